//! The hand-off from accepting to executing on the same replica: when the
//! replica that accepts a request owns the cluster, the claim is folded into
//! the accept transaction and the operation starts at once, without waiting
//! for the watch and reading the records back.

use super::OperationRecord;
use crate::cluster::{ClusterRecord, Spec};
use crate::replication::Claim;

/// An operation accepted and claimed in one transaction, as committed.
#[derive(Debug, Clone)]
pub struct ClaimedOperation {
    /// The cluster as the accept left it (its state key at `state_revision`).
    pub cluster: ClusterRecord,
    pub operation: OperationRecord,
    pub operation_revision: i64,
    pub claim: Claim,
}

/// This replica's executor, as the accept path sees it.
pub trait LocalRunner: Send + Sync {
    /// If this replica owns the cluster and can plan `operation` on `spec`
    /// without asking the provider, marks the operation as running here (so
    /// no watch event starts it again) and fills in the claim: RUNNING, this
    /// replica and epoch, the first step. Returns the claim to fence the
    /// accept with; `None` leaves the operation to the usual path.
    fn claim_at_accept(&self, operation: &mut OperationRecord, spec: &Spec) -> Option<Claim>;
    /// The accept failed, so it may or may not have committed (etcd's reply
    /// can be lost after the commit): forget the mark, and look at the
    /// cluster's slot again, since a state change that arrived while the
    /// mark stood was skipped for it.
    fn abandon(&self, cluster: &str, operation: &str);
    /// The accept committed: run it.
    fn run_claimed(&self, claimed: ClaimedOperation);
}
