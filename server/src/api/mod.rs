//! The gRPC services of drover.v1. Handlers validate, call the domain, and
//! convert errors to statuses once, in [`error`].

mod admin;
mod audited;
mod clusters;
pub(crate) mod convert;
mod error;
mod operations;
mod rollouts;
mod tasks;

pub use admin::AdminService;
pub(crate) use clusters::parse_label_selector;
pub use clusters::ClustersService;
pub use error::ApiError;
pub use operations::OperationsService;
pub use rollouts::RolloutsService;
pub use tasks::TasksService;
