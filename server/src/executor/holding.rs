//! The cluster and operation as an executor holds them, and the one place
//! its writes go through: a transaction that compares the state key's and
//! the operation's revisions and this replica's claim (the fence).

use super::Executor;
use crate::cluster::{to_json, ClusterRecord};
use crate::operation::{LifecycleError, OperationError, OperationRecord, Versioned};
use crate::replication::Claim;
use crate::store::{CmpOp, Compare, Op, StoreError, Txn};
use drover_proto::provider::v1 as pb;
use std::time::Duration;
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

impl Holding<'_> {
    /// The one place executor writes go through: the transaction applies
    /// only while the cluster's state and the operation are as this executor
    /// last saw them, and while this replica owns the cluster.
    ///
    /// etcd being unreachable is retried while the claim lives. A write whose
    /// outcome was unknown (the connection broke after sending) is
    /// recognised afterwards by the operation record it wrote.
    pub(super) async fn commit(&mut self, writes: Vec<Op>) -> Result<i64, LifecycleError> {
        self.commit_checking(writes, Vec::new()).await
    }

    /// [`Self::commit`], also comparing `checks`.
    pub(super) async fn commit_checking(
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
    pub(super) fn holds_claim(&self) -> bool {
        self.executor.replication.claim(&self.cluster.spec.name) == Some(self.claim)
    }

    /// The deadline of a provider call under this operation's claim, or
    /// ABORTED once the claim no longer holds.
    pub(super) async fn claim_deadline(&self) -> Result<std::time::Instant, tonic::Status> {
        let name = &self.cluster.spec.name;
        let replication = &self.executor.replication;
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

pub(super) fn is_conflict(error: &LifecycleError) -> bool {
    matches!(error, LifecycleError::Registry(e) if e.is_conflict())
}

/// An operation error with `code`, as the operation record holds it.
pub(super) fn error(code: Code, message: impl Into<String>) -> Option<OperationError> {
    Some(OperationError {
        code: format!("{code:?}"),
        message: message.into(),
    })
}
