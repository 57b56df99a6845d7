//! The cluster and operation as an executor holds them, and the one place
//! its writes go through: a transaction that compares the state key's and
//! the operation's revisions and this replica's claim (the fence).

use super::Executor;
use crate::cluster::{to_json, ClusterRecord};
use crate::operation::{LifecycleError, OperationError, OperationRecord, Versioned};
use crate::replication::Claim;
use crate::store::{CmpOp, Compare, Op, StoreFailure, Txn};
use drover_proto::provider::v1 as pb;
use tonic::Code;

/// How a drive ends early.
pub(super) enum Interrupt {
    /// Cancel was requested: stop at this boundary.
    Cancelled,
    /// Someone else moved the operation or the cluster: stop touching it.
    Lost,
}

/// The cluster and operation as this executor holds them.
pub(super) struct Holding<'e> {
    pub(super) executor: &'e Executor,
    pub(super) claim: Claim,
    pub(super) cluster: ClusterRecord,
    pub(super) operation: OperationRecord,
    pub(super) operation_revision: i64,
    pub(super) nodes: Vec<pb::ProviderNode>,
    /// `nodes` is the provider's latest answer in this execution, not a
    /// view from before it (a resumed execution starts without one).
    pub(super) nodes_fresh: bool,
}

impl<'e> Holding<'e> {
    pub(super) fn new(
        executor: &'e Executor,
        claim: Claim,
        cluster: ClusterRecord,
        operation: OperationRecord,
        operation_revision: i64,
    ) -> Self {
        Self {
            executor,
            claim,
            cluster,
            operation,
            operation_revision,
            nodes: Vec::new(),
            nodes_fresh: false,
        }
    }

    /// The one place executor writes go through: the transaction applies
    /// only while the cluster's state and the operation are as this executor
    /// last saw them, and while this replica owns the cluster.
    ///
    /// etcd being unreachable is retried while the claim lives. A write whose
    /// outcome was unknown (the connection broke after sending) is
    /// recognised afterwards by the operation record it wrote (see
    /// [`OwnerWork::commit`](crate::owner_work::OwnerWork::commit)).
    pub(super) async fn commit(&mut self, writes: Vec<Op>) -> Result<i64, LifecycleError> {
        self.commit_checking(writes, Vec::new()).await
    }

    /// [`Self::commit`], also comparing `checks`.
    pub(super) async fn commit_checking(
        &mut self,
        writes: Vec<Op>,
        checks: Vec<Compare>,
    ) -> Result<i64, LifecycleError> {
        let operations = &self.executor.operations;
        let keys = operations.keys();
        let name = &self.cluster.spec.name;
        let operation_key = keys.operation(name, &self.operation.id);
        // The operation record only this write produces: it recognises the
        // write after a lost reply.
        let marker = writes
            .iter()
            .find(|op| matches!(op, Op::Put { key, .. } if *key == operation_key))
            .cloned();
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
        let work = &self.executor.work;
        let store = operations.store();
        let revision = work
            .commit(store, txn, name, self.claim, marker.as_ref())
            .await?;
        if let Some(Op::Put { key, value, .. }) = marker {
            operations.record_own_write(key, value, revision);
        }
        Ok(revision)
    }

    /// Writes the operation record.
    pub(super) async fn save_operation(&mut self) -> Result<(), Interrupt> {
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
    pub(super) async fn explain(&mut self, error: LifecycleError) -> Interrupt {
        if !error.is_conflict() {
            tracing::warn!(%error, operation = %self.operation.id, "write failed");
            return Interrupt::Lost;
        }
        if self.cancel_seen().await {
            Interrupt::Cancelled
        } else {
            Interrupt::Lost
        }
    }

    /// Whether the operation record, read now, carries a cancel request
    /// while the cluster and the run are still as this executor holds
    /// them. If so, the final write compares the record the cancel wrote.
    pub(super) async fn cancel_seen(&mut self) -> bool {
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
                    return false;
                }
                self.operation.cancel_requested = true;
                self.operation.abandon_reason = record.abandon_reason;
                self.operation_revision = revision;
                true
            }
            _ => false,
        }
    }

    /// Whether this replica still holds the cluster under this claim.
    pub(super) fn holds_claim(&self) -> bool {
        self.executor
            .work
            .holds(&self.cluster.spec.name, self.claim)
    }

    /// The deadline of a provider call under this operation's claim, or
    /// ABORTED once the claim no longer holds.
    pub(super) async fn claim_deadline(&self) -> Result<std::time::Instant, tonic::Status> {
        let name = &self.cluster.spec.name;
        let replication = self.executor.work.replication();
        replication
            .claim_deadline(name, self.claim)
            .await
            .ok_or_else(|| tonic::Status::aborted("this replica no longer owns the cluster"))
    }

    pub(super) fn token(&self) -> Option<pb::FencingToken> {
        Some(pb::FencingToken {
            cluster_uid: self.cluster.spec.uid.clone(),
            epoch: self.claim.epoch,
            operation_id: self.operation.id.clone(),
        })
    }
}

/// An operation error with `code`, as the operation record holds it.
pub(super) fn error(code: Code, message: impl Into<String>) -> Option<OperationError> {
    Some(OperationError {
        code: format!("{code:?}"),
        message: message.into(),
    })
}
