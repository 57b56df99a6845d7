//! The calls, as sequences of the steps in [`crate::ops`]: each converges
//! on the same end state when repeated, from wherever it was cut short.

use crate::ops::{remove_dir, Ctx};
use crate::pg;
use crate::store::{NodeRecord, Role};
use tonic::Status;

/// Adds node records (no processes yet) until the cluster has `workers`
/// standbys, each with a free port; a primary first if it has none. Each
/// is at [`ClusterRecord::join_version`](crate::store::ClusterRecord::join_version):
/// the primary's, not necessarily the version the cluster was created at.
pub fn add_nodes(ctx: &mut Ctx<'_>, workers: u32) -> Result<(), Status> {
    let want_primary = ctx.cluster.primary().is_none();
    let have = ctx.standbys().len() as u32;
    let roles = want_primary
        .then_some(Role::Primary)
        .into_iter()
        .chain((have..workers).map(|_| Role::Standby));
    for role in roles.collect::<Vec<_>>() {
        let version = ctx.cluster.join_version();
        let port = ctx.inner.free_port()?;
        let id = format!("pg-{}", ctx.cluster.next_index);
        ctx.cluster.next_index += 1;
        ctx.cluster.nodes.push(NodeRecord {
            id,
            port,
            role,
            version,
            offering: ctx.cluster.offering.clone(),
            built: false,
        });
        // Saved one by one, so the port is taken before anything else.
        ctx.save()?;
    }
    Ok(())
}

/// Every node built and running, the standbys streaming.
pub async fn converge(ctx: &mut Ctx<'_>) -> Result<(), Status> {
    ctx.cluster.stopped = false;
    ctx.save()?;
    ctx.build_primary().await?;
    let primary = ctx.primary()?.id;
    ctx.start(&primary).await?;
    // Standbys left following another node (a switchover cut short).
    ctx.repoint().await?;
    for node in ctx.standbys() {
        ctx.ensure_standby(&node.id).await?;
    }
    ctx.settle().await
}

/// Stops every node cleanly, the primary first (its shutdown checkpoint
/// then reaches the standbys before they stop).
pub async fn stop_all(ctx: &mut Ctx<'_>) -> Result<(), Status> {
    ctx.cluster.stopped = true;
    ctx.save()?;
    let primary = ctx.primary()?.id;
    ctx.stop(&primary).await?;
    for node in ctx.standbys() {
        ctx.stop(&node.id).await?;
    }
    Ok(())
}

/// Removes a standby: stopped, its slot dropped, its directory deleted,
/// its port free (it leaves the record last, so a repeat finishes it).
pub async fn remove_standby(ctx: &mut Ctx<'_>, id: &str) -> Result<(), Status> {
    ctx.stop(id).await?;
    ctx.check(&format!("removing {id}"))?;
    let primary = ctx.primary()?;
    if pg::running(&ctx.dir(&primary)) {
        ctx.drop_slot(id).await?;
    }
    let node = ctx.node(id).cloned().expect("known node");
    remove_dir(&ctx.dir(&node))?;
    ctx.cluster.nodes.retain(|n| n.id != id);
    ctx.save()
}

/// Destroys the cluster: no process, no directory, no record left. A node
/// that does not stop cleanly is killed.
pub async fn destroy(ctx: &mut Ctx<'_>) -> Result<(), Status> {
    for node in ctx.cluster.nodes.clone() {
        if ctx.stop(&node.id).await.is_err() {
            if let Some(pid) = pg::pid(&ctx.dir(&node)) {
                pg::kill9(pid);
            }
        }
    }
    ctx.check("removing the cluster's directories")?;
    remove_dir(&ctx.inner.cluster_dir(&ctx.cluster.uid))?;
    for node in &ctx.cluster.nodes {
        let _ = std::fs::remove_file(ctx.inner.log_path(&ctx.cluster.uid, &node.id));
    }
    ctx.inner.store.remove_cluster(&ctx.cluster.uid)?;
    ctx.cluster.nodes.clear();
    Ok(())
}

/// Scales to `workers` standbys and/or applies a new offering. A hot
/// standby refuses to start with a lower max_connections than its primary
/// runs with, so the offering reaches the nodes that run before any new
/// standby is made (which then starts on it), in the order
/// [`apply_offering`] keeps.
pub async fn resize(
    ctx: &mut Ctx<'_>,
    workers: Option<u32>,
    offering: Option<String>,
) -> Result<(), Status> {
    if let Some(workers) = workers {
        let mut standbys = ctx.standbys();
        standbys.sort_by_key(|n| node_index(&n.id));
        for node in standbys.iter().skip(workers as usize).rev() {
            remove_standby(ctx, &node.id).await?;
        }
    }
    if let Some(offering) = offering {
        ctx.cluster.offering = offering;
        ctx.save()?;
    }
    apply_offering(ctx).await?;
    if let Some(workers) = workers {
        add_nodes(ctx, workers)?;
    }
    converge(ctx).await
}

/// Restarts every running node whose settings are of another offering
/// than the cluster's. A hot standby refuses to start below the settings
/// its control file holds from the primary, so when max_connections
/// shrinks the primary restarts first and each standby restarts only once
/// it has replayed the primary's change; when it grows, the standbys
/// restart first. A stopped node starts on the new offering when the call
/// converges (a standby that cannot is rebuilt there).
async fn apply_offering(ctx: &mut Ctx<'_>) -> Result<(), Status> {
    // A primary that is down starts on the new offering (the call starts
    // the cluster anyway): the standbys then have its WAL to replay.
    let primary = ctx.primary()?;
    if primary.built {
        ctx.start(&primary.id).await?;
    }
    let new = ctx.inner.offering(&ctx.cluster.offering)?;
    let mut stale: Vec<NodeRecord> = ctx.cluster.nodes.clone();
    stale.retain(|n| n.built && n.offering != ctx.cluster.offering && pg::running(&ctx.dir(n)));
    let primary_first = stale.iter().any(|n| {
        ctx.inner
            .offering(&n.offering)
            .is_ok_and(|old| old.max_connections > new.max_connections)
    });
    stale.sort_by_key(|n| (n.role == Role::Primary) != primary_first);
    for node in stale {
        if primary_first && node.role == Role::Standby {
            ctx.wait_replayed(&node).await?;
        }
        ctx.stop(&node.id).await?;
        ctx.start(&node.id).await?;
    }
    Ok(())
}

fn node_index(id: &str) -> u32 {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Upgrades one node to `version`: a standby restarts on its binaries; the
/// primary switches over to a caught-up standby first and then rejoins as
/// a standby on them.
pub async fn upgrade(ctx: &mut Ctx<'_>, id: &str, version: &str) -> Result<(), Status> {
    let node = ctx
        .node(id)
        .cloned()
        .ok_or_else(|| Status::not_found(format!("node_id: node {id} is not in the cluster")))?;
    converge_if_down(ctx).await?;
    if node.version == version {
        return Ok(());
    }
    if node.role == Role::Primary && !ctx.standbys().is_empty() {
        switchover(ctx, version).await?;
    }
    ctx.stop(id).await?;
    ctx.check(&format!("upgrading {id}"))?;
    ctx.cluster
        .nodes
        .iter_mut()
        .filter(|n| n.id == id)
        .for_each(|n| n.version = version.to_string());
    ctx.cluster.version = ctx.cluster.join_version();
    ctx.save()?;
    converge(ctx).await
}

/// Brings a stopped or broken cluster up before an upgrade acts on it.
async fn converge_if_down(ctx: &mut Ctx<'_>) -> Result<(), Status> {
    let all_up = ctx
        .cluster
        .nodes
        .iter()
        .all(|n| n.built && pg::running(&ctx.dir(n)));
    if all_up {
        return Ok(());
    }
    converge(ctx).await
}

/// Moves the primary role to a caught-up standby (one already at `version`
/// preferred): the primary stops cleanly, the candidate receives all of
/// its WAL, is promoted, and the others follow it. The old primary stays
/// stopped, a standby now, for the caller to restart.
async fn switchover(ctx: &mut Ctx<'_>, version: &str) -> Result<(), Status> {
    let old = ctx.primary()?;
    let streaming = ctx.streaming().await?;
    let mut candidates = ctx.standbys();
    candidates.retain(|n| streaming.contains(&n.id));
    candidates.sort_by_key(|n| (n.version != version, node_index(&n.id)));
    let candidate = candidates
        .into_iter()
        .next()
        .ok_or_else(|| Status::unavailable("no streaming standby to switch over to"))?;
    ctx.stop(&old.id).await?;
    ctx.fault_point("switchover.old_stopped");
    let lsn = ctx.control(&old).await?.checkpoint_lsn;
    ctx.wait_caught_up(&candidate, lsn).await?;
    ctx.fault_point("switchover.caught_up");
    ctx.promote(&candidate.id, false, "switchover").await?;
    ctx.repoint().await?;
    ctx.fault_point("switchover.repointed");
    Ok(())
}

/// Repairs the nodes `ids` names (RepairNodes' `node_ids`; empty: every
/// node that needs it). A repair of the primary, or one made while the
/// primary is down (a standby cannot stream without it), is the whole
/// cluster's: what is down restarts; when the primary is down and a
/// standby runs, the most caught-up standby is promoted and the old
/// primary rebuilt as a standby (it may hold WAL the others never got, so
/// it cannot follow). With the primary up and only standbys named, each
/// of those is brought back to streaming (restarted, or rebuilt when it
/// cannot restart or its data directory is gone) and the other nodes are
/// left as they are. Names of nodes no longer in the cluster are skipped.
pub async fn repair(ctx: &mut Ctx<'_>, ids: &[String]) -> Result<(), Status> {
    let primary = ctx.primary()?;
    let primary_up = primary.built && pg::running(&ctx.dir(&primary));
    let named: Vec<String> = ids
        .iter()
        .filter(|id| ctx.node(id).is_some())
        .cloned()
        .collect();
    if primary_up && !ids.is_empty() && !named.contains(&primary.id) {
        for id in &named {
            ctx.ensure_standby(id).await?;
        }
        return ctx.settle_only(Some(&named)).await;
    }
    repair_all(ctx).await
}

async fn repair_all(ctx: &mut Ctx<'_>) -> Result<(), Status> {
    let primary = ctx.primary()?;
    let primary_down = primary.built && !pg::running(&ctx.dir(&primary));
    if primary_down {
        let mut best: Option<(u64, String)> = None;
        for node in ctx.standbys() {
            if !node.built || !pg::running(&ctx.dir(&node)) {
                continue;
            }
            if let Ok(lsn) = ctx.lsn(&node).await {
                if best.as_ref().is_none_or(|(b, _)| lsn > *b) {
                    best = Some((lsn, node.id.clone()));
                }
            }
        }
        if let Some((_, id)) = best {
            tracing::warn!(
                old = primary.id,
                new = id,
                "primary down: promoting a standby"
            );
            ctx.promote(&id, true, "repair").await?;
            ctx.repoint().await?;
            ctx.fault_point("repair.repointed");
        }
    }
    converge(ctx).await
}

/// The cluster's nodes as they are: process, role, replication.
pub async fn describe(
    inner: &crate::Inner,
    uid: &str,
) -> Result<Vec<drover_proto::provider::v1::ProviderNode>, Status> {
    let Some(cluster) = inner.store.cluster(uid)? else {
        return Ok(Vec::new());
    };
    crate::describe::nodes(inner, &cluster).await
}
