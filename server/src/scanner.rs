//! The status scanner: compares what the provider reports with each idle
//! cluster's state and moves it by the table.
//!
//! - Running with faulty nodes, or fewer nodes than the spec has (missing
//!   ones) → Alert (FaultsDetected), a CAS on the state as read.
//! - Alert with every node healthy and none missing → a Recover operation
//!   (a missing node is the remediator's, within its budgets) (Recovering →
//!   Running); Alert with every node stopped → a Stop operation (Stopping →
//!   Stopped). Both go through the normal accept path, so each move is an
//!   edge and holds the slot.
//! - Destroying with no operation (a destroy that failed) → the destroy is
//!   retried.
//! - Running, Alert, Stopped or Error: `status.nodes` is refreshed from the
//!   provider's answer (a describe fenced under the owner's epoch) when
//!   the nodes it shows differ (id, role, power, version, readiness), so a
//!   status left stale — a describe that failed after a failed step —
//!   heals without a new operation. The write is fenced and compares the
//!   cluster's keys as scanned.
//!
//! A paused cluster (`spec.paused`) is observed (its status refreshed, a
//! Running one with faulty nodes moved to Alert) but nothing is started
//! for it: no Recover, no Stop, no destroy retry.
//!
//! A reconciler on the owner-work runtime, which hands it every owned
//! cluster each `--scan-interval`, as its watch cache shows it (read from
//! etcd while the cache is not ready; a cluster that changed meanwhile only
//! loses the compare-and-swap); clusters holding an operation are left to
//! the executor. A check that fails is logged and tried at the next scan.

use crate::audit::AuditLog;
use crate::cluster::machine::Event;
use crate::cluster::{
    now_rfc3339, to_json, ClusterCache, ClusterRecord, ClusterState, NodeStatus, StateBrief,
    SCHEMA_VERSION,
};
use crate::executor::Executor;
use crate::health::{self, merge_nodes};
use crate::operation::{
    LifecycleError, LifecycleRequest, OperationKind, OperationParams, Operations,
};
use crate::owner_work::{Controller, Next, OwnerWork, ReconcileError, Reconciler, Triggers};
use crate::provider::{due_by, node_ready, node_status, Providers, DESCRIBE_TIMEOUT};
use crate::replication::Claim;
use crate::store::{Op, Txn};
use drover_proto::provider::v1 as pb;
use std::sync::Arc;
use std::time::Duration;

/// The states [`Scanner::check`] acts on.
const SCANNED: [ClusterState; 5] = [
    ClusterState::Running,
    ClusterState::Alert,
    ClusterState::Stopped,
    ClusterState::Error,
    ClusterState::Destroying,
];

/// The `operation_id` of the scanner's fenced describes.
const SCAN_OPERATION: &str = "status-scan";

pub struct Scanner {
    operations: Operations,
    /// Where the operations the scanner asks for go, like any request.
    executor: Arc<Executor>,
    /// Each cluster is described by its own provider.
    providers: Arc<Providers>,
    /// The claim check.
    work: Arc<OwnerWork>,
    cache: Arc<ClusterCache>,
    interval: Duration,
    /// Where the operations it asks for are written, as Drover's own.
    audit: Arc<AuditLog>,
}

impl Scanner {
    pub fn new(
        operations: Operations,
        executor: Arc<Executor>,
        providers: Arc<Providers>,
        work: Arc<OwnerWork>,
        cache: Arc<ClusterCache>,
        interval: Duration,
        audit: Arc<AuditLog>,
    ) -> Arc<Self> {
        Arc::new(Self {
            operations,
            executor,
            providers,
            work,
            cache,
            interval,
            audit,
        })
    }

    /// Asks for `kind` on `name` as any request would, written to the
    /// audit log as Drover's own.
    async fn remediate(&self, name: &str, kind: OperationKind) -> Result<(), LifecycleError> {
        let request = LifecycleRequest {
            kind,
            params: OperationParams::default(),
            request_id: String::new(),
        };
        let submitted = self.executor.submit_own(&self.audit, name, None, request);
        submitted.await.map(drop)
    }

    async fn check(&self, cluster: &ClusterRecord) -> Result<(), LifecycleError> {
        let name = &cluster.spec.name;
        let Some(claim) = self.work.claim(name) else {
            // Another replica's cluster.
            return Ok(());
        };
        if cluster.state.operation.is_some() || cluster.newer_schema().is_some() {
            return Ok(());
        }
        match cluster.state.state {
            ClusterState::Running => {
                let nodes = self.look(cluster, claim).await?;
                let missing = missing_nodes(cluster, &nodes);
                let faulty: Vec<&str> = nodes
                    .iter()
                    .filter(|n| !node_ready(n))
                    .map(|n| n.id.as_str())
                    .chain(missing.iter().map(|n| n.id.as_str()))
                    .collect();
                if !faulty.is_empty() {
                    let message = format!("faults detected on nodes {}", faulty.join(", "));
                    let fence = claim.fence(self.operations.keys(), name);
                    self.operations
                        .transition(cluster, Event::FaultsDetected, message, &fence)
                        .await?;
                }
            }
            ClusterState::Alert => {
                let nodes = self.look(cluster, claim).await?;
                // Paused: observed, never remediated (see `Spec::paused`).
                if nodes.is_empty() || cluster.spec.spec.paused {
                    return Ok(());
                }
                // A missing node is the remediator's (within its budgets).
                if nodes.iter().all(node_ready) && missing_nodes(cluster, &nodes).is_empty() {
                    self.remediate(name, OperationKind::Recover).await?;
                } else if nodes.iter().all(|n| n.power_state == "off") {
                    self.remediate(name, OperationKind::Stop).await?;
                }
            }
            ClusterState::Stopped | ClusterState::Error => {
                self.look(cluster, claim).await?;
            }
            ClusterState::Destroying if !cluster.spec.spec.paused => {
                tracing::info!(cluster = %name, "retrying a destroy that did not finish");
                self.remediate(name, OperationKind::Destroy).await?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The nodes as the provider shows them now, the status refreshed
    /// from them when it shows other nodes.
    async fn look(
        &self,
        cluster: &ClusterRecord,
        claim: Claim,
    ) -> Result<Vec<pb::ProviderNode>, LifecycleError> {
        let nodes = self.describe(cluster, claim).await?;
        self.refresh_nodes(cluster, claim, &nodes).await?;
        Ok(nodes)
    }

    /// A describe fenced under `claim` (the owner's epoch: the provider then
    /// refuses older ones), due by the end of the claim.
    async fn describe(
        &self,
        cluster: &ClusterRecord,
        claim: Claim,
    ) -> Result<Vec<pb::ProviderNode>, LifecycleError> {
        let unavailable = |why: String| LifecycleError::ProviderUnavailable(why);
        let name = &cluster.spec.name;
        let deadline = self
            .work
            .replication()
            .claim_deadline(name, claim)
            .await
            .ok_or_else(|| unavailable(format!("no longer the owner of {name}")))?;
        let request = pb::DescribeClusterRequest {
            cluster_uid: cluster.spec.uid.clone(),
            token: Some(pb::FencingToken {
                cluster_uid: cluster.spec.uid.clone(),
                epoch: claim.epoch,
                operation_id: SCAN_OPERATION.to_string(),
            }),
        };
        let mut provider = self
            .providers
            .for_cluster(&cluster.spec.spec)
            .map_err(|e| unavailable(e.to_string()))?;
        let request = due_by(
            deadline.min(std::time::Instant::now() + DESCRIBE_TIMEOUT),
            request,
        );
        let described = tokio::time::timeout(DESCRIBE_TIMEOUT, provider.describe_cluster(request))
            .await
            .map_err(|_| {
                unavailable(format!(
                    "no answer to DescribeCluster within {DESCRIBE_TIMEOUT:?}"
                ))
            })?;
        described
            .map(|r| r.into_inner().nodes)
            .map_err(|status| unavailable(status.message().to_string()))
    }

    /// Writes the provider's `nodes` into the status when they differ from
    /// it in what a node is (facts alone changing write nothing): fenced by
    /// `claim`, and only while the cluster's keys are as scanned.
    async fn refresh_nodes(
        &self,
        cluster: &ClusterRecord,
        claim: Claim,
        nodes: &[pb::ProviderNode],
    ) -> Result<(), LifecycleError> {
        let mut status = cluster.status.clone().unwrap_or_default();
        let shown = nodes.iter().map(node_status).collect();
        let shown = merge_nodes(&status.nodes, shown, &cluster.spec.spec, &now_rfc3339());
        // What a node is, and since when it has not been ready (the clock
        // of its health check; a node from before health checks gets it).
        let same = |a: &NodeStatus, b: &NodeStatus| {
            (&a.id, &a.role, &a.power_state, &a.version, a.ready)
                == (&b.id, &b.role, &b.power_state, &b.version, b.ready)
                && (a.not_ready_since.is_some() == b.not_ready_since.is_some())
        };
        if status.nodes.len() == shown.len()
            && status.nodes.iter().zip(&shown).all(|(a, b)| same(a, b))
        {
            return Ok(());
        }
        let name = &cluster.spec.name;
        let keys = self.operations.keys();
        status.schema = SCHEMA_VERSION;
        status.nodes = shown;
        let txn = Txn::new()
            .when(claim.fence(keys, name))
            .when(cluster.unchanged(keys))
            .and_then([Op::put(keys.cluster_status(name), to_json(&status))]);
        if self.operations.store().txn(txn).await?.succeeded {
            tracing::info!(cluster = %name, nodes = nodes.len(), "status nodes refreshed from the provider");
        }
        Ok(())
    }
}

/// The nodes `cluster`'s spec has and the provider's `nodes` lack.
fn missing_nodes(cluster: &ClusterRecord, nodes: &[pb::ProviderNode]) -> Vec<NodeStatus> {
    health::missing(&cluster.spec.spec, nodes.iter().map(|n| n.role.as_str()))
}

#[async_trait::async_trait]
impl Reconciler for Scanner {
    fn controller(&self) -> Controller {
        Controller::Scanner
    }

    /// None: the scan comes every interval.
    fn triggers(&self) -> Triggers {
        Triggers::default()
    }

    fn resync(&self) -> Duration {
        self.interval
    }

    /// Describes of different clusters go on side by side.
    fn concurrency(&self) -> usize {
        4
    }

    /// The owned clusters in a state the scanner acts on, with no
    /// operation (every owned one while the cache is not ready): a fleet
    /// at rest is mostly clusters it would only look at and leave.
    fn candidates(&self) -> Vec<String> {
        let scanned = |state: StateBrief| !state.busy && SCANNED.contains(&state.state);
        self.work.owned_where(&self.cache, scanned)
    }

    async fn reconcile(
        self: Arc<Self>,
        cluster: String,
        _claim: Claim,
    ) -> Result<Next, ReconcileError> {
        let record = match self.cache.get(&cluster) {
            Some(Ok(record)) => record,
            // Deleted since, or unreadable (which reads report).
            Some(Err(_)) => return Ok(Next::Idle),
            // Not in the cache (not ready yet): from etcd.
            None => match self.operations.registry().get(&cluster).await {
                Ok(record) => record,
                Err(error) => {
                    tracing::debug!(cluster, %error, "scanner could not read the cluster");
                    return Ok(Next::Idle);
                }
            },
        };
        if let Err(error) = self.check(&record).await {
            tracing::debug!(cluster, %error, "scanner left the cluster alone");
        }
        Ok(Next::Idle)
    }
}
