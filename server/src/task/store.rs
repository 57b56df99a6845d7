//! Reading a cluster together with its task records, and its run history.

use super::reconcile::Existing;
use super::record::{TaskRun, TaskSetRecord};
use super::TaskError;
use crate::cluster::{from_json, ClusterRecord, Registry, SCHEMA_VERSION};
use crate::keys::KeyLayout;
use crate::store::{Op, RangeRequest, SharedStore, Txn};

/// Runs kept per task; older ones are deleted in batches.
pub const RUN_HISTORY: usize = 20;
const RUN_HISTORY_SLACK: usize = 5;

/// A cluster and its tasks, read at one revision.
#[derive(Debug, Clone)]
pub struct ClusterTasks {
    pub cluster: ClusterRecord,
    /// The newest reconciled spec generation and the marker's revision.
    pub reconciled: Option<(i64, i64)>,
    pub tasks: Vec<Existing>,
    /// The newest mod revision among the cluster's keys.
    pub revision: i64,
}

impl ClusterTasks {
    /// Whether any record is newer than this build understands.
    pub fn newer_schema(&self) -> bool {
        self.cluster.newer_schema().is_some()
            || self.tasks.iter().any(|t| t.record.schema > SCHEMA_VERSION)
    }

    /// The record of the task (type, name), if it exists.
    pub fn record(&self, task_type: super::TaskType, name: &str) -> Option<&Existing> {
        self.tasks
            .iter()
            .find(|e| e.record.task_type == task_type && e.record.name == name)
    }
}

/// Task reads against the store.
#[derive(Clone)]
pub struct TaskStore {
    store: SharedStore,
    keys: KeyLayout,
    registry: Registry,
}

impl TaskStore {
    pub fn new(store: SharedStore, keys: KeyLayout) -> Self {
        let registry = Registry::new(store.clone(), keys.clone());
        Self {
            store,
            keys,
            registry,
        }
    }

    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Reads a cluster and its task records in one range request; `None`
    /// when the cluster does not exist.
    pub async fn read(&self, cluster: &str) -> Result<Option<ClusterTasks>, TaskError> {
        let result = self
            .store
            .range(RangeRequest::prefix(self.keys.cluster(cluster)))
            .await?;
        let revision = result
            .kvs
            .iter()
            .map(|kv| kv.mod_revision)
            .max()
            .unwrap_or(0);
        let (mut tasks, mut reconciled, mut rest) = (Vec::new(), None, Vec::new());
        for kv in result.kvs {
            match self.keys.split_cluster_key(&kv.key).map(|(_, leaf)| leaf) {
                Some(leaf) if leaf.starts_with("tasks/") => tasks.push(Existing {
                    record: from_json(&kv)?,
                    revision: kv.mod_revision,
                }),
                Some("taskset") => {
                    let marker: TaskSetRecord = from_json(&kv)?;
                    reconciled = Some((marker.generation, kv.mod_revision));
                }
                _ => rest.push(kv),
            }
        }
        Ok(self.registry.assemble(rest)?.map(|cluster| ClusterTasks {
            cluster,
            reconciled,
            tasks,
            revision,
        }))
    }

    /// The runs of one task, newest first, at most `limit`.
    pub async fn runs(
        &self,
        cluster: &str,
        task_id: &str,
        limit: usize,
    ) -> Result<Vec<TaskRun>, TaskError> {
        let all = self
            .store
            .range(RangeRequest::prefix(self.keys.task_runs(cluster, task_id)))
            .await?;
        all.kvs
            .iter()
            .rev()
            .take(limit)
            .map(|kv| from_json(kv).map_err(TaskError::from))
            .collect()
    }

    /// Deletes the oldest runs of a task beyond [`RUN_HISTORY`], once the
    /// history is a few runs over it.
    pub async fn trim_runs(&self, cluster: &str, task_id: &str) -> Result<usize, TaskError> {
        let all = self
            .store
            .range(RangeRequest::prefix(self.keys.task_runs(cluster, task_id)))
            .await?;
        if all.kvs.len() < RUN_HISTORY + RUN_HISTORY_SLACK {
            return Ok(0);
        }
        let excess = all.kvs.len() - RUN_HISTORY;
        let mut deletes = Vec::new();
        for kv in all.kvs.iter().take(excess) {
            let run: TaskRun = from_json(kv)?;
            // Never a run still in progress.
            if run.status.is_final() {
                deletes.push(Op::delete(kv.key.clone()));
            }
        }
        let deleted = deletes.len();
        if deleted > 0 {
            self.store.txn(Txn::new().and_then(deletes)).await?;
        }
        Ok(deleted)
    }
}
