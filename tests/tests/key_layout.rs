//! The etcd key layout as the README promises it, end to end: a real etcd,
//! the simulated provider process and a `drover serve` process with a short
//! operation history, so that history collection runs during the tests.

use drover_client::v1::{self, ClusterState as S, OperationState as O};
use drover_server::store::{RangeRequest, Store};
use drover_tests::fixture::Fixture;
use drover_tests::{create_running, operations_of, wait_until};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const PREFIX: &str = "/drover/v1/";

/// One replica keeping two finished operations per cluster.
async fn fixture() -> Fixture {
    let builder = Fixture::builder().scan_interval(1);
    builder
        .replica_args(&["--operation-history", "2"])
        .start()
        .await
}

/// The operations these tests run, and what the provider saw of them.
trait Runs {
    async fn run(&mut self, cluster: &str, stop: bool, request_id: &str) -> v1::Operation;
    async fn stop_nodes_calls(&self, uid: &str) -> usize;
}

impl Runs for Fixture {
    /// Stops (`stop`) or starts `cluster` under `request_id` and waits for
    /// the operation to succeed; returns it.
    async fn run(&mut self, cluster: &str, stop: bool, request_id: &str) -> v1::Operation {
        let (name, request_id) = (cluster.to_string(), request_id.to_string());
        let clusters = &mut self.client.clusters();
        let accepted = if stop {
            let request = v1::StopClusterRequest {
                name,
                request_id,
                ..Default::default()
            };
            clusters.stop_cluster(request).await
        } else {
            let request = v1::StartClusterRequest {
                name,
                request_id,
                ..Default::default()
            };
            clusters.start_cluster(request).await
        };
        let accepted = accepted.expect("accepted").into_inner();
        let done = self
            .client
            .wait_operation(&accepted, WAIT)
            .await
            .expect("wait");
        assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
        done
    }

    async fn stop_nodes_calls(&self, uid: &str) -> usize {
        let audit = self.sim.audit(uid).await;
        audit.iter().filter(|e| e.method == "StopNodes").count()
    }
}

/// A rollout that upgraded `layout` and waits at an approval gate, so
/// every kind of rollout key exists (its owner key too: it is not settled).
async fn held_rollout(f: &mut Fixture) {
    let stage = |name: &str, approval_required| v1::RolloutStage {
        name: name.into(),
        approval_required,
        ..Default::default()
    };
    let spec = v1::RolloutSpec {
        clusters: vec!["layout".into()],
        version: "1.30.0".into(),
        stages: vec![stage("all", false), stage("gate", true)],
        ..Default::default()
    };
    let request = v1::CreateRolloutRequest {
        name: "layout".into(),
        spec: Some(spec),
    };
    f.client
        .rollouts()
        .create_rollout(request)
        .await
        .expect("a rollout");
    wait_until(WAIT, "the rollout to wait at its gate", || {
        let mut client = f.client.clone();
        async move {
            let request = v1::GetRolloutRequest {
                name: "layout".into(),
            };
            let rollout = client.rollouts().get_rollout(request).await.unwrap();
            let state = rollout.into_inner().status.map_or(0, |s| s.state);
            state == v1::RolloutState::RolloutWaitingApproval as i32
        }
    })
    .await;
}

#[tokio::test]
async fn every_value_under_the_prefix_is_json() {
    let mut f = fixture().await;
    create_running(&mut f.client, "layout", 1).await;
    // Enough operations with request ids that history collection has run
    // (the entries of collected operations are rewritten), and a task run.
    for i in 0..3 {
        f.run("layout", true, &format!("stop-{i}")).await;
        f.run("layout", false, &format!("start-{i}")).await;
    }
    let task = drover_tests::repair_now("nightly");
    let put = v1::PutTaskRequest {
        cluster: "layout".into(),
        task: Some(task),
    };
    f.client.tasks().put_task(put).await.expect("put task");
    let store = f.etcd.store().await;
    let runs = format!("{PREFIX}runs/");
    wait_until(WAIT, "a task run to be recorded", || {
        let (store, runs) = (&store, runs.clone());
        async move {
            let listed = store.range(RangeRequest::prefix(runs)).await.unwrap();
            !listed.kvs.is_empty()
        }
    })
    .await;

    held_rollout(&mut f).await;

    let all = store.range(RangeRequest::prefix(PREFIX)).await.unwrap();
    let mut kinds = std::collections::BTreeSet::new();
    for kv in &all.kvs {
        let value: Result<serde_json::Value, _> = serde_json::from_slice(&kv.value);
        let value = value.unwrap_or_else(|error| {
            panic!(
                "{} holds {:?}, not JSON: {error}",
                kv.key,
                String::from_utf8_lossy(&kv.value)
            )
        });
        assert!(value.is_object(), "{} holds {value}", kv.key);
        kinds.insert(
            kv.key[PREFIX.len()..]
                .split('/')
                .next()
                .unwrap()
                .to_string(),
        );
    }
    let expected = [
        "clusters",
        "fence",
        "members",
        "operations",
        "owners",
        "requests",
        "rollout-clusters",
        "rollout-owners",
        "rollout-status",
        "rollout-targets",
        "rollouts",
        "runs",
    ];
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), expected);
}

#[tokio::test]
async fn a_retried_request_id_answers_with_its_operation_after_history_collection() {
    let mut f = fixture().await;
    let cluster = create_running(&mut f.client, "retried", 1).await;
    let first = f.run("retried", true, "stop-once").await;
    f.run("retried", false, "").await;
    // Far more operations than the history keeps: the stop's record goes.
    for _ in 0..3 {
        f.run("retried", true, "").await;
        f.run("retried", false, "").await;
    }
    let kept = operations_of(&f.client, "retried").await;
    assert!(
        kept.iter().all(|op| op.id != first.id) && kept.len() <= 3,
        "the stop was collected: {} kept",
        kept.len()
    );
    let stops = f.stop_nodes_calls(&cluster.uid).await;

    // The client retries the first stop (its answer was lost, say).
    let retry = v1::StopClusterRequest {
        name: "retried".into(),
        request_id: "stop-once".into(),
        ..Default::default()
    };
    let answer = f.client.clusters().stop_cluster(retry).await;
    let answer = answer.expect("the retry is answered").into_inner();
    assert_eq!(answer.id, first.id, "the first stop's answer");
    assert_eq!(answer.state, O::Succeeded as i32, "as it ended");
    let now = f.client.get_cluster("retried").await.expect("get");
    let state = now.status.and_then(|s| s.state);
    assert_eq!(state, Some(S::Running as i32), "nothing stopped it");
    assert_eq!(f.stop_nodes_calls(&cluster.uid).await, stops, "no call");
}
