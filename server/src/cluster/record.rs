//! The JSON records of a cluster, one per etcd key (see [`crate::keys`]).
//!
//! Every record carries `schema`: a replica never rewrites a record whose
//! schema is newer than [`SCHEMA_VERSION`].

use super::ClusterState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The record schema this build writes.
pub const SCHEMA_VERSION: u32 = 1;

/// Autoscaling bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autoscaling {
    pub enabled: bool,
    pub min: u32,
    pub max: u32,
}

/// The desired state of a cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub version: String,
    pub control_nodes: u32,
    pub worker_nodes: u32,
    pub node_offering: String,
    #[serde(default)]
    pub autoscaling: Autoscaling,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Scheduled maintenance tasks; reconciled by the owner.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<super::task_spec::TaskSpec>,
    /// The provider's name, fixed at create. Empty in records written
    /// before providers had names: those clusters use the default provider.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// Nothing starts on its own (remediation, task runs, rollout steps)
    /// while set; an operator's own requests still run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Scheduled task runs are suspended: none starts while set (until its
    /// `until`, when it has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_suspended: Option<TaskSuspension>,
    /// Node health checks and remediation; unset fields take defaults.
    #[serde(default, skip_serializing_if = "HealthPolicy::is_default")]
    pub health: HealthPolicy,
    /// When Drover may start work of its own; empty: at any time.
    #[serde(default, skip_serializing_if = "MaintenanceWindow::is_empty")]
    pub maintenance: MaintenanceWindow,
    /// How an upgrade's node calls are retried; unset: no retry.
    #[serde(default, skip_serializing_if = "UpgradePolicy::is_default")]
    pub upgrade_policy: UpgradePolicy,
}

/// `spec.upgrade_policy`, as given (`None`: the default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradePolicy {
    /// Workers upgraded side by side; `None`: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<u32>,
    /// Surge workers added (and upgraded) first; `None`: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_timeout_seconds: Option<u32>,
}

impl UpgradePolicy {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.health`, as given (`None`: the default, see `crate::health`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_timeout_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_seconds: Option<u32>,
    /// A count or a percentage (`40%`); empty: the default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub max_unhealthy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_period_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_healthy_period_seconds: Option<u32>,
    /// "repair" or "replace"; empty: the default (repair).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub remediation: String,
}

impl HealthPolicy {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// `spec.maintenance`: `[WEEKDAY-]HH:MM` start/end pairs in a time zone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaintenanceWindow {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window: Vec<String>,
    /// IANA name; empty: UTC.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
}

impl MaintenanceWindow {
    pub fn is_empty(&self) -> bool {
        self.window.is_empty() && self.timezone.is_empty()
    }
}

/// A suspension of a cluster's scheduled task runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSuspension {
    /// RFC 3339; `None`: until resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// `clusters/<name>/spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecRecord {
    pub schema: u32,
    pub name: String,
    pub uid: String,
    /// Bumped on every spec change.
    pub generation: i64,
    pub spec: Spec,
    /// RFC 3339.
    pub created_at: String,
    /// The idempotency key of the create, if the caller gave one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
}

/// The operation holding a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationSlot {
    pub id: String,
    /// The operation kind, so a refused request can say what holds the
    /// cluster without another read.
    pub kind: String,
}

/// `clusters/<name>/state`: the compare-and-swap target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRecord {
    pub schema: u32,
    pub uid: String,
    pub state: ClusterState,
    /// The operation in progress; `null` when the cluster is free.
    pub operation: Option<OperationSlot>,
    /// RFC 3339 time of the last state change.
    pub changed_at: String,
}

/// `clusters/<name>/status`: what Drover observed. Absent fields were not
/// observed; nothing is filled from the spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusRecord {
    pub schema: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// What automatic remediation did, per node.
    #[serde(default, skip_serializing_if = "RemediationStatus::is_empty")]
    pub remediation: RemediationStatus,
}

/// `status.remediation`: written by the remediation controller before it
/// asks for a remediation, so a crash never gives a node more than its
/// retries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemediationStatus {
    /// Why nothing is remediated now, when so.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub short_circuited: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeRemediation>,
    /// Remediations asked for so far: the request ids' sequence.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub asked: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RemediationStatus {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One node's remediations since its retries were last reset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRemediation {
    pub node_id: String,
    pub attempts: u32,
    /// RFC 3339.
    pub last_started_at: String,
}

/// The outcome of the last finished operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastOperation {
    pub id: String,
    /// Operation kind name (`start`, `upgrade`, ...).
    pub kind: String,
    /// `Succeeded`, `Failed` or `Cancelled`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One node as last observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The provider's id, or for a node the spec has and the provider no
    /// longer shows, a placeholder (see [`NodeStatus::missing`]).
    pub id: String,
    pub role: String,
    pub power_state: String,
    pub version: String,
    pub ready: bool,
    /// The provider's facts about the node as of this write. They change on
    /// their own (a replication lag), so they are refreshed whenever the
    /// status is written and are never a reason to write it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, String>,
    /// RFC 3339: since when the node has not been ready, as first observed
    /// (kept across writes while it stays so); `None` when ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_since: Option<String>,
    /// Not ready since it first appeared: judged by the startup timeout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub never_ready: bool,
}

impl NodeStatus {
    /// The power state of a node the spec has and the provider no longer
    /// shows.
    pub const MISSING: &'static str = "missing";

    /// The `n`th (from 1) missing node of `role`: a placeholder, so the
    /// health check judges it and remediation counts its attempts like any
    /// node's.
    pub fn missing(role: &str, n: usize) -> Self {
        Self {
            id: format!("missing-{role}-{n}"),
            role: role.to_string(),
            power_state: Self::MISSING.to_string(),
            version: String::new(),
            ready: false,
            facts: BTreeMap::new(),
            not_ready_since: None,
            never_ready: false,
        }
    }

    pub fn is_missing(&self) -> bool {
        self.power_state == Self::MISSING
    }

    /// The role of the missing node a placeholder id names (as a
    /// remediation names it); `None` for a provider's node id.
    pub fn missing_role(id: &str) -> Option<&str> {
        let rest = id.strip_prefix("missing-")?;
        let (role, n) = rest.rsplit_once('-')?;
        n.parse::<usize>().ok().map(|_| role)
    }
}

/// Every record of one cluster, read together.
#[derive(Debug, Clone)]
pub struct ClusterRecord {
    pub spec: SpecRecord,
    /// Mod revision of the spec key: the operand of spec edits.
    pub spec_revision: i64,
    pub state: StateRecord,
    /// Mod revision of the state key: the CAS operand.
    pub state_revision: i64,
    pub status: Option<StatusRecord>,
    /// Mod revision of the status key; 0 when there is none.
    pub status_revision: i64,
}

impl ClusterRecord {
    /// The newest schema among the cluster's records when it is newer than
    /// this build understands: such a cluster is left to newer replicas.
    pub fn newer_schema(&self) -> Option<u32> {
        let newest = [
            Some(self.spec.schema),
            Some(self.state.schema),
            self.status.as_ref().map(|s| s.schema),
        ]
        .into_iter()
        .flatten()
        .max()?;
        (newest > SCHEMA_VERSION).then_some(newest)
    }
}
