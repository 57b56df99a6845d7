//! A watch cache of every cluster's records, serving Get and List without a
//! round trip to etcd, and the replica's one etcd watch.
//!
//! It lists `clusters/` at revision R, then watches the whole key prefix
//! from R + 1: it applies each change of a cluster key itself and hands the
//! other changes to whoever subscribed to their prefix ([`ClusterCache::watch_keys`]:
//! the operation feed, the owners view, the ownership loop's member
//! changes); the rest (request entries, task runs) it drops. One watch per
//! replica, as Kubernetes' shared informers do: etcd matches and sends each
//! change once per replica instead of once per consumer. When the watch
//! fails (compaction, etcd restart) it ends every subscription and lists
//! again.
//!
//! # Guarantees
//! - The cache only ever moves forward through etcd's history: a read never
//!   shows a cluster older than an earlier read from the same cache.
//! - A subscription delivers, in revision order and without gaps, every
//!   change under its prefix from the revision [`ClusterCache::watch_keys`]
//!   returns; if the watch fails it ends with an error (changes may then be
//!   missed: the subscriber lists again or resubscribes).
//!
//! # Caveats
//! - Reads may lag etcd by the watch delay (milliseconds). Callers that must
//!   see their own writes ask for a linearizable read, served from etcd, or
//!   wait for the cache to show them ([`ClusterCache::wait_until_applied`],
//!   [`ClusterCache::wait_until_shown`]).
//! - The records of one transaction arrive one event at a time, so for an
//!   instant a cluster's spec and state may come from adjacent revisions.
//! - Once stopped, the cache serves no reads, but the watch goes on for as
//!   long as a subscriber follows it (the operation feed answers waits while
//!   the replica drains), unless it fails.

use super::leaves::{CachedKey, ClusterBrief, Interner, Leaves};
use super::{ClusterFilter, ClusterPage, ClusterRecord, Registry, RegistryError};
use crate::keys::{leaf, KeyLayout};
use crate::metrics::Metrics;
use crate::store::{
    EventKind, KeyValue, RangeRequest, SharedStore, StoreError, WatchEvent, WatchStream,
};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};

const RELIST_DELAY: Duration = Duration::from_millis(200);
/// State changes buffered per follower; one that falls further behind is
/// told to re-scan.
const CHANGES_BUFFER: usize = 4096;
/// How often a stopped cache looks whether anyone still follows its watch.
const SUBSCRIBERS_CHECK: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Snapshot {
    /// Whether a list has completed since the last failure.
    ready: bool,
    /// Keyed by `<name>/`, so iteration follows etcd's key order.
    clusters: BTreeMap<String, Leaves>,
    /// Clusters (`<name>/`) that declare tasks or still have task records,
    /// kept up to date on every change so the task scheduler need not scan.
    with_tasks: BTreeSet<String>,
    /// The label strings of every cluster held.
    interner: Interner,
}

impl Snapshot {
    /// Re-derives whether cluster `name` (`<name>/`) has tasks.
    fn update_tasks_flag(&mut self, name: &str) {
        let has_tasks = self.clusters.get(name).is_some_and(|leaves| {
            leaves
                .leaves()
                .any(|key| key.starts_with(leaf::TASKS) || key == leaf::TASK_SET)
                || leaves
                    .get(leaf::SPEC)
                    .is_some_and(|kv| declares_tasks(&kv.value))
        });
        if has_tasks {
            self.with_tasks.insert(name.to_string());
        } else {
            self.with_tasks.remove(name);
        }
    }
}

/// Whether writing or deleting the cluster key with leaf `key` can change
/// whether the cluster has tasks: its spec (which declares them) and its
/// task keys. State and status writes, most of the traffic, cannot.
fn affects_tasks(key: &str) -> bool {
    key == leaf::SPEC || key == leaf::TASK_SET || key.starts_with(leaf::TASKS)
}

/// Whether `key` is a cluster's state key: its leaf is `state` (a task's
/// key under `tasks/` may end in `/state` too, when the task is so named).
fn is_state_key(keys: &KeyLayout, key: &str) -> bool {
    keys.split_cluster_key(key)
        .is_some_and(|(_, rest)| rest == leaf::STATE)
}

/// Whether a stored spec record lists tasks. The spec omits an empty task
/// list, and no other field of it is named `tasks`.
fn declares_tasks(spec_json: &[u8]) -> bool {
    spec_json
        .windows(TASKS_FIELD.len())
        .any(|window| window == TASKS_FIELD)
}

const TASKS_FIELD: &[u8] = b"\"tasks\":[{";

/// The subscribers of the keys outside `clusters/`.
#[derive(Default)]
struct Fanout {
    /// Whether the watch is live: subscriptions can start.
    live: bool,
    /// The revision of the newest change handed out (or of the last list):
    /// a subscription starting now gets every change after it.
    revision: i64,
    subscribers: Vec<(
        String,
        mpsc::UnboundedSender<crate::store::Result<WatchEvent>>,
    )>,
}

impl Fanout {
    /// Hands `event` to the subscribers of its key.
    fn dispatch(&mut self, event: &WatchEvent) {
        self.revision = self.revision.max(event.kv.mod_revision);
        for (prefix, sender) in &self.subscribers {
            if event.kv.key.starts_with(prefix.as_str()) {
                // One that went away is dropped at the next subscription.
                let _ = sender.send(Ok(event.clone()));
            }
        }
    }

    /// Ends every subscription: the watch failed, changes may be missed.
    fn end(&mut self) {
        self.live = false;
        for (_, sender) in self.subscribers.drain(..) {
            let _ = sender.send(Err(StoreError::Unavailable(
                "the replica's watch restarted".to_string(),
            )));
        }
    }

    /// Forgets the subscribers that went away; whether any is left.
    fn prune(&mut self) -> bool {
        self.subscribers.retain(|(_, sender)| !sender.is_closed());
        !self.subscribers.is_empty()
    }
}

/// A change the cache applied, for whoever follows it (the executor) in
/// place of a watch of its own.
#[derive(Debug, Clone)]
pub enum CacheChange {
    /// A cluster's state key was written.
    State(KeyValue),
    /// Another key of this cluster was written or deleted, and the cluster
    /// declares tasks or has task records (or had, before the change).
    Tasks(String),
    /// The cache listed everything anew: changes may have been missed.
    Relisted,
}

pub struct ClusterCache {
    store: SharedStore,
    changes: broadcast::Sender<CacheChange>,
    metrics: Arc<Metrics>,
    keys: KeyLayout,
    registry: Registry,
    snapshot: RwLock<Snapshot>,
    /// The revision of the newest change applied (or of the last list).
    applied: watch::Sender<i64>,
    /// `<prefix>clusters/`: the keys the cache applies.
    clusters: String,
    fanout: Mutex<Fanout>,
}

impl ClusterCache {
    pub fn new(store: SharedStore, keys: KeyLayout, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            changes: broadcast::channel(CHANGES_BUFFER).0,
            metrics,
            registry: Registry::new(store.clone(), keys.clone()),
            clusters: keys.clusters(),
            store,
            keys,
            snapshot: RwLock::new(Snapshot::default()),
            applied: watch::channel(0).0,
            fanout: Mutex::new(Fanout::default()),
        })
    }

    /// Keeps the cache current until `shutdown` turns true, and the watch
    /// going after that for as long as a subscriber follows it.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let prefix = self.keys.clusters();
        while !*shutdown.borrow() {
            let listed = match self.store.range(RangeRequest::prefix(&prefix)).await {
                Ok(listed) => listed,
                Err(error) => {
                    tracing::warn!(%error, "cache list failed; retrying");
                    tokio::time::sleep(RELIST_DELAY).await;
                    continue;
                }
            };
            // Every key, not only the clusters': the replica's one watch.
            let all = self.keys.all();
            let mut watch = match self.store.watch(all, listed.revision + 1).await {
                Ok(watch) => watch,
                Err(error) => {
                    tracing::warn!(%error, "cache watch failed; retrying");
                    tokio::time::sleep(RELIST_DELAY).await;
                    continue;
                }
            };
            {
                let mut snapshot = self.write();
                snapshot.clusters.clear();
                snapshot.with_tasks.clear();
                for kv in listed.kvs {
                    self.insert(&mut snapshot, kv);
                }
                snapshot.ready = true;
                self.metrics.clusters.set(snapshot.clusters.len() as i64);
            }
            self.applied.send_replace(listed.revision);
            {
                let mut fanout = self.fanout();
                fanout.live = true;
                fanout.revision = listed.revision;
            }
            let _ = self.changes.send(CacheChange::Relisted);
            let stopped = self.follow(&mut watch, &mut shutdown).await;
            // Until the next list completes, reads go to etcd, and
            // subscribers list again or subscribe anew.
            self.write().ready = false;
            self.fanout().end();
            if stopped {
                return;
            }
        }
    }

    /// Applies the watch's changes until it fails (`false`: list again) or,
    /// once `shutdown` turned true, until nobody subscribes any more
    /// (`true`).
    async fn follow(&self, watch: &mut WatchStream, shutdown: &mut watch::Receiver<bool>) -> bool {
        let mut serving = true;
        let mut check = tokio::time::interval(SUBSCRIBERS_CHECK);
        loop {
            tokio::select! {
                _ = shutdown.changed(), if serving => {
                    serving = false;
                    // No longer followed: the reads served while the
                    // replica drains go to etcd rather than to a view
                    // that would go stale.
                    self.write().ready = false;
                    // Waiters for a revision (`show`) see it at once.
                    self.applied.send_modify(|_| {});
                }
                _ = check.tick(), if !serving => {
                    if !self.fanout().prune() {
                        return true;
                    }
                }
                event = watch.next() => match event {
                    // Nobody subscribes to cluster keys (see `watch_keys`).
                    Some(Ok(event)) if event.kv.key.starts_with(&self.clusters) => {
                        if serving {
                            self.apply(event.kind, event.kv);
                        }
                    }
                    Some(Ok(event)) => self.fanout().dispatch(&event),
                    Some(Err(error)) => {
                        tracing::info!(%error, "cache watch ended; re-listing");
                        return !serving;
                    }
                    None => return !serving,
                },
            }
        }
    }

    /// Follows the watch's changes of the keys under `prefix` (keys outside
    /// `clusters/`: the cache applies those itself) from now on. Returns the
    /// changes and the revision from which they are complete: every change
    /// under `prefix` from it on is delivered, in order. `None` while the
    /// watch is not live (starting, or listing again).
    ///
    /// A subscriber that needs the keys as they are lists them after
    /// subscribing, and skips the changes its list already holds: the list
    /// is served at a revision at least that of every change the watch
    /// delivered before.
    pub fn watch_keys(&self, prefix: &str) -> Option<(WatchStream, i64)> {
        let mut fanout = self.fanout();
        if !fanout.live {
            return None;
        }
        fanout.prune();
        let (sender, receiver) = mpsc::unbounded_channel();
        fanout.subscribers.push((prefix.to_string(), sender));
        Some((WatchStream::new(receiver), fanout.revision + 1))
    }

    fn fanout(&self) -> std::sync::MutexGuard<'_, Fanout> {
        self.fanout.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Snapshot> {
        self.snapshot.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Snapshot> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, snapshot: &mut Snapshot, kv: KeyValue) {
        let Some((name, leaf)) = self.keys.split_cluster_dir(&kv.key) else {
            return;
        };
        let tasks_changed = affects_tasks(leaf).then(|| name.to_string());
        let dir_len = kv.key.len() - leaf.len();
        let Snapshot {
            clusters, interner, ..
        } = snapshot;
        match clusters.get_mut(name) {
            Some(leaves) => leaves.put(dir_len, kv, interner),
            None => {
                let name = name.to_string();
                let mut leaves = Leaves::default();
                leaves.put(dir_len, kv, interner);
                clusters.insert(name, leaves);
            }
        }
        if let Some(name) = tasks_changed {
            snapshot.update_tasks_flag(&name);
        }
    }

    /// Follows the state changes the cache applies from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<CacheChange> {
        self.changes.subscribe()
    }

    /// Whether `cluster` declares tasks or has task records.
    pub fn has_tasks(&self, cluster: &str) -> bool {
        self.read().with_tasks.contains(&format!("{cluster}/"))
    }

    /// The key layout the cache reads.
    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    fn apply(&self, kind: EventKind, kv: KeyValue) {
        // Followers hear of a change once the cache shows it.
        let state_key = is_state_key(&self.keys, &kv.key);
        let changed_state = (kind == EventKind::Put && state_key).then(|| kv.clone());
        let other_key = (!state_key).then(|| kv.key.clone());
        let tasks_before = other_key
            .as_deref()
            .and_then(|key| self.task_cluster_of(key));
        let revision = kv.mod_revision;
        self.apply_to_snapshot(kind, kv);
        self.applied.send_replace(revision);
        if let Some(kv) = changed_state {
            let _ = self.changes.send(CacheChange::State(kv));
        }
        let tasks = tasks_before.or_else(|| self.task_cluster_of(other_key.as_deref()?));
        if let Some(cluster) = tasks {
            let _ = self.changes.send(CacheChange::Tasks(cluster));
        }
    }

    /// The cluster of `key` when the cluster has tasks or the key is one
    /// that decides whether it has.
    fn task_cluster_of(&self, key: &str) -> Option<String> {
        let (dir, leaf) = self.keys.split_cluster_dir(key)?;
        let with_tasks = affects_tasks(leaf) || self.read().with_tasks.contains(dir);
        with_tasks.then(|| dir.trim_end_matches('/').to_string())
    }

    fn apply_to_snapshot(&self, kind: EventKind, kv: KeyValue) {
        let mut snapshot = self.write();
        match kind {
            EventKind::Put => {
                self.insert(&mut snapshot, kv);
                self.metrics.clusters.set(snapshot.clusters.len() as i64);
            }
            EventKind::Delete => {
                if let Some((name, leaf)) = self.keys.split_cluster_dir(&kv.key) {
                    let mut gone = false;
                    if let Some(keys) = snapshot.clusters.get_mut(name) {
                        keys.remove(leaf);
                        if keys.is_empty() {
                            snapshot.clusters.remove(name);
                            self.metrics.clusters.set(snapshot.clusters.len() as i64);
                            gone = true;
                        }
                    }
                    if gone || affects_tasks(leaf) {
                        snapshot.update_tasks_flag(name);
                    }
                }
            }
        }
    }

    /// The clusters that declare tasks or have task records, each with the
    /// newest mod revision among its keys (so a caller can tell whether it
    /// changed since it last looked).
    pub fn task_clusters(&self) -> Vec<(String, i64)> {
        let snapshot = self.read();
        snapshot
            .with_tasks
            .iter()
            .filter_map(|name| {
                let leaves = snapshot.clusters.get(name)?;
                let revision = leaves.values().map(|kv| kv.mod_revision).max()?;
                Some((name.trim_end_matches('/').to_string(), revision))
            })
            .collect()
    }

    /// Calls `visit` with each cluster's name, state and labels, in name
    /// order, under the cache's read lock (so `visit` must be quick); every
    /// cluster with a state record this replica understands. `false` when
    /// the cache is not ready.
    pub fn visit_briefs(&self, mut visit: impl FnMut(&str, ClusterBrief<'_>)) -> bool {
        let snapshot = self.read();
        if !snapshot.ready {
            return false;
        }
        for (name, leaves) in &snapshot.clusters {
            if let Some(brief) = leaves.brief() {
                visit(name.trim_end_matches('/'), brief);
            }
        }
        true
    }

    /// Calls `visit` with each cluster's name and state key, in name order,
    /// under the cache's read lock (so `visit` must be quick: nothing is
    /// copied); `false` when the cache is not ready.
    fn visit_states(&self, mut visit: impl FnMut(&str, &CachedKey)) -> bool {
        let snapshot = self.read();
        if !snapshot.ready {
            return false;
        }
        for (name, leaves) in &snapshot.clusters {
            if let Some(state) = leaves.get(leaf::STATE) {
                visit(name.trim_end_matches('/'), state);
            }
        }
        true
    }

    /// Calls `visit` with each cluster's name and state key: from the cache
    /// when it is ready (listing every cluster from etcd, on every replica,
    /// cost etcd megabytes each time at ten thousand clusters), from etcd
    /// otherwise. The one read of "every state" the owner work makes.
    pub async fn for_each_state(
        &self,
        mut visit: impl FnMut(&str, &CachedKey) + Send,
    ) -> crate::store::Result<()> {
        if self.visit_states(&mut visit) {
            return Ok(());
        }
        let listed = self
            .store
            .range(RangeRequest::prefix(self.keys.clusters()))
            .await?;
        for kv in listed.kvs {
            if !is_state_key(&self.keys, &kv.key) {
                continue;
            }
            if let Some((cluster, _)) = self.keys.split_cluster_key(&kv.key) {
                let cluster = cluster.to_string();
                visit(&cluster, &CachedKey::new(leaf::STATE.into(), kv));
            }
        }
        Ok(())
    }

    /// How long an answer waits for the cache to show the write it reports
    /// ([`Self::wait_until_applied`]): normally milliseconds; past it, the
    /// answer goes out anyway.
    pub const CATCH_UP: Duration = Duration::from_secs(1);

    /// Waits, for at most `limit`, until the cache has applied the changes
    /// up to `revision`. Returns at once when the cache is not ready: reads
    /// then go to etcd anyway.
    ///
    /// A caller that learnt of a write from elsewhere (the operation feed)
    /// calls it before answering, so that its client's next request to this
    /// replica sees the clusters as that write left them. (A revision's
    /// keys, one transaction's or those of a batch the etcd store sent
    /// together, arrive one event at a time: its first cluster key is then
    /// shown, and the rest follow in microseconds.)
    pub async fn wait_until_applied(&self, revision: i64, limit: Duration) {
        let mut applied = self.applied.subscribe();
        let shown = |applied: &i64| *applied >= revision || !self.read().ready;
        let _ = tokio::time::timeout(limit, applied.wait_for(shown)).await;
    }

    /// Waits, for at most `limit`, until the cache shows `cluster`'s spec
    /// and state keys at least as new as in `cluster` (or is not ready:
    /// reads then go to etcd). Unlike [`Self::wait_until_applied`], it does
    /// not return between two keys of one revision, which arrive one event
    /// at a time: a read after it finds the cluster whole.
    pub async fn wait_until_shown(&self, cluster: &ClusterRecord, limit: Duration) {
        let dir = format!("{}/", cluster.spec.name);
        let newer = |leaves: &Leaves, leaf: &str, revision: i64| {
            leaves
                .get(leaf)
                .is_some_and(|key| key.mod_revision >= revision)
        };
        let shown = |_: &i64| {
            let snapshot = self.read();
            !snapshot.ready
                || snapshot.clusters.get(&dir).is_some_and(|leaves| {
                    newer(leaves, leaf::SPEC, cluster.spec_revision)
                        && newer(leaves, leaf::STATE, cluster.state_revision)
                })
        };
        let mut applied = self.applied.subscribe();
        let _ = tokio::time::timeout(limit, applied.wait_for(shown)).await;
    }

    /// One cluster from the cache; `None` when the cache is not ready.
    pub fn get(&self, name: &str) -> Option<Result<ClusterRecord, RegistryError>> {
        let snapshot = self.read();
        if !snapshot.ready {
            return None;
        }
        let dir = self.keys.cluster(name);
        let kvs = snapshot
            .clusters
            .get(&format!("{name}/"))
            .map(|keys| keys.values().map(|key| key.to_key_value(&dir)).collect())
            .unwrap_or_default();
        Some(
            self.registry
                .assemble(kvs)
                .and_then(|c| c.ok_or_else(|| RegistryError::NotFound(name.to_string()))),
        )
    }

    /// Whether the cache follows etcd (listed, watching).
    pub fn is_ready(&self) -> bool {
        self.read().ready
    }

    /// A cluster's state key as the cache holds it: a cheaper look than
    /// [`Self::get`] for whether an operation still holds the cluster.
    /// `None` when the cache holds no such cluster. It answers from what
    /// it holds even when not ready (re-listing after a lost watch):
    /// callers that need a current view check [`Self::is_ready`] first.
    pub fn state_of(&self, name: &str) -> Option<KeyValue> {
        let state = self.cached_state(name)?;
        Some(state.to_key_value(&self.keys.cluster(name)))
    }

    /// [`Self::state_of`], as the cache holds it (the leaf, not the key).
    pub fn cached_state(&self, name: &str) -> Option<CachedKey> {
        let snapshot = self.read();
        let leaves = snapshot.clusters.get(&format!("{name}/"))?;
        leaves.get(leaf::STATE).cloned()
    }

    /// A page of clusters from the cache, as [`Registry::list`] would return
    /// it; `None` when the cache is not ready.
    pub fn list(
        &self,
        filter: &ClusterFilter,
        after: Option<&str>,
        page_size: usize,
    ) -> Option<Result<ClusterPage, RegistryError>> {
        let snapshot = self.read();
        if !snapshot.ready {
            return None;
        }
        let start = match after {
            Some(name) => Bound::Excluded(format!("{name}/")),
            None => Bound::Unbounded,
        };
        let mut clusters = Vec::new();
        let prefix = self.keys.clusters();
        for (name, keys) in snapshot.clusters.range((start, Bound::Unbounded)) {
            // Most of a selective filter's misses go without parsing.
            if keys.brief().is_some_and(|brief| !brief.matches(filter)) {
                continue;
            }
            let dir = format!("{prefix}{name}");
            let kvs = keys.values().map(|key| key.to_key_value(&dir)).collect();
            match self.registry.assemble(kvs) {
                Ok(Some(cluster)) if filter.matches(&cluster) => clusters.push(cluster),
                Ok(_) => {}
                Err(error) => return Some(Err(error)),
            }
            if clusters.len() > page_size {
                break;
            }
        }
        let next_after = (clusters.len() > page_size).then(|| {
            clusters.truncate(page_size);
            clusters
                .last()
                .map(|c| c.spec.name.clone())
                .unwrap_or_default()
        });
        Some(Ok(ClusterPage {
            clusters,
            next_after,
            revision: *self.applied.borrow(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_clusters_own_state_key_is_one_not_a_task_named_state() {
        let keys = KeyLayout::new("/drover/v1/");
        assert!(is_state_key(&keys, &keys.cluster_state("prod")));
        let task = keys.task("prod", "backup", "state");
        assert!(task.ends_with("/state"), "{task}");
        assert!(!is_state_key(&keys, &task));
        assert!(!is_state_key(&keys, &keys.cluster_spec("prod")));
    }
    use crate::cluster::{from_json, to_json, ClusterState, Spec, SpecRecord, StateRecord};
    use crate::store::{MemoryStore, Op, Store, Txn};

    fn spec() -> Spec {
        Spec {
            version: "1.0.0".into(),
            control_nodes: 1,
            node_offering: "m".into(),
            ..Spec::default()
        }
    }

    async fn eventually<F: Fn() -> bool>(what: &str, condition: F) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn follows_the_store_in_key_order() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let registry = Registry::new(store.clone(), keys.clone());
        registry
            .create("foo", "u1".into(), spec(), "", None)
            .await
            .unwrap();
        let cache = ClusterCache::new(store.clone(), keys.clone(), Metrics::new());
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(Arc::clone(&cache).run(stopped));
        eventually("the first list", || {
            cache.get("foo").is_some_and(|r| r.is_ok())
        })
        .await;

        for (name, uid) in [("foo-bar", "u2"), ("foo0", "u3")] {
            registry
                .create(name, uid.into(), spec(), "", None)
                .await
                .unwrap();
        }
        eventually("the watched creates", || {
            cache
                .list(&ClusterFilter::default(), None, 10)
                .is_some_and(|p| p.unwrap().clusters.len() == 3)
        })
        .await;
        let from_cache = cache
            .list(&ClusterFilter::default(), None, 2)
            .unwrap()
            .unwrap();
        let from_store = registry
            .list(&ClusterFilter::default(), None, 2)
            .await
            .unwrap();
        let names = |page: &ClusterPage| {
            page.clusters
                .iter()
                .map(|c| c.spec.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&from_cache), names(&from_store));
        assert_eq!(names(&from_cache), ["foo-bar", "foo"]);
        assert_eq!(from_cache.next_after, from_store.next_after);
        let rest = cache
            .list(
                &ClusterFilter::default(),
                from_cache.next_after.as_deref(),
                2,
            )
            .unwrap()
            .unwrap();
        assert_eq!(names(&rest), ["foo0"]);

        store
            .txn(
                crate::store::Txn::new()
                    .and_then([crate::store::Op::delete_prefix(keys.cluster("foo0"))]),
            )
            .await
            .unwrap();
        eventually("the delete", || {
            matches!(cache.get("foo0"), Some(Err(RegistryError::NotFound(_))))
        })
        .await;
        let _ = stop.send(true);
    }

    /// Filters are matched on what the cache read off each record when it
    /// was written: after relabels and state changes, the pages must be
    /// those the registry reads from the store.
    #[tokio::test]
    async fn filtered_pages_follow_relabels_and_state_changes() {
        let (store, keys, cache, stop) = running_cache();
        let registry = Registry::new(store.clone(), keys.clone());
        for (i, env) in ["prod", "dev", "prod", "dev", "prod"].iter().enumerate() {
            let mut spec = spec();
            spec.labels = [("env".to_string(), env.to_string())].into();
            let name = format!("c{i}");
            registry
                .create(&name, name.clone(), spec, "", None)
                .await
                .unwrap();
        }
        // c0 moves to dev; c1 runs.
        let read = |key: String| {
            let store = store.clone();
            async move { store.get(&key).await.unwrap().kvs[0].clone() }
        };
        let mut relabelled: SpecRecord = from_json(&read(keys.cluster_spec("c0")).await).unwrap();
        relabelled.spec.labels.insert("env".into(), "dev".into());
        let mut running: StateRecord = from_json(&read(keys.cluster_state("c1")).await).unwrap();
        running.state = ClusterState::Running;
        let written = store
            .txn(Txn::new().and_then([
                Op::put(keys.cluster_spec("c0"), to_json(&relabelled)),
                Op::put(keys.cluster_state("c1"), to_json(&running)),
            ]))
            .await
            .unwrap()
            .revision;
        eventually("the first list", || cache.is_ready()).await;
        cache
            .wait_until_applied(written, Duration::from_secs(10))
            .await;

        let names = |page: ClusterPage| -> Vec<String> {
            page.clusters.into_iter().map(|c| c.spec.name).collect()
        };
        let label = |v: &str| vec![("env".to_string(), v.to_string())];
        let filters = [
            (
                ClusterFilter {
                    state: None,
                    labels: label("dev"),
                },
                vec!["c0", "c1", "c3"],
            ),
            (
                ClusterFilter {
                    state: None,
                    labels: label("prod"),
                },
                vec!["c2", "c4"],
            ),
            (
                ClusterFilter {
                    state: Some(ClusterState::Created),
                    labels: label("dev"),
                },
                vec!["c0", "c3"],
            ),
            (
                ClusterFilter {
                    state: Some(ClusterState::Running),
                    labels: vec![],
                },
                vec!["c1"],
            ),
        ];
        for (filter, expected) in filters {
            let cached = names(cache.list(&filter, None, 10).unwrap().unwrap());
            let stored = names(registry.list(&filter, None, 10).await.unwrap());
            assert_eq!(cached, stored, "{filter:?}");
            assert_eq!(cached, expected, "{filter:?}");
        }
        let mut busy = 0;
        assert!(cache.visit_briefs(|_, brief| busy += usize::from(brief.state.busy)));
        assert_eq!(busy, 0);
        let _ = stop.send(true);
    }

    /// An empty memory store and a cache following it until `stop` says so.
    fn running_cache() -> (
        Arc<MemoryStore>,
        KeyLayout,
        Arc<ClusterCache>,
        watch::Sender<bool>,
    ) {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let cache = ClusterCache::new(store.clone(), keys.clone(), Metrics::new());
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(Arc::clone(&cache).run(stopped));
        (store, keys, cache, stop)
    }

    #[tokio::test]
    async fn knows_which_clusters_have_tasks_through_every_kind_of_change() {
        use crate::store::{Op, Txn};
        let (store, keys, cache, stop) = running_cache();
        let write = |op: Op| {
            let store = store.clone();
            async move { store.txn(Txn::new().and_then([op])).await.unwrap() }
        };
        let with_tasks = || -> Vec<String> {
            cache
                .task_clusters()
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        // Waits until the cache has applied everything written so far.
        let mut marks = 0;
        let mut settle = || {
            marks += 1;
            let (cache, mark) = (Arc::clone(&cache), marks.to_string());
            let op = Op::put(keys.cluster_state("marker"), mark.clone());
            let write = write(op);
            async move {
                write.await;
                eventually("the marker", || {
                    let mut marked = false;
                    cache.visit_states(|_, kv| marked |= *kv.value == *mark.as_bytes());
                    marked
                })
                .await;
            }
        };
        write(Op::put(keys.cluster_state("a"), "{}")).await;
        write(Op::put(
            keys.cluster_spec("a"),
            r#"{"tasks":[{"name":"r"}]}"#,
        ))
        .await;
        settle().await;
        assert_eq!(with_tasks(), ["a"], "the spec declares tasks");
        write(Op::put(keys.cluster_state("a"), "{ }")).await;
        write(Op::put(keys.cluster_status("a"), "{}")).await;
        settle().await;
        assert_eq!(
            with_tasks(),
            ["a"],
            "state and status writes change nothing"
        );
        write(Op::put(keys.cluster_spec("a"), "{}")).await;
        settle().await;
        assert!(with_tasks().is_empty(), "the spec no longer declares any");
        write(Op::put(keys.task("a", "repair", "r"), "{}")).await;
        settle().await;
        assert_eq!(with_tasks(), ["a"], "a task record is left");
        write(Op::delete(keys.task("a", "repair", "r"))).await;
        settle().await;
        assert!(with_tasks().is_empty(), "the task record is gone");
        let _ = stop.send(true);
    }

    async fn next_event(stream: &mut WatchStream) -> WatchEvent {
        let next = tokio::time::timeout(Duration::from_secs(10), stream.next());
        let event = next.await.expect("an event in time");
        event.expect("the stream goes on").expect("no error")
    }

    #[tokio::test]
    async fn hands_the_other_keys_to_their_subscribers_from_the_revision_it_says() {
        use crate::store::{Op, Txn};
        let (store, keys, cache, stop) = running_cache();
        let write = |op: Op| {
            let store = store.clone();
            async move { store.txn(Txn::new().and_then([op])).await.unwrap() }
        };
        let before = write(Op::put(keys.owner("a"), "r0")).await.revision;
        eventually("the watch to go live", || {
            cache.watch_keys(&keys.owners()).is_some()
        })
        .await;
        let (mut owners, from) = cache.watch_keys(&keys.owners()).unwrap();
        assert!(from > before, "complete from after what was written before");
        write(Op::put(keys.cluster_state("a"), "{}")).await;
        write(Op::put(keys.member("r1"), "{}")).await;
        let claimed = write(Op::put(keys.owner("a"), "r1")).await.revision;
        write(Op::delete(keys.owner("a"))).await;
        let put = next_event(&mut owners).await;
        assert_eq!((put.kind, put.kv.mod_revision), (EventKind::Put, claimed));
        assert_eq!(next_event(&mut owners).await.kind, EventKind::Delete);
        // The cluster key went to the cache itself.
        eventually("the state in the cache", || {
            let mut seen = false;
            cache.visit_states(|name, _| seen |= name == "a");
            seen
        })
        .await;
        let _ = stop.send(true);
    }
}
