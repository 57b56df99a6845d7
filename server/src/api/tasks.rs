//! The drover.v1.Tasks service: edits of the spec's task list, and reads of
//! tasks (spec and status) and their runs.

use super::audited::pending;
use super::convert::{
    task_run_to_proto, task_spec_from_proto, task_spec_to_proto, task_status_to_proto,
    task_type_from_proto,
};
use super::error::ApiResult;
use crate::cluster::validate::{self, FieldError};
use crate::cluster::{ClusterRecord, ClusterState};
use crate::operation::Operations;
use crate::task::{self, TaskError, TaskSpec, TaskStore, TaskType};
use drover_proto::v1::{self, tasks_server::Tasks};
use tonic::{Request, Response, Status};

const DEFAULT_RUNS: u32 = 100;
const MAX_RUNS: u32 = 1000;

pub struct TasksService {
    operations: Operations,
    tasks: TaskStore,
}

impl TasksService {
    pub fn new(operations: Operations) -> Self {
        let tasks = TaskStore::new(operations.store().clone(), operations.keys().clone());
        Self { operations, tasks }
    }

    /// Edits the task list of a live cluster; bumps its generation.
    async fn edit(
        &self,
        cluster: &str,
        edit: impl FnOnce(&mut Vec<TaskSpec>) -> Result<(), TaskError>,
    ) -> ApiResult<ClusterRecord> {
        let current = self.operations.registry().get(cluster).await?;
        self.operations.check_schema(&current)?;
        if matches!(
            current.state.state,
            ClusterState::Destroying | ClusterState::Destroyed
        ) {
            return Err(TaskError::ClusterGone {
                cluster: cluster.to_string(),
                state: current.state.state,
            }
            .into());
        }
        let updated = self
            .operations
            .registry()
            .update_spec(cluster, 0, |spec| {
                let before = spec.tasks.clone();
                edit(&mut spec.tasks)?;
                task::validate::edit("task", &before, &spec.tasks)?;
                Ok::<_, TaskError>(())
            })
            .await?;
        Ok(updated)
    }

    async fn put(&self, request: v1::PutTaskRequest) -> ApiResult<v1::Task> {
        validate::cluster_name("cluster", &request.cluster)?;
        let spec = request
            .task
            .ok_or_else(|| FieldError::new("task", "is required"))?;
        let spec = task_spec_from_proto("task", spec)?;
        let (task_type, name) = (spec.task_type, spec.name.clone());
        let put = spec.clone();
        self.edit(&request.cluster, move |tasks| {
            match tasks
                .iter_mut()
                .find(|t| t.task_type == put.task_type && t.name == put.name)
            {
                Some(existing) => *existing = put,
                None => tasks.push(put),
            }
            Ok(())
        })
        .await?;
        tracing::info!(cluster = %request.cluster, %task_type, task = %name, "task put");
        self.get(&request.cluster, task_type, &name).await
    }

    async fn delete(&self, request: v1::DeleteTaskRequest) -> ApiResult<v1::DeleteTaskResponse> {
        let (task_type, name) = identity(&request.cluster, request.r#type, &request.name)?;
        let cluster = request.cluster.clone();
        self.edit(&request.cluster, move |tasks| {
            let before = tasks.len();
            tasks.retain(|t| !(t.task_type == task_type && t.name == name));
            if tasks.len() == before {
                return Err(TaskError::NotFound {
                    cluster,
                    task_type,
                    name,
                });
            }
            Ok(())
        })
        .await?;
        tracing::info!(cluster = %request.cluster, %task_type, task = %request.name, "task deleted from the spec");
        Ok(v1::DeleteTaskResponse {})
    }

    async fn read(&self, cluster: &str) -> ApiResult<task::ClusterTasks> {
        self.tasks
            .read(cluster)
            .await?
            .ok_or_else(|| crate::cluster::RegistryError::NotFound(cluster.to_string()).into())
    }

    async fn get(&self, cluster: &str, task_type: TaskType, name: &str) -> ApiResult<v1::Task> {
        let read = self.read(cluster).await?;
        let spec = read
            .cluster
            .spec
            .spec
            .tasks
            .iter()
            .find(|t| t.task_type == task_type && t.name == name)
            .cloned()
            .ok_or_else(|| TaskError::NotFound {
                cluster: cluster.to_string(),
                task_type,
                name: name.to_string(),
            })?;
        Ok(task_to_proto(&read, spec))
    }

    async fn list(&self, cluster: &str) -> ApiResult<v1::ListTasksResponse> {
        let read = self.read(cluster).await?;
        // Only declared tasks are listed; a record whose task left the
        // spec is on its way out.
        let tasks = read
            .cluster
            .spec
            .spec
            .tasks
            .iter()
            .map(|spec| task_to_proto(&read, spec.clone()))
            .collect();
        Ok(v1::ListTasksResponse { tasks })
    }

    async fn runs(&self, request: v1::ListTaskRunsRequest) -> ApiResult<v1::ListTaskRunsResponse> {
        let (task_type, name) = identity(&request.cluster, request.r#type, &request.name)?;
        let limit = match request.page_size {
            0 => DEFAULT_RUNS,
            n if n <= MAX_RUNS => n,
            _ => {
                return Err(
                    FieldError::new("page_size", format!("must be at most {MAX_RUNS}")).into(),
                )
            }
        };
        let read = self.read(&request.cluster).await?;
        let declared = read
            .cluster
            .spec
            .spec
            .tasks
            .iter()
            .any(|t| t.task_type == task_type && t.name == name);
        if !declared {
            return Err(TaskError::NotFound {
                cluster: request.cluster,
                task_type,
                name,
            }
            .into());
        }
        let runs = match read
            .record(task_type, &name)
            .and_then(|e| e.record.id.clone())
        {
            Some(id) => {
                self.tasks
                    .runs(&request.cluster, &id, limit as usize)
                    .await?
            }
            None => Vec::new(),
        };
        Ok(v1::ListTaskRunsResponse {
            runs: runs.into_iter().map(task_run_to_proto).collect(),
        })
    }
}

/// The (type, name) of a request, validated.
fn identity(cluster: &str, task_type: i32, name: &str) -> Result<(TaskType, String), FieldError> {
    validate::cluster_name("cluster", cluster)?;
    let task_type = task_type_from_proto("type", task_type)?;
    task::validate::name("name", name)?;
    Ok((task_type, name.to_string()))
}

fn task_to_proto(read: &task::ClusterTasks, spec: TaskSpec) -> v1::Task {
    let status = read
        .record(spec.task_type, &spec.name)
        .map(|e| task_status_to_proto(e.record.clone()));
    v1::Task {
        cluster: read.cluster.spec.name.clone(),
        spec: Some(task_spec_to_proto(spec)),
        status,
    }
}

#[tonic::async_trait]
impl Tasks for TasksService {
    async fn put_task(
        &self,
        request: Request<v1::PutTaskRequest>,
    ) -> Result<Response<v1::Task>, Status> {
        let audit = pending(&request);
        audit.finish(self.put(request.into_inner()).await)
    }

    async fn delete_task(
        &self,
        request: Request<v1::DeleteTaskRequest>,
    ) -> Result<Response<v1::DeleteTaskResponse>, Status> {
        let audit = pending(&request);
        audit.finish(self.delete(request.into_inner()).await)
    }

    async fn get_task(
        &self,
        request: Request<v1::GetTaskRequest>,
    ) -> Result<Response<v1::Task>, Status> {
        let r = request.into_inner();
        let (task_type, name) =
            identity(&r.cluster, r.r#type, &r.name).map_err(super::ApiError::from)?;
        Ok(Response::new(self.get(&r.cluster, task_type, &name).await?))
    }

    async fn list_tasks(
        &self,
        request: Request<v1::ListTasksRequest>,
    ) -> Result<Response<v1::ListTasksResponse>, Status> {
        let r = request.into_inner();
        validate::cluster_name("cluster", &r.cluster).map_err(super::ApiError::from)?;
        Ok(Response::new(self.list(&r.cluster).await?))
    }

    async fn list_task_runs(
        &self,
        request: Request<v1::ListTaskRunsRequest>,
    ) -> Result<Response<v1::ListTaskRunsResponse>, Status> {
        Ok(Response::new(self.runs(request.into_inner()).await?))
    }
}
