//! Roles as the nodes show them, and the promotion that moves the primary
//! role: decided and committed before `pg_ctl promote` runs, and finished
//! or dropped, from what the nodes show, by the next call after a crash.
//!
//! # Guarantees
//! - At most one node accepts writes. A promotion is committed to the
//!   store before its node is asked to promote, and the roles swap in the
//!   commit that clears it. A call that finds one open, before it starts
//!   or rebuilds anything, finishes it when its node runs or last ran as a
//!   primary, and drops it only when that node never left recovery and
//!   does not run (its `promote.signal` removed, so it cannot promote
//!   later). A primary is started only while no other node runs as one,
//!   nor last ran as one on a newer timeline.
//! - Every call compares each running node's role (its control file, which
//!   says "in production" from just before the node takes writes) with the
//!   record before it acts, and refuses (FAILED_PRECONDITION,
//!   naming the node and both roles) when they differ.
//! - A data directory whose timeline may hold writes the primary lacks
//!   (it last ran as a primary, and did not stop cleanly before the point
//!   where the primary's history forked from its timeline) is never
//!   deleted, nor started as a standby: a rebuild moves it aside
//!   (`<node>.kept-<unix seconds>` in the cluster's directory), where an
//!   operator can read its rows; describe names it in the node's `kept`
//!   fact.
//!
//! # Assumptions
//! - Only this provider starts, stops and promotes the nodes.
//!
//! # Caveats
//! - Replication is asynchronous: a repair after a primary's crash
//!   promotes the most caught-up standby, and commits the old primary had
//!   not sent reach the final primary only if an operator replays them
//!   from the kept directory.

use crate::ops::{remove_dir, unavailable, Ctx};
use crate::pg::{self, Control};
use crate::store::{NodeRecord, Promotion, Role};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::Status;

/// How long a promotion may take once asked for.
const PROMOTE_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

fn name(role: Role) -> &'static str {
    match role {
        Role::Primary => "primary",
        Role::Standby => "standby",
    }
}

impl Ctx<'_> {
    /// Aborts the process here when the configuration names this step, as
    /// a crash at it would (the tests' fault injection).
    pub fn fault_point(&self, step: &str) {
        if self.inner.cfg.fault_point.as_deref() == Some(step) {
            tracing::error!(step, "fault point reached: aborting");
            std::process::abort();
        }
    }

    pub async fn control(&self, node: &NodeRecord) -> Result<Control, Status> {
        let bin = self.bin(&node.version)?;
        let pg = &self.inner.pg;
        pg.control(&bin, &self.dir(node)).await.map_err(unavailable)
    }

    /// The role a node shows while it runs; None when it does not run.
    /// Read from its control file, not asked with `pg_is_in_recovery()`:
    /// the server rewrites the file as it leaves recovery, just before it
    /// takes writes, and a node that hangs cannot hang a file read.
    pub async fn running_role(&self, node: &NodeRecord) -> Result<Option<Role>, Status> {
        if !pg::running(&self.dir(node)) {
            return Ok(None);
        }
        Ok(Some(match self.control(node).await?.was_primary() {
            true => Role::Primary,
            false => Role::Standby,
        }))
    }

    /// Finishes or drops a promotion a crash left open, then compares every
    /// running node's role with the record: before a call starts, stops or
    /// rebuilds anything.
    pub async fn reconcile_roles(&mut self) -> Result<(), Status> {
        if let Some(promotion) = self.cluster.promotion.clone() {
            self.resolve_promotion(&promotion).await?;
        }
        for node in &self.cluster.nodes {
            let Some(actual) = self.running_role(node).await? else {
                continue;
            };
            if actual != node.role {
                return Err(Status::failed_precondition(format!(
                    "node {} runs as a {} but the record has it a {}: refusing to start, \
                     stop or rebuild anything until they agree",
                    node.id,
                    name(actual),
                    name(node.role)
                )));
            }
        }
        Ok(())
    }

    async fn resolve_promotion(&mut self, p: &Promotion) -> Result<(), Status> {
        let node = self
            .node(&p.new)
            .cloned()
            .expect("a node named by the record");
        let dir = self.dir(&node);
        if pg::running(&dir) || self.control(&node).await?.was_primary() {
            tracing::warn!(
                old = p.old,
                new = p.new,
                kind = p.kind,
                "finishing a promotion a crash left open"
            );
            self.finish_promotion().await?;
            return self.repoint().await;
        }
        tracing::warn!(
            old = p.old,
            new = p.new,
            kind = p.kind,
            "dropping a promotion that never happened"
        );
        match std::fs::remove_file(dir.join("promote.signal")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(unavailable(e)),
            _ => {}
        }
        self.cluster.promotion = None;
        self.save()
    }

    /// Moves the primary role to the standby `id`: the decision committed
    /// first, then the promotion, then the roles (see the module's docs).
    /// `kind` names the fault points (`<kind>.intent`, `.signalled`,
    /// `.promoted`, `.recorded`).
    pub async fn promote(&mut self, id: &str, rebuild_old: bool, kind: &str) -> Result<(), Status> {
        self.check(&format!("promoting {id}"))?;
        self.cluster.promotion = Some(Promotion {
            old: self.primary()?.id,
            new: id.to_string(),
            rebuild_old,
            kind: kind.to_string(),
        });
        self.save()?;
        self.fault_point(&format!("{kind}.intent"));
        self.finish_promotion().await
    }

    async fn finish_promotion(&mut self) -> Result<(), Status> {
        let p = self.cluster.promotion.clone().expect("an open promotion");
        let node = self
            .node(&p.new)
            .cloned()
            .expect("a node named by the record");
        match self.running_role(&node).await? {
            Some(Role::Standby) => {
                self.check(&format!("promoting {}", node.id))?;
                let bin = self.bin(&node.version)?;
                let pg = &self.inner.pg;
                pg.request_promotion(&bin, &self.dir(&node))
                    .await
                    .map_err(unavailable)?;
                self.fault_point(&format!("{}.signalled", p.kind));
                self.wait_promoted(&node).await?;
            }
            Some(Role::Primary) => {}
            None if self.control(&node).await?.was_primary() => {}
            None => {
                return Err(Status::unavailable(format!(
                    "{} stopped before its promotion; the next call drops the promotion",
                    node.id
                )))
            }
        }
        self.fault_point(&format!("{}.promoted", p.kind));
        let old = self.node_mut(&p.old);
        old.role = Role::Standby;
        old.built &= !p.rebuild_old;
        self.node_mut(&p.new).role = Role::Primary;
        self.cluster.promotion = None;
        self.save()?;
        self.fault_point(&format!("{}.recorded", p.kind));
        Ok(())
    }

    async fn wait_promoted(&self, node: &NodeRecord) -> Result<(), Status> {
        let until = Instant::now() + PROMOTE_WAIT;
        loop {
            match self.running_role(node).await? {
                Some(Role::Primary) => return Ok(()),
                Some(Role::Standby) => {}
                None => {
                    return Err(Status::unavailable(format!(
                        "{} stopped while it promoted",
                        node.id
                    )))
                }
            }
            self.check(&format!("{} finishing its promotion", node.id))?;
            if Instant::now() >= until {
                return Err(Status::unavailable(format!(
                    "{} did not finish its promotion; a repeated call waits again",
                    node.id
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Refuses to start `id` as the primary while another node runs as
    /// one, or last ran as one on a newer timeline than `id` knows.
    pub async fn refuse_second_primary(&self, id: &str) -> Result<(), Status> {
        let me = self.node(id).cloned().expect("a node named by the record");
        let mine = self.timeline(&me).await?;
        for other in self.cluster.nodes.iter().filter(|n| n.id != id && n.built) {
            let why = match self.running_role(other).await? {
                Some(Role::Primary) => "runs as a primary",
                Some(Role::Standby) => continue,
                None => match self.control(other).await {
                    Ok(c) if c.was_primary() && self.timeline(other).await? > mine => {
                        "last ran as a primary on a newer timeline"
                    }
                    _ => continue,
                },
            };
            return Err(Status::failed_precondition(format!(
                "not starting {id} as the primary: {} {why}",
                other.id
            )));
        }
        Ok(())
    }

    /// The newest timeline the node's data directory knows of.
    async fn timeline(&self, node: &NodeRecord) -> Result<u32, Status> {
        let control = self.control(node).await?.timeline;
        Ok(control.max(pg::history(&self.dir(node)).timeline))
    }

    /// Whether the node's data directory may hold writes the primary
    /// lacks (see the module's docs). A directory without a control file,
    /// or a base backup that never started (its `backup_label` is still
    /// there), holds none; one whose control file cannot be read may.
    pub async fn may_hold_unique_writes(&self, node: &NodeRecord) -> Result<bool, Status> {
        let dir = self.dir(node);
        if !dir.join("global/pg_control").exists() || dir.join("backup_label").exists() {
            return Ok(false);
        }
        let Ok(control) = self.control(node).await else {
            return Ok(true);
        };
        if !control.was_primary() {
            return Ok(false);
        }
        let primary = self.primary()?;
        if primary.id == node.id {
            return Ok(false);
        }
        if !control.shut_down_cleanly() {
            return Ok(true);
        }
        let forks = pg::history(&self.dir(&primary)).forks;
        let fork = forks.get(&control.timeline);
        Ok(fork.is_none_or(|fork| control.checkpoint_lsn >= *fork))
    }

    /// Empties the node's place for a rebuild: its data directory deleted,
    /// or moved aside when it may hold writes the primary lacks.
    pub async fn clear_data_dir(&self, node: &NodeRecord) -> Result<(), Status> {
        let dir = self.dir(node);
        if !self.may_hold_unique_writes(node).await? {
            return remove_dir(&dir);
        }
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let kept = self.kept_dir(node, secs);
        std::fs::rename(&dir, &kept)
            .map_err(|e| unavailable(format!("moving {} aside: {e}", dir.display())))?;
        tracing::warn!(
            node = node.id,
            kept = %kept.display(),
            "the node's data may hold writes the primary lacks: kept aside, not deleted"
        );
        Ok(())
    }

    fn kept_dir(&self, node: &NodeRecord, secs: u64) -> PathBuf {
        let cluster = self.inner.cluster_dir(&self.cluster.uid);
        cluster.join(format!("{}.kept-{secs}", node.id))
    }
}

/// The directories kept aside for node `id` under `cluster_dir`.
pub fn kept_dirs(cluster_dir: &std::path::Path, id: &str) -> Vec<String> {
    let prefix = format!("{id}.kept-");
    let mut kept: Vec<String> = std::fs::read_dir(cluster_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    kept.sort();
    kept
}
