//! An upgrade with `spec.upgrade_policy.max_surge = 1` on real PostgreSQL,
//! through Drover: a real etcd, replica processes, the PostgreSQL provider
//! process and the postgres processes it runs. The provider's own answers
//! (DescribeCluster, asked over and over while the upgrade runs) and the
//! postgres logs it keeps are the witnesses of the order: a standby is
//! added, stopped and running again at the target version before any node
//! the cluster had is stopped for its upgrade, the rolling upgrade of the
//! others runs with it there, and only once every node is at the target is
//! the cluster brought back to its spec's worker count (whichever standby
//! the provider removes). The databases are checked too: the rows written
//! before are on every node after, and never two nodes take writes at once
//! (every node the provider shows, the surge standby included, sampled
//! every 100 ms).

use drover_client::v1;
use drover_proto::provider::v1 as pb;
use drover_tests::postgres::{
    address, one_primary_all_ready, primary, psql, rows_everywhere, writable, PgDeployment,
    WritableSampler, V1, V2,
};
use drover_tests::{start_upgrade, wait_until};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROWS: u32 = 100;
const WORKERS: u32 = 2;
const SURGE: u32 = 1;

/// One answer of the provider's DescribeCluster: each node's role and
/// version, by node id.
type Shape = BTreeMap<String, (String, String)>;

/// Creates `pg` (1 primary, [`WORKERS`] standbys, at [`V1`], upgraded with
/// a surge of [`SURGE`]), writes [`ROWS`] rows, and waits until every node
/// has them.
async fn create(d: &mut PgDeployment) -> Vec<v1::Node> {
    let request = v1::CreateClusterRequest {
        name: "pg".into(),
        spec: Some(v1::ClusterSpec {
            version: V1.into(),
            control_nodes: 1,
            worker_nodes: WORKERS,
            node_offering: "small".into(),
            upgrade_policy: Some(v1::UpgradePolicy {
                max_surge: Some(SURGE),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = d.client.clusters().create_cluster(request).await;
    let created = created.expect("create").into_inner();
    let policy = created.cluster.as_ref().and_then(|c| c.spec.as_ref());
    let policy = policy.and_then(|s| s.upgrade_policy.as_ref());
    assert_eq!(
        policy.and_then(|p| p.max_surge),
        Some(SURGE),
        "{created:#?}"
    );
    d.succeeds(created.operation.expect("a start")).await;
    let nodes = d.nodes().await;
    assert_eq!(nodes.len(), 1 + WORKERS as usize, "{nodes:#?}");
    assert!(
        nodes.iter().all(|n| n.ready && n.version == V1),
        "{nodes:#?}"
    );
    let sql = format!(
        "CREATE TABLE items (id int PRIMARY KEY, name text); \
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, {ROWS}) g"
    );
    psql(&address(&primary(&nodes)), &sql).expect("write rows");
    rows_everywhere(&nodes, ROWS).await;
    nodes
}

/// The provider's DescribeCluster of one cluster, asked again as soon as
/// it answers (with a 20 ms pause), on a task of its own until
/// [`Timeline::finish`]: every distinct answer in order, and the nodes of
/// the latest one (for [`WritableSampler::following`]).
struct Timeline {
    stop: Arc<AtomicBool>,
    nodes: Arc<Mutex<Vec<v1::Node>>>,
    task: tokio::task::JoinHandle<(Vec<Shape>, u64)>,
}

impl Timeline {
    /// Starts asking; returns once the first answer is in.
    async fn start(endpoint: String, uid: String) -> Self {
        let mut provider = pb::provider_client::ProviderClient::connect(endpoint)
            .await
            .expect("connect to the provider");
        let stop = Arc::new(AtomicBool::new(false));
        let nodes = Arc::new(Mutex::new(Vec::new()));
        let shapes = Arc::new(Mutex::new(Vec::<Shape>::new()));
        let task = {
            let (stop, nodes, shapes) = (stop.clone(), nodes.clone(), shapes.clone());
            tokio::spawn(async move {
                let mut asked = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let request = pb::DescribeClusterRequest {
                        cluster_uid: uid.clone(),
                        token: None,
                    };
                    if let Ok(answer) = provider.describe_cluster(request).await {
                        asked += 1;
                        let answer = answer.into_inner().nodes;
                        let shape: Shape = answer
                            .iter()
                            .map(|n| (n.id.clone(), (n.role.clone(), n.version.clone())))
                            .collect();
                        let mut shapes = shapes.lock().unwrap();
                        if shapes.last() != Some(&shape) {
                            shapes.push(shape);
                        }
                        drop(shapes);
                        *nodes.lock().unwrap() = answer.into_iter().map(node_of).collect();
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let shapes = shapes.lock().unwrap().clone();
                (shapes, asked)
            })
        };
        let first = nodes.clone();
        wait_until(
            Duration::from_secs(30),
            "the provider's first answer",
            || std::future::ready(!first.lock().unwrap().is_empty()),
        )
        .await;
        Self { stop, nodes, task }
    }

    /// Stops asking; every distinct answer in order, and how many answers
    /// there were.
    async fn finish(self) -> (Vec<Shape>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the timeline task")
    }
}

/// A provider's node as far as [`writable`] needs it (id and address).
fn node_of(node: pb::ProviderNode) -> v1::Node {
    v1::Node {
        id: node.id,
        role: node.role,
        version: node.version,
        facts: node.facts,
        ..Default::default()
    }
}

/// The version of node `id` in `shape`, if the provider shows it.
fn version_in<'a>(shape: &'a Shape, id: &str) -> Option<&'a str> {
    shape.get(id).map(|(_, version)| version.as_str())
}

/// Compactly, for a failure message: `pg-0:control@15.0.0 ...` per answer.
fn show(shapes: &[Shape]) -> String {
    let lines: Vec<String> = shapes
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            let nodes: Vec<String> = shape
                .iter()
                .map(|(id, (role, version))| format!("{id}:{role}@{version}"))
                .collect();
            format!("{i:3}: {}", nodes.join(" "))
        })
        .collect();
    lines.join("\n")
}

/// Checks the order on the provider's answers; returns the surge node's
/// id and the node removed at the end.
fn assert_surge_order(shapes: &[Shape], original: &BTreeSet<String>) -> (String, String) {
    let timeline = show(shapes);
    // The first answer is the cluster as it was, untouched.
    let first = &shapes[0];
    assert_eq!(
        first.keys().cloned().collect::<BTreeSet<_>>(),
        *original,
        "the provider's first answer:\n{timeline}"
    );
    assert!(
        first.values().all(|(_, v)| v == V1),
        "the first answer, before the upgrade:\n{timeline}"
    );
    // Exactly one node added, and never more than the surge at once.
    let added: BTreeSet<&String> = shapes
        .iter()
        .flat_map(|s| s.keys())
        .filter(|id| !original.contains(*id))
        .collect();
    assert_eq!(
        added.len(),
        SURGE as usize,
        "one surge standby added:\n{timeline}"
    );
    let surge = added.into_iter().next().expect("a surge node").clone();
    let most = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    assert_eq!(
        most,
        (1 + WORKERS + SURGE) as usize,
        "at most the spec's count plus the surge:\n{timeline}"
    );
    let touched = |shape: &Shape| {
        original
            .iter()
            .any(|id| version_in(shape, id).is_some_and(|v| v != V1))
    };
    let first_added = shapes.iter().position(|s| s.contains_key(&surge));
    let first_touched = shapes.iter().position(touched);
    let (Some(first_added), Some(first_touched)) = (first_added, first_touched) else {
        panic!("no surge standby, or no node upgraded:\n{timeline}");
    };
    // ResizeNodes adding a standby before any node it had is upgraded.
    assert!(
        first_added < first_touched,
        "the surge standby came after the first node upgraded:\n{timeline}"
    );
    assert_eq!(
        shapes[first_added][&surge].0, "worker",
        "the surge node is a standby:\n{timeline}"
    );
    // While the others are rolled, the surge standby is there, at the
    // target (it was upgraded before them: never one of them at the target
    // with it still at the old version); no node is ever at a third
    // version. These hold in every answer, however few were sampled; the
    // exact order of the restarts is read from the postgres logs (see
    // [`assert_surge_restarted_first`]).
    for (i, shape) in shapes.iter().enumerate() {
        assert!(
            shape.values().all(|(_, v)| v == V1 || v == V2),
            "answer {i}: a version neither {V1} nor {V2}:\n{timeline}"
        );
        let present: Vec<&str> = original
            .iter()
            .filter_map(|id| version_in(shape, id))
            .collect();
        let upgraded = present.iter().filter(|v| **v == V2).count();
        if upgraded > 0 && upgraded < present.len() {
            assert_eq!(
                version_in(shape, &surge),
                Some(V2),
                "answer {i}: mid-upgrade without the surge standby at {V2}:\n{timeline}"
            );
        }
        if touched(shape) {
            assert!(
                version_in(shape, &surge) != Some(V1),
                "answer {i}: a node upgraded while the surge standby was at {V1}:\n{timeline}"
            );
        }
    }
    // Back to the spec's count only once every node is at the target.
    let shrunk = shapes[first_added..]
        .iter()
        .position(|s| s.len() == (1 + WORKERS) as usize)
        .map(|i| i + first_added)
        .unwrap_or_else(|| panic!("never back to {} nodes:\n{timeline}", 1 + WORKERS));
    assert!(
        shapes[shrunk..]
            .iter()
            .all(|s| s.values().all(|(_, v)| v == V2)),
        "back to the spec's count before every node was at {V2}:\n{timeline}"
    );
    let last = shapes.last().expect("an answer");
    let workers = last.values().filter(|(role, _)| role == "worker").count();
    let controls = last.values().filter(|(role, _)| role == "control").count();
    assert_eq!(
        (controls, workers),
        (1, WORKERS as usize),
        "the spec's count at the end:\n{timeline}"
    );
    let before_shrink = &shapes[shrunk - 1];
    let removed: Vec<&String> = before_shrink
        .keys()
        .filter(|id| !last.contains_key(*id))
        .collect();
    assert_eq!(removed.len(), 1, "one standby removed:\n{timeline}");
    assert_eq!(
        before_shrink[removed[0]].0, "worker",
        "a standby removed:\n{timeline}"
    );
    (surge, removed[0].clone())
}

/// Node `id`'s postgres log (`pg_ctl start -l`), which the provider keeps
/// under its root after the node is removed.
fn log_path(d: &PgDeployment, uid: &str, id: &str) -> PathBuf {
    d.provider
        .root()
        .join("logs")
        .join(format!("{uid}-{id}.log"))
}

/// When a log line containing `what` was written, for each such line of
/// `text`: its `%m` prefix to the millisecond (`2026-01-31 12:00:00.123`,
/// PostgreSQL's default log_line_prefix; every node logs in the time zone
/// initdb gave the primary, so these compare as text).
fn logged(text: &str, what: &str) -> Vec<String> {
    let lines = text.lines().filter(|line| line.contains(what));
    lines
        .map(|line| line.get(..23).unwrap_or("").to_string())
        .collect()
}

const STOPPING: &str = "received fast shutdown request";
const READY: &str = "database system is ready to accept";

/// The order of the restarts, from the postgres processes themselves: the
/// surge standby was stopped (UpgradeNode) and was running again on the
/// target's binaries before any node the cluster had was stopped for its
/// own upgrade. `offsets`: each of those nodes' log length before the
/// upgrade began.
fn assert_surge_restarted_first(
    d: &PgDeployment,
    uid: &str,
    surge: &str,
    offsets: &BTreeMap<String, usize>,
) -> (String, String) {
    let text = std::fs::read_to_string(log_path(d, uid, surge)).expect("the surge node's log");
    let stopped = logged(&text, STOPPING);
    let upgraded_stop = stopped.first().unwrap_or_else(|| {
        panic!("{surge} was never stopped (no UpgradeNode of it):\n{text}");
    });
    let ready = logged(&text, READY);
    let back = ready
        .iter()
        .find(|at| *at > upgraded_stop)
        .unwrap_or_else(|| panic!("{surge} never ran again after its upgrade:\n{text}"));
    for (id, offset) in offsets {
        let text = std::fs::read_to_string(log_path(d, uid, id)).expect("a node's log");
        let since = text.get(*offset..).unwrap_or("");
        let stopped = logged(since, STOPPING);
        let first = stopped
            .first()
            .unwrap_or_else(|| panic!("{id} was never stopped for its upgrade:\n{since}"));
        assert!(
            back < first,
            "{id} was stopped for its upgrade at {first}, before the surge standby {surge} \
             was back on the target at {back}"
        );
    }
    (upgraded_stop.clone(), back.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_surge_upgrade_adds_a_standby_at_the_target_first_and_removes_one_last() {
    let mut d = PgDeployment::start(&["pgs-r1", "pgs-r2"]).await;
    let before = create(&mut d).await;
    let original: BTreeSet<String> = before.iter().map(|n| n.id.clone()).collect();
    let old_primary = primary(&before).id;
    let uid = d.client.get_cluster("pg").await.expect("get").uid;
    let offsets: BTreeMap<String, usize> = original
        .iter()
        .map(|id| {
            let text = std::fs::read_to_string(log_path(&d, &uid, id)).expect("a node's log");
            assert!(logged(&text, STOPPING).is_empty(), "{id} stopped before");
            (id.clone(), text.len())
        })
        .collect();
    let timeline = Timeline::start(d.provider.endpoint(), uid.clone()).await;
    let sampler = WritableSampler::following(timeline.nodes.clone());

    let began = Instant::now();
    let upgrade = start_upgrade(&mut d.client, "pg", V2).await;
    let done = d.succeeds(upgrade).await;
    let took = began.elapsed();
    let (shapes, answers) = timeline.finish().await;
    let (most, samples) = sampler.finish().await;

    assert!(most.len() <= 1, "two writable nodes at once: {most:?}");
    assert!(samples > 10, "the sampler ran ({samples} samples)");
    let (surge, removed) = assert_surge_order(&shapes, &original);
    let (surge_stopped, surge_back) = assert_surge_restarted_first(&d, &uid, &surge, &offsets);
    // Drover's plan: the surge, the two standbys, the primary, the resize
    // back.
    let progress = done.progress.expect("progress");
    assert_eq!(progress.total_steps, 5, "{progress:?}");

    // Drover's view, once its scanner has caught up: the spec's count, all
    // at the target, one primary, the rows everywhere.
    let after = d
        .wait_for_nodes(
            "1 primary, 2 standbys, all ready at the target",
            Duration::from_secs(30),
            |nodes| {
                one_primary_all_ready(nodes, WORKERS as usize)
                    && nodes.iter().all(|n| n.version == V2)
            },
        )
        .await;
    let new_primary = primary(&after).id;
    assert_eq!(writable(&after), vec![new_primary.clone()], "{after:#?}");
    rows_everywhere(&after, ROWS).await;
    let sql = format!("INSERT INTO items VALUES ({}, 'after')", ROWS + 1);
    psql(&address(&primary(&after)), &sql).expect("write on the primary");
    rows_everywhere(&after, ROWS + 1).await;
    eprintln!(
        "surge upgrade {V1} -> {V2} in {took:?}: {surge} added and upgraded first \
         (stopped at {surge_stopped}, back at {surge_back}, before any other node stopped), \
         primary {old_primary} -> {new_primary}, {removed} removed at the end; \
         {} distinct provider answers of {answers}; at most {} writable in {samples} samples\n{}",
        shapes.len(),
        most.len(),
        show(&shapes),
    );
}
