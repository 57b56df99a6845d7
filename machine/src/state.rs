//! The lifecycle states of a cluster, as stored in etcd.

use std::fmt;

/// A cluster's lifecycle state (the CKS state machine's states). Stored by
/// these exact names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ClusterState {
    Created,
    Starting,
    Running,
    Stopping,
    Stopped,
    Scaling,
    ScalingStoppedCluster,
    Upgrading,
    Importing,
    RemovingNodes,
    Alert,
    Recovering,
    Destroying,
    Destroyed,
    Error,
}

impl ClusterState {
    /// Every state, in the order of the proto enum.
    pub const ALL: [ClusterState; 15] = [
        ClusterState::Created,
        ClusterState::Starting,
        ClusterState::Running,
        ClusterState::Stopping,
        ClusterState::Stopped,
        ClusterState::Scaling,
        ClusterState::ScalingStoppedCluster,
        ClusterState::Upgrading,
        ClusterState::Importing,
        ClusterState::RemovingNodes,
        ClusterState::Alert,
        ClusterState::Recovering,
        ClusterState::Destroying,
        ClusterState::Destroyed,
        ClusterState::Error,
    ];
}

impl fmt::Display for ClusterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
