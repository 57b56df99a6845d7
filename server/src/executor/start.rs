//! How an operation comes to be held, and run, here.
//!
//! An operation begins in one of three ways: accepted here (the accept
//! claimed it in its own transaction, see `submit`), accepted on another
//! replica (found in its cluster's slot through the watch cache, PENDING or
//! already claimed for this owner by that accept), or left RUNNING by a
//! lost owner (found the same way once this replica adopts the cluster).
//! [`Executor::start`] takes every one of them: it spawns the drive, which
//! first gets a [`Holding`] ([`Executor::hold`]) and then runs, cancels or
//! recovers it.

use super::holding::{error, Holding};
use super::Executor;
use crate::cluster::machine::Event;
use crate::cluster::{from_json, now_rfc3339, to_json, ClusterRecord, StateBrief, StateRecord};
use crate::config::OrphanPolicy;
use crate::metrics::Running;
use crate::operation::{
    Accepted, LifecycleError, OperationRecord, OperationState, Seen, Versioned,
};
use crate::owner_work::{Controller, InFlight, Next, ReconcileError, Reconciler, Triggers};
use crate::replication::Claim;
use crate::store::Op;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tonic::Code;
use tracing::Instrument;

/// How often every owned slot is looked at, whatever the triggers.
const RESCAN_INTERVAL: Duration = Duration::from_secs(30);
/// How long the executor waits for the operation feed to deliver an
/// operation whose accept the watch cache already showed, before reading it
/// from etcd instead.
const FEED_CATCH_UP: Duration = Duration::from_millis(50);

/// Where an operation to run comes from.
pub(super) enum Origin {
    /// This replica's accept claimed it: held as committed.
    Accepted(Box<Accepted>, Claim),
    /// Found in the slot of the cluster: accepted elsewhere, or left by a
    /// lost owner.
    Slot { cluster: String, id: String },
}

/// An operation as this replica holds it, and what to do with it.
pub(super) enum Held<'e> {
    /// Run its steps; `claimed` when the record already says RUNNING here
    /// at its first step.
    Run { holding: Holding<'e>, claimed: bool },
    /// A PENDING operation whose cancel was asked for.
    Cancel(Holding<'e>),
    /// RUNNING under an owner epoch that is gone: resumed.
    Resume(Holding<'e>),
    /// RUNNING under an owner epoch that is gone: failed.
    Orphan(Holding<'e>),
}

impl<'e> Held<'e> {
    fn holding(&self) -> &Holding<'e> {
        match self {
            Held::Run { holding, .. }
            | Held::Cancel(holding)
            | Held::Resume(holding)
            | Held::Orphan(holding) => holding,
        }
    }
}

/// The span of this owner's run of the held operation: every log line of
/// the run carries its operation, cluster and trace id; when traced, a
/// child of the accept's span, linked to the runs of owners that were
/// lost.
fn run_span(holding: &Holding<'_>) -> tracing::Span {
    let operation = &holding.operation;
    let span = tracing::info_span!(
        "operation",
        operation = %operation.id,
        cluster = %operation.cluster,
        kind = operation.kind.name(),
        trace_id = tracing::field::Empty,
    );
    let earlier = operation.earlier_run_spans(holding.claim.epoch);
    drover_telemetry::continue_trace(&span, operation.trace_parent.as_deref(), earlier);
    if let Some(trace_id) = drover_telemetry::trace_id(&span) {
        span.record("trace_id", trace_id);
    }
    span
}

#[async_trait::async_trait]
impl Reconciler for Executor {
    fn controller(&self) -> Controller {
        Controller::Executor
    }

    fn triggers(&self) -> Triggers {
        Triggers {
            state: true,
            tasks: false,
            adoption: true,
        }
    }

    /// A look at every slot now and then catches anything a trigger
    /// missed.
    fn resync(&self) -> Duration {
        RESCAN_INTERVAL
    }

    /// Unbounded: a reconcile drives a whole operation, and every owned
    /// cluster's operation runs at once (a replica may adopt thousands).
    fn concurrency(&self) -> usize {
        usize::MAX
    }

    /// The owned clusters whose slot holds an operation (every owned one
    /// while the cache is not ready); forgets the history counts of the
    /// clusters no longer owned.
    fn candidates(&self) -> Vec<String> {
        self.history()
            .retain(|cluster, _| self.work.claim(cluster).is_some());
        let with_slot = |state: StateBrief| state.busy;
        self.work.owned_where(&self.cache, with_slot)
    }

    /// Other owners may have added to its history meanwhile.
    fn adopted(&self, cluster: &str) {
        self.history().remove(cluster);
    }

    /// A state change is worth a look when its slot holds an operation
    /// that does not run here (one this replica accepted runs already).
    fn wants(&self, _cluster: &str, state: Option<&crate::store::KeyValue>) -> bool {
        let Some(kv) = state else { return true };
        from_json::<StateRecord>(kv).map_or(true, |state| {
            state
                .operation
                .is_some_and(|slot| !self.work.runs(&slot.id))
        })
    }

    /// Runs the operation in the cluster's slot, if any and not running
    /// here yet: accepted elsewhere, or left by a lost owner.
    async fn reconcile(
        self: Arc<Self>,
        cluster: String,
        _claim: Claim,
    ) -> Result<Next, ReconcileError> {
        let Some(state) = self.state_of(&cluster).await? else {
            return Ok(Next::Idle);
        };
        let Some(slot) = state.operation else {
            return Ok(Next::Idle);
        };
        if self.work.is_stopping() {
            return Ok(Next::Idle);
        }
        // Running here already: this replica's accept drives it.
        let Some(mark) = self.work.mark(&slot.id) else {
            return Ok(Next::Idle);
        };
        let origin = Origin::Slot {
            cluster: cluster.clone(),
            id: slot.id.clone(),
        };
        let driven = self.drive(origin).await;
        drop(mark);
        driven?;
        Ok(Next::Idle)
    }
}

impl Executor {
    /// The cluster's state as the cache shows it (at most moments behind
    /// etcd: a slot filled after its view arrives as a change), or read
    /// from etcd when the cache does not have it.
    async fn state_of(&self, cluster: &str) -> Result<Option<StateRecord>, LifecycleError> {
        if let Some(state) = self.cached_state(cluster) {
            return Ok(Some(state));
        }
        let key = self.operations.keys().cluster_state(cluster);
        let read = self.operations.store().get(&key).await?;
        Ok(read.into_single().and_then(|kv| from_json(&kv).ok()))
    }

    /// The cluster's state from the cache, when it follows etcd: its state
    /// key alone is parsed, not the whole cluster (every operation's
    /// reconcile looks).
    fn cached_state(&self, cluster: &str) -> Option<StateRecord> {
        from_json(&self.cache_state_kv(cluster)?).ok()
    }

    /// Starts the operation in the cluster's slot, if any and not running
    /// here yet (`own_accept`: see [`Self::start_slot`]).
    pub(super) async fn start_slot_of(self: &Arc<Self>, cluster: &str, own_accept: Option<&str>) {
        // The cache is at most moments behind etcd, and a slot filled after
        // its view arrives as a change: no read per adopted cluster (a
        // replica may adopt thousands at once).
        if let Some(state) = self.cached_state(cluster) {
            self.start_slot(cluster, &state, own_accept);
            return;
        }
        let key = self.operations.keys().cluster_state(cluster);
        match self.operations.store().get(&key).await {
            Ok(read) => {
                let state = read.into_single().and_then(|kv| from_json(&kv).ok());
                if let Some(state) = state {
                    self.start_slot(cluster, &state, own_accept);
                }
            }
            Err(error) => {
                tracing::warn!(cluster, %error, "cannot read the state of a cluster to look at; the next scan retries")
            }
        }
    }

    /// Starts the operation in a slot, unless the replica is shutting down;
    /// even then when it is `own_accept`, an operation this replica's accept
    /// claimed (committed RUNNING under its epoch: left alone, the next
    /// owner would fail it as an orphan).
    fn start_slot(self: &Arc<Self>, cluster: &str, state: &StateRecord, own_accept: Option<&str>) {
        let Some(slot) = &state.operation else { return };
        if self.work.is_stopping() && own_accept != Some(slot.id.as_str()) {
            return;
        }
        if self.work.claim(cluster).is_none() {
            return;
        }
        let Some(mark) = self.work.mark(&slot.id) else {
            return;
        };
        let origin = Origin::Slot {
            cluster: cluster.to_string(),
            id: slot.id.clone(),
        };
        self.start(origin, mark);
    }

    /// Runs an operation, marked in flight here by `mark`, in a task of its
    /// own. The one way an operation starts.
    pub(super) fn start(self: &Arc<Self>, origin: Origin, mark: InFlight) {
        let (cluster, id) = match &origin {
            Origin::Accepted(accepted, _) => (
                accepted.cluster.spec.name.clone(),
                accepted.operation.id.clone(),
            ),
            Origin::Slot { cluster, id } => (cluster.clone(), id.clone()),
        };
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(error) = this.drive(origin).await {
                tracing::warn!(cluster, operation = id, %error, "operation not finished; looking at its cluster again");
            }
            drop(mark);
            // A trigger that came meanwhile found the operation in flight
            // here and started nothing (a lapse and a new claim, say):
            // look again now.
            this.work.trigger(Controller::Executor, &cluster);
        });
    }

    /// Holds the operation, then runs, cancels or recovers it, in its run
    /// span.
    async fn drive(&self, origin: Origin) -> Result<(), LifecycleError> {
        let Some(held) = self.hold(origin).await? else {
            return Ok(());
        };
        let span = run_span(held.holding());
        self.drive_held(held).instrument(span).await
    }

    async fn drive_held(&self, held: Held<'_>) -> Result<(), LifecycleError> {
        match held {
            Held::Run { holding, claimed } => {
                let _running = self.running(&holding);
                let deadline =
                    tokio::time::Instant::now() + self.timeouts.get(holding.operation.kind);
                self.execute(holding, claimed, deadline).await
            }
            Held::Cancel(mut holding) => {
                let cancelled = error(Code::Cancelled, "cancelled before it started");
                holding
                    .finish(OperationState::Cancelled, Event::OperationFailed, cancelled)
                    .await
            }
            Held::Resume(holding) => {
                let _running = self.running(&holding);
                self.resume_orphan(holding).await
            }
            Held::Orphan(holding) => self.recover_orphan(holding).await,
        }
    }

    /// Counts the held operation as running here (for the oldest-running
    /// gauge) until the mark is dropped, from its acceptance: a resumed one
    /// shows its whole age, not the time since this replica took it.
    fn running(&self, holding: &Holding<'_>) -> Running {
        let operation = &holding.operation;
        let accepted =
            humantime::parse_rfc3339(&operation.created_at).unwrap_or_else(|_| SystemTime::now());
        self.operations.metrics().running(operation.kind, accepted)
    }

    /// The operation as this replica holds it, however it began; `None`
    /// when it is not this replica's to run (no longer in the slot, the
    /// cluster not owned here).
    async fn hold(&self, origin: Origin) -> Result<Option<Held<'_>>, LifecycleError> {
        let (cluster, id) = match origin {
            Origin::Accepted(accepted, claim) => {
                let Accepted {
                    cluster,
                    operation,
                    revision,
                } = *accepted;
                let holding = Holding::new(self, claim, cluster, operation, revision);
                let claimed = true;
                return Ok(Some(Held::Run { holding, claimed }));
            }
            Origin::Slot { cluster, id } => (cluster, id),
        };
        if let Some(holding) = self.claim_from_views(&cluster, &id).await {
            let claimed = true;
            return Ok(Some(Held::Run { holding, claimed }));
        }
        let (current, operation) = self.operations.get_with_cluster(&cluster, &id).await?;
        self.operations.check_schema(&current)?;
        let in_slot = current.state.operation.as_ref().is_some_and(|s| s.id == id);
        let Some(claim) = self.work.claim(&cluster).filter(|_| in_slot) else {
            return Ok(None);
        };
        let Versioned { record, revision } =
            operation.ok_or(LifecycleError::NotFound { cluster, id })?;
        let holding = Holding::new(self, claim, current, record, revision);
        let operation = &holding.operation;
        Ok(match operation.state {
            OperationState::Pending if operation.cancel_requested => Some(Held::Cancel(holding)),
            OperationState::Running if operation.owner_epoch != Some(claim.epoch) => {
                Some(self.orphan(holding))
            }
            // PENDING; or RUNNING under this very claim but not in flight
            // here (its drive gave up, e.g. etcd was down for long): resume.
            // Steps are idempotent and re-planned from the nodes as they are.
            OperationState::Pending | OperationState::Running => {
                let claimed = false;
                Some(Held::Run { holding, claimed })
            }
            // Terminal but still in the slot cannot happen (completion
            // clears the slot in the same transaction).
            _ => None,
        })
    }

    /// What becomes of an orphan: resumed while the policy allows it.
    fn orphan<'e>(&self, holding: Holding<'e>) -> Held<'e> {
        if resumes(self.orphans, &holding.operation, holding.claim.epoch) {
            Held::Resume(holding)
        } else {
            Held::Orphan(holding)
        }
    }

    /// Claims a PENDING operation another replica accepted from what this
    /// replica's watch cache and operation feed already hold, without
    /// reading etcd first, or takes one that accept claimed for this owner.
    /// The claim compares every key the views came from (state, operation,
    /// spec, status), so a view that is not current only loses the
    /// compare-and-swap. `None` when the views do not both show the
    /// cluster as the accept left it, or the claim lost: the caller reads
    /// etcd instead.
    async fn claim_from_views(&self, cluster: &str, id: &str) -> Option<Holding<'_>> {
        let state = self.cache_state_kv(cluster)?;
        let slot = from_json::<StateRecord>(&state).ok()?.operation?;
        if slot.id != id {
            return None;
        }
        let accepted_at = state.mod_revision;
        let kv = self.accepted_record(cluster, id, accepted_at).await?;
        // Written by the accept, and not since (a cancel request would be).
        if kv.mod_revision != accepted_at {
            return None;
        }
        let mut operation: OperationRecord = from_json(&kv).ok()?;
        if operation.cancel_requested {
            return None;
        }
        // The record reached the feed after the accept's other keys reached
        // the cache (one watch, in order): the cluster as the cache shows
        // it now includes all of them.
        let current = self.cache.get(cluster)?.ok()?;
        if current.state_revision != accepted_at {
            return None;
        }
        if operation.state == OperationState::Running {
            return self.claimed_for_this_owner(current, operation);
        }
        if operation.state != OperationState::Pending {
            return None;
        }
        let claim = self.prepare_claim(&mut operation, &current.spec.spec)?;
        operation.started_at = Some(now_rfc3339());
        let checks = current.unchanged(self.operations.keys()).to_vec();
        let key = self.operations.keys().operation(cluster, id);
        let write = vec![Op::put(key, to_json(&operation))];
        let mut holding = Holding::new(self, claim, current, operation, accepted_at);
        holding.operation_revision = holding.commit_checking(write, checks).await.ok()?;
        Some(holding)
    }

    /// The cluster's state key as the cache holds it, while the cache
    /// follows etcd.
    fn cache_state_kv(&self, cluster: &str) -> Option<crate::store::KeyValue> {
        self.cache
            .is_ready()
            .then(|| self.cache.state_of(cluster))?
    }

    /// An operation whose accept on another replica claimed it for this
    /// owner (`Executor::claim_for_owner`): RUNNING at its first step under
    /// this replica's claim, as the accept wrote it (`current` shows the
    /// cluster as that accept left it). Held as claimed, with no write.
    fn claimed_for_this_owner(
        &self,
        current: ClusterRecord,
        operation: OperationRecord,
    ) -> Option<Holding<'_>> {
        let claim = self.work.claim(&current.spec.name)?;
        let me = self.work.replication().replica_id();
        let for_this_claim =
            operation.owner_epoch == Some(claim.epoch) && operation.replica.as_deref() == Some(me);
        let accepted_at = current.state_revision;
        for_this_claim.then(|| Holding::new(self, claim, current, operation, accepted_at))
    }

    /// The operation record as the operation feed has it at or after
    /// `accepted_at`, waiting briefly when the cache's watch delivered the
    /// accept before the feed's did.
    async fn accepted_record(
        &self,
        cluster: &str,
        id: &str,
        accepted_at: i64,
    ) -> Option<Arc<crate::store::KeyValue>> {
        let operation_key = self.operations.keys().operation(cluster, id);
        let mut follower = self.operations.follow(&operation_key);
        match follower.known.take() {
            Some(kv) if kv.mod_revision >= accepted_at => Some(kv),
            // The feed is past the accept and does not know the record.
            _ if self.operations.feed_revision() >= accepted_at => None,
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
            .ok()?,
        }
    }
}

/// Whether an orphan taken over under `epoch` is resumed: with this loss
/// counted, it was orphaned at most the policy's limit of times.
fn resumes(policy: OrphanPolicy, operation: &OperationRecord, epoch: i64) -> bool {
    let OrphanPolicy::Resume { limit } = policy else {
        return false;
    };
    let mut taken_over = operation.clone();
    taken_over.run_by("", epoch);
    taken_over.orphaned() <= limit as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::machine::Event;
    use crate::cluster::ClusterState;
    use crate::operation::{OperationKind, OperationParams};

    /// An upgrade first run by r1 under epoch 10, then lost `losses` times.
    fn orphaned(losses: i64) -> OperationRecord {
        let mut operation = OperationRecord::pending(
            "op".into(),
            "c",
            "uid",
            OperationKind::Upgrade,
            Event::UpgradeRequested,
            OperationParams::default(),
            ClusterState::Running,
            ClusterState::Upgrading,
            "",
            now_rfc3339(),
        );
        for epoch in 0..=losses {
            operation.run_by(&format!("r{epoch}"), 10 + epoch);
        }
        operation
    }

    #[test]
    fn an_orphan_is_resumed_up_to_the_limit_then_failed() {
        let resume = OrphanPolicy::Resume { limit: 3 };
        assert!(resumes(resume, &orphaned(0), 20), "first loss");
        assert!(resumes(resume, &orphaned(2), 20), "third loss");
        assert!(!resumes(resume, &orphaned(3), 20), "fourth loss");
        assert!(!resumes(
            OrphanPolicy::Resume { limit: 0 },
            &orphaned(0),
            20
        ));
        assert!(!resumes(OrphanPolicy::Fail, &orphaned(0), 20));
    }

    #[test]
    fn each_owner_is_recorded_once_and_a_record_from_before_runs_keeps_its_first() {
        let mut operation = orphaned(1);
        operation.run_by("r1", 11);
        let runs: Vec<i64> = operation.runs.iter().map(|r| r.epoch).collect();
        assert_eq!(runs, [10, 11], "the same owner again adds nothing");
        assert_eq!(operation.orphaned(), 1);

        let mut legacy = orphaned(0);
        legacy.runs.clear();
        legacy.run_by("r9", 30);
        let runs: Vec<(&str, i64)> = legacy
            .runs
            .iter()
            .map(|r| (r.replica.as_str(), r.epoch))
            .collect();
        assert_eq!(runs, [("r0", 10), ("r9", 30)]);
        assert_eq!(legacy.owner_epoch, Some(30));
    }
}
