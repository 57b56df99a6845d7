//! The executor: the one path from a lifecycle request to its execution.
//!
//! Reading order: `submit` (the API's entry: accept a request, claimed at
//! once when this replica owns the cluster), `start` (how an operation
//! comes to be held here, however it began, and the watch that finds those
//! accepted elsewhere or left by a lost owner), `run` (the steps),
//! `holding` (what a running operation holds, and the fenced commit every
//! write goes through), `calls` (provider calls under the claim), `finish`
//! (how an operation ends), `plan` (the steps as plain data), `shape` (the
//! provider's say on a shape before an accept writes it).
//!
//! # Guarantees
//! - Every write the executor makes goes through `Holding::commit`, which
//!   compares the state key's and the operation's revisions and this
//!   replica's ownership: an operation only moves the cluster while it still
//!   holds it, and only its owner writes.
//! - Every provider call carries the owner's fencing token and is made only
//!   while the claim is alive.
//! - An operation runs at most once per replica at a time: whatever starts
//!   it first takes its in-flight mark ([`OwnerWork::mark`]).
//!
//! Only clusters this replica owns are driven; the replication layer hands
//! over each cluster it adopts.
//!
//! - An operation found RUNNING under another owner epoch was orphaned by a
//!   lost replica. Nothing happens to it before the provider is fenced under
//!   this owner's epoch (which ends the lost owner's calls). Then it is
//!   resumed from its last persisted step (steps are idempotent and
//!   re-planned from the nodes as they are), its record listing each owner
//!   that ran it; or, with `--orphaned-operations=fail` or once it was
//!   orphaned more than the resume limit, failed with an error naming that
//!   replica and step. A PENDING one nobody started is run.

mod calls;
mod finish;
mod holding;
mod plan;
mod run;
mod shape;
mod start;
mod submit;

pub use plan::{check_plan_input, needs_nodes, plan, resume_index, Step};
pub use shape::{shape, Answered, Asked};

use crate::cluster::ClusterCache;
use crate::config::{OrphanPolicy, Timeouts};
use crate::operation::{LifecycleError, Operations};
use crate::owner_work::OwnerWork;
use crate::provider::Providers;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Runs accepted operations.
pub struct Executor {
    operations: Operations,
    /// Each cluster's calls go to its own provider.
    providers: Arc<Providers>,
    /// The claim check, the in-flight marks (operation ids) and the stop
    /// flag, shared with the rest of the owner work. Once the replica shuts
    /// down, operations not started are left PENDING for the clusters'
    /// next owners, which run them (started here, one that outlasted the
    /// hand-off would be failed as an orphan).
    work: Arc<OwnerWork>,
    cache: Arc<ClusterCache>,
    timeouts: Timeouts,
    orphans: OrphanPolicy,
    /// Each owned cluster's history size as this replica last counted it,
    /// plus the operations it finished since: history collection counts
    /// the records only when this says a batch is due (or the cluster was
    /// just adopted).
    history: Mutex<HashMap<String, usize>>,
    /// Each provider's capabilities once asked, by name (GetCapabilities may be
    /// cached): the upgrade order.
    capabilities:
        Mutex<std::collections::HashMap<String, drover_proto::provider::v1::Capabilities>>,
}

impl Executor {
    pub fn new(
        operations: Operations,
        providers: Arc<Providers>,
        work: Arc<OwnerWork>,
        cache: Arc<ClusterCache>,
        timeouts: Timeouts,
        orphans: OrphanPolicy,
    ) -> Arc<Self> {
        Arc::new(Self {
            operations,
            providers,
            work,
            cache,
            timeouts,
            orphans,
            history: Mutex::new(HashMap::new()),
            capabilities: Mutex::default(),
        })
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
        let Some(claim) = self.work.claim(cluster) else {
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

    /// Counts a provider call sent again after an answer that may pass.
    fn count_retry(&self, call: &str) {
        self.operations
            .metrics()
            .provider_request_retries
            .get_or_create(&crate::metrics::RequestLabels {
                request: call.to_string(),
            })
            .inc();
    }
}
