//! Describes a cluster as its processes show it, never as the record
//! says it should be: a node is on when its postmaster runs, and healthy
//! when it answers a query in its role (the primary not in recovery, a
//! standby in recovery and streaming from the current primary). While the
//! primary does not answer, a standby that answers in recovery is healthy
//! (its `replication` fact says it waits for the primary): the fault is
//! the primary's, which alone is reported unhealthy, so Drover's
//! remediation names it instead of short-circuiting on every node.

use crate::pg;
use crate::store::{ClusterRecord, NodeRecord, Role};
use crate::Inner;
use drover_proto::provider::v1 as pb;
use std::collections::HashMap;
use tonic::Status;

/// What the primary says about one standby: state and lag in bytes.
struct Replica {
    state: String,
    lag: String,
}

pub async fn nodes(
    inner: &Inner,
    cluster: &ClusterRecord,
) -> Result<Vec<pb::ProviderNode>, Status> {
    let primary = cluster.primary();
    let replicas = match primary {
        Some(p) => replicas(inner, cluster, p).await,
        None => None,
    };
    let mut out = Vec::new();
    for node in &cluster.nodes {
        out.push(node_of(inner, cluster, node, primary, &replicas).await);
    }
    Ok(out)
}

/// What the primary says of its standbys; `None` when it does not run or
/// does not answer.
async fn replicas(
    inner: &Inner,
    cluster: &ClusterRecord,
    primary: &NodeRecord,
) -> Option<HashMap<String, Replica>> {
    if !primary.built || !pg::running(&inner.node_dir(&cluster.uid, &primary.id)) {
        return None;
    }
    let sql = "SELECT application_name, state, \
               COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0)::bigint \
               FROM pg_stat_replication WHERE NOT pg_is_in_recovery()";
    let out = query(inner, primary, sql).await.ok()?;
    let replicas = out
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('|').collect();
            let replica = Replica {
                state: f.get(1)?.to_string(),
                lag: f.get(2)?.to_string(),
            };
            Some((f.first()?.to_string(), replica))
        })
        .collect();
    Some(replicas)
}

async fn query(inner: &Inner, node: &NodeRecord, sql: &str) -> Result<String, Status> {
    let bin = inner
        .cfg
        .versions
        .get(&node.version)
        .ok_or_else(|| Status::failed_precondition("version not configured"))?;
    inner
        .pg
        .query(bin, node.port, "postgres", sql)
        .await
        .map_err(crate::ops::unavailable)
}

async fn node_of(
    inner: &Inner,
    cluster: &ClusterRecord,
    node: &NodeRecord,
    primary: Option<&NodeRecord>,
    replicas: &Option<HashMap<String, Replica>>,
) -> pb::ProviderNode {
    let dir = inner.node_dir(&cluster.uid, &node.id);
    let on = node.built && pg::running(&dir);
    let in_recovery = match on {
        true => query(inner, node, "SELECT pg_is_in_recovery()").await.ok(),
        false => None,
    };
    let (healthy, replication) = match (node.role, in_recovery.as_deref()) {
        (_, None) => (false, "down".to_string()),
        (Role::Primary, Some("f")) => {
            let mut names: Vec<&String> = replicas.iter().flat_map(|r| r.keys()).collect();
            names.sort();
            (true, format!("primary; standbys connected: {names:?}"))
        }
        (Role::Standby, Some("t")) => match replicas.as_ref().map(|r| r.get(&node.id)) {
            None => {
                let from = primary.map(|p| p.id.as_str()).unwrap_or("?");
                (
                    true,
                    format!("waiting for the primary {from}, which does not answer"),
                )
            }
            Some(Some(r)) => {
                let from = primary.map(|p| p.id.as_str()).unwrap_or("?");
                let text = format!("{} from {from}, lag {} bytes", r.state, r.lag);
                (r.state == "streaming", text)
            }
            Some(None) => (false, "not connected to the primary".to_string()),
        },
        (_, Some(other)) => (false, format!("wrong role: in recovery = {other}")),
    };
    let mut facts = HashMap::from([
        ("address".to_string(), format!("127.0.0.1:{}", node.port)),
        ("data_dir".to_string(), dir.display().to_string()),
        ("replication".to_string(), replication),
    ]);
    let kept = crate::roles::kept_dirs(&inner.cluster_dir(&cluster.uid), &node.id);
    if !kept.is_empty() {
        facts.insert("kept".to_string(), kept.join(","));
    }
    pb::ProviderNode {
        id: node.id.clone(),
        role: match node.role {
            Role::Primary => "control",
            Role::Standby => "worker",
        }
        .to_string(),
        power_state: if on { "on" } else { "off" }.to_string(),
        version: node.version.clone(),
        healthy,
        offering: node.offering.clone(),
        facts,
    }
}
