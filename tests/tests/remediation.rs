//! Node health checks and automatic remediation (`spec.health`), end to
//! end: real etcd, replica processes and the simulator. A node not ready
//! past its timeout is remediated by a Recover naming it, accepted like any
//! request; too many unhealthy nodes short-circuit; retries are limited;
//! a remediation whose owner is killed resumes on a peer and ends once; a
//! node the provider no longer shows is missing, and added back; under a
//! policy of replacement a worker is replaced, not repaired.

use drover_client::v1::{self, ClusterState as S, NodeHealth, OperationKind as K};
use drover_client::Client;
use drover_tests::fixture::Fixture;
use drover_tests::{operations_of, owner, scrape, wait_for_state, wait_until};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// Creates `name` (one control node, `workers` workers) with `health`,
/// waits for it to run, and returns it with its node ids by role.
async fn create(
    f: &mut Fixture,
    name: &str,
    control: u32,
    workers: u32,
    health: v1::HealthPolicy,
) -> v1::Cluster {
    let request = v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(v1::ClusterSpec {
            version: "1.29.0".into(),
            control_nodes: control,
            worker_nodes: workers,
            node_offering: "medium".into(),
            health: Some(health),
            ..Default::default()
        }),
        create_only: false,
        request_id: String::new(),
    };
    let created = f.client.clusters().create_cluster(request).await;
    let start = created
        .expect("create")
        .into_inner()
        .operation
        .expect("a start");
    let done = f.finish(start).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    f.client.get_cluster(name).await.expect("the cluster")
}

fn node_ids(cluster: &v1::Cluster, role: &str) -> Vec<String> {
    let status = cluster.status.clone().unwrap_or_default();
    let nodes = status.nodes.into_iter().filter(|n| n.role == role);
    nodes.map(|n| n.id).collect()
}

fn recovers(ops: &[v1::Operation]) -> Vec<&v1::Operation> {
    ops.iter()
        .filter(|op| op.kind == K::Recover as i32)
        .collect()
}

fn remediation(cluster: &v1::Cluster) -> v1::Remediation {
    let status = cluster.status.clone().unwrap_or_default();
    status.remediation.unwrap_or_default()
}

/// Waits until the cluster's remediation says something containing `text`.
async fn wait_for_message(client: &Client, name: &str, text: &str) -> v1::Cluster {
    let what = format!("{name}'s remediation to say {text:?}");
    wait_until(WAIT, &what, || {
        let mut client = client.clone();
        async move {
            let cluster = client.get_cluster(name).await.expect("the cluster");
            remediation(&cluster).message.contains(text)
        }
    })
    .await;
    client.clone().get_cluster(name).await.expect("the cluster")
}

#[tokio::test]
async fn an_unhealthy_worker_is_remediated_by_a_recover_naming_it() {
    let mut f = Fixture::builder().scan_interval(1).start().await;
    let health = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(2),
        ..Default::default()
    };
    let cluster = create(&mut f, "heal", 1, 2, health).await;
    let worker = node_ids(&cluster, "worker")[0].clone();
    f.sim.set_node_health(&cluster.uid, &[&worker], false).await;
    wait_for_state(&f.client, "heal", S::Alert, WAIT).await;
    // Seen not ready, then remediated once past the timeout.
    let client = f.client.clone();
    wait_until(WAIT, "a Recover naming the worker", || {
        let client = client.clone();
        async move { !recovers(&operations_of(&client, "heal").await).is_empty() }
    })
    .await;
    wait_for_state(&f.client, "heal", S::Running, WAIT).await;
    let ops = operations_of(&f.client, "heal").await;
    let recovers = recovers(&ops);
    assert_eq!(recovers.len(), 1, "one remediation: {recovers:?}");
    let params = recovers[0].params.clone().unwrap_or_default();
    assert_eq!(params.node_ids, [worker], "it names the node");
    assert_eq!(recovers[0].state, v1::OperationState::Succeeded as i32);
    let audit = f.sim.audit(&cluster.uid).await;
    assert_eq!(
        audit.iter().filter(|e| e.method == "RepairNodes").count(),
        1,
        "{audit:?}"
    );
    let healed = f.client.get_cluster("heal").await.unwrap();
    let record = remediation(&healed);
    assert_eq!(record.nodes.len(), 1, "{record:?}");
    assert_eq!(
        (record.nodes[0].attempts, record.nodes[0].retries_left),
        (1, 2)
    );
    let nodes = healed.status.unwrap_or_default().nodes;
    assert!(
        nodes.iter().all(|n| n.health == NodeHealth::Healthy as i32),
        "{nodes:?}"
    );
    // The gauge counted the node while it was unhealthy, and no more.
    let admin = f.replicas[0].admin_endpoint();
    wait_until(WAIT, "no unhealthy node counted", || {
        let admin = admin.clone();
        async move {
            let samples = scrape::metrics(&admin).await;
            scrape::sum(&samples, "drover_unhealthy_nodes", "") == 0.0
        }
    })
    .await;
    f.check_history().await;
}

#[tokio::test]
async fn too_many_unhealthy_nodes_short_circuit_and_a_control_quorum_is_kept() {
    let mut f = Fixture::builder().scan_interval(1).start().await;
    let health = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(1),
        max_unhealthy: "1".into(),
        ..Default::default()
    };
    let cluster = create(&mut f, "storm", 1, 3, health).await;
    let workers = node_ids(&cluster, "worker");
    let bad: Vec<&str> = workers.iter().take(2).map(String::as_str).collect();
    f.sim.set_node_health(&cluster.uid, &bad, false).await;
    let held = wait_for_message(&f.client, "storm", "short-circuited: 2 of 4").await;
    assert!(remediation(&held).short_circuited);
    assert!(recovers(&operations_of(&f.client, "storm").await).is_empty());
    // The describe shows each node's health and why remediation holds.
    let out = std::process::Command::new(drover_tests::workspace_binary("droverctl"))
        .args(["--endpoint", &f.replicas[0].endpoint()])
        .args(["cluster", "describe", "storm"])
        .output()
        .expect("droverctl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("UNHEALTHY: not ready for"), "{text}");
    assert!(text.contains("short-circuited"), "{text}");
    // So do the metrics.
    let samples = scrape::metrics(&f.replicas[0].admin_endpoint()).await;
    let short = scrape::sum(&samples, "drover_clusters_short_circuited", "");
    let counted = scrape::sum(&samples, "drover_remediations_total", "short_circuited");
    assert_eq!((short, counted), (1.0, 1.0), "short-circuited, counted");

    // Three control nodes, two down: neither is touched (quorum).
    let health = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(1),
        ..Default::default()
    };
    let cluster = create(&mut f, "quorum", 3, 0, health).await;
    let control = node_ids(&cluster, "control");
    let two: Vec<&str> = control.iter().take(2).map(String::as_str).collect();
    f.sim.set_node_health(&cluster.uid, &two, false).await;
    wait_for_message(&f.client, "quorum", "would lose the control plane's quorum").await;
    assert!(recovers(&operations_of(&f.client, "quorum").await).is_empty());
    f.check_history().await;
}

#[tokio::test]
async fn a_node_whose_remediations_keep_failing_is_given_up_after_max_retry() {
    let mut f = Fixture::builder().scan_interval(1).start().await;
    let health = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(1),
        max_retry: Some(2),
        retry_period_seconds: Some(1),
        ..Default::default()
    };
    let cluster = create(&mut f, "stuck", 1, 1, health).await;
    let worker = node_ids(&cluster, "worker")[0].clone();
    // Its first two repairs fail (an error, not the provider unavailable,
    // which an operation would ask again).
    // (Each armed fault takes the next call not taken by another.)
    f.sim.fault("RepairNodes", 1, false).await;
    f.sim.fault("RepairNodes", 1, false).await;
    f.sim.set_node_health(&cluster.uid, &[&worker], false).await;
    let held = wait_for_message(&f.client, "stuck", "retries used up (2 of 2)").await;
    let ops = operations_of(&f.client, "stuck").await;
    let recovers = recovers(&ops);
    assert_eq!(recovers.len(), 2, "max_retry remediations: {recovers:?}");
    assert!(recovers
        .iter()
        .all(|op| op.state == v1::OperationState::Failed as i32));
    assert_eq!(remediation(&held).nodes[0].retries_left, 0);
    let state = held.status.unwrap_or_default().state;
    assert_eq!(state, Some(S::Alert as i32));
    let samples = scrape::metrics(&f.replicas[0].admin_endpoint()).await;
    let gave_up = scrape::sum(&samples, "drover_remediations_total", "gave_up");
    assert_eq!(gave_up, 1.0, "a node given up, counted");
}

#[tokio::test]
async fn a_remediation_whose_owner_is_killed_resumes_on_a_peer_and_ends_once() {
    let mut f = Fixture::builder()
        .replicas(3)
        .ttl(2)
        .scan_interval(1)
        .start()
        .await;
    let health = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(1),
        ..Default::default()
    };
    let cluster = create(&mut f, "resume", 1, 2, health).await;
    let worker = node_ids(&cluster, "worker")[0].clone();
    // The repair takes long enough to kill its owner in the middle.
    f.sim.set_latency(Duration::from_secs(3)).await;
    f.sim.set_node_health(&cluster.uid, &[&worker], false).await;
    let client = f.client.clone();
    wait_until(WAIT, "the remediation to run", || {
        let client = client.clone();
        async move {
            let ops = operations_of(&client, "resume").await;
            let running = v1::OperationState::Running as i32;
            recovers(&ops).iter().any(|op| op.state == running)
        }
    })
    .await;
    let mut admin = v1::admin_client::AdminClient::connect(f.replicas[0].endpoint())
        .await
        .unwrap();
    let owner = owner(&mut admin, "resume").await.expect("an owner").replica;
    // The fixture names its replicas r1, r2, r3, in order.
    let index: usize = owner.trim_start_matches('r').parse::<usize>().unwrap() - 1;
    f.replicas[index].kill9();
    let client = f.replicas[(index + 1) % 3].client().await;
    wait_for_state(&client, "resume", S::Running, Duration::from_secs(60)).await;
    let ops = operations_of(&client, "resume").await;
    let recovers = recovers(&ops);
    assert_eq!(recovers.len(), 1, "remediated once: {recovers:?}");
    assert_eq!(recovers[0].state, v1::OperationState::Succeeded as i32);
    let cluster = client.clone().get_cluster("resume").await.unwrap();
    assert_eq!(remediation(&cluster).nodes[0].attempts, 1);
    f.check_history().await;
}

/// The methods of the audit entries, in order, from the first `from` on.
fn methods(audit: &[drover_proto::provider::v1::AuditEntry], from: &str) -> Vec<String> {
    let start = audit.iter().position(|e| e.method == from).unwrap_or(0);
    audit[start..].iter().map(|e| e.method.clone()).collect()
}

/// Waits for one Recover to have ended with the cluster Running, and
/// returns it.
async fn remediated(f: &Fixture, name: &str) -> v1::Operation {
    let client = f.client.clone();
    wait_until(WAIT, "a Recover", || {
        let client = client.clone();
        async move { !recovers(&operations_of(&client, name).await).is_empty() }
    })
    .await;
    wait_for_state(&f.client, name, S::Running, WAIT).await;
    let ops = operations_of(&f.client, name).await;
    let recovers = recovers(&ops);
    assert_eq!(recovers.len(), 1, "one remediation: {recovers:?}");
    assert_eq!(recovers[0].state, v1::OperationState::Succeeded as i32);
    recovers[0].clone()
}

#[tokio::test]
async fn a_node_the_provider_no_longer_shows_is_missing_and_added_back() {
    let mut f = Fixture::builder().scan_interval(1).start().await;
    let health = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(2),
        ..Default::default()
    };
    let cluster = create(&mut f, "lost", 1, 3, health).await;
    let workers = node_ids(&cluster, "worker");
    f.sim.lose_nodes(&cluster.uid, &[&workers[1]]).await;
    // Shown as a missing node (until it is added back).
    let client = f.client.clone();
    wait_until(WAIT, "a missing worker shown", || {
        let mut client = client.clone();
        async move {
            let seen = client.get_cluster("lost").await.expect("the cluster");
            let nodes = seen.status.unwrap_or_default().nodes;
            nodes.iter().any(|n| {
                n.id == "missing-worker-1"
                    && n.power_state == "missing"
                    && n.health_reason.starts_with("missing")
            })
        }
    })
    .await;
    let recover = remediated(&f, "lost").await;
    let params = recover.params.unwrap_or_default();
    assert_eq!(params.node_ids, ["missing-worker-1"], "it names the node");
    let audit = f.sim.audit(&cluster.uid).await;
    assert_eq!(methods(&audit, "ResizeNodes"), ["ResizeNodes"], "{audit:?}");
    let healed = f.client.get_cluster("lost").await.unwrap();
    let now = node_ids(&healed, "worker");
    assert_eq!(now.len(), 3, "the worker count is the spec's: {now:?}");
    assert!(!now.contains(&workers[1]), "a new worker: {now:?}");
    f.check_history().await;
}

#[tokio::test]
async fn under_a_policy_of_replacement_a_worker_is_added_then_the_bad_one_deleted() {
    let mut f = Fixture::builder().scan_interval(1).start().await;
    let health = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(2),
        remediation: "replace".into(),
        ..Default::default()
    };
    let cluster = create(&mut f, "swap", 1, 2, health).await;
    let workers = node_ids(&cluster, "worker");
    f.sim
        .set_node_health(&cluster.uid, &[&workers[0]], false)
        .await;
    let recover = remediated(&f, "swap").await;
    let params = recover.params.unwrap_or_default();
    assert_eq!(params.node_ids, [workers[0].clone()], "it names the node");
    let audit = f.sim.audit(&cluster.uid).await;
    let calls = methods(&audit, "ResizeNodes");
    assert_eq!(calls, ["ResizeNodes", "DeleteNodes"], "{audit:?}");
    let healed = f.client.get_cluster("swap").await.unwrap();
    let now = node_ids(&healed, "worker");
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(
        !now.contains(&workers[0]),
        "the bad worker is gone: {now:?}"
    );
    assert!(now.contains(&workers[1]), "the good one is kept: {now:?}");
    // A control node is still repaired in place.
    let control = node_ids(&healed, "control")[0].clone();
    f.sim
        .set_node_health(&cluster.uid, &[&control], false)
        .await;
    wait_until(WAIT, "the control node repaired", || {
        let (sim, uid) = (&f.sim, cluster.uid.clone());
        async move {
            sim.audit(&uid)
                .await
                .iter()
                .any(|e| e.method == "RepairNodes")
        }
    })
    .await;
    // Recovering since the repair was asked for: Running once it ends.
    wait_for_state(&f.client, "swap", S::Running, WAIT).await;
    f.check_history().await;
}
