//! Clusters: their stored records (with the task specs their spec embeds),
//! their states, validation of what users ask for, and the registry that
//! reads and writes them.

mod cache;
mod leaves;
pub mod machine;
mod record;
mod registry;
pub mod task_spec;
pub mod validate;
pub mod window;

pub use cache::{CacheChange, ClusterCache};
pub use drover_machine::ClusterState;
pub use leaves::{CachedKey, ClusterBrief, StateBrief};
pub use record::{
    Autoscaling, ClusterRecord, HealthPolicy, LastOperation, MaintenanceWindow, NodeRemediation,
    NodeStatus, OperationSlot, RemediationStatus, Spec, SpecRecord, StateRecord, StatusRecord,
    TaskSuspension, UpgradePolicy, SCHEMA_VERSION,
};
pub use registry::{
    from_json, now_rfc3339, to_json, ClusterFilter, ClusterPage, FirstOperation, Registry,
    RegistryError,
};

#[cfg(test)]
mod tests {
    use super::ClusterState;

    /// Records in etcd store a state by its exact variant name: the shared
    /// crate's serde feature must keep that form.
    #[test]
    fn a_state_is_stored_by_its_name() {
        for state in ClusterState::ALL {
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{state}\""));
            assert_eq!(serde_json::from_str::<ClusterState>(&json).unwrap(), state);
        }
        let json = serde_json::to_string(&ClusterState::ScalingStoppedCluster).unwrap();
        assert_eq!(json, "\"ScalingStoppedCluster\"");
    }
}
