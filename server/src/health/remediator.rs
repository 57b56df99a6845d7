//! The remediation controller: a reconciler on the owner-work runtime
//! that remediates the unhealthy nodes of the clusters this replica owns,
//! as [`decide`] says, by a Recover operation naming them.
//!
//! # Guarantees
//! - A remediation is an operation accepted like any request (the CAS,
//!   one operation at a time, fenced, in the history, cancellable): it
//!   never races a user's operation — whichever is accepted first holds
//!   the cluster, the other is refused or waits.
//! - The attempts are written to `status.remediation` (fenced, compared
//!   against the state and status as read) before the operation is asked
//!   for, under a request id made of the cluster's uid and the count of
//!   remediations asked: a crash between the two costs the node one
//!   attempt and a retry period, never gives it one more than
//!   `max_retry`; a retry of the same ask is answered with the operation
//!   already accepted.
//! - Why nothing is remediated (short-circuited, paused, outside the
//!   window, quorum, retries used up) is written to the status when it
//!   changes, and counted.
//!
//! # Assumptions
//! - The status scanner keeps `status.nodes` as the provider shows them
//!   (each write keeping since when a node has not been ready).

use super::decide::{decide, Decision, WindowClosed};
use crate::audit::AuditLog;
use crate::cluster::{
    now_rfc3339, to_json, ClusterCache, ClusterRecord, ClusterState, NodeRemediation,
    RemediationStatus, StateBrief, SCHEMA_VERSION,
};
use crate::executor::Executor;
use crate::metrics::Metrics;
use crate::operation::{LifecycleRequest, OperationKind, OperationParams, Operations};
use crate::owner_work::{Controller, Next, OwnerWork, ReconcileError, Reconciler, Triggers};
use crate::replication::Claim;
use crate::store::{KeyValue, Op, Txn};
use chrono::Utc;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Remediator {
    operations: Operations,
    executor: Arc<Executor>,
    work: Arc<OwnerWork>,
    cache: Arc<ClusterCache>,
    interval: Duration,
    audit: Arc<AuditLog>,
    metrics: Arc<Metrics>,
    /// Unhealthy nodes per owned cluster, as last judged: the gauges.
    unhealthy: Mutex<HashMap<String, (usize, bool)>>,
}

impl Remediator {
    pub fn new(
        operations: Operations,
        executor: Arc<Executor>,
        work: Arc<OwnerWork>,
        cache: Arc<ClusterCache>,
        interval: Duration,
        audit: Arc<AuditLog>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            operations,
            executor,
            work,
            cache,
            interval,
            audit,
            metrics,
            unhealthy: Mutex::new(HashMap::new()),
        })
    }

    async fn record(&self, cluster: &str) -> Option<ClusterRecord> {
        match self.cache.get(cluster) {
            Some(Ok(record)) => Some(record),
            Some(Err(_)) => None,
            None => self.operations.registry().get(cluster).await.ok(),
        }
    }

    /// Acts on `decision` for `cluster`: records and asks for a
    /// remediation, or records why none.
    async fn act(
        &self,
        cluster: &ClusterRecord,
        claim: Claim,
        decision: Decision,
    ) -> Result<Next, ReconcileError> {
        let previous = cluster.status.clone().unwrap_or_default().remediation;
        match decision {
            Decision::Wait {
                message,
                short_circuited,
                kept,
                look_at,
            } => {
                let next = RemediationStatus {
                    message,
                    short_circuited,
                    nodes: kept,
                    asked: previous.asked,
                };
                if next != previous {
                    self.count_news(&previous, &next);
                    self.write(cluster, claim, next).await?;
                }
                let after = look_at.and_then(|at| (at - Utc::now()).to_std().ok());
                Ok(after.map_or(Next::Idle, |after| Next::After(after.min(self.interval))))
            }
            Decision::Remediate { nodes, kept } => {
                self.remediate(cluster, claim, previous, nodes, kept).await
            }
        }
    }

    /// Counts the attempts of `nodes`, writes them, then asks for the
    /// Recover naming them.
    async fn remediate(
        &self,
        cluster: &ClusterRecord,
        claim: Claim,
        previous: RemediationStatus,
        nodes: Vec<String>,
        mut kept: Vec<NodeRemediation>,
    ) -> Result<Next, ReconcileError> {
        let now = now_rfc3339();
        for node in &nodes {
            match kept.iter_mut().find(|e| &e.node_id == node) {
                Some(entry) => {
                    entry.attempts += 1;
                    entry.last_started_at = now.clone();
                }
                None => kept.push(NodeRemediation {
                    node_id: node.clone(),
                    attempts: 1,
                    last_started_at: now.clone(),
                }),
            }
        }
        let asked = previous.asked + 1;
        let next = RemediationStatus {
            message: String::new(),
            short_circuited: false,
            nodes: kept,
            asked,
        };
        if !self.write(cluster, claim, next).await? {
            // The cluster changed since it was read: decided again on it.
            return Ok(Next::After(Duration::ZERO));
        }
        let name = &cluster.spec.name;
        let request = LifecycleRequest {
            kind: OperationKind::Recover,
            params: OperationParams {
                node_ids: nodes.clone(),
                ..Default::default()
            },
            request_id: format!("remediation-{}-{asked}", cluster.spec.uid),
        };
        let submitted = self.executor.submit_own(&self.audit, name, None, request);
        let operation = submitted.await?;
        tracing::info!(cluster = %name, nodes = ?nodes, operation = %operation.id, "remediating unhealthy nodes");
        self.metrics.remediation("started");
        Ok(Next::Idle)
    }

    /// Writes `remediation` into the cluster's status, fenced by `claim`,
    /// while the cluster's keys are as read; whether it was written.
    async fn write(
        &self,
        cluster: &ClusterRecord,
        claim: Claim,
        remediation: RemediationStatus,
    ) -> Result<bool, ReconcileError> {
        let name = &cluster.spec.name;
        let keys = self.operations.keys();
        let mut status = cluster.status.clone().unwrap_or_default();
        status.schema = SCHEMA_VERSION;
        status.remediation = remediation;
        let txn = Txn::new()
            .when(claim.fence(keys, name))
            .when(cluster.unchanged(keys))
            .and_then([Op::put(keys.cluster_status(name), to_json(&status))]);
        Ok(self.operations.store().txn(txn).await?.succeeded)
    }

    /// Counts what newly holds remediation back.
    fn count_news(&self, previous: &RemediationStatus, next: &RemediationStatus) {
        if next.short_circuited && !previous.short_circuited {
            self.metrics.remediation("short_circuited");
        }
        if next.message.contains("retries used up") && !previous.message.contains("retries used up")
        {
            self.metrics.remediation("gave_up");
        }
    }

    /// Records `cluster`'s unhealthy nodes and whether it is
    /// short-circuited for the gauges, dropping the
    /// clusters this replica no longer owns.
    fn observe(&self, cluster: &ClusterRecord, short_circuited: bool) {
        let policy = super::Policy::of(&cluster.spec.spec.health);
        let now = Utc::now();
        let status = cluster.status.as_ref();
        let nodes = status.map(|s| s.nodes.as_slice()).unwrap_or_default();
        let unhealthy = nodes
            .iter()
            .filter(|n| super::judge(n, &policy, now).health == super::NodeHealth::Unhealthy)
            .count();
        let mut seen = crate::sync::lock(&self.unhealthy);
        // Only clusters with something to count are kept (see `wants`).
        if unhealthy > 0 || short_circuited {
            seen.insert(cluster.spec.name.clone(), (unhealthy, short_circuited));
        } else {
            seen.remove(&cluster.spec.name);
        }
        seen.retain(|name, _| self.work.claim(name).is_some());
        let nodes: usize = seen.values().map(|(n, _)| n).sum();
        let short = seen.values().filter(|(_, s)| *s).count();
        self.metrics.set_health(nodes, short);
    }
}

#[async_trait::async_trait]
impl Reconciler for Remediator {
    fn controller(&self) -> Controller {
        Controller::Remediation
    }

    fn triggers(&self) -> Triggers {
        Triggers {
            state: true,
            tasks: false,
            adoption: true,
        }
    }

    fn resync(&self) -> Duration {
        self.interval
    }

    fn concurrency(&self) -> usize {
        4
    }

    /// The owned clusters in Alert with no operation (every owned one while
    /// the cache is not ready).
    fn candidates(&self) -> Vec<String> {
        self.work.owned_where(&self.cache, free_in_alert)
    }

    /// A cluster that is now in Alert with no operation, or one the gauges
    /// count (it may have healed); a remediation held back is cleared by
    /// the operation that ends the fault (see `executor::finish`). The
    /// other changes, most of them, cost nothing.
    fn wants(&self, cluster: &str, state: Option<&KeyValue>) -> bool {
        let alert = |kv: &KeyValue| StateBrief::parse(&kv.value).is_some_and(free_in_alert);
        state.is_some_and(alert) || crate::sync::lock(&self.unhealthy).contains_key(cluster)
    }

    async fn reconcile(
        self: Arc<Self>,
        cluster: String,
        claim: Claim,
    ) -> Result<Next, ReconcileError> {
        let Some(record) = self.record(&cluster).await else {
            return Ok(Next::Idle);
        };
        if record.state.operation.is_some() || record.newer_schema().is_some() {
            return Ok(Next::Idle);
        }
        let window: WindowClosed =
            crate::cluster::window::closed(&record.spec.spec.maintenance, Utc::now());
        let decision = decide(&record, window, Utc::now());
        let short_circuited = matches!(
            decision,
            Decision::Wait {
                short_circuited: true,
                ..
            }
        );
        self.observe(&record, short_circuited);
        self.act(&record, claim, decision).await
    }
}

fn free_in_alert(state: StateBrief) -> bool {
    !state.busy && state.state == ClusterState::Alert
}
