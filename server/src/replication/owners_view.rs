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
//! - The view is shared ([`OwnerMap`]): an accept on a replica that does not
//!   own the cluster folds in the owner's claim as the view has it, so it is
//!   as current as the last pass. A stale entry only fails that accept's
//!   compare of the owner key.

use super::OwnerRecord;
use crate::cluster::{from_json, ClusterCache};
use crate::keys::KeyLayout;
use crate::store::{EventKind, LeaseId, RangeRequest, Store, WatchEvent, WatchStream};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// How long a pass waits for the watch to deliver this replica's own owner
/// writes before it lists the owner keys again instead.
const CATCH_UP: Duration = Duration::from_secs(1);

/// An owner key as the passes and the accepts need it. Every cluster has
/// one, so it is kept small: the replica id is shared by all of that
/// replica's keys, and the record's schema is not kept.
#[derive(Debug, Clone)]
pub(super) struct OwnerEntry {
    pub replica: Arc<str>,
    pub lease: LeaseId,
    /// The epoch base the owner claimed under ([`OwnerRecord::base`]).
    pub base: i64,
    /// The owner key's create revision.
    pub created: i64,
}

impl OwnerEntry {
    fn claim(&self) -> super::Claim {
        super::Claim::new(self.lease, self.base, self.created)
    }
}

/// Cluster name → its owner key, as the ownership passes last saw them,
/// and the members that take work; read by the accepts.
#[derive(Default)]
pub struct OwnerMap {
    owners: RwLock<HashMap<Box<str>, OwnerEntry>>,
    /// The members ownership prefers among (not draining, reaching the
    /// providers), as the last pass read them.
    working: RwLock<HashSet<String>>,
}

impl OwnerMap {
    /// The owner of `cluster` and its claim, as last seen, while that owner
    /// takes work: its replica id, and what a write fenced on its claim
    /// compares and records.
    pub fn claim_of(&self, cluster: &str) -> Option<(String, super::Claim)> {
        let owners = self.read();
        let owner = owners.get(cluster)?;
        let working = self.working.read().unwrap_or_else(|p| p.into_inner());
        if !working.contains(&*owner.replica) {
            return None;
        }
        Some((owner.replica.to_string(), owner.claim()))
    }

    /// The members that take work now.
    pub(super) fn set_working(&self, members: impl IntoIterator<Item = String>) {
        let mut working = self.working.write().unwrap_or_else(|p| p.into_inner());
        working.clear();
        working.extend(members);
    }

    /// The claims of the owner keys bound to `lease`, by cluster.
    pub(super) fn claims_of(&self, lease: LeaseId) -> HashMap<String, super::Claim> {
        let owners = self.read();
        let mine = owners.iter().filter(|(_, owner)| owner.lease == lease);
        mine.map(|(cluster, owner)| (cluster.to_string(), owner.claim()))
            .collect()
    }

    /// The lease and create revision of `cluster`'s owner key.
    pub(super) fn key_of(&self, cluster: &str) -> Option<(LeaseId, i64)> {
        let owners = self.read();
        owners
            .get(cluster)
            .map(|owner| (owner.lease, owner.created))
    }

    /// Held only in code that does not wait (never across an `.await`).
    pub(super) fn read(&self) -> RwLockReadGuard<'_, HashMap<Box<str>, OwnerEntry>> {
        self.owners
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<Box<str>, OwnerEntry>> {
        self.owners
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(super) struct OwnersView {
    /// Whose watch the view follows.
    cache: Arc<ClusterCache>,
    /// Every owner key, shared with the accepts.
    owners: Arc<OwnerMap>,
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
    /// The replica ids the owner keys name, each held once.
    replicas: HashSet<Arc<str>>,
}

impl OwnersView {
    /// An empty view, listed on the first [`Self::catch_up`], that follows
    /// `cache`'s watch and keeps the owner keys in `owners`.
    pub(super) fn new(cache: Arc<ClusterCache>, owners: Arc<OwnerMap>) -> Self {
        Self {
            cache,
            owners,
            leases: HashMap::new(),
            revision: 0,
            listed: 0,
            watch: None,
            lingering: HashSet::new(),
            replicas: HashSet::new(),
        }
    }

    pub(super) fn owners(&self) -> &OwnerMap {
        &self.owners
    }

    /// The view holds every owner-key change up to this revision (it moves
    /// with every change applied, and with every list).
    pub(super) fn revision(&self) -> i64 {
        self.revision
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
        self.owners.write().clear();
        self.leases.clear();
        self.replicas.clear();
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

    fn insert(&mut self, cluster: &str, owner: OwnerRecord, created: i64) {
        *self.leases.entry(owner.lease).or_default() += 1;
        let entry = OwnerEntry {
            replica: self.replica_id(&owner.replica),
            lease: owner.lease,
            base: owner.base(),
            created,
        };
        let before = self.owners.write().insert(cluster.into(), entry);
        if let Some(before) = before {
            self.forget(before);
        }
    }

    /// `replica`, shared with every owner key that names it.
    fn replica_id(&mut self, replica: &str) -> Arc<str> {
        if let Some(held) = self.replicas.get(replica) {
            return Arc::clone(held);
        }
        let id: Arc<str> = replica.into();
        self.replicas.insert(Arc::clone(&id));
        id
    }

    fn remove(&mut self, cluster: &str) {
        let before = self.owners.write().remove(cluster);
        if let Some(before) = before {
            self.forget(before);
        }
    }

    /// Forgets an owner key that was replaced or deleted: its lease's count,
    /// and its replica id once no other key names it (members come and go).
    fn forget(&mut self, before: OwnerEntry) {
        if let Some(held) = self.leases.get_mut(&before.lease) {
            *held -= 1;
            if *held == 0 {
                self.leases.remove(&before.lease);
            }
        }
        // Held by the set and by `before` alone.
        if Arc::strong_count(&before.replica) == 2 {
            self.replicas.remove(&before.replica);
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
        (OwnersView::new(cache, Arc::default()), stop)
    }

    fn owner_of(view: &OwnersView, cluster: &str) -> Option<String> {
        let owners = view.owners().read();
        owners.get(cluster).map(|owner| owner.replica.to_string())
    }

    #[tokio::test]
    async fn the_owner_keys_of_one_replica_share_its_id_until_none_names_it() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        write(&store, Op::put(keys.owner("a"), record("r1"))).await;
        write(&store, Op::put(keys.owner("b"), record("r1"))).await;
        let (mut view, _cache) = view_of(&store, &keys).await;
        view.catch_up(store.as_ref(), &keys, 0).await.unwrap();
        {
            let owners = view.owners().read();
            assert!(Arc::ptr_eq(&owners["a"].replica, &owners["b"].replica));
        }

        write(&store, Op::delete(keys.owner("a"))).await;
        let moved = write(&store, Op::put(keys.owner("b"), record("r2"))).await;
        view.catch_up(store.as_ref(), &keys, moved).await.unwrap();
        let held: Vec<&str> = view.replicas.iter().map(|id| &**id).collect();
        assert_eq!(held, ["r2"], "r1 is let go once no key names it");
    }

    #[tokio::test]
    async fn lists_once_then_includes_every_write_up_to_the_revision_asked_for() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let first = write(&store, Op::put(keys.owner("a"), record("r1"))).await;
        let (mut view, _cache) = view_of(&store, &keys).await;
        view.catch_up(store.as_ref(), &keys, 0).await.unwrap();
        assert_eq!(owner_of(&view, "a").as_deref(), Some("r1"));
        assert_eq!(
            view.owners().key_of("a").map(|(_, created)| created),
            Some(first),
            "the epoch is the create revision"
        );

        let claimed = write(&store, Op::put(keys.owner("b"), record("r2"))).await;
        let released = write(&store, Op::delete(keys.owner("a"))).await;
        assert!(claimed < released);
        view.catch_up(store.as_ref(), &keys, released)
            .await
            .unwrap();
        assert_eq!(owner_of(&view, "b").as_deref(), Some("r2"));
        assert_eq!(owner_of(&view, "a"), None, "the delete arrived");
        assert!(
            view.watch.is_some(),
            "followed the watch, did not list again"
        );

        // Another key's change wakes a waiting pass and is applied.
        write(&store, Op::put(keys.owner("c"), record("r3"))).await;
        view.next_change(&keys).await;
        assert_eq!(owner_of(&view, "c").as_deref(), Some("r3"));
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
        assert_eq!(owner_of(&view, "b").as_deref(), Some("stuck"));
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
        assert_eq!(owner_of(&view, "a").as_deref(), Some("r1"));
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
        assert_eq!(owner_of(&view, "a").as_deref(), Some("r1"));
    }
}
