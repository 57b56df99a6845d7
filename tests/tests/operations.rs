//! Operations end to end: a real etcd, the simulated provider process and a
//! `drover serve` process. Every test ends by replaying the state keys'
//! history and checking each change against the table.

use drover_client::v1::{self, ClusterState as S, OperationState as O};
use drover_server::cluster::ClusterState;
use drover_tests::etcd::EtcdProcess;
use drover_tests::fixture::{Fixture, FixtureBuilder};
use drover_tests::{create_running, operations_of, wait_for_state, wait_running, wait_until};
use std::time::Duration;
use tonic::{Code, Response, Status};

const WAIT: Duration = Duration::from_secs(30);

/// One replica scanning every second; a test that counts DescribeCluster
/// calls sets its own interval.
fn fixture() -> FixtureBuilder {
    Fixture::builder().scan_interval(1)
}

/// What these tests ask of the fixture's replica, in one call each.
trait Calls {
    async fn create(&mut self, name: &str, workers: u32, create_only: bool) -> v1::Cluster;
    async fn add_nodes(&mut self, name: &str, count: u32) -> v1::Operation;
    async fn cluster(&mut self, name: &str) -> v1::Cluster;
    async fn state(&mut self, name: &str) -> i32;
    async fn stop(&mut self, name: &str) -> Result<v1::Operation, Status>;
    async fn start(&mut self, name: &str) -> Result<v1::Operation, Status>;
    async fn upgrade(&mut self, name: &str, version: &str) -> Result<v1::Operation, Status>;
    async fn scale(
        &mut self,
        name: &str,
        workers: Option<u32>,
        offering: Option<&str>,
    ) -> Result<v1::Operation, Status>;
}

impl Calls for Fixture {
    /// Creates a cluster and, unless `create_only`, waits for its start.
    async fn create(&mut self, name: &str, workers: u32, create_only: bool) -> v1::Cluster {
        if !create_only {
            return create_running(&mut self.client, name, workers).await;
        }
        let request = v1::CreateClusterRequest {
            name: name.into(),
            spec: Some(v1::ClusterSpec {
                version: "1.29.0".into(),
                control_nodes: 1,
                worker_nodes: workers,
                node_offering: "medium".into(),
                ..Default::default()
            }),
            create_only,
            request_id: String::new(),
        };
        let response = self
            .client
            .clusters()
            .create_cluster(request)
            .await
            .expect("create");
        response.into_inner().cluster.expect("the created cluster")
    }

    /// Accepts an add-nodes of `count` workers to `name`.
    async fn add_nodes(&mut self, name: &str, count: u32) -> v1::Operation {
        let add = v1::AddNodesRequest {
            name: name.into(),
            count,
            request_id: String::new(),
            ..Default::default()
        };
        let response = self.client.clusters().add_nodes(add).await;
        response.expect("add nodes").into_inner()
    }

    async fn cluster(&mut self, name: &str) -> v1::Cluster {
        self.client.get_cluster(name).await.expect("get cluster")
    }

    async fn state(&mut self, name: &str) -> i32 {
        self.cluster(name).await.status.unwrap().state.unwrap()
    }

    /// Asks for a stop of `name`: the accepted operation, or the refusal.
    async fn stop(&mut self, name: &str) -> Result<v1::Operation, Status> {
        let answer = self.client.clusters().stop_cluster(stop(name)).await;
        answer.map(Response::into_inner)
    }

    /// Asks for a start of `name`: the accepted operation, or the refusal.
    async fn start(&mut self, name: &str) -> Result<v1::Operation, Status> {
        let answer = self.client.clusters().start_cluster(start(name)).await;
        answer.map(Response::into_inner)
    }

    /// Asks for an upgrade of `name` to `version`: the accepted operation,
    /// or the refusal.
    async fn upgrade(&mut self, name: &str, version: &str) -> Result<v1::Operation, Status> {
        let request = upgrade(name, version);
        let answer = self.client.clusters().upgrade_cluster(request).await;
        answer.map(Response::into_inner)
    }

    /// Asks for a scale of `name`: the accepted operation, or the refusal.
    async fn scale(
        &mut self,
        name: &str,
        workers: Option<u32>,
        offering: Option<&str>,
    ) -> Result<v1::Operation, Status> {
        let request = scale(name, workers, offering);
        let answer = self.client.clusters().scale_cluster(request).await;
        answer.map(Response::into_inner)
    }
}

fn stop(name: &str) -> v1::StopClusterRequest {
    v1::StopClusterRequest {
        name: name.into(),
        request_id: String::new(),
        ..Default::default()
    }
}

fn start(name: &str) -> v1::StartClusterRequest {
    v1::StartClusterRequest {
        name: name.into(),
        request_id: String::new(),
        ..Default::default()
    }
}

fn upgrade(name: &str, version: &str) -> v1::UpgradeClusterRequest {
    v1::UpgradeClusterRequest {
        name: name.into(),
        version: version.into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    }
}

fn scale(name: &str, workers: Option<u32>, offering: Option<&str>) -> v1::ScaleClusterRequest {
    v1::ScaleClusterRequest {
        name: name.into(),
        worker_nodes: workers,
        node_offering: offering.map(String::from),
        autoscaling: None,
        request_id: String::new(),
        ..Default::default()
    }
}

fn methods(entries: &[drover_proto::provider::v1::AuditEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.method.as_str()).collect()
}

#[tokio::test]
async fn every_operation_kind_end_to_end() {
    let mut f = fixture().start().await;
    let created = f.create("web", 2, false).await;
    let status = created.status.clone().unwrap();
    assert_eq!(status.state, Some(S::Running as i32));
    assert_eq!(status.current_version.as_deref(), Some("1.29.0"));
    assert_eq!(status.nodes.len(), 3);
    let uid = created.uid.clone();

    let op = f.stop("web").await.unwrap();
    assert_eq!(
        (op.from_state, op.entered_state),
        (S::Running as i32, S::Stopping as i32)
    );
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    assert_eq!(f.state("web").await, S::Stopped as i32);

    // A stopped cluster can only change its offering.
    let refused = f.scale("web", Some(5), None).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let op = f.scale("web", None, Some("large")).await.unwrap();
    assert_eq!(op.entered_state, S::ScalingStoppedCluster as i32);
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    assert_eq!(f.state("web").await, S::Stopped as i32);

    let op = f.start("web").await.unwrap();
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    let op = f.scale("web", Some(4), None).await.unwrap();
    assert_eq!(op.entered_state, S::Scaling as i32);
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    let cluster = f.cluster("web").await;
    assert_eq!(cluster.spec.unwrap().worker_nodes, 4);
    assert_eq!(cluster.status.unwrap().nodes.len(), 5);

    let op = f.upgrade("web", "1.30.0").await.unwrap();
    assert_eq!(op.entered_state, S::Upgrading as i32);
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Succeeded as i32);
    assert_eq!(done.progress.unwrap().total_steps, 5, "one step per node");
    let status = f.cluster("web").await.status.unwrap();
    assert_eq!(status.current_version.as_deref(), Some("1.30.0"));
    assert!(status.nodes.iter().all(|n| n.version == "1.30.0"));

    let op = f.add_nodes("web", 2).await;
    assert_eq!(op.entered_state, S::Importing as i32);
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    assert_eq!(f.cluster("web").await.status.unwrap().nodes.len(), 7);

    // Ids that are not workers of the cluster are refused, naming the id,
    // and nothing is written.
    let generation = f.cluster("web").await.generation;
    for (ids, field) in [
        (vec!["worker-0", "nope"], "node_ids[1]: "),
        (vec!["control-0"], "node_ids[0]: "),
    ] {
        let remove = v1::RemoveNodesRequest {
            name: "web".into(),
            node_ids: ids.into_iter().map(String::from).collect(),
            request_id: String::new(),
            ..Default::default()
        };
        let refused = f.client.clusters().remove_nodes(remove).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().starts_with(field), "{refused:?}");
    }
    assert_eq!(
        f.cluster("web").await.generation,
        generation,
        "nothing written"
    );
    let remove = v1::RemoveNodesRequest {
        name: "web".into(),
        node_ids: vec!["worker-0".into()],
        request_id: String::new(),
        ..Default::default()
    };
    let op = f
        .client
        .clusters()
        .remove_nodes(remove)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(op.entered_state, S::RemovingNodes as i32);
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    let status = f.cluster("web").await.status.unwrap();
    assert_eq!(status.nodes.len(), 6);
    assert!(status.nodes.iter().all(|n| n.id != "worker-0"));

    let destroy = v1::DeleteClusterRequest {
        name: "web".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f
        .client
        .clusters()
        .delete_cluster(destroy)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(op.entered_state, S::Destroying as i32);
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    assert_eq!(f.state("web").await, S::Destroyed as i32);

    let audit = f.sim.audit(&uid).await;
    assert_eq!(
        methods(&audit),
        [
            "CreateNodes",
            "StopNodes",
            "ResizeNodes",
            "StartNodes",
            "ResizeNodes",
            "UpgradeNode",
            "UpgradeNode",
            "UpgradeNode",
            "UpgradeNode",
            "UpgradeNode",
            "ResizeNodes",
            "DeleteNodes",
            "DeleteNodes",
        ]
    );
    let listed = f
        .client
        .operations()
        .list_operations(v1::ListOperationsRequest {
            cluster: "web".into(),
            page_size: 3,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let kinds: Vec<i32> = listed.operations.iter().map(|o| o.kind).collect();
    assert_eq!(
        kinds,
        [
            v1::OperationKind::Destroy as i32,
            v1::OperationKind::RemoveNodes as i32,
            v1::OperationKind::AddNodes as i32
        ],
        "newest first"
    );
    assert!(!listed.next_page_token.is_empty());

    // The name is free again at once, under a new uid.
    let again = f.create("web", 1, true).await;
    assert_ne!(again.uid, uid);
    let history = f.check_history().await;
    assert_eq!(history[&uid].last(), Some(&ClusterState::Destroyed));
}

#[tokio::test]
async fn scaling_a_created_cluster_only_edits_the_spec() {
    let mut f = fixture().start().await;
    let created = f.create("draft", 1, true).await;
    let op = f.scale("draft", Some(6), None).await.unwrap();
    assert_eq!(op.state, O::Succeeded as i32);
    let cluster = f.cluster("draft").await;
    assert_eq!(cluster.generation, 2);
    assert_eq!(cluster.spec.unwrap().worker_nodes, 6);
    assert_eq!(cluster.status.unwrap().state, Some(S::Created as i32));
    assert!(
        f.sim.audit(&created.uid).await.is_empty(),
        "nothing touched the provider"
    );
    f.check_history().await;
}

#[tokio::test]
async fn refused_requests_name_the_state_and_change_nothing() {
    let mut f = fixture().start().await;
    let cluster = f.create("db", 1, false).await;
    let refused = f.start("db").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("Running"),
        "{}",
        refused.message()
    );
    let bad = f.upgrade("db", "latest").await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().starts_with("version: "), "{}", bad.message());
    // Errors that depend on the cluster name the request's fields, not the
    // spec they would produce.
    let scale = v1::ScaleClusterRequest {
        name: "db".into(),
        autoscaling: Some(v1::Autoscaling {
            enabled: true,
            min: 5,
            max: 2,
        }),
        ..Default::default()
    };
    let bad = f.client.clusters().scale_cluster(scale).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message().starts_with("autoscaling: "),
        "{}",
        bad.message()
    );
    // The state is the reason first: a created cluster has no nodes yet.
    f.create("fresh", 1, true).await;
    let remove = v1::RemoveNodesRequest {
        name: "fresh".into(),
        node_ids: vec!["worker-0".into()],
        request_id: String::new(),
        ..Default::default()
    };
    let refused = f.client.clusters().remove_nodes(remove).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let missing = f.stop("nope").await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(
        f.cluster("db").await.revision,
        cluster.revision,
        "nothing was written"
    );
    f.check_history().await;
}

#[tokio::test]
async fn of_32_concurrent_conflicting_requests_exactly_one_is_accepted() {
    let mut f = fixture().start().await;
    let cluster = f.create("hot", 2, false).await;
    f.sim.set_latency(Duration::from_millis(200)).await;
    let before = f.sim.audit(&cluster.uid).await.len();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let mut client = f.client.clone();
        tasks.push(tokio::spawn(async move {
            let clusters = client.clusters();
            match i % 3 {
                0 => clusters.stop_cluster(stop("hot")).await,
                1 => clusters.upgrade_cluster(upgrade("hot", "1.31.0")).await,
                _ => clusters.scale_cluster(scale("hot", Some(9), None)).await,
            }
        }));
    }
    let mut accepted = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(op) => accepted.push(op.into_inner()),
            Err(status) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert!(status.message().contains("retry"), "{}", status.message());
            }
        }
    }
    assert_eq!(accepted.len(), 1, "exactly one accepted: {accepted:?}");
    let winner = accepted.pop().unwrap();
    assert_eq!(f.finish(winner.clone()).await.state, O::Succeeded as i32);
    let audit = f.sim.audit(&cluster.uid).await;
    for entry in &audit[before..] {
        assert_eq!(
            entry.token.as_ref().unwrap().operation_id,
            winner.id,
            "only the winner touched the provider"
        );
    }
    let listed = f
        .client
        .operations()
        .list_operations(v1::ListOperationsRequest {
            cluster: "hot".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.operations.len(), 2, "the start and the winner only");
    f.check_history().await;
}

#[tokio::test]
async fn failing_steps_end_where_the_table_says() {
    let mut f = fixture()
        .replica_args(&["--operation-timeout", "stop=2"])
        .start()
        .await;
    // A failed upgrade: Upgrading -> Alert, version unchanged, the nodes
    // upgraded so far stay upgraded.
    f.create("up", 2, false).await;
    f.sim.fault("UpgradeNode", 2, false).await;
    let op = f.upgrade("up", "1.30.0").await.unwrap();
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Failed as i32);
    let error = done.error.unwrap();
    assert!(error.message.contains("step 2 of 3"), "{}", error.message);
    assert!(error.message.contains("upgrade node"), "{}", error.message);
    let status = f.cluster("up").await.status.unwrap();
    assert_eq!(status.state, Some(S::Alert as i32));
    assert_eq!(status.current_version.as_deref(), Some("1.29.0"));
    assert_eq!(
        status
            .nodes
            .iter()
            .filter(|n| n.version == "1.30.0")
            .count(),
        1
    );

    // Provisioning failure: Starting -> Error (CreateFailed); a start of an
    // Error cluster is a go-ahead and, when it works, Error -> Running.
    f.sim.fault("CreateNodes", 1, false).await;
    let response = f
        .client
        .clusters()
        .create_cluster(v1::CreateClusterRequest {
            name: "broken".into(),
            spec: Some(v1::ClusterSpec {
                version: "1.29.0".into(),
                control_nodes: 1,
                node_offering: "m".into(),
                ..Default::default()
            }),
            create_only: false,
            request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        f.finish(response.operation.unwrap()).await.state,
        O::Failed as i32
    );
    assert_eq!(f.state("broken").await, S::Error as i32);
    let op = f.start("broken").await.unwrap();
    assert_eq!(
        (op.from_state, op.entered_state),
        (S::Error as i32, S::Error as i32),
        "go-ahead keeps the state"
    );
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    assert_eq!(f.state("broken").await, S::Running as i32);

    // A hung provider hits the per-kind timeout: Stopping -> Alert. A call
    // cut at the end of the claim's lease period is asked again, so every
    // ask hangs.
    for _ in 0..3 {
        f.sim.fault("StopNodes", 1, true).await;
    }
    let op = f.stop("broken").await.unwrap();
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Failed as i32);
    assert_eq!(done.error.unwrap().code, "DeadlineExceeded");
    assert_eq!(f.state("broken").await, S::Alert as i32);
    f.check_history().await;
}

#[tokio::test]
async fn cancel_stops_at_the_next_step_boundary() {
    let mut f = fixture().start().await;
    let cluster = f.create("slow", 3, false).await;
    f.sim.set_latency(Duration::from_millis(400)).await;
    let op = f.upgrade("slow", "1.30.0").await.unwrap();
    let (cluster_name, id) = (op.cluster.clone(), op.id.clone());
    let mut ops = f.client.clone();
    wait_running(&ops, &cluster_name, &id, WAIT).await;
    let cancel = v1::CancelOperationRequest {
        cluster: "slow".into(),
        id: op.id.clone(),
    };
    let requested = ops
        .operations()
        .cancel_operation(cancel)
        .await
        .unwrap()
        .into_inner();
    assert!(requested.cancel_requested);
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Cancelled as i32, "{done:?}");
    // Once ended, there is nothing to cancel: said, not silently echoed.
    let again = v1::CancelOperationRequest {
        cluster: "slow".into(),
        id: done.id.clone(),
    };
    let refused = ops.operations().cancel_operation(again).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("already ended"), "{refused:?}");
    let upgrades = f
        .sim
        .audit(&cluster.uid)
        .await
        .iter()
        .filter(|e| e.method == "UpgradeNode")
        .count();
    assert!(
        (1..4).contains(&upgrades),
        "stopped early: {upgrades} of 4 nodes upgraded"
    );
    // A cancelled operation ends as a failed one would: Upgrading -> Alert.
    assert_eq!(f.state("slow").await, S::Alert as i32);
    f.check_history().await;
}

#[tokio::test]
async fn a_repeated_request_id_returns_the_same_operation() {
    let mut f = fixture().start().await;
    let cluster = f.create("idem", 1, false).await;
    let request = v1::StopClusterRequest {
        name: "idem".into(),
        request_id: "stop-1".into(),
        ..Default::default()
    };
    let first = f
        .client
        .clusters()
        .stop_cluster(request.clone())
        .await
        .unwrap()
        .into_inner();
    f.finish(first.clone()).await;
    let second = f
        .client
        .clusters()
        .stop_cluster(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.id, first.id);
    let stops = f
        .sim
        .audit(&cluster.uid)
        .await
        .iter()
        .filter(|e| e.method == "StopNodes")
        .count();
    assert_eq!(stops, 1, "the retry ran nothing");
    // The same id on another kind of request is refused: it used to return
    // the stop, as if the start had been accepted.
    let start = v1::StartClusterRequest {
        name: "idem".into(),
        request_id: "stop-1".into(),
        ..Default::default()
    };
    let refused = f.client.clusters().start_cluster(start).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("request_id: "), "{refused:?}");
    assert_eq!(f.state("idem").await, S::Stopped as i32, "nothing started");
    f.check_history().await;
}

#[tokio::test]
async fn wait_returns_at_the_deadline_for_a_running_operation() {
    let mut f = fixture().start().await;
    f.create("patient", 1, false).await;
    // Longer than the wait, shorter than the claim's deadline (at a 2 s TTL
    // a provider call has at least about 0.9 s).
    f.sim.set_latency(Duration::from_millis(600)).await;
    let op = f.stop("patient").await.unwrap();
    let early = f
        .client
        .wait_operation(&op, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(
        early.state < O::Succeeded as i32,
        "not finished yet: {early:?}"
    );
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    f.check_history().await;
}

/// A lifecycle call with `wait_ms` answers once its operation has ended:
/// one call instead of an accept and a wait, the cluster as it left it on
/// the same replica's next read. Cut short by a slow provider, it answers
/// the operation still running, which WaitOperation then follows.
#[tokio::test]
async fn a_lifecycle_call_with_wait_ms_answers_the_ended_operation() {
    let mut f = fixture().start().await;
    f.create("onecall", 1, false).await;
    let request = v1::StopClusterRequest {
        wait_ms: 30_000,
        ..stop("onecall")
    };
    let done = f.client.clusters().stop_cluster(request).await.unwrap();
    let done = done.into_inner();
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    let request = v1::GetClusterRequest {
        name: "onecall".into(),
        linearizable: false,
    };
    let cached = f.client.clusters().get_cluster(request).await.unwrap();
    let status = cached.into_inner().status.expect("status");
    assert_eq!(status.state, Some(S::Stopped as i32), "{status:?}");
    assert_eq!(status.current_operation, None, "{status:?}");

    f.sim.set_latency(Duration::from_millis(600)).await;
    let request = v1::StartClusterRequest {
        wait_ms: 200,
        ..start("onecall")
    };
    let early = f.client.clusters().start_cluster(request).await.unwrap();
    let early = early.into_inner();
    assert!(
        early.state < O::Succeeded as i32,
        "not finished yet: {early:?}"
    );
    assert_eq!(f.finish(early).await.state, O::Succeeded as i32);

    // A caller's deadline shorter than its wait_ms: answered before it
    // (the operation still running), not DEADLINE_EXCEEDED with the
    // operation it started unknown to it.
    let mut request = tonic::Request::new(v1::StopClusterRequest {
        wait_ms: 30_000,
        ..stop("onecall")
    });
    request.set_timeout(Duration::from_millis(400));
    let early = f.client.clusters().stop_cluster(request).await.unwrap();
    let early = early.into_inner();
    assert!(early.state < O::Succeeded as i32, "{early:?}");
    assert_eq!(f.finish(early).await.state, O::Succeeded as i32);
    f.check_history().await;
}

/// A wait longer than an hour is refused naming `wait_ms`, and nothing is
/// accepted.
#[tokio::test]
async fn a_lifecycle_call_with_too_long_a_wait_is_refused_and_writes_nothing() {
    let mut f = fixture().start().await;
    f.create("impatient", 1, false).await;
    let request = v1::StopClusterRequest {
        wait_ms: 3_600_001,
        ..stop("impatient")
    };
    let refused = f.client.clusters().stop_cluster(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("wait_ms: "), "{refused:?}");
    assert_eq!(f.state("impatient").await, S::Running as i32);
    let ops = operations_of(&f.client, "impatient").await;
    assert_eq!(ops.len(), 1, "only the create's start: {ops:?}");
    f.check_history().await;
}

#[tokio::test]
async fn the_scanner_detects_faults_and_recovers_healthy_clusters() {
    let mut f = fixture().start().await;
    let cluster = f.create("watched", 2, false).await;
    f.sim.set_health(&cluster.uid, false).await;
    let mut probe = f.client.clone();
    wait_for_state(&probe, "watched", S::Alert, WAIT).await;
    f.sim.set_health(&cluster.uid, true).await;
    wait_for_state(&probe, "watched", S::Running, WAIT).await;
    // A destroy that fails stays Destroying; the scanner retries it.
    f.sim.fault("DeleteNodes", 1, false).await;
    let destroy = v1::DeleteClusterRequest {
        name: "watched".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = probe
        .clusters()
        .delete_cluster(destroy)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(f.finish(op).await.state, O::Failed as i32);
    wait_for_state(&probe, "watched", S::Destroyed, WAIT).await;
    let history = f.check_history().await;
    let states = &history[&cluster.uid];
    for expected in [
        ClusterState::Alert,
        ClusterState::Recovering,
        ClusterState::Destroying,
        ClusterState::Destroyed,
    ] {
        assert!(
            states.contains(&expected),
            "{expected} missing from {states:?}"
        );
    }
}

/// The look at the nodes before the first step (a start of a cluster in
/// Error describes it; the scanner leaves Error clusters alone) counts
/// against the operation's deadline. On a hung provider it used to wait for
/// ever: the operation stayed PENDING and the cluster busy.
#[tokio::test]
async fn a_hung_look_before_the_first_step_times_out_the_operation() {
    let mut f = fixture()
        .replica_args(&["--operation-timeout", "start=2"])
        .start()
        .await;
    f.sim.fault("CreateNodes", 1, false).await;
    let request = v1::CreateClusterRequest {
        name: "broken".into(),
        spec: Some(v1::ClusterSpec {
            version: "1.29.0".into(),
            control_nodes: 1,
            node_offering: "m".into(),
            ..Default::default()
        }),
        create_only: false,
        request_id: String::new(),
    };
    let created = f.client.clusters().create_cluster(request).await.unwrap();
    let first_start = created.into_inner().operation.unwrap();
    assert_eq!(f.finish(first_start).await.state, O::Failed as i32);
    assert_eq!(f.state("broken").await, S::Error as i32);
    // Every ask hangs (one cut at the end of the claim's lease period is
    // asked again).
    for _ in 0..3 {
        f.sim.fault("DescribeCluster", 1, true).await;
    }
    let op = f.start("broken").await.unwrap();
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    let error = done.error.unwrap();
    assert_eq!(error.code, "DeadlineExceeded");
    assert!(error.message.contains("describing"), "{}", error.message);
    f.check_history().await;
}

/// The status scan's look at a cluster is bounded: a provider that hangs
/// on one DescribeCluster used to stall the scan of every cluster of the
/// replica for ever.
#[tokio::test]
async fn a_hung_look_does_not_stall_the_scanner() {
    let mut f = fixture().start().await;
    let cluster = f.create("watched", 1, false).await;
    // The next look is the scanner's (every second here).
    f.sim.fault("DescribeCluster", 1, true).await;
    f.sim.set_health(&cluster.uid, false).await;
    wait_for_state(&f.client, "watched", S::Alert, WAIT).await;
    f.check_history().await;
}

#[tokio::test]
async fn operation_history_is_bounded_per_cluster() {
    let mut f = fixture()
        .replica_args(&["--operation-history", "2"])
        .start()
        .await;
    f.create("short", 1, false).await;
    // 1 start + 22 stop/start: far more than the bound below.
    let mut last = String::new();
    for _ in 0..11 {
        let op = f.stop("short").await.unwrap();
        f.finish(op).await;
        let op = f.start("short").await.unwrap();
        last = op.id.clone();
        f.finish(op).await;
    }
    let kept = operations_of(&f.client, "short").await;
    // The owner keeps count of the history and collects it once it is a
    // quarter (at least 1) over the limit: limit + slack = 2 + 1 records at
    // most (3 until the last collection is done), never fewer than the
    // limit. (Collecting every 8th operation kept 8 here.)
    assert!(
        (2..=3).contains(&kept.len()),
        "{} of 23 operations kept",
        kept.len()
    );
    assert_eq!(kept[0].id, last, "newest first, the newest kept");
    assert!(kept.windows(2).all(|w| w[0].id > w[1].id));
    f.check_history().await;
}

/// How many times the replica's executor described a cluster.
async fn describes(f: &Fixture) -> f64 {
    let samples = drover_tests::scrape::metrics(&f.replicas[0].admin_endpoint()).await;
    drover_tests::scrape::sum(
        &samples,
        "drover_provider_request_duration_seconds_count",
        "request=\"DescribeCluster\"",
    )
}

/// The final health check takes the answer of the start (or create) when it
/// shows every node ready, and describes the cluster only otherwise; nodes
/// that are not ready still fail the start into Alert.
#[tokio::test]
async fn the_health_check_describes_only_when_the_last_answer_is_not_all_ready() {
    let mut f = fixture().start().await;
    let cluster = f.create("checked", 1, false).await;
    let op = f.stop("checked").await.unwrap();
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    assert_eq!(describes(&f).await, 0.0, "create's answer was all ready");
    // Stopped: the scanner leaves it alone, so only the start looks.
    f.sim.set_health(&cluster.uid, false).await;
    let op = f.start("checked").await.unwrap();
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    assert_eq!(f.state("checked").await, S::Alert as i32);
    assert_eq!(describes(&f).await, 1.0, "an unready answer is checked");
    f.check_history().await;
}

#[tokio::test]
async fn metrics_and_readiness_are_served_on_the_admin_port() {
    let mut f = fixture().start().await;
    f.create("measured", 1, false).await;
    let op = f.stop("measured").await.unwrap();
    f.finish(op).await;
    let admin = f.replicas[0].admin_endpoint();
    let (status, body) = drover_tests::http_get(&admin, "/metrics");
    assert_eq!(status, 200);
    for expected in [
        "drover_operations_total{kind=\"start\",result=\"succeeded\"} 1",
        "drover_operations_total{kind=\"stop\",result=\"succeeded\"} 1",
        "drover_state_transitions_total{from=\"Running\",to=\"Stopping\"} 1",
        "drover_state_transitions_total{from=\"Stopping\",to=\"Stopped\"} 1",
        "drover_clusters_owned 1",
        "drover_clusters 1",
        "drover_etcd_request_duration_seconds_count{request=\"txn\"}",
        "drover_operation_duration_seconds_count{kind=\"stop\"} 1",
        "drover_provider_request_duration_seconds_count{request=\"CreateNodes\"} 1",
        "drover_provider_request_duration_seconds_count{request=\"StopNodes\"} 1",
        "drover_orphan_recoveries_total 0",
        "drover_lease_keepalive_failures_total 0",
    ] {
        assert!(body.contains(expected), "{expected} missing from:\n{body}");
    }
    assert_eq!(drover_tests::http_get(&admin, "/healthz").0, 200);
    assert_eq!(drover_tests::http_get(&admin, "/readyz").0, 200);
    assert_eq!(drover_tests::http_get(&admin, "/nothing").0, 404);
}

/// etcd's watchers, from its own metrics.
async fn etcd_watchers(etcd: &EtcdProcess) -> f64 {
    let samples = drover_tests::scrape::metrics(&etcd.endpoint()).await;
    drover_tests::scrape::sum(&samples, "etcd_debugging_mvcc_watcher_total", "")
}

/// A WatchClusters stream whose client went away ends its etcd watch at
/// once. It used to end only at the cluster's next change, so watches of a
/// quiet cluster piled up in the replica and in etcd.
#[tokio::test]
async fn a_cluster_watch_ends_when_its_client_goes_away() {
    let mut f = fixture().start().await;
    f.create("quiet", 1, true).await;
    let before = etcd_watchers(&f.etcd).await;
    let mut streams = Vec::new();
    for _ in 0..20 {
        let request = v1::WatchClustersRequest {
            from_revision: 0,
            name: "quiet".into(),
        };
        let stream = f.client.clusters().watch_clusters(request).await.unwrap();
        streams.push(stream.into_inner());
    }
    let etcd = &f.etcd;
    // The replica's ownership passes open and close a watch of their own
    // now and then: a margin of 2.
    wait_until(WAIT, "etcd to count the 20 watches", || async move {
        etcd_watchers(etcd).await >= before + 20.0
    })
    .await;
    drop(streams);
    wait_until(WAIT, "the 20 watches to end", || async move {
        etcd_watchers(etcd).await <= before + 2.0
    })
    .await;
    f.check_history().await;
}

/// UpdateCluster refuses a negative expected generation (it used to answer
/// ABORTED, "retry", for ever) and, as PutTask does, tasks for a cluster
/// that is destroyed; neither writes anything.
#[tokio::test]
async fn update_refuses_a_negative_generation_and_tasks_of_a_destroyed_cluster() {
    let mut f = fixture().start().await;
    f.create("gone", 1, false).await;
    let labels = v1::UpdateClusterRequest {
        name: "gone".into(),
        labels: [("tier".to_string(), "gold".to_string())].into(),
        update_labels: true,
        expected_generation: -1,
        ..Default::default()
    };
    let refused = f
        .client
        .clusters()
        .update_cluster(labels)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("expected_generation: "),
        "{refused:?}"
    );
    let destroy = v1::DeleteClusterRequest {
        name: "gone".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f
        .client
        .clusters()
        .delete_cluster(destroy)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    let before = f.cluster("gone").await;
    let tasks = v1::UpdateClusterRequest {
        name: "gone".into(),
        update_tasks: true,
        ..Default::default()
    };
    let refused = f.client.clusters().update_cluster(tasks).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        f.cluster("gone").await.generation,
        before.generation,
        "nothing written"
    );
    f.check_history().await;
}

#[tokio::test]
async fn update_bumps_the_generation_and_watch_streams_every_change() {
    let mut f = fixture().start().await;
    f.create("seen", 1, false).await;
    let request = v1::WatchClustersRequest {
        from_revision: 0,
        name: "seen".into(),
    };
    let mut events = f
        .client
        .clusters()
        .watch_clusters(request)
        .await
        .unwrap()
        .into_inner();

    let mut labels = std::collections::HashMap::new();
    labels.insert("tier".to_string(), "gold".to_string());
    let update = v1::UpdateClusterRequest {
        name: "seen".into(),
        labels: labels.clone(),
        update_labels: true,
        expected_generation: 1,
        ..Default::default()
    };
    let updated = f
        .client
        .clusters()
        .update_cluster(update.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(updated.generation, 2);
    assert_eq!(updated.spec.unwrap().labels, labels);
    let stale = f
        .client
        .clusters()
        .update_cluster(update)
        .await
        .unwrap_err();
    assert_eq!(
        stale.code(),
        Code::Aborted,
        "generation 1 is gone: {stale:?}"
    );
    // Marked, so that a client does not send the same request again.
    assert_eq!(
        stale
            .metadata()
            .get(drover_proto::REASON_METADATA)
            .and_then(|r| r.to_str().ok()),
        Some(drover_proto::REASON_GENERATION_MISMATCH),
        "{stale:?}"
    );
    assert!(!drover_client::ClientError::Status(stale).is_retryable());
    let bad_cron = v1::TaskSpec {
        r#type: v1::TaskType::Repair as i32,
        name: "nightly".into(),
        schedule: Some(v1::TaskSchedule {
            cron: "every night".into(),
            ..Default::default()
        }),
        properties: None,
    };
    let tasks = v1::UpdateClusterRequest {
        name: "seen".into(),
        update_tasks: true,
        tasks: vec![bad_cron],
        ..Default::default()
    };
    let refused = f.client.clusters().update_cluster(tasks).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("tasks[0].schedule.cron: "),
        "{}",
        refused.message()
    );
    assert_eq!(f.cluster("seen").await.generation, 2, "nothing written");

    let op = f.stop("seen").await.unwrap();
    f.finish(op).await;
    let mut states = Vec::new();
    while states.last() != Some(&(S::Stopped as i32)) {
        let event = tokio::time::timeout(WAIT, events.message())
            .await
            .expect("a watch event")
            .unwrap()
            .expect("the stream is open");
        assert_eq!(event.kind, v1::cluster_event::Kind::Put as i32);
        let cluster = event.cluster.unwrap();
        assert_eq!(cluster.name, "seen");
        states.push(cluster.status.unwrap().state.unwrap());
    }
    assert!(
        states.contains(&(S::Stopping as i32)) || states.len() >= 2,
        "{states:?}"
    );
    f.check_history().await;
}

/// On the owner, the claim is part of the accept: a one-step operation is
/// two etcd writes (accept-and-claim, completion), and its record says who
/// ran it from the first write on.
#[tokio::test]
async fn a_one_step_operation_accepted_by_the_owner_takes_two_writes() {
    use drover_server::store::Store;
    let mut f = fixture().start().await;
    f.create("lean", 1, false).await;
    let store = f.etcd.store().await;
    let before = store.get("/").await.unwrap().revision;
    let op = f.stop("lean").await.unwrap();
    assert_eq!(op.state, O::Running as i32, "claimed in the accept: {op:?}");
    assert_eq!(op.replica.as_deref(), Some("r1"));
    assert!(op.owner_epoch.is_some_and(|epoch| epoch > 0));
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Succeeded as i32);
    let after = store.get("/").await.unwrap().revision;
    assert_eq!(after - before, 2, "accept+claim, then completion");
    f.check_history().await;
}

/// On another replica, the accept folds in the owner's claim as that
/// replica's view of the owner keys shows it: the operation record is
/// written twice (accept-and-claim, completion; before, the owner's claim
/// was a third write), names the owner from the accept on, and the owner
/// runs it. The view follows the owner keys through the ownership passes,
/// so the first accepts may still come PENDING: they are polled until one
/// is claimed and run as claimed, then every one after must be.
#[tokio::test]
async fn a_one_step_operation_accepted_on_another_replica_is_claimed_for_its_owner() {
    let mut f = fixture().replicas(2).start().await;
    f.create("spread", 1, false).await;
    let (preferred, elsewhere, mut client, store) = away_from_the_owner(&f, "spread").await;
    let mut stop_next = false;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        stop_next = !stop_next;
        let (op, _, writes) = counted_stop_or_start(&mut client, &store, "spread", stop_next).await;
        if op.state == O::Running as i32 && writes == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no accept on r{} claimed for the owner {preferred}",
            elsewhere + 1
        );
    }
    for _ in 0..6 {
        stop_next = !stop_next;
        let (op, done, writes) =
            counted_stop_or_start(&mut client, &store, "spread", stop_next).await;
        assert_eq!(op.state, O::Running as i32, "claimed for the owner: {op:?}");
        assert_eq!(op.replica.as_deref(), Some(preferred));
        assert_eq!(done.replica.as_deref(), Some(preferred), "{done:?}");
        assert_eq!(done.runs.len(), 1, "one owner ran it: {done:?}");
        assert_eq!(writes, 2, "accept-and-claim, then completion");
    }
    f.check_history().await;
}

/// The owner's operation feed follows operation writes from the replica's
/// start: the first operation another replica accepts for it (RUNNING
/// under its claim) is found on the feed, and the owner runs it without
/// reading it from etcd and writing a step to claim it again. (The feed
/// used to start on first use, after that operation's record was written.)
#[tokio::test]
async fn the_first_operation_accepted_for_an_owner_is_found_on_its_feed() {
    let mut f = fixture().replicas(2).start().await;
    // Created only: no operation yet, so the owner has taken none up.
    f.create("first", 1, true).await;
    let (preferred, elsewhere, mut client, store) = away_from_the_owner(&f, "first").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut stopping = false;
    loop {
        let (op, _, writes) = counted_stop_or_start(&mut client, &store, "first", stopping).await;
        if op.state == O::Running as i32 {
            assert_eq!(writes, 2, "accept-and-claim, then completion");
            break;
        }
        // Accepted PENDING (this replica's view did not show the owner
        // yet): the owner claimed it itself.
        stopping = !stopping;
        assert!(
            tokio::time::Instant::now() < deadline,
            "no accept on r{} claimed for the owner {preferred}",
            elsewhere + 1
        );
    }
    f.check_history().await;
}

/// Once `name`'s preferred member owns it: that member, the index of the
/// other replica, a client of the other replica and a store on etcd.
async fn away_from_the_owner(
    f: &Fixture,
    name: &str,
) -> (
    &'static str,
    usize,
    drover_client::Client,
    drover_server::store::EtcdStore,
) {
    let preferred = wait_for_preferred_owner(f, name).await;
    let elsewhere = usize::from(preferred == "r1");
    let client = f.replicas[elsewhere].client().await;
    (preferred, elsewhere, client, f.etcd.store().await)
}

/// Waits until `name`'s preferred member among r1 and r2 owns it (a member
/// that just joined claims nothing until its peers watch it), and returns
/// that member.
async fn wait_for_preferred_owner(f: &Fixture, name: &str) -> &'static str {
    let preferred = drover_server::replication::preferred(name, ["r1", "r2"]).unwrap();
    let endpoint = f.replicas[0].endpoint();
    let admin = v1::admin_client::AdminClient::connect(endpoint);
    let admin = admin.await.expect("admin");
    wait_until(WAIT, "the preferred member to own the cluster", || {
        let mut admin = admin.clone();
        async move {
            let owner = drover_tests::owner(&mut admin, name).await;
            owner.is_some_and(|owner| owner.replica == preferred)
        }
    })
    .await;
    preferred
}

/// A stop (or start) of `cluster` through `client`, waited for until it
/// succeeded: the operation as accepted, as finished, and how many times
/// its record was written.
async fn counted_stop_or_start(
    client: &mut drover_client::Client,
    store: &drover_server::store::EtcdStore,
    cluster: &str,
    stopping: bool,
) -> (v1::Operation, v1::Operation, i64) {
    use drover_server::store::Store;
    let op = drover_tests::stop_or_start(client, cluster, stopping).await;
    let op = op.expect("accepted");
    let done = client.wait_operation(&op, WAIT).await.expect("wait");
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    let key = format!("/drover/v1/operations/{cluster}/{}", op.id);
    let record = store.get(&key).await.unwrap().into_single();
    (op, done, record.expect("the record").version)
}

/// A client that waits for an operation and then reads the cluster from the
/// same replica's cache must find it as the operation left it. The owner
/// hands the finished record to its waiters before any watch delivers the
/// completion to the cache; under a concurrent load, without the wait for
/// the cache, some of these reads showed the operation still in progress.
#[tokio::test]
async fn after_wait_operation_the_cached_cluster_shows_the_finished_operation() {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 10;
    let mut f = fixture().start().await;
    for i in 0..CLIENTS {
        f.create(&format!("fresh-{i}"), 1, false).await;
    }
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let mut client = f.replicas[0].client().await;
        let name = format!("fresh-{i}");
        clients.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                for expected in [S::Stopped, S::Running] {
                    let clusters = client.clusters();
                    let op = match expected {
                        S::Stopped => clusters.stop_cluster(stop(&name)).await,
                        _ => clusters.start_cluster(start(&name)).await,
                    };
                    let op = op.expect("accepted").into_inner();
                    let done = client.wait_operation(&op, WAIT).await.expect("wait");
                    assert_eq!(done.state, O::Succeeded as i32, "{name} {round}: {done:?}");
                    let request = v1::GetClusterRequest {
                        name: name.clone(),
                        linearizable: false,
                    };
                    let cached = client.clusters().get_cluster(request).await;
                    let status = cached.expect("get").into_inner().status.expect("status");
                    assert_eq!(
                        (status.state, status.current_operation.as_deref()),
                        (Some(expected as i32), None),
                        "{name} round {round}: the cache shows {status:?} after {done:?}"
                    );
                }
            }
        }));
    }
    for client in clients {
        client.await.expect("a client");
    }
    f.check_history().await;
}

/// An upgrade plans from the nodes the provider describes. A describe that
/// failed used to count as "no nodes": zero steps, SUCCEEDED,
/// `current_version` set to the target and `status.nodes` emptied, with no
/// node upgraded.
#[tokio::test]
async fn an_upgrade_whose_describe_fails_fails_and_leaves_the_status() {
    let mut f = fixture().scan_interval(3600).start().await;
    let created = f.create("up", 2, false).await;
    let before = f.cluster("up").await.status.unwrap();
    assert_eq!(before.nodes.len(), 3, "{before:?}");
    f.sim.fault("DescribeCluster", 1, false).await;
    let op = f.upgrade("up", "1.30.0").await.unwrap();
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    let error = done.error.unwrap();
    assert!(
        error.message.contains("simulated DescribeCluster failure"),
        "the provider's error: {}",
        error.message
    );
    let status = f.cluster("up").await.status.unwrap();
    assert_eq!(status.current_version.as_deref(), Some("1.29.0"));
    assert_eq!(status.nodes, before.nodes, "the nodes as they were");
    let audit = f.sim.audit(&created.uid).await;
    assert!(!methods(&audit).contains(&"UpgradeNode"), "{audit:?}");
    f.check_history().await;
}

/// A failed first step has no provider answer: the status keeps the nodes
/// it showed. It used to be emptied, and RemoveNodes then refused the
/// cluster's real workers as "not a worker node". The failed add-nodes
/// says that the spec asks for more workers than exist, and shows the one
/// it lacks as missing.
#[tokio::test]
async fn a_failed_first_step_keeps_the_nodes_and_says_what_is_missing() {
    let mut f = fixture().scan_interval(3600).start().await;
    f.create("w", 2, false).await;
    let before = f.cluster("w").await.status.unwrap();
    f.sim.fault("ResizeNodes", 1, false).await;
    let op = f.add_nodes("w", 1).await;
    assert_eq!(f.finish(op).await.state, O::Failed as i32);
    let status = f.cluster("w").await.status.unwrap();
    let (missing, real): (Vec<_>, Vec<_>) = status
        .nodes
        .into_iter()
        .partition(|n| n.power_state == "missing");
    assert_eq!(real, before.nodes, "the nodes as they were");
    let missing: Vec<&str> = missing.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(missing, ["missing-worker-1"], "the worker the spec lacks");
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("3 worker nodes") && message.contains("shows 2"),
        "the gap between spec and provider: {message}"
    );

    f.sim.fault("StopNodes", 1, false).await;
    let op = f.stop("w").await.unwrap();
    assert_eq!(f.finish(op).await.state, O::Failed as i32);
    let status = f.cluster("w").await.status.unwrap();
    let real = status
        .nodes
        .into_iter()
        .filter(|n| n.power_state != "missing");
    assert_eq!(
        real.collect::<Vec<_>>(),
        before.nodes,
        "the nodes as they were"
    );

    let worker = before.nodes.iter().find(|n| n.role == "worker").unwrap();
    let remove = v1::RemoveNodesRequest {
        name: "w".into(),
        node_ids: vec![worker.id.clone()],
        request_id: String::new(),
        ..Default::default()
    };
    let op = f.client.clusters().remove_nodes(remove).await;
    let op = op.expect("a real worker can be removed").into_inner();
    assert_eq!(f.finish(op).await.state, O::Succeeded as i32);
    f.check_history().await;
}

/// A cluster never started is stopped and deleted without a single call to
/// its provider: the stop is a no-op, the delete goes Created ->
/// Destroying -> Destroyed with no step (a delete of a Created cluster used
/// to be refused, FAILED_PRECONDITION).
#[tokio::test]
async fn a_cluster_never_started_is_stopped_and_deleted_without_its_provider() {
    let mut f = fixture().start().await;
    let created = f.create("draft", 1, true).await;
    let stopped = f.stop("draft").await.expect("stop");
    let stopped = f.finish(stopped).await;
    assert_eq!(stopped.state, O::Succeeded as i32, "{stopped:?}");
    assert_eq!(stopped.entered_state, S::Created as i32, "a go-ahead");
    assert!(
        stopped.progress.is_none_or(|p| p.total_steps == 0),
        "no step"
    );
    assert_eq!(f.state("draft").await, S::Created as i32);

    let destroy = v1::DeleteClusterRequest {
        name: "draft".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f.client.clusters().delete_cluster(destroy).await;
    let op = op.expect("a Created cluster can be deleted").into_inner();
    assert_eq!(op.entered_state, S::Destroying as i32);
    let op = f.finish(op).await;
    assert_eq!(op.state, O::Succeeded as i32, "{op:?}");
    assert!(op.progress.is_none_or(|p| p.total_steps == 0), "no step");
    wait_for_state(&f.client, "draft", S::Destroyed, WAIT).await;
    let calls = f.sim.audit(&created.uid).await;
    assert!(calls.is_empty(), "provider calls: {calls:?}");
    let history = f.check_history().await;
    let draft: Vec<_> = history.values().flatten().collect();
    assert!(
        draft.contains(&&ClusterState::Destroyed),
        "replayed: {history:?}"
    );
}

/// Versions are semantic versions: an upgrade to a lower one is refused,
/// naming `version`, unless the request allows a downgrade; the same
/// version is accepted and has nothing to do.
#[tokio::test]
async fn a_downgrade_is_refused_unless_allowed() {
    let mut f = fixture().start().await;
    create_running(&mut f.client, "web", 1).await;
    let before = f.cluster("web").await;
    let refused = f.upgrade("web", "1.28.9").await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let message = refused.message();
    assert!(message.starts_with("version: "), "{message}");
    assert!(message.contains("1.29.0") && message.contains("allow_downgrade"));
    assert_eq!(
        f.cluster("web").await.generation,
        before.generation,
        "nothing was written"
    );

    let same = f.upgrade("web", "1.29.0").await.expect("the same version");
    let same = f.finish(same).await;
    assert_eq!(same.state, O::Succeeded as i32, "{same:?}");
    assert!(same.progress.is_none_or(|p| p.total_steps == 0), "no step");

    let mut down = upgrade("web", "1.28.9");
    down.allow_downgrade = true;
    let down = f.client.clusters().upgrade_cluster(down).await;
    let down = f
        .finish(down.expect("an allowed downgrade").into_inner())
        .await;
    assert_eq!(down.state, O::Succeeded as i32, "{down:?}");
    assert!(down.params.unwrap().allow_downgrade, "on the record");
    let status = f.cluster("web").await.status.unwrap();
    assert_eq!(status.current_version.as_deref(), Some("1.28.9"));

    // Ordered as numbers, not as text: 1.100.0 is an upgrade of 1.28.9.
    let up = f
        .upgrade("web", "1.100.0")
        .await
        .expect("1.100.0 is higher");
    let up = f.finish(up).await;
    assert_eq!(up.state, O::Succeeded as i32, "{up:?}");
    f.check_history().await;
}

/// A stop that did half its nodes and failed, then could not describe the
/// nodes: the status shows the nodes as they were before it. The scanner
/// refreshes them from the provider (fenced) once it answers again, with
/// no new operation.
#[tokio::test]
async fn a_status_left_stale_by_a_failed_step_heals_without_an_operation() {
    let mut f = fixture().start().await;
    let cluster = f.create("stale", 3, false).await;
    f.sim
        .set_faults(
            "StopNodes:partial=1;DescribeCluster:error=1",
            1,
            Duration::ZERO,
        )
        .await;
    let op = f.stop("stale").await.unwrap();
    let done = f.finish(op).await;
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    let powers = |nodes: Vec<(String, String)>| {
        let mut nodes = nodes;
        nodes.sort();
        nodes
    };
    let shown = |c: v1::Cluster| {
        powers(
            c.status
                .unwrap()
                .nodes
                .into_iter()
                .map(|n| (n.id, n.power_state))
                .collect(),
        )
    };
    // Read while the provider still fails every describe: the scanner
    // cannot have refreshed it yet.
    let before = shown(f.cluster("stale").await);
    let operations = operations_of(&f.client, "stale").await.len();
    f.sim.set_faults("", 1, Duration::ZERO).await;
    let real = powers(
        f.sim
            .nodes(&cluster.uid)
            .await
            .into_iter()
            .map(|n| (n.id, n.power_state))
            .collect(),
    );
    assert!(
        real.iter().any(|(_, p)| p == "off"),
        "half stopped: {real:?}"
    );
    assert_ne!(
        before, real,
        "the status was not stale: the test proves nothing"
    );
    let client = f.client.clone();
    wait_until(WAIT, "the status to show the provider's nodes", || {
        let (mut client, real) = (client.clone(), real.clone());
        async move { shown(client.get_cluster("stale").await.unwrap()) == real }
    })
    .await;
    assert_eq!(
        operations_of(&f.client, "stale").await.len(),
        operations,
        "no new operation"
    );
    f.check_history().await;
}
