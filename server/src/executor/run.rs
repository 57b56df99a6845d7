//! Driving one operation: claim, steps, completion — each a transaction that
//! holds the cluster (compares the state key's and the operation's
//! revisions).

use super::{check_plan_input, needs_nodes, plan, resume_index, Executor, Step};
use crate::cluster::machine::{self, Event};
use crate::cluster::{
    from_json, now_rfc3339, to_json, ClusterRecord, LastOperation, NodeStatus, StateRecord,
    StatusRecord, SCHEMA_VERSION,
};
use crate::metrics::{KindLabels, OperationLabels};
use crate::operation::{
    ClaimedOperation, LifecycleError, OperationError, OperationKind, OperationRecord,
    OperationState, Progress, Seen, Versioned,
};
use crate::provider::{due_by, node_ready, DESCRIBE_TIMEOUT};
use crate::replication::Claim;
use crate::store::{CmpOp, Compare, Op, StoreError, Txn};
use drover_proto::provider::v1 as pb;
use std::time::{Duration, Instant};
use tonic::Code;

/// How long the executor waits for the operation feed to deliver an
/// operation whose accept the watch cache already showed, before reading it
/// from etcd instead.
const FEED_CATCH_UP: Duration = Duration::from_millis(50);

/// How much earlier than the operation's deadline a step's provider call is
/// due (see `Holding::call`).
const OPERATION_DEADLINE_SLACK: Duration = Duration::from_millis(200);

/// The first and the longest pause between fencing looks of an orphan.
const FENCE_RETRY_FIRST: Duration = Duration::from_millis(500);
const FENCE_RETRY_MAX: Duration = Duration::from_secs(30);

/// Attempts at describing the nodes (before planning, after a failed step)
/// when the provider's error says it may pass.
const LOOK_ATTEMPTS: u32 = 3;

/// How a drive ends early.
enum Interrupt {
    /// Cancel was requested: stop at this boundary.
    Cancelled,
    /// Someone else moved the operation or the cluster: stop touching it.
    Lost,
}

/// The cluster and operation as this executor holds them.
pub(super) struct Holding<'e> {
    executor: &'e Executor,
    claim: Claim,
    cluster: ClusterRecord,
    operation: OperationRecord,
    operation_revision: i64,
    nodes: Vec<pb::ProviderNode>,
    /// `nodes` is the provider's latest answer in this execution, not a
    /// view from before it (a resumed execution starts without one).
    nodes_fresh: bool,
}

impl Holding<'_> {
    /// The one place executor writes go through: the transaction applies
    /// only while the cluster's state and the operation are as this executor
    /// last saw them, and while this replica owns the cluster.
    ///
    /// etcd being unreachable is retried while the claim lives. A write whose
    /// outcome was unknown (the connection broke after sending) is
    /// recognised afterwards by the operation record it wrote.
    async fn commit(&mut self, writes: Vec<Op>) -> Result<i64, LifecycleError> {
        self.commit_checking(writes, Vec::new()).await
    }

    /// [`Self::commit`], also comparing `checks`.
    async fn commit_checking(
        &mut self,
        writes: Vec<Op>,
        checks: Vec<Compare>,
    ) -> Result<i64, LifecycleError> {
        let keys = self.executor.operations.keys();
        let name = &self.cluster.spec.name;
        let operation_key = keys.operation(name, &self.operation.id);
        let written_operation = writes.iter().find_map(|op| match op {
            Op::Put { key, value, .. } if *key == operation_key => Some(value.clone()),
            _ => None,
        });
        let txn = Txn::new()
            .when([
                Compare::mod_revision(
                    keys.cluster_state(name),
                    CmpOp::Equal,
                    self.cluster.state_revision,
                ),
                Compare::mod_revision(&operation_key, CmpOp::Equal, self.operation_revision),
            ])
            .when(self.claim.fence(keys, name))
            .when(checks)
            .and_then(writes);
        let store = self.executor.operations.store();
        let mut delay = Duration::from_millis(100);
        let mut ambiguous = false;
        loop {
            match store.cas(txn.clone()).await {
                Ok(result) => {
                    if let Some(written) = written_operation {
                        let operations = &self.executor.operations;
                        operations.wrote(operation_key, written, result.revision);
                    }
                    return Ok(result.revision);
                }
                Err(StoreError::Unavailable(error))
                    if self.executor.replication.claim(name) == Some(self.claim) =>
                {
                    tracing::warn!(cluster = %name, %error, retry_in = ?delay, "etcd unavailable; retrying the write");
                    ambiguous = true;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(StoreError::Conflict { revision }) if ambiguous => {
                    let current = match store.get(&operation_key).await {
                        Ok(read) => read.into_single(),
                        // Still unreachable: try the whole write again
                        // (its compare fails again if it had committed).
                        Err(StoreError::Unavailable(error))
                            if self.executor.replication.claim(name) == Some(self.claim) =>
                        {
                            tracing::warn!(cluster = %name, %error, retry_in = ?delay, "etcd unavailable; retrying the write");
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_secs(2));
                            continue;
                        }
                        Err(error) => return Err(error.into()),
                    };
                    return match (current, &written_operation) {
                        (Some(kv), Some(written)) if &kv.value == written => Ok(kv.mod_revision),
                        _ => Err(StoreError::Conflict { revision }.into()),
                    };
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Writes the operation record.
    async fn save_operation(&mut self) -> Result<(), Interrupt> {
        let key = self
            .executor
            .operations
            .keys()
            .operation(&self.cluster.spec.name, &self.operation.id);
        let writes = vec![Op::put(key, to_json(&self.operation))];
        match self.commit(writes).await {
            Ok(revision) => {
                self.operation_revision = revision;
                Ok(())
            }
            Err(error) => Err(self.explain(error).await),
        }
    }

    /// Why a write failed: a cancel request (the only other writer of the
    /// operation record) or a lost hold.
    async fn explain(&mut self, error: LifecycleError) -> Interrupt {
        if !is_conflict(&error) {
            tracing::warn!(%error, operation = %self.operation.id, "write failed");
            return Interrupt::Lost;
        }
        let name = self.cluster.spec.name.clone();
        match self
            .executor
            .operations
            .get(&name, &self.operation.id)
            .await
        {
            Ok(Versioned {
                record, revision, ..
            }) if record.cancel_requested
                && !record.state.is_terminal()
                && record.replica == self.operation.replica =>
            {
                let state_unchanged = self
                    .executor
                    .operations
                    .registry()
                    .get(&name)
                    .await
                    .is_ok_and(|c| c.state_revision == self.cluster.state_revision);
                if !state_unchanged {
                    return Interrupt::Lost;
                }
                self.operation.cancel_requested = true;
                self.operation_revision = revision;
                Interrupt::Cancelled
            }
            _ => Interrupt::Lost,
        }
    }

    /// Whether this replica still holds the cluster under this claim.
    fn holds_claim(&self) -> bool {
        self.executor.replication.claim(&self.cluster.spec.name) == Some(self.claim)
    }

    /// The deadline of a provider call under this operation's claim, or
    /// ABORTED once the claim no longer holds.
    async fn claim_deadline(&self) -> Result<std::time::Instant, tonic::Status> {
        let name = &self.cluster.spec.name;
        let replication = &self.executor.replication;
        replication
            .claim_deadline(name, self.claim)
            .await
            .ok_or_else(|| tonic::Status::aborted("this replica no longer owns the cluster"))
    }

    fn token(&self) -> Option<pb::FencingToken> {
        Some(pb::FencingToken {
            cluster_uid: self.cluster.spec.uid.clone(),
            epoch: self.claim.epoch,
            operation_id: self.operation.id.clone(),
        })
    }

    /// Runs `step` at the provider, under this replica's claim and by the
    /// operation's deadline (the gRPC deadline the provider learns is the
    /// earlier of the two, so no call lands after the operation ended).
    async fn call(
        &mut self,
        step: &Step,
        operation_deadline: tokio::time::Instant,
    ) -> Result<(), tonic::Status> {
        if *step == Step::HealthCheck {
            return self.health_check().await;
        }
        // The provider learns a deadline a little before the operation's: a
        // deadline travels as time left, so the provider's clock for it
        // starts when the call arrives, and a call it lands just in time
        // must not land after this replica has written the operation off.
        let cutoff = operation_deadline.into_std() - OPERATION_DEADLINE_SLACK;
        let started = Instant::now();
        let response = loop {
            let deadline = self.claim_deadline().await?.min(cutoff);
            match self.send(step, deadline).await {
                Err(status) if cut_at_claim_end(&status, deadline) && Instant::now() < cutoff => {
                    tracing::debug!(cluster = %self.cluster.spec.name, step = %step.name(), "a provider call outlasted the claim; asking again");
                }
                // Cut at the cutoff: the operation's own timeout, moments
                // away, ends the step (the caller bounds it by that deadline).
                Err(status) if cut_at_claim_end(&status, deadline) => {
                    std::future::pending::<()>().await;
                }
                other => break other,
            }
        };
        self.executor
            .observe_provider(step.provider_call(), started);
        self.nodes = response?.into_inner().nodes;
        self.nodes_fresh = true;
        Ok(())
    }

    /// Sends `step`'s provider call, due by `deadline`.
    async fn send(
        &self,
        step: &Step,
        deadline: std::time::Instant,
    ) -> Result<tonic::Response<pb::NodesResponse>, tonic::Status> {
        let mut provider = self.executor.provider.clone();
        let spec = &self.cluster.spec.spec;
        let token = self.token();
        match step {
            Step::CreateNodes => {
                provider
                    .create_nodes(due_by(
                        deadline,
                        pb::CreateNodesRequest {
                            token,
                            control_nodes: spec.control_nodes,
                            worker_nodes: spec.worker_nodes,
                            offering: spec.node_offering.clone(),
                            version: spec.version.clone(),
                        },
                    ))
                    .await
            }
            Step::StartNodes => {
                let request = due_by(deadline, pb::PowerRequest { token });
                provider.start_nodes(request).await
            }
            Step::StopNodes => {
                let request = due_by(deadline, pb::PowerRequest { token });
                provider.stop_nodes(request).await
            }
            Step::Resize { workers, offering } => {
                provider
                    .resize_nodes(due_by(
                        deadline,
                        pb::ResizeNodesRequest {
                            token,
                            worker_nodes: *workers,
                            offering: offering.clone(),
                        },
                    ))
                    .await
            }
            Step::UpgradeNode { node_id, version } => {
                provider
                    .upgrade_node(due_by(
                        deadline,
                        pb::UpgradeNodeRequest {
                            token,
                            node_id: node_id.clone(),
                            version: version.clone(),
                        },
                    ))
                    .await
            }
            Step::DeleteNodes(ids) => {
                provider
                    .delete_nodes(due_by(
                        deadline,
                        pb::DeleteNodesRequest {
                            token,
                            node_ids: ids.clone(),
                        },
                    ))
                    .await
            }
            Step::HealthCheck => unreachable!("the health check describes"),
        }
    }

    /// Every node is on and ready (a read-only step). The provider's last
    /// answer in this execution (the start, create, resize or upgrade just
    /// run) lists the nodes as it left them: when it shows every node ready
    /// there is nothing more to learn. Otherwise, or when this execution
    /// resumed at the check, the cluster is described (fenced).
    async fn health_check(&mut self) -> Result<(), tonic::Status> {
        if self.nodes_fresh && !self.nodes.is_empty() && self.nodes.iter().all(node_ready) {
            return Ok(());
        }
        let nodes = self.describe().await?;
        let unhealthy: Vec<&str> = nodes
            .iter()
            .filter(|n| !node_ready(n))
            .map(|n| n.id.as_str())
            .collect();
        if nodes.is_empty() {
            return Err(tonic::Status::failed_precondition(
                "the cluster has no nodes",
            ));
        }
        if !unhealthy.is_empty() {
            return Err(tonic::Status::failed_precondition(format!(
                "nodes not ready: {}",
                unhealthy.join(", ")
            )));
        }
        Ok(())
    }

    async fn describe(&mut self) -> Result<Vec<pb::ProviderNode>, tonic::Status> {
        // Fenced: once this owner has looked, its predecessors' calls are
        // refused (orphan recovery relies on it).
        let started = Instant::now();
        let response = loop {
            let deadline = self.claim_deadline().await?;
            let request = pb::DescribeClusterRequest {
                cluster_uid: self.cluster.spec.uid.clone(),
                token: self.token(),
            };
            let mut provider = self.executor.provider.clone();
            match provider.describe_cluster(due_by(deadline, request)).await {
                Err(status) if cut_at_claim_end(&status, deadline) => {}
                other => break other,
            }
        };
        self.executor.observe_provider("DescribeCluster", started);
        let nodes = response?.into_inner().nodes;
        self.nodes = nodes.clone();
        self.nodes_fresh = true;
        Ok(nodes)
    }

    /// After a failed operation: what the spec asks for that the provider
    /// does not show (a failed add-nodes leaves `spec.worker_nodes` above
    /// the nodes that exist), as a sentence to append to the status message.
    fn worker_gap(&self) -> String {
        let wanted = self.cluster.spec.spec.worker_nodes as usize;
        if !self.nodes_fresh {
            return "; the provider's nodes are unknown after the failure: the status shows the last ones observed".into();
        }
        let shown = self.nodes.iter().filter(|n| n.role == "worker").count();
        if shown == wanted {
            return String::new();
        }
        format!("; the spec asks for {wanted} worker nodes, the provider shows {shown}")
    }

    /// The nodes to plan from, as the provider describes them now. A look
    /// that fails is never "no nodes" (an upgrade planned from it had no
    /// steps and succeeded): a transient error is retried a few times, any
    /// other ends the operation with the provider's error.
    async fn look_before_plan(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<pb::ProviderNode>, Option<OperationError>> {
        match self.look(deadline).await {
            Ok(nodes) => Ok(nodes),
            Err(Some(status)) => {
                let message = format!(
                    "describing the cluster's nodes before the first step failed: {}",
                    status.message()
                );
                Err(error(status.code(), message))
            }
            Err(None) => {
                let message = "timed out describing the cluster's nodes before the first step";
                Err(error(Code::DeadlineExceeded, message))
            }
        }
    }

    /// After a failed mutating step: learns what exists, so the status
    /// mirrors it (the step may have done part of its work). Bounded by the
    /// operation's deadline and [`DESCRIBE_TIMEOUT`]; a look that fails
    /// leaves the nodes unknown, and the status message says so.
    async fn look_after_failure(&mut self, deadline: tokio::time::Instant) {
        self.nodes_fresh = false;
        let now = tokio::time::Instant::now();
        if !self.holds_claim() || now >= deadline {
            return;
        }
        if let Err(error) = self.look(deadline.min(now + DESCRIBE_TIMEOUT)).await {
            let error = error.map_or("no answer".to_string(), |s| s.to_string());
            tracing::warn!(cluster = %self.cluster.spec.name, %error, "cannot describe the nodes after a failed step");
        }
    }

    /// Describes the nodes by `deadline`, asking again (with backoff) when
    /// the provider's error says it may pass (UNAVAILABLE,
    /// RESOURCE_EXHAUSTED), [`LOOK_ATTEMPTS`] times in all. `Err(None)`: no
    /// answer by the deadline.
    async fn look(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<pb::ProviderNode>, Option<tonic::Status>> {
        let looking = async {
            let mut delay = Duration::from_millis(200);
            for _ in 1..LOOK_ATTEMPTS {
                match self.describe().await {
                    Err(status) if is_transient(&status) => {
                        tracing::warn!(cluster = %self.cluster.spec.name, %status, retry_in = ?delay, "describing the nodes failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                    answer => return answer,
                }
            }
            self.describe().await
        };
        match tokio::time::timeout_at(deadline, looking).await {
            Ok(answer) => answer.map_err(Some),
            Err(_) => Err(None),
        }
    }

    /// Makes a provider call under this owner's epoch (a fenced describe)
    /// before an orphan is failed: until one succeeds, a call the lost owner
    /// made could still land. Retries with backoff while this replica holds
    /// the cluster, saying in the status why the operation is still held.
    /// `false` when it stopped trying (the cluster moved on, or the replica
    /// is shutting down): the operation stays for the next owner.
    async fn fence_orphan(&mut self) -> bool {
        let name = self.cluster.spec.name.clone();
        let mut delay = FENCE_RETRY_FIRST;
        let mut said = false;
        loop {
            let why = match tokio::time::timeout(DESCRIBE_TIMEOUT, self.describe()).await {
                Ok(Ok(_)) => return true,
                Ok(Err(status)) => format!(
                    "the provider answered {:?}: {}",
                    status.code(),
                    status.message()
                ),
                Err(_) => format!("no answer within {DESCRIBE_TIMEOUT:?}"),
            };
            let holds = self.executor.replication.claim(&name) == Some(self.claim);
            if !holds || self.executor.is_stopping() {
                return false;
            }
            tracing::warn!(cluster = %name, operation = %self.operation.id, %why, retry_in = ?delay, "cannot fence the provider; the orphan is held until a fenced call succeeds");
            if !said {
                let message = format!(
                    "recovering operation {} of a lost replica: cannot fence the provider ({why}); retrying",
                    self.operation.id
                );
                said = self.say_in_status(message).await;
            }
            if !self.executor.pause_unless_stopping(delay).await {
                return false;
            }
            delay = (delay * 2).min(FENCE_RETRY_MAX);
        }
    }

    /// Writes `message` into the cluster's status (fenced like every write).
    async fn say_in_status(&mut self, message: String) -> bool {
        let mut status = self.cluster.status.clone().unwrap_or_default();
        status.schema = SCHEMA_VERSION;
        status.message = Some(message);
        let key = self
            .executor
            .operations
            .keys()
            .cluster_status(&self.cluster.spec.name);
        self.commit(vec![Op::put(key, to_json(&status))])
            .await
            .is_ok()
    }

    /// The status an operation ending in `state` leaves: the nodes only
    /// from a provider answer (an operation that ended without one, its
    /// first call failed, leaves them as last observed), the version only
    /// as the provider shows it, and the outcome.
    fn final_status(&self, state: OperationState, error: Option<OperationError>) -> StatusRecord {
        let mut status = self.cluster.status.clone().unwrap_or_default();
        status.schema = SCHEMA_VERSION;
        if self.nodes_fresh {
            status.nodes = self.nodes.iter().map(node_status).collect();
        }
        if state == OperationState::Succeeded {
            status.observed_generation = Some(self.cluster.spec.generation);
            let version = &self.cluster.spec.spec.version;
            if self.nodes_fresh && all_at_version(&self.nodes, version) {
                status.current_version = Some(version.clone());
            }
            if self.operation.kind == OperationKind::Destroy {
                status.nodes.clear();
            }
        }
        status.message = error.as_ref().map(|e| match state {
            OperationState::Failed => format!("{}{}", e.message, self.worker_gap()),
            _ => e.message.clone(),
        });
        status.last_operation = Some(LastOperation {
            id: self.operation.id.clone(),
            kind: self.operation.kind.name().to_string(),
            state: format!("{state:?}"),
            message: error.map(|e| e.message),
        });
        status
    }

    /// Ends the operation: moves the cluster as the table says (only if it
    /// still holds it), clears the slot, records the outcome and the status.
    async fn finish(
        &mut self,
        state: OperationState,
        event: Event,
        error: Option<OperationError>,
    ) -> Result<(), LifecycleError> {
        let from = self.cluster.state.state;
        // A go-ahead destroy that works completes, a go-ahead start that
        // works recovers an Error cluster; other go-aheads stay.
        let go_ahead_moves = matches!(
            self.operation.kind,
            OperationKind::Destroy | OperationKind::Start
        );
        let to = machine::final_state(
            from,
            self.operation.go_ahead,
            go_ahead_moves,
            state == OperationState::Succeeded,
            event,
        );
        let now = now_rfc3339();
        self.operation.state = state;
        self.operation.error = error.clone();
        self.operation.finished_at = Some(now.clone());
        let name = self.cluster.spec.name.clone();
        let keys = self.executor.operations.keys().clone();
        let new_state = StateRecord {
            schema: SCHEMA_VERSION,
            uid: self.cluster.spec.uid.clone(),
            state: to,
            operation: None,
            changed_at: if to == from {
                self.cluster.state.changed_at.clone()
            } else {
                now
            },
        };
        let status = self.final_status(state, error);
        // A cancel that lands after the last step began cannot stop it: the
        // operation ends as it did, with the cancel request kept on record.
        let mut cancels_seen = 0;
        loop {
            let writes = vec![
                Op::put(keys.cluster_state(&name), to_json(&new_state)),
                Op::put(
                    keys.operation(&name, &self.operation.id),
                    to_json(&self.operation),
                ),
                Op::put(keys.cluster_status(&name), to_json(&status)),
            ];
            match self.commit(writes).await {
                Ok(_) => break,
                Err(error) if cancels_seen == 0 && is_conflict(&error) => {
                    cancels_seen += 1;
                    if let Interrupt::Lost = self.explain(error).await {
                        return Err(LifecycleError::Raced(name));
                    }
                }
                Err(error) => return Err(error),
            }
        }
        let metrics = self.executor.operations.metrics();
        metrics.transition(from, to);
        let kind = self.operation.kind.name().to_string();
        metrics
            .operations
            .get_or_create(&OperationLabels {
                kind: kind.clone(),
                result: format!("{state:?}").to_lowercase(),
            })
            .inc();
        if let Ok(created) = humantime::parse_rfc3339(&self.operation.created_at) {
            let elapsed = created.elapsed().unwrap_or_default().as_secs_f64();
            metrics
                .operation_seconds
                .get_or_create(&KindLabels { kind })
                .observe(elapsed);
        }
        tracing::info!(
            cluster = %name,
            operation = %self.operation.id,
            kind = self.operation.kind.name(),
            result = ?state,
            from = %from,
            to = %to,
            "operation finished"
        );
        Ok(())
    }
}

fn is_conflict(error: &LifecycleError) -> bool {
    matches!(
        error,
        LifecycleError::Registry(crate::cluster::RegistryError::Store(
            StoreError::Conflict { .. }
        ))
    )
}

/// Whether `status` ended a call at the end of the claim it was made
/// under (see [`due_by`]), rather than being the provider's answer. Such a
/// call is asked again once the claim is renewed: provider calls are
/// idempotent, and a slow provider is bounded by the operation's timeout,
/// not by one lease period.
fn cut_at_claim_end(status: &tonic::Status, deadline: std::time::Instant) -> bool {
    status.code() == Code::Cancelled && std::time::Instant::now() >= deadline
}

/// Whether the provider's error says that asking again may work.
fn is_transient(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::ResourceExhausted)
}

/// Whether the provider's answer shows nodes, every one at `version`.
fn all_at_version(nodes: &[pb::ProviderNode], version: &str) -> bool {
    !nodes.is_empty() && nodes.iter().all(|n| n.version == version)
}

fn node_status(node: &pb::ProviderNode) -> NodeStatus {
    NodeStatus {
        id: node.id.clone(),
        role: node.role.clone(),
        power_state: node.power_state.clone(),
        version: node.version.clone(),
        ready: node.healthy && node.power_state == "on",
    }
}

fn error(code: Code, message: impl Into<String>) -> Option<OperationError> {
    Some(OperationError {
        code: format!("{code:?}"),
        message: message.into(),
    })
}

impl Executor {
    /// Runs one operation from wherever it is.
    pub(super) async fn drive(&self, cluster: &str, id: &str) -> Result<(), LifecycleError> {
        if let Some(holding) = self.claim_from_views(cluster, id).await {
            return self.execute(holding, true).await;
        }
        let (current, operation) = self.operations.get_with_cluster(cluster, id).await?;
        self.operations.check_schema(&current)?;
        if current
            .state
            .operation
            .as_ref()
            .is_none_or(|slot| slot.id != id)
        {
            return Ok(());
        }
        let Some(claim) = self.replication.claim(cluster) else {
            return Ok(());
        };
        let Versioned { record, revision } = operation.ok_or_else(|| LifecycleError::NotFound {
            cluster: cluster.to_string(),
            id: id.to_string(),
        })?;
        let mut holding = Holding {
            executor: self,
            claim,
            cluster: current,
            operation: record,
            operation_revision: revision,
            nodes: Vec::new(),
            nodes_fresh: false,
        };
        match holding.operation.state {
            OperationState::Pending if holding.operation.cancel_requested => {
                holding
                    .finish(
                        OperationState::Cancelled,
                        Event::OperationFailed,
                        error(Code::Cancelled, "cancelled before it started"),
                    )
                    .await
            }
            OperationState::Pending => self.execute(holding, false).await,
            OperationState::Running if holding.operation.owner_epoch != Some(claim.epoch) => {
                let progress = holding.operation.progress.clone();
                let replica = holding.operation.replica.clone().unwrap_or_default();
                let message = match progress {
                    Some(p) => format!(
                        "replica {replica} was lost while running step {} of {} ({})",
                        p.step, p.total_steps, p.step_name
                    ),
                    None => format!("replica {replica} was lost before its first step"),
                };
                // Fence the provider before failing the orphan, so the lost
                // replica (if it is only paused) can change nothing more;
                // the nodes are as it left them.
                if !holding.fence_orphan().await {
                    return Ok(());
                }
                tracing::warn!(cluster, operation = id, %message, "recovering an orphaned operation");
                holding
                    .finish(
                        OperationState::Failed,
                        Event::OperationFailed,
                        error(Code::Aborted, message),
                    )
                    .await?;
                self.operations.metrics().orphan_recoveries.inc();
                Ok(())
            }
            // Running under this very claim but not in flight here (its
            // drive gave up, e.g. etcd was down for long): resume. Steps are
            // idempotent and re-planned from the nodes as they are now.
            OperationState::Running => self.execute(holding, false).await,
            // Terminal but still in the slot cannot happen (completion clears
            // the slot in the same transaction).
            _ => Ok(()),
        }
    }

    /// Claims a PENDING operation another replica accepted from what this
    /// replica's watch cache and operation feed already hold, without
    /// reading etcd first. The claim compares every key the views came
    /// from (state, operation, spec, status), so a view that is not current
    /// only loses the compare-and-swap. `None` when the views do not both
    /// show the cluster as the accept left it, or the claim lost: the
    /// caller reads etcd instead.
    async fn claim_from_views(&self, cluster: &str, id: &str) -> Option<Holding<'_>> {
        let current = self.cache.get(cluster)?.ok()?;
        if current.state.operation.as_ref()?.id != id {
            return None;
        }
        let accepted_at = current.state_revision;
        let keys = self.operations.keys();
        let operation_key = keys.operation(cluster, id);
        let mut follower = self.operations.follow(&operation_key);
        let kv = match follower.known.take() {
            Some(kv) if kv.mod_revision >= accepted_at => kv,
            // The feed is past the accept and does not know the record.
            _ if self.operations.feed_revision() >= accepted_at => return None,
            // The cache's watch delivered the accept before the feed's did.
            _ => tokio::time::timeout(FEED_CATCH_UP, async {
                loop {
                    match follower.next().await? {
                        Seen::Record(kv) if kv.mod_revision >= accepted_at => return Some(kv),
                        Seen::Record(_) | Seen::Nothing => {}
                        Seen::Resync => return None,
                    }
                }
            })
            .await
            .ok()??,
        };
        // Written by the accept, and not since (a cancel request would be).
        if kv.mod_revision != accepted_at {
            return None;
        }
        let mut operation: OperationRecord = from_json(&kv).ok()?;
        if operation.state != OperationState::Pending || operation.cancel_requested {
            return None;
        }
        let claim = self.prepare_claim(&mut operation, &current.spec.spec)?;
        operation.started_at = Some(now_rfc3339());
        let checks = vec![
            Compare::mod_revision(
                keys.cluster_spec(cluster),
                CmpOp::Equal,
                current.spec_revision,
            ),
            match current.status_revision {
                0 => Compare::absent(keys.cluster_status(cluster)),
                revision => {
                    Compare::mod_revision(keys.cluster_status(cluster), CmpOp::Equal, revision)
                }
            },
        ];
        let write = vec![Op::put(operation_key, to_json(&operation))];
        let mut holding = Holding {
            executor: self,
            claim,
            cluster: current,
            operation,
            operation_revision: accepted_at,
            nodes: Vec::new(),
            nodes_fresh: false,
        };
        holding.operation_revision = holding.commit_checking(write, checks).await.ok()?;
        Some(holding)
    }

    /// Runs an operation whose accept already claimed it on this replica.
    pub(super) async fn drive_claimed(
        &self,
        claimed: ClaimedOperation,
    ) -> Result<(), LifecycleError> {
        let holding = Holding {
            executor: self,
            claim: claimed.claim,
            cluster: claimed.cluster,
            operation: claimed.operation,
            operation_revision: claimed.operation_revision,
            nodes: Vec::new(),
            nodes_fresh: false,
        };
        self.execute(holding, true).await
    }

    /// Runs the steps; `claimed` when the record already says RUNNING here
    /// with the first step (written by the accept).
    async fn execute(&self, mut holding: Holding<'_>, claimed: bool) -> Result<(), LifecycleError> {
        let deadline = tokio::time::Instant::now() + self.timeouts.get(holding.operation.kind);
        let steps = match holding.plan_steps(deadline).await {
            Ok(steps) => steps,
            // The claim ended (or lapsed past a TTL) meanwhile: whoever holds
            // the cluster next decides, nothing is written here.
            Err(_) if !holding.holds_claim() => return Ok(()),
            Err(failure) => {
                return holding
                    .finish(OperationState::Failed, Event::OperationFailed, failure)
                    .await
            }
        };
        // Resumed under the claim that ran it: from the persisted step.
        let resumed = holding.operation.state == OperationState::Running
            && holding.operation.owner_epoch == Some(holding.claim.epoch);
        let from = if resumed {
            resume_index(&holding.operation, &steps)
        } else {
            0
        };
        holding.operation.state = OperationState::Running;
        holding.operation.replica = Some(self.replication.replica_id().to_string());
        holding.operation.owner_epoch = Some(holding.claim.epoch);
        if holding.operation.started_at.is_none() {
            holding.operation.started_at = Some(now_rfc3339());
        }
        for (index, step) in steps.iter().enumerate().skip(from) {
            // The claim (first step) and the boundary before each mutating
            // step are written: a cancel request shows up there as a
            // conflict. A read-only step is worth neither a write nor a
            // cancel; its progress shows in the final record.
            let first = index == from && !claimed;
            let save = first || (index > from && step.is_mutating());
            if let Err(end) = holding.run_step(&steps, index, save, deadline).await {
                return match end {
                    StepEnd::Interrupted => Ok(()),
                    StepEnd::Ended(state, event, failure) => {
                        holding.finish(state, event, failure).await
                    }
                };
            }
        }
        if steps.is_empty() {
            // Nothing to do still claims, so the record says who ran it.
            if let Err(Interrupt::Lost) = holding.save_operation().await {
                return Ok(());
            }
        }
        if let Err(failure) = holding.check_outcome() {
            return holding
                .finish(OperationState::Failed, Event::OperationFailed, failure)
                .await;
        }
        holding
            .finish(OperationState::Succeeded, Event::OperationSucceeded, None)
            .await?;
        let cluster = &holding.cluster.spec.name;
        if let Some(expected) = self.gc_due(cluster) {
            self.collect_history(cluster, expected).await?;
        }
        Ok(())
    }
}

/// How a step ends the drive early.
enum StepEnd {
    /// Another writer took over: stop without writing.
    Interrupted,
    /// The operation ends so (cancelled or failed).
    Ended(OperationState, Event, Option<OperationError>),
}

impl Holding<'_> {
    /// The steps, planned from a successful look at the nodes when the plan
    /// depends on them.
    async fn plan_steps(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Step>, Option<OperationError>> {
        let nodes = if needs_nodes(&self.operation) {
            self.look_before_plan(deadline).await?
        } else {
            Vec::new()
        };
        check_plan_input(&self.operation, &nodes)
            .map_err(|message| error(Code::FailedPrecondition, message))?;
        Ok(plan(&self.operation, &self.cluster.spec.spec, &nodes))
    }

    /// Runs step `index` of `steps`, first persisting the progress when
    /// `save` (where a cancel request shows up).
    async fn run_step(
        &mut self,
        steps: &[Step],
        index: usize,
        save: bool,
        deadline: tokio::time::Instant,
    ) -> Result<(), StepEnd> {
        let step = &steps[index];
        let total = steps.len();
        let at = format!("step {} of {total} ({})", index + 1, step.name());
        self.operation.progress = Some(Progress {
            step: index as u32 + 1,
            total_steps: total as u32,
            step_name: step.name(),
        });
        if save {
            match self.save_operation().await {
                Ok(()) => {}
                Err(Interrupt::Cancelled) => {
                    let failure = error(Code::Cancelled, format!("cancelled before {at}"));
                    let end =
                        StepEnd::Ended(OperationState::Cancelled, Event::OperationFailed, failure);
                    return Err(end);
                }
                Err(Interrupt::Lost) => return Err(StepEnd::Interrupted),
            }
        }
        let failure = match tokio::time::timeout_at(deadline, self.call(step, deadline)).await {
            Ok(Ok(())) => return Ok(()),
            // Not the provider's answer: this replica stopped holding the
            // cluster (a lapse whose lease may yet live, or a lost claim).
            // Stop without writing; the holder next resumes or recovers.
            Ok(Err(_)) if !self.holds_claim() => return Err(StepEnd::Interrupted),
            Ok(Err(status)) => error(status.code(), format!("{at} failed: {}", status.message())),
            Err(_) => error(Code::DeadlineExceeded, format!("timed out during {at}")),
        };
        if step.is_mutating() {
            self.look_after_failure(deadline).await;
        }
        Err(StepEnd::Ended(
            OperationState::Failed,
            step.failure_event(),
            failure,
        ))
    }

    /// Success only as the provider shows it: an upgrade ends with every
    /// node at the target version.
    fn check_outcome(&self) -> Result<(), Option<OperationError>> {
        if self.operation.kind != OperationKind::Upgrade {
            return Ok(());
        }
        let params = &self.operation.params;
        let target = params
            .version
            .as_ref()
            .unwrap_or(&self.cluster.spec.spec.version);
        if self.nodes_fresh && all_at_version(&self.nodes, target) {
            return Ok(());
        }
        let behind: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| &n.version != target)
            .map(|n| n.id.as_str())
            .collect();
        let message = format!(
            "the provider does not show every node at {target} (behind: {})",
            behind.join(", ")
        );
        Err(error(Code::FailedPrecondition, message))
    }
}
