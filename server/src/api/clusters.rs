//! The drover.v1.Clusters service.

use super::audited::{pending, Audited};
use super::convert::{
    cluster_to_proto, health_from_proto, maintenance_from_proto, operation_to_proto,
    spec_from_proto, state_from_proto, suspension_from_proto, tasks_from_proto,
    upgrade_policy_from_proto,
};
use super::error::{ApiError, ApiResult};
use crate::cluster::validate::{self, FieldError};
use crate::cluster::{
    ClusterCache, ClusterFilter, ClusterRecord, ClusterState, Registry, RegistryError,
};
use crate::executor::Executor;
use crate::keys::leaf;
use crate::keys::KeyLayout;
use crate::kind::{Call, LifecycleCall};
use crate::operation::{LifecycleError, LifecycleRequest, OperationKind, Operations};
use crate::provider::Providers;
use crate::store::{EventKind, WatchStream};
use crate::task::TaskError;
use drover_proto::v1::{self, clusters_server::Clusters};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;

/// Serves cluster CRUD and lifecycle requests.
pub struct ClustersService {
    operations: Operations,
    registry: Registry,
    cache: Arc<ClusterCache>,
    /// Where lifecycle requests go; `None` on a replica without a provider,
    /// which runs no operations.
    executor: Option<Arc<Executor>>,
    /// What `spec.provider` may name and what empty means; `None` on a
    /// replica without a provider, which stores the name as given.
    providers: Option<Arc<Providers>>,
}

impl ClustersService {
    pub fn new(
        operations: Operations,
        cache: Arc<ClusterCache>,
        executor: Option<Arc<Executor>>,
        providers: Option<Arc<Providers>>,
    ) -> Self {
        Self {
            registry: operations.registry().clone(),
            cache,
            operations,
            executor,
            providers,
        }
    }

    /// The provider a new cluster is pinned to: the one it names, or the
    /// default one when it names none.
    fn pin_provider(&self, requested: &str) -> Result<String, FieldError> {
        let Some(providers) = &self.providers else {
            return Ok(requested.to_string());
        };
        match providers.named(requested) {
            Ok(link) => Ok(link.name.clone()),
            Err(unknown) => Err(FieldError::new(
                "spec.provider",
                format!(
                    "{:?} is not a provider of this replica (it has: {})",
                    unknown.name, unknown.known
                ),
            )),
        }
    }

    /// A retried create that names another provider than the cluster has:
    /// the provider is fixed at create.
    fn check_same_provider(&self, requested: &str, stored: &str) -> Result<(), FieldError> {
        let default = self.providers.as_ref().map(|p| p.default_name());
        let stored = match stored {
            "" => default.unwrap_or_default(),
            stored => stored,
        };
        if requested.is_empty() || requested == stored {
            return Ok(());
        }
        Err(FieldError::new(
            "spec.provider",
            format!("cannot change after create (the cluster's provider is {stored:?})"),
        ))
    }

    /// Any lifecycle request: its kind reads and checks its own fields,
    /// then the common ones are checked and the request accepted.
    async fn lifecycle<R: LifecycleCall + Audited>(
        &self,
        request: Request<R>,
    ) -> Result<Response<v1::Operation>, Status> {
        let audit = pending(&request);
        let deadline = drover_proto::provider::deadline::grpc_timeout(request.metadata());
        let (accepted, wait) = match request.into_inner().into_call() {
            Ok(call) => match self.accept(R::KIND, call).await {
                Ok((op, wait)) => (Ok(op), wait),
                Err(error) => (Err(error), None),
            },
            Err(field) => (Err(field.into()), None),
        };
        // Audited as accepted: the wait that follows changes nothing.
        let op = audit.finish(accepted)?.into_inner();
        match wait {
            Some(wait) => {
                let wait = within_deadline(wait, deadline);
                Ok(Response::new(self.wait_for_end(op, wait).await))
            }
            None => Ok(Response::new(op)),
        }
    }

    /// The accepted operation, and how long the caller asked to wait for
    /// its end (`None`: not at all).
    async fn accept(
        &self,
        kind: OperationKind,
        call: Call,
    ) -> ApiResult<(v1::Operation, Option<Duration>)> {
        validate::cluster_name("name", &call.name)?;
        validate::request_id("request_id", &call.request_id)?;
        let wait = validate::wait_ms("wait_ms", call.wait_ms)?;
        let Some(executor) = &self.executor else {
            return Err(LifecycleError::NoProvider.into());
        };
        let request = LifecycleRequest {
            kind,
            params: call.params,
            request_id: call.request_id,
        };
        let op = operation_to_proto(executor.submit(&call.name, request).await?);
        Ok((op, wait))
    }

    /// `op` as it is once it has ended or `wait` has passed. A wait that
    /// cannot go on (etcd unreachable) answers the operation as accepted:
    /// it was, and an error would have the caller ask again.
    async fn wait_for_end(&self, op: v1::Operation, wait: Duration) -> v1::Operation {
        match self.operations.wait(&op.cluster, &op.id, wait).await {
            Ok(record) => operation_to_proto(record),
            Err(error) => {
                tracing::warn!(%error, cluster = op.cluster, operation = op.id, "cannot wait for an operation just accepted; answering it as accepted");
                op
            }
        }
    }

    async fn create(
        &self,
        request: v1::CreateClusterRequest,
    ) -> ApiResult<v1::CreateClusterResponse> {
        validate::cluster_name("name", &request.name)?;
        let mut spec = spec_from_proto("spec", request.spec)?;
        validate::request_id("request_id", &request.request_id)?;
        let requested = std::mem::take(&mut spec.provider);
        spec.provider = self.pin_provider(&requested)?;
        let start = !request.create_only;
        if start && self.executor.is_none() {
            return Err(LifecycleError::NoProvider.into());
        }
        // Before anything is written: a shape the provider would refuse is
        // refused here, not by a start that fails later.
        if let Some(executor) = &self.executor {
            let after = crate::executor::shape(&spec);
            executor
                .check_shape(
                    &spec.provider,
                    "",
                    crate::executor::Asked::Create,
                    after,
                    &mut Default::default(),
                )
                .await?;
        }
        let (cluster, operation) = self
            .operations
            .create_cluster(&request.name, spec, &request.request_id, start)
            .await?;
        self.check_same_provider(&requested, &cluster.spec.spec.provider)?;
        tracing::info!(cluster = %request.name, uid = %cluster.spec.uid, start, "cluster created");
        self.shown_here(&cluster).await;
        Ok(v1::CreateClusterResponse {
            cluster: Some(cluster_to_proto(cluster)),
            operation: operation.map(operation_to_proto),
        })
    }

    async fn get(&self, request: v1::GetClusterRequest) -> ApiResult<v1::Cluster> {
        validate::cluster_name("name", &request.name)?;
        let cached = (!request.linearizable)
            .then(|| self.cache.get(&request.name))
            .flatten();
        let cluster = match cached {
            Some(cluster) => cluster?,
            None => self.registry.get(&request.name).await?,
        };
        Ok(cluster_to_proto(cluster))
    }

    async fn list(&self, request: v1::ListClustersRequest) -> ApiResult<v1::ListClustersResponse> {
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n <= MAX_PAGE_SIZE => n,
            _ => {
                return Err(FieldError::new(
                    "page_size",
                    format!("must be at most {MAX_PAGE_SIZE}"),
                )
                .into())
            }
        };
        let after = (!request.page_token.is_empty()).then_some(request.page_token.as_str());
        if let Some(after) = after {
            validate::cluster_name("page_token", after)
                .map_err(|_| FieldError::new("page_token", "is not a token this API returned"))?;
        }
        let state = v1::ClusterState::try_from(request.state).map_err(|_| {
            FieldError::new("state", format!("{} is not a cluster state", request.state))
        })?;
        let filter = ClusterFilter {
            state: state_from_proto(state),
            labels: parse_label_selector(&request.label_selector)?,
        };
        let cached = (!request.linearizable)
            .then(|| self.cache.list(&filter, after, page_size as usize))
            .flatten();
        let page = match cached {
            Some(page) => page?,
            None => {
                let registry = &self.registry;
                registry.list(&filter, after, page_size as usize).await?
            }
        };
        Ok(v1::ListClustersResponse {
            clusters: page.clusters.into_iter().map(cluster_to_proto).collect(),
            next_page_token: page.next_after.unwrap_or_default(),
            revision: page.revision,
        })
    }
}

impl ClustersService {
    async fn update(&self, request: v1::UpdateClusterRequest) -> ApiResult<v1::Cluster> {
        validate::cluster_name("name", &request.name)?;
        if request.expected_generation < 0 {
            return Err(FieldError::new(
                "expected_generation",
                "must not be negative (0: whatever the generation)",
            )
            .into());
        }
        let (name, expected_generation) = (request.name.clone(), request.expected_generation);
        let edit = SpecEdit::checked(request)?;
        let current = self.registry.get(&name).await?;
        self.operations.check_schema(&current)?;
        let gone = matches!(
            current.state.state,
            ClusterState::Destroying | ClusterState::Destroyed
        );
        if edit.tasks.is_some() && gone {
            // As PutTask refuses: tasks of a cluster that is going away.
            return Err(TaskError::ClusterGone {
                cluster: name,
                state: current.state.state,
            }
            .into());
        }
        let cluster = self
            .registry
            .update_spec(&name, expected_generation, |spec| {
                edit.apply(spec);
                Ok::<_, ApiError>(())
            })
            .await?;
        self.shown_here(&cluster).await;
        Ok(cluster_to_proto(cluster))
    }

    /// Returns once this replica's watch cache shows `cluster` as written:
    /// the client's next read here is served from that cache (unless it asks
    /// for a linearizable one) and must find what it just wrote.
    async fn shown_here(&self, cluster: &ClusterRecord) {
        self.cache
            .wait_until_shown(cluster, ClusterCache::CATCH_UP)
            .await;
    }

    /// Streams a PUT with the cluster as it is now for every change to its
    /// records, and a DELETE when its state key goes.
    async fn watch(&self, request: v1::WatchClustersRequest) -> ApiResult<ClusterEventStream> {
        if !request.name.is_empty() {
            validate::cluster_name("name", &request.name)?;
        }
        if request.from_revision < 0 {
            return Err(FieldError::new("from_revision", "must not be negative").into());
        }
        let keys = self.operations.keys().clone();
        let prefix = if request.name.is_empty() {
            keys.clusters()
        } else {
            keys.cluster(&request.name)
        };
        let watch = self
            .operations
            .store()
            .watch(&prefix, request.from_revision)
            .await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        tokio::spawn(forward_cluster_events(
            watch,
            keys,
            self.registry.clone(),
            sender,
        ));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        )))
    }
}

/// Sends a cluster event for each change `watch` reports until the client
/// goes away or the watch fails (then with the error, so the client
/// resumes: never a clean end).
async fn forward_cluster_events(
    mut watch: WatchStream,
    keys: KeyLayout,
    registry: Registry,
    sender: tokio::sync::mpsc::Sender<Result<v1::ClusterEvent, Status>>,
) {
    // The records of one transaction share a revision: one event.
    let mut last: Option<(String, i64)> = None;
    loop {
        // A client that went away ends the etcd watch at once, not at the
        // next change (a quiet cluster may have none).
        let event = tokio::select! {
            _ = sender.closed() => return,
            event = watch.next() => event,
        };
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                let _ = sender.send(Err(ApiError::from(error).into())).await;
                return;
            }
            None => {
                let ended =
                    Status::unavailable("the watch ended; resume from the last revision received");
                let _ = sender.send(Err(ended)).await;
                return;
            }
        };
        let Some((name, rest)) = keys.split_cluster_key(&event.kv.key) else {
            continue;
        };
        let revision = event.kv.mod_revision;
        if last.as_ref() == Some(&(name.to_string(), revision)) {
            continue;
        }
        last = Some((name.to_string(), revision));
        let deleted = event.kind == EventKind::Delete && rest == leaf::STATE;
        let message = match cluster_event(&registry, name, deleted, revision).await {
            Ok(Some(message)) => Ok(message),
            Ok(None) => continue,
            Err(status) => Err(status),
        };
        let failed = message.is_err();
        if sender.send(message).await.is_err() || failed {
            return;
        }
    }
}

/// The event for a change of cluster `name` at `revision`: a DELETE when
/// its state key went, else a PUT with the cluster as it is now; None when
/// it was deleted since (its deletion follows).
async fn cluster_event(
    registry: &Registry,
    name: &str,
    deleted: bool,
    revision: i64,
) -> Result<Option<v1::ClusterEvent>, Status> {
    if deleted {
        return Ok(Some(v1::ClusterEvent {
            kind: v1::cluster_event::Kind::Delete as i32,
            cluster: Some(v1::Cluster {
                name: name.to_string(),
                ..Default::default()
            }),
            revision,
        }));
    }
    match registry.get(name).await {
        Ok(cluster) => Ok(Some(v1::ClusterEvent {
            kind: v1::cluster_event::Kind::Put as i32,
            cluster: Some(cluster_to_proto(cluster)),
            revision,
        })),
        Err(RegistryError::NotFound(_)) => Ok(None),
        // Skipping it would lose the change without a word: end the
        // stream, and the client resumes.
        Err(error) => Err(ApiError::from(error).into()),
    }
}

/// Parses `k=v,k2=v2`.
pub(crate) fn parse_label_selector(selector: &str) -> Result<Vec<(String, String)>, FieldError> {
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    selector
        .split(',')
        .map(|pair| {
            let (key, value) = pair.trim().split_once('=').ok_or_else(|| {
                FieldError::new(
                    "label_selector",
                    format!("{pair:?} is not of the form key=value"),
                )
            })?;
            let labels = [(key.to_string(), value.to_string())].into_iter().collect();
            validate::labels("label_selector", &labels)?;
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

type ClusterEventStream = Pin<Box<dyn Stream<Item = Result<v1::ClusterEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Clusters for ClustersService {
    async fn create_cluster(
        &self,
        request: Request<v1::CreateClusterRequest>,
    ) -> Result<Response<v1::CreateClusterResponse>, Status> {
        let audit = pending(&request);
        audit.finish(self.create(request.into_inner()).await)
    }

    async fn get_cluster(
        &self,
        request: Request<v1::GetClusterRequest>,
    ) -> Result<Response<v1::Cluster>, Status> {
        Ok(Response::new(self.get(request.into_inner()).await?))
    }

    async fn list_clusters(
        &self,
        request: Request<v1::ListClustersRequest>,
    ) -> Result<Response<v1::ListClustersResponse>, Status> {
        Ok(Response::new(self.list(request.into_inner()).await?))
    }

    type WatchClustersStream = ClusterEventStream;

    async fn watch_clusters(
        &self,
        request: Request<v1::WatchClustersRequest>,
    ) -> Result<Response<Self::WatchClustersStream>, Status> {
        Ok(Response::new(self.watch(request.into_inner()).await?))
    }

    async fn update_cluster(
        &self,
        request: Request<v1::UpdateClusterRequest>,
    ) -> Result<Response<v1::Cluster>, Status> {
        let audit = pending(&request);
        audit.finish(self.update(request.into_inner()).await)
    }

    async fn delete_cluster(
        &self,
        request: Request<v1::DeleteClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }

    async fn start_cluster(
        &self,
        request: Request<v1::StartClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }

    async fn stop_cluster(
        &self,
        request: Request<v1::StopClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }

    async fn scale_cluster(
        &self,
        request: Request<v1::ScaleClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }

    async fn upgrade_cluster(
        &self,
        request: Request<v1::UpgradeClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }

    async fn add_nodes(
        &self,
        request: Request<v1::AddNodesRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }

    async fn remove_nodes(
        &self,
        request: Request<v1::RemoveNodesRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }

    async fn recover_cluster(
        &self,
        request: Request<v1::RecoverClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        self.lifecycle(request).await
    }
}

/// What an UpdateCluster changes in a spec, each part checked (naming its
/// field) before anything is read or written.
struct SpecEdit {
    labels: Option<BTreeMap<String, String>>,
    tasks: Option<Vec<crate::task::TaskSpec>>,
    paused: Option<bool>,
    /// `Some(None)`: resumed.
    suspension: Option<Option<crate::cluster::TaskSuspension>>,
    health: Option<crate::cluster::HealthPolicy>,
    maintenance: Option<crate::cluster::MaintenanceWindow>,
    upgrade_policy: Option<crate::cluster::UpgradePolicy>,
}

impl SpecEdit {
    fn checked(request: v1::UpdateClusterRequest) -> Result<Self, ApiError> {
        let policies =
            request.update_health || request.update_maintenance || request.update_upgrade_policy;
        let suspends = request.suspend_tasks.is_some() || request.resume_tasks;
        let edits = request.update_labels || request.update_tasks || request.paused.is_some();
        if !(edits || suspends || policies) {
            let message = "nothing to update: set update_labels, update_tasks, paused, suspend_tasks, resume_tasks, update_health, update_maintenance and/or update_upgrade_policy";
            return Err(FieldError::new("update_labels", message).into());
        }
        if request.suspend_tasks.is_some() && request.resume_tasks {
            let message = "cannot resume and suspend the tasks at once";
            return Err(FieldError::new("resume_tasks", message).into());
        }
        let suspension = request
            .suspend_tasks
            .map(|s| suspension_from_proto("suspend_tasks", s, chrono::Utc::now()))
            .transpose()?;
        let labels = request
            .update_labels
            .then(|| request.labels.into_iter().collect());
        if let Some(labels) = &labels {
            validate::labels("labels", labels)?;
        }
        let tasks = match request.update_tasks {
            true => Some(tasks_from_proto("tasks", request.tasks)?),
            false => None,
        };
        let health = request
            .update_health
            .then(|| health_from_proto(request.health.unwrap_or_default()));
        if let Some(health) = &health {
            crate::health::policy::validate("health", health)?;
        }
        let maintenance = request
            .update_maintenance
            .then(|| maintenance_from_proto(request.maintenance.unwrap_or_default()));
        if let Some(maintenance) = &maintenance {
            crate::cluster::window::validate("maintenance", maintenance)?;
        }
        let upgrade_policy = request
            .update_upgrade_policy
            .then(|| upgrade_policy_from_proto(request.upgrade_policy.unwrap_or_default()));
        if let Some(policy) = &upgrade_policy {
            validate::upgrade_policy("upgrade_policy", policy)?;
        }
        Ok(Self {
            labels,
            tasks,
            paused: request.paused,
            suspension: suspends.then_some(suspension),
            health,
            maintenance,
            upgrade_policy,
        })
    }

    fn apply(self, spec: &mut crate::cluster::Spec) {
        if let Some(labels) = self.labels {
            spec.labels = labels;
        }
        if let Some(tasks) = self.tasks {
            spec.tasks = tasks;
        }
        if let Some(paused) = self.paused {
            spec.paused = paused;
        }
        if let Some(suspension) = self.suspension {
            spec.tasks_suspended = suspension;
        }
        if let Some(health) = self.health {
            spec.health = health;
        }
        if let Some(maintenance) = self.maintenance {
            spec.maintenance = maintenance;
        }
        if let Some(policy) = self.upgrade_policy {
            spec.upgrade_policy = policy;
        }
    }
}

/// A wait cut short to answer before the caller's deadline
/// (`grpc-timeout`): a caller whose deadline passed first would not learn
/// the operation it started. A fifth of the time left (at most a second) is
/// kept for the answer to travel.
fn within_deadline(wait: Duration, deadline: Option<Duration>) -> Duration {
    match deadline {
        Some(left) => wait.min(left.saturating_sub((left / 5).min(Duration::from_secs(1)))),
        None => wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_before_the_callers_deadline() {
        let s = Duration::from_secs;
        assert_eq!(within_deadline(s(60), None), s(60));
        assert_eq!(within_deadline(s(60), Some(s(10))), s(9));
        assert_eq!(within_deadline(s(2), Some(s(10))), s(2));
        let ms = Duration::from_millis;
        assert_eq!(within_deadline(s(60), Some(ms(500))), ms(400));
    }

    #[test]
    fn label_selectors_parse_or_name_the_field() {
        assert_eq!(parse_label_selector("").unwrap(), vec![]);
        assert_eq!(
            parse_label_selector("team=db, env=prod").unwrap(),
            vec![("team".into(), "db".into()), ("env".into(), "prod".into())]
        );
        assert_eq!(
            parse_label_selector("team").unwrap_err().field,
            "label_selector"
        );
        assert_eq!(
            parse_label_selector("a=b/c").unwrap_err().field,
            "label_selector[\"a\"]"
        );
    }
}
