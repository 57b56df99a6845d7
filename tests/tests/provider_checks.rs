//! What Drover asks the provider beyond running steps, end to end (a real
//! etcd, the simulated provider process, a `drover serve` process): Recover
//! repairs what is down, and the shape of a create or of a change is
//! checked with the provider before anything is written.

use drover_client::v1::{self, ClusterState as S, OperationState as O};
use drover_tests::fixture::Fixture;
use drover_tests::{create_running, wait_for_state};
use std::time::Duration;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);

/// A replica scanning every second, on a simulator started with `sim`.
async fn fixture(sim: &[&str]) -> Fixture {
    let builder = Fixture::builder().scan_interval(1).sim_args(sim);
    builder.start().await
}

/// What these tests read of the fixture: etcd's keys, the replica's
/// metrics.
trait Reads {
    fn keys_of(&self, cluster: &str) -> Vec<String>;
    async fn validations(&self) -> f64;
}

impl Reads for Fixture {
    /// Every key etcd holds that names `cluster`.
    fn keys_of(&self, cluster: &str) -> Vec<String> {
        let keys = self
            .etcd
            .etcdctl(&["get", "--prefix", "--keys-only", "/drover/"]);
        keys.lines()
            .filter(|key| key.contains(&format!("/{cluster}/")) || key.ends_with(cluster))
            .map(String::from)
            .collect()
    }

    /// How many times the replica asked the provider to validate a shape.
    async fn validations(&self) -> f64 {
        let samples = drover_tests::scrape::metrics(&self.replicas[0].admin_endpoint()).await;
        drover_tests::scrape::sum(
            &samples,
            "drover_provider_request_duration_seconds_count",
            "request=\"ValidateSpec\"",
        )
    }
}

fn create_request(name: &str, offering: &str) -> v1::CreateClusterRequest {
    v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(v1::ClusterSpec {
            version: "1.29.0".into(),
            control_nodes: 1,
            worker_nodes: 1,
            node_offering: offering.into(),
            ..Default::default()
        }),
        create_only: false,
        request_id: String::new(),
    }
}

/// A cluster the scanner moved to Alert because a node went unhealthy is
/// brought back by a Recover: the provider repairs the node, the health
/// check then passes. Before RepairNodes, the Recover's health check failed
/// and the cluster stayed in Alert.
#[tokio::test]
async fn recover_repairs_an_unhealthy_node_and_the_cluster_runs_again() {
    let mut f = fixture(&[]).await;
    let cluster = create_running(&mut f.client, "sick", 2).await;
    let control = f.sim.control().await;
    let mut control = control;
    control
        .set_node_health(drover_proto::provider::v1::NodeHealth {
            cluster_uid: cluster.uid.clone(),
            node_ids: vec!["worker-1".into()],
            healthy: false,
            lost: false,
        })
        .await
        .unwrap();
    wait_for_state(&f.client, "sick", S::Alert, WAIT).await;
    let recover = v1::RecoverClusterRequest {
        name: "sick".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f.client.clusters().recover_cluster(recover).await.unwrap();
    let done = f.finish(op.into_inner()).await;
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    let shown = f.client.get_cluster("sick").await.unwrap();
    let status = shown.status.unwrap();
    assert_eq!(status.state, Some(S::Running as i32));
    assert!(status.nodes.iter().all(|n| n.ready), "{:?}", status.nodes);
    let nodes = f.sim.nodes(&cluster.uid).await;
    assert!(nodes.iter().all(|n| n.healthy), "{nodes:?}");
    let audit = f.sim.audit(&cluster.uid).await;
    assert!(audit.iter().any(|e| e.method == "RepairNodes"), "{audit:?}");
    f.check_history().await;
}

/// A create of an offering the provider does not build is refused by the
/// API naming `spec.node_offering`, and nothing is written; one it builds
/// is created as before.
#[tokio::test]
async fn a_create_the_provider_refuses_is_invalid_and_writes_nothing() {
    let f = fixture(&["--versions", "1.29.0,1.30.0", "--offerings", "medium"]).await;
    let mut client = f.client.clone();
    let refused = client
        .clusters()
        .create_cluster(create_request("huge", "xxl"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("spec.node_offering:"),
        "{}",
        refused.message()
    );
    assert!(refused.message().contains("xxl"), "{}", refused.message());
    assert_eq!(f.keys_of("huge"), Vec::<String>::new());
    let created = create_running(&mut client, "fine", 1).await;
    assert_eq!(created.status.unwrap().state, Some(S::Running as i32));
}

/// An upgrade to a version the provider does not run, or a scale to an
/// offering it does not build, is refused naming the request's field, and
/// the cluster's spec and operations are untouched; an accepted upgrade
/// runs. Requests that keep the shape never ask the provider.
#[tokio::test]
async fn a_change_of_shape_the_provider_refuses_is_invalid_and_writes_nothing() {
    let mut f = fixture(&["--versions", "1.29.0,1.30.0", "--offerings", "medium"]).await;
    create_running(&mut f.client, "db", 1).await;
    let before = f.client.get_cluster("db").await.unwrap();
    let asked = f.validations().await;
    assert_eq!(asked, 1.0, "the create asked once");
    let upgrade = |version: &str| v1::UpgradeClusterRequest {
        name: "db".into(),
        version: version.into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    let refused = f
        .client
        .clusters()
        .upgrade_cluster(upgrade("1.31.0"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("version:"),
        "{}",
        refused.message()
    );
    let scale = v1::ScaleClusterRequest {
        name: "db".into(),
        worker_nodes: None,
        node_offering: Some("xxl".into()),
        autoscaling: None,
        request_id: String::new(),
        ..Default::default()
    };
    let refused = f.client.clusters().scale_cluster(scale).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("node_offering:"),
        "{}",
        refused.message()
    );
    let after = f.client.get_cluster("db").await.unwrap();
    assert_eq!(after.generation, before.generation, "the spec is untouched");
    let operations = drover_tests::operations_of(&f.client, "db").await;
    assert_eq!(operations.len(), 1, "only the first start: {operations:?}");
    // A stop and a start keep the shape: the provider is not asked.
    for kind in ["stop", "start"] {
        let op = if kind == "stop" {
            let r = v1::StopClusterRequest {
                name: "db".into(),
                request_id: String::new(),
                ..Default::default()
            };
            f.client.clusters().stop_cluster(r).await
        } else {
            let r = v1::StartClusterRequest {
                name: "db".into(),
                request_id: String::new(),
                ..Default::default()
            };
            f.client.clusters().start_cluster(r).await
        };
        let done = f.finish(op.unwrap().into_inner()).await;
        assert_eq!(done.state, O::Succeeded as i32, "{kind}: {done:?}");
    }
    assert_eq!(f.validations().await, asked + 2.0, "the two refusals only");
    let op = f
        .client
        .clusters()
        .upgrade_cluster(upgrade("1.30.0"))
        .await
        .unwrap();
    let done = f.finish(op.into_inner()).await;
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    f.check_history().await;
}

/// A provider that does not answer the check refuses the request with
/// UNAVAILABLE, saying nothing was written, within the bound.
#[tokio::test]
async fn a_provider_that_cannot_be_asked_makes_the_create_unavailable() {
    let f = fixture(&[]).await;
    f.sim.fault("ValidateSpec", 1, true).await;
    let mut client = f.client.clone();
    let started = std::time::Instant::now();
    let refused = client
        .clusters()
        .create_cluster(create_request("later", "medium"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("nothing was written"),
        "{}",
        refused.message()
    );
    assert!(started.elapsed() < Duration::from_secs(15), "bounded");
    assert_eq!(f.keys_of("later"), Vec::<String>::new());
}

/// The provider's facts about each node reach the status, and droverctl
/// shows them in `cluster get -o json`.
#[tokio::test]
async fn node_facts_reach_the_status_and_droverctl() {
    let mut f = fixture(&[]).await;
    let cluster = create_running(&mut f.client, "facts", 1).await;
    let nodes = cluster.status.unwrap().nodes;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for node in &nodes {
        let address = node.facts.get("address").map(String::as_str);
        let expected = format!("{}.simulated:5432", node.id);
        assert_eq!(address, Some(expected.as_str()), "{node:?}");
    }
    let shown = std::process::Command::new(drover_tests::workspace_binary("droverctl"))
        .args(["--endpoint", &f.replicas[0].endpoint()])
        .args(["cluster", "get", "facts", "-o", "json"])
        .output()
        .expect("run droverctl");
    assert!(shown.status.success(), "{shown:?}");
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    let node = &json["status"]["nodes"][0];
    let id = node["id"].as_str().unwrap();
    assert_eq!(
        node["facts"]["address"],
        format!("{id}.simulated:5432"),
        "{json}"
    );
}
