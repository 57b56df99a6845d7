//! What each call does to a cluster's nodes, step by step. Every step is
//! idempotent and checks the call's deadline before it starts, so a call
//! cut short is finished by the same call sent again.

use crate::pg::{self, NodeConf};
use crate::store::{ClusterRecord, NodeRecord, Role};
use crate::Inner;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tonic::Status;

/// How long a call waits for a standby to stream before it rebuilds it.
const STREAM_WAIT: Duration = Duration::from_secs(20);
/// How long a switchover waits for the candidate to catch up.
const CATCH_UP_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);
/// How long the processes a standby's killed postmaster left behind get
/// to exit once sent SIGKILL, and the primary to release its slot.
const LEFTOVER_WAIT: Duration = Duration::from_secs(10);
/// How many times a rebuild starts over when its data directory is
/// deleted again before the standby has started on it.
const REBUILD_ATTEMPTS: u32 = 3;
/// A node's WAL position: received (standby) or written (primary).
const RECEIVED: &str = "SELECT CASE WHEN pg_is_in_recovery() \
    THEN COALESCE(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) \
    ELSE pg_current_wal_lsn() END";

/// One fenced call's view of its cluster; the caller holds the cluster's
/// lock for as long as it lives.
pub struct Ctx<'a> {
    pub inner: &'a Inner,
    pub epoch: i64,
    pub deadline: Option<Instant>,
    pub cluster: ClusterRecord,
}

pub fn unavailable(e: impl std::fmt::Display) -> Status {
    Status::unavailable(e.to_string())
}

impl Ctx<'_> {
    /// Called once, under the cluster's lock, before the call's first
    /// effect: a call whose epoch was superseded while it waited for the
    /// lock applies nothing. Once past this, a call runs to its end (a
    /// newer epoch's call waits for the lock): aborting it mid-way would
    /// answer ABORTED with some of its effects applied.
    pub fn admit(&self) -> Result<(), Status> {
        self.check("anything")?;
        let newest = self.inner.store.epoch(&self.cluster.uid)?;
        if let Some(newest) = newest.filter(|n| *n > self.epoch) {
            return Err(Status::aborted(format!(
                "superseded by epoch {newest} for cluster {}: nothing applied",
                self.cluster.uid
            )));
        }
        Ok(())
    }

    /// Called before each physical step: nothing starts after the call's
    /// deadline.
    pub fn check(&self, step: &str) -> Result<(), Status> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Status::deadline_exceeded(format!(
                "deadline reached before {step}; the work done so far stays and a repeated call goes on"
            )));
        }
        Ok(())
    }

    pub fn save(&self) -> Result<(), Status> {
        Ok(self.inner.store.put_cluster(&self.cluster)?)
    }

    pub fn dir(&self, node: &NodeRecord) -> PathBuf {
        self.inner.node_dir(&self.cluster.uid, &node.id)
    }

    fn log(&self, node: &NodeRecord) -> PathBuf {
        self.inner.log_path(&self.cluster.uid, &node.id)
    }

    pub fn bin(&self, version: &str) -> Result<PathBuf, Status> {
        self.inner
            .cfg
            .versions
            .get(version)
            .cloned()
            .ok_or_else(|| {
                Status::failed_precondition(format!("version {version} is no longer configured"))
            })
    }

    pub fn node(&self, id: &str) -> Option<&NodeRecord> {
        self.cluster.nodes.iter().find(|n| n.id == id)
    }

    pub fn node_mut(&mut self, id: &str) -> &mut NodeRecord {
        let node = self.cluster.nodes.iter_mut().find(|n| n.id == id);
        node.expect("a node named by the cluster record")
    }

    pub fn primary(&self) -> Result<NodeRecord, Status> {
        self.cluster
            .primary()
            .cloned()
            .ok_or_else(|| Status::internal("cluster record has no primary"))
    }

    pub fn standbys(&self) -> Vec<NodeRecord> {
        let all = self.cluster.nodes.iter();
        all.filter(|n| n.role == Role::Standby).cloned().collect()
    }

    /// Writes the node's settings for its role and the cluster's offering,
    /// and starts it (on its version's binaries) if it is not running; a
    /// primary only while no other node is or was one on a newer timeline.
    pub async fn start(&mut self, id: &str) -> Result<(), Status> {
        let node = self.node(id).cloned().expect("known node");
        let dir = self.dir(&node);
        if pg::running(&dir) {
            return Ok(());
        }
        self.check(&format!("starting {id}"))?;
        if node.role == Role::Primary {
            self.refuse_second_primary(id).await?;
        }
        let offering = self.inner.offering(&self.cluster.offering)?;
        let primary = self.primary()?;
        let slot = slot_name(id);
        let conf = NodeConf {
            port: node.port,
            shared_buffers: &offering.shared_buffers,
            max_connections: offering.max_connections,
            follow: (node.role == Role::Standby).then_some((primary.port, slot.as_str())),
            application_name: id,
            fsync: !self.inner.cfg.unsafe_no_fsync,
        };
        let pg = &self.inner.pg;
        pg.write_conf(&dir, &conf).map_err(unavailable)?;
        let bin = self.bin(&node.version)?;
        pg.start(&bin, &dir, &self.log(&node))
            .await
            .map_err(unavailable)?;
        let offering = self.cluster.offering.clone();
        self.node_mut(id).offering = offering;
        self.save()
    }

    pub async fn stop(&self, id: &str) -> Result<(), Status> {
        let node = self.node(id).cloned().expect("known node");
        let dir = self.dir(&node);
        if !pg::running(&dir) {
            return Ok(());
        }
        self.check(&format!("stopping {id}"))?;
        let bin = self.bin(&node.version)?;
        self.inner.pg.stop(&bin, &dir).await.map_err(unavailable)
    }

    /// Makes the primary's data directory (initdb) if it is not complete.
    pub async fn build_primary(&mut self) -> Result<(), Status> {
        let node = self.primary()?;
        if node.built {
            return Ok(());
        }
        self.check("initdb")?;
        let dir = self.dir(&node);
        remove_dir(&dir)?;
        let bin = self.bin(&node.version)?;
        self.inner
            .pg
            .initdb(&bin, &dir)
            .await
            .map_err(unavailable)?;
        self.node_mut(&node.id).built = true;
        self.save()
    }

    /// Creates the standby's replication slot on the primary if missing.
    pub async fn ensure_slot(&self, id: &str) -> Result<(), Status> {
        let primary = self.primary()?;
        let slot = slot_name(id);
        let sql = format!(
            "SELECT pg_create_physical_replication_slot('{slot}', true) \
             WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}')"
        );
        self.query(&primary, &sql).await.map(drop)
    }

    pub async fn drop_slot(&self, id: &str) -> Result<(), Status> {
        let primary = self.primary()?;
        let slot = slot_name(id);
        let sql = format!(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = '{slot}' AND NOT active"
        );
        self.query(&primary, &sql).await.map(drop)
    }

    pub async fn query(&self, node: &NodeRecord, sql: &str) -> Result<String, Status> {
        let bin = self.bin(&node.version)?;
        let pg = &self.inner.pg;
        pg.query(&bin, node.port, "postgres", sql)
            .await
            .map_err(unavailable)
    }

    /// Makes the standby's data directory anew from the primary
    /// (pg_basebackup through its slot) and starts it; starts over, a
    /// bounded number of times, when the new directory is deleted before
    /// the standby has started on it.
    /// A node running as a primary is never rebuilt, and a data directory
    /// that may hold writes the primary lacks is moved aside, not deleted.
    pub async fn rebuild_standby(&mut self, id: &str) -> Result<(), Status> {
        let dir = self.dir(&self.node(id).cloned().expect("known node"));
        let mut attempt = 1;
        loop {
            self.rebuild_dir(id).await?;
            match self.start(id).await {
                Err(e) if attempt < REBUILD_ATTEMPTS && retry_rebuild(&e, &dir) => {
                    tracing::warn!(node = id, error = %e, "data directory gone before the rebuilt standby started; rebuilding again");
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    /// The rebuild's data directory, made anew; the node not started.
    async fn rebuild_dir(&mut self, id: &str) -> Result<(), Status> {
        let node = self.node(id).cloned().expect("known node");
        if self.running_role(&node).await? == Some(Role::Primary) {
            return Err(Status::failed_precondition(format!(
                "not rebuilding {id}: it runs as a primary"
            )));
        }
        self.stop(id).await?;
        self.check(&format!("rebuilding {id}"))?;
        self.end_leftovers(&node).await?;
        self.node_mut(id).built = false;
        self.save()?;
        self.ensure_slot(id).await?;
        self.wait_slot_released(id).await?;
        let primary = self.primary()?;
        let dir = self.dir(&node);
        self.clear_data_dir(&node).await?;
        let bin = self.bin(&primary.version)?;
        let slot = slot_name(id);
        let pg = &self.inner.pg;
        pg.basebackup(&bin, primary.port, &dir, Some(&slot))
            .await
            .map_err(unavailable)?;
        self.node_mut(id).built = true;
        self.save()
    }

    /// Brings a standby to streaming from the primary: built, configured
    /// for the current primary, running; rebuilt when its data directory
    /// is missing or incomplete, or it cannot start (which covers a
    /// directory deleted after this looked at it).
    pub async fn ensure_standby(&mut self, id: &str) -> Result<(), Status> {
        let node = self.node(id).cloned().expect("known node");
        let dir = self.dir(&node);
        let stopped = !pg::running(&dir);
        if !node.built
            || (stopped && (!pg::complete(&dir) || self.may_hold_unique_writes(&node).await?))
        {
            return self.rebuild_standby(id).await;
        }
        self.ensure_slot(id).await?;
        if stopped {
            self.end_leftovers(&node).await?;
        }
        if let Err(e) = self.start(id).await {
            if e.code() == tonic::Code::DeadlineExceeded {
                return Err(e);
            }
            tracing::warn!(node = id, error = %e, "standby did not start; rebuilding it");
            return self.rebuild_standby(id).await;
        }
        Ok(())
    }

    /// Ends what a standby's killed postmaster left behind (children that
    /// have yet to notice its death, or a postmaster whose directory and
    /// pid file were deleted under it), and waits until they are gone:
    /// while they live they hold the old shared memory, which PostgreSQL
    /// refuses to start over when the new directory gets the old one's
    /// inode (its key), the old port, and the replication slot.
    async fn end_leftovers(&self, node: &NodeRecord) -> Result<(), Status> {
        let dir = self.dir(node);
        let until = Instant::now() + LEFTOVER_WAIT;
        loop {
            if pg::running(&dir) {
                return Ok(());
            }
            let left = pg::processes_in(&dir);
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(Status::unavailable(format!(
                    "processes {left:?} of {}'s previous run did not exit",
                    node.id
                )));
            }
            tracing::warn!(node = node.id, pids = ?left, "ending what a killed postmaster left behind");
            left.into_iter().for_each(pg::kill9);
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits (bounded) until no process streams from the standby's slot:
    /// the primary's WAL sender for a killed standby's WAL receiver ends
    /// only once it sees the connection close, and pg_basebackup cannot
    /// use a slot still active. Past the wait, pg_basebackup reports it.
    async fn wait_slot_released(&self, id: &str) -> Result<(), Status> {
        let primary = self.primary()?;
        let sql = format!(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = '{}' AND active",
            slot_name(id)
        );
        let until = Instant::now() + LEFTOVER_WAIT;
        while !self.query(&primary, &sql).await?.is_empty() && Instant::now() < until {
            self.check(&format!("waiting for {id}'s slot"))?;
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Names of the standbys the primary streams to.
    pub async fn streaming(&self) -> Result<Vec<String>, Status> {
        let primary = self.primary()?;
        let sql = "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'";
        let out = self.query(&primary, sql).await?;
        Ok(out.lines().map(str::to_string).collect())
    }

    /// Waits (bounded) until every standby streams; rebuilds, once, those
    /// that do not (e.g. a node whose history left the primary's).
    pub async fn settle(&mut self) -> Result<(), Status> {
        self.settle_only(None).await
    }

    /// As [`Self::settle`], for the standbys in `only` alone when given.
    pub async fn settle_only(&mut self, only: Option<&[String]>) -> Result<(), Status> {
        for rebuild in [true, false] {
            let until = Instant::now() + STREAM_WAIT;
            let mut lagging: Vec<String>;
            loop {
                let streaming = self.streaming().await?;
                lagging = self.standbys().into_iter().map(|n| n.id).collect();
                lagging.retain(|id| !streaming.contains(id));
                lagging.retain(|id| only.is_none_or(|only| only.contains(id)));
                if lagging.is_empty() {
                    return Ok(());
                }
                if Instant::now() >= until || self.deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                tokio::time::sleep(POLL).await;
            }
            if !rebuild {
                return Err(Status::unavailable(format!(
                    "standbys not streaming: {lagging:?}"
                )));
            }
            for id in lagging {
                tracing::warn!(node = id, "standby does not stream; rebuilding it");
                self.rebuild_standby(&id).await?;
            }
        }
        Ok(())
    }

    /// The node's WAL position: received (standby) or written (primary).
    pub async fn lsn(&self, node: &NodeRecord) -> Result<u64, Status> {
        self.position(node, RECEIVED).await
    }

    async fn position(&self, node: &NodeRecord, sql: &str) -> Result<u64, Status> {
        let out = self.query(node, sql).await?;
        pg::parse_lsn(&out).ok_or_else(|| Status::unavailable(format!("bad WAL position {out:?}")))
    }

    /// Points every running standby at the current primary (settings
    /// rewritten, then reloaded where they changed: primary_conninfo takes
    /// effect live).
    pub async fn repoint(&mut self) -> Result<(), Status> {
        let primary = self.primary()?;
        for node in self.standbys() {
            let dir = self.dir(&node);
            if !node.built || !pg::running(&dir) {
                continue;
            }
            self.check(&format!("re-pointing {}", node.id))?;
            self.ensure_slot(&node.id).await?;
            let offering = self.inner.offering(&self.cluster.offering)?;
            let slot = slot_name(&node.id);
            let conf = NodeConf {
                port: node.port,
                shared_buffers: &offering.shared_buffers,
                max_connections: offering.max_connections,
                follow: Some((primary.port, &slot)),
                application_name: &node.id,
                fsync: !self.inner.cfg.unsafe_no_fsync,
            };
            let pg = &self.inner.pg;
            if pg.write_conf(&dir, &conf).map_err(unavailable)? {
                let bin = self.bin(&node.version)?;
                pg.reload(&bin, &dir).await.map_err(unavailable)?;
            }
        }
        Ok(())
    }

    /// Waits until `node` has received WAL up to `lsn`.
    pub async fn wait_caught_up(&self, node: &NodeRecord, lsn: u64) -> Result<(), Status> {
        self.wait_position(node, lsn, RECEIVED, "catch up").await
    }

    /// Waits until the standby `node` has replayed WAL up to the primary's
    /// current position, so a settings change the primary logged there
    /// (e.g. a lower max_connections) is in the standby's control file,
    /// which a restart of the standby checks its own settings against.
    pub async fn wait_replayed(&self, node: &NodeRecord) -> Result<(), Status> {
        let lsn = self.position(&self.primary()?, RECEIVED).await?;
        let sql = "SELECT pg_last_wal_replay_lsn()";
        self.wait_position(node, lsn, sql, "replay the primary's WAL")
            .await
    }

    async fn wait_position(
        &self,
        node: &NodeRecord,
        lsn: u64,
        sql: &str,
        what: &str,
    ) -> Result<(), Status> {
        let until = Instant::now() + CATCH_UP_WAIT;
        loop {
            if self.position(node, sql).await? >= lsn {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(Status::unavailable(format!("{} did not {what}", node.id)));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The replication slot of a standby (slot names allow [a-z0-9_]).
pub fn slot_name(id: &str) -> String {
    id.replace('-', "_")
}

/// Whether a rebuild whose start failed with `e` starts over: only when
/// its new directory `dir` was deleted (wholly or in part) meanwhile.
fn retry_rebuild(e: &Status, dir: &std::path::Path) -> bool {
    e.code() != tonic::Code::DeadlineExceeded && !pg::complete(dir)
}

pub fn remove_dir(dir: &std::path::Path) -> Result<(), Status> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(unavailable(format!("removing {}: {e}", dir.display())))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rebuild starts over only when its directory went (wholly or in
    /// part) while it started, and never past the call's deadline.
    #[test]
    fn a_rebuild_starts_over_only_when_its_directory_went() {
        let dir = std::env::temp_dir().join(format!("drover-retry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let failed = Status::unavailable("pg_ctl start failed");
        assert!(retry_rebuild(&failed, &dir), "no directory");
        std::fs::create_dir_all(dir.join("global")).unwrap();
        std::fs::write(dir.join("global/pg_control"), "").unwrap();
        assert!(retry_rebuild(&failed, &dir), "no PG_VERSION");
        std::fs::write(dir.join("PG_VERSION"), "15\n").unwrap();
        assert!(!retry_rebuild(&failed, &dir), "a whole directory");
        std::fs::remove_dir_all(&dir).unwrap();
        let late = Status::deadline_exceeded("deadline reached");
        assert!(!retry_rebuild(&late, &dir), "past the deadline");
    }
}
