//! Accepting the operations of the targets a reconcile chose, in the
//! background: the reconcile writes them STARTING and returns, so the next
//! one (woken by another target's end) need not wait for these accepts.
//!
//! # Guarantees
//! - A target is submitted by at most one task at a time here: a reconcile
//!   leaves a STARTING target alone while [`Starts::is_submitting`] says
//!   a task has it.
//! - How each submit went reaches the next reconcile
//!   ([`Starts::take_done`]), which writes it with its own changes (one
//!   fenced write, not two). Until that write commits the targets stay
//!   STARTING in etcd: an owner that takes the rollout over meanwhile
//!   submits them again under the same request ids, and the accept answers
//!   with the operations already created.
//! - The drain waits for these tasks (each holds an in-flight mark).

use super::record::{TargetRecord, TargetState};
use super::spec::{Action, OnBusy};
use super::store::Loaded;
use crate::audit::AuditLog;
use crate::executor::Executor;
use crate::operation::{
    LifecycleError, LifecycleRequest, OperationKind, OperationParams, OperationRecord,
    OperationState,
};
use crate::owner_work::{Controller, OwnerWork};
use crate::store::StoreFailure;
use crate::sync::lock;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One target to submit: its index, its cluster, its request.
type Job = (usize, String, LifecycleRequest);

pub struct Starts {
    executor: Arc<Executor>,
    work: Arc<OwnerWork>,
    /// Per rollout, the clusters whose accepts are under way.
    submitting: Mutex<HashMap<String, HashSet<String>>>,
    /// Per rollout, targets as their accepts left them, for the next
    /// reconcile to write.
    done: Mutex<HashMap<String, Vec<(usize, TargetRecord)>>>,
    next_task: AtomicU64,
    /// Where each submit is written, as Drover's own.
    audit: Arc<AuditLog>,
}

impl Starts {
    pub fn new(executor: Arc<Executor>, work: Arc<OwnerWork>, audit: Arc<AuditLog>) -> Arc<Self> {
        Arc::new(Self {
            executor,
            work,
            submitting: Mutex::default(),
            done: Mutex::default(),
            next_task: AtomicU64::new(0),
            audit,
        })
    }

    pub fn is_submitting(&self, rollout: &str, cluster: &str) -> bool {
        lock(&self.submitting)
            .get(rollout)
            .is_some_and(|clusters| clusters.contains(cluster))
    }

    /// The targets of `rollout` submitted since the last call, to write.
    pub fn take_done(&self, rollout: &str) -> Vec<(usize, TargetRecord)> {
        lock(&self.done).remove(rollout).unwrap_or_default()
    }

    /// Submits the STARTING targets `chosen` of `run` in a task of its own,
    /// then hands how each went to the next reconcile and wakes the
    /// rollout.
    pub fn spawn(self: &Arc<Self>, run: &Loaded, chosen: &[usize]) {
        let name = run.record.name.clone();
        let template = action_request(&run.record.spec.action);
        let jobs: Vec<Job> = chosen
            .iter()
            .map(|&i| {
                let cluster = run.targets[i].cluster.clone();
                let request_id = format!("rollout-{}-{cluster}", run.record.uid);
                let request = LifecycleRequest {
                    request_id,
                    ..template.clone()
                };
                (i, cluster, request)
            })
            .collect();
        let clusters: Vec<String> = jobs.iter().map(|(_, c, _)| c.clone()).collect();
        lock(&self.submitting)
            .entry(name.clone())
            .or_default()
            .extend(clusters.iter().cloned());
        let task = self.next_task.fetch_add(1, Ordering::Relaxed);
        let mark = self.work.mark(&format!("rollout-starts/{name}/{task}"));
        let on_busy = run.record.spec.on_busy;
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let _mark = mark;
            let records = this.submit_all(&name, jobs, on_busy).await;
            // Handed over before the targets stop counting as submitted: a
            // reconcile in between finds them done, not to submit again.
            lock(&this.done)
                .entry(name.clone())
                .or_default()
                .extend(records);
            if let Some(submitting) = lock(&this.submitting).get_mut(&name) {
                clusters.iter().for_each(|c| {
                    submitting.remove(c);
                });
            }
            this.work.trigger(Controller::Rollouts, &name);
        });
    }

    /// Every job's submit of `rollout`, at once, each written to the
    /// audit log; each target's record after it.
    async fn submit_all(
        &self,
        rollout: &str,
        jobs: Vec<Job>,
        on_busy: OnBusy,
    ) -> Vec<(usize, TargetRecord)> {
        let mut submits = tokio::task::JoinSet::new();
        for (i, cluster, request) in jobs {
            let executor = Arc::clone(&self.executor);
            let (audit, rollout) = (Arc::clone(&self.audit), rollout.to_string());
            submits.spawn(async move {
                let submitted = executor.submit_own(&audit, &cluster, Some(&rollout), request);
                (i, submitted.await)
            });
        }
        let mut records = Vec::new();
        while let Some(joined) = submits.join_next().await {
            // A submit that panicked leaves its target STARTING: the next
            // reconcile submits it again under the same request id.
            let Ok((i, result)) = joined else {
                continue;
            };
            records.push((i, started(result, on_busy)));
        }
        records
    }
}

fn action_request(action: &Action) -> LifecycleRequest {
    let (kind, params) = match action {
        Action::Upgrade { version } => (
            OperationKind::Upgrade,
            OperationParams {
                version: Some(version.clone()),
                ..OperationParams::default()
            },
        ),
        Action::NodeOffering { offering } => (
            OperationKind::Scale,
            OperationParams {
                node_offering: Some(offering.clone()),
                ..OperationParams::default()
            },
        ),
    };
    LifecycleRequest {
        kind,
        params,
        request_id: String::new(),
    }
}

/// The target's record after its submit: RUNNING under its operation;
/// back to PENDING when nothing was written and it may be tried again
/// (busy and waiting, a lost race, the provider not asked); still STARTING
/// when etcd failed and the accept may have committed (the next reconcile
/// submits it again under the same request id, and it stays counted in
/// flight meanwhile); or ended.
pub fn started(result: Result<OperationRecord, LifecycleError>, on_busy: OnBusy) -> TargetRecord {
    let error = match result {
        Ok(operation) => {
            let id = operation.id.as_str();
            return match operation.state {
                OperationState::Succeeded => TargetRecord::ended(TargetState::Succeeded, id, ""),
                OperationState::Failed | OperationState::Cancelled => {
                    let message = operation.error.map(|e| e.message).unwrap_or_default();
                    TargetRecord::ended(TargetState::Failed, id, &message)
                }
                _ => TargetRecord::ended(TargetState::Running, id, ""),
            };
        }
        Err(error) => error,
    };
    let message = error.to_string();
    match &error {
        LifecycleError::Busy { .. } if on_busy == OnBusy::Wait => TargetRecord::pending(),
        LifecycleError::Busy { .. } => TargetRecord::ended(TargetState::Skipped, "", &message),
        LifecycleError::Raced(_) | LifecycleError::ProviderUnavailable(_) => {
            TargetRecord::pending()
        }
        LifecycleError::Registry(store) if store.store_error().is_some() => {
            TargetRecord::ended(TargetState::Starting, "", &message)
        }
        _ => TargetRecord::ended(TargetState::Failed, "", &message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::RegistryError;
    use crate::store::StoreError;

    /// An accept whose outcome etcd left unknown may have committed: its
    /// target stays counted in flight, to be submitted again under the
    /// same request id (the model's `PendingAfterLostAnswer` flaw).
    #[test]
    fn an_accept_of_unknown_outcome_keeps_its_target_starting() {
        let unknown = LifecycleError::Registry(RegistryError::Store(StoreError::Unavailable(
            "connection reset".into(),
        )));
        assert_eq!(
            started(Err(unknown), OnBusy::Wait).state,
            TargetState::Starting
        );
        let raced = LifecycleError::Raced("c".into());
        assert_eq!(
            started(Err(raced), OnBusy::Wait).state,
            TargetState::Pending
        );
        let busy = || LifecycleError::Busy {
            cluster: "c".into(),
            operation: "op".into(),
            kind: "stop".into(),
        };
        assert_eq!(
            started(Err(busy()), OnBusy::Wait).state,
            TargetState::Pending
        );
        assert_eq!(
            started(Err(busy()), OnBusy::Skip).state,
            TargetState::Skipped
        );
        let refused = LifecycleError::NoProvider;
        assert_eq!(
            started(Err(refused), OnBusy::Wait).state,
            TargetState::Failed
        );
    }
}
