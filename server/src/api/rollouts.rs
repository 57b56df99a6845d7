//! The drover.v1.Rollouts service: creating a rollout (its targets fixed
//! from the watch cache), reading and following it, and the user's
//! controls (pause, resume, approve, cancel), each a compare-and-swap of
//! the rollout's record that its owner acts on.

use super::audited::pending;
use super::convert::timestamp;
use super::error::ApiResult;
use crate::cluster::validate::FieldError;
use crate::cluster::{ClusterCache, ClusterFilter, ClusterRecord};
use crate::rollout::record::{Cancel, RolloutRecord, RolloutState, StatusRecord, TargetState};
use crate::rollout::spec::RolloutSpec;
use crate::rollout::store::{Loaded, Target};
use crate::rollout::{RolloutError, RolloutStore};
use drover_proto::v1::{self, rollouts_server::Rollouts};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// Clusters read per page of the cache when fixing the targets.
const PAGE: usize = 1000;

pub struct RolloutsService {
    rollouts: RolloutStore,
    cache: Arc<ClusterCache>,
}

impl RolloutsService {
    pub fn new(rollouts: RolloutStore, cache: Arc<ClusterCache>) -> Self {
        Self { rollouts, cache }
    }

    async fn create(&self, request: v1::CreateRolloutRequest) -> ApiResult<v1::Rollout> {
        crate::names::dns_label(&request.name).map_err(|reason| FieldError::new("name", reason))?;
        let spec = RolloutSpec::from_proto(request.spec)?;
        let targets = self.targets(&spec)?;
        if targets.is_empty() {
            return Err(RolloutError::NoTargets.into());
        }
        self.rollouts.create(&request.name, spec, targets).await?;
        self.get(&request.name).await
    }

    /// The targets as the cache shows the clusters now, each with its
    /// stage; every named cluster must exist, and every target must fall
    /// in a stage.
    fn targets(&self, spec: &RolloutSpec) -> Result<Vec<(String, usize)>, RolloutError> {
        let mut clusters: Vec<ClusterRecord> = Vec::new();
        let mut after: Option<String> = None;
        let filter = ClusterFilter {
            state: None,
            labels: spec.selector.clone().into_iter().collect(),
        };
        loop {
            let page = self
                .cache
                .list(&filter, after.as_deref(), PAGE)
                .ok_or_else(|| {
                    RolloutError::from(crate::store::StoreError::Unavailable(
                        "the cluster cache is not ready".into(),
                    ))
                })??;
            clusters.extend(page.clusters);
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        for (i, name) in spec.clusters.iter().enumerate() {
            if !clusters.iter().any(|c| &c.spec.name == name) {
                let reason = format!("no cluster {name:?}");
                return Err(FieldError::new(format!("spec.clusters[{i}]"), reason).into());
            }
        }
        let mut targets = Vec::new();
        for cluster in clusters {
            let (name, labels) = (&cluster.spec.name, &cluster.spec.spec.labels);
            if !spec.targets(name, labels) {
                continue;
            }
            let Some(stage) = spec.stage_of(labels) else {
                let reason = format!("cluster {name:?} falls in no stage (leave the last stage's selector empty to take the rest)");
                return Err(FieldError::new("spec.stages", reason).into());
            };
            targets.push((name.clone(), stage));
        }
        Ok(targets)
    }

    async fn get(&self, name: &str) -> ApiResult<v1::Rollout> {
        crate::names::dns_label(name).map_err(|reason| FieldError::new("name", reason))?;
        let loaded = self.rollouts.load(name).await?;
        Ok(rollout_to_proto(&loaded, true))
    }

    async fn list(&self) -> ApiResult<v1::ListRolloutsResponse> {
        let mut rollouts = Vec::new();
        for (record, _) in self.rollouts.list().await? {
            match self.rollouts.load(&record.name).await {
                Ok(loaded) => rollouts.push(rollout_to_proto(&loaded, false)),
                Err(RolloutError::NotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(v1::ListRolloutsResponse { rollouts })
    }

    /// Changes the rollout's controls, refusing a rollout that ended (as
    /// `action`), and returns it.
    async fn control(
        &self,
        name: &str,
        action: &'static str,
        change: impl Fn(&mut RolloutRecord, &StatusRecord) -> Result<(), RolloutError>,
    ) -> ApiResult<v1::Rollout> {
        crate::names::dns_label(name).map_err(|reason| FieldError::new("name", reason))?;
        self.rollouts
            .update_control(name, |record, status| {
                // Cancelling again (to cancel the running too) is allowed.
                let again = status.state == RolloutState::Cancelled && action == "cancel";
                if status.state.is_terminal() && !again {
                    return Err(RolloutError::Ended {
                        name: record.name.clone(),
                        state: status.state.name(),
                        action,
                    });
                }
                change(record, status)
            })
            .await?;
        self.get(name).await
    }

    async fn approve(&self, request: v1::ApproveRolloutRequest) -> ApiResult<v1::Rollout> {
        let stage = request.stage;
        self.control(&request.name, "approve", |record, _| {
            if !record.spec.stages.iter().any(|s| s.name == stage) {
                let reason = format!("rollout {} has no stage {stage:?}", record.name);
                return Err(FieldError::new("stage", reason).into());
            }
            if !record.control.approved.contains(&stage) {
                record.control.approved.push(stage.clone());
            }
            Ok(())
        })
        .await
    }

    async fn watch(&self, name: String) -> ApiResult<RolloutStream> {
        let mut current = self.get(&name).await?;
        let keys = self.rollouts.keys();
        let Some((mut changes, _)) = self.cache.watch_keys(&keys.rollout_status(&name)) else {
            return Err(
                crate::store::StoreError::Unavailable("the watch is not live".into()).into(),
            );
        };
        let (sender, receiver) = tokio::sync::mpsc::channel(16);
        let rollouts = self.rollouts.clone();
        tokio::spawn(async move {
            loop {
                let done = current.status.as_ref().is_some_and(|s| ended(s.state));
                if sender.send(Ok(current)).await.is_err() || done {
                    return;
                }
                tokio::select! {
                    _ = sender.closed() => return,
                    event = changes.next() => if !matches!(event, Some(Ok(_))) {
                        let _ = sender.send(Err(Status::unavailable("the watch ended; watch again"))).await;
                        return;
                    },
                }
                current = match rollouts.load(&name).await {
                    Ok(loaded) => rollout_to_proto(&loaded, true),
                    Err(error) => {
                        let _ = sender
                            .send(Err(super::error::ApiError::from(error).into()))
                            .await;
                        return;
                    }
                };
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        )))
    }
}

type RolloutStream = Pin<Box<dyn Stream<Item = Result<v1::Rollout, Status>> + Send>>;

/// Whether a watch of a rollout in `state` is over.
fn ended(state: i32) -> bool {
    matches!(
        v1::RolloutState::try_from(state),
        Ok(v1::RolloutState::RolloutSucceeded
            | v1::RolloutState::RolloutFailed
            | v1::RolloutState::RolloutCancelled)
    )
}

fn state_to_proto(state: RolloutState) -> v1::RolloutState {
    match state {
        RolloutState::Pending => v1::RolloutState::RolloutPending,
        RolloutState::Running => v1::RolloutState::RolloutRunning,
        RolloutState::Paused => v1::RolloutState::RolloutPaused,
        RolloutState::WaitingApproval => v1::RolloutState::RolloutWaitingApproval,
        RolloutState::Succeeded => v1::RolloutState::RolloutSucceeded,
        RolloutState::Failed => v1::RolloutState::RolloutFailed,
        RolloutState::Cancelled => v1::RolloutState::RolloutCancelled,
    }
}

/// As the API shows it: a STARTING target is RUNNING (its operation is
/// being accepted).
fn target_state_to_proto(state: TargetState) -> v1::TargetState {
    match state {
        TargetState::Pending => v1::TargetState::TargetPending,
        TargetState::Starting | TargetState::Running => v1::TargetState::TargetRunning,
        TargetState::Succeeded => v1::TargetState::TargetSucceeded,
        TargetState::Failed => v1::TargetState::TargetFailed,
        TargetState::Skipped => v1::TargetState::TargetSkipped,
    }
}

/// The rollout for the API; with its per-cluster list when `clusters`.
pub fn rollout_to_proto(loaded: &Loaded, clusters: bool) -> v1::Rollout {
    let record = &loaded.record;
    let status = &loaded.status;
    let stages = record
        .spec
        .stages
        .iter()
        .enumerate()
        .map(|(i, stage)| stage_status(&stage.name, &loaded.targets, i, status));
    let stage_name = |i: usize| record.spec.stages.get(i).map_or("", |s| s.name.as_str());
    let clusters = clusters.then(|| {
        loaded
            .targets
            .iter()
            .map(|t| v1::RolloutCluster {
                cluster: t.cluster.clone(),
                stage: stage_name(t.stage).to_string(),
                state: target_state_to_proto(t.record.state) as i32,
                operation_id: t.record.operation_id.clone(),
                message: t.record.message.clone(),
            })
            .collect()
    });
    v1::Rollout {
        name: record.name.clone(),
        spec: Some(record.spec.to_proto()),
        status: Some(v1::RolloutStatus {
            state: state_to_proto(status.state) as i32,
            message: status.message.clone(),
            stages: stages.collect(),
            clusters: clusters.unwrap_or_default(),
            owner: status.owner.clone(),
        }),
        created_at: timestamp(&record.created_at),
        uid: record.uid.clone(),
    }
}

fn stage_status(
    name: &str,
    targets: &[Target],
    stage: usize,
    status: &StatusRecord,
) -> v1::StageStatus {
    let mut counts = v1::StageStatus {
        name: name.to_string(),
        started_at: status
            .stage_started
            .get(stage)
            .cloned()
            .flatten()
            .and_then(|t| timestamp(&t)),
        finished_at: status
            .stage_finished
            .get(stage)
            .cloned()
            .flatten()
            .and_then(|t| timestamp(&t)),
        ..Default::default()
    };
    for target in targets.iter().filter(|t| t.stage == stage) {
        counts.targets += 1;
        match target.record.state {
            TargetState::Pending => counts.pending += 1,
            TargetState::Starting | TargetState::Running => counts.running += 1,
            TargetState::Succeeded => counts.succeeded += 1,
            TargetState::Failed => counts.failed += 1,
            TargetState::Skipped => counts.skipped += 1,
        }
    }
    counts
}

#[tonic::async_trait]
impl Rollouts for RolloutsService {
    async fn create_rollout(
        &self,
        request: Request<v1::CreateRolloutRequest>,
    ) -> Result<Response<v1::Rollout>, Status> {
        let audit = pending(&request);
        audit.finish(self.create(request.into_inner()).await)
    }

    async fn get_rollout(
        &self,
        request: Request<v1::GetRolloutRequest>,
    ) -> Result<Response<v1::Rollout>, Status> {
        Ok(Response::new(self.get(&request.into_inner().name).await?))
    }

    async fn list_rollouts(
        &self,
        _request: Request<v1::ListRolloutsRequest>,
    ) -> Result<Response<v1::ListRolloutsResponse>, Status> {
        Ok(Response::new(self.list().await?))
    }

    type WatchRolloutStream = RolloutStream;

    async fn watch_rollout(
        &self,
        request: Request<v1::WatchRolloutRequest>,
    ) -> Result<Response<Self::WatchRolloutStream>, Status> {
        Ok(Response::new(self.watch(request.into_inner().name).await?))
    }

    async fn pause_rollout(
        &self,
        request: Request<v1::PauseRolloutRequest>,
    ) -> Result<Response<v1::Rollout>, Status> {
        let audit = pending(&request);
        let name = request.into_inner().name;
        let paused = self.control(&name, "pause", |record, _| {
            record.control.paused = true;
            Ok(())
        });
        audit.finish(paused.await)
    }

    async fn resume_rollout(
        &self,
        request: Request<v1::ResumeRolloutRequest>,
    ) -> Result<Response<v1::Rollout>, Status> {
        let audit = pending(&request);
        let name = request.into_inner().name;
        let resumed = self.control(&name, "resume", |record, _| {
            record.control.paused = false;
            record.control.resumes += 1;
            Ok(())
        });
        audit.finish(resumed.await)
    }

    async fn approve_rollout(
        &self,
        request: Request<v1::ApproveRolloutRequest>,
    ) -> Result<Response<v1::Rollout>, Status> {
        let audit = pending(&request);
        audit.finish(self.approve(request.into_inner()).await)
    }

    async fn cancel_rollout(
        &self,
        request: Request<v1::CancelRolloutRequest>,
    ) -> Result<Response<v1::Rollout>, Status> {
        let audit = pending(&request);
        let request = request.into_inner();
        let cancelled = self.control(&request.name, "cancel", |record, _| {
            let earlier = record.control.cancel.is_some_and(|c| c.cancel_running);
            record.control.cancel = Some(Cancel {
                cancel_running: earlier || request.cancel_running,
            });
            Ok(())
        });
        audit.finish(cancelled.await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_ends_with_the_rollout() {
        assert!(ended(v1::RolloutState::RolloutSucceeded as i32));
        assert!(!ended(v1::RolloutState::RolloutPaused as i32));
    }

    #[test]
    fn field_errors_stay_invalid_argument() {
        let error: Status = super::super::error::ApiError::from(RolloutError::from(
            FieldError::new("spec.stages[1].max_concurrency", "bad"),
        ))
        .into();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(error.message().contains("spec.stages[1].max_concurrency"));
    }
}
