//! A fleet rollout on real PostgreSQL, through Drover: three clusters
//! labelled alike, a canary stage of one behind an approval gate, then the
//! rest two at a time. The databases are the witness: the rows written
//! before are on every node after, and no cluster ever has two nodes
//! taking writes (sampled every 100 ms).

use drover_client::v1;
use drover_tests::postgres::{address, psql, writable, PgDeployment, V1, V2};
use drover_tests::wait_until;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const ROWS: u32 = 50;
const CLUSTERS: [&str; 3] = ["pg-a", "pg-b", "pg-c"];

async fn create(d: &mut PgDeployment, name: &str, canary: bool) -> Vec<v1::Node> {
    let mut labels = BTreeMap::from([("fleet".to_string(), "pg".to_string())]);
    if canary {
        labels.insert("ring".into(), "0".into());
    }
    let request = v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(v1::ClusterSpec {
            version: V1.into(),
            control_nodes: 1,
            worker_nodes: 1,
            node_offering: "small".into(),
            labels: labels.into_iter().collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = d.client.clusters().create_cluster(request).await;
    let start = created
        .expect("create")
        .into_inner()
        .operation
        .expect("a start");
    let done = d
        .client
        .wait_operation(&start, Duration::from_secs(180))
        .await;
    assert_eq!(
        done.expect("wait").state,
        v1::OperationState::Succeeded as i32
    );
    nodes_of(d, name).await
}

async fn nodes_of(d: &mut PgDeployment, name: &str) -> Vec<v1::Node> {
    let cluster = d.client.get_cluster(name).await.expect("get");
    cluster.status.unwrap_or_default().nodes
}

/// Writes the rows through the cluster's primary.
fn write_rows(nodes: &[v1::Node]) {
    let primary = nodes
        .iter()
        .find(|n| n.role == "control")
        .expect("a primary");
    let sql = format!(
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, {ROWS})"
    );
    psql(&address(primary), &sql).expect("rows written");
}

/// Polls until every node of every cluster serves the rows.
async fn rows_everywhere(clusters: &BTreeMap<String, Vec<v1::Node>>) {
    for node in clusters.values().flatten() {
        wait_until(Duration::from_secs(60), "the rows on every node", || {
            let rows = psql(&address(node), "SELECT count(*) FROM items");
            std::future::ready(rows == Ok(ROWS.to_string()))
        })
        .await;
    }
}

/// Samples, every 100 ms until stopped, how many nodes of each cluster
/// take writes; the most seen for any cluster.
fn sample_writable(
    clusters: BTreeMap<String, Vec<v1::Node>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut most = 0;
        while !stop.load(Ordering::Relaxed) {
            for nodes in clusters.values() {
                most = most.max(writable(nodes).len());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        most
    })
}

fn stage(name: &str, max: &str, selector: &[(&str, &str)], approval: bool) -> v1::RolloutStage {
    v1::RolloutStage {
        name: name.into(),
        max_concurrency: max.into(),
        selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        approval_required: approval,
        ..Default::default()
    }
}

async fn rollout(d: &mut PgDeployment) -> v1::Rollout {
    let request = v1::GetRolloutRequest {
        name: "pg15".into(),
    };
    let got = d.client.rollouts().get_rollout(request).await;
    got.expect("get the rollout").into_inner()
}

async fn wait_rollout(d: &mut PgDeployment, state: v1::RolloutState) -> v1::Rollout {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        let now = rollout(d).await;
        if now.status.as_ref().is_some_and(|s| s.state == state as i32) {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {now:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollout_upgrades_three_postgres_clusters_canary_first_keeping_their_rows() {
    let mut d = PgDeployment::start(&["pg-r1", "pg-r2", "pg-r3"]).await;
    let mut clusters = BTreeMap::new();
    for (i, name) in CLUSTERS.iter().enumerate() {
        let nodes = create(&mut d, name, i == 0).await;
        write_rows(&nodes);
        clusters.insert(name.to_string(), nodes);
    }
    rows_everywhere(&clusters).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_writable(clusters.clone(), Arc::clone(&stop));

    let spec = v1::RolloutSpec {
        selector: [("fleet".to_string(), "pg".to_string())].into(),
        version: V2.into(),
        stages: vec![
            stage("canary", "1", &[("ring", "0")], true),
            stage("rest", "2", &[], false),
        ],
        ..Default::default()
    };
    let request = v1::CreateRolloutRequest {
        name: "pg15".into(),
        spec: Some(spec),
    };
    d.client
        .rollouts()
        .create_rollout(request)
        .await
        .expect("the rollout");
    let waiting = wait_rollout(&mut d, v1::RolloutState::RolloutWaitingApproval).await;
    assert!(waiting.status.unwrap().message.contains("canary"));
    let approve = v1::ApproveRolloutRequest {
        name: "pg15".into(),
        stage: "canary".into(),
    };
    d.client
        .rollouts()
        .approve_rollout(approve)
        .await
        .expect("approve");
    let done = wait_rollout(&mut d, v1::RolloutState::RolloutSucceeded).await;
    stop.store(true, Ordering::Relaxed);
    let most_writable = sampler.join().expect("the sampler");

    assert!(
        most_writable <= 1,
        "a cluster had {most_writable} writable nodes at once"
    );
    let status = done.status.expect("a status");
    assert_eq!(
        (status.stages[0].succeeded, status.stages[1].succeeded),
        (1, 2)
    );
    let canary_done = status.stages[0].finished_at.expect("the canary ended");
    let rest_began = status.stages[1].started_at.expect("the rest began");
    assert!(
        (rest_began.seconds, rest_began.nanos) >= (canary_done.seconds, canary_done.nanos),
        "the rest began before the canary ended"
    );
    let mut after = BTreeMap::new();
    for name in CLUSTERS {
        let nodes = nodes_of(&mut d, name).await;
        assert!(
            nodes.iter().all(|n| n.version == V2 && n.ready),
            "{name}: {nodes:#?}"
        );
        assert_eq!(writable(&nodes).len(), 1, "{name}: one primary");
        after.insert(name.to_string(), nodes);
    }
    rows_everywhere(&after).await;
}
