//! Maintenance windows (`spec.maintenance`, `droverctl cluster update
//! --window`): outside its window Drover starts nothing of its own for a
//! cluster — no task run, no rollout step — and says when the window
//! opens; an operator's own requests still run. Bad windows are refused
//! naming the field, and write nothing.

use drover_client::v1;
use drover_client::Client;
use drover_tests::fixture::Fixture;
use drover_tests::{
    create_only, create_running, has_run, repair_now, repair_status, roll_one, rollout_status,
    wait_for_repair, wait_until,
};
use std::process::Output;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const WAIT: Duration = Duration::from_secs(20);
/// How long "nothing starts" is watched once the task says it waits: a
/// run would have started well within it.
const QUIET: Duration = Duration::from_secs(2);
/// Asia/Kolkata is UTC+05:30 all year (no DST), so a window there can be
/// computed from the UTC clock alone.
const KOLKATA: i64 = 5 * 60 + 30;

/// `HH:MM` of `minutes` past midnight, wrapped into one day.
fn hhmm(minutes: i64) -> String {
    let m = minutes.rem_euclid(24 * 60);
    format!("{:02}:{:02}", m / 60, m % 60)
}

/// Minutes since midnight UTC now.
fn utc_minute() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (now.as_secs() as i64 / 60).rem_euclid(24 * 60)
}

/// A daily window from `from` to `to` minutes away from now, in UTC.
fn window_from_now(from: i64, to: i64) -> v1::MaintenanceWindow {
    let now = utc_minute();
    v1::MaintenanceWindow {
        window: vec![hhmm(now + from), hhmm(now + to)],
        timezone: String::new(),
    }
}

fn set_window(name: &str, window: v1::MaintenanceWindow) -> v1::UpdateClusterRequest {
    v1::UpdateClusterRequest {
        name: name.into(),
        maintenance: Some(window),
        update_maintenance: true,
        ..Default::default()
    }
}

async fn update(
    client: &Client,
    request: v1::UpdateClusterRequest,
) -> Result<v1::Cluster, tonic::Status> {
    let updated = client.clone().clusters().update_cluster(request).await;
    updated.map(tonic::Response::into_inner)
}

fn droverctl(f: &Fixture, args: &[&str]) -> Output {
    std::process::Command::new(drover_tests::workspace_binary("droverctl"))
        .args(["--endpoint", &f.replicas[0].endpoint()])
        .args(args)
        .output()
        .expect("droverctl runs")
}

#[tokio::test]
async fn a_due_task_waits_for_the_window_and_an_operators_request_does_not() {
    let mut f = Fixture::builder().start().await;
    let cluster = create_running(&mut f.client, "windowed", 1).await;
    // A window two hours from now, for an hour, set in Kolkata's time.
    let local = utc_minute() + KOLKATA;
    let (start, end) = (hhmm(local + 120), hhmm(local + 180));
    let bounds = format!("{start},{end}");
    let out = droverctl(
        &f,
        &[
            "cluster",
            "update",
            "windowed",
            "--window",
            &bounds,
            "--timezone",
            "Asia/Kolkata",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let got = f.client.get_cluster("windowed").await.unwrap();
    assert_eq!(
        got.generation,
        cluster.generation + 1,
        "an edit of the spec"
    );
    let maintenance = got.spec.unwrap().maintenance.unwrap_or_default();
    assert_eq!(maintenance.window, [start.clone(), end.clone()]);
    assert_eq!(maintenance.timezone, "Asia/Kolkata");
    let out = droverctl(&f, &["cluster", "describe", "windowed"]);
    let described = String::from_utf8_lossy(&out.stdout);
    let shown = format!("{start}..{end} (Asia/Kolkata)");
    assert!(described.contains(&shown), "{described}");

    // A task due now waits, saying why and when the window opens.
    let put = v1::PutTaskRequest {
        cluster: "windowed".into(),
        task: Some(repair_now("now")),
    };
    f.client.tasks().put_task(put).await.expect("task put");
    let client = f.client.clone();
    wait_until(WAIT, "the task to say it waits for the window", || {
        let client = client.clone();
        async move {
            let status = repair_status(&client, "windowed", "now").await;
            status
                .error
                .is_some_and(|e| e.contains("outside the maintenance window"))
        }
    })
    .await;
    let error = repair_status(&f.client, "windowed", "now")
        .await
        .error
        .unwrap();
    assert!(
        error.contains(&format!("({start}..{end} Asia/Kolkata)")),
        "{error}"
    );
    assert!(error.contains("; it opens at 20"), "{error}");
    let out = droverctl(&f, &["task", "list", "windowed"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("outside the maintenance window"),
        "{listed}"
    );

    // The operator's own requests run all the same.
    let stop = v1::StopClusterRequest {
        name: "windowed".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f.client.clusters().stop_cluster(stop).await.unwrap();
    let done = f.finish(op.into_inner()).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    let start_request = v1::StartClusterRequest {
        name: "windowed".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f
        .client
        .clusters()
        .start_cluster(start_request)
        .await
        .unwrap();
    let done = f.finish(op.into_inner()).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    let quiet_until = Instant::now() + QUIET;
    while Instant::now() < quiet_until {
        assert!(
            !has_run(&repair_status(&f.client, "windowed", "now").await),
            "no task run"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let audit = f.sim.audit(&cluster.uid).await;
    assert!(
        audit.iter().all(|e| e.method != "RunTask"),
        "the provider was asked for no run: {audit:?}"
    );

    // A window open now lets the run start.
    update(&f.client, set_window("windowed", window_from_now(-60, 120)))
        .await
        .expect("window set");
    let what = "the task to run once the window is open";
    wait_for_repair(&f.client, "windowed", what, has_run).await;
    f.check_history().await;
}

#[tokio::test]
async fn bad_windows_are_refused_naming_the_field_and_write_nothing() {
    let mut f = Fixture::builder().start().await;
    f.client
        .clusters()
        .create_cluster(create_only("strict"))
        .await
        .expect("created");
    let generation = f.client.get_cluster("strict").await.unwrap().generation;
    let window = |bounds: &[&str], timezone: &str| v1::MaintenanceWindow {
        window: bounds.iter().map(|b| b.to_string()).collect(),
        timezone: timezone.into(),
    };
    let cases = [
        (window(&["Sat-22:00"], ""), "maintenance.window:"),
        (window(&["01:00", "25:00"], ""), "maintenance.window[1]"),
        (window(&["Sat-22:00", "06:00"], ""), "maintenance.window[1]"),
        (
            window(&["01:00", "02:00", "03:00", "03:00"], ""),
            "maintenance.window[3]",
        ),
        (
            window(&["01:00", "02:00"], "Mars/Olympus"),
            "maintenance.timezone",
        ),
    ];
    for (bad, field) in cases {
        let refused = update(&f.client, set_window("strict", bad.clone()))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{bad:?}");
        assert!(refused.message().contains(field), "{bad:?}: {refused:?}");
    }
    let health = v1::UpdateClusterRequest {
        name: "strict".into(),
        health: Some(v1::HealthPolicy {
            max_unhealthy: "lots".into(),
            ..Default::default()
        }),
        update_health: true,
        ..Default::default()
    };
    let refused = update(&f.client, health).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("health.max_unhealthy"),
        "{refused:?}"
    );
    // A good window alongside a bad policy: the whole update is refused.
    let mixed = v1::UpdateClusterRequest {
        health: Some(v1::HealthPolicy {
            max_in_flight: Some(0),
            ..Default::default()
        }),
        update_health: true,
        ..set_window("strict", window(&["01:00", "05:00"], ""))
    };
    let refused = update(&f.client, mixed).await.unwrap_err();
    assert!(
        refused.message().contains("health.max_in_flight"),
        "{refused:?}"
    );
    // From the command line: exit 5, invalid argument, naming the field.
    let out = droverctl(&f, &["cluster", "update", "strict", "--window", "01:00"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("maintenance.window"), "{stderr}");
    // A create with a bad window is refused the same way, under `spec`.
    let mut create = create_only("strict-too");
    create.spec.as_mut().unwrap().maintenance = Some(window(&["Mon-01:00", "Mon-01:00"], ""));
    let refused = f
        .client
        .clusters()
        .create_cluster(create)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("spec.maintenance.window[1]"),
        "{refused:?}"
    );

    let got = f.client.get_cluster("strict").await.unwrap();
    assert_eq!(got.generation, generation, "refusals wrote nothing");
    let maintenance = got.spec.unwrap().maintenance.unwrap_or_default();
    assert_eq!(maintenance, v1::MaintenanceWindow::default(), "no window");

    // Good ones are written, in one generation, and cleared again.
    let both = v1::UpdateClusterRequest {
        health: Some(v1::HealthPolicy {
            max_unhealthy: "2".into(),
            ..Default::default()
        }),
        update_health: true,
        ..set_window(
            "strict",
            window(&["sat-22:00", "Sun-06:00"], "Europe/Warsaw"),
        )
    };
    let got = update(&f.client, both).await.expect("updated");
    assert_eq!(got.generation, generation + 1);
    let spec = got.spec.unwrap();
    let maintenance = spec.maintenance.unwrap_or_default();
    assert_eq!(maintenance.window, ["sat-22:00", "Sun-06:00"]);
    assert_eq!(maintenance.timezone, "Europe/Warsaw");
    assert_eq!(spec.health.unwrap_or_default().max_unhealthy, "2");
    let out = droverctl(&f, &["cluster", "update", "strict", "--no-window"]);
    assert!(out.status.success(), "{out:?}");
    let got = f.client.get_cluster("strict").await.unwrap();
    assert_eq!(got.generation, generation + 2);
    let spec = got.spec.unwrap();
    assert!(spec.maintenance.unwrap_or_default().window.is_empty());
    assert_eq!(spec.health.unwrap_or_default().max_unhealthy, "2", "kept");
}

#[tokio::test]
async fn a_rollout_waits_for_the_window_and_goes_on_when_it_opens() {
    let mut f = Fixture::builder().start().await;
    create_running(&mut f.client, "rolled", 1).await;
    update(&f.client, set_window("rolled", window_from_now(120, 180)))
        .await
        .expect("window set");
    roll_one(&f.client, "past-window", "rolled", "1.30.0").await;
    let client = f.client.clone();
    wait_until(WAIT, "the rollout's cluster to wait for the window", || {
        let client = client.clone();
        async move {
            let status = rollout_status(&client, "past-window").await;
            status.clusters.iter().any(|c| {
                c.state == v1::TargetState::TargetPending as i32
                    && c.message
                        .starts_with("waiting: outside the maintenance window (")
                    && c.message.contains("; it opens at ")
            })
        }
    })
    .await;
    let got = f.client.get_cluster("rolled").await.unwrap();
    let status = got.status.unwrap_or_default();
    assert_eq!(
        status.current_operation, None,
        "the rollout started nothing"
    );

    update(&f.client, set_window("rolled", window_from_now(-60, 120)))
        .await
        .expect("window set");
    let client = f.client.clone();
    wait_until(WAIT, "the rollout to succeed once the window opens", || {
        let client = client.clone();
        async move {
            let status = rollout_status(&client, "past-window").await;
            status.state == v1::RolloutState::RolloutSucceeded as i32
        }
    })
    .await;
    let cluster = f.client.get_cluster("rolled").await.unwrap();
    assert_eq!(cluster.spec.unwrap().version, "1.30.0");
}
