//! Clusters: their stored records, their states, validation of what users
//! ask for, and the registry that reads and writes them.

mod record;
mod registry;
mod state;
pub mod validate;

pub use record::{
    Autoscaling, ClusterRecord, NodeStatus, OperationSlot, Spec, SpecRecord, StateRecord,
    StatusRecord, SCHEMA_VERSION,
};
pub use registry::{ClusterFilter, ClusterPage, Registry, RegistryError};
pub use state::ClusterState;
