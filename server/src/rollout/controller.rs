//! The rollout controller: a reconciler on the owner-work runtime that
//! carries one owned rollout forward each time it runs.
//!
//! A reconcile takes the user's controls as last read, looks at the
//! targets in flight (an operation that ended moves its target to
//! SUCCEEDED or FAILED), decides the rollout's state (cancel, resume,
//! pause, the failure budget, the stage: approval, concurrency, soak),
//! writes what changed, fenced, then starts the targets it chose: each is
//! first written STARTING, then its operation is accepted through
//! `Executor::submit` under a request id made of the rollout's uid and the
//! cluster (in the background, [`super::starts`]: the next reconcile need
//! not wait for the accepts), then the next reconcile writes it RUNNING
//! with its other changes.
//!
//! # Guarantees
//! - A target's operation is accepted at most once, whatever fails: a new
//!   owner submits a STARTING target again under the same request id, and
//!   the accept answers with the operation the first submit created.
//! - At most the stage's concurrency of its targets are STARTING or
//!   RUNNING at once, counted from the records every owner loads: a target
//!   is counted before its operation exists, and until the owner sees the
//!   operation end, so the provider never runs more.
//! - Nothing new starts while the rollout is paused (by a user or by its
//!   failure budget), waits for an approval, soaks, or has been cancelled.
//!   A reconcile decides on the record (the controls) as it last read it,
//!   without a read when it has something to write: the targets it starts
//!   are written STARTING with the status in one transaction that
//!   compares the record's revision, so a control written meanwhile fails
//!   it, and they start only after it committed.
//! - A target whose cluster is paused, or outside its maintenance window
//!   (`spec.maintenance`), stays PENDING saying so; it starts when that
//!   ends.
//!
//! # Caveats
//! - The owner learns that an operation ended from the watch cache (a
//!   state change of the target's cluster wakes the rollout), or, should
//!   that be missed, by looking every [`POLL`].

use super::owners::RolloutOwners;
use super::record::*;
use super::spec::{Action, OnBusy, RolloutSpec};
use super::starts::Starts;
use super::store::{Loaded, RolloutStore, Target};
use crate::cluster::validate::parse_version;
use crate::cluster::{
    from_json, now_rfc3339, to_json, CacheChange, ClusterCache, ClusterRecord, StateRecord,
};
use crate::metrics::Metrics;
use crate::operation::{LifecycleError, OperationState, Operations};
use crate::owner_work::{Controller, Next, OwnerWork, ReconcileError, Reconciler, Triggers};
use crate::replication::Claim;
use crate::store::Op;
use crate::sync::lock;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// How often an owner looks at the targets in flight without being woken
/// by a change of one of them.
pub const POLL: Duration = Duration::from_millis(500);

/// Targets one reconcile starts at most: they are written STARTING in one
/// transaction with the status (etcd allows 128 writes in one), so that a
/// control written meanwhile stops them all.
const STARTS_PER_RECONCILE: usize = super::store::WRITES_PER_TXN - 1;

/// How soon a rollout whose write conflicted is loaded again: soon, but
/// not in a loop while its lost claim is still believed held.
const RELOAD_AFTER: Duration = Duration::from_millis(20);

pub struct RolloutController {
    rollouts: RolloutStore,
    metrics: Arc<Metrics>,
    owners: Arc<RolloutOwners>,
    operations: Operations,
    cache: Arc<ClusterCache>,
    /// Each owned rollout as last loaded or written, under the claim it was
    /// loaded under.
    loaded: Mutex<HashMap<String, (Claim, Loaded)>>,
    /// The clusters of the targets in flight, and their rollout: a change
    /// of one of them wakes its rollout (see [`Self::follow_clusters`]).
    in_flight: Mutex<HashMap<String, String>>,
    starts: Arc<Starts>,
    work: Arc<OwnerWork>,
}

/// What one reconcile changed, to write.
#[derive(Default)]
struct Changes {
    targets: Vec<usize>,
    /// Targets to submit: those chosen now and those a former owner (or a
    /// submit whose outcome is unknown) left STARTING.
    start: Vec<usize>,
    /// Targets this reconcile moved from PENDING to STARTING: written with
    /// the status, in one transaction.
    chosen: HashSet<usize>,
}

impl RolloutController {
    pub fn new(
        rollouts: RolloutStore,
        owners: Arc<RolloutOwners>,
        starts: Arc<Starts>,
        operations: Operations,
        cache: Arc<ClusterCache>,
        metrics: Arc<Metrics>,
        work: Arc<OwnerWork>,
    ) -> Arc<Self> {
        Arc::new(Self {
            rollouts,
            metrics,
            owners,
            operations,
            cache,
            loaded: Mutex::default(),
            in_flight: Mutex::default(),
            starts,
            work,
        })
    }

    /// Wakes a rollout each time the cache shows a state change of one of
    /// its targets in flight (most likely: its operation ended), until
    /// `shutdown`; the reconciles' own [`POLL`] covers what this misses.
    pub async fn follow_clusters(
        self: Arc<Self>,
        cache: Arc<ClusterCache>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut changes = cache.subscribe();
        loop {
            let change = tokio::select! {
                _ = shutdown.changed() => return,
                change = changes.recv() => change,
            };
            let woken: Vec<String> = match change {
                Ok(CacheChange::State(kv)) => {
                    let Some((cluster, _)) = cache.keys().split_cluster_key(&kv.key) else {
                        continue;
                    };
                    lock(&self.in_flight)
                        .get(cluster)
                        .cloned()
                        .into_iter()
                        .collect()
                }
                Ok(CacheChange::Tasks(_)) => continue,
                Ok(CacheChange::Relisted) | Err(RecvError::Lagged(_)) => self.owners.owned(),
                Err(RecvError::Closed) => return,
            };
            for rollout in woken {
                self.work.trigger(Controller::Rollouts, &rollout);
            }
        }
    }

    /// Notes which clusters `run` has in flight now.
    fn note_in_flight(&self, run: &Loaded) {
        let name = &run.record.name;
        let mut in_flight = lock(&self.in_flight);
        in_flight.retain(|_, rollout| rollout != name);
        for target in run.targets.iter().filter(|t| t.record.state.in_flight()) {
            in_flight.insert(target.cluster.clone(), name.clone());
        }
    }

    /// The rollout as loaded under `claim`, or loaded now.
    async fn take(&self, name: &str, claim: Claim) -> Result<Loaded, RolloutError> {
        if let Some((held, loaded)) = lock(&self.loaded).remove(name) {
            if held == claim {
                return Ok(loaded);
            }
        }
        self.rollouts.load(name).await
    }

    async fn step(&self, run: &mut Loaded, claim: Claim) -> Result<Next, RolloutError> {
        let name = run.record.name.clone();
        let before = run.status.clone();
        let mut changes = Changes::default();
        for (i, record) in self.starts.take_done(&name) {
            if run.targets[i].record.state == TargetState::Starting {
                run.targets[i].record = record;
                changes.targets.push(i);
            }
        }
        self.observe(run, &mut changes).await?;
        let next = self.advance(run, &mut changes).await;
        run.status.owner = self.owners.replica_id().to_string();
        // The record (the user's controls) is the one the last reconcile
        // held: a write compares it, so a change fails the write and the
        // rollout is loaded again; with nothing to write, it is read.
        if run.status != before || !changes.targets.is_empty() {
            self.write(run, &changes, claim).await?;
        } else if self.reread_record(run).await? {
            return Ok(Next::After(Duration::ZERO));
        }
        if !changes.start.is_empty() {
            // Before the accepts: an operation that ends at once must find
            // its cluster followed.
            self.note_in_flight(run);
            self.starts.spawn(run, &changes.start);
            return Ok(match next {
                Next::After(soon) if soon < POLL => next,
                _ => Next::After(POLL),
            });
        }
        if run.status.settled {
            self.owners.release(&name, claim).await?;
            self.forget_metrics(&name);
            tracing::info!(
                rollout = name,
                state = run.status.state.name(),
                "rollout settled"
            );
            return Ok(Next::Idle);
        }
        Ok(next)
    }

    fn record_metrics(&self, run: &Loaded) {
        let targets: Vec<(&'static str, i64)> = TargetState::ALL
            .iter()
            .map(|state| (state.name(), count(run, *state) as i64))
            .collect();
        let states = RolloutState::ALL.map(RolloutState::name);
        let budget = run.status.paused_by == Some(PausedBy::Budget);
        let name = &run.record.name;
        let state = run.status.state.name();
        self.metrics.rollout(name, state, &states, &targets, budget);
    }

    fn forget_metrics(&self, name: &str) {
        let states = RolloutState::ALL.map(RolloutState::name);
        let targets = TargetState::ALL.map(TargetState::name);
        self.metrics.forget_rollout(name, &states, &targets);
    }

    /// Moves the targets whose operations ended; submits again the ones a
    /// former owner left STARTING.
    async fn observe(&self, run: &mut Loaded, changes: &mut Changes) -> Result<(), RolloutError> {
        for i in 0..run.targets.len() {
            match run.targets[i].record.state {
                TargetState::Running => {
                    if let Some(ended) = self.ended(&run.targets[i]).await? {
                        run.targets[i].record = ended;
                        changes.targets.push(i);
                    }
                }
                TargetState::Starting => {
                    let cluster = &run.targets[i].cluster;
                    if !self.starts.is_submitting(&run.record.name, cluster) {
                        changes.start.push(i);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The target's record once its operation ended; `None` while it runs.
    async fn ended(&self, target: &Target) -> Result<Option<TargetRecord>, RolloutError> {
        let id = &target.record.operation_id;
        if let Some(kv) = self.cache.state_of(&target.cluster) {
            let state: Result<StateRecord, _> = from_json(&kv);
            if state.is_ok_and(|s| s.operation.is_some_and(|slot| &slot.id == id)) {
                return Ok(None);
            }
        }
        if let Some(ended) = self.ended_as_cached(target) {
            return Ok(Some(ended));
        }
        let record = match self.operations.get(&target.cluster, id).await {
            Ok(found) => found.record,
            Err(LifecycleError::NotFound { .. }) => {
                return Ok(Some(TargetRecord::ended(
                    TargetState::Failed,
                    id,
                    "its operation's record is gone (deleted with the cluster, or collected)",
                )))
            }
            Err(error) => return Err(error.into()),
        };
        let message = record.error.map(|e| e.message).unwrap_or_default();
        Ok(match record.state {
            OperationState::Succeeded => Some(TargetRecord::ended(TargetState::Succeeded, id, "")),
            OperationState::Failed => Some(TargetRecord::ended(TargetState::Failed, id, &message)),
            OperationState::Cancelled => Some(TargetRecord::ended(
                TargetState::Failed,
                id,
                "its operation was cancelled",
            )),
            OperationState::Pending | OperationState::Running => None,
        })
    }

    /// The target's end as its cluster's status shows it (written with the
    /// slot's release), without a read of etcd; `None` when the status
    /// shows another operation last (the record then says).
    fn ended_as_cached(&self, target: &Target) -> Option<TargetRecord> {
        let cluster = self.cache.get(&target.cluster)?.ok()?;
        let last = cluster.status?.last_operation?;
        let id = &target.record.operation_id;
        if &last.id != id {
            return None;
        }
        let message = last.message.unwrap_or_default();
        Some(match last.state.as_str() {
            "Succeeded" => TargetRecord::ended(TargetState::Succeeded, id, ""),
            "Cancelled" => {
                TargetRecord::ended(TargetState::Failed, id, "its operation was cancelled")
            }
            _ => TargetRecord::ended(TargetState::Failed, id, &message),
        })
    }

    /// Decides the rollout's state and chooses the targets to start.
    async fn advance(&self, run: &mut Loaded, changes: &mut Changes) -> Next {
        let control = run.record.control.clone();
        if control.cancel.is_some() && !run.status.state.is_terminal() {
            set_state(run, RolloutState::Cancelled, "cancelled by request".into());
        }
        if control.cancel.is_some_and(|c| c.cancel_running) && !run.status.cancelled_running {
            self.cancel_running(run).await;
            run.status.cancelled_running = true;
        }
        if run.status.state.is_terminal() {
            run.status.settled = !run.targets.iter().any(|t| t.record.state.in_flight());
            return Next::After(POLL);
        }
        self.apply_resume_and_pause(run);
        if run.status.state != RolloutState::Paused {
            self.check_budget(run);
        }
        if run.status.state == RolloutState::Paused {
            return poll_while_in_flight(run);
        }
        self.advance_stages(run, changes)
    }

    async fn cancel_running(&self, run: &Loaded) {
        for target in run.targets.iter() {
            if target.record.state != TargetState::Running {
                continue;
            }
            let cancel = self
                .operations
                .cancel(&target.cluster, &target.record.operation_id);
            if let Err(error) = cancel.await {
                tracing::info!(cluster = target.cluster, %error, "could not cancel a rollout's operation");
            }
        }
    }

    fn apply_resume_and_pause(&self, run: &mut Loaded) {
        let control = &run.record.control;
        if control.resumes > run.status.resumes_seen {
            run.status.resumes_seen = control.resumes;
            run.status.forgiven = count(run, TargetState::Failed) as u32;
            if run.status.paused_by == Some(PausedBy::Budget) {
                run.status.paused_by = None;
                set_state(run, RolloutState::Running, String::new());
            }
        }
        if run.record.control.paused {
            run.status.paused_by = Some(PausedBy::Request);
            set_state(run, RolloutState::Paused, "paused by request".into());
        } else if run.status.paused_by == Some(PausedBy::Request) {
            run.status.paused_by = None;
            set_state(run, RolloutState::Running, String::new());
        }
    }

    /// Pauses the rollout when more targets failed than its budget allows.
    fn check_budget(&self, run: &mut Loaded) {
        let failed: Vec<&Target> = run
            .targets
            .iter()
            .filter(|t| t.record.state == TargetState::Failed)
            .collect();
        let counted = failed.len().saturating_sub(run.status.forgiven as usize);
        let allowed = run.record.spec.max_failures.of(run.targets.len(), false);
        if counted <= allowed {
            return;
        }
        let names: Vec<&str> = failed.iter().map(|t| t.cluster.as_str()).take(20).collect();
        let message = format!(
            "paused by the failure budget: {counted} clusters failed, more than max_failures {allowed} ({}); resume to go on",
            names.join(", ")
        );
        run.status.paused_by = Some(PausedBy::Budget);
        set_state(run, RolloutState::Paused, message);
    }

    /// Walks the stages from the current one: approval, start, targets,
    /// soak, next.
    fn advance_stages(&self, run: &mut Loaded, changes: &mut Changes) -> Next {
        let now = chrono::Utc::now();
        loop {
            let stage = run.status.stage;
            let Some(spec) = run.record.spec.stages.get(stage).cloned() else {
                return finish(run);
            };
            if run.status.stage_started[stage].is_none() {
                if spec.approval_required && !run.record.control.approved.contains(&spec.name) {
                    let message =
                        format!("stage {} waits for approval (ApproveRollout)", spec.name);
                    set_state(run, RolloutState::WaitingApproval, message);
                    return Next::Idle;
                }
                run.status.stage_started[stage] = Some(now_rfc3339());
            }
            set_state(run, RolloutState::Running, String::new());
            let members: Vec<usize> = (0..run.targets.len())
                .filter(|&i| run.targets[i].stage == stage)
                .collect();
            if members
                .iter()
                .any(|&i| !run.targets[i].record.state.is_terminal())
            {
                return self.start_some(run, &members, spec.concurrency(members.len()), changes);
            }
            let finished = run.status.stage_finished[stage].get_or_insert_with(now_rfc3339);
            let finished = chrono::DateTime::parse_from_rfc3339(finished).map_or(now, |t| t.into());
            let soak_until = finished + chrono::Duration::seconds(spec.soak_seconds.into());
            if !members.is_empty() && now < soak_until {
                run.status.message = format!(
                    "soaking after stage {} until {}",
                    spec.name,
                    soak_until.to_rfc3339()
                );
                return Next::After((soak_until - now).to_std().unwrap_or(POLL));
            }
            run.status.stage += 1;
        }
    }

    /// Chooses up to the stage's free slots of its pending targets.
    fn start_some(
        &self,
        run: &mut Loaded,
        members: &[usize],
        concurrency: usize,
        changes: &mut Changes,
    ) -> Next {
        let in_flight = members
            .iter()
            .filter(|&&i| run.targets[i].record.state.in_flight())
            .count();
        let free = concurrency.saturating_sub(in_flight);
        let mut room = free.min(STARTS_PER_RECONCILE);
        for &i in members {
            if room == 0 {
                break;
            }
            if run.targets[i].record.state != TargetState::Pending {
                continue;
            }
            match self.readiness(&run.record.spec, &run.targets[i].cluster) {
                Readiness::Ready => {
                    run.targets[i].record.state = TargetState::Starting;
                    run.targets[i].record.message.clear();
                    changes.targets.push(i);
                    changes.start.push(i);
                    changes.chosen.insert(i);
                    room -= 1;
                }
                Readiness::Skip(message) => {
                    run.targets[i].record = TargetRecord::ended(TargetState::Skipped, "", &message);
                    changes.targets.push(i);
                }
                Readiness::Wait => {}
                Readiness::WaitSaying(message) => {
                    if run.targets[i].record.message != message {
                        run.targets[i].record.message = message;
                        changes.targets.push(i);
                    }
                }
            }
        }
        // More room than one write starts: the next reconcile goes on at
        // once.
        if room == 0 && free > STARTS_PER_RECONCILE {
            Next::After(Duration::ZERO)
        } else {
            Next::After(POLL)
        }
    }

    /// Whether `cluster` can start now, as the cache shows it.
    fn readiness(&self, spec: &RolloutSpec, cluster: &str) -> Readiness {
        let record = match self.cache.get(cluster) {
            None => return Readiness::Wait,
            Some(Err(crate::cluster::RegistryError::NotFound(_))) => {
                return Readiness::Skip("the cluster no longer exists".into())
            }
            Some(Err(_)) => return Readiness::Wait,
            Some(Ok(record)) => record,
        };
        if let Some(message) = already_there(&spec.action, &record) {
            return Readiness::Skip(message);
        }
        if record.spec.spec.paused {
            let waiting = "waiting: the cluster is paused; it starts when unpaused";
            return Readiness::WaitSaying(waiting.into());
        }
        let window = &record.spec.spec.maintenance;
        if let Some((why, _)) = crate::cluster::window::closed(window, chrono::Utc::now()) {
            // Looked at again every POLL, so the opening needs no timer.
            let waiting = format!("waiting: {why}");
            return Readiness::WaitSaying(waiting);
        }
        match (&record.state.operation, spec.on_busy) {
            (None, _) => Readiness::Ready,
            (Some(_), OnBusy::Wait) => Readiness::Wait,
            (Some(slot), OnBusy::Skip) => {
                Readiness::Skip(format!("busy with {} operation {}", slot.kind, slot.id))
            }
        }
    }

    /// Writes the status and the changed targets, fenced by `claim` and by
    /// the record as `run` holds it. The status and the targets newly
    /// STARTING go in one transaction (at most [`STARTS_PER_RECONCILE`]
    /// of them): a control written meanwhile fails it whole.
    async fn write(
        &self,
        run: &Loaded,
        changes: &Changes,
        claim: Claim,
    ) -> Result<(), RolloutError> {
        let keys = self.rollouts.keys();
        let name = &run.record.name;
        let mut together = vec![Op::put(keys.rollout_status(name), to_json(&run.status))];
        let mut rest = Vec::new();
        for &i in &changes.targets {
            let target = &run.targets[i];
            let key = keys.rollout_cluster(name, &target.cluster);
            let put = Op::put(key, to_json(&target.record));
            if changes.chosen.contains(&i) {
                together.push(put);
            } else {
                rest.push(put);
            }
        }
        let fenced = self
            .rollouts
            .write_fenced(name, together, rest, claim, Some(run.revision));
        Ok(fenced.await?)
    }

    /// Reads the rollout's record again: true when it changed since `run`
    /// read it (a control was written), `run` then holding the new one.
    async fn reread_record(&self, run: &mut Loaded) -> Result<bool, RolloutError> {
        let (record, revision) = self.rollouts.record(&run.record.name).await?;
        let changed = revision != run.revision;
        (run.record, run.revision) = (record, revision);
        Ok(changed)
    }
}

/// What a reconcile may do with a pending target now.
enum Readiness {
    Ready,
    Wait,
    /// Waits, its target saying why.
    WaitSaying(String),
    Skip(String),
}

/// Why the cluster needs no change, when it does not.
fn already_there(action: &Action, cluster: &ClusterRecord) -> Option<String> {
    match action {
        Action::Upgrade { version } => {
            let target = parse_version(version).ok()?;
            let current = cluster.status.as_ref()?.current_version.as_deref()?;
            let current = parse_version(current).ok()?;
            (current >= target).then(|| format!("already at {current}"))
        }
        Action::NodeOffering { offering } => (cluster.spec.spec.node_offering == *offering)
            .then(|| format!("already on node offering {offering}")),
    }
}

fn set_state(run: &mut Loaded, state: RolloutState, message: String) {
    run.status.state = state;
    run.status.message = message;
}

fn count(run: &Loaded, state: TargetState) -> usize {
    run.targets
        .iter()
        .filter(|t| t.record.state == state)
        .count()
}

fn poll_while_in_flight(run: &Loaded) -> Next {
    if run.targets.iter().any(|t| t.record.state.in_flight()) {
        Next::After(POLL)
    } else {
        Next::Idle
    }
}

/// Every stage done: SUCCEEDED, or FAILED naming the failed targets.
fn finish(run: &mut Loaded) -> Next {
    let failed: Vec<&str> = run
        .targets
        .iter()
        .filter(|t| t.record.state == TargetState::Failed)
        .map(|t| t.cluster.as_str())
        .collect();
    if failed.is_empty() {
        set_state(run, RolloutState::Succeeded, String::new());
    } else {
        let shown: Vec<&str> = failed.iter().copied().take(20).collect();
        let message = format!("{} clusters failed: {}", failed.len(), shown.join(", "));
        set_state(run, RolloutState::Failed, message);
    }
    run.status.settled = !run.targets.iter().any(|t| t.record.state.in_flight());
    Next::After(POLL)
}

#[async_trait::async_trait]
impl Reconciler for RolloutController {
    fn controller(&self) -> Controller {
        Controller::Rollouts
    }

    /// None from the cluster cache: the owners' passes trigger it.
    fn triggers(&self) -> Triggers {
        Triggers::default()
    }

    fn resync(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn concurrency(&self) -> usize {
        16
    }

    fn candidates(&self) -> Vec<String> {
        self.owners.owned()
    }

    fn claim(&self, _work: &OwnerWork, rollout: &str) -> Option<Claim> {
        self.owners.claim(rollout)
    }

    async fn reconcile(
        self: Arc<Self>,
        name: String,
        claim: Claim,
    ) -> Result<Next, ReconcileError> {
        let mut run = self.take(&name, claim).await?;
        let next = match self.step(&mut run, claim).await {
            Ok(next) => next,
            // A control written since the record was read, or the claim
            // lost: what this step decided is dropped with `run`, and the
            // next one loads the rollout again.
            Err(error) if error.is_conflict() => return Ok(Next::After(RELOAD_AFTER)),
            Err(error) => return Err(error.into()),
        };
        self.note_in_flight(&run);
        if !run.status.settled {
            self.record_metrics(&run);
            lock(&self.loaded).insert(name, (claim, run));
        }
        Ok(next)
    }
}
