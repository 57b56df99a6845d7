//! What every kind of owner work shares: the executor's operations, the
//! task scheduler's runs and the status scanner's checks, and the one
//! [`runtime`] that runs them.
//!
//! Each of them runs work for the clusters this replica owns, and each
//! needs the same few things, written once here: the claim check, a stop
//! flag for shutdown, an in-flight mark so one piece of work runs at most
//! once per replica at a time, and the fenced commit that survives a
//! reply etcd lost. The work itself (what to plan, what to call, what to
//! write) stays with its owner, small, as kube-runtime keeps reconcilers
//! small: the [`runtime`] owns the queue, the removal of repeats and the
//! requeue.
//!
//! One [`OwnerWork`] per replica, shared by all three: one in-flight set,
//! one stop flag.
//!
//! # Guarantees
//! - [`OwnerWork::mark`] hands out at most one [`InFlight`] per id at a
//!   time; the mark goes when the guard is dropped, however the work ends
//!   (a panic included).
//! - [`OwnerWork::in_flight`] counts what the drain waits for: operations
//!   and reconciles, not task runs waiting on their provider (a run does
//!   not keep its cluster through a hand-off: the next owner aborts and
//!   retries it).
//! - [`OwnerWork::commit`] applies a transaction only while it carries the
//!   caller's compares; a write whose reply was lost is retried only while
//!   the claim it is fenced by still holds, and recognised afterwards by a
//!   key it wrote, so an unknown outcome is never reported as a loss when
//!   it committed (nor as a success when it did not).
//!
//! # Caveats
//! - A claim checked here may end a moment later: every write still
//!   compares the claim's fence in etcd, so the check only saves work.

pub mod runtime;

pub use runtime::{Controller, Next, ReconcileError, Reconciler, Runtime, Triggers};

use crate::cluster::StateBrief;
use crate::replication::{Claim, Ownership};
use crate::store::{Op, SharedStore, StoreError, Txn};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// What a mark in flight is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// An operation's drive (by operation id).
    Operation,
    /// A task run waiting on its provider (by run id).
    TaskRun,
    /// A reconcile of the runtime (by controller and cluster).
    Reconcile,
}

type Marks = Arc<Mutex<HashMap<String, Held>>>;

/// The owner work of this replica: what the executor, the task scheduler
/// and the scanner share.
pub struct OwnerWork {
    replication: Arc<Ownership>,
    in_flight: Marks,
    /// Set once the replica shuts down: no new work starts from then on.
    stopping: AtomicBool,
    /// Wakes what waits out a backoff once `stopping` is set.
    stopped: tokio::sync::Notify,
    /// Asks the runtime to look at a cluster again ([`Self::trigger`]).
    triggers: mpsc::UnboundedSender<(Controller, String)>,
    /// The other end, until the runtime takes it.
    requests: Mutex<Option<mpsc::UnboundedReceiver<(Controller, String)>>>,
}

/// The mark of one piece of work in flight here; dropping it ends the mark.
#[must_use = "the work is in flight only while the guard lives"]
pub struct InFlight {
    id: String,
    set: Marks,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.set).remove(&self.id);
    }
}

impl OwnerWork {
    pub fn new(replication: Arc<Ownership>) -> Arc<Self> {
        let (triggers, requests) = mpsc::unbounded_channel();
        Arc::new(Self {
            replication,
            in_flight: Arc::default(),
            stopping: AtomicBool::new(false),
            stopped: tokio::sync::Notify::new(),
            triggers,
            requests: Mutex::new(Some(requests)),
        })
    }

    /// Asks `controller` to look at `cluster` again soon (a change the
    /// cache would not show: an operation that ended here, a run's end
    /// that could not be recorded).
    pub fn trigger(&self, controller: Controller, cluster: &str) {
        let _ = self.triggers.send((controller, cluster.to_string()));
    }

    /// The requests [`Self::trigger`] sends, once: for the runtime.
    fn take_requests(&self) -> Option<mpsc::UnboundedReceiver<(Controller, String)>> {
        lock(&self.requests).take()
    }

    pub fn replication(&self) -> &Arc<Ownership> {
        &self.replication
    }

    /// This replica's claim on `cluster`, while it believes in it.
    pub fn claim(&self, cluster: &str) -> Option<Claim> {
        self.replication.claim(cluster)
    }

    /// The owned clusters whose state, as `cache` shows it, `keep`
    /// accepts: the candidates of a controller's resync. Every owned one
    /// while the cache is not ready (its reconciles then read etcd).
    pub fn owned_where(
        &self,
        cache: &crate::cluster::ClusterCache,
        keep: impl Fn(StateBrief) -> bool,
    ) -> Vec<String> {
        let mut owned = Vec::new();
        let ready = cache.visit_briefs(|cluster, brief| {
            if keep(brief.state) && self.claim(cluster).is_some() {
                owned.push(cluster.to_string());
            }
        });
        if !ready {
            return self.replication.owned_clusters();
        }
        owned
    }

    /// Whether this replica still holds `cluster` under `claim` (not a
    /// newer claim of its own: work begun under an older one must stop).
    pub fn holds(&self, cluster: &str, claim: Claim) -> bool {
        self.replication.claim(cluster) == Some(claim)
    }

    /// Marks operation `id` in flight here; `None` when it already is.
    pub fn mark(&self, id: &str) -> Option<InFlight> {
        self.mark_as(id, Held::Operation)
    }

    /// Marks task run `id` in flight here; `None` when it already is.
    pub fn mark_task_run(&self, id: &str) -> Option<InFlight> {
        self.mark_as(id, Held::TaskRun)
    }

    fn mark_as(&self, id: &str, held: Held) -> Option<InFlight> {
        let mut marks = lock(&self.in_flight);
        if marks.contains_key(id) {
            return None;
        }
        marks.insert(id.to_string(), held);
        Some(InFlight {
            id: id.to_string(),
            set: Arc::clone(&self.in_flight),
        })
    }

    /// How many pieces of work the drain waits for are in flight here now:
    /// operations and reconciles (task runs do not keep their cluster).
    pub fn in_flight(&self) -> usize {
        let marks = lock(&self.in_flight);
        marks
            .values()
            .filter(|held| **held != Held::TaskRun)
            .count()
    }

    /// Whether `id` is in flight here now.
    pub fn runs(&self, id: &str) -> bool {
        lock(&self.in_flight).contains_key(id)
    }

    /// Starts no new work from now on (the replica is shutting down).
    pub fn stop_taking_work(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stopped.notify_waiters();
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Sleeps `delay`, or less when the replica starts shutting down
    /// meanwhile; `false` then (or when it already was).
    pub async fn pause_unless_stopping(&self, delay: Duration) -> bool {
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

    /// Commits `txn`, an owner write on `cluster` fenced by `claim` (its
    /// compares include the claim's fence), and returns the revision it
    /// committed at.
    ///
    /// etcd being unreachable or out of space is retried while the claim
    /// holds. A write whose outcome was unknown (the connection broke after
    /// sending) and whose retry then lost its compare is recognised by
    /// `marker`, a put of the transaction whose value only this write
    /// produces: found in etcd, the write committed.
    pub async fn commit(
        &self,
        store: &SharedStore,
        txn: Txn,
        cluster: &str,
        claim: Claim,
        marker: Option<&Op>,
    ) -> Result<i64, StoreError> {
        let mut delays = etcd_retries();
        let mut ambiguous = false;
        loop {
            let delay = delays.next().unwrap_or(ETCD_RETRY_MAX);
            let error = match store.cas(txn.clone()).await {
                Ok(result) => return Ok(result.revision),
                Err(error) => error,
            };
            match error {
                StoreError::Unavailable(error) if self.holds(cluster, claim) => {
                    tracing::warn!(cluster, %error, retry_in = ?delay, "etcd unavailable; retrying the write");
                    ambiguous = true;
                }
                // Refused before applying: the work waits (holding its
                // cluster) for an operator to free space, instead of
                // failing an operation it could not even record as failed.
                StoreError::NoSpace(error) if self.holds(cluster, claim) => {
                    tracing::error!(cluster, %error, retry_in = ?delay, "etcd is out of space; retrying the write");
                }
                StoreError::Conflict { revision } if ambiguous => {
                    match written_by(store, marker).await {
                        Ok(Some(at)) => return Ok(at),
                        Ok(None) => return Err(StoreError::Conflict { revision }),
                        // Still unreachable: try the whole write again (its
                        // compare fails again if it had committed).
                        Err(StoreError::Unavailable(error)) if self.holds(cluster, claim) => {
                            tracing::warn!(cluster, %error, retry_in = ?delay, "etcd unavailable; retrying the write");
                        }
                        Err(error) => return Err(error),
                    }
                }
                error => return Err(error),
            }
            tokio::time::sleep(delay).await;
        }
    }
}

impl OwnerWork {
    /// Reads `key` for owner work on `cluster` under `claim`, retrying while
    /// etcd is unavailable and the claim holds (as [`Self::commit`] does),
    /// so a blip of etcd does not end the work that needs the read.
    pub async fn get_while_held(
        &self,
        store: &SharedStore,
        key: &str,
        cluster: &str,
        claim: Claim,
    ) -> Result<Option<crate::store::KeyValue>, StoreError> {
        let mut delays = etcd_retries();
        loop {
            let delay = delays.next().unwrap_or(ETCD_RETRY_MAX);
            match store.get(key).await {
                Ok(read) => return Ok(read.into_single()),
                Err(StoreError::Unavailable(error)) if self.holds(cluster, claim) => {
                    tracing::warn!(cluster, %error, retry_in = ?delay, "etcd unavailable; retrying the read");
                }
                Err(error) => return Err(error),
            }
            tokio::time::sleep(delay).await;
        }
    }
}

/// The longest wait between two attempts at a write or read etcd could
/// not take.
const ETCD_RETRY_MAX: Duration = Duration::from_secs(2);

/// The waits between attempts at a write or read etcd could not take,
/// for as long as the claim holds: 100 ms, doubling, at most 2 s.
fn etcd_retries() -> backon::ExponentialBackoff {
    crate::retry::doubling(Duration::from_millis(100), ETCD_RETRY_MAX)
}

/// The revision at which `marker` (a put) is in etcd as it would write it,
/// if it is.
async fn written_by(store: &SharedStore, marker: Option<&Op>) -> Result<Option<i64>, StoreError> {
    let Some(Op::Put { key, value, .. }) = marker else {
        return Ok(None);
    };
    let current = store.get(key).await?.into_single();
    Ok(current
        .filter(|kv| &kv.value == value)
        .map(|kv| kv.mod_revision))
}
