//! Task specs as users declare them in the cluster spec (after the
//! scylla-operator manager API): a type, a name unique within that type, a
//! schedule and type-specific properties.
//!
//! They live with the cluster records because the cluster spec embeds them
//! ([`super::Spec::tasks`]): plain data, so the cluster layer does not
//! depend on the task layer that reconciles and runs them (`crate::task`
//! re-exports these types, where most code names them).
//!
//! # Guarantees
//! - [`TaskSpec::hash`] changes with any field of the spec and only then,
//!   the same on every replica version.

use serde::{Deserialize, Serialize};

/// Retries after a failed run when the spec sets none.
pub const DEFAULT_RETRIES: u32 = 3;

/// The kinds of maintenance task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskType {
    Repair,
    Backup,
}

impl TaskType {
    pub const ALL: [TaskType; 2] = [TaskType::Repair, TaskType::Backup];

    /// The name used in keys, logs and the provider API.
    pub fn name(self) -> &'static str {
        match self {
            TaskType::Repair => "repair",
            TaskType::Backup => "backup",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl std::fmt::Display for TaskType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// When a task runs. Empty strings mean "not set".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSchedule {
    /// RFC 3339, `now` or `now+<duration>`; empty means `now`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub start_date: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cron: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
    /// Deprecated fixed interval (`24h`); zero or empty with cron.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interval: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_retries: Option<u32>,
    /// First retry delay; doubles per attempt.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub retry_wait: String,
}

/// Repair properties.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairProperties {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dc: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyspace: Vec<String>,
    #[serde(default)]
    pub fail_fast: bool,
    /// A float as a string; empty means the default, "1".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub intensity: String,
    #[serde(default)]
    pub parallel: u32,
    /// A size (`1GiB`); empty means the default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub small_table_threshold: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
}

/// Backup properties.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupProperties {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dc: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keyspace: Vec<String>,
    /// `[dc:]provider:bucket`; at least one.
    #[serde(default)]
    pub location: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rate_limit: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshot_parallel: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upload_parallel: Vec<String>,
}

/// One task as declared in the cluster spec. Its identity is
/// (`task_type`, `name`); its id lives in the task record, never here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    #[serde(rename = "type")]
    pub task_type: TaskType,
    pub name: String,
    #[serde(default)]
    pub schedule: TaskSchedule,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairProperties>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupProperties>,
}

impl TaskSpec {
    /// A stable fingerprint of the spec: a change of any field changes it.
    /// FNV-1a over the stored JSON, so every replica version computes the
    /// same value for the same spec.
    pub fn hash(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("task specs serialize");
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{hash:016x}")
    }

    /// Retries after a failed run: the spec's, or 3; a fail-fast repair
    /// never retries.
    pub fn effective_retries(&self) -> u32 {
        if self.repair.as_ref().is_some_and(|r| r.fail_fast) {
            return 0;
        }
        self.schedule.num_retries.unwrap_or(DEFAULT_RETRIES)
    }
}

/// A task with a default schedule and no properties, for tests.
#[cfg(test)]
pub(crate) fn bare(task_type: TaskType, name: &str) -> TaskSpec {
    TaskSpec {
        task_type,
        name: name.into(),
        schedule: TaskSchedule::default(),
        repair: None,
        backup: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repair(name: &str) -> TaskSpec {
        bare(TaskType::Repair, name)
    }

    #[test]
    fn the_hash_changes_with_the_spec_and_only_then() {
        let a = repair("nightly");
        assert_eq!(a.hash(), repair("nightly").hash());
        let mut b = a.clone();
        b.schedule.cron = "0 3 * * *".into();
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn fail_fast_forces_zero_retries() {
        let mut task = repair("r");
        task.schedule.num_retries = Some(5);
        assert_eq!(task.effective_retries(), 5);
        task.repair = Some(RepairProperties {
            fail_fast: true,
            ..Default::default()
        });
        assert_eq!(task.effective_retries(), 0);
        assert_eq!(repair("r").effective_retries(), 3);
    }
}
