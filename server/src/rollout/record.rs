//! The records of a rollout in etcd, each JSON (see the README's key
//! layout):
//!
//! - `rollouts/<name>`: [`RolloutRecord`], what was asked and the user's
//!   controls (pause, resumes, approvals, cancel); written by the API.
//! - `rollout-targets/<name>/<n>`: [`TargetChunk`]s, the targets as fixed
//!   at create, each with its stage; never rewritten.
//! - `rollout-status/<name>`: [`StatusRecord`], where the rollout is;
//!   written by its owner only, fenced.
//! - `rollout-clusters/<name>/<cluster>`: [`TargetRecord`], one target's
//!   progress, from when it leaves PENDING; written by the owner, fenced.
//! - `rollout-owners/<name>`: the owner's replica id, bound to its lease.

use super::spec::RolloutSpec;
use crate::cluster::validate::FieldError;
use crate::cluster::{RegistryError, SCHEMA_VERSION};
use crate::store::StoreError;
use serde::{Deserialize, Serialize};

/// Targets per chunk record: a chunk of names stays far below etcd's
/// request size limit.
pub const TARGETS_PER_CHUNK: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    #[serde(default = "schema")]
    pub schema: u32,
    pub uid: String,
    pub name: String,
    pub created_at: String,
    pub spec: RolloutSpec,
    #[serde(default)]
    pub control: Control,
}

/// What users asked of a running rollout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    #[serde(default)]
    pub paused: bool,
    /// How many times it was resumed: each resume forgives the failures
    /// so far.
    #[serde(default)]
    pub resumes: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<Cancel>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    pub cancel_running: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RolloutState {
    Pending,
    Running,
    Paused,
    WaitingApproval,
    Succeeded,
    Failed,
    Cancelled,
}

impl RolloutState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RolloutState::Succeeded | RolloutState::Failed | RolloutState::Cancelled
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            RolloutState::Pending => "pending",
            RolloutState::Running => "running",
            RolloutState::Paused => "paused",
            RolloutState::WaitingApproval => "waiting_approval",
            RolloutState::Succeeded => "succeeded",
            RolloutState::Failed => "failed",
            RolloutState::Cancelled => "cancelled",
        }
    }

    pub const ALL: [RolloutState; 7] = [
        RolloutState::Pending,
        RolloutState::Running,
        RolloutState::Paused,
        RolloutState::WaitingApproval,
        RolloutState::Succeeded,
        RolloutState::Failed,
        RolloutState::Cancelled,
    ];
}

/// Why a rollout is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PausedBy {
    Request,
    Budget,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusRecord {
    #[serde(default = "schema")]
    pub schema: u32,
    pub state: RolloutState,
    #[serde(default)]
    pub message: String,
    /// The stage it is at (the number of stages once every one is done).
    #[serde(default)]
    pub stage: usize,
    #[serde(default)]
    pub stage_started: Vec<Option<String>>,
    #[serde(default)]
    pub stage_finished: Vec<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<PausedBy>,
    /// The control's resumes this owner has acted on.
    #[serde(default)]
    pub resumes_seen: u32,
    /// Failures the resumes forgave: the budget counts the rest.
    #[serde(default)]
    pub forgiven: u32,
    /// Ended, with nothing of it in flight: no replica needs to own it.
    #[serde(default)]
    pub settled: bool,
    /// Whether the running operations were asked to cancel.
    #[serde(default)]
    pub cancelled_running: bool,
    #[serde(default)]
    pub owner: String,
}

/// The schema records of this build write.
fn schema() -> u32 {
    SCHEMA_VERSION
}

/// `rollout-owners/<name>`, bound to the owner's lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    #[serde(default = "schema")]
    pub schema: u32,
    pub replica: String,
    pub lease: i64,
}

impl StatusRecord {
    pub fn new(stages: usize) -> Self {
        Self {
            schema: SCHEMA_VERSION,
            state: RolloutState::Pending,
            message: String::new(),
            stage: 0,
            stage_started: vec![None; stages],
            stage_finished: vec![None; stages],
            paused_by: None,
            resumes_seen: 0,
            forgiven: 0,
            settled: false,
            cancelled_running: false,
            owner: String::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetState {
    Pending,
    /// Chosen to start: counted against the stage's concurrency before its
    /// operation is accepted, so a new owner counts it too.
    Starting,
    Running,
    Succeeded,
    Failed,
    Skipped,
}

impl TargetState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TargetState::Succeeded | TargetState::Failed | TargetState::Skipped
        )
    }

    /// Whether it takes one of its stage's concurrency slots.
    pub fn in_flight(self) -> bool {
        matches!(self, TargetState::Starting | TargetState::Running)
    }

    pub const ALL: [TargetState; 6] = [
        TargetState::Pending,
        TargetState::Starting,
        TargetState::Running,
        TargetState::Succeeded,
        TargetState::Failed,
        TargetState::Skipped,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TargetState::Pending => "pending",
            TargetState::Starting => "starting",
            TargetState::Running => "running",
            TargetState::Succeeded => "succeeded",
            TargetState::Failed => "failed",
            TargetState::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRecord {
    #[serde(default = "schema")]
    pub schema: u32,
    pub state: TargetState,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl TargetRecord {
    pub fn ended(state: TargetState, operation_id: &str, message: &str) -> Self {
        Self {
            schema: SCHEMA_VERSION,
            state,
            operation_id: operation_id.to_string(),
            message: message.to_string(),
        }
    }

    pub fn pending() -> Self {
        Self {
            schema: SCHEMA_VERSION,
            state: TargetState::Pending,
            operation_id: String::new(),
            message: String::new(),
        }
    }
}

/// Targets as fixed at create: (cluster, stage index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetChunk {
    #[serde(default = "schema")]
    pub schema: u32,
    pub targets: Vec<(String, usize)>,
}

/// What rollout requests fail with.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("rollout {0:?} not found")]
    NotFound(String),
    #[error("rollout {0:?} already exists")]
    AlreadyExists(String),
    #[error("rollout {name:?} already ended {state}: {action} is not possible")]
    Ended {
        name: String,
        state: &'static str,
        action: &'static str,
    },
    #[error("the selector matches no cluster: a rollout needs at least one target")]
    NoTargets,
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error(transparent)]
    Lifecycle(#[from] crate::operation::LifecycleError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl RolloutError {
    /// A fenced write whose compares did not hold.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            RolloutError::Registry(RegistryError::Store(StoreError::Conflict { .. }))
        )
    }
}

impl From<StoreError> for RolloutError {
    fn from(error: StoreError) -> Self {
        RolloutError::Registry(RegistryError::Store(error))
    }
}
