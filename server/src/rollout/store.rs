//! Reading and writing a rollout's records (see `record` for the layout).
//! The API creates rollouts and edits their controls here; the owner loads
//! one whole and writes its progress, fenced, here.

use super::record::*;
use super::spec::RolloutSpec;
use crate::cluster::{from_json, now_rfc3339, to_json};
use crate::keys::KeyLayout;
use crate::store::{CmpOp, Compare, KeyValue, Op, RangeRequest, SharedStore, StoreError, Txn};
use std::collections::HashMap;

/// One target: its cluster, its stage, where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub cluster: String,
    pub stage: usize,
    pub record: TargetRecord,
}

/// A rollout as stored, whole.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub record: RolloutRecord,
    pub status: StatusRecord,
    pub targets: Vec<Target>,
}

#[derive(Clone)]
pub struct RolloutStore {
    store: SharedStore,
    keys: KeyLayout,
}

impl RolloutStore {
    pub fn new(store: SharedStore, keys: KeyLayout) -> Self {
        Self { store, keys }
    }

    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// Writes a new rollout with its targets, in one transaction: a
    /// rollout exists with all its targets or not at all.
    pub async fn create(
        &self,
        name: &str,
        spec: RolloutSpec,
        targets: Vec<(String, usize)>,
    ) -> Result<RolloutRecord, RolloutError> {
        let record = RolloutRecord {
            schema: crate::cluster::SCHEMA_VERSION,
            uid: uuid::Uuid::now_v7().to_string(),
            name: name.to_string(),
            created_at: now_rfc3339(),
            control: Control::default(),
            spec,
        };
        let key = self.keys.rollout(name);
        let status = StatusRecord::new(record.spec.stages.len());
        let mut writes = vec![
            Op::put(&key, to_json(&record)),
            Op::put(self.keys.rollout_status(name), to_json(&status)),
        ];
        for (n, chunk) in targets.chunks(TARGETS_PER_CHUNK).enumerate() {
            let chunk = TargetChunk {
                schema: crate::cluster::SCHEMA_VERSION,
                targets: chunk.to_vec(),
            };
            let chunk_key = self.keys.rollout_target_chunk(name, n);
            writes.push(Op::put(chunk_key, to_json(&chunk)));
        }
        let txn = Txn::new().when([Compare::absent(&key)]).and_then(writes);
        match self.store.cas(txn).await {
            Ok(_) => Ok(record),
            Err(StoreError::Conflict { .. }) => Err(RolloutError::AlreadyExists(name.into())),
            Err(error) => Err(error.into()),
        }
    }

    /// The rollout's record and the revision it was read at.
    pub async fn record(&self, name: &str) -> Result<(RolloutRecord, i64), RolloutError> {
        let kv = self
            .store
            .get(&self.keys.rollout(name))
            .await?
            .into_single();
        let kv = kv.ok_or_else(|| RolloutError::NotFound(name.to_string()))?;
        Ok((from_json(&kv)?, kv.mod_revision))
    }

    /// Changes the rollout's controls with `change`, which refuses by
    /// returning an error; retried on a concurrent change.
    pub async fn update_control(
        &self,
        name: &str,
        mut change: impl FnMut(&mut RolloutRecord, &StatusRecord) -> Result<(), RolloutError>,
    ) -> Result<(), RolloutError> {
        loop {
            let (mut record, revision) = self.record(name).await?;
            let status = self.status(name).await?;
            change(&mut record, &status)?;
            let key = self.keys.rollout(name);
            let txn = Txn::new()
                .when([Compare::mod_revision(&key, CmpOp::Equal, revision)])
                .and_then([Op::put(&key, to_json(&record))]);
            match self.store.cas(txn).await {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
    }

    pub async fn status(&self, name: &str) -> Result<StatusRecord, RolloutError> {
        let key = self.keys.rollout_status(name);
        let kv = self.store.get(&key).await?.into_single();
        let kv = kv.ok_or_else(|| RolloutError::NotFound(name.to_string()))?;
        Ok(from_json(&kv)?)
    }

    /// The whole rollout: its record, status and every target.
    pub async fn load(&self, name: &str) -> Result<Loaded, RolloutError> {
        let (record, _) = self.record(name).await?;
        let status = self.status(name).await?;
        let chunks = self.range(&self.keys.rollout_targets(name)).await?;
        let progress = self.range(&self.keys.rollout_clusters(name)).await?;
        let prefix = self.keys.rollout_clusters(name);
        let mut records: HashMap<&str, TargetRecord> = HashMap::new();
        for kv in &progress {
            let cluster = kv.key.strip_prefix(&prefix).unwrap_or(&kv.key);
            records.insert(cluster, from_json(kv)?);
        }
        let mut targets = Vec::new();
        for kv in &chunks {
            let chunk: TargetChunk = from_json(kv)?;
            for (cluster, stage) in chunk.targets {
                let record = records
                    .remove(cluster.as_str())
                    .unwrap_or_else(TargetRecord::pending);
                targets.push(Target {
                    cluster,
                    stage,
                    record,
                });
            }
        }
        Ok(Loaded {
            record,
            status,
            targets,
        })
    }

    /// Every rollout's record and status.
    pub async fn list(&self) -> Result<Vec<(RolloutRecord, StatusRecord)>, RolloutError> {
        let records = self.range(&self.keys.rollouts()).await?;
        let mut rollouts = Vec::new();
        for kv in &records {
            let record: RolloutRecord = from_json(kv)?;
            let status = match self.status(&record.name).await {
                Ok(status) => status,
                Err(RolloutError::NotFound(_)) => continue,
                Err(error) => return Err(error),
            };
            rollouts.push((record, status));
        }
        Ok(rollouts)
    }

    async fn range(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        Ok(self.store.range(RangeRequest::prefix(prefix)).await?.kvs)
    }
}
