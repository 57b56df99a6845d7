//! The durable state: the newest fencing epoch per cluster, the calls in
//! flight, each cluster's topology and each task run's outcome, in one
//! embedded redb file, so a restarted provider forgets nothing.
//!
//! # Guarantees
//! - Every write is committed (durably) before the method that made it
//!   returns: an epoch recorded here is refused-below after any restart.
//!
//! # Caveats
//! - One process at a time: redb locks the file, so a second provider on
//!   the same root fails to open it.

use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;

const EPOCHS: TableDefinition<&str, i64> = TableDefinition::new("epochs");
const CLUSTERS: TableDefinition<&str, &str> = TableDefinition::new("clusters");
const IN_FLIGHT: TableDefinition<&str, &str> = TableDefinition::new("in_flight");
const RUNS: TableDefinition<&str, &str> = TableDefinition::new("runs");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store: {0}")]
    Db(String),
    #[error("state store record: {0}")]
    Record(#[from] serde_json::Error),
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Db(e.to_string()) }
        }
    )*};
}
db_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

impl From<StoreError> for tonic::Status {
    fn from(e: StoreError) -> Self {
        tonic::Status::unavailable(e.to_string())
    }
}

/// The role of a node: the primary is Drover's control node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Primary,
    Standby,
}

/// One node as the provider built it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: String,
    pub port: u16,
    pub role: Role,
    /// Version label it runs (or last ran) on.
    pub version: String,
    /// Offering its settings were last applied for.
    pub offering: String,
    /// Its data directory is complete (initdb or pg_basebackup finished).
    pub built: bool,
}

/// One cluster: its nodes and what it should look like.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub uid: String,
    pub offering: String,
    /// The version the cluster was created at, brought to the primary's by
    /// each upgrade. A node added later does not take it as it stands (a
    /// state file written before upgrades kept it may hold the creation
    /// version still): see [`ClusterRecord::join_version`].
    pub version: String,
    pub nodes: Vec<NodeRecord>,
    /// Index of the next node id ("pg-N"): ids are never reused.
    pub next_index: u32,
    /// The nodes should be off (StopNodes), until StartNodes or a repair.
    pub stopped: bool,
    /// A promotion decided and recorded before `pg_ctl promote` runs, until
    /// the roles are swapped in the same commit that clears it: a call that
    /// finds it open resolves it from what the nodes show before it starts
    /// or rebuilds anything.
    #[serde(default)]
    pub promotion: Option<Promotion>,
}

/// The primary role moving from `old` to `new` (a switchover, or a repair
/// of a primary that is down).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promotion {
    pub old: String,
    pub new: String,
    /// The old primary is rebuilt from the new one afterwards (a repair:
    /// it went down uncleanly and may hold WAL the new one never got).
    pub rebuild_old: bool,
    /// What decided it, for fault points and logs ("switchover", "repair").
    pub kind: String,
}

impl ClusterRecord {
    pub fn primary(&self) -> Option<&NodeRecord> {
        self.nodes.iter().find(|n| n.role == Role::Primary)
    }

    /// The version a node added to the cluster (CreateNodes, ResizeNodes)
    /// starts at. The rule: the primary's (Drover's control node), i.e. the
    /// version the cluster runs now, so a standby added after an upgrade
    /// joins at the upgraded version; the recorded cluster version only
    /// while there is no primary yet (the first node of a new cluster).
    /// The primary's because a standby is built from its base backup and
    /// streams from it: at its version it always can. Mid-way through a
    /// rolling upgrade (standbys first, the primary last) a node added is
    /// at the old version, like the primary, and needs an UpgradeNode of
    /// its own; a surge standby (added before any node is upgraded, then
    /// upgraded first) starts at the old version as before. A standby
    /// rebuilt in place (RepairNodes) keeps its own record's version.
    pub fn join_version(&self) -> String {
        self.primary()
            .map_or_else(|| self.version.clone(), |p| p.version.clone())
    }
}

/// A task run as recorded: `outcome` is empty while it runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    pub cluster_uid: String,
    pub epoch: i64,
    pub outcome: Option<(String, String, String)>,
}

pub struct Store {
    db: Database,
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path)?;
        let tx = db.begin_write()?;
        tx.open_table(EPOCHS)?;
        tx.open_table(CLUSTERS)?;
        tx.open_table(IN_FLIGHT)?;
        tx.open_table(RUNS)?;
        tx.commit()?;
        Ok(Self { db })
    }

    pub fn epoch(&self, uid: &str) -> Result<Option<i64>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(EPOCHS)?;
        Ok(table.get(uid)?.map(|v| v.value()))
    }

    /// Raises the newest epoch of `uid` to `epoch` if that is newer and
    /// returns the one it had, atomically with the check.
    pub fn raise_epoch(&self, uid: &str, epoch: i64) -> Result<Option<i64>, StoreError> {
        let tx = self.db.begin_write()?;
        let old = {
            let mut table = tx.open_table(EPOCHS)?;
            let old = table.get(uid)?.map(|v| v.value());
            if old.is_none_or(|old| epoch > old) {
                table.insert(uid, epoch)?;
            }
            old
        };
        tx.commit()?;
        Ok(old)
    }

    pub fn cluster(&self, uid: &str) -> Result<Option<ClusterRecord>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(CLUSTERS)?;
        let value = table.get(uid)?;
        Ok(match value {
            Some(v) => Some(serde_json::from_str(v.value())?),
            None => None,
        })
    }

    pub fn clusters(&self) -> Result<Vec<ClusterRecord>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(CLUSTERS)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (_, v) = entry?;
            out.push(serde_json::from_str(v.value())?);
        }
        Ok(out)
    }

    pub fn put_cluster(&self, cluster: &ClusterRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(cluster)?;
        self.put(CLUSTERS, &cluster.uid, &json)
    }

    pub fn remove_cluster(&self, uid: &str) -> Result<(), StoreError> {
        self.remove(CLUSTERS, uid)
    }

    /// Records a call in flight under `key` (method, cluster, epoch,
    /// operation); an entry left after a crash shows what was cut short.
    pub fn begin_call(&self, key: &str, what: &str) -> Result<(), StoreError> {
        self.put(IN_FLIGHT, key, what)
    }

    pub fn end_call(&self, key: &str) -> Result<(), StoreError> {
        self.remove(IN_FLIGHT, key)
    }

    /// Calls recorded in flight, e.g. those a crash cut short.
    pub fn calls_in_flight(&self) -> Result<Vec<(String, String)>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(IN_FLIGHT)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (k, v) = entry?;
            out.push((k.value().to_string(), v.value().to_string()));
        }
        Ok(out)
    }

    pub fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let tx = self.db.begin_read()?;
        let table = tx.open_table(RUNS)?;
        let value = table.get(run_id)?;
        Ok(match value {
            Some(v) => Some(serde_json::from_str(v.value())?),
            None => None,
        })
    }

    pub fn put_run(&self, run_id: &str, run: &RunRecord) -> Result<(), StoreError> {
        self.put(RUNS, run_id, &serde_json::to_string(run)?)
    }

    fn put(&self, def: TableDefinition<&str, &str>, k: &str, v: &str) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        tx.open_table(def)?.insert(k, v)?;
        tx.commit()?;
        Ok(())
    }

    fn remove(&self, def: TableDefinition<&str, &str>, k: &str) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        tx.open_table(def)?.remove(k)?;
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record written before upgrades updated the cluster version: it
    /// still loads, and new nodes join at the primary's version.
    #[test]
    fn an_old_record_loads_and_new_nodes_join_at_the_primary_version() {
        let old = r#"{"uid":"c","offering":"small","version":"15.0.0",
            "nodes":[
              {"id":"pg-0","port":5432,"role":"Standby","version":"15.1.0","offering":"small","built":true},
              {"id":"pg-1","port":5433,"role":"Primary","version":"15.1.0","offering":"small","built":true}],
            "next_index":2,"stopped":false}"#;
        let record: ClusterRecord = serde_json::from_str(old).unwrap();
        assert_eq!(record.version, "15.0.0");
        assert_eq!(record.join_version(), "15.1.0");
        let empty = ClusterRecord {
            version: "15.0.0".into(),
            ..Default::default()
        };
        assert_eq!(empty.join_version(), "15.0.0");
    }
}
