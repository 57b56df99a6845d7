//! The drover.v1.Operations service.

use super::audited::pending;
use super::convert::operation_to_proto;
use super::error::ApiResult;
use crate::cluster::validate::{self, FieldError};
use crate::operation::Operations;
use drover_proto::v1::{self, operations_server};
use std::time::Duration;
use tonic::{Request, Response, Status};

const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// Serves reads, waits and cancels of operations.
pub struct OperationsService {
    operations: Operations,
}

impl OperationsService {
    pub fn new(operations: Operations) -> Self {
        Self { operations }
    }
}

fn check_ids(cluster: &str, id: &str) -> Result<(), FieldError> {
    validate::cluster_name("cluster", cluster)?;
    if !is_operation_id(id) {
        return Err(FieldError::new(
            "id",
            format!("{id:?} is not an operation id (a lower-case, hyphenated UUID)"),
        ));
    }
    Ok(())
}

/// An id as Drover writes them: a UUID in its lower-case hyphenated form,
/// the only one its keys use (an upper-case or braced form parses as the
/// same UUID and names no key).
fn is_operation_id(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok_and(|uuid| uuid.hyphenated().to_string() == id)
}

impl OperationsService {
    async fn list(&self, r: v1::ListOperationsRequest) -> ApiResult<v1::ListOperationsResponse> {
        validate::cluster_name("cluster", &r.cluster)?;
        let page_size = match r.page_size {
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
        let before = (!r.page_token.is_empty()).then_some(r.page_token.as_str());
        if before.is_some_and(|b| !is_operation_id(b)) {
            return Err(FieldError::new("page_token", "is not a token this API returned").into());
        }
        let page = self
            .operations
            .list(&r.cluster, before, page_size as usize)
            .await?;
        Ok(v1::ListOperationsResponse {
            operations: page
                .operations
                .into_iter()
                .map(operation_to_proto)
                .collect(),
            next_page_token: page.next_before.unwrap_or_default(),
        })
    }

    async fn cancel(&self, r: v1::CancelOperationRequest) -> ApiResult<v1::Operation> {
        check_ids(&r.cluster, &r.id)?;
        Ok(operation_to_proto(
            self.operations.cancel(&r.cluster, &r.id).await?,
        ))
    }

    async fn abandon(&self, r: v1::AbandonOperationRequest) -> Result<v1::Operation, Status> {
        check_ids(&r.cluster, &r.id).map_err(super::ApiError::from)?;
        if r.reason.trim().is_empty() {
            return Err(Status::invalid_argument(
                "reason: is required (why the operation is abandoned, for whoever reads it later)",
            ));
        }
        let op = self
            .operations
            .abandon(&r.cluster, &r.id, r.reason.trim())
            .await
            .map_err(super::ApiError::from)?;
        Ok(operation_to_proto(op))
    }

    async fn wait(&self, r: v1::WaitOperationRequest) -> ApiResult<v1::Operation> {
        check_ids(&r.cluster, &r.id)?;
        let timeout = validate::wait_ms("timeout_ms", r.timeout_ms)?.unwrap_or(DEFAULT_WAIT);
        Ok(operation_to_proto(
            self.operations.wait(&r.cluster, &r.id, timeout).await?,
        ))
    }
}

#[tonic::async_trait]
impl operations_server::Operations for OperationsService {
    async fn get_operation(
        &self,
        request: Request<v1::GetOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let r = request.into_inner();
        check_ids(&r.cluster, &r.id).map_err(super::ApiError::from)?;
        let op = self
            .operations
            .get(&r.cluster, &r.id)
            .await
            .map_err(super::ApiError::from)?;
        Ok(Response::new(operation_to_proto(op.record)))
    }

    async fn list_operations(
        &self,
        request: Request<v1::ListOperationsRequest>,
    ) -> Result<Response<v1::ListOperationsResponse>, Status> {
        Ok(Response::new(self.list(request.into_inner()).await?))
    }

    async fn wait_operation(
        &self,
        request: Request<v1::WaitOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        Ok(Response::new(self.wait(request.into_inner()).await?))
    }

    async fn cancel_operation(
        &self,
        request: Request<v1::CancelOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let audit = pending(&request);
        audit.finish(self.cancel(request.into_inner()).await)
    }

    async fn abandon_operation(
        &self,
        request: Request<v1::AbandonOperationRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        let audit = pending(&request);
        audit.finish(self.abandon(request.into_inner()).await)
    }
}

#[cfg(test)]
mod tests {
    use super::is_operation_id;

    #[test]
    fn only_the_form_drover_writes_is_an_operation_id() {
        let id = "01a23d44-ee70-74e1-ba32-ee823d0a45f0";
        assert!(is_operation_id(id));
        for other in [
            id.to_uppercase(),
            format!("{{{id}}}"),
            format!("urn:uuid:{id}"),
            id.replace('-', ""),
        ] {
            assert!(!is_operation_id(&other), "{other}");
        }
    }
}
