//! The gRPC services of drover.v1. Handlers validate, call the domain, and
//! convert errors to statuses once, in [`error`].

mod clusters;
mod convert;
mod error;
mod pending;

pub use clusters::ClustersService;
pub use error::ApiError;
pub use pending::{AdminService, OperationsService, TasksService};
