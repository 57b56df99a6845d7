//! Every write of an operation record, as the replica's one watch delivers
//! them, shared by every waiter and by the executor.
//!
//! The feed subscribes to the cluster cache's watch of the whole key prefix
//! ([`ClusterCache::watch_keys`]) once, as the replica starts, rather than
//! watching etcd itself: a watch created per wait starts "in the past" whenever
//! anything was written between the read and the watch, and etcd serves
//! such watches from a catch-up loop that runs every 100 ms; and a watch of
//! its own would have etcd send every operation write once more to each
//! replica.
//!
//! The feed also remembers the newest record it has seen of each recently
//! written operation, so a waiter (or the executor picking up an operation
//! another replica accepted) usually needs no read at all; and it wakes only
//! the followers of the key that changed.
//!
//! # Guarantees
//! - While the feed is live, a remembered record is the newest the feed has
//!   seen of its key, and every later write of that key reaches the key's
//!   followers. A record is only remembered if it was written after the
//!   feed's subscription began, so no write between the two can be missed.
//! - When the watch restarts, everything remembered is forgotten and every
//!   follower is told to read again.
//!
//! # Caveats
//! - The feed ignores deletes (only finished operations are collected): a
//!   collected record stays remembered until it is forgotten in turn.
//! - A key not remembered (evicted, or last written before the feed began)
//!   says nothing: the caller reads etcd.

use crate::cluster::{CacheChange, ClusterCache};
use crate::store::{EventKind, KeyValue};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// Operation records remembered; older ones are forgotten first. A few
/// thousand is ample for the operations in flight plus those just finished.
const REMEMBERED: usize = 4096;
const RESTART_DELAY: Duration = Duration::from_millis(200);

/// What a follower of one key sees.
#[derive(Debug, Clone)]
pub enum Seen {
    /// Nothing known beyond what the follower started from.
    Nothing,
    /// The key was written.
    Record(Arc<KeyValue>),
    /// The feed restarted and may have missed writes: read again.
    Resync,
}

#[derive(Default)]
struct Memory {
    /// The subscription's first revision while it is live.
    live_from: Option<i64>,
    /// The newest revision the watch has delivered.
    seen: i64,
    /// Newest record per key, with its place in `order`.
    records: HashMap<String, (u64, Arc<KeyValue>)>,
    /// Keys by when they were last written, oldest first.
    order: BTreeMap<u64, String>,
    next_seq: u64,
    followers: HashMap<String, Weak<watch::Sender<Seen>>>,
}

impl Memory {
    /// Remembers `kv` if it is newer than what is known of its key, and
    /// tells its followers. Returns whether it was newer.
    fn remember(&mut self, kv: Arc<KeyValue>) -> bool {
        let Some(live_from) = self.live_from else {
            return false;
        };
        if kv.mod_revision < live_from {
            return false;
        }
        if let Some((seq, known)) = self.records.get(&kv.key) {
            if known.mod_revision >= kv.mod_revision {
                return false;
            }
            self.order.remove(seq);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, kv.key.clone());
        self.records.insert(kv.key.clone(), (seq, Arc::clone(&kv)));
        while self.records.len() > REMEMBERED {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.records.remove(&oldest);
        }
        self.tell(&kv.key, Seen::Record(kv.clone()));
        true
    }

    fn tell(&mut self, key: &str, seen: Seen) {
        match self.followers.get(key).and_then(Weak::upgrade) {
            Some(sender) => {
                sender.send_replace(seen);
            }
            None => {
                self.followers.remove(key);
            }
        }
    }

    /// Forgets everything and tells every follower to read again.
    fn reset(&mut self, live_from: Option<i64>) {
        self.live_from = live_from;
        self.seen = live_from.map_or(0, |from| from - 1);
        self.records.clear();
        self.order.clear();
        self.followers.retain(|_, sender| match sender.upgrade() {
            Some(sender) => {
                sender.send_replace(Seen::Resync);
                true
            }
            None => false,
        });
    }
}

pub struct OperationFeed {
    memory: Mutex<Memory>,
    started: OnceLock<()>,
}

/// A follower of one operation key; stops following when dropped.
pub struct Follower {
    feed: Arc<OperationFeed>,
    key: String,
    /// Shared by every follower of the key; `None` once dropped.
    sender: Option<Arc<watch::Sender<Seen>>>,
    receiver: watch::Receiver<Seen>,
    /// The newest record the feed knew when following began.
    pub known: Option<Arc<KeyValue>>,
}

impl Follower {
    /// The next thing seen of the key; `None` when the feed went away.
    pub async fn next(&mut self) -> Option<Seen> {
        self.receiver.changed().await.ok()?;
        Some(self.receiver.borrow_and_update().clone())
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        // Under the lock no follower can be added meanwhile; the last one
        // out removes the key. The share is let go under the lock too: of
        // two followers leaving at once, the second must see the first gone.
        let mut memory = self.feed.memory();
        drop(self.sender.take());
        let last = memory
            .followers
            .get(&self.key)
            .is_some_and(|sender| sender.strong_count() == 0);
        if last {
            memory.followers.remove(&self.key);
        }
    }
}

impl OperationFeed {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            memory: Mutex::new(Memory::default()),
            started: OnceLock::new(),
        })
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the feed of every operation write under `prefix`, from
    /// `cache`'s watch, once.
    pub fn start(self: &Arc<Self>, cache: &Arc<ClusterCache>, prefix: &str) {
        self.started.get_or_init(|| {
            let cache = Arc::clone(cache);
            tokio::spawn(run(cache, prefix.to_string(), Arc::downgrade(self)));
        });
    }

    /// Follows `key` from now on, with what is known of it now.
    pub fn follow(self: &Arc<Self>, key: &str) -> Follower {
        let mut memory = self.memory();
        let existing = memory.followers.get(key).and_then(Weak::upgrade);
        let sender = existing.unwrap_or_else(|| {
            let sender = Arc::new(watch::channel(Seen::Nothing).0);
            memory
                .followers
                .insert(key.to_string(), Arc::downgrade(&sender));
            sender
        });
        let mut receiver = sender.subscribe();
        receiver.mark_unchanged();
        Follower {
            known: memory.records.get(key).map(|(_, kv)| Arc::clone(kv)),
            feed: Arc::clone(self),
            key: key.to_string(),
            sender: Some(sender),
            receiver,
        }
    }

    /// The newest revision the feed's watch has delivered; 0 when it is not
    /// live. A record written at or before it, and not remembered, was not
    /// written since the feed began (or was forgotten).
    pub fn revision(&self) -> i64 {
        self.memory().seen
    }

    /// A record this replica just wrote itself: its followers here learn of
    /// it without waiting for the watch to deliver it.
    pub fn record_own_write(&self, kv: KeyValue) {
        self.memory().remember(Arc::new(kv));
    }
}

async fn run(cache: Arc<ClusterCache>, prefix: String, feed: Weak<OperationFeed>) {
    loop {
        // Subscribed first, so that a list completing after the look
        // below is not missed.
        let mut changes = cache.subscribe();
        let Some((mut watch, live_from)) = cache.watch_keys(&prefix) else {
            // The replica's watch is starting or listing again: look again
            // as soon as it lists (a feed that goes live late misses the
            // records written meanwhile), or after a while.
            let listed = async {
                while !matches!(changes.recv().await, Ok(CacheChange::Relisted) | Err(_)) {}
            };
            let _ = tokio::time::timeout(RESTART_DELAY, listed).await;
            if feed.strong_count() == 0 {
                return;
            }
            continue;
        };
        drop(changes);
        let Some(this) = feed.upgrade() else { return };
        this.memory().reset(Some(live_from));
        drop(this);
        while let Some(Ok(event)) = watch.next().await {
            let Some(this) = feed.upgrade() else { return };
            let mut memory = this.memory();
            memory.seen = memory.seen.max(event.kv.mod_revision);
            // Only finished operations are deleted (collected), and what is
            // remembered of one stays true.
            if event.kind == EventKind::Put {
                memory.remember(Arc::new(event.kv));
            }
        }
        tracing::info!("operation feed's watch ended; following it again");
        match feed.upgrade() {
            Some(this) => this.memory().reset(None),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, revision: i64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: revision.to_string().into_bytes(),
            create_revision: 1,
            mod_revision: revision,
            version: 1,
            lease: 0,
        }
    }

    fn live(from: i64) -> Arc<OperationFeed> {
        let feed = OperationFeed::new();
        feed.memory().reset(Some(from));
        feed
    }

    #[tokio::test]
    async fn followers_see_newer_writes_of_their_key_only() {
        let feed = live(10);
        let mut follower = feed.follow("a");
        assert!(follower.known.is_none());
        feed.record_own_write(kv("b", 11));
        feed.record_own_write(kv("a", 12));
        feed.record_own_write(kv("a", 12));
        match follower.next().await {
            Some(Seen::Record(record)) => assert_eq!(record.mod_revision, 12),
            other => panic!("expected the write of a, got {other:?}"),
        }
        // An older write (a watch event behind a local write) changes nothing.
        feed.record_own_write(kv("a", 11));
        assert_eq!(feed.follow("a").known.as_ref().unwrap().mod_revision, 12);
        assert!(!follower.receiver.has_changed().unwrap());
    }

    #[tokio::test]
    async fn nothing_written_before_the_feed_began_is_remembered() {
        let feed = live(10);
        feed.record_own_write(kv("a", 9));
        assert!(feed.follow("a").known.is_none());
        let not_live = OperationFeed::new();
        not_live.record_own_write(kv("a", 20));
        assert!(not_live.follow("a").known.is_none());
    }

    #[tokio::test]
    async fn a_restart_forgets_and_tells_followers_to_read_again() {
        let feed = live(10);
        feed.record_own_write(kv("a", 12));
        let mut follower = feed.follow("a");
        assert!(follower.known.is_some());
        feed.memory().reset(None);
        assert!(matches!(follower.next().await, Some(Seen::Resync)));
        assert!(feed.follow("a").known.is_none());
    }

    #[tokio::test]
    async fn memory_is_bounded_oldest_first() {
        let feed = live(1);
        for i in 0..(REMEMBERED + 10) {
            feed.record_own_write(kv(&format!("k{i}"), i as i64 + 1));
        }
        let memory = feed.memory();
        assert_eq!(memory.records.len(), REMEMBERED);
        assert_eq!(memory.order.len(), REMEMBERED);
        assert!(!memory.records.contains_key("k0"));
        assert!(memory.records.contains_key(&format!("k{}", REMEMBERED + 9)));
    }

    #[tokio::test]
    async fn the_last_follower_out_removes_the_key() {
        let feed = live(1);
        let first = feed.follow("a");
        let second = feed.follow("a");
        drop(first);
        assert!(feed.memory().followers.contains_key("a"));
        drop(second);
        assert!(feed.memory().followers.is_empty());
    }

    #[test]
    fn followers_leaving_at_once_remove_the_key() {
        let feed = live(1);
        for round in 0..2_000 {
            let key = format!("k{round}");
            let (first, second) = (feed.follow(&key), feed.follow(&key));
            let start = Arc::new(std::sync::Barrier::new(2));
            let leave = |follower: Follower| {
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    drop(follower);
                })
            };
            let (a, b) = (leave(first), leave(second));
            a.join().unwrap();
            b.join().unwrap();
        }
        let left = feed.memory().followers.len();
        assert_eq!(left, 0, "keys left behind by followers that all left");
    }
}
