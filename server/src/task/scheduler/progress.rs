//! A run's progress while its RunTask call is in flight: the provider is
//! asked (GetTaskProgress) every few seconds, and what it says is written
//! into the run and its task record's copy when it changed.
//!
//! # Guarantees
//! - A progress write is fenced like the run's other writes: this owner's
//!   claim and the task record as read, with the run still the task's run
//!   in progress. A lost compare skips that update; the next ask tries
//!   again.
//! - The RunTask call is never held up: an ask or a write still going when
//!   the call ends is dropped.
//!
//! # Caveats
//! - Each change is two writes (the run and its task record); unchanged
//!   progress writes nothing.

use super::TaskScheduler;
use crate::cluster::{from_json, to_json, SpecRecord};
use crate::provider::due_by;
use crate::replication::Claim;
use crate::store::{CmpOp, Compare, Op, StoreError, Txn};
use crate::task::record::{RunProgress, RunStatus, TaskRecord, TaskRun};
use crate::task::schedule::{format_time, parse_time};
use crate::task::TaskError;
use chrono::Utc;
use drover_proto::provider::v1 as pb;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a run in flight is asked for its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// How long one ask may take: a slow answer is skipped, not waited for.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(2);

/// The run in flight whose progress is followed.
pub(super) struct Following<'a> {
    pub spec: &'a SpecRecord,
    pub task_key: &'a str,
    pub run: &'a TaskRun,
    pub claim: Claim,
}

/// What one ask came to.
enum Step {
    /// This progress was written.
    Recorded(RunProgress),
    /// Nothing new, or nothing written this time.
    Unchanged,
    /// The provider has no GetTaskProgress: not asked again for this run.
    Unsupported,
}

impl TaskScheduler {
    /// Awaits `call` (the run's RunTask) while following the run's
    /// progress. Returns the call's answer and the progress last written,
    /// for the record of the run's end.
    pub(super) async fn with_progress<T>(
        &self,
        following: Following<'_>,
        call: impl Future<Output = T>,
    ) -> (T, Option<RunProgress>) {
        tokio::pin!(call);
        let mut last = following.run.progress.clone();
        let first = tokio::time::Instant::now() + PROGRESS_EVERY;
        let mut tick = tokio::time::interval_at(first, PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut asking = true;
        loop {
            tokio::select! {
                ended = &mut call => return (ended, last),
                _ = tick.tick(), if asking => {
                    let step = self.progress_step(&following, last.clone());
                    tokio::select! {
                        ended = &mut call => return (ended, last),
                        step = step => match step {
                            Step::Recorded(progress) => last = Some(progress),
                            Step::Unchanged => {}
                            Step::Unsupported => asking = false,
                        },
                    }
                }
            }
        }
    }

    /// One ask, and the write of what changed since `last`.
    async fn progress_step(&self, following: &Following<'_>, last: Option<RunProgress>) -> Step {
        let (cluster, run) = (following.spec.name.as_str(), &following.run.id);
        let progress = match self.ask_progress(following.spec, run).await {
            Ok(progress) => progress,
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::debug!(cluster, %run, "the provider reports no task progress");
                return Step::Unsupported;
            }
            Err(status) => {
                // Not known yet, or the provider busy: asked again later.
                tracing::debug!(cluster, %run, error = %status.message(), "no task progress this time");
                return Step::Unchanged;
            }
        };
        if last.is_some_and(|last| last.same_as(&progress)) {
            return Step::Unchanged;
        }
        match self.record_progress(following, &progress).await {
            Ok(true) => Step::Recorded(progress),
            Ok(false) => Step::Unchanged,
            Err(error) => {
                tracing::debug!(cluster, %run, %error, "task progress not recorded");
                Step::Unchanged
            }
        }
    }

    /// GetTaskProgress at the cluster's provider, bounded by
    /// [`PROGRESS_TIMEOUT`].
    async fn ask_progress(
        &self,
        spec: &SpecRecord,
        run_id: &str,
    ) -> Result<RunProgress, tonic::Status> {
        let mut provider = self
            .providers
            .for_cluster(&spec.spec)
            .map_err(|unknown| tonic::Status::not_found(unknown.to_string()))?;
        let request = pb::GetTaskProgressRequest {
            cluster_uid: spec.uid.clone(),
            run_id: run_id.to_string(),
        };
        let request = due_by(Instant::now() + PROGRESS_TIMEOUT, request);
        let answer = provider.get_task_progress(request).await?.into_inner();
        Ok(RunProgress {
            percent: answer.percent.map(|percent| percent.min(100)),
            message: answer.message,
            at: format_time(Utc::now()),
        })
    }

    /// Writes `progress` into the run and its task record's copy, if the
    /// run is still the task's run in progress. Whether it was written.
    async fn record_progress(
        &self,
        following: &Following<'_>,
        progress: &RunProgress,
    ) -> Result<bool, TaskError> {
        let (keys, store) = (self.tasks.keys(), self.tasks.store());
        let (cluster, task_key) = (following.spec.name.as_str(), following.task_key);
        let read = store.get(task_key).await?;
        let Some(kv) = read.kvs.first() else {
            return Ok(false);
        };
        let mut record: TaskRecord = from_json(kv)?;
        let Some(run) = record
            .last_run
            .as_mut()
            .filter(|run| run.status == RunStatus::Running && run.id == following.run.id)
        else {
            return Ok(false);
        };
        run.progress = Some(progress.clone());
        let run = run.clone();
        let slot_ms = parse_time(&run.slot).map_or(0, |t| t.timestamp_millis());
        let txn = Txn::new()
            .when(following.claim.fence(keys, cluster))
            .when([Compare::mod_revision(
                task_key,
                CmpOp::Equal,
                kv.mod_revision,
            )])
            .and_then([
                Op::put(keys.task_run(cluster, &run.task_id, slot_ms), to_json(&run)),
                Op::put(task_key, to_json(&record)),
            ]);
        match store.cas(txn).await {
            Ok(_) => Ok(true),
            Err(StoreError::Conflict { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }
}
