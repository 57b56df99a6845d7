//! Automatic remediation end to end on real PostgreSQL, through Drover,
//! without a person: a real etcd, replica processes scanning every second,
//! the PostgreSQL provider process and the postgres processes it runs. A
//! fault is made (the primary killed; a standby's data directory deleted)
//! and the test calls nothing after it: Drover sees the node not ready
//! (Alert), remediates it past `spec.health.unhealthy_timeout_seconds` with
//! a Recover naming it (RepairNodes for that node, then the health check),
//! and the cluster is back to Running, checked on the databases
//! themselves: one writable node, every node ready and streaming, the rows
//! on every node.

use drover_client::v1::{self, ClusterState as S, OperationKind as K};
use drover_tests::postgres::{
    address, data_dir, kill_postmaster, one_primary_all_ready, postmaster_pid, primary, psql,
    rows_everywhere, writable, PgDeployment, WritableSampler, V1,
};
use drover_tests::{operations_of, wait_for_state, wait_until};
use std::time::{Duration, Instant};

/// Detection (a scan, the timeout) and one remediation, a standby rebuilt
/// included, end well within this.
const HEAL: Duration = Duration::from_secs(180);
const ROWS: u32 = 100;

/// Two replicas in front of the PostgreSQL provider, scanning every second.
async fn deployment() -> PgDeployment {
    PgDeployment::start(&["pgh-r1", "pgh-r2"]).await
}

/// Creates `pg` (1 primary, 2 standbys) remediated 2 s after a node stops
/// being ready, writes [`ROWS`] rows, and waits until every node has them.
async fn create(d: &mut PgDeployment) -> Vec<v1::Node> {
    let request = v1::CreateClusterRequest {
        name: "pg".into(),
        spec: Some(v1::ClusterSpec {
            version: V1.into(),
            control_nodes: 1,
            worker_nodes: 2,
            node_offering: "small".into(),
            health: Some(v1::HealthPolicy {
                unhealthy_timeout_seconds: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = d.client.clusters().create_cluster(request).await;
    let start = created.expect("create").into_inner().operation;
    d.succeeds(start.expect("a start")).await;
    let nodes = d.nodes().await;
    assert_eq!(nodes.len(), 3, "{nodes:#?}");
    assert!(nodes.iter().all(|n| n.ready), "{nodes:#?}");
    let sql = format!(
        "CREATE TABLE items (id int PRIMARY KEY, name text); \
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, {ROWS}) g"
    );
    psql(&address(&primary(&nodes)), &sql).expect("write rows");
    rows_everywhere(&nodes, ROWS).await;
    nodes
}

/// Recover operations Drover's remediation started (its request ids).
fn remediations(ops: &[v1::Operation]) -> Vec<v1::Operation> {
    ops.iter()
        .filter(|op| op.kind == K::Recover as i32 && op.request_id.starts_with("remediation-"))
        .cloned()
        .collect()
}

/// Waits, calling nothing but reads, for the fault on `node` to be seen
/// (Alert) and remediated: a Recover naming it, started by Drover, ends
/// succeeded and the cluster runs with 1 primary and 2 standbys, all
/// ready. Returns the remediation and the nodes.
async fn healed_by_drover(d: &mut PgDeployment, node: &str) -> (v1::Operation, Vec<v1::Node>) {
    wait_for_state(&d.client, "pg", S::Alert, Duration::from_secs(60)).await;
    let client = d.client.clone();
    let what = format!("a remediation naming {node}");
    wait_until(Duration::from_secs(60), &what, || {
        let client = client.clone();
        async move {
            let ops = operations_of(&client, "pg").await;
            remediations(&ops)
                .iter()
                .any(|op| op.params.as_ref().is_some_and(|p| p.node_ids == [node]))
        }
    })
    .await;
    let ops = operations_of(&d.client, "pg").await;
    let ours = remediations(&ops);
    assert_eq!(ours.len(), 1, "one remediation: {ours:#?}");
    let done = d.client.wait_operation(&ours[0], HEAL).await.expect("wait");
    assert_eq!(
        done.state,
        v1::OperationState::Succeeded as i32,
        "{done:#?}"
    );
    wait_for_state(&d.client, "pg", S::Running, Duration::from_secs(60)).await;
    d.wait_for_nodes(
        "1 primary, 2 standbys, all ready",
        Duration::from_secs(30),
        |nodes| one_primary_all_ready(nodes, 2),
    )
    .await;
    // Nothing but the one remediation: no other Recover, by anyone.
    let ops = operations_of(&d.client, "pg").await;
    let recovers: Vec<_> = ops
        .iter()
        .filter(|op| op.kind == K::Recover as i32)
        .collect();
    assert_eq!(recovers.len(), 1, "{recovers:#?}");
    (done, d.nodes().await)
}

/// A write on the primary reaches every node: the standbys stream from it.
async fn one_more_row(nodes: &[v1::Node]) {
    let sql = format!("INSERT INTO items VALUES ({}, 'after')", ROWS + 1);
    psql(&address(&primary(nodes)), &sql).expect("write on the primary");
    rows_everywhere(nodes, ROWS + 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_is_failed_over_and_rebuilt_by_drover_alone() {
    let mut d = deployment().await;
    let before = create(&mut d).await;
    let old = primary(&before);
    let standbys: Vec<String> = before
        .iter()
        .filter(|n| n.role == "worker")
        .map(|n| n.id.clone())
        .collect();
    let sampler = WritableSampler::start(&before);
    let killed_at = Instant::now();
    kill_postmaster(&old);

    let (done, after) = healed_by_drover(&mut d, &old.id).await;
    let healed_in = killed_at.elapsed();
    let (most, samples) = sampler.finish().await;
    assert!(most.len() <= 1, "two writable nodes at once: {most:?}");
    assert!(samples > 10, "the sampler ran ({samples} samples)");

    let new = primary(&after);
    assert!(
        standbys.contains(&new.id),
        "a standby was promoted: {after:#?}"
    );
    assert_eq!(writable(&after), vec![new.id.clone()]);
    let rebuilt = after
        .iter()
        .find(|n| n.id == old.id)
        .expect("the old primary");
    assert_eq!(rebuilt.role, "worker", "rebuilt as a standby: {rebuilt:#?}");
    assert!(rebuilt.ready, "{rebuilt:#?}");
    // Its old data directory, which may hold writes the others never got,
    // is kept aside for an operator, not deleted.
    assert!(rebuilt.facts.contains_key("kept"), "{rebuilt:#?}");
    rows_everywhere(&after, ROWS).await;
    one_more_row(&after).await;
    eprintln!(
        "killed primary {} remediated by {} (node_ids {:?}): {} promoted, {} rebuilt, \
         Running again {healed_in:?} after the kill; at most {} writable in {samples} samples",
        old.id,
        done.id,
        done.params.unwrap_or_default().node_ids,
        new.id,
        old.id,
        most.len(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_whose_data_directory_is_gone_is_rebuilt_by_drover_alone() {
    let mut d = deployment().await;
    let before = create(&mut d).await;
    let standby = before
        .iter()
        .find(|n| n.role == "worker")
        .expect("a standby")
        .clone();
    let others: Vec<(String, Option<u32>)> = before
        .iter()
        .filter(|n| n.id != standby.id)
        .map(|n| (n.id.clone(), postmaster_pid(n)))
        .collect();
    let dir = data_dir(&standby);
    let killed_at = Instant::now();
    kill_postmaster(&standby);
    std::fs::remove_dir_all(&dir).expect("delete the standby's data directory");

    let (done, after) = healed_by_drover(&mut d, &standby.id).await;
    let healed_in = killed_at.elapsed();
    let rebuilt = after
        .iter()
        .find(|n| n.id == standby.id)
        .expect("the standby");
    assert_eq!(rebuilt.role, "worker", "{rebuilt:#?}");
    assert!(rebuilt.ready, "{rebuilt:#?}");
    assert!(
        dir.join("PG_VERSION").exists(),
        "its data directory is back"
    );
    assert_eq!(primary(&after).id, primary(&before).id, "no failover");
    assert_eq!(writable(&after), vec![primary(&after).id]);
    // RepairNodes named the standby alone: the other nodes run on, the
    // same processes as before.
    for (id, pid) in &others {
        let node = after.iter().find(|n| &n.id == id).expect("the node");
        assert_eq!(&postmaster_pid(node), pid, "{id} was left alone");
    }
    rows_everywhere(&after, ROWS).await;
    one_more_row(&after).await;
    eprintln!(
        "standby {} without its data directory remediated by {}: rebuilt, Running again \
         {healed_in:?} after the fault",
        standby.id, done.id,
    );
}
