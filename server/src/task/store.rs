//! Reading a cluster together with its task records, and its run history.

use super::reconcile::Existing;
use super::record::{TaskRun, TaskSetRecord};
use super::TaskError;
use crate::cluster::{from_json, ClusterRecord, Registry, SCHEMA_VERSION};
use crate::keys::{leaf, KeyLayout};
use crate::replication::Claim;
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
            match self.keys.split_cluster_key(&kv.key).map(|(_, tail)| tail) {
                Some(tail) if tail.starts_with(leaf::TASKS) => tasks.push(Existing {
                    record: from_json(&kv)?,
                    revision: kv.mod_revision,
                }),
                Some(leaf::TASK_SET) => {
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
    /// history is a few runs over it. An owner write, fenced by `claim`:
    /// under a claim that no longer holds, nothing is deleted (0).
    pub async fn trim_runs(
        &self,
        cluster: &str,
        task_id: &str,
        claim: Claim,
    ) -> Result<usize, TaskError> {
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
        if deletes.is_empty() {
            return Ok(0);
        }
        let deleted = deletes.len();
        let txn = Txn::new()
            .when(claim.fence(&self.keys, cluster))
            .and_then(deletes);
        let trimmed = self.store.txn(txn).await?.succeeded;
        Ok(if trimmed { deleted } else { 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::to_json;
    use crate::store::{MemoryStore, Store};
    use crate::task::record::RunStatus;
    use std::sync::Arc;

    #[tokio::test]
    async fn run_history_is_trimmed_only_under_a_claim_that_holds() {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let tasks = TaskStore::new(store.clone(), keys.clone());
        let runs = RUN_HISTORY + RUN_HISTORY_SLACK;
        for slot in 0..runs as i64 {
            let run = TaskRun {
                schema: SCHEMA_VERSION,
                id: format!("t1.{slot}"),
                task_id: "t1".into(),
                status: RunStatus::Done,
                slot: String::new(),
                attempt: 0,
                replica: "r1".into(),
                epoch: 1,
                started_at: None,
                finished_at: None,
                error: None,
                report: None,
                progress: None,
            };
            let key = keys.task_run("c", "t1", slot);
            store
                .txn(Txn::new().and_then([Op::put(key, to_json(&run))]))
                .await
                .unwrap();
        }
        let lease = store.grant_lease(30).await.unwrap();
        let owner = Op::put_with_lease(keys.owner("c"), "{}", lease);
        let epoch = store.txn(Txn::new().and_then([owner])).await.unwrap();
        let claim = Claim::new(lease, 0, epoch.revision);
        // Another lease holds the owner key now: a lost claim.
        let lost = Claim {
            lease: lease + 1,
            ..claim
        };
        assert_eq!(tasks.trim_runs("c", "t1", lost).await.unwrap(), 0);
        assert_eq!(tasks.runs("c", "t1", 100).await.unwrap().len(), runs);

        assert_eq!(
            tasks.trim_runs("c", "t1", claim).await.unwrap(),
            RUN_HISTORY_SLACK
        );
        assert_eq!(tasks.runs("c", "t1", 100).await.unwrap().len(), RUN_HISTORY);
    }
}
