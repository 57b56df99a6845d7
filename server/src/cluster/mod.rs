//! Clusters: their stored records, their states, validation of what users
//! ask for, and the registry that reads and writes them.

mod cache;
pub mod machine;
mod record;
mod registry;
pub mod validate;

pub use cache::{CacheChange, ClusterCache};
pub use drover_machine::ClusterState;
pub use record::{
    Autoscaling, ClusterRecord, LastOperation, NodeStatus, OperationSlot, Spec, SpecRecord,
    StateRecord, StatusRecord, SCHEMA_VERSION,
};
pub use registry::{
    from_json, now_rfc3339, to_json, ClusterFilter, ClusterPage, FirstOperation, Registry,
    RegistryError,
};
