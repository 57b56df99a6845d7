//! The executor: finds accepted operations and runs them step by step
//! through the provider.
//!
//! It lists every cluster state holding an operation slot, then follows the
//! state changes this replica's watch cache applies (re-listing when the
//! cache re-lists or the executor falls behind, and periodically, to catch
//! anything missed); it keeps no watch of its own.
//!
//! # Guarantees
//! - Every write the executor makes goes through `Holding::commit`, which
//!   compares the state key's and the operation's revisions and this
//!   replica's ownership: an operation only moves the cluster while it still
//!   holds it, and only its owner writes.
//! - Every provider call carries the owner's fencing token and is made only
//!   while the claim is alive.
//! - An operation runs at most once per replica at a time.
//!
//! Only clusters this replica owns are driven; the replication layer hands
//! over each cluster it adopts.
//!
//! - An operation found RUNNING under another owner epoch was orphaned by a
//!   lost replica: it is failed with an error naming that replica and step,
//!   never resumed blindly. A PENDING one nobody started is run.

mod calls;
mod finish;
mod holding;
mod plan;
mod run;

pub use plan::{check_plan_input, needs_nodes, plan, resume_index, Step};

use crate::cluster::{from_json, CacheChange, ClusterCache, Spec, StateRecord};
use crate::config::Timeouts;
use crate::operation::{
    ClaimedOperation, LifecycleError, LocalRunner, OperationRecord, Operations, Progress,
};
use crate::provider::Provider;
use crate::replication::{Claim, Replication};
use crate::store::RangeRequest;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

const RESCAN_INTERVAL: Duration = Duration::from_secs(30);
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Runs accepted operations.
pub struct Executor {
    /// Itself, for the tasks it spawns from `&self` (the accept hand-off).
    me: Weak<Executor>,
    operations: Operations,
    provider: Provider,
    replication: Arc<Replication>,
    cache: Arc<ClusterCache>,
    timeouts: Timeouts,
    in_flight: Mutex<HashSet<String>>,
    /// Set once the replica shuts down: operations not started by then are
    /// left PENDING for the clusters' next owners, which run them (started
    /// here, one that outlasted the hand-off would be failed as an orphan).
    stopping: AtomicBool,
    /// Wakes what waits out a backoff once `stopping` is set.
    stopped: tokio::sync::Notify,
    /// Each owned cluster's history size as this replica last counted it,
    /// plus the operations it finished since: history collection counts
    /// the records only when this says a batch is due (or the cluster was
    /// just adopted).
    history: Mutex<HashMap<String, usize>>,
}

impl Executor {
    pub fn new(
        operations: Operations,
        provider: Provider,
        replication: Arc<Replication>,
        cache: Arc<ClusterCache>,
        timeouts: Timeouts,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            operations,
            provider,
            replication,
            cache,
            timeouts,
            in_flight: Mutex::new(HashSet::new()),
            stopping: AtomicBool::new(false),
            stopped: tokio::sync::Notify::new(),
            history: Mutex::new(HashMap::new()),
        })
    }

    /// Starts no operation from now on (the replica is shutting down).
    pub fn stop_taking_work(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stopped.notify_waiters();
    }

    /// Sleeps `delay`, or less when the replica starts shutting down
    /// meanwhile; `false` then (or when it already was).
    async fn pause_unless_stopping(&self, delay: Duration) -> bool {
        let stopped = self.stopped.notified();
        tokio::pin!(stopped);
        stopped.as_mut().enable();
        if self.is_stopping() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = stopped => false,
        }
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Notes an operation finished on `cluster`; when its history should be
    /// collected now, the size expected (0: not counted since this replica
    /// adopted the cluster). The estimate misses records other replicas
    /// wrote (an edit-only request accepted elsewhere), so the history may
    /// run over the limit plus the GC slack by those until the next count.
    fn gc_due(&self, cluster: &str) -> Option<usize> {
        let mut history = self.history();
        match history.get_mut(cluster) {
            Some(size) => {
                *size += 1;
                (*size >= self.operations.gc_threshold()).then_some(*size)
            }
            None => Some(0),
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Collects `cluster`'s history and notes its size after, as an owner
    /// write fenced by this replica's claim on the cluster now (the claim
    /// the operation ran under, or a newer one: either way only its owner
    /// collects); without a claim there is nothing to collect here.
    async fn collect_history(&self, cluster: &str, expected: usize) -> Result<(), LifecycleError> {
        let Some(claim) = self.replication.claim(cluster) else {
            self.history().remove(cluster);
            return Ok(());
        };
        match self
            .operations
            .collect_garbage(cluster, expected, &claim)
            .await
        {
            Ok(left) => {
                self.history().insert(cluster.to_string(), left);
                Ok(())
            }
            Err(error) => {
                self.history().remove(cluster);
                Err(error)
            }
        }
    }

    /// Records how long a provider call took, by call.
    fn observe_provider(&self, call: &str, started: std::time::Instant) {
        self.operations
            .metrics()
            .provider_request_seconds
            .get_or_create(&crate::metrics::RequestLabels {
                request: call.to_string(),
            })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Operations running on this replica now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Whether operation `id` runs on this replica now.
    pub fn runs(&self, id: &str) -> bool {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    /// Finds and runs operations until `shutdown` turns true; `adoptions`
    /// names each cluster this replica just became the owner of.
    pub async fn run(
        self: Arc<Self>,
        mut shutdown: watch::Receiver<bool>,
        mut adoptions: mpsc::UnboundedReceiver<String>,
    ) {
        while !*shutdown.borrow() {
            // Subscribe before listing, so no change after the list is missed.
            let mut changes = self.cache.subscribe();
            if let Err(error) = self.scan().await {
                tracing::warn!(%error, "executor scan failed; retrying");
                tokio::time::sleep(RETRY_DELAY).await;
                continue;
            }
            let rescan = tokio::time::sleep(RESCAN_INTERVAL);
            tokio::pin!(rescan);
            loop {
                tokio::select! {
                    _ = shutdown.changed() => break,
                    _ = &mut rescan => break,
                    Some(cluster) = adoptions.recv() => self.adopt(&cluster).await,
                    change = changes.recv() => match change {
                        Ok(CacheChange::State(kv)) => {
                            // Every replica sees every change: parse only
                            // those of clusters this replica owns.
                            let owned = self
                                .operations
                                .keys()
                                .split_cluster_key(&kv.key)
                                .is_some_and(|(cluster, _)| self.replication.claim(cluster).is_some());
                            if owned {
                                if let Ok(state) = from_json::<StateRecord>(&kv) {
                                    self.start_slot(&kv.key, &state, None);
                                }
                            }
                        }
                        // Missed changes: list again.
                        Ok(CacheChange::Relisted) | Err(_) => break,
                    },
                }
            }
        }
        tracing::info!("executor stopped taking new operations");
    }

    /// Starts every operation found in a slot.
    ///
    /// The clusters this replica owns come from its watch cache when that is
    /// ready (listing every cluster from etcd, on every replica, every
    /// rescan, cost etcd megabytes each time at ten thousand clusters), and
    /// from etcd otherwise. Also forgets the history counts of clusters it
    /// no longer owns.
    async fn scan(self: &Arc<Self>) -> crate::store::Result<()> {
        let mut owned = Vec::new();
        let cached = self.cache.visit_states(|cluster, kv| {
            if self.replication.claim(cluster).is_some() {
                owned.push(kv.clone());
            }
        });
        if !cached {
            let store = self.operations.store();
            let listed = store
                .range(RangeRequest::prefix(self.operations.keys().clusters()))
                .await?;
            owned = listed
                .kvs
                .into_iter()
                .filter(|kv| kv.key.ends_with("/state"))
                .collect();
        }
        for kv in &owned {
            if let Ok(state) = from_json::<StateRecord>(kv) {
                self.start_slot(&kv.key, &state, None);
            }
        }
        self.history()
            .retain(|cluster, _| self.replication.claim(cluster).is_some());
        Ok(())
    }

    /// Looks at a cluster this replica just became the owner of: its
    /// operation may be one a lost owner left behind.
    async fn adopt(self: &Arc<Self>, cluster: &str) {
        // Other owners may have added to its history meanwhile.
        self.history().remove(cluster);
        self.look_at(cluster, None).await;
    }

    /// Starts the operation in the cluster's slot, if any and not running
    /// here yet (`own_accept`: see [`Self::start_slot`]).
    async fn look_at(self: &Arc<Self>, cluster: &str, own_accept: Option<&str>) {
        let key = self.operations.keys().cluster_state(cluster);
        // The cache is at most moments behind etcd, and a slot filled after
        // its view arrives as a change: no read per adopted cluster (a
        // replica may adopt thousands at once).
        if let Some(Ok(record)) = self.cache.get(cluster) {
            self.start_slot(&key, &record.state, own_accept);
            return;
        }
        match self.operations.store().get(&key).await {
            Ok(read) => {
                if let Some(kv) = read.into_single() {
                    if let Ok(state) = from_json::<StateRecord>(&kv) {
                        self.start_slot(&key, &state, own_accept);
                    }
                }
            }
            Err(error) => {
                tracing::warn!(cluster, %error, "cannot read the state of a cluster to look at; the next scan retries")
            }
        }
    }

    /// Starts the operation in a slot, unless the replica is shutting down;
    /// even then when it is `own_accept`, an operation this replica's accept
    /// claimed (committed RUNNING under its epoch: left alone, the next
    /// owner would fail it as an orphan).
    fn start_slot(
        self: &Arc<Self>,
        state_key: &str,
        state: &StateRecord,
        own_accept: Option<&str>,
    ) {
        let Some(slot) = &state.operation else { return };
        if self.is_stopping() && own_accept != Some(slot.id.as_str()) {
            return;
        }
        let Some((cluster, _)) = self.operations.keys().split_cluster_key(state_key) else {
            return;
        };
        if self.replication.claim(cluster).is_none() {
            return;
        }
        if !self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot.id.clone())
        {
            return;
        }
        let this = Arc::clone(self);
        let cluster = cluster.to_string();
        let id = slot.id.clone();
        let claim = self.replication.claim(&cluster);
        tokio::spawn(async move {
            if let Err(error) = this.drive(&cluster, &id).await {
                tracing::warn!(cluster, operation = id, %error, "operation not finished; will retry on the next scan");
            }
            this.drive_ended(&cluster, &id, claim).await;
        });
    }
}

impl Executor {
    /// Makes `operation` RUNNING here at its first step, when this replica
    /// owns its cluster and the plan does not depend on the nodes (so it is
    /// known without asking the provider).
    fn prepare_claim(&self, operation: &mut OperationRecord, spec: &Spec) -> Option<Claim> {
        let claim = self.replication.claim(&operation.cluster)?;
        if needs_nodes(operation) {
            return None;
        }
        let steps = plan(operation, spec, &[]);
        let first = steps.first()?;
        operation.state = crate::operation::OperationState::Running;
        operation.replica = Some(self.replication.replica_id().to_string());
        operation.owner_epoch = Some(claim.epoch);
        operation.started_at = Some(operation.created_at.clone());
        operation.progress = Some(Progress {
            step: 1,
            total_steps: steps.len() as u32,
            step_name: first.name(),
        });
        Some(claim)
    }

    /// After a drive of `operation` that began under `claim`: it no longer
    /// runs here. When the cluster was claimed again meanwhile (this
    /// replica's session lapsed and it won the cluster back under a new
    /// epoch), that adoption found the operation in flight and started
    /// nothing, and the drive just ended on the fence: look again now
    /// rather than at the next rescan.
    async fn drive_ended(self: &Arc<Self>, cluster: &str, operation: &str, claim: Option<Claim>) {
        self.release(operation);
        let reclaimed = self.replication.claim(cluster);
        if reclaimed.is_some() && reclaimed != claim {
            self.look_at(cluster, None).await;
        }
    }

    fn release(&self, operation: &str) {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(operation);
    }
}

impl LocalRunner for Executor {
    fn claim_at_accept(&self, operation: &mut OperationRecord, spec: &Spec) -> Option<Claim> {
        if self.is_stopping() {
            return None;
        }
        let in_flight_here = !self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(operation.id.clone());
        if in_flight_here {
            return None;
        }
        let claim = self.prepare_claim(operation, spec);
        if claim.is_none() {
            self.release(&operation.id);
        }
        claim
    }

    fn abandon(&self, cluster: &str, operation: &str) {
        self.release(operation);
        let Some(this) = self.me.upgrade() else {
            return;
        };
        let (cluster, operation) = (cluster.to_string(), operation.to_string());
        tokio::spawn(async move { this.look_at(&cluster, Some(&operation)).await });
    }

    fn run_claimed(&self, claimed: ClaimedOperation) {
        let Some(this) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let (cluster, id) = (
                claimed.cluster.spec.name.clone(),
                claimed.operation.id.clone(),
            );
            let claim = Some(claimed.claim);
            if let Err(error) = this.drive_claimed(claimed).await {
                tracing::warn!(cluster, operation = id, %error, "operation not finished; will retry on the next scan");
            }
            this.drive_ended(&cluster, &id, claim).await;
        });
    }
}
