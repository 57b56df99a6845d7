//! The stored records of tasks: one per task under the cluster
//! (`clusters/<c>/tasks/<type>/<name>`), the reconcile marker
//! (`clusters/<c>/taskset`) and one per run (`runs/<c>/<task-id>/<slot>`).

use super::{TaskSpec, TaskType};
use serde::{Deserialize, Serialize};

/// The status of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RunStatus {
    New,
    Running,
    Done,
    Error,
    Stopped,
    Aborted,
}

impl RunStatus {
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Done | RunStatus::Error | RunStatus::Stopped | RunStatus::Aborted
        )
    }
}

/// One run of a task: `runs/<cluster>/<task-id>/<slot>`, and the task
/// record's `last_run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRun {
    pub schema: u32,
    /// `<task-id>.<slot in ms>`: one slot, one id, one run.
    pub id: String,
    pub task_id: String,
    pub status: RunStatus,
    /// The activation this run serves (RFC 3339).
    pub slot: String,
    /// 0 for a scheduled activation, n for the n-th retry.
    pub attempt: u32,
    /// The replica and owner epoch that started it.
    pub replica: String,
    pub epoch: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the run found or produced, in the provider's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
    /// How far the run has got, as the provider last reported it while the
    /// run was going; kept as last seen once it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RunProgress>,
}

/// A run's progress in its provider's words (GetTaskProgress).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunProgress {
    /// 0 to 100; absent when the provider cannot tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    #[serde(default)]
    pub message: String,
    /// When Drover first saw this progress (RFC 3339).
    #[serde(default)]
    pub at: String,
}

impl RunProgress {
    /// Whether `other` says the same (its time aside): then nothing is
    /// written.
    pub fn same_as(&self, other: &RunProgress) -> bool {
        self.percent == other.percent && self.message == other.message
    }
}

/// `clusters/<cluster>/tasks/<type>/<name>`: what exists of one task. The
/// API's task status is read from it; nothing in it is a spec default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub schema: u32,
    #[serde(rename = "type")]
    pub task_type: TaskType,
    pub name: String,
    /// Assigned once, when the task is first scheduled; never changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Fingerprint of the spec this record was reconciled from.
    pub spec_hash: String,
    /// The spec generation this record was reconciled from.
    pub generation: i64,
    /// The spec as reconciled: what the scheduler runs.
    pub spec: TaskSpec,
    /// The evaluated start date (a `now`-relative date resolved once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_activation: Option<String>,
    /// Retry attempt the next activation is (0: a scheduled one).
    #[serde(default)]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<TaskRun>,
    #[serde(default)]
    pub success_count: u64,
    #[serde(default)]
    pub error_count: u64,
    /// The task could not be scheduled (a client-side error): the status
    /// shows only the name and this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_error: Option<String>,
    /// Why a due run has not started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

impl TaskRecord {
    /// The run in progress, if any.
    pub fn running(&self) -> Option<&TaskRun> {
        self.last_run
            .as_ref()
            .filter(|run| run.status == RunStatus::Running)
    }
}

/// `clusters/<cluster>/taskset`: the newest spec generation whose tasks were
/// reconciled. A reconcile of an older generation is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSetRecord {
    pub schema: u32,
    pub generation: i64,
}

/// The run id of a task's slot.
pub fn run_id(task_id: &str, slot_ms: i64) -> String {
    format!("{task_id}.{slot_ms:013}")
}
