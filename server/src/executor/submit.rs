//! The entry of a lifecycle request: accept it and, when this replica owns
//! the cluster, claim it in the accept's own transaction and start it; when
//! another replica owns it, claim it in the same way for that owner, which
//! then runs it without a claim of its own.
//!
//! The request goes down the layers and comes back only as results: the
//! `operation` module plans the accept (compares and writes, no side
//! effects) and commits it; in between, this replica adds its claim to the
//! plan when it owns the cluster and can plan the operation without asking
//! the provider. A claimed accept is written RUNNING under the owner's
//! epoch, so no watch event starts it again and no read follows.

use super::start::Origin;
use super::{needs_nodes, plan, shape, Answered, Asked, Executor};
use crate::cluster::{ClusterRecord, Spec};
use crate::config::OrphanPolicy;
use crate::operation::{
    AcceptPlan, LifecycleError, LifecycleRequest, OperationKind, OperationRecord, OperationState,
    Progress,
};
use crate::owner_work::InFlight;
use crate::replication::Claim;
use crate::store::StoreFailure;
use std::sync::Arc;
use tracing::Instrument;

impl Executor {
    /// Asks for `request` on `cluster` as Drover's own work (a
    /// remediation, a rollout's step, the scanner's recovery): through the
    /// same accept as any request, and written to the audit log as started
    /// by Drover (for `rollout`, when a rollout's).
    pub async fn submit_own(
        self: &Arc<Self>,
        audit: &crate::audit::AuditLog,
        cluster: &str,
        rollout: Option<&str>,
        request: LifecycleRequest,
    ) -> Result<OperationRecord, LifecycleError> {
        let (method, request_id) = (request.kind.rules().rpc(), request.request_id.clone());
        let submitted = self.submit(cluster, request).await;
        let accepted = submitted.as_ref().map(|op| op.id.as_str());
        let accepted = accepted.map_err(ToString::to_string);
        audit.started_by_drover(method, cluster, rollout, &request_id, accepted);
        submitted
    }

    /// Accepts `request` on `cluster` in one transaction, or refuses it
    /// having written nothing; an operation accepted on a cluster this
    /// replica owns starts here at once.
    pub async fn submit(
        self: &Arc<Self>,
        cluster: &str,
        request: LifecycleRequest,
    ) -> Result<OperationRecord, LifecycleError> {
        // The accept's span: the operation's trace starts (or, with a
        // caller's traceparent, continues) here.
        let span = tracing::info_span!(
            "accept",
            cluster,
            kind = request.kind.name(),
            request_id = %request.request_id,
        );
        self.submit_traced(cluster, request).instrument(span).await
    }

    async fn submit_traced(
        self: &Arc<Self>,
        cluster: &str,
        request: LifecycleRequest,
    ) -> Result<OperationRecord, LifecycleError> {
        // The watch cache usually holds the cluster as etcd does: try the
        // transaction on it first (it compares the revisions it read, so a
        // stale view only loses). Any refusal or lost race on the cached
        // view is decided again on a read from etcd.
        let mut answered = Answered::default();
        let on_cache = match self.cache.get(cluster) {
            Some(Ok(cached)) => Some(self.accept_on(cached, &request, &mut answered, true).await),
            _ => None,
        };
        if let Some(Ok(Some(record))) = on_cache {
            return Ok(record);
        }
        // A request id already used fails the transaction's compare: its
        // first answer is looked up only now, not before every accept (a
        // read per accept with a request id, and rollouts use them all).
        if let Some(existing) = self.operations.answer_retry(cluster, &request).await? {
            return Ok(existing);
        }
        match on_cache {
            // etcd's answer, not the view's: an unreachable etcd (or a
            // write whose outcome is unknown) is the caller's to retry.
            Some(Err(error)) if error.store_error().is_some() => return Err(error),
            // Schemas only grow: etcd holds one at least as new (and the
            // refusal is logged and counted once).
            Some(Err(error @ LifecycleError::NewerSchema { .. })) => return Err(error),
            // Asking a provider that could not be asked again would only
            // double the caller's wait.
            Some(Err(error @ LifecycleError::ProviderUnavailable(_))) => return Err(error),
            _ => {}
        }
        // Not for the owner this time: its claim as this replica's view of
        // the owner keys shows it may be what failed the first try.
        let current = self.operations.registry().get(cluster).await?;
        match self
            .accept_on(current, &request, &mut answered, false)
            .await?
        {
            Some(record) => Ok(record),
            None => Err(self.operations.explain_lost_race(cluster, &request).await),
        }
    }

    /// Accepts `request` on the cluster as read in `view`: the operation,
    /// or `None` when the cluster changed since (nothing written). With
    /// `for_owner`, an accept on a cluster another replica owns folds in
    /// that owner's claim ([`Self::claim_for_owner`]).
    async fn accept_on(
        self: &Arc<Self>,
        view: ClusterRecord,
        request: &LifecycleRequest,
        answered: &mut Answered,
        for_owner: bool,
    ) -> Result<Option<OperationRecord>, LifecycleError> {
        let mut plan = self.operations.plan_accept(view, request)?;
        self.check_shape_change(&plan, request.kind, answered)
            .await?;
        let Some((claim, mark)) = self.claim_at_accept(&mut plan) else {
            if for_owner {
                self.claim_for_owner(&mut plan);
            }
            let accepted = self.operations.commit_accept(plan).await?;
            return Ok(accepted.map(|accepted| accepted.operation));
        };
        // The commit and the start run to completion in their own task: a
        // caller that goes away mid-call must not leave a committed, claimed
        // operation that nobody runs.
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let (cluster, id) = (plan.view().spec.name.clone(), plan.operation.id.clone());
            let committed = this.operations.commit_accept(plan).await;
            match &committed {
                Ok(Some(accepted)) => {
                    let origin = Origin::Accepted(Box::new(accepted.clone()), claim);
                    this.start(origin, mark);
                }
                // It may or may not have committed (etcd's reply can be lost
                // after the commit): drop the mark and look at the slot
                // again, since a state change that arrived while the mark
                // stood was skipped for it.
                _ => {
                    drop(mark);
                    tokio::spawn(async move { this.start_slot_of(&cluster, Some(&id)).await });
                }
            }
            committed.map(|accepted| accepted.map(|accepted| accepted.operation))
        })
        .await
        .expect("the accept task does not panic")
    }

    /// Asks the provider about the shape `plan` leaves the cluster in, when
    /// it is another than the cluster's now (a request that keeps the shape,
    /// such as a stop, never asks).
    async fn check_shape_change(
        &self,
        plan: &AcceptPlan,
        kind: OperationKind,
        answered: &mut Answered,
    ) -> Result<(), LifecycleError> {
        let before = shape(&plan.view().spec.spec);
        let after = shape(plan.spec_after());
        if before == after {
            return Ok(());
        }
        let asked = Asked::Change {
            kind,
            before: &before,
        };
        let spec = &plan.view().spec;
        self.check_shape(&spec.spec.provider, &spec.uid, asked, after, answered)
            .await
    }

    /// Folds this replica's claim into the accept, when it owns the cluster
    /// and can plan the operation without asking the provider: marks the
    /// operation in flight here (so no watch event starts it again), makes
    /// the record RUNNING here at its first step, and makes the accept
    /// depend on the claim's fence and on the whole view being current
    /// (the executor starts from it, not only from the state key).
    fn claim_at_accept(&self, plan: &mut AcceptPlan) -> Option<(Claim, InFlight)> {
        if !plan.executes() || self.work.is_stopping() {
            return None;
        }
        let mark = self.work.mark(&plan.operation.id)?;
        let spec = plan.spec_after().clone();
        let claim = self.prepare_claim(&mut plan.operation, &spec)?;
        self.compare_claim(plan, claim);
        Some((claim, mark))
    }

    /// Folds the owner's claim into an accept on a cluster another replica
    /// owns, as this replica's view of the owner keys shows it, when the
    /// plan does not depend on the nodes: the record is written RUNNING at
    /// its first step under the owner's epoch, and the accept compares the
    /// owner key and the whole view, as the owner's own claim would. The
    /// owner then finds the operation in the slot already claimed and runs
    /// it with no write of its own first (one etcd transaction and its watch
    /// events fewer per operation). A stale view of the owner only fails
    /// the compare; the caller accepts again without it.
    ///
    /// Only while orphans are resumed: an owner that goes before it picks
    /// the operation up leaves it RUNNING under its epoch, for the next
    /// owner to resume (fenced, as any orphan) rather than fail unstarted.
    fn claim_for_owner(&self, plan: &mut AcceptPlan) {
        let resumes = matches!(self.orphans, OrphanPolicy::Resume { limit } if limit > 0);
        if !plan.executes() || !resumes {
            return;
        }
        let cluster = &plan.view().spec.name;
        let Some((owner, claim)) = self.work.replication().claim_of_owner(cluster) else {
            return;
        };
        let spec = plan.spec_after().clone();
        if run_at_first_step(&mut plan.operation, &spec, &owner, claim).is_none() {
            return;
        }
        self.compare_claim(plan, claim);
    }

    /// Makes the accept depend on `claim`'s fence and on the whole view
    /// being current (the owner starts from it, not only from the state
    /// key).
    fn compare_claim(&self, plan: &mut AcceptPlan, claim: Claim) {
        let keys = self.operations.keys();
        let fence = claim.fence(keys, &plan.view().spec.name);
        let unchanged = plan.view().unchanged(keys);
        plan.compare(fence.into_iter().chain(unchanged));
    }

    /// Makes `operation` RUNNING here at its first step, when this replica
    /// owns its cluster and the plan does not depend on the nodes (so it is
    /// known without asking the provider).
    pub(super) fn prepare_claim(
        &self,
        operation: &mut OperationRecord,
        spec: &Spec,
    ) -> Option<Claim> {
        let claim = self.work.claim(&operation.cluster)?;
        let me = self.work.replication().replica_id();
        run_at_first_step(operation, spec, me, claim)?;
        Some(claim)
    }
}

/// Makes `operation` RUNNING at its first step under `replica`'s `claim`,
/// when its plan does not depend on the nodes (so it is known without asking
/// the provider); `None`, the operation untouched, otherwise.
fn run_at_first_step(
    operation: &mut OperationRecord,
    spec: &Spec,
    replica: &str,
    claim: Claim,
) -> Option<()> {
    if needs_nodes(operation) {
        return None;
    }
    // An operation planned from the nodes (an upgrade, a recover) is
    // never claimed here, so the capabilities do not matter.
    let caps = drover_proto::provider::v1::Capabilities::default();
    let steps = plan(operation, spec, &[], &caps);
    let first = steps.first()?;
    operation.state = OperationState::Running;
    operation.run_by(replica, claim.epoch);
    operation.started_at = Some(operation.created_at.clone());
    operation.progress = Some(Progress {
        step: 1,
        total_steps: steps.len() as u32,
        step_name: first.name(),
    });
    Some(())
}
