//! The operation record, `operations/<cluster>/<id>`.

use crate::cluster::machine::Event;
use crate::cluster::{ClusterState, SCHEMA_VERSION};
use serde::{Deserialize, Serialize};

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OperationKind {
    Start,
    Stop,
    Scale,
    Upgrade,
    AddNodes,
    RemoveNodes,
    Destroy,
    Recover,
}

impl OperationKind {
    pub const ALL: [OperationKind; 8] = [
        OperationKind::Start,
        OperationKind::Stop,
        OperationKind::Scale,
        OperationKind::Upgrade,
        OperationKind::AddNodes,
        OperationKind::RemoveNodes,
        OperationKind::Destroy,
        OperationKind::Recover,
    ];

    /// The lower-case name used in flags and logs.
    pub fn name(self) -> &'static str {
        match self {
            OperationKind::Start => "start",
            OperationKind::Stop => "stop",
            OperationKind::Scale => "scale",
            OperationKind::Upgrade => "upgrade",
            OperationKind::AddNodes => "add-nodes",
            OperationKind::RemoveNodes => "remove-nodes",
            OperationKind::Destroy => "destroy",
            OperationKind::Recover => "recover",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Where an operation is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl OperationState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OperationState::Succeeded | OperationState::Failed | OperationState::Cancelled
        )
    }
}

/// Parameters, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_offering: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<crate::cluster::Autoscaling>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_ids: Vec<String>,
    /// A start that provisions the cluster's nodes first (the first start).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provision: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub step: u32,
    pub total_steps: u32,
    pub step_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationError {
    /// Canonical gRPC code name.
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationRecord {
    pub schema: u32,
    pub id: String,
    pub cluster: String,
    pub cluster_uid: String,
    pub kind: OperationKind,
    /// The request event that admitted it.
    pub event: EventName,
    pub params: OperationParams,
    pub state: OperationState,
    pub from_state: ClusterState,
    pub entered_state: ClusterState,
    /// Whether it holds the slot without having moved the state.
    #[serde(default)]
    pub go_ahead: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<OperationError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_epoch: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default)]
    pub cancel_requested: bool,
}

/// An [`Event`] stored by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventName(#[serde(with = "event_serde")] pub Event);

mod event_serde {
    use crate::cluster::machine::Event;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(event: &Event, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&event.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Event, D::Error> {
        let name = String::deserialize(d)?;
        Event::ALL
            .into_iter()
            .find(|e| e.to_string() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown event {name:?}")))
    }
}

impl OperationRecord {
    /// A new PENDING operation.
    #[allow(clippy::too_many_arguments)]
    pub fn pending(
        id: String,
        cluster: &str,
        cluster_uid: &str,
        kind: OperationKind,
        event: Event,
        params: OperationParams,
        from_state: ClusterState,
        entered_state: ClusterState,
        request_id: &str,
        now: String,
    ) -> Self {
        Self {
            schema: SCHEMA_VERSION,
            id,
            cluster: cluster.to_string(),
            cluster_uid: cluster_uid.to_string(),
            kind,
            event: EventName(event),
            params,
            state: OperationState::Pending,
            go_ahead: from_state == entered_state,
            from_state,
            entered_state,
            progress: None,
            error: None,
            replica: None,
            owner_epoch: None,
            request_id: request_id.to_string(),
            created_at: now,
            started_at: None,
            finished_at: None,
            cancel_requested: false,
        }
    }
}
