//! The one place where Drover's errors become gRPC statuses.

use crate::cluster::validate::FieldError;
use crate::cluster::RegistryError;
use crate::operation::LifecycleError;
use crate::rollout::RolloutError;
use crate::store::StoreError;
use crate::task::TaskError;
use tonic::Status;

/// Everything an RPC can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    InvalidArgument(#[from] FieldError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Rollout(#[from] RolloutError),
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::Registry(RegistryError::Store(error))
    }
}

impl From<ApiError> for Status {
    fn from(error: ApiError) -> Self {
        let message = error.to_string();
        match error {
            ApiError::InvalidArgument(_) => Status::invalid_argument(message),
            ApiError::Task(error) => match error {
                TaskError::NotFound { .. } => Status::not_found(message),
                TaskError::ClusterGone { .. } => Status::failed_precondition(message),
                TaskError::Provider(_) => Status::unavailable(message),
                TaskError::Invalid(field) => ApiError::InvalidArgument(field).into(),
                TaskError::Registry(error) => ApiError::Registry(error).into(),
            },
            ApiError::Rollout(error) => match error {
                RolloutError::NotFound(_) => Status::not_found(message),
                RolloutError::AlreadyExists(_) => Status::already_exists(message),
                RolloutError::Ended { .. } | RolloutError::NoTargets => {
                    Status::failed_precondition(message)
                }
                RolloutError::Invalid(field) => ApiError::InvalidArgument(field).into(),
                RolloutError::Lifecycle(error) => ApiError::Lifecycle(error).into(),
                RolloutError::Registry(error) => ApiError::Registry(error).into(),
            },
            ApiError::Lifecycle(error) => match error {
                LifecycleError::NotFound { .. } | LifecycleError::NoOwner(_) => {
                    Status::not_found(message)
                }
                LifecycleError::Busy { .. } | LifecycleError::Raced(_) => Status::aborted(message),
                LifecycleError::NoTransition { .. }
                | LifecycleError::Ended { .. }
                | LifecycleError::StoppedClusterScale(_)
                | LifecycleError::Downgrade { .. }
                | LifecycleError::NoProvider
                | LifecycleError::NewerSchema { .. } => Status::failed_precondition(message),
                LifecycleError::ProviderUnavailable(_) => Status::unavailable(message),
                LifecycleError::Invalid(field) => ApiError::InvalidArgument(field).into(),
                LifecycleError::Registry(error) => ApiError::Registry(error).into(),
            },
            ApiError::Registry(error) => match error {
                RegistryError::NotFound(_) => Status::not_found(message),
                RegistryError::AlreadyExists(_) => Status::already_exists(message),
                RegistryError::Corrupt { .. } => Status::internal(message),
                RegistryError::GenerationMismatch { .. } => {
                    let mut status = Status::aborted(message);
                    status.metadata_mut().insert(
                        drover_proto::REASON_METADATA,
                        tonic::metadata::MetadataValue::from_static(
                            drover_proto::REASON_GENERATION_MISMATCH,
                        ),
                    );
                    status
                }
                RegistryError::Store(store) => match store {
                    StoreError::Unavailable(_) => {
                        Status::unavailable(format!("{message}; retry later"))
                    }
                    StoreError::Conflict { .. } => Status::aborted(format!("{message}; retry")),
                    StoreError::Compacted { .. } => Status::out_of_range(message),
                    StoreError::NoSpace(_) => Status::resource_exhausted(message),
                    StoreError::LeaseNotFound(_) | StoreError::Other(_) => {
                        Status::internal(message)
                    }
                },
            },
        }
    }
}

/// The result type of RPC handlers before conversion.
pub type ApiResult<T> = Result<T, ApiError>;
