//! When to read an operation record: what a replica's waiters and its
//! executor know of the operations they follow, without following every
//! record.
//!
//! The replica's watch leaves the operation records out (three writes and
//! a delete per operation, which every replica used to receive). What a
//! waiter needs is when to read its record, and the cluster's state key
//! says it: the feed follows the watch cache's cluster changes and tells an
//! operation's followers to read again whenever their cluster's state is
//! written with a slot that does not hold their operation (it ended, or the
//! cluster went). The records this replica writes itself (the accept, the
//! owner's claim, progress and completion) are remembered and handed to
//! their followers at once, so a waiter on the owner reads nothing.
//!
//! # Guarantees
//! - A follower is told, from when it began following, of every record of
//!   its key this replica writes (`Record`) and of every state write of its
//!   cluster whose slot does not hold its operation (`Moved`).
//! - When the watch restarts (or the feed first goes live), every follower
//!   is told to read again: changes may have been missed.
//!
//! # Caveats
//! - A remembered record is the newest this replica wrote of its key, not
//!   necessarily the newest there is: a caller that starts from it checks
//!   first that the cluster has not moved on since (see
//!   `Operations::wait`).
//! - Progress another replica writes is not followed: a waiter sees it when
//!   it reads.

use crate::cluster::ClusterCache;
use crate::keys::{leaf, KeyLayout};
use crate::store::{EventKind, KeyValue};
use serde::Deserialize;
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
    /// This replica wrote the key.
    Record(Arc<KeyValue>),
    /// The cluster's state was written at this revision, its slot not
    /// holding the operation: it may have ended then. Read it.
    Moved(i64),
    /// Changes may have been missed: read again.
    Resync,
}

#[derive(Default)]
struct Memory {
    /// Newest record written here per key, with its place in `order`.
    records: HashMap<String, (u64, Arc<KeyValue>)>,
    /// Keys by when they were last written, oldest first.
    order: BTreeMap<u64, String>,
    next_seq: u64,
    /// In key order, so a cluster's operations are one range.
    followers: BTreeMap<String, Weak<watch::Sender<Seen>>>,
}

impl Memory {
    /// Remembers `kv` if it is newer than what is known of its key, and
    /// tells its followers. Returns whether it was newer.
    fn remember(&mut self, kv: Arc<KeyValue>) -> bool {
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

    /// Whether any key under `prefix` (one cluster's operations) is
    /// followed.
    fn follows_any(&self, prefix: &str) -> bool {
        self.followers
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .is_some_and(|(key, _)| key.starts_with(prefix))
    }

    /// The cluster whose operations are under `prefix` had its state
    /// written at `revision` with `slot` (the operation id it holds, if
    /// any): every other of its operations followed is told to read.
    fn state_written(&mut self, prefix: &str, slot: Option<&str>, revision: i64) {
        let moved_on: Vec<String> = self
            .followers
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(key, _)| key.starts_with(prefix))
            .filter(|(key, _)| slot != Some(&key[prefix.len()..]))
            .map(|(key, _)| key.clone())
            .collect();
        for key in moved_on {
            self.tell(&key, Seen::Moved(revision));
        }
    }

    /// Tells every follower to read again.
    fn resync_all(&mut self) {
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
    /// The newest record of the key this replica wrote, when following
    /// began (see the caveats).
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

    /// Starts following `cache`'s cluster changes, once.
    pub fn start(self: &Arc<Self>, cache: &Arc<ClusterCache>) {
        self.started.get_or_init(|| {
            let cache = Arc::clone(cache);
            tokio::spawn(run(cache, Arc::downgrade(self)));
        });
    }

    /// Follows `key` from now on, with what this replica wrote of it.
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

    /// The newest record of `key` this replica wrote, if remembered.
    pub fn remembered(&self, key: &str) -> Option<Arc<KeyValue>> {
        self.memory().records.get(key).map(|(_, kv)| Arc::clone(kv))
    }

    /// A record this replica just wrote itself: its followers here learn of
    /// it at once.
    pub fn record_own_write(&self, kv: KeyValue) {
        self.memory().remember(Arc::new(kv));
    }
}

/// The operation a cluster's state record holds in its slot, read without
/// parsing the rest.
pub(crate) fn slot_of(state_json: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Slot {
        id: String,
    }
    #[derive(Deserialize)]
    struct State {
        operation: Option<Slot>,
    }
    serde_json::from_slice::<State>(state_json)
        .ok()?
        .operation
        .map(|slot| slot.id)
}

async fn run(cache: Arc<ClusterCache>, feed: Weak<OperationFeed>) {
    let keys = cache.keys().clone();
    loop {
        let Some((mut watch, _)) = cache.watch_keys(&keys.clusters()) else {
            // The replica's watch is starting or listing again.
            tokio::time::sleep(RESTART_DELAY).await;
            if feed.strong_count() == 0 {
                return;
            }
            continue;
        };
        // Whoever followed before now may have missed a change.
        let Some(this) = feed.upgrade() else { return };
        this.memory().resync_all();
        drop(this);
        while let Some(Ok(event)) = watch.next().await {
            let Some(this) = feed.upgrade() else { return };
            this.cluster_written(&keys, event.kind, &event.kv);
        }
        tracing::info!("operation feed's watch ended; following it again");
        match feed.upgrade() {
            Some(this) => this.memory().resync_all(),
            None => return,
        }
    }
}

impl OperationFeed {
    /// A change of a cluster key: when it is the state of a cluster with
    /// operations followed, those it does not hold are told to read.
    fn cluster_written(&self, keys: &KeyLayout, kind: EventKind, kv: &KeyValue) {
        let Some((cluster, leaf::STATE)) = keys.split_cluster_key(&kv.key) else {
            return;
        };
        let prefix = keys.operations(cluster);
        if !self.memory().follows_any(&prefix) {
            return;
        }
        let slot = match kind {
            EventKind::Put => slot_of(&kv.value),
            EventKind::Delete => None,
        };
        self.memory()
            .state_written(&prefix, slot.as_deref(), kv.mod_revision);
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

    #[tokio::test]
    async fn followers_see_newer_writes_of_their_key_only() {
        let feed = OperationFeed::new();
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
    async fn a_restart_tells_followers_to_read_again() {
        let feed = OperationFeed::new();
        feed.record_own_write(kv("a", 12));
        let mut follower = feed.follow("a");
        assert!(follower.known.is_some());
        feed.memory().resync_all();
        assert!(matches!(follower.next().await, Some(Seen::Resync)));
    }

    #[tokio::test]
    async fn a_state_write_tells_the_clusters_other_operations_to_read() {
        let feed = OperationFeed::new();
        let mut held = feed.follow("/o/c/op1");
        let mut ended = feed.follow("/o/c/op2");
        let elsewhere = feed.follow("/o/cc/op3");
        assert!(feed.memory().follows_any("/o/c/"));
        assert!(!feed.memory().follows_any("/o/b/"));
        feed.memory().state_written("/o/c/", Some("op1"), 7);
        assert!(matches!(ended.next().await, Some(Seen::Moved(7))));
        assert!(!held.receiver.has_changed().unwrap());
        assert!(!elsewhere.receiver.has_changed().unwrap());
        feed.memory().state_written("/o/c/", None, 8);
        assert!(matches!(held.next().await, Some(Seen::Moved(8))));
        assert!(!elsewhere.receiver.has_changed().unwrap());
    }

    #[test]
    fn the_slot_is_read_from_a_state_record() {
        let held = br#"{"schema":1,"uid":"u","state":"Running","operation":{"id":"op1","kind":"Stop"},"changed_at":"t"}"#;
        assert_eq!(slot_of(held).as_deref(), Some("op1"));
        let free = br#"{"schema":1,"uid":"u","state":"Running","operation":null,"changed_at":"t"}"#;
        assert_eq!(slot_of(free), None);
    }

    #[tokio::test]
    async fn memory_is_bounded_oldest_first() {
        let feed = OperationFeed::new();
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
        let feed = OperationFeed::new();
        let first = feed.follow("a");
        let second = feed.follow("a");
        drop(first);
        assert!(feed.memory().followers.contains_key("a"));
        drop(second);
        assert!(feed.memory().followers.is_empty());
    }

    #[test]
    fn followers_leaving_at_once_remove_the_key() {
        let feed = OperationFeed::new();
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
