//! The task scheduler: on the owner of each cluster, reconciles the spec's
//! tasks into task records, starts due runs through the provider, records
//! how they end, and aborts runs a lost owner left behind.
//!
//! A reconciler on the owner-work runtime: a cluster is looked at when its
//! keys change (seen through the watch cache), when its next activation
//! comes, or when this replica adopts it.
//!
//! # Guarantees
//! - Every write compares this replica's ownership of the cluster and the
//!   revision of each record it read, so only the owner changes tasks and a
//!   paused ex-owner changes nothing.
//! - A run is created by a transaction that requires its key (derived from
//!   the task id and the slot) to be absent, the cluster state to be as read
//!   (Running, no operation), and the task record to be as read: one slot,
//!   at most one run.
//! - No run starts while the cluster is paused, its tasks are suspended,
//!   or it is outside its maintenance window; the task's status says why,
//!   and a run already going goes on.
//! - A run left RUNNING under another owner epoch is first fenced at the
//!   provider (StopTask with this owner's newer token), then recorded as
//!   ABORTED and retried per the task's policy; it is never resumed.
//! - While a run's RunTask call is in flight, the provider's word on its
//!   progress is written into the run when it changed (see [`progress`]).
//!
//! # Caveats
//! - A run in progress keeps its cluster on this replica through membership
//!   changes, but not through this replica's end: after a crash or a
//!   SIGTERM, the new owner aborts the run and retries it (as scylla-manager
//!   does with runs left RUNNING by a restart).

mod progress;

use super::reconcile::{finished, plan, Change, Plan};
use super::record::{run_id, RunStatus, TaskRecord, TaskRun, TaskSetRecord};
use super::schedule::{format_time, parse_time};
use super::store::{ClusterTasks, TaskStore};
use super::TaskError;
use crate::cluster::{
    to_json, ClusterCache, ClusterRecord, ClusterState, SpecRecord, SCHEMA_VERSION,
};
use crate::metrics::Metrics;
use crate::owner_work::{
    Controller, InFlight, Next, OwnerWork, ReconcileError, Reconciler, Triggers,
};
use crate::provider::{due_by, Providers};
use crate::replication::{Claim, Hold};
use crate::store::{CmpOp, Compare, Op, StoreError, StoreFailure, Txn};
use chrono::{DateTime, Utc};
use drover_proto::provider::v1 as pb;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How soon a cluster whose task records changed under a look is looked at
/// again.
const AFTER_CONFLICT: Duration = Duration::from_secs(1);
/// Every cluster with tasks is looked at this often, whatever the triggers.
const RESYNC: Duration = Duration::from_secs(30);
/// Clusters looked at at once.
const CONCURRENCY: usize = 4;
/// How long StopTask may take before the cluster is looked at again later.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at recording a run's end when the task record keeps changing.
const FINISH_ATTEMPTS: usize = 5;

/// What a reconcile did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileOutcome {
    /// The records already match the spec.
    Unchanged,
    /// The spec is older than the newest generation reconciled: nothing was
    /// touched.
    Stale { generation: i64, reconciled: i64 },
    /// `changes` records were written at `revision`.
    Applied { changes: usize, revision: i64 },
}

pub struct TaskScheduler {
    tasks: TaskStore,
    /// Each cluster's runs go to its own provider.
    providers: Arc<Providers>,
    cache: Arc<ClusterCache>,
    metrics: Arc<Metrics>,
    /// How long a run may take before it is stopped and counted an error.
    run_timeout: Duration,
    /// The claim check, the in-flight marks (runs this replica is waiting
    /// on the provider for) and the stop flag, shared with the rest of the
    /// owner work: once the replica shuts down, no run starts (the next
    /// owner would abort it).
    work: Arc<OwnerWork>,
}

impl TaskScheduler {
    pub fn new(
        tasks: TaskStore,
        providers: Arc<Providers>,
        work: Arc<OwnerWork>,
        cache: Arc<ClusterCache>,
        metrics: Arc<Metrics>,
        run_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            tasks,
            providers,
            work,
            cache,
            metrics,
            run_timeout,
        })
    }

    /// One look at a cluster owned under `claim`: reconcile, then abort,
    /// start or note waiting runs. Returns when to look again. A spec
    /// written during the look is a trigger the runtime keeps, so the
    /// cluster is looked at again once this look ends.
    async fn process(
        self: &Arc<Self>,
        name: &str,
        claim: Claim,
    ) -> Result<Option<DateTime<Utc>>, TaskError> {
        let Some(mut read) = self.tasks.read(name).await? else {
            return Ok(None);
        };
        if read.newer_schema() {
            return Ok(None);
        }
        let spec = read.cluster.spec.clone();
        if let ReconcileOutcome::Applied { .. } = self.reconcile_read(&spec, claim, &read).await? {
            match self.tasks.read(name).await? {
                Some(again) => read = again,
                None => return Ok(None),
            }
        }
        let mut wake: Option<DateTime<Utc>> = None;
        for existing in &read.tasks {
            let next = self
                .step(&read, &existing.record, existing.revision, claim)
                .await?;
            wake = match (wake, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(wake)
    }

    /// Reconciles `spec`'s tasks against the task records in the store, as
    /// the owner holding `claim`. `spec` may be older than the stored one:
    /// then nothing is touched.
    pub async fn reconcile(
        &self,
        spec: &SpecRecord,
        claim: Claim,
    ) -> Result<ReconcileOutcome, TaskError> {
        let read = self.tasks.read(&spec.name).await?.ok_or_else(|| {
            TaskError::from(crate::cluster::RegistryError::NotFound(spec.name.clone()))
        })?;
        self.reconcile_read(spec, claim, &read).await
    }

    async fn reconcile_read(
        &self,
        spec: &SpecRecord,
        claim: Claim,
        read: &ClusterTasks,
    ) -> Result<ReconcileOutcome, TaskError> {
        let name = &spec.name;
        let keys = self.tasks.keys();
        let reconciled = read.reconciled.map(|(generation, _)| generation);
        let changes = match plan(
            spec.generation,
            reconciled,
            &spec.spec.tasks,
            &read.tasks,
            Utc::now(),
        ) {
            Plan::Stale {
                generation,
                reconciled,
            } => {
                tracing::info!(cluster = %name, generation, reconciled, "not reconciling tasks of an older spec generation");
                return Ok(ReconcileOutcome::Stale {
                    generation,
                    reconciled,
                });
            }
            Plan::Changes(changes) => changes,
        };
        if changes.is_empty() && reconciled == Some(spec.generation) {
            return Ok(ReconcileOutcome::Unchanged);
        }
        // A removed task's run is stopped (and the provider fenced) before
        // its record goes.
        for change in &changes {
            if let Change::Delete { record, .. } = change {
                if let Some(run) = record.running() {
                    self.stop_run(&read.cluster.spec, claim, run).await?;
                }
            }
        }
        let marker_key = keys.task_set(name);
        let mut compares: Vec<Compare> = claim.fence(keys, name).to_vec();
        compares.push(match read.reconciled {
            Some((_, revision)) => Compare::mod_revision(&marker_key, CmpOp::Equal, revision),
            None => Compare::absent(&marker_key),
        });
        let marker = TaskSetRecord {
            schema: SCHEMA_VERSION,
            generation: spec.generation,
        };
        let mut writes = vec![Op::put(&marker_key, to_json(&marker))];
        let count = changes.len();
        for change in changes {
            let (compare, mut ops) = self.change_txn(name, spec.generation, change);
            compares.push(compare);
            writes.append(&mut ops);
        }
        let result = self
            .tasks
            .store()
            .cas(Txn::new().when(compares).and_then(writes))
            .await?;
        Ok(ReconcileOutcome::Applied {
            changes: count,
            revision: result.revision,
        })
    }

    /// What applying `change` to cluster `name`'s tasks compares and
    /// writes.
    fn change_txn(&self, name: &str, generation: i64, change: Change) -> (Compare, Vec<Op>) {
        let keys = self.tasks.keys();
        match change {
            Change::Put { record, revision } => {
                let key = keys.task(name, record.task_type.name(), &record.name);
                let compare = match revision {
                    Some(revision) => Compare::mod_revision(&key, CmpOp::Equal, revision),
                    None => Compare::absent(&key),
                };
                tracing::info!(cluster = %name, task = %record.name, task_type = %record.task_type, id = ?record.id, generation, created = revision.is_none(), "task reconciled");
                (compare, vec![Op::put(key, to_json(&record))])
            }
            Change::Delete { record, revision } => {
                let key = keys.task(name, record.task_type.name(), &record.name);
                let compare = Compare::mod_revision(&key, CmpOp::Equal, revision);
                let mut ops = vec![Op::delete(key)];
                if let Some(id) = &record.id {
                    ops.push(Op::delete_prefix(keys.task_runs(name, id)));
                }
                tracing::info!(cluster = %name, task = %record.name, task_type = %record.task_type, id = ?record.id, "task removed from the spec: deleted");
                (compare, ops)
            }
        }
    }

    /// Acts on one task record; returns when it next needs a look.
    async fn step(
        self: &Arc<Self>,
        read: &ClusterTasks,
        record: &TaskRecord,
        revision: i64,
        claim: Claim,
    ) -> Result<Option<DateTime<Utc>>, TaskError> {
        if let Some(run) = record.running() {
            if run.epoch != claim.epoch {
                self.abort_orphan(read, record, revision, run, claim)
                    .await?;
                return Ok(Some(Utc::now()));
            }
            if !self.work.runs(&run.id) {
                self.resume(read, record, run.clone(), claim).await?;
            }
            return Ok(None);
        }
        if record.schedule_error.is_some() || record.id.is_none() {
            return Ok(None);
        }
        let Some(next) = record.next_activation.as_deref().and_then(parse_time) else {
            return Ok(None);
        };
        if next > Utc::now() {
            return Ok(Some(next));
        }
        if read.cluster.state.state == ClusterState::Destroyed {
            // Gone: its tasks go with its records when the name is reused.
            return Ok(None);
        }
        let waiting = why_waiting(&read.cluster, Utc::now());
        if let Some((reason, wake)) = waiting {
            if record.waiting.as_deref() != Some(reason.as_str()) {
                let mut waiting = record.clone();
                waiting.waiting = Some(reason);
                let key = self.task_key(read, record);
                let txn = Txn::new()
                    .when(self.fence(read, claim))
                    .when([Compare::mod_revision(&key, CmpOp::Equal, revision)])
                    .and_then([Op::put(key, to_json(&waiting))]);
                self.tasks.store().cas(txn).await?;
            }
            // The cluster's next change brings it back here, or the end
            // of a suspension.
            return Ok(wake);
        }
        self.start_run(read, record, revision, next, claim).await?;
        Ok(None)
    }

    /// Creates the run of `slot` (if no run of that slot exists) and hands
    /// it to the provider.
    async fn start_run(
        self: &Arc<Self>,
        read: &ClusterTasks,
        record: &TaskRecord,
        revision: i64,
        slot: DateTime<Utc>,
        claim: Claim,
    ) -> Result<(), TaskError> {
        let name = &read.cluster.spec.name;
        let keys = self.tasks.keys();
        let Some(task_id) = record.id.clone() else {
            return Ok(());
        };
        let slot_ms = slot.timestamp_millis();
        let run = TaskRun {
            schema: SCHEMA_VERSION,
            id: run_id(&task_id, slot_ms),
            task_id: task_id.clone(),
            status: RunStatus::Running,
            slot: format_time(slot),
            attempt: record.attempt,
            replica: self.work.replication().replica_id().to_string(),
            epoch: claim.epoch,
            started_at: Some(format_time(Utc::now())),
            finished_at: None,
            error: None,
            report: None,
            progress: None,
        };
        let mut started = record.clone();
        started.last_run = Some(run.clone());
        started.next_activation = None;
        started.waiting = None;
        let task_key = self.task_key(read, record);
        let run_key = keys.task_run(name, &task_id, slot_ms);
        let txn = Txn::new()
            .when(self.fence(read, claim))
            .when([
                Compare::mod_revision(
                    keys.cluster_state(name),
                    CmpOp::Equal,
                    read.cluster.state_revision,
                ),
                Compare::mod_revision(&task_key, CmpOp::Equal, revision),
                Compare::absent(&run_key),
            ])
            .and_then([
                Op::put(&run_key, to_json(&run)),
                Op::put(task_key, to_json(&started)),
            ]);
        if self.work.is_stopping() {
            return Ok(());
        }
        // Held from before the run exists: handed over in between, the
        // cluster's next owner would abort a run nobody had asked for.
        let hold = self.work.replication().hold(name);
        // etcd may commit it and the reply be lost: the run key, which only
        // this write produces, says which.
        let marker = Op::put(&run_key, to_json(&run));
        let store = self.tasks.store();
        self.work
            .commit(store, txn, name, claim, Some(&marker))
            .await?;
        tracing::info!(cluster = %name, task = %record.name, task_type = %record.task_type, run = %run.id, attempt = run.attempt, "task run started");
        if let Some(mark) = self.work.mark_task_run(&run.id) {
            self.dispatch(read, record, run, claim, (hold, mark));
        }
        Ok(())
    }

    /// A run of ours nobody here waits on (its end could not be recorded):
    /// asks the provider again (RunTask is idempotent per run id) — unless
    /// a read taken after marking it shows it ended. `read` may predate
    /// its end: the run's waiter records the end, then unmarks it, so a
    /// look that read before the one and checked after the other would
    /// otherwise ask for an ended run again.
    async fn resume(
        self: &Arc<Self>,
        read: &ClusterTasks,
        record: &TaskRecord,
        run: TaskRun,
        claim: Claim,
    ) -> Result<(), TaskError> {
        let hold = self.work.replication().hold(&read.cluster.spec.name);
        let Some(mark) = self.work.mark_task_run(&run.id) else {
            return Ok(());
        };
        let task_key = self.task_key(read, record);
        let fresh = self.tasks.store().get(&task_key).await?;
        let Some(kv) = fresh.kvs.first() else {
            return Ok(());
        };
        let fresh: TaskRecord = crate::cluster::from_json(kv)?;
        if fresh.running().is_some_and(|r| r.id == run.id) {
            self.dispatch(read, record, run, claim, (hold, mark));
        }
        Ok(())
    }

    /// Waits for the provider to run `run`, following its progress
    /// meanwhile, then records how it ended.
    fn dispatch(
        self: &Arc<Self>,
        read: &ClusterTasks,
        record: &TaskRecord,
        run: TaskRun,
        claim: Claim,
        (hold, mark): (Hold, InFlight),
    ) {
        let this = Arc::clone(self);
        // The run's provider and, should it time out, where it is stopped.
        let spec = read.cluster.spec.clone();
        let cluster = spec.name.clone();
        let task_key = self.task_key(read, record);
        let request = pb::RunTaskRequest {
            token: Some(token(&spec.uid, claim, &run.id)),
            task_type: record.task_type.name().to_string(),
            task_name: record.name.clone(),
            run_id: run.id.clone(),
            // What the task is, as declared: a backup's locations, a
            // repair's options.
            spec: Some(crate::api::convert::task_spec_to_proto(record.spec.clone())),
        };
        tokio::spawn(async move {
            let _hold = hold;
            let (ended, progress) = if this.work.holds(&cluster, claim) {
                let call = this.run_on_provider(&spec, request, claim, &run);
                let following = progress::Following {
                    spec: &spec,
                    task_key: &task_key,
                    run: &run,
                    claim,
                };
                this.with_progress(following, call).await
            } else {
                let ended = Err(tonic::Status::aborted("no longer the owner"));
                (ended, run.progress.clone())
            };
            let outcome = match ended {
                Ok(response) => Some(run_outcome(response.into_inner())),
                // Fenced off or no longer the owner: the new owner aborts it.
                Err(status) if no_longer_ours(&status) => {
                    tracing::warn!(cluster, run = %run.id, error = %status.message(), "task run no longer ours");
                    None
                }
                Err(status) => Some(failed_call_outcome(&status)),
            };
            if let Some((status, error, report)) = outcome {
                // The progress last seen stays with the ended run.
                let run = TaskRun {
                    report,
                    progress,
                    ..run
                };
                if let Err(error) = this
                    .finish_run(&cluster, &task_key, &run, status, error, claim)
                    .await
                {
                    tracing::warn!(cluster, run = %run.id, %error, "could not record the end of a task run; the next look retries");
                    // Once it is no longer in flight, the next look asks the
                    // provider again (RunTask is idempotent per run id).
                    drop(mark);
                    this.work.trigger(Controller::Tasks, &cluster);
                    return;
                }
            }
            drop(mark);
        });
    }

    /// RunTask at the cluster's provider, stopped once it outlasts the run
    /// timeout.
    async fn run_on_provider(
        &self,
        spec: &SpecRecord,
        request: pb::RunTaskRequest,
        claim: Claim,
        run: &TaskRun,
    ) -> Result<tonic::Response<pb::RunTaskResponse>, tonic::Status> {
        // NOT_FOUND rather than the error's FAILED_PRECONDITION, which reads
        // "fenced off" here: the run ends as an error that says why.
        let mut provider = self
            .providers
            .for_cluster(&spec.spec)
            .map_err(|unknown| tonic::Status::not_found(unknown.to_string()))?;
        // The one provider call without the claim's deadline: a run lasts
        // hours, far past any one renewal, and what it does after a lost
        // claim the next owner's StopTask (newer epoch) ends before it
        // starts anything.
        match tokio::time::timeout(self.run_timeout, provider.run_task(request)).await {
            Ok(ended) => ended,
            Err(_) => {
                // Stopped (and fenced) before it counts as failed.
                if let Err(error) = self.stop_run(spec, claim, run).await {
                    tracing::warn!(cluster = %spec.name, run = %run.id, %error, "could not stop a run that timed out");
                }
                Err(tonic::Status::deadline_exceeded(format!(
                    "the run took longer than {:?} and was stopped",
                    self.run_timeout
                )))
            }
        }
    }

    /// Records the end of `run` on its task (if it is still that task's
    /// run) and schedules what comes next.
    async fn finish_run(
        &self,
        cluster: &str,
        task_key: &str,
        run: &TaskRun,
        status: RunStatus,
        error: Option<String>,
        claim: Claim,
    ) -> Result<(), TaskError> {
        let keys = self.tasks.keys();
        let store = self.tasks.store();
        for _ in 0..FINISH_ATTEMPTS {
            // An etcd blip is waited out while the claim holds: the run's end
            // is then recorded, and RunTask need not be asked again.
            let read = self.work.get_while_held(store, task_key, cluster, claim);
            let Some(kv) = read.await? else {
                return Ok(());
            };
            let record: TaskRecord = crate::cluster::from_json(&kv)?;
            if record.running().is_none_or(|r| r.id != run.id) {
                return Ok(());
            }
            let (updated, ended) = finished(&record, run, status, error.clone(), Utc::now());
            let slot_ms = parse_time(&run.slot).map_or(0, |t| t.timestamp_millis());
            // The ended run, stamped with its end time: only this write
            // produces it.
            let marker = Op::put(
                keys.task_run(cluster, &run.task_id, slot_ms),
                to_json(&ended),
            );
            let txn = Txn::new()
                .when(claim.fence(keys, cluster))
                .when([Compare::mod_revision(
                    task_key,
                    CmpOp::Equal,
                    kv.mod_revision,
                )])
                .and_then([marker.clone(), Op::put(task_key, to_json(&updated))]);
            let committed = self.work.commit(store, txn, cluster, claim, Some(&marker));
            match committed.await {
                Ok(_) => {
                    self.count(&record, status);
                    tracing::info!(cluster, task = %record.name, run = %run.id, ?status, error = ?ended.error, next = ?updated.next_activation, "task run ended");
                    if let Err(error) = self.tasks.trim_runs(cluster, &run.task_id, claim).await {
                        tracing::debug!(cluster, %error, "run history not trimmed");
                    }
                    return Ok(());
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(StoreError::Conflict { revision: 0 }.into())
    }

    /// A run left RUNNING by a lost owner: fence the provider with this
    /// owner's token (stopping the run), then record it ABORTED and retry.
    async fn abort_orphan(
        &self,
        read: &ClusterTasks,
        record: &TaskRecord,
        revision: i64,
        run: &TaskRun,
        claim: Claim,
    ) -> Result<(), TaskError> {
        let name = &read.cluster.spec.name;
        self.stop_run(&read.cluster.spec, claim, run).await?;
        let message = format!(
            "replica {} (epoch {}) was lost while the run was in progress; aborted by {}",
            run.replica,
            run.epoch,
            self.work.replication().replica_id()
        );
        let (updated, ended) = finished(record, run, RunStatus::Aborted, Some(message), Utc::now());
        let keys = self.tasks.keys();
        let slot_ms = parse_time(&run.slot).map_or(0, |t| t.timestamp_millis());
        let task_key = self.task_key(read, record);
        let txn = Txn::new()
            .when(self.fence(read, claim))
            .when([Compare::mod_revision(&task_key, CmpOp::Equal, revision)])
            .and_then([
                Op::put(keys.task_run(name, &run.task_id, slot_ms), to_json(&ended)),
                Op::put(task_key, to_json(&updated)),
            ]);
        self.tasks.store().cas(txn).await?;
        self.count(record, RunStatus::Aborted);
        self.metrics.orphan_recoveries.inc();
        tracing::warn!(cluster = %name, task = %record.name, run = %run.id, lost = %run.replica, next = ?updated.next_activation, "aborted a task run left by a lost owner");
        Ok(())
    }

    /// StopTask with this owner's token, while `claim` holds (and due by the
    /// end of it, like every provider call); a run the provider never saw is
    /// fine (the token still fences it).
    async fn stop_run(
        &self,
        spec: &SpecRecord,
        claim: Claim,
        run: &TaskRun,
    ) -> Result<(), TaskError> {
        let (cluster, uid) = (spec.name.as_str(), spec.uid.as_str());
        let mut provider = self
            .providers
            .for_cluster(&spec.spec)
            .map_err(|unknown| TaskError::Provider(unknown.to_string()))?;
        let replication = self.work.replication();
        let Some(deadline) = replication.claim_deadline(cluster, claim).await else {
            return Err(TaskError::Provider(format!(
                "not stopping run {}: this replica no longer owns the cluster",
                run.id
            )));
        };
        let request = pb::StopTaskRequest {
            token: Some(token(uid, claim, &run.id)),
            run_id: run.id.clone(),
        };
        // Bounded: one cluster's provider trouble must not stall the loop.
        let request = due_by(deadline.min(Instant::now() + STOP_TIMEOUT), request);
        let stopped = provider.stop_task(request).await;
        match stopped {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
            Err(status) if status.code() == tonic::Code::Cancelled => {
                Err(TaskError::Provider(format!(
                    "no answer to StopTask by its deadline: {}",
                    status.message()
                )))
            }
            Err(status) => Err(TaskError::Provider(status.message().to_string())),
        }
    }

    fn count(&self, record: &TaskRecord, status: RunStatus) {
        let status = format!("{status:?}").to_lowercase();
        self.metrics
            .task_run_finished(record.task_type, &status, std::time::SystemTime::now());
    }

    fn task_key(&self, read: &ClusterTasks, record: &TaskRecord) -> String {
        self.tasks.keys().task(
            &read.cluster.spec.name,
            record.task_type.name(),
            &record.name,
        )
    }

    fn fence(&self, read: &ClusterTasks, claim: Claim) -> [Compare; 2] {
        claim.fence(self.tasks.keys(), &read.cluster.spec.name)
    }
}

fn token(uid: &str, claim: Claim, run: &str) -> pb::FencingToken {
    pb::FencingToken {
        cluster_uid: uid.to_string(),
        epoch: claim.epoch,
        operation_id: run.to_string(),
    }
}

#[async_trait::async_trait]
impl Reconciler for TaskScheduler {
    fn controller(&self) -> Controller {
        Controller::Tasks
    }

    fn triggers(&self) -> Triggers {
        Triggers {
            state: true,
            tasks: true,
            adoption: true,
        }
    }

    fn resync(&self) -> Duration {
        RESYNC
    }

    fn concurrency(&self) -> usize {
        CONCURRENCY
    }

    fn candidates(&self) -> Vec<String> {
        let clusters = self.cache.task_clusters().into_iter();
        clusters.map(|(name, _)| name).collect()
    }

    /// Only clusters with tasks.
    fn wants(&self, cluster: &str, _state: Option<&crate::store::KeyValue>) -> bool {
        self.cache.has_tasks(cluster)
    }

    /// One look at the cluster (see [`TaskScheduler::process`]); again at
    /// its next activation.
    async fn reconcile(
        self: Arc<Self>,
        cluster: String,
        claim: Claim,
    ) -> Result<Next, ReconcileError> {
        if !self.cache.has_tasks(&cluster) {
            return Ok(Next::Idle);
        }
        match self.process(&cluster, claim).await {
            Ok(Some(wake)) => Ok(Next::After(
                (wake - Utc::now()).to_std().unwrap_or_default(),
            )),
            Ok(None) => Ok(Next::Idle),
            Err(error) if error.is_conflict() => {
                tracing::debug!(cluster, %error, "task records changed meanwhile; looking again");
                Ok(Next::After(AFTER_CONFLICT))
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// Why a due run of `cluster` cannot start at `now`, and when to look
/// again (`None`: at the cluster's next change).
fn why_waiting(
    cluster: &ClusterRecord,
    now: DateTime<Utc>,
) -> Option<(String, Option<DateTime<Utc>>)> {
    let spec = &cluster.spec.spec;
    if spec.paused {
        let reason = "waiting: cluster is paused; runs start when it is unpaused";
        return Some((reason.into(), None));
    }
    if let Some(suspended) = &spec.tasks_suspended {
        match suspended.until.as_deref().and_then(parse_time) {
            None => {
                let reason = "waiting: the cluster's tasks are suspended until resumed";
                return Some((reason.into(), None));
            }
            Some(until) if until > now => {
                let reason = format!(
                    "waiting: the cluster's tasks are suspended until {}",
                    format_time(until)
                );
                return Some((reason, Some(until)));
            }
            Some(_) => {}
        }
    }
    // A run already going is not asked: only starts wait for the window.
    if let Some((why, opens)) = crate::cluster::window::closed(&spec.maintenance, now) {
        return Some((format!("waiting: {why}"), opens));
    }
    let state = &cluster.state;
    let reason = match (&state.operation, state.state) {
        (Some(slot), _) => format!(
            "waiting: cluster is busy with operation {} ({}); runs start when it ends",
            slot.id, slot.kind
        ),
        (None, ClusterState::Running) => return None,
        (None, other) => {
            format!("waiting: cluster is {other}; runs start only while it is Running")
        }
    };
    Some((reason, None))
}

/// How a run ended, with its report: as the provider answered.
type RunOutcome = (RunStatus, Option<String>, Option<String>);

/// The outcome the provider's answer to RunTask reports.
fn run_outcome(response: pb::RunTaskResponse) -> RunOutcome {
    let report = (!response.report.is_empty()).then_some(response.report);
    let (status, error) = match response.status.as_str() {
        "DONE" => (RunStatus::Done, None),
        "STOPPED" => (RunStatus::Stopped, None),
        _ => (
            RunStatus::Error,
            Some(if response.error.is_empty() {
                format!("the provider reported {:?}", response.status)
            } else {
                response.error
            }),
        ),
    };
    (status, error, report)
}

/// Whether a failed RunTask says this replica no longer runs the task
/// (fenced off, or no longer the owner): the new owner aborts the run.
fn no_longer_ours(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::FailedPrecondition | tonic::Code::Aborted
    )
}

/// The outcome of a RunTask that failed otherwise: the run failed.
fn failed_call_outcome(status: &tonic::Status) -> RunOutcome {
    let error = if status.code() == tonic::Code::DeadlineExceeded {
        status.message().to_string()
    } else {
        format!("provider: {}", status.message())
    };
    (RunStatus::Error, Some(error), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{MaintenanceWindow, StateRecord, TaskSuspension};

    fn running(maintenance: &[&str]) -> ClusterRecord {
        let spec = crate::cluster::Spec {
            maintenance: MaintenanceWindow {
                window: maintenance.iter().map(|b| b.to_string()).collect(),
                timezone: String::new(),
            },
            ..Default::default()
        };
        ClusterRecord {
            spec: SpecRecord {
                schema: SCHEMA_VERSION,
                name: "c".into(),
                uid: "u".into(),
                generation: 1,
                spec,
                created_at: String::new(),
                request_id: String::new(),
            },
            spec_revision: 1,
            state: StateRecord {
                schema: SCHEMA_VERSION,
                uid: "u".into(),
                state: ClusterState::Running,
                operation: None,
                changed_at: String::new(),
            },
            state_revision: 1,
            status: None,
            status_revision: 0,
        }
    }

    /// A due run waits for the window, waking when it opens; the pause and
    /// a suspension, which the operator lifts, are said first.
    #[test]
    fn a_due_run_waits_for_the_maintenance_window() {
        let now = parse_time("2026-05-04T12:00:00Z").unwrap();
        assert_eq!(why_waiting(&running(&[]), now), None);
        assert_eq!(why_waiting(&running(&["11:00", "13:00"]), now), None);
        let closed = running(&["01:00", "05:00"]);
        let (reason, wake) = why_waiting(&closed, now).unwrap();
        assert_eq!(
            reason,
            "waiting: outside the maintenance window (01:00..05:00 UTC); it opens at 2026-05-05T01:00:00Z"
        );
        assert_eq!(wake, parse_time("2026-05-05T01:00:00Z"));
        let mut suspended = closed.clone();
        suspended.spec.spec.tasks_suspended = Some(TaskSuspension { until: None });
        let (reason, _) = why_waiting(&suspended, now).unwrap();
        assert!(reason.contains("suspended"), "{reason}");
        let mut paused = closed;
        paused.spec.spec.paused = true;
        let (reason, _) = why_waiting(&paused, now).unwrap();
        assert!(reason.contains("paused"), "{reason}");
    }
}
