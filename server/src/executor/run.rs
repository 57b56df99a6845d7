//! Driving one operation: how a drive starts (accepted here, claimed from
//! another replica's accept, adopted as an orphan) and runs its steps.
//! What it holds and how it writes is in `holding`, its provider calls in
//! `calls`, how it ends in `finish`.

use super::finish::all_at_version;
use super::holding::{error, Holding, Interrupt};
use super::{check_plan_input, needs_nodes, plan, resume_index, Executor, Step};
use crate::cluster::machine::Event;
use crate::cluster::{from_json, now_rfc3339, to_json};
use crate::operation::{
    ClaimedOperation, LifecycleError, OperationError, OperationKind, OperationRecord,
    OperationState, Progress, Seen, Versioned,
};
use crate::store::{CmpOp, Compare, Op};
use std::time::Duration;
use tonic::Code;

/// How long the executor waits for the operation feed to deliver an
/// operation whose accept the watch cache already showed, before reading it
/// from etcd instead.
const FEED_CATCH_UP: Duration = Duration::from_millis(50);

impl Executor {
    /// Runs one operation from wherever it is.
    pub(super) async fn drive(&self, cluster: &str, id: &str) -> Result<(), LifecycleError> {
        if let Some(holding) = self.claim_from_views(cluster, id).await {
            return self.execute(holding, true).await;
        }
        let (current, operation) = self.operations.get_with_cluster(cluster, id).await?;
        self.operations.check_schema(&current)?;
        if current
            .state
            .operation
            .as_ref()
            .is_none_or(|slot| slot.id != id)
        {
            return Ok(());
        }
        let Some(claim) = self.replication.claim(cluster) else {
            return Ok(());
        };
        let Versioned { record, revision } = operation.ok_or_else(|| LifecycleError::NotFound {
            cluster: cluster.to_string(),
            id: id.to_string(),
        })?;
        let mut holding = Holding {
            executor: self,
            claim,
            cluster: current,
            operation: record,
            operation_revision: revision,
            nodes: Vec::new(),
            nodes_fresh: false,
        };
        match holding.operation.state {
            OperationState::Pending if holding.operation.cancel_requested => {
                holding
                    .finish(
                        OperationState::Cancelled,
                        Event::OperationFailed,
                        error(Code::Cancelled, "cancelled before it started"),
                    )
                    .await
            }
            OperationState::Pending => self.execute(holding, false).await,
            OperationState::Running if holding.operation.owner_epoch != Some(claim.epoch) => {
                let progress = holding.operation.progress.clone();
                let replica = holding.operation.replica.clone().unwrap_or_default();
                let message = match progress {
                    Some(p) => format!(
                        "replica {replica} was lost while running step {} of {} ({})",
                        p.step, p.total_steps, p.step_name
                    ),
                    None => format!("replica {replica} was lost before its first step"),
                };
                // Fence the provider before failing the orphan, so the lost
                // replica (if it is only paused) can change nothing more;
                // the nodes are as it left them.
                if !holding.fence_orphan().await {
                    return Ok(());
                }
                tracing::warn!(cluster, operation = id, %message, "recovering an orphaned operation");
                holding
                    .finish(
                        OperationState::Failed,
                        Event::OperationFailed,
                        error(Code::Aborted, message),
                    )
                    .await?;
                self.operations.metrics().orphan_recoveries.inc();
                Ok(())
            }
            // Running under this very claim but not in flight here (its
            // drive gave up, e.g. etcd was down for long): resume. Steps are
            // idempotent and re-planned from the nodes as they are now.
            OperationState::Running => self.execute(holding, false).await,
            // Terminal but still in the slot cannot happen (completion clears
            // the slot in the same transaction).
            _ => Ok(()),
        }
    }

    /// Claims a PENDING operation another replica accepted from what this
    /// replica's watch cache and operation feed already hold, without
    /// reading etcd first. The claim compares every key the views came
    /// from (state, operation, spec, status), so a view that is not current
    /// only loses the compare-and-swap. `None` when the views do not both
    /// show the cluster as the accept left it, or the claim lost: the
    /// caller reads etcd instead.
    async fn claim_from_views(&self, cluster: &str, id: &str) -> Option<Holding<'_>> {
        let current = self.cache.get(cluster)?.ok()?;
        if current.state.operation.as_ref()?.id != id {
            return None;
        }
        let accepted_at = current.state_revision;
        let keys = self.operations.keys();
        let operation_key = keys.operation(cluster, id);
        let mut follower = self.operations.follow(&operation_key);
        let kv = match follower.known.take() {
            Some(kv) if kv.mod_revision >= accepted_at => kv,
            // The feed is past the accept and does not know the record.
            _ if self.operations.feed_revision() >= accepted_at => return None,
            // The cache's watch delivered the accept before the feed's did.
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
            .ok()??,
        };
        // Written by the accept, and not since (a cancel request would be).
        if kv.mod_revision != accepted_at {
            return None;
        }
        let mut operation: OperationRecord = from_json(&kv).ok()?;
        if operation.state != OperationState::Pending || operation.cancel_requested {
            return None;
        }
        let claim = self.prepare_claim(&mut operation, &current.spec.spec)?;
        operation.started_at = Some(now_rfc3339());
        let checks = vec![
            Compare::mod_revision(
                keys.cluster_spec(cluster),
                CmpOp::Equal,
                current.spec_revision,
            ),
            match current.status_revision {
                0 => Compare::absent(keys.cluster_status(cluster)),
                revision => {
                    Compare::mod_revision(keys.cluster_status(cluster), CmpOp::Equal, revision)
                }
            },
        ];
        let write = vec![Op::put(operation_key, to_json(&operation))];
        let mut holding = Holding {
            executor: self,
            claim,
            cluster: current,
            operation,
            operation_revision: accepted_at,
            nodes: Vec::new(),
            nodes_fresh: false,
        };
        holding.operation_revision = holding.commit_checking(write, checks).await.ok()?;
        Some(holding)
    }

    /// Runs an operation whose accept already claimed it on this replica.
    pub(super) async fn drive_claimed(
        &self,
        claimed: ClaimedOperation,
    ) -> Result<(), LifecycleError> {
        let holding = Holding {
            executor: self,
            claim: claimed.claim,
            cluster: claimed.cluster,
            operation: claimed.operation,
            operation_revision: claimed.operation_revision,
            nodes: Vec::new(),
            nodes_fresh: false,
        };
        self.execute(holding, true).await
    }

    /// Runs the steps; `claimed` when the record already says RUNNING here
    /// with the first step (written by the accept).
    async fn execute(&self, mut holding: Holding<'_>, claimed: bool) -> Result<(), LifecycleError> {
        let deadline = tokio::time::Instant::now() + self.timeouts.get(holding.operation.kind);
        let steps = match holding.plan_steps(deadline).await {
            Ok(steps) => steps,
            // The claim ended (or lapsed past a TTL) meanwhile: whoever holds
            // the cluster next decides, nothing is written here.
            Err(_) if !holding.holds_claim() => return Ok(()),
            Err(failure) => {
                return holding
                    .finish(OperationState::Failed, Event::OperationFailed, failure)
                    .await
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
        holding.operation.replica = Some(self.replication.replica_id().to_string());
        holding.operation.owner_epoch = Some(holding.claim.epoch);
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
        Ok(plan(&self.operation, &self.cluster.spec.spec, &nodes))
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
        let failure = match tokio::time::timeout_at(deadline, self.call(step, deadline)).await {
            Ok(Ok(())) => return Ok(()),
            // Not the provider's answer: this replica stopped holding the
            // cluster (a lapse whose lease may yet live, or a lost claim).
            // Stop without writing; the holder next resumes or recovers.
            Ok(Err(_)) if !self.holds_claim() => return Err(StepEnd::Interrupted),
            Ok(Err(status)) => error(status.code(), format!("{at} failed: {}", status.message())),
            Err(_) => error(Code::DeadlineExceeded, format!("timed out during {at}")),
        };
        if step.is_mutating() {
            self.look_after_failure(deadline).await;
        }
        Err(StepEnd::Ended(
            OperationState::Failed,
            step.failure_event(),
            failure,
        ))
    }

    /// Success only as the provider shows it: an upgrade ends with every
    /// node at the target version.
    fn check_outcome(&self) -> Result<(), Option<OperationError>> {
        if self.operation.kind != OperationKind::Upgrade {
            return Ok(());
        }
        let params = &self.operation.params;
        let target = params
            .version
            .as_ref()
            .unwrap_or(&self.cluster.spec.spec.version);
        if self.nodes_fresh && all_at_version(&self.nodes, target) {
            return Ok(());
        }
        let behind: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| &n.version != target)
            .map(|n| n.id.as_str())
            .collect();
        let message = format!(
            "the provider does not show every node at {target} (behind: {})",
            behind.join(", ")
        );
        Err(error(Code::FailedPrecondition, message))
    }
}
