//! How a held operation ends: the fence an orphan needs first, the status
//! it leaves (only what the provider showed), and the completing
//! transaction.

use super::holding::{error, Holding, Interrupt};
use crate::cluster::machine::{self, Event};
use crate::cluster::{
    now_rfc3339, to_json, ClusterState, LastOperation, StateRecord, StatusRecord, SCHEMA_VERSION,
};
use crate::health::merge_nodes;
use crate::metrics::{KindLabels, OperationLabels};
use crate::operation::{LifecycleError, OperationError, OperationState};
use crate::provider::{node_status, DESCRIBE_TIMEOUT};
use crate::store::{Op, StoreFailure};
use drover_proto::provider::v1 as pb;
use std::time::Duration;
use tonic::Code;

/// The first and the longest pause between fencing looks of an orphan
/// (a cancel request is seen after at most the longest).
const FENCE_RETRY_FIRST: Duration = Duration::from_millis(500);
const FENCE_RETRY_MAX: Duration = Duration::from_secs(5);

/// How the fence of an orphan ended.
pub(super) enum Fence {
    /// A fenced call succeeded: nothing the lost owner sent can land now.
    Done,
    /// This replica stopped trying (the cluster moved on, or it is shutting
    /// down): the operation stays for the next owner.
    GaveUp,
    /// The operation ends unfenced, so (cancelled, or out of time).
    Ended(OperationState, Option<OperationError>),
}

impl Holding<'_> {
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

    /// Makes a provider call under this owner's epoch (a fenced describe)
    /// before an orphan is resumed or failed: until one succeeds, a call the
    /// lost owner made could still land. Retries with backoff while this
    /// replica holds the cluster, saying in the status why the operation is
    /// still held, until a cancel request or the operation's `deadline`
    /// (counted from its acceptance) ends it unfenced.
    pub(super) async fn fence_orphan(&mut self, deadline: tokio::time::Instant) -> Fence {
        let name = self.cluster.spec.name.clone();
        let mut delays = crate::retry::doubling(FENCE_RETRY_FIRST, FENCE_RETRY_MAX);
        let mut said = false;
        loop {
            let delay = delays.next().unwrap_or(FENCE_RETRY_MAX);
            let why = match tokio::time::timeout(DESCRIBE_TIMEOUT, self.describe()).await {
                Ok(Ok(_)) => return Fence::Done,
                Ok(Err(status)) => format!(
                    "the provider answered {:?}: {}",
                    status.code(),
                    status.message()
                ),
                Err(_) => format!("no answer within {DESCRIBE_TIMEOUT:?}"),
            };
            let holds = self.executor.work.holds(&name, self.claim);
            if !holds || self.executor.work.is_stopping() {
                return Fence::GaveUp;
            }
            if let Some(ended) = self.unfenced_end(&why, deadline).await {
                return ended;
            }
            tracing::warn!(cluster = %name, operation = %self.operation.id, %why, retry_in = ?delay, "cannot fence the provider; the orphan is held until a fenced call succeeds, a cancel or its timeout");
            if !said {
                let message = format!(
                    "recovering operation {} of a lost replica: cannot fence the provider ({why}); retrying until it answers, the operation is cancelled or it times out",
                    self.operation.id
                );
                said = self.say_in_status(message).await;
            }
            let pause = delay.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            if !self.executor.work.pause_unless_stopping(pause).await {
                return Fence::GaveUp;
            }
        }
    }

    /// How an orphan whose fence failed (`why`) ends unfenced, if it does
    /// now: cancelled, or past its deadline. The message says plainly that
    /// the provider could not be fenced.
    async fn unfenced_end(&mut self, why: &str, deadline: tokio::time::Instant) -> Option<Fence> {
        let lost = self.operation.replica.clone().unwrap_or_default();
        let unproven = format!(
            "the provider could not be fenced ({why}): a call replica {lost} sent before it was lost may still land"
        );
        if self.cancel_seen().await {
            if let Some(reason) = self.operation.abandon_reason.clone() {
                let failure = error(
                    Code::Aborted,
                    format!("abandoned by an admin ({reason}) while recovering it from lost replica {lost}: Drover cannot prove that the provider stopped; {unproven}"),
                );
                return Some(Fence::Ended(OperationState::Failed, failure));
            }
            let failure = error(
                Code::Cancelled,
                format!("cancelled while recovering it from lost replica {lost}; {unproven}"),
            );
            return Some(Fence::Ended(OperationState::Cancelled, failure));
        }
        if tokio::time::Instant::now() >= deadline {
            let failure = error(
                Code::DeadlineExceeded,
                format!("timed out (counted from its acceptance) while recovering it from lost replica {lost}; {unproven}"),
            );
            return Some(Fence::Ended(OperationState::Failed, failure));
        }
        None
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
            let shown = self.nodes.iter().map(node_status).collect();
            let spec = &self.cluster.spec.spec;
            status.nodes = merge_nodes(&status.nodes, shown, spec, &now_rfc3339());
        }
        if state == OperationState::Succeeded {
            // The health check passed: nothing holds remediation back any
            // more (the attempts stay, for the retry budget).
            status.remediation.message.clear();
            status.remediation.short_circuited = false;
            status.observed_generation = Some(self.cluster.spec.generation);
            let version = &self.cluster.spec.spec.version;
            if self.nodes_fresh && all_at_version(&self.nodes, version) {
                status.current_version = Some(version.clone());
            }
            if self.operation.kind.rules().clears_nodes() {
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

    /// The metrics of an operation that ended in `state`, moving its
    /// cluster from `from` to `to`.
    fn count_finished(&self, state: OperationState, from: ClusterState, to: ClusterState) {
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
    }

    /// Ends the operation: moves the cluster as the table says (only if it
    /// still holds it), clears the slot, records the outcome and the status.
    pub(super) async fn finish(
        &mut self,
        state: OperationState,
        event: Event,
        error: Option<OperationError>,
    ) -> Result<(), LifecycleError> {
        let from = self.cluster.state.state;
        let to = machine::final_state(
            from,
            self.operation.go_ahead,
            self.operation.kind.rules().go_ahead_moves(),
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
            // Watchers get a transaction's events in its order: the status
            // first, so whoever the state change wakes (a rollout) reads
            // how the operation ended; the operation record last, so that
            // a waiter it answers finds the cluster's cache up to date.
            let writes = vec![
                Op::put(keys.cluster_status(&name), to_json(&status)),
                Op::put(keys.cluster_state(&name), to_json(&new_state)),
                Op::put(
                    keys.operation(&name, &self.operation.id),
                    to_json(&self.operation),
                ),
            ];
            match self.commit(writes).await {
                Ok(_) => break,
                Err(error) if cancels_seen == 0 && error.is_conflict() => {
                    cancels_seen += 1;
                    if let Interrupt::Lost = self.explain(error).await {
                        return Err(LifecycleError::Raced(name));
                    }
                }
                Err(error) => return Err(error),
            }
        }
        self.count_finished(state, from, to);
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

/// Whether the provider's answer shows nodes, every one at `version`.
pub(super) fn all_at_version(nodes: &[pb::ProviderNode], version: &str) -> bool {
    !nodes.is_empty() && nodes.iter().all(|n| n.version == version)
}
