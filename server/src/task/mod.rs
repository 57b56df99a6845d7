//! Scheduled maintenance tasks (repair, backup), after the scylla-operator
//! manager reconciliation: declared in the cluster spec, reconciled by name
//! within type into task records, run by the owner through the provider.
//!
//! - [`TaskSpec`]: task specs as users declare them (plain data in
//!   [`crate::cluster::task_spec`], since the cluster spec embeds them);
//!   [`validate`]: the rules.
//! - [`schedule`]: start dates, cron / interval / one-shot activations,
//!   retry back-off.
//! - [`record`]: the stored task, run and reconcile-marker records.
//! - [`reconcile`]: the pure plan (identity, change detection, generation
//!   guard) and how a record moves when a run ends.
//! - [`store`]: reading a cluster with its tasks, and run history.
//! - [`scheduler`]: the owner's loop.
//!
//! # Guarantees
//! - A task's id is assigned once and never changed by reconciliation; an
//!   older spec generation never deletes or recreates a task.
//! - Status (the task record) is separate from spec and holds only what
//!   exists; a task that cannot be scheduled shows only its name and error.
//! - One schedule slot, at most one run, even across failover.
//!
//! # Assumptions
//! - The provider's RunTask is idempotent per run id and refuses stale
//!   fencing tokens, as drover.provider.v1 requires.

pub mod reconcile;
pub mod record;
pub mod schedule;
mod scheduler;
pub mod store;
pub mod validate;

pub use crate::cluster::task_spec::{
    BackupProperties, RepairProperties, TaskSchedule, TaskSpec, TaskType,
};
pub use scheduler::{ReconcileOutcome, TaskScheduler};
pub use store::{ClusterTasks, TaskStore};

use crate::cluster::RegistryError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("cluster {cluster:?} has no {task_type} task named {name:?}")]
    NotFound {
        cluster: String,
        task_type: TaskType,
        name: String,
    },
    #[error("cluster {cluster:?} is {state}: its tasks can no longer change")]
    ClusterGone {
        cluster: String,
        state: crate::cluster::ClusterState,
    },
    #[error("the provider did not answer: {0}")]
    Provider(String),
    #[error(transparent)]
    Invalid(#[from] crate::cluster::validate::FieldError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl crate::store::StoreFailure for TaskError {
    fn store_error(&self) -> Option<&StoreError> {
        match self {
            TaskError::Registry(error) => error.store_error(),
            _ => None,
        }
    }
}

impl From<StoreError> for TaskError {
    fn from(error: StoreError) -> Self {
        TaskError::Registry(RegistryError::Store(error))
    }
}
