//! Reads and writes cluster records in the store.
//!
//! # Guarantees
//! - A cluster's records are read in one range request, so spec, state and
//!   status come from one store revision.
//! - Create is one transaction that succeeds only while the name is free
//!   (or held by a Destroyed cluster whose state has not changed since it was
//!   read).

use super::*;
use crate::keys::{leaf, KeyLayout};
use crate::store::{
    CmpOp, Compare, GetResult, KeyValue, Op, RangeRequest, SharedStore, StoreError, Txn,
};
use serde::de::DeserializeOwned;
use std::time::SystemTime;

/// Keys read per range request while paging through clusters.
const LIST_BATCH: i64 = 512;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cluster {0:?} not found")]
    NotFound(String),
    #[error("cluster {0:?} already exists")]
    AlreadyExists(String),
    #[error("record {key} is unreadable: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("cluster {name:?} is at generation {actual}, not {expected}; read it again and retry")]
    GenerationMismatch {
        name: String,
        expected: i64,
        actual: i64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl crate::store::StoreFailure for RegistryError {
    fn store_error(&self) -> Option<&StoreError> {
        match self {
            RegistryError::Store(error) => Some(error),
            _ => None,
        }
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

/// An operation accepted together with a create.
pub struct FirstOperation {
    pub slot: OperationSlot,
    /// The state the cluster enters instead of Created.
    pub entered: ClusterState,
    /// The operation's own records.
    pub writes: Vec<Op>,
}

impl ClusterRecord {
    /// The compares that hold only while every key this view was read from
    /// (spec, state, status) is as read: the one "is my view current" check,
    /// for a write that acts on the whole view (a watch cache may hold one
    /// key of a transaction and not yet the next).
    pub fn unchanged(&self, keys: &KeyLayout) -> [Compare; 3] {
        let name = &self.spec.name;
        let status_key = keys.cluster_status(name);
        [
            Compare::mod_revision(keys.cluster_spec(name), CmpOp::Equal, self.spec_revision),
            Compare::mod_revision(keys.cluster_state(name), CmpOp::Equal, self.state_revision),
            match self.status_revision {
                0 => Compare::absent(status_key),
                revision => Compare::mod_revision(status_key, CmpOp::Equal, revision),
            },
        ]
    }
}

/// Which clusters a list returns.
#[derive(Debug, Clone, Default)]
pub struct ClusterFilter {
    pub state: Option<ClusterState>,
    /// Every one of these labels must match.
    pub labels: Vec<(String, String)>,
}

impl ClusterFilter {
    /// Whether a cluster in `state`, whose label `key` has the value
    /// `label(key)`, passes: the one meaning of a filter, whichever form
    /// the cluster is held in.
    pub(crate) fn admits<'a>(
        &self,
        state: ClusterState,
        label: impl Fn(&str) -> Option<&'a str>,
    ) -> bool {
        self.state.is_none_or(|wanted| state == wanted)
            && self
                .labels
                .iter()
                .all(|(key, value)| label(key) == Some(value.as_str()))
    }

    pub(crate) fn matches(&self, cluster: &ClusterRecord) -> bool {
        let labels = &cluster.spec.spec.labels;
        self.admits(cluster.state.state, |key| {
            labels.get(key).map(String::as_str)
        })
    }
}

/// One page of a cluster list.
#[derive(Debug, Clone)]
pub struct ClusterPage {
    pub clusters: Vec<ClusterRecord>,
    /// Name of the last cluster of this page when more may follow.
    pub next_after: Option<String>,
    /// Store revision of the page's first read: a watch from the next one
    /// misses no change made after it.
    pub revision: i64,
}

/// The clusters in the store.
#[derive(Clone)]
pub struct Registry {
    store: SharedStore,
    keys: KeyLayout,
}

impl Registry {
    pub fn new(store: SharedStore, keys: KeyLayout) -> Self {
        Self { store, keys }
    }

    /// Writes a new cluster (identified by `uid`) in state Created; with
    /// `first`, accepts its first operation in the same transaction.
    pub async fn create(
        &self,
        name: &str,
        uid: String,
        spec: Spec,
        request_id: &str,
        first: Option<FirstOperation>,
    ) -> Result<ClusterRecord> {
        let existing = self.read_cluster(name).await?;
        let guard = match &existing {
            None => Compare::absent(self.keys.cluster_state(name)),
            Some(cluster) if cluster.state.state == ClusterState::Destroyed => {
                Compare::mod_revision(
                    self.keys.cluster_state(name),
                    CmpOp::Equal,
                    cluster.state_revision,
                )
            }
            Some(cluster) if !request_id.is_empty() && cluster.spec.request_id == request_id => {
                // A retry of a create that already happened.
                return Ok(cluster.clone());
            }
            Some(_) => return Err(RegistryError::AlreadyExists(name.to_string())),
        };
        let now = now_rfc3339();
        let spec = SpecRecord {
            schema: SCHEMA_VERSION,
            name: name.to_string(),
            uid,
            generation: 1,
            spec,
            created_at: now.clone(),
            request_id: request_id.to_string(),
        };
        let state = StateRecord {
            schema: SCHEMA_VERSION,
            uid: spec.uid.clone(),
            state: first.as_ref().map_or(ClusterState::Created, |f| f.entered),
            operation: first.as_ref().map(|f| f.slot.clone()),
            changed_at: now,
        };
        let txn = Txn::new()
            .when([guard])
            .and_then([
                // A destroyed predecessor's observations and tasks are not
                // this cluster's.
                Op::delete(self.keys.cluster_status(name)),
                Op::delete_prefix(self.keys.tasks(name)),
                Op::delete(self.keys.task_set(name)),
                Op::delete_prefix(self.keys.cluster_runs(name)),
                Op::put(self.keys.cluster_spec(name), to_json(&spec)),
                Op::put(self.keys.cluster_state(name), to_json(&state)),
            ])
            .and_then(first.map(|f| f.writes).unwrap_or_default());
        match self.store.cas(txn).await {
            Ok(result) => Ok(ClusterRecord {
                spec,
                spec_revision: result.revision,
                state,
                state_revision: result.revision,
                status: None,
                status_revision: 0,
            }),
            // Someone created (or changed) the cluster since it was read.
            Err(StoreError::Conflict { .. }) => Err(RegistryError::AlreadyExists(name.to_string())),
            Err(error) => Err(error.into()),
        }
    }

    /// Edits a cluster's spec (bumping its generation) if it is still at
    /// `expected_generation` (0: any). The write compares the spec key's
    /// revision: a concurrent spec change makes it fail with a conflict, to
    /// be retried. `edit` may refuse the change.
    pub async fn update_spec<E>(
        &self,
        name: &str,
        expected_generation: i64,
        edit: impl FnOnce(&mut Spec) -> std::result::Result<(), E>,
    ) -> std::result::Result<ClusterRecord, E>
    where
        E: From<RegistryError>,
    {
        let key = self.keys.cluster_spec(name);
        let read = self
            .store
            .get(&key)
            .await
            .map_err(RegistryError::from)?
            .into_single()
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let mut spec: SpecRecord = from_json(&read)?;
        if expected_generation != 0 && spec.generation != expected_generation {
            return Err(RegistryError::GenerationMismatch {
                name: name.to_string(),
                expected: expected_generation,
                actual: spec.generation,
            }
            .into());
        }
        edit(&mut spec.spec)?;
        spec.generation += 1;
        let txn = Txn::new()
            .when([Compare::mod_revision(&key, CmpOp::Equal, read.mod_revision)])
            .and_then([Op::put(&key, to_json(&spec))]);
        self.store.cas(txn).await.map_err(RegistryError::from)?;
        Ok(self.get(name).await?)
    }

    /// Reads one cluster.
    pub async fn get(&self, name: &str) -> Result<ClusterRecord> {
        self.read_cluster(name)
            .await?
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))
    }

    /// Lists clusters in key order after `after`, at most `page_size`.
    pub async fn list(
        &self,
        filter: &ClusterFilter,
        after: Option<&str>,
        page_size: usize,
    ) -> Result<ClusterPage> {
        let mut start = after.map_or_else(
            || self.keys.clusters(),
            |name| self.keys.after_cluster(name),
        );
        let mut clusters = Vec::new();
        let mut pending: Vec<KeyValue> = Vec::new();
        let mut revision = 0;
        loop {
            let batch = self
                .store
                .range(
                    RangeRequest::prefix(self.keys.clusters())
                        .starting_at(&start)
                        .limit(LIST_BATCH),
                )
                .await?;
            if revision == 0 {
                revision = batch.revision;
            }
            let more = batch.more;
            if let Some(last) = batch.kvs.last() {
                start = format!("{}\0", last.key);
            }
            for kv in batch.kvs {
                let same_cluster = pending
                    .first()
                    .is_none_or(|first| self.cluster_of(first) == self.cluster_of(&kv));
                if !same_cluster {
                    if let Some(cluster) = self.assemble(std::mem::take(&mut pending))? {
                        if filter.matches(&cluster) {
                            clusters.push(cluster);
                        }
                    }
                }
                pending.push(kv);
            }
            // The last group may continue in the next batch: keep it pending.
            if clusters.len() > page_size {
                break;
            }
            if !more {
                if let Some(cluster) = self.assemble(std::mem::take(&mut pending))? {
                    if filter.matches(&cluster) {
                        clusters.push(cluster);
                    }
                }
                break;
            }
        }
        let next_after = if clusters.len() > page_size {
            clusters.truncate(page_size);
            clusters.last().map(|c| c.spec.name.clone())
        } else {
            None
        };
        Ok(ClusterPage {
            clusters,
            next_after,
            revision,
        })
    }

    async fn read_cluster(&self, name: &str) -> Result<Option<ClusterRecord>> {
        let GetResult { kvs, .. } = self
            .store
            .range(RangeRequest::prefix(self.keys.cluster(name)))
            .await?;
        self.assemble(kvs)
    }

    fn cluster_of<'k>(&self, kv: &'k KeyValue) -> Option<&'k str> {
        self.keys.split_cluster_key(&kv.key).map(|(name, _)| name)
    }

    /// Builds a cluster from all of its keys; `None` when it has no state
    /// key (a half-deleted or foreign entry).
    pub(crate) fn assemble(&self, kvs: Vec<KeyValue>) -> Result<Option<ClusterRecord>> {
        let (mut spec, mut state, mut status, mut status_revision) = (None, None, None, 0);
        for kv in kvs {
            match self.keys.split_cluster_key(&kv.key).map(|(_, rest)| rest) {
                Some(leaf::SPEC) => spec = Some((from_json::<SpecRecord>(&kv)?, kv.mod_revision)),
                Some(leaf::STATE) => {
                    state = Some((from_json::<StateRecord>(&kv)?, kv.mod_revision))
                }
                Some(leaf::STATUS) => {
                    status = Some(from_json::<StatusRecord>(&kv)?);
                    status_revision = kv.mod_revision;
                }
                _ => {}
            }
        }
        Ok(match (spec, state) {
            (Some((spec, spec_revision)), Some((state, state_revision))) => Some(ClusterRecord {
                spec,
                spec_revision,
                state,
                state_revision,
                status,
                status_revision,
            }),
            _ => None,
        })
    }
}

/// A stored record, or why it cannot be read.
pub fn from_json<T: DeserializeOwned>(kv: &KeyValue) -> Result<T> {
    serde_json::from_slice(&kv.value).map_err(|error| RegistryError::Corrupt {
        key: kv.key.clone(),
        reason: error.to_string(),
    })
}

/// A record as stored: compact JSON.
pub fn to_json<T: serde::Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).expect("records always serialize")
}

/// The current time in RFC 3339, as stored in records.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}
