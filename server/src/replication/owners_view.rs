//! Every owner key as the replica's watch delivers them, for the ownership
//! passes.
//!
//! A pass used to range every owner key: with ten thousand clusters, three
//! replicas' passes (each at least every TTL/3) kept etcd busy at rest. The
//! view lists the keys once, then follows the owner changes of the watch
//! cache's watch ([`ClusterCache::watch_keys`]: the replica's one watch).
//!
//! # Guarantees
//! - [`OwnersView::catch_up`] returns a view that includes every owner write
//!   up to the revision asked for (this replica's own claims and releases),
//!   so a pass never forgets a cluster it has just claimed.
//!
//! # Caveats
//! - Like the range it replaces, the view may miss a change made after it
//!   was brought up to date: every owner write compares what it relies on,
//!   so such a view only loses a compare-and-swap.
//! - While the replica's watch is not live (starting, or listing again
//!   after a failure), every pass lists the owner keys.

use super::OwnerRecord;
use crate::cluster::{from_json, ClusterCache};
use crate::keys::KeyLayout;
use crate::store::{EventKind, LeaseId, RangeRequest, Store, WatchEvent, WatchStream};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How long a pass waits for the watch to deliver this replica's own owner
/// writes before it lists the owner keys again instead.
const CATCH_UP: Duration = Duration::from_secs(1);

pub(super) struct OwnersView {
    /// Whose watch the view follows.
    cache: Arc<ClusterCache>,
    /// Cluster name → its owner record and the key's create revision (the
    /// owner's epoch).
    owners: HashMap<String, (OwnerRecord, i64)>,
    /// How many of `owners` each lease holds: which leases hold keys is
    /// asked after every change while a departed member's keys go (a
    /// takeover's 33,000 deletes), and counting all 100,000 owners each
    /// time was most of a replica's CPU then.
    leases: HashMap<LeaseId, usize>,
    /// The view holds every change up to this revision.
    revision: i64,
    /// The revision of the last list: the changes up to it are in it.
    listed: i64,
    /// `None` until listed, and after the watch failed.
    watch: Option<WatchStream>,
    /// Leases no member holds whose owner keys are not waited for: still in
    /// etcd after a wait for their deletes, or of a deposed member (its
    /// lease lives until its keys are drained).
    lingering: HashSet<LeaseId>,
}

impl OwnersView {
    /// An empty view, listed on the first [`Self::catch_up`], that follows
    /// `cache`'s watch.
    pub(super) fn new(cache: Arc<ClusterCache>) -> Self {
        Self {
            cache,
            owners: HashMap::new(),
            leases: HashMap::new(),
            revision: 0,
            listed: 0,
            watch: None,
            lingering: HashSet::new(),
        }
    }

    pub(super) fn owners(&self) -> &HashMap<String, (OwnerRecord, i64)> {
        &self.owners
    }

    /// How many owner keys each lease holds.
    pub(super) fn leases(&self) -> &HashMap<LeaseId, usize> {
        &self.leases
    }

    /// Brings the view up to `revision` at least: applies what the watch has
    /// delivered, waits up to [`CATCH_UP`] for the rest, and lists the owner
    /// keys again when there is no watch or it lags.
    pub(super) async fn catch_up(
        &mut self,
        store: &dyn Store,
        keys: &KeyLayout,
        revision: i64,
    ) -> crate::store::Result<()> {
        self.apply_delivered(keys);
        if self.watch.is_some() && self.revision < revision {
            let _ = tokio::time::timeout(CATCH_UP, async {
                while self.watch.is_some() && self.revision < revision {
                    self.next_change(keys).await;
                }
            })
            .await;
            // The rest of the transaction that reached `revision`: its
            // keys share that revision and arrive one event at a time (a
            // batch of claims seen by its first key only lost the others
            // until the next change).
            self.apply_delivered(keys);
        }
        if self.watch.is_none() || self.revision < revision {
            self.list(store, keys).await?;
        }
        Ok(())
    }

    /// Whether the view follows the watch (an owner change then wakes the
    /// ownership loop); while it does not, only a pass that lists sees one.
    pub(super) fn is_following(&self) -> bool {
        self.watch.is_some()
    }

    /// Applies the changes the watch has delivered, without waiting.
    fn apply_delivered(&mut self, keys: &KeyLayout) {
        while let Some(watch) = &mut self.watch {
            match watch.try_next() {
                Some(event) => self.apply(keys, Some(event)),
                None => break,
            }
        }
    }

    /// Waits, up to [`CATCH_UP`], until the view holds no owner key bound to
    /// a lease outside `live_leases` that etcd no longer holds: such keys
    /// belong to a member that left, and etcd deletes them with its lease
    /// (a deposed member's lease lives on: its keys are drained instead). Lists the owner keys
    /// again if some are still there, and does not wait for those again
    /// (whatever keeps them, a pass must not stall on it every time).
    pub(super) async fn await_departed(
        &mut self,
        store: &dyn Store,
        keys: &KeyLayout,
        live_leases: &HashSet<LeaseId>,
    ) -> crate::store::Result<()> {
        let departed = |view: &Self| -> HashSet<LeaseId> {
            let leases = view.leases.keys().copied();
            leases
                .filter(|lease| !live_leases.contains(lease))
                .collect()
        };
        if departed(self).is_subset(&self.lingering) {
            return Ok(());
        }
        // A member deposed as crashed keeps its lease, and its keys, until
        // the survivors drained them: those are not coming.
        for lease in departed(self)
            .difference(&self.lingering)
            .copied()
            .collect::<Vec<_>>()
        {
            if store.lease_time_to_live(lease).await?.is_some() {
                self.lingering.insert(lease);
            }
        }
        if departed(self).is_subset(&self.lingering) {
            return Ok(());
        }
        let _ = tokio::time::timeout(CATCH_UP, async {
            while self.watch.is_some() && !departed(self).is_subset(&self.lingering) {
                self.next_change(keys).await;
            }
        })
        .await;
        if !departed(self).is_subset(&self.lingering) {
            self.list(store, keys).await?;
        }
        self.lingering = departed(self);
        Ok(())
    }

    /// Waits for the next change and applies it; never returns while there
    /// is no watch.
    pub(super) async fn next_change(&mut self, keys: &KeyLayout) {
        let Some(watch) = &mut self.watch else {
            return std::future::pending().await;
        };
        let event = watch.next().await;
        self.apply(keys, event);
    }

    async fn list(&mut self, store: &dyn Store, keys: &KeyLayout) -> crate::store::Result<()> {
        self.watch = None;
        // Subscribed first, so the changes after the list are all in it.
        let subscription = self.cache.watch_keys(&keys.owners());
        let listed = store.range(RangeRequest::prefix(keys.owners())).await?;
        self.owners.clear();
        self.leases.clear();
        for kv in &listed.kvs {
            let Some(cluster) = kv.key.strip_prefix(&keys.owners()) else {
                continue;
            };
            if let Ok(owner) = from_json::<OwnerRecord>(kv) {
                self.insert(cluster, owner, kv.create_revision);
            }
        }
        self.revision = listed.revision;
        self.listed = listed.revision;
        // Without one (the watch is not live) the next pass lists again.
        self.watch = subscription.map(|(watch, _)| watch);
        Ok(())
    }

    /// Applies one watch delivery; a failed or ended watch is dropped, so
    /// the next [`Self::catch_up`] lists again.
    fn apply(&mut self, keys: &KeyLayout, event: Option<crate::store::Result<WatchEvent>>) {
        let Some(Ok(WatchEvent { kind, kv })) = event else {
            self.watch = None;
            return;
        };
        if kv.mod_revision <= self.listed {
            // Subscribed before the list: the list has it already.
            return;
        }
        self.revision = self.revision.max(kv.mod_revision);
        let Some(cluster) = kv.key.strip_prefix(&keys.owners()) else {
            return;
        };
        match kind {
            EventKind::Put => match from_json::<OwnerRecord>(&kv) {
                Ok(owner) => self.insert(cluster, owner, kv.create_revision),
                // As the list does: an unreadable record counts as no owner
                // (a claim of it then only loses its compare-and-swap).
                Err(error) => {
                    tracing::warn!(%error, "unreadable owner key ignored");
                    self.remove(cluster);
                }
            },
            EventKind::Delete => self.remove(cluster),
        }
    }

    fn insert(&mut self, cluster: &str, owner: OwnerRecord, epoch: i64) {
        *self.leases.entry(owner.lease).or_default() += 1;
        if let Some((before, _)) = self.owners.insert(cluster.to_string(), (owner, epoch)) {
            self.forget_one(before.lease);
        }
    }

    fn remove(&mut self, cluster: &str) {
        if let Some((before, _)) = self.owners.remove(cluster) {
            self.forget_one(before.lease);
        }
    }

    fn forget_one(&mut self, lease: LeaseId) {
        if let Some(held) = self.leases.get_mut(&lease) {
            *held -= 1;
            if *held == 0 {
                self.leases.remove(&lease);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::to_json;
    use crate::metrics::Metrics;
    use crate::store::{MemoryStore, Op, Txn};
    use tokio::sync::watch;

    fn record(replica: &str) -> Vec<u8> {
        to_json(&OwnerRecord {
            schema: crate::cluster::SCHEMA_VERSION,
            replica: replica.into(),
            lease: 7,
            epoch_base: 0,
            generation: 0,
        })
    }

    async fn write(store: &MemoryStore, op: Op) -> i64 {
        store.txn(Txn::new().and_then([op])).await.unwrap().revision
    }

    /// An empty view that follows the watch of a cache of `store`, once
    /// that watch is live; the cache stops when the sender is dropped.
    async fn view_of(
        store: &Arc<MemoryStore>,
        keys: &KeyLayout,
    ) -> (OwnersView, watch::Sender<bool>) {
        let cache = ClusterCache::new(store.clone(), keys.clone(), Metrics::new());
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(Arc::clone(&cache).run(stopped));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cache.watch_keys(&keys.owners()).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the watch never went live"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (OwnersView::new(cache), stop)
    }

    fn owner_of<'a>(view: &'a OwnersView, cluster: &str) -> Option<&'a str> {
        view.owners().get(cluster).map(|(o, _)| o.replica.as_str())
    }

    #[tokio::test]
    async fn lists_once_then_includes_every_write_up_to_the_revision_asked_for() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let first = write(&store, Op::put(keys.owner("a"), record("r1"))).await;
        let (mut view, _cache) = view_of(&store, &keys).await;
        view.catch_up(store.as_ref(), &keys, 0).await.unwrap();
        assert_eq!(owner_of(&view, "a"), Some("r1"));
        assert_eq!(
            view.owners()["a"].1,
            first,
            "the epoch is the create revision"
        );

        let claimed = write(&store, Op::put(keys.owner("b"), record("r2"))).await;
        let released = write(&store, Op::delete(keys.owner("a"))).await;
        assert!(claimed < released);
        view.catch_up(store.as_ref(), &keys, released)
            .await
            .unwrap();
        assert_eq!(owner_of(&view, "b"), Some("r2"));
        assert_eq!(owner_of(&view, "a"), None, "the delete arrived");
        assert!(
            view.watch.is_some(),
            "followed the watch, did not list again"
        );

        // Another key's change wakes a waiting pass and is applied.
        write(&store, Op::put(keys.owner("c"), record("r3"))).await;
        view.next_change(&keys).await;
        assert_eq!(owner_of(&view, "c"), Some("r3"));
    }

    #[tokio::test]
    async fn waits_for_a_departed_members_keys_but_not_twice_for_lingering_ones() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        write(&store, Op::put(keys.owner("a"), record("gone"))).await;
        let (mut view, _cache) = view_of(&store, &keys).await;
        view.catch_up(store.as_ref(), &keys, 0).await.unwrap();
        // Lease 7 is no member's: its key is deleted (as with the lease)
        // and the wait ends once the view has the delete.
        let no_members = HashSet::new();
        let expiry = store.txn(Txn::new().and_then([Op::delete(keys.owner("a"))]));
        let (expired, waited) = tokio::join!(
            expiry,
            view.await_departed(store.as_ref(), &keys, &no_members)
        );
        expired.unwrap();
        waited.unwrap();
        assert_eq!(owner_of(&view, "a"), None);
        assert!(view.lingering.is_empty());

        // A key that stays is waited for once, then known to linger.
        let stuck = write(&store, Op::put(keys.owner("b"), record("stuck"))).await;
        view.catch_up(store.as_ref(), &keys, stuck).await.unwrap();
        view.await_departed(store.as_ref(), &keys, &no_members)
            .await
            .unwrap();
        assert_eq!(owner_of(&view, "b"), Some("stuck"));
        assert_eq!(view.lingering, HashSet::from([7]));
        let again = std::time::Instant::now();
        view.await_departed(store.as_ref(), &keys, &no_members)
            .await
            .unwrap();
        assert!(again.elapsed() < CATCH_UP, "no second wait");
    }

    #[tokio::test]
    async fn lists_again_when_the_watch_failed() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let (mut view, _cache) = view_of(&store, &keys).await;
        view.catch_up(store.as_ref(), &keys, 0).await.unwrap();
        view.apply(&keys, None);
        assert!(view.watch.is_none());
        let claimed = write(&store, Op::put(keys.owner("a"), record("r1"))).await;
        view.catch_up(store.as_ref(), &keys, claimed).await.unwrap();
        assert_eq!(owner_of(&view, "a"), Some("r1"));
        assert!(view.watch.is_some());
    }

    #[tokio::test]
    async fn skips_the_changes_its_list_already_holds() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let (mut view, _cache) = view_of(&store, &keys).await;
        let claimed = write(&store, Op::put(keys.owner("a"), record("r1"))).await;
        view.catch_up(store.as_ref(), &keys, claimed).await.unwrap();
        // A change the subscription delivers that the list already showed
        // (here, an older delete of the key) changes nothing.
        let older = WatchEvent {
            kind: EventKind::Delete,
            kv: crate::store::KeyValue {
                key: keys.owner("a"),
                value: Vec::new(),
                create_revision: 0,
                mod_revision: view.listed,
                version: 0,
                lease: 0,
            },
        };
        view.apply(&keys, Some(Ok(older)));
        assert_eq!(owner_of(&view, "a"), Some("r1"));
    }
}
