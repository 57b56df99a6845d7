//! OpenTelemetry traces end to end: an upgrade is one trace from the
//! client's `traceparent` through the accept, each owner's run and its
//! provider calls to the simulator's own spans, across a kill -9 of its
//! owner, as an OTLP receiver in the test's process collects them.

use drover_client::v1::{self, OperationState as O};
use drover_server::keys::KeyLayout;
use drover_server::store::Store;
use drover_tests::etcd::EtcdProcess;
use drover_tests::fixture::{Backends, Fixture};
use drover_tests::otlp::{traceparent_ids, OtlpReceiver, ReceivedSpan};
use drover_tests::postgres::{PgProviderProcess, V1};
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, owner, wait_running};
use std::time::Duration;

const PREFIX: &str = "/drover/v1/";
/// Spans are batched for at most this long (the test shortens the 5 s
/// default, so a replica killed -9 has sent most of its own).
const BATCH_DELAY_MS: &str = "100";
const SPANS_WAIT: Duration = Duration::from_secs(20);

/// A client's trace context: a fresh trace id and span id, sampled.
fn client_traceparent() -> String {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    format!("00-{trace}-{span}-01")
}

fn span_named<'a>(
    spans: &'a [ReceivedSpan],
    trace: &[u8],
    name: &str,
) -> impl Iterator<Item = &'a ReceivedSpan> {
    let name = name.to_string();
    let trace = trace.to_vec();
    spans
        .iter()
        .filter(move |s| s.span.trace_id == trace && s.span.name == name)
}

#[tokio::test]
async fn an_upgrade_is_one_trace_across_a_kill_9_of_its_owner() {
    // Read by every process the test starts (replicas and simulator).
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", BATCH_DELAY_MS);
    let receiver = OtlpReceiver::start().await;
    let otlp = ["--otlp-endpoint", receiver.endpoint.as_str()];
    let mut f = Fixture::builder()
        .replicas(3)
        .ttl(2)
        .sim_args(&otlp)
        .replica_args(&otlp)
        .start()
        .await;
    create_running(&mut f.client, "traced", 3).await;
    let endpoint = f.replicas[0].endpoint();
    let mut admin = v1::admin_client::AdminClient::connect(endpoint)
        .await
        .unwrap();
    let before = owner(&mut admin, "traced").await.expect("an owner");
    f.sim.set_latency(Duration::from_millis(500)).await;

    let sent = client_traceparent();
    let (trace, client_span) = traceparent_ids(&sent);
    let mut request = tonic::Request::new(v1::UpgradeClusterRequest {
        name: "traced".into(),
        version: "1.30.0".into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("traceparent", sent.parse().unwrap());
    // Accepted by a replica that is not the owner (and survives): the
    // accept, each run and the provider calls cross three processes.
    let killed: usize = before.replica.trim_start_matches('r').parse().unwrap();
    let accepting = f
        .replicas
        .iter()
        .enumerate()
        .find(|(i, _)| *i != killed - 1);
    let mut client = accepting.unwrap().1.client().await;
    let op = client.clusters().upgrade_cluster(request).await;
    let op = op.expect("upgrade").into_inner();
    wait_running(&client, "traced", &op.id, Duration::from_secs(20)).await;
    f.replicas[killed - 1].kill9();
    let done = client
        .wait_operation(&op, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    f.sim.set_latency(Duration::ZERO).await;

    // The record keeps the accept's context and each run's span.
    let store = f.etcd.store().await;
    let key = KeyLayout::new(PREFIX).operation("traced", &op.id);
    let kv = store.get(&key).await.unwrap().kvs.remove(0);
    let record: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
    let (accept_trace, accept_span) = traceparent_ids(record["trace_parent"].as_str().unwrap());
    assert_eq!(
        accept_trace, trace,
        "the accept continues the client's trace"
    );
    let runs = record["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "two owners ran it: {runs:?}");
    let (_, lost_run) = traceparent_ids(runs[0]["trace_span"].as_str().unwrap());
    let (_, resumed_run) = traceparent_ids(runs[1]["trace_span"].as_str().unwrap());

    let spans = receiver
        .wait_for(SPANS_WAIT, "the resumed run and its calls", |spans| {
            let resumed =
                span_named(spans, &trace, "operation").any(|s| s.span.span_id == resumed_run);
            let sim = spans
                .iter()
                .any(|s| s.service == "drover-sim-provider" && s.span.trace_id == trace);
            resumed && sim
        })
        .await;
    let accept = span_named(&spans, &trace, "accept")
        .find(|s| s.span.span_id == accept_span)
        .expect("the accept's span");
    let request_span = spans
        .iter()
        .find(|s| s.span.span_id == accept.span.parent_span_id)
        .expect("the accept's parent: the gRPC request");
    assert_eq!(
        request_span.span.parent_span_id, client_span,
        "a child of the client's span"
    );
    assert!(
        request_span.span.name.ends_with("/UpgradeCluster"),
        "{request_span:?}"
    );

    let resumed = span_named(&spans, &trace, "operation")
        .find(|s| s.span.span_id == resumed_run)
        .unwrap();
    assert_eq!(
        resumed.span.parent_span_id, accept_span,
        "a run is a child of the accept"
    );
    assert!(
        resumed
            .span
            .links
            .iter()
            .any(|l| l.span_id == lost_run && l.trace_id == trace),
        "the resumed run links to the lost one: {:?}",
        resumed.span.links
    );
    assert_ne!(resumed.service, "", "{resumed:?}");

    // The provider's spans are children of the replicas' client spans.
    let calls: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.span.trace_id == trace && s.service == "drover" && s.span.kind == 3)
        .collect();
    assert!(!calls.is_empty(), "provider calls as client spans");
    // (Those the lost owner had open when it was killed never arrive.)
    let provider_side: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.service == "drover-sim-provider" && s.span.trace_id == trace)
        .collect();
    assert!(
        provider_side
            .iter()
            .all(|s| !s.span.parent_span_id.is_empty()),
        "every provider span has a parent"
    );
    let continued = provider_side
        .iter()
        .filter(|s| {
            calls
                .iter()
                .any(|c| c.span.span_id == s.span.parent_span_id)
        })
        .count();
    assert!(
        continued > 0,
        "the simulator's spans continue the replicas' calls: {provider_side:?}"
    );
    drop(receiver);
}

/// `droverctl -v` prints the trace id its requests carry; the replica's
/// span of the request is in that trace, and every JSON log line of the
/// operation carries the operation, its cluster and that trace id.
#[tokio::test]
async fn droverctl_sends_a_trace_context_and_logs_join_the_trace() {
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", BATCH_DELAY_MS);
    let receiver = OtlpReceiver::start().await;
    let backends = Backends::start().await;
    let dir = drover_tests::TempDir::new("traces");
    let log = dir.path().join("r1.log");
    let sim = backends.sim.endpoint();
    let args = [
        "--provider",
        sim.as_str(),
        "--otlp-endpoint",
        receiver.endpoint.as_str(),
        "--log-format",
        "json",
    ];
    let etcd = backends.etcd.endpoint();
    let replica =
        ReplicaProcess::serve_logged(&etcd, "r1", &args, &[("RUST_LOG", "info")], &log).await;
    create_running(&mut replica.client().await, "ctl", 1).await;
    let out = std::process::Command::new(drover_tests::workspace_binary("droverctl"))
        .args(["--endpoint", &replica.endpoint(), "-v", "-o", "json"])
        .args(["cluster", "stop", "ctl", "--wait"])
        .output()
        .expect("droverctl runs");
    assert!(out.status.success(), "{out:?}");
    let operation: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let operation = operation["id"]
        .as_str()
        .expect("an operation id")
        .to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let trace_id = stderr
        .lines()
        .find_map(|line| line.strip_prefix("trace id: "))
        .unwrap_or_else(|| panic!("no trace id printed: {stderr}"))
        .to_string();
    assert_eq!(trace_id.len(), 32, "{trace_id}");
    let (trace, _) = traceparent_ids(&format!("00-{trace_id}-0000000000000001-01"));
    let spans = receiver
        .wait_for(SPANS_WAIT, "the stop's run", |spans| {
            span_named(spans, &trace, "operation").next().is_some()
        })
        .await;
    let request = spans
        .iter()
        .find(|s| s.span.trace_id == trace && s.span.name.ends_with("/StopCluster"))
        .expect("the StopCluster request's span");
    assert_eq!(request.span.kind, 2, "a server span: {request:?}");
    assert_eq!(request.service, "drover");

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|line: &serde_json::Value| line["span"]["operation"] == operation.as_str())
        .collect();
    assert!(!lines.is_empty(), "log lines of the operation: {text}");
    for line in &lines {
        assert_eq!(line["span"]["cluster"], "ctl", "{line}");
        assert_eq!(line["span"]["trace_id"], trace_id.as_str(), "{line}");
    }
}

/// The PostgreSQL provider continues an operation's trace: its spans of
/// the calls a start makes are children of the replica's client spans.
#[tokio::test]
async fn the_postgresql_provider_continues_the_trace() {
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", BATCH_DELAY_MS);
    let receiver = OtlpReceiver::start().await;
    let otlp = ["--otlp-endpoint", receiver.endpoint.as_str()];
    let etcd = EtcdProcess::start().await;
    let provider = PgProviderProcess::start_with(&otlp).await;
    let endpoint = provider.endpoint();
    let mut args = vec!["--provider", endpoint.as_str(), "--lease-ttl", "10"];
    args.extend(otlp);
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &args).await;
    let mut client = replica.client().await;
    let request = v1::CreateClusterRequest {
        name: "pg".into(),
        spec: Some(v1::ClusterSpec {
            version: V1.into(),
            control_nodes: 1,
            node_offering: "small".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = client.clusters().create_cluster(request).await;
    let start = created
        .expect("create")
        .into_inner()
        .operation
        .expect("a start");
    let done = client.wait_operation(&start, Duration::from_secs(60)).await;
    assert_eq!(done.unwrap().state, O::Succeeded as i32);

    let store = etcd.store().await;
    let key = KeyLayout::new(PREFIX).operation("pg", &start.id);
    let kv = store.get(&key).await.unwrap().kvs.remove(0);
    let record: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
    let (trace, _) = traceparent_ids(record["trace_parent"].as_str().expect("traced"));
    let spans = receiver
        .wait_for(SPANS_WAIT, "the provider's spans of the start", |spans| {
            let calls: Vec<&Vec<u8>> = spans
                .iter()
                .filter(|s| s.service == "drover" && s.span.trace_id == trace && s.span.kind == 3)
                .map(|s| &s.span.span_id)
                .collect();
            spans.iter().any(|s| {
                s.service == "drover-postgres-provider"
                    && s.span.trace_id == trace
                    && calls.contains(&&s.span.parent_span_id)
            })
        })
        .await;
    let names: Vec<&str> = spans
        .iter()
        .filter(|s| s.service == "drover-postgres-provider" && s.span.trace_id == trace)
        .map(|s| s.span.name.as_str())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with("/CreateNodes")),
        "the provider's span of CreateNodes: {names:?}"
    );
}
