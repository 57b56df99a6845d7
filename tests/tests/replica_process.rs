//! The replica process itself: configuration errors, health, reflection,
//! graceful exit, and the embedded mode.

use drover_client::v1;
use drover_tests::etcd::EtcdProcess;
use drover_tests::fixture::{Backends, Fixture};
use drover_tests::replica::{health, service_health, ReplicaProcess};
use drover_tests::scrape::{fetch, metrics};
use drover_tests::workspace_binary;
use drover_tests::{create_only, create_running, owner, wait_until, TempDir};
use std::process::Command;
use std::time::Duration;
use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_reflection::pb::v1::{
    server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
    server_reflection_response::MessageResponse, ServerReflectionRequest,
};

fn drover(args: &[&str]) -> std::process::Output {
    Command::new(workspace_binary("drover"))
        .args(args)
        .output()
        .expect("run drover")
}

#[test]
fn a_bad_configuration_exits_64_with_one_line() {
    let dir = drover_tests::TempDir::new("config");
    let file = dir.path().join("drover.toml");
    std::fs::write(&file, "lease_ttl = 3\nunknown_setting = 1\n").unwrap();
    let file_arg = file.to_string_lossy().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["serve", "--lease-ttl", "0", "--replica-id", "r"],
            "lease_ttl",
        ),
        (
            vec!["serve", "--listen", "localhost", "--replica-id", "r"],
            "listen",
        ),
        (
            vec![
                "serve",
                "--etcd-endpoints",
                "127.0.0.1:2379",
                "--replica-id",
                "r",
            ],
            "etcd_endpoints",
        ),
        (
            vec!["serve", "--log-format", "xml", "--replica-id", "r"],
            "log_format",
        ),
        (
            vec!["serve", "--config", &file_arg, "--replica-id", "r"],
            "unknown_setting",
        ),
        (vec!["serve", "--lease-ttl", "soon"], "lease-ttl"),
    ];
    for (args, mention) in cases {
        let output = drover(&args);
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(mention), "{args:?}: {stderr}");
    }
    let output = drover(&["serve", "--lease-ttl", "0", "--replica-id", "r"]);
    assert_eq!(
        String::from_utf8_lossy(&output.stderr)
            .trim()
            .lines()
            .count(),
        1
    );
}

#[tokio::test]
async fn reflection_lists_every_service() {
    let replica = ReplicaProcess::dev().await;
    let channel = tonic::transport::Channel::from_shared(replica.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("expected a service list, got {response:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    for service in [
        "drover.v1.Admin",
        "drover.v1.Clusters",
        "drover.v1.Operations",
        "drover.v1.Tasks",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == service),
            "{service} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn embedded_mode_serves_without_etcd() {
    let replica = ReplicaProcess::dev().await;
    let mut client = replica.client().await;
    let created = client
        .create_cluster(v1::CreateClusterRequest {
            name: "local".into(),
            spec: Some(v1::ClusterSpec {
                version: "1.30.0".into(),
                control_nodes: 1,
                node_offering: "small".into(),
                ..Default::default()
            }),
            create_only: true,
            request_id: String::new(),
        })
        .await
        .unwrap()
        .cluster
        .unwrap();
    assert_eq!(client.get_cluster("local").await.unwrap().uid, created.uid);
}

#[tokio::test]
async fn sigterm_stops_serving_and_exits_cleanly() {
    let etcd = EtcdProcess::start().await;
    let mut replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let endpoint = replica.endpoint();
    let status = replica.terminate().await;
    assert!(status.success(), "{status:?}");
    assert_eq!(health(&endpoint).await, None, "nothing answers after exit");
}

#[tokio::test]
async fn droverctl_creates_updates_and_watches_with_script_friendly_exit_codes() {
    let replica = ReplicaProcess::dev().await;
    let ctl = |args: &[&str]| {
        Command::new(workspace_binary("droverctl"))
            .args(["--endpoint", &replica.endpoint()])
            .args(args)
            .output()
            .expect("run droverctl")
    };
    let mut watch = Command::new(workspace_binary("droverctl"))
        .args([
            "--endpoint",
            &replica.endpoint(),
            "-o",
            "json",
            "watch",
            "cli",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run droverctl watch");
    let created = ctl(&["cluster", "create", "cli", "--version", "1.29.0", "--wait"]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let updated = ctl(&[
        "-o",
        "json",
        "cluster",
        "update",
        "cli",
        "--label",
        "env=prod",
        "--expected-generation",
        "1",
    ]);
    assert!(
        updated.status.success(),
        "{}",
        String::from_utf8_lossy(&updated.stderr)
    );
    let cluster: serde_json::Value = serde_json::from_slice(&updated.stdout).expect("JSON output");
    // Whole messages, the proto3 JSON mapping: 64-bit integers as strings.
    assert_eq!(cluster["generation"], "2");
    assert_eq!(cluster["spec"]["labels"]["env"], "prod");
    // Exit codes a script can rely on.
    assert_eq!(
        ctl(&[
            "cluster",
            "update",
            "cli",
            "--label",
            "a=b",
            "--expected-generation",
            "1"
        ])
        .status
        .code(),
        Some(7)
    );
    assert_eq!(ctl(&["cluster", "get", "missing"]).status.code(), Some(3));
    assert_eq!(
        ctl(&["cluster", "create", "Bad", "--version", "1.0.0"])
            .status
            .code(),
        Some(5)
    );
    assert_eq!(ctl(&["cluster", "start", "cli"]).status.code(), Some(6));
    // Lists are JSON arrays even with one entry (scripts index them).
    for list in [&["cluster", "list"][..], &["op", "list", "cli"][..]] {
        let out = ctl(&[&["-o", "json"], list].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert!(value.is_array(), "{list:?}: {value}");
    }
    // TLS options with an http:// endpoint would send the token in the clear.
    let dir = drover_tests::TempDir::new("ctl-tls");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not used").unwrap();
    let plain = ctl(&["--ca-cert", &ca.to_string_lossy(), "cluster", "list"]);
    assert_eq!(
        plain.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    assert!(String::from_utf8_lossy(&plain.stderr).contains("https://"));

    // The watch saw the update: read its JSON lines until generation 2.
    use std::io::BufRead;
    let stdout = watch.stdout.take().expect("piped stdout");
    let lines = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let event: serde_json::Value =
                serde_json::from_str(&line.expect("a line")).expect("a JSON line");
            let done = event["cluster"]["generation"] == "2";
            seen.push(event);
            if done {
                break;
            }
        }
        seen
    });
    let seen = tokio::time::timeout(std::time::Duration::from_secs(20), lines)
        .await
        .expect("the watch reports the update")
        .unwrap();
    assert!(
        seen.iter()
            .all(|e| e["cluster"]["name"] == "cli" && e["kind"] == "PUT"),
        "{seen:?}"
    );
    let _ = watch.kill();
    let _ = watch.wait();
}

#[tokio::test]
async fn droverctl_puts_lists_and_deletes_tasks() {
    let replica = ReplicaProcess::dev().await;
    let ctl = |args: &[&str]| {
        Command::new(workspace_binary("droverctl"))
            .args(["--endpoint", &replica.endpoint()])
            .args(args)
            .output()
            .expect("run droverctl")
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let out = ctl(&[&["-o", "json"], args].concat());
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON output")
    };
    let created = ctl(&["cluster", "create", "db", "--version", "1.29.0", "--wait"]);
    assert!(created.status.success());
    let put = json(&[
        "task",
        "put",
        "db",
        "backup",
        "daily",
        "--location",
        "dc1:s3:backups",
    ]);
    assert_eq!(put["spec"]["type"], "TASK_TYPE_BACKUP");
    assert_eq!(put["spec"]["name"], "daily");
    assert_eq!(put["spec"]["schedule"]["start_date"], "now");

    let refused = ctl(&["task", "put", "db", "backup", "nowhere"]);
    assert_eq!(refused.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("task.backup.location"), "{stderr}");

    drover_tests::wait_until(Duration::from_secs(20), "the backup to run", || {
        let task = json(&["task", "get", "db", "backup", "daily"]);
        std::future::ready(task["status"]["last_run"]["status"] == "TASK_RUN_STATUS_DONE")
    })
    .await;
    let runs = json(&["task", "runs", "db", "backup", "daily"]);
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    let table = ctl(&["task", "list", "db"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("daily"));

    assert!(ctl(&["task", "delete", "db", "backup", "daily"])
        .status
        .success());
    assert_eq!(
        ctl(&["task", "get", "db", "backup", "daily"]).status.code(),
        Some(3)
    );
}

/// Every lifecycle command through droverctl: with `--wait` each follows
/// the operation it started to SUCCEEDED and prints it; `op get`, `op wait`
/// and `op list` show the same operations (`op cancel` of an ended one is
/// refused, exit 6); the same `--request-id` again returns the operation
/// it started; a command the cluster's state refuses exits 6.
#[tokio::test]
async fn droverctl_runs_every_lifecycle_command_and_shows_its_operations() {
    let replica = ReplicaProcess::dev().await;
    let ctl = |args: &[&str]| {
        Command::new(workspace_binary("droverctl"))
            .args(["--endpoint", &replica.endpoint(), "-o", "json"])
            .args(args)
            .output()
            .expect("run droverctl")
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let out = ctl(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON output")
    };
    let created = json(&["cluster", "create", "life", "--version", "1.29.0", "--wait"]);
    assert_eq!(created["kind"], "OPERATION_KIND_START", "{created}");
    let commands: [(&[&str], &str); 7] = [
        (&["stop", "life", "--request-id", "stop-life-1"], "STOP"),
        (&["start", "life"], "START"),
        (&["scale", "life", "--workers", "2"], "SCALE"),
        (&["upgrade", "life", "--version", "1.30.0"], "UPGRADE"),
        (&["add-nodes", "life", "--count", "1"], "ADD_NODES"),
        (&["remove-nodes", "life", "worker-0"], "REMOVE_NODES"),
        (&["delete", "life"], "DESTROY"),
    ];
    let mut ids = vec![created["id"].clone()];
    for (args, kind) in commands {
        let op = json(&[&["cluster"], args, &["--wait"]].concat());
        assert_eq!(
            (&op["kind"], &op["state"]),
            (
                &format!("OPERATION_KIND_{kind}").into(),
                &"OPERATION_STATE_SUCCEEDED".into()
            )
        );
        let id = op["id"].as_str().expect("an id").to_string();
        for shown in ["get", "wait"] {
            let again = json(&["op", shown, "life", &id]);
            assert_eq!((&again["id"], &again["state"]), (&op["id"], &op["state"]));
        }
        let cancel = ctl(&["op", "cancel", "life", &id]);
        assert_eq!(cancel.status.code(), Some(6), "an ended operation");
        let said = String::from_utf8_lossy(&cancel.stderr);
        assert!(said.contains("nothing to cancel"), "{said}");
        if kind == "STOP" {
            let again = json(&["cluster", "stop", "life", "--request-id", "stop-life-1"]);
            assert_eq!(again["id"], op["id"], "the same request id");
            let refused = ctl(&["cluster", "recover", "life"]);
            assert_eq!(refused.status.code(), Some(6), "recover from Stopped");
        }
        ids.push(op["id"].clone());
    }
    let listed = json(&["op", "list", "life"]);
    let mut listed_ids: Vec<_> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|op| op["id"].clone())
        .collect();
    listed_ids.reverse();
    assert_eq!(listed_ids, ids, "op list shows them newest first");
}

/// On SIGTERM every service reports NOT_SERVING (probes that name a service
/// stop routing too), and a second SIGTERM exits at once, with 130, instead
/// of waiting out the hand-off of an operation that will not end soon.
#[tokio::test]
async fn a_second_sigterm_exits_at_once() {
    let mut f = Fixture::builder().start().await;
    let (replica, client, sim) = (&mut f.replicas[0], &mut f.client, &f.sim);
    create_running(client, "slow", 1).await;
    sim.set_latency(Duration::from_secs(60)).await;
    let request = v1::StopClusterRequest {
        name: "slow".into(),
        request_id: String::new(),
        ..Default::default()
    };
    client.clusters().stop_cluster(request).await.unwrap();
    replica.signal("TERM");
    let endpoint = replica.endpoint();
    for service in [
        "",
        "drover.v1.Clusters",
        "drover.v1.Operations",
        "drover.v1.Tasks",
        "drover.v1.Admin",
    ] {
        let endpoint = endpoint.clone();
        let what = format!("{service:?} to report NOT_SERVING");
        wait_until(Duration::from_secs(10), &what, || {
            let endpoint = endpoint.clone();
            async move { service_health(&endpoint, service).await == Some(ServingStatus::NotServing) }
        })
        .await;
    }
    let status = replica.terminate().await;
    assert_eq!(status.code(), Some(130), "{status:?}");
}

/// The admin HTTP port keeps serving through the drain, so that an
/// orchestrator's probes see the replica draining rather than dead: /readyz
/// answers 503 and /healthz 200 until the process exits (the port used to
/// close at SIGTERM).
#[tokio::test]
async fn the_admin_port_answers_through_the_drain() {
    // A TTL long enough that the slow call's deadline (the claim's) does
    // not end the operation, and with it the drain, before the checks.
    let mut f = Fixture::builder().ttl(20).start().await;
    let (replica, client, sim) = (&mut f.replicas[0], &mut f.client, &f.sim);
    create_running(client, "slow", 1).await;
    sim.set_latency(Duration::from_secs(60)).await;
    let request = v1::StopClusterRequest {
        name: "slow".into(),
        request_id: String::new(),
        ..Default::default()
    };
    client.clusters().stop_cluster(request).await.unwrap();
    let admin = replica.admin_endpoint();
    let (ready, _) = fetch(&admin, "/readyz").await.expect("the admin port");
    assert_eq!(ready, 200);
    // etcd's version was checked for the early lease revoke at start-up.
    let series = "drover_etcd_known_issue{issue=\"early-lease-revoke\"}";
    wait_until(Duration::from_secs(10), "etcd's version checked", || {
        let admin = admin.clone();
        async move { metrics(&admin).await.contains_key(series) }
    })
    .await;
    let flagged = metrics(&admin).await[series];
    assert!(flagged == 0.0 || flagged == 1.0, "{flagged}");
    replica.signal("TERM");
    wait_until(Duration::from_secs(10), "/readyz to answer 503", || {
        let admin = admin.clone();
        async move { fetch(&admin, "/readyz").await.is_ok_and(|(s, _)| s == 503) }
    })
    .await;
    // Well into the hand-off (its grace is 5 s): still answering.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (path, expected) in [("/healthz", 200), ("/readyz", 503), ("/metrics", 200)] {
        let (status, _) = fetch(&admin, path).await.expect("the admin port");
        assert_eq!(status, expected, "{path}");
    }
    let status = replica.terminate().await;
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(fetch(&admin, "/healthz").await.is_err(), "closed on exit");
}

/// Runs droverctl against `endpoints` (comma-separated), with no token from
/// the environment.
fn droverctl(endpoints: &str, args: &[&str]) -> std::process::Output {
    Command::new(workspace_binary("droverctl"))
        .args(["--endpoint", endpoints])
        .args(args)
        .env_remove("DROVER_TOKEN")
        .env_remove("DROVER_TOKEN_FILE")
        .output()
        .expect("run droverctl")
}

/// A loopback URL nobody listens on.
fn dead_endpoint() -> String {
    format!("http://127.0.0.1:{}", drover_tests::free_port())
}

/// Spawns droverctl with its standard output piped, reads `lines` lines,
/// closes the pipe (as `| head` does), runs `after` (something that makes
/// droverctl write again), and returns how droverctl ended.
async fn droverctl_into_head(
    endpoint: &str,
    args: &[&str],
    lines: usize,
    after: impl std::future::Future<Output = ()>,
) -> std::process::Output {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = Command::new(workspace_binary("droverctl"))
        .args(["--endpoint", endpoint])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run droverctl");
    let stdout = child.stdout.take().expect("piped stdout");
    let read = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        for _ in 0..lines {
            let mut line = String::new();
            reader.read_line(&mut line).expect("a line");
        }
        // The reader is dropped here: the pipe's read end closes.
    });
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("droverctl prints")
        .unwrap();
    after.await;
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .expect("droverctl ends once its reader has gone")
    .unwrap()
    .expect("droverctl's status")
}

/// `droverctl ... | head` in a script: droverctl ends quietly with success
/// once its reader has gone, instead of panicking (exit 101). The list is
/// longer than a pipe holds, so droverctl is still writing when the reader
/// closes; the watch writes again for a change made after.
#[tokio::test]
async fn droverctl_into_a_reader_that_closes_early_ends_quietly() {
    let replica = ReplicaProcess::dev().await;
    let mut client = replica.client().await;
    for i in 0..300 {
        let request = create_only(&format!("piped-{i}"));
        client.create_cluster(request).await.expect("create");
    }
    let endpoint = replica.endpoint();
    let list = ["-o", "json", "cluster", "list"];
    let listed = droverctl_into_head(&endpoint, &list, 2, async {}).await;
    let watch = ["-o", "json", "watch", "--from-revision", "1"];
    let mut writer = client.clone();
    let one_more = async move {
        let request = create_only("after-head");
        writer.create_cluster(request).await.expect("create");
    };
    let watched = droverctl_into_head(&endpoint, &watch, 2, one_more).await;
    for (what, out) in [("list", listed), ("watch", watched)] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{what}: {stderr}");
    }
}

/// Reads fail over across `--endpoint a,b` as lifecycle calls do: with the
/// first endpoint dead, every read still answers (a read used to fail
/// whenever it was sent to the dead one).
#[tokio::test]
async fn droverctl_reads_fail_over_to_a_live_endpoint() {
    let replica = ReplicaProcess::dev().await;
    let mut client = replica.client().await;
    create_running(&mut client, "failover", 0).await;
    let endpoints = format!("{},{}", dead_endpoint(), replica.endpoint());
    let reads: [&[&str]; 5] = [
        &["cluster", "list"],
        &["cluster", "get", "failover"],
        &["members"],
        &["op", "list", "failover"],
        &["task", "list", "failover"],
    ];
    // Each read is sent several times: a balancer picks an endpoint at
    // random, so a read without failover fails about one time in five.
    for round in 0..5 {
        for read in reads {
            let out = droverctl(&endpoints, read);
            assert!(
                out.status.success(),
                "round {round}, {read:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// With every endpoint down droverctl says so at once, naming each endpoint
/// and what went wrong (it used to retry in silence for 15 s and then print
/// "tcp connect error").
#[tokio::test]
async fn droverctl_with_every_endpoint_down_says_so_quickly() {
    let (first, second) = (dead_endpoint(), dead_endpoint());
    let endpoints = format!("{first},{second}");
    for (endpoints, args) in [
        (first.as_str(), &["cluster", "list"][..]),
        (endpoints.as_str(), &["cluster", "list"][..]),
        (endpoints.as_str(), &["cluster", "stop", "web"][..]),
    ] {
        let started = std::time::Instant::now();
        let out = droverctl(endpoints, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{args:?}: {:?}",
            started.elapsed()
        );
        assert_eq!(out.status.code(), Some(8), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        for endpoint in endpoints.split(',') {
            assert!(stderr.contains(endpoint), "{args:?}: {stderr}");
        }
        assert!(stderr.contains("connection refused"), "{stderr}");
    }
}

/// Errors that say what to do: an endpoint without a scheme, https against
/// a plaintext replica; a file droverctl cannot read is a usage error with
/// its own exit code (13), not INVALID_ARGUMENT (5).
#[tokio::test]
async fn droverctl_errors_name_the_endpoint_and_the_fix() {
    let replica = ReplicaProcess::dev().await;
    let bare = replica.endpoint().replace("http://", "");
    let out = droverctl(&bare, &["cluster", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("http://{bare}")), "{stderr}");

    let tls = replica.endpoint().replace("http://", "https://");
    let dir = drover_tests::TempDir::new("ctl-errors");
    let pki = drover_tests::pki::Pki::new();
    let ca = pki.ca().to_string_lossy().into_owned();
    let out = droverctl(&tls, &["--ca-cert", &ca, "cluster", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains(&tls), "{stderr}");
    assert!(stderr.contains("does not speak TLS"), "{stderr}");
    assert!(
        stderr.contains(&replica.endpoint()),
        "suggests http://: {stderr}"
    );

    let missing = dir.path().join("missing");
    let missing = missing.to_string_lossy();
    for flag in ["--token-file", "--ca-cert"] {
        let out = droverctl(&tls, &[flag, &missing, "cluster", "list"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(13), "{flag}: {stderr}");
        assert!(stderr.contains(&*missing), "{flag}: {stderr}");
        assert!(stderr.contains(flag), "{flag}: {stderr}");
    }
}

/// No traps: `cluster update` without a change is a usage error (it used
/// to wipe every label), `--clear-labels` says so on purpose; a stop and a
/// delete of a cluster never started say they touch nothing; a downgrade
/// needs `--allow-downgrade`.
#[tokio::test]
async fn droverctl_refuses_what_would_surprise() {
    let replica = ReplicaProcess::dev().await;
    let endpoint = replica.endpoint();
    let ctl = |args: &[&str]| droverctl(&endpoint, args);
    let said = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let out = ctl(&[
        "cluster",
        "create",
        "draft",
        "--version",
        "1.29.0",
        "--label",
        "team=db",
        "--create-only",
    ]);
    assert!(out.status.success(), "{}", said(&out));
    let out = ctl(&["cluster", "update", "draft"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("--label") && said(&out).contains("--clear-labels"),
        "{}",
        said(&out)
    );
    let out = ctl(&[
        "cluster",
        "update",
        "draft",
        "--label",
        "a=b",
        "--clear-labels",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let labels = |out: std::process::Output| {
        let cluster: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        cluster["spec"]["labels"].clone()
    };
    let kept = labels(ctl(&["-o", "json", "cluster", "get", "draft"]));
    assert_eq!(kept["team"], "db", "nothing was changed: {kept}");
    let cleared = labels(ctl(&[
        "-o",
        "json",
        "cluster",
        "update",
        "draft",
        "--clear-labels",
    ]));
    assert!(
        cleared.as_object().is_none_or(|labels| labels.is_empty()),
        "{cleared}"
    );

    let out = ctl(&["cluster", "stop", "draft", "--wait"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("never started"), "{}", said(&out));
    assert!(said(&out).contains("no-op"), "{}", said(&out));
    let out = ctl(&["cluster", "delete", "draft", "--wait"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("without any call to its provider"),
        "{}",
        said(&out)
    );

    let out = ctl(&["cluster", "create", "web", "--version", "1.29.0", "--wait"]);
    assert!(out.status.success(), "{}", said(&out));
    let down = ["cluster", "upgrade", "web", "--version", "1.28.0", "--wait"];
    let out = ctl(&down);
    assert_eq!(out.status.code(), Some(6), "{}", said(&out));
    assert!(said(&out).contains("--allow-downgrade"), "{}", said(&out));
    let out = ctl(&[&down[..], &["--allow-downgrade"]].concat());
    assert!(out.status.success(), "{}", said(&out));
    let out = ctl(&["cluster", "upgrade", "web", "--version", "1.28.0", "--wait"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("had no steps"),
        "the same version: {}",
        said(&out)
    );
}

/// A replica serving TLS with a certificate the CA given did not sign: a
/// message that says so (it used to read "transport error").
#[tokio::test]
async fn droverctl_explains_an_unknown_ca() {
    let etcd = EtcdProcess::start().await;
    let pki = drover_tests::pki::Pki::new();
    let server = pki.server("replica");
    let (cert, key) = (
        server.cert.to_string_lossy().into_owned(),
        server.key.to_string_lossy().into_owned(),
    );
    let probe = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pki.ca_pem()));
    let args = ["--tls-cert", cert.as_str(), "--tls-key", key.as_str()];
    let replica = ReplicaProcess::serve_tls(&etcd.endpoint(), "r1", &args, probe).await;
    let endpoint = replica.endpoint();
    let other = drover_tests::pki::Pki::new();
    let other_ca = other.ca().to_string_lossy().into_owned();
    let out = droverctl(&endpoint, &["--ca-cert", &other_ca, "cluster", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains(&endpoint), "{stderr}");
    assert!(
        stderr.contains("not signed by the CA given (--ca-cert)"),
        "{stderr}"
    );
    // http:// to a replica that speaks TLS: one line that says so (it used
    // to read "Cancelled: operation was canceled").
    let plain = endpoint.replacen("https://", "http://", 1);
    let out = droverctl(&plain, &["cluster", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&plain), "{stderr}");
    assert!(
        stderr.contains("the replica speaks TLS: use https:// and --ca-cert"),
        "{stderr}"
    );
}

/// Logs written to a pipe (not a terminal) carry no colour codes, and a log
/// reader that goes away (`drover dev 2>&1 | head`) does not take the
/// replica down: it keeps serving and still exits cleanly on SIGTERM (it
/// used to panic, exit 101, at its next log line).
#[tokio::test]
async fn logs_into_a_pipe_are_plain_and_a_closed_pipe_stops_nothing() {
    use std::io::BufRead;
    use std::process::Stdio;
    let etcd = EtcdProcess::start().await;
    let etcd_endpoint = etcd.endpoint();
    let serve = [
        "serve",
        "--etcd-endpoints",
        &etcd_endpoint,
        "--replica-id",
        "r1",
        "--lease-ttl",
        "2",
    ];
    for mode in [&["dev"][..], &serve[..]] {
        let (port, admin_port) = (drover_tests::free_port(), drover_tests::free_port());
        let child = Command::new(workspace_binary("drover"))
            .args(mode)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn drover");
        let mut child = KillOnDrop(child);
        let stderr = child.0.stderr.take().expect("piped stderr");
        // Read a few lines, then drop the reader: the pipe closes.
        let lines = tokio::task::spawn_blocking(move || {
            std::io::BufReader::new(stderr)
                .lines()
                .take(2)
                .collect::<Result<Vec<_>, _>>()
        });
        let lines = tokio::time::timeout(Duration::from_secs(20), lines)
            .await
            .expect("drover logs")
            .unwrap()
            .expect("log lines");
        assert!(!lines.is_empty(), "{mode:?}");
        for line in &lines {
            assert!(!line.contains("\x1b["), "{mode:?}: {line:?}");
        }
        let endpoint = format!("http://127.0.0.1:{port}");
        wait_until(Duration::from_secs(20), "the replica to serve", || {
            let endpoint = endpoint.clone();
            async move { health(&endpoint).await == Some(ServingStatus::Serving) }
        })
        .await;
        // Work that logs, into the closed pipe.
        let mut client = drover_client::Client::connect(&endpoint).await.unwrap();
        if mode == ["dev"] {
            create_running(&mut client, "logged", 0).await;
        }
        assert_eq!(health(&endpoint).await, Some(ServingStatus::Serving));
        let status = Command::new("kill")
            .args(["-TERM", &child.0.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        let mut exit = None;
        wait_until(Duration::from_secs(30), "drover to exit", || {
            exit = child.0.try_wait().expect("poll drover");
            std::future::ready(exit.is_some())
        })
        .await;
        assert!(exit.is_some_and(|e| e.success()), "{mode:?}: {exit:?}");
    }
}

/// A process this test started, killed if the test ends before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every field in every format: whole messages as JSON and YAML, names,
/// wide tables, describe; `cluster list` hides Destroyed clusters unless
/// asked and filters by state and label; a watch starts with the clusters
/// as they are.
#[tokio::test]
async fn droverctl_shows_every_field_in_every_format() {
    let replica = ReplicaProcess::dev().await;
    let endpoint = replica.endpoint();
    let ctl = |args: &[&str]| {
        let out = droverctl(&endpoint, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let create = ["cluster", "create", "shown", "--version", "1.29.0"];
    ctl(&[&create[..], &["--label", "team=a", "--wait"]].concat());
    ctl(&["cluster", "create", "gone", "--version", "1.29.0", "--wait"]);
    ctl(&["cluster", "delete", "gone", "--wait"]);

    let listed = ctl(&["-o", "name", "cluster", "list"]);
    assert_eq!(listed, "shown\n", "Destroyed hidden");
    let all = ctl(&["-o", "name", "cluster", "list", "--all"]);
    assert_eq!(all, "gone\nshown\n");
    let destroyed = ctl(&["-o", "name", "cluster", "list", "--state", "destroyed"]);
    assert_eq!(destroyed, "gone\n");
    assert_eq!(ctl(&["-o", "name", "cluster", "list", "-l", "team=b"]), "");

    let json: serde_json::Value =
        serde_json::from_str(&ctl(&["-o", "json", "cluster", "get", "shown"])).unwrap();
    assert_eq!(json["status"]["state"], "CLUSTER_STATE_RUNNING", "{json}");
    assert_eq!(json["status"]["nodes"][0]["ready"], true, "{json}");
    assert!(json["created_at"]
        .as_str()
        .is_some_and(|t| t.starts_with("20")));
    let yaml = ctl(&["-o", "yaml", "cluster", "get", "shown"]);
    for field in ["name: shown", "node_offering: medium", "power_state: on"] {
        assert!(yaml.contains(field), "{field} in\n{yaml}");
    }
    let wide = ctl(&["-o", "wide", "cluster", "list"]);
    assert!(wide.lines().next().unwrap().contains("LABELS"), "{wide}");
    assert!(wide.contains("team=a"), "{wide}");

    let described = ctl(&["cluster", "describe", "shown"]);
    for part in [
        "Spec:",
        "Nodes:",
        "control-0",
        "Operations:",
        "START",
        "CREATED -> STARTING",
    ] {
        assert!(described.contains(part), "{part} in\n{described}");
    }

    // A watch begins with the cluster as it is, then goes on.
    let mut watch = Command::new(workspace_binary("droverctl"))
        .args(["--endpoint", &endpoint, "-o", "json", "watch", "shown"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run droverctl watch");
    let stdout = watch.stdout.take().expect("piped");
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    });
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("a first line at once")
        .unwrap()
        .unwrap();
    let _ = watch.kill();
    let _ = watch.wait();
    let event: serde_json::Value = serde_json::from_str(&first).expect("a JSON line");
    assert_eq!(event["cluster"]["name"], "shown", "{event}");
    assert_eq!(event["cluster"]["status"]["state"], "CLUSTER_STATE_RUNNING");
}

/// Two `drover dev` left on the default admin port both start: the one
/// that finds it taken serves admin HTTP on a free port and logs which.
/// (Should something else hold the default, both move; still each has
/// its own.)
#[tokio::test]
async fn two_dev_instances_on_the_default_admin_port_both_start() {
    let instances = [DevLogged::start(), DevLogged::start()];
    let mut admins = Vec::new();
    for instance in instances {
        let endpoint = instance.endpoint.clone();
        wait_until(Duration::from_secs(20), "drover dev to serve", || {
            let endpoint = endpoint.clone();
            async move { health(&endpoint).await == Some(ServingStatus::Serving) }
        })
        .await;
        let admin = tokio::time::timeout(Duration::from_secs(20), instance.admin)
            .await
            .expect("drover dev to log its admin address")
            .expect("an admin address in its log");
        let (status, _) = fetch(&format!("http://{admin}"), "/healthz")
            .await
            .expect("its admin port");
        assert_eq!(status, 200, "{admin}");
        // Both keep running until the end of the test.
        admins.push((admin, instance.child));
    }
    assert_ne!(
        admins[0].0, admins[1].0,
        "each instance has its own admin port"
    );
}

/// `drover dev` on a free gRPC port and the default admin port, its log
/// lines read as they come.
struct DevLogged {
    child: KillOnDrop,
    endpoint: String,
    /// The admin address from its log, once it says.
    admin: tokio::sync::oneshot::Receiver<String>,
}

impl DevLogged {
    fn start() -> Self {
        use std::io::BufRead;
        use std::process::Stdio;
        let port = drover_tests::free_port();
        let mut child = Command::new(workspace_binary("drover"))
            .args(["dev", "--listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn drover");
        let stderr = child.stderr.take().expect("piped stderr");
        let (said, admin) = tokio::sync::oneshot::channel();
        // Reads to the end (the process's exit), so its logging never
        // blocks on a full pipe.
        std::thread::spawn(move || {
            let mut said = Some(said);
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let address = line
                    .contains("serving admin HTTP")
                    .then(|| {
                        line.split_whitespace()
                            .find_map(|f| f.strip_prefix("address="))
                    })
                    .flatten();
                if let Some(address) = address {
                    if let Some(said) = said.take() {
                        let _ = said.send(address.to_string());
                    }
                }
            }
        });
        Self {
            child: KillOnDrop(child),
            endpoint: format!("http://127.0.0.1:{port}"),
            admin,
        }
    }
}

/// `drover dev`'s simulator on `--sim-listen` answers reflection with the
/// services it serves (and not Drover's own API), and `--step-latency-ms`
/// slows the steps of an operation: its recorded duration is at least one
/// step's latency (a lower bound only, so a slow machine cannot fail it).
#[tokio::test]
async fn dev_simulator_answers_reflection_and_its_latency_slows_steps() {
    const LATENCY: Duration = Duration::from_millis(400);
    let sim = format!("127.0.0.1:{}", drover_tests::free_port());
    let latency = LATENCY.as_millis().to_string();
    let replica =
        ReplicaProcess::dev_with(&["--sim-listen", &sim, "--step-latency-ms", &latency]).await;
    let names = reflected_services(&format!("http://{sim}")).await;
    for service in [
        "drover.provider.v1.Provider",
        "drover.provider.v1.Simulator",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.contains(&service.to_string()),
            "{service} missing from {names:?}"
        );
    }
    assert!(
        !names.contains(&"drover.v1.Clusters".to_string()),
        "{names:?}"
    );

    let mut client = replica.client().await;
    let created = create_running(&mut client, "slow", 0).await;
    let done = client
        .operations()
        .list_operations(v1::ListOperationsRequest {
            cluster: "slow".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .operations;
    let start = done
        .iter()
        .find(|op| op.finished_at.is_some())
        .expect("a finished operation");
    let (began, ended) = (start.started_at.unwrap(), start.finished_at.unwrap());
    let took = Duration::from_millis(
        ((ended.seconds - began.seconds) * 1000 + i64::from(ended.nanos - began.nanos) / 1_000_000)
            as u64,
    );
    assert!(took >= LATENCY, "{} took {took:?}", created.name);
}

/// The services a gRPC server lists through reflection.
async fn reflected_services(endpoint: &str) -> Vec<String> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("expected a service list, got {response:?}");
    };
    list.service.into_iter().map(|s| s.name).collect()
}

/// Ctrl-C while droverctl waits stops the waiting, not the operation: it
/// exits 130 and says how to follow the operation again, which goes on to
/// its end.
#[tokio::test]
async fn ctrl_c_while_waiting_says_how_to_follow_the_operation_that_goes_on() {
    let replica = ReplicaProcess::dev_with(&["--step-latency-ms", "400"]).await;
    let mut client = replica.client().await;
    client
        .create_cluster(create_only("slow"))
        .await
        .expect("create");
    let mut waiting = Command::new(workspace_binary("droverctl"))
        .args(["--endpoint", &replica.endpoint()])
        .args(["cluster", "start", "slow", "--wait"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run droverctl");
    let stderr = waiting.stderr.take().expect("piped");
    let said = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::BufReader::new(stderr), &mut text).map(|_| text)
    });
    // Its start is running (400 ms a step): droverctl is waiting on it.
    wait_until(Duration::from_secs(10), "the start to be running", || {
        let client = client.clone();
        async move {
            let ops = drover_tests::operations_of(&client, "slow").await;
            ops.iter()
                .any(|op| op.state == v1::OperationState::Running as i32)
        }
    })
    .await;
    // And droverctl catches SIGINT by now (its handler is installed once it
    // follows the operation): /proc shows the caught signals.
    let pid = waiting.id();
    wait_until(Duration::from_secs(10), "droverctl to catch SIGINT", || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        std::future::ready(caught & (1 << (2 - 1)) != 0)
    })
    .await;
    let interrupted = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let status = waiting.wait().expect("droverctl exits");
    let said = said.await.unwrap().expect("its standard error");
    assert_eq!(status.code(), Some(130), "{said}");
    assert!(said.contains("droverctl op wait slow"), "{said}");
    let op = drover_tests::operations_of(&client, "slow").await.remove(0);
    let done = client
        .wait_operation(&op, Duration::from_secs(30))
        .await
        .expect("wait");
    assert_eq!(
        done.state,
        v1::OperationState::Succeeded as i32,
        "it went on"
    );
}

/// CPU time process `pid` has used, in clock ticks (utime + stime).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // The fields after the command name, which may hold spaces: state is
    // the 3rd field, utime the 14th and stime the 15th.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// A replica out of descriptors waits instead of spinning: with its
/// RLIMIT_NOFILE lowered to a few above what it holds, connections beyond
/// it wait in the kernel's backlog on both the gRPC and the admin port,
/// every accept fails with EMFILE, and the replica uses little CPU; once
/// the connections close it serves again on both ports.
#[tokio::test]
async fn a_replica_out_of_descriptors_waits_instead_of_spinning_and_serves_again() {
    let replica = ReplicaProcess::dev().await;
    let pid = replica.pid();
    let open = move || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let limit = open() + 4;
    let lowered = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("run prlimit");
    assert!(lowered.success());
    let grpc = replica.endpoint().trim_start_matches("http://").to_string();
    let admin = replica
        .admin_endpoint()
        .trim_start_matches("http://")
        .to_string();
    let mut held = Vec::new();
    for address in std::iter::repeat_n(&grpc, 12).chain(std::iter::repeat_n(&admin, 6)) {
        held.push(
            tokio::net::TcpStream::connect(address)
                .await
                .expect("connect"),
        );
    }
    wait_until(
        Duration::from_secs(10),
        "the replica at its descriptor limit",
        || async move { open() >= limit },
    )
    .await;

    // A measurement window, not a wait for an event.
    let window = Duration::from_secs(3);
    let before = cpu_ticks(pid);
    tokio::time::sleep(window).await;
    let cores = (cpu_ticks(pid) - before) as f64 / clock_ticks_per_second() / window.as_secs_f64();
    eprintln!("CPU while out of descriptors: {cores:.3} cores");
    assert!(cores < 0.2, "{cores:.3} cores: the accept loops spin");

    drop(held);
    let endpoint = replica.endpoint();
    wait_until(Duration::from_secs(10), "gRPC to serve again", || {
        let endpoint = endpoint.clone();
        async move { health(&endpoint).await == Some(ServingStatus::Serving) }
    })
    .await;
    let (status, _) = drover_tests::http_get(&replica.admin_endpoint(), "/healthz");
    assert_eq!(status, 200);
}

/// A background loop that panics ends the replica at once, non-zero (70)
/// with the panic in its log, so a supervisor restarts it; its peer takes
/// its clusters through the liveness connection the exit closes, well
/// inside the lease TTL (10 s), never a replica serving with a dead loop.
#[tokio::test]
async fn a_panicking_loop_ends_the_replica_and_a_peer_takes_its_clusters() {
    let Backends { sim, etcd } = Backends::start().await;
    let dir = TempDir::new("panic");
    let (trigger, log) = (dir.path().join("panic-now"), dir.path().join("r1.log"));
    let hook = format!("ownership@{}", trigger.display());
    let args = ["--provider", &sim.endpoint(), "--lease-ttl", "10"];
    let env = [("DROVER_TEST_PANIC", hook.as_str())];
    let mut r1 = ReplicaProcess::serve_logged(&etcd.endpoint(), "r1", &args, &env, &log).await;
    let r2 = ReplicaProcess::serve_with(&etcd.endpoint(), "r2", &args).await;
    let mut client = r2.client().await;
    let mut admin = v1::admin_client::AdminClient::connect(r2.endpoint())
        .await
        .unwrap();
    let mut of_r1 = None;
    for n in 0..8 {
        let name = format!("c{n}");
        create_running(&mut client, &name, 0).await;
        let owned = owner(&mut admin, &name).await.expect("an owner");
        if owned.replica == "r1" {
            of_r1 = Some(name);
            break;
        }
    }
    let cluster = of_r1.expect("r1 owns one of 8 clusters");

    std::fs::write(&trigger, "").unwrap();
    let panicked = std::time::Instant::now();
    let status = r1.wait_exit_within(Duration::from_secs(5)).await;
    let exited = panicked.elapsed();
    assert_eq!(status.code(), Some(70), "{status:?}");
    assert!(
        exited < Duration::from_secs(1),
        "exited {exited:?} after the panic"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("task ownership panicked"), "{logged}");
    wait_until(Duration::from_secs(30), "r2 to own r1's cluster", || {
        let (mut admin, cluster) = (admin.clone(), cluster.clone());
        async move {
            owner(&mut admin, &cluster)
                .await
                .is_some_and(|o| o.replica == "r2")
        }
    })
    .await;
    let taken = panicked.elapsed();
    assert!(
        taken < Duration::from_secs(10),
        "taken after {taken:?}: the TTL's work, not the exit's"
    );
    eprintln!("r1 exited {exited:?} after its loop panicked; r2 owned {cluster} after {taken:?}");
}
