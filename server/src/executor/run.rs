//! Running one held operation: its steps, or the recovery of an orphan.
//! How it came to be held is in `start`; what it holds and how it writes
//! is in `holding`, its provider calls in `calls`, how it ends in `finish`.

use super::finish::{all_at_version, Fence};
use super::holding::{error, Holding, Interrupt};
use super::{check_plan_input, needs_nodes, plan, resume_index, Executor, Step};
use crate::cluster::machine::Event;
use crate::cluster::now_rfc3339;
use crate::operation::{LifecycleError, OperationError, OperationState, Progress};
use drover_proto::provider::v1::Capabilities;
use tonic::Code;
use tracing::Instrument;

impl Executor {
    /// Resumes an operation a lost owner left RUNNING: once the provider is
    /// fenced under this replica's epoch (so none of the lost owner's calls
    /// can still land), from its last persisted step. The first step's
    /// save records this owner in the operation.
    pub(super) async fn resume_orphan(&self, holding: Holding<'_>) -> Result<(), LifecycleError> {
        let mut holding = holding;
        let deadline = self.deadline_from_acceptance(&holding.operation);
        match holding.fence_orphan(deadline).await {
            Fence::Done => {}
            Fence::GaveUp => return Ok(()),
            Fence::Ended(state, failure) => {
                return holding.finish(state, Event::OperationFailed, failure).await
            }
        }
        let lost = holding.operation.replica.clone().unwrap_or_default();
        let at = holding.operation.progress.clone();
        let me = self.work.replication().replica_id().to_string();
        holding.operation.run_by(&me, holding.claim.epoch);
        let (cluster, id) = (&holding.cluster.spec.name, &holding.operation.id);
        let step = at.map_or(0, |p| p.step);
        tracing::warn!(%cluster, operation = %id, %lost, step, orphaned = holding.operation.orphaned(), "resuming an orphaned operation from its last persisted step");
        self.operations.metrics().orphan_resumes.inc();
        self.execute(holding, false, deadline).await
    }

    /// Fails an operation a lost owner left RUNNING, once the provider is
    /// fenced under this replica's epoch, with an error naming that
    /// replica and the step it was at.
    pub(super) async fn recover_orphan(&self, holding: Holding<'_>) -> Result<(), LifecycleError> {
        let mut holding = holding;
        let progress = holding.operation.progress.clone();
        let replica = holding.operation.replica.clone().unwrap_or_default();
        let message = match progress {
            Some(p) => format!(
                "replica {replica} was lost while running step {} of {} ({})",
                p.step, p.total_steps, p.step_name
            ),
            None => format!("replica {replica} was lost before its first step"),
        };
        // Fence the provider before failing the orphan, so the lost replica
        // (if it is only paused) can change nothing more; the nodes are as
        // it left them.
        let deadline = self.deadline_from_acceptance(&holding.operation);
        let (state, failure) = match holding.fence_orphan(deadline).await {
            Fence::Done => (OperationState::Failed, error(Code::Aborted, message)),
            Fence::GaveUp => return Ok(()),
            Fence::Ended(state, failure) => (state, failure),
        };
        let (cluster, id) = (&holding.cluster.spec.name, &holding.operation.id);
        tracing::warn!(%cluster, operation = %id, ?failure, "recovering an orphaned operation");
        holding
            .finish(state, Event::OperationFailed, failure)
            .await?;
        self.operations.metrics().orphan_recoveries.inc();
        Ok(())
    }

    /// When `operation` times out: its kind's timeout after its acceptance
    /// (an orphan's time is not renewed by each new owner).
    fn deadline_from_acceptance(
        &self,
        operation: &crate::operation::OperationRecord,
    ) -> tokio::time::Instant {
        let timeout = self.timeouts.get(operation.kind);
        let accepted = chrono::DateTime::parse_from_rfc3339(&operation.created_at);
        let elapsed = accepted
            .ok()
            .and_then(|at| {
                (chrono::Utc::now() - at.with_timezone(&chrono::Utc))
                    .to_std()
                    .ok()
            })
            .unwrap_or_default();
        tokio::time::Instant::now() + timeout.saturating_sub(elapsed)
    }

    /// Runs the steps; `claimed` when the record already says RUNNING here
    /// with the first step (written by the accept).
    pub(super) async fn execute(
        &self,
        mut holding: Holding<'_>,
        claimed: bool,
        deadline: tokio::time::Instant,
    ) -> Result<(), LifecycleError> {
        let steps = match holding.plan_steps(deadline).await {
            Ok(steps) => steps,
            // The claim ended (or lapsed past a TTL) meanwhile: whoever holds
            // the cluster next decides, nothing is written here.
            Err(_) if !holding.holds_claim() => return Ok(()),
            Err(failure) => {
                let state = if holding.operation.cancel_requested {
                    OperationState::Cancelled
                } else {
                    OperationState::Failed
                };
                return holding.finish(state, Event::OperationFailed, failure).await;
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
        let me = self.work.replication().replica_id().to_string();
        holding.operation.run_by(&me, holding.claim.epoch);
        // Saved with the next step: an owner that resumes it after this
        // one is lost links its run to this one.
        let this_run = drover_telemetry::traceparent(&tracing::Span::current());
        holding.operation.trace_run(holding.claim.epoch, this_run);
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
        let spec = &self.cluster.spec.spec;
        let rules = self.operation.kind.rules();
        let caps = if rules.needs_capabilities(&self.operation, spec) {
            self.capabilities_by(deadline).await?
        } else {
            Capabilities::default()
        };
        Ok(plan(&self.operation, spec, &nodes, &caps))
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
        let span =
            tracing::info_span!("step", otel.name = %step.name(), step = index + 1, of = total);
        let failure = match self
            .call_retrying(step, &at, deadline)
            .instrument(span)
            .await
        {
            Attempts::Done => return Ok(()),
            Attempts::Interrupted => return Err(StepEnd::Interrupted),
            Attempts::Failed(failure) => failure,
        };
        if step.is_mutating() {
            self.look_after_failure(deadline).await;
        }
        // Cancelled while the step waited for the provider: what the step
        // did is unknown, as after a failure, and it ends so.
        let state = if self.operation.cancel_requested {
            OperationState::Cancelled
        } else {
            OperationState::Failed
        };
        Err(StepEnd::Ended(state, step.failure_event(), failure))
    }

    /// Runs `step` by `deadline`, sent again as the cluster's upgrade
    /// policy allows (node calls only: each attempt within the step
    /// timeout, a failure that fencing did not cause retried after a wait
    /// doubling from 1 s to 30 s); how the attempts ended.
    async fn call_retrying(
        &mut self,
        step: &Step,
        at: &str,
        deadline: tokio::time::Instant,
    ) -> Attempts {
        let policy = StepPolicy::of(&self.cluster.spec.spec.upgrade_policy, step);
        let mut waits = retry_waits();
        let mut attempt = 0;
        loop {
            let attempt_deadline = policy
                .timeout
                .map_or(deadline, |t| deadline.min(tokio::time::Instant::now() + t));
            let call = self.call(step, attempt_deadline);
            let (failure, retryable) = match tokio::time::timeout_at(attempt_deadline, call).await {
                Ok(Ok(())) => return Attempts::Done,
                // Not the provider's answer: this replica stopped holding
                // the cluster (a lapse whose lease may yet live, or a lost
                // claim). Stop without writing; the holder next resumes or
                // recovers.
                Ok(Err(_)) if !self.holds_claim() => return Attempts::Interrupted,
                Ok(Err(status)) => {
                    let message = format!("{at} failed: {}", status.message());
                    (error(status.code(), message), retryable(&status))
                }
                Err(_) => (
                    error(Code::DeadlineExceeded, format!("timed out during {at}")),
                    true,
                ),
            };
            let wait = waits.next().unwrap_or(RETRY_MAX_WAIT);
            let in_time = tokio::time::Instant::now() + wait < deadline;
            if !retryable || attempt >= policy.retries || !in_time || self.cancel_seen().await {
                return Attempts::Failed(failure);
            }
            attempt += 1;
            let why = failure
                .as_ref()
                .map(|f| f.message.as_str())
                .unwrap_or_default();
            tracing::warn!(cluster = %self.cluster.spec.name, step = %step.name(), attempt, error = why, retry_in = ?wait, "a node call failed; sending it again (upgrade_policy.step_retries)");
            self.executor.count_retry(step.provider_call());
            tokio::time::sleep(wait).await;
        }
    }

    /// Success only as the provider shows it: an upgrade ends with every
    /// node at the target version.
    fn check_outcome(&self) -> Result<(), Option<OperationError>> {
        let spec = &self.cluster.spec.spec;
        let rules = self.operation.kind.rules();
        let Some(target) = rules.target_version(&self.operation, spec) else {
            return Ok(());
        };
        if self.nodes_fresh && all_at_version(&self.nodes, &target) {
            return Ok(());
        }
        let behind: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.version != target)
            .map(|n| n.id.as_str())
            .collect();
        let message = format!(
            "the provider does not show every node at {target} (behind: {})",
            behind.join(", ")
        );
        Err(error(Code::FailedPrecondition, message))
    }
}

/// How a step's attempts ended.
enum Attempts {
    Done,
    /// This replica stopped holding the cluster.
    Interrupted,
    /// The last attempt's failure.
    Failed(Option<OperationError>),
}

/// How a step is retried: by the cluster's upgrade policy for node calls,
/// not at all for the others.
struct StepPolicy {
    retries: u32,
    timeout: Option<std::time::Duration>,
}

impl StepPolicy {
    fn of(policy: &crate::cluster::UpgradePolicy, step: &Step) -> Self {
        let node_calls = matches!(
            step,
            Step::UpgradeNode { .. } | Step::UpgradeNodes { .. } | Step::Surge { .. }
        );
        if !node_calls {
            return Self {
                retries: 0,
                timeout: None,
            };
        }
        Self {
            retries: policy.step_retries.unwrap_or(0),
            timeout: policy
                .step_timeout_seconds
                .map(|s| std::time::Duration::from_secs(u64::from(s))),
        }
    }
}

const RETRY_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn retry_waits() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_secs(1))
        .with_max_delay(RETRY_MAX_WAIT)
        .without_max_times()
        .build()
}

/// A failure worth sending the call again for: not a fencing refusal (a
/// newer epoch owns the cluster), nor a request the provider will always
/// refuse, nor a cancel.
fn retryable(status: &tonic::Status) -> bool {
    !matches!(
        status.code(),
        Code::FailedPrecondition
            | Code::Aborted
            | Code::InvalidArgument
            | Code::NotFound
            | Code::Cancelled
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}
