//! A paused cluster (`spec.paused`, `droverctl cluster pause`): observed,
//! but Drover starts nothing on its own for it — no remediation, no task
//! run, no rollout step — until it is unpaused; an operator's own requests
//! still run.

use drover_client::v1::{self, ClusterState as S};
use drover_client::Client;
use drover_tests::fixture::Fixture;
use drover_tests::{
    create_running, has_run, repair_now, repair_status, roll_one, rollout_status, wait_for_repair,
    wait_for_state, wait_until,
};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);
/// How long "nothing starts" is watched: three scans at one a second.
const QUIET: Duration = Duration::from_secs(3);

async fn set_paused(client: &mut Client, name: &str, paused: bool) -> v1::Cluster {
    let request = v1::UpdateClusterRequest {
        name: name.into(),
        paused: Some(paused),
        ..Default::default()
    };
    let updated = client.clusters().update_cluster(request).await;
    updated.expect("paused or unpaused").into_inner()
}

async fn state_of(client: &Client, cluster: &str) -> (S, Option<String>) {
    let got = client
        .clone()
        .get_cluster(cluster)
        .await
        .expect("the cluster");
    let status = got.status.unwrap_or_default();
    let state = S::try_from(status.state.unwrap_or_default()).unwrap();
    (state, status.current_operation)
}

#[tokio::test]
async fn a_paused_cluster_is_observed_but_nothing_starts_on_its_own_until_unpaused() {
    let mut f = Fixture::builder().scan_interval(1).start().await;
    let cluster = create_running(&mut f.client, "held", 1).await;
    // Paused from the command line; the table says so.
    let out = std::process::Command::new(drover_tests::workspace_binary("droverctl"))
        .args(["--endpoint", &f.replicas[0].endpoint()])
        .args(["cluster", "pause", "held"])
        .output()
        .expect("droverctl runs");
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("RUNNING (paused)"), "{table}");
    let got = f.client.get_cluster("held").await.unwrap();
    assert!(got.spec.unwrap().paused);

    // A task due now waits, saying why.
    let put = v1::PutTaskRequest {
        cluster: "held".into(),
        task: Some(repair_now("now")),
    };
    f.client.tasks().put_task(put).await.expect("task put");
    let client = f.client.clone();
    wait_until(WAIT, "the task to say it waits for the pause", || {
        let client = client.clone();
        async move {
            let status = repair_status(&client, "held", "now").await;
            status.error.is_some_and(|e| e.contains("paused"))
        }
    })
    .await;

    // A fault is observed (Alert); healthy again, nothing recovers it.
    f.sim.set_health(&cluster.uid, false).await;
    wait_for_state(&f.client, "held", S::Alert, WAIT).await;
    f.sim.set_health(&cluster.uid, true).await;
    let quiet_until = Instant::now() + QUIET;
    while Instant::now() < quiet_until {
        let (state, operation) = state_of(&f.client, "held").await;
        assert_eq!((state, &operation), (S::Alert, &None), "nothing starts");
        assert!(
            !has_run(&repair_status(&f.client, "held", "now").await),
            "no task run"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let audit = f.sim.audit(&cluster.uid).await;
    assert!(
        audit.iter().all(|e| e.method != "RunTask"),
        "the provider was asked for no run: {audit:?}"
    );

    // Unpaused: the scanner recovers it and the task runs.
    set_paused(&mut f.client, "held", false).await;
    wait_for_state(&f.client, "held", S::Running, WAIT).await;
    wait_for_repair(&f.client, "held", "the task to run once unpaused", has_run).await;
    f.check_history().await;
}

#[tokio::test]
async fn a_rollout_waits_for_a_paused_cluster_and_an_operator_request_does_not() {
    let mut f = Fixture::builder().start().await;
    create_running(&mut f.client, "rolled", 1).await;
    set_paused(&mut f.client, "rolled", true).await;
    // The operator's own request runs on a paused cluster.
    let stop = v1::StopClusterRequest {
        name: "rolled".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f.client.clusters().stop_cluster(stop).await.unwrap();
    f.finish(op.into_inner()).await;
    let start = v1::StartClusterRequest {
        name: "rolled".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f.client.clusters().start_cluster(start).await.unwrap();
    f.finish(op.into_inner()).await;

    roll_one(&f.client, "past-pause", "rolled", "1.30.0").await;
    let client = f.client.clone();
    wait_until(WAIT, "the rollout's cluster to wait for the pause", || {
        let client = client.clone();
        async move {
            let status = rollout_status(&client, "past-pause").await;
            status.clusters.iter().any(|c| {
                c.state == v1::TargetState::TargetPending as i32 && c.message.contains("paused")
            })
        }
    })
    .await;
    let (_, operation) = state_of(&f.client, "rolled").await;
    assert_eq!(operation, None, "the rollout started nothing");

    set_paused(&mut f.client, "rolled", false).await;
    let client = f.client.clone();
    wait_until(WAIT, "the rollout to succeed once unpaused", || {
        let client = client.clone();
        async move {
            let status = rollout_status(&client, "past-pause").await;
            status.state == v1::RolloutState::RolloutSucceeded as i32
        }
    })
    .await;
    let cluster = f.client.get_cluster("rolled").await.unwrap();
    assert_eq!(cluster.spec.unwrap().version, "1.30.0");
}

async fn update(
    client: &mut Client,
    request: v1::UpdateClusterRequest,
) -> Result<(), tonic::Status> {
    client.clusters().update_cluster(request).await.map(drop)
}

/// sctool's suspend and resume: a cluster's task runs suspended until
/// resumed, or for a while (they start by themselves after it).
#[tokio::test]
async fn task_runs_wait_while_suspended_and_start_when_resumed_or_the_time_is_up() {
    let mut f = Fixture::builder().start().await;
    create_running(&mut f.client, "quiet", 1).await;
    // Bad suspensions are refused naming the field, and change nothing.
    let past = drover_proto::Timestamp {
        seconds: 1,
        nanos: 0,
    };
    let refused = update(
        &mut f.client,
        v1::UpdateClusterRequest {
            name: "quiet".into(),
            suspend_tasks: Some(v1::TaskSuspension { until: Some(past) }),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("suspend_tasks.until"),
        "{refused:?}"
    );
    let both = v1::UpdateClusterRequest {
        name: "quiet".into(),
        suspend_tasks: Some(v1::TaskSuspension::default()),
        resume_tasks: true,
        ..Default::default()
    };
    let refused = update(&mut f.client, both).await.unwrap_err();
    assert!(refused.message().contains("resume_tasks"), "{refused:?}");
    let generation = f.client.get_cluster("quiet").await.unwrap().generation;

    // Until resumed.
    let suspend = v1::UpdateClusterRequest {
        name: "quiet".into(),
        suspend_tasks: Some(v1::TaskSuspension::default()),
        ..Default::default()
    };
    update(&mut f.client, suspend).await.unwrap();
    let cluster = f.client.get_cluster("quiet").await.unwrap();
    assert_eq!(cluster.generation, generation + 1, "refusals wrote nothing");
    let put = v1::PutTaskRequest {
        cluster: "quiet".into(),
        task: Some(repair_now("now")),
    };
    f.client.tasks().put_task(put).await.expect("task put");
    wait_for_repair(&f.client, "quiet", "the task to wait, suspended", |s| {
        s.error
            .as_deref()
            .is_some_and(|e| e.contains("suspended until resumed"))
    })
    .await;
    assert!(!has_run(&repair_status(&f.client, "quiet", "now").await));
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(drover_tests::workspace_binary("droverctl"))
            .args(["--endpoint", &f.replicas[0].endpoint()])
            .args(args)
            .output()
            .expect("droverctl runs");
        assert!(out.status.success(), "{out:?}");
    };
    ctl(&["task", "resume", "quiet"]);
    wait_for_repair(&f.client, "quiet", "the task to run once resumed", has_run).await;

    // For a while: a new start date runs once the time is up, by itself.
    ctl(&["task", "suspend", "quiet", "--for", "2s"]);
    let mut again = repair_now("now");
    again.schedule.as_mut().unwrap().start_date = "now+1s".into();
    let put = v1::PutTaskRequest {
        cluster: "quiet".into(),
        task: Some(again),
    };
    f.client.tasks().put_task(put).await.expect("task put");
    wait_for_repair(&f.client, "quiet", "the task to wait until a time", |s| {
        s.error
            .as_deref()
            .is_some_and(|e| e.contains("suspended until 20"))
    })
    .await;
    wait_for_repair(
        &f.client,
        "quiet",
        "the task to run after the suspension",
        |s| s.success_count == Some(2),
    )
    .await;
}
