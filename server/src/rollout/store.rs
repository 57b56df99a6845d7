//! Reading and writing a rollout's records (see `record` for the layout).
//! The API creates rollouts and edits their controls here; the owner loads
//! one whole and writes its progress, fenced, here.

use super::record::*;
use super::spec::RolloutSpec;
use crate::cluster::{from_json, now_rfc3339, to_json};
use crate::keys::KeyLayout;
use crate::replication::Claim;
use crate::store::{CmpOp, Compare, KeyValue, Op, RangeRequest, SharedStore, StoreError, Txn};
use std::collections::HashMap;

/// One target: its cluster, its stage, where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub cluster: String,
    pub stage: usize,
    pub record: TargetRecord,
}

/// Writes per fenced transaction (etcd allows 128 operations).
pub const WRITES_PER_TXN: usize = 100;

/// A rollout as stored, whole.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub record: RolloutRecord,
    /// The record's revision as read: what the owner's status writes
    /// compare (see [`RolloutStore::write_fenced`]).
    pub revision: i64,
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
        let (record, revision) = self.record(name).await?;
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
            revision,
            status,
            targets,
        })
    }

    /// Writes `together` (at most [`WRITES_PER_TXN`] writes) in one
    /// transaction and `rest` in as many as it takes, all at once; each
    /// applies only while `claim` holds the rollout's owner key and, given
    /// `record_at`, while its record is still at that revision: a control
    /// written since (a pause, an approval) fails `together` whole with
    /// [`StoreError::Conflict`], so nothing decided without it lands there.
    pub async fn write_fenced(
        &self,
        name: &str,
        together: Vec<Op>,
        rest: Vec<Op>,
        claim: Claim,
        record_at: Option<i64>,
    ) -> Result<(), StoreError> {
        debug_assert!(together.len() <= WRITES_PER_TXN);
        let record = record_at
            .map(|revision| Compare::mod_revision(self.keys.rollout(name), CmpOp::Equal, revision));
        let batches = std::iter::once(together.as_slice()).chain(rest.chunks(WRITES_PER_TXN));
        let writes = batches.filter(|batch| !batch.is_empty()).map(|batch| {
            let compares = claim.fence_key(self.keys.rollout_owner(name));
            let txn = Txn::new()
                .when(compares.into_iter().chain(record.clone()))
                .and_then(batch.to_vec());
            self.store.cas(txn)
        });
        futures_util::future::try_join_all(writes).await?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use drover_proto::v1;
    use std::sync::Arc;

    /// A rollout of one target written to a memory store, and a claim of
    /// its owner key.
    async fn owned_rollout(rollouts: &RolloutStore) -> Claim {
        let spec = v1::RolloutSpec {
            version: "1.31.2".into(),
            clusters: vec!["c".into()],
            stages: vec![v1::RolloutStage {
                name: "all".into(),
                max_concurrency: "1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let spec = RolloutSpec::from_proto(Some(spec)).unwrap();
        rollouts
            .create("r", spec, vec![("c".into(), 0)])
            .await
            .unwrap();
        let store = rollouts.store();
        let lease = store.grant_lease(60).await.unwrap();
        let owner = Op::put_with_lease(rollouts.keys().rollout_owner("r"), b"{}".to_vec(), lease);
        let written = store.cas(Txn::new().and_then([owner])).await.unwrap();
        Claim::new(lease, 0, written.revision)
    }

    /// A status write decided on a record that a pause changed since is
    /// refused whole: nothing the owner chose without the pause is
    /// written (or started).
    #[tokio::test]
    async fn a_write_decided_before_a_pause_is_refused() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let rollouts = RolloutStore::new(store, KeyLayout::new("/t/"));
        let claim = owned_rollout(&rollouts).await;
        let mut run = rollouts.load("r").await.unwrap();
        rollouts
            .update_control("r", |record, _| {
                record.control.paused = true;
                Ok(())
            })
            .await
            .unwrap();
        run.status.message = "decided without the pause".into();
        let status = Op::put(rollouts.keys().rollout_status("r"), to_json(&run.status));
        let write =
            rollouts.write_fenced("r", vec![status.clone()], vec![], claim, Some(run.revision));
        assert!(matches!(write.await, Err(StoreError::Conflict { .. })));
        assert_ne!(rollouts.status("r").await.unwrap(), run.status);

        let (_, now) = rollouts.record("r").await.unwrap();
        let write = rollouts.write_fenced("r", vec![status], vec![], claim, Some(now));
        write.await.unwrap();
        assert_eq!(rollouts.status("r").await.unwrap(), run.status);
    }
}
