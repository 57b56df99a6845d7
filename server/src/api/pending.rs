//! The services whose RPCs later versions implement: declared in the
//! contract so clients can be written now, answering UNIMPLEMENTED.

use super::error::unimplemented;
use drover_proto::v1::{self, tasks_server::Tasks};
use tonic::{Request, Response, Status};

/// drover.v1.Tasks, not yet served.
pub struct TasksService;

#[tonic::async_trait]
impl Tasks for TasksService {
    async fn put_task(&self, _: Request<v1::PutTaskRequest>) -> Result<Response<v1::Task>, Status> {
        unimplemented("PutTask")
    }
    async fn delete_task(
        &self,
        _: Request<v1::DeleteTaskRequest>,
    ) -> Result<Response<v1::DeleteTaskResponse>, Status> {
        unimplemented("DeleteTask")
    }
    async fn get_task(&self, _: Request<v1::GetTaskRequest>) -> Result<Response<v1::Task>, Status> {
        unimplemented("GetTask")
    }
    async fn list_tasks(
        &self,
        _: Request<v1::ListTasksRequest>,
    ) -> Result<Response<v1::ListTasksResponse>, Status> {
        unimplemented("ListTasks")
    }
    async fn list_task_runs(
        &self,
        _: Request<v1::ListTaskRunsRequest>,
    ) -> Result<Response<v1::ListTaskRunsResponse>, Status> {
        unimplemented("ListTaskRuns")
    }
}
