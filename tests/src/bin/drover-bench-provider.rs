//! drover-bench-provider: how long each kind of operation takes on a real
//! provider, and how much of it is Drover's own work.
//!
//! One etcd, one replica and the PostgreSQL provider (or the simulator,
//! for comparison). Each round takes a fresh cluster through its life:
//! create (the first start provisions a primary and its standbys), scale
//! up by one standby, a rolling upgrade, stop, start, destroy. For every
//! operation it records the wall time from the request to the end the
//! client saw, and the time the replica spent waiting on the provider (the
//! sum of `drover_provider_request_duration_seconds` over the operation,
//! read from the replica's /metrics); Drover's overhead is the rest: etcd
//! transactions, the watch, scheduling, the client's wait. The scanner is
//! slowed down so its describes do not count. Prints a table and writes
//! JSON.

use clap::{Parser, ValueEnum};
use drover_client::v1::{self, OperationState as O};
use drover_client::Client;
use drover_tests::etcd::EtcdProcess;
use drover_tests::postgres::{PgProviderProcess, V1, V2};
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::scrape;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "drover-bench-provider",
    about = "Time per operation kind on a real provider: Drover's overhead and the provider's work"
)]
struct Args {
    /// Which provider does the work.
    #[arg(long, value_enum, default_value_t = Kind::Postgres)]
    provider: Kind,
    /// Clusters taken through their whole life.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-provider.json")]
    json: std::path::PathBuf,
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    Postgres,
    Simulator,
}

/// The provider process, kept alive (killed on drop) for the run.
struct Running {
    endpoint: String,
    _process: Box<dyn std::any::Any>,
}

impl Running {
    async fn start(kind: Kind) -> Self {
        match kind {
            Kind::Postgres => {
                let process = PgProviderProcess::start().await;
                let endpoint = process.endpoint();
                Running {
                    endpoint,
                    _process: Box::new(process),
                }
            }
            Kind::Simulator => {
                let process = SimProcess::start().await;
                let endpoint = process.endpoint();
                Running {
                    endpoint,
                    _process: Box::new(process),
                }
            }
        }
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }
}

/// One operation as measured.
struct Sample {
    wall: Duration,
    provider: Duration,
}

/// Seconds the replica has spent waiting on provider calls so far.
async fn provider_seconds(replica: &ReplicaProcess) -> f64 {
    let samples = scrape::metrics(&replica.admin_endpoint()).await;
    scrape::sum(&samples, "drover_provider_request_duration_seconds_sum", "")
}

/// Sends a request that starts an operation, waits for its end, and
/// measures both times.
async fn measured<F, Fut>(client: &mut Client, replica: &ReplicaProcess, send: F) -> Sample
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = v1::Operation>,
{
    let provider_before = provider_seconds(replica).await;
    let started = Instant::now();
    let op = send(client.clone()).await;
    let done = client
        .wait_operation(&op, Duration::from_secs(600))
        .await
        .expect("wait");
    let wall = started.elapsed();
    assert_eq!(done.state, O::Succeeded as i32, "{done:#?}");
    let provider = provider_seconds(replica).await - provider_before;
    Sample {
        wall,
        provider: Duration::from_secs_f64(provider.max(0.0)),
    }
}

/// One cluster's life, each operation measured under its kind.
async fn life(
    client: &mut Client,
    replica: &ReplicaProcess,
    name: &str,
    figures: &mut BTreeMap<&'static str, Vec<Sample>>,
) {
    let spec = v1::ClusterSpec {
        version: V1.into(),
        control_nodes: 1,
        worker_nodes: 1,
        node_offering: "small".into(),
        ..Default::default()
    };
    let create = v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(spec),
        ..Default::default()
    };
    let sample = measured(client, replica, |mut c| async move {
        let created = c.clusters().create_cluster(create).await.expect("create");
        created.into_inner().operation.expect("a start")
    })
    .await;
    figures.entry("create").or_default().push(sample);
    let steps: [(&'static str, Request); 5] = [
        ("scale", Request::Scale),
        ("upgrade", Request::Upgrade),
        ("stop", Request::Stop),
        ("start", Request::Start),
        ("destroy", Request::Destroy),
    ];
    for (kind, request) in steps {
        let name = name.to_string();
        let sample = measured(client, replica, |c| request.send(c, name)).await;
        figures.entry(kind).or_default().push(sample);
    }
}

#[derive(Clone, Copy)]
enum Request {
    Scale,
    Upgrade,
    Stop,
    Start,
    Destroy,
}

impl Request {
    async fn send(self, mut c: Client, name: String) -> v1::Operation {
        let clusters = &mut c.clusters();
        let answer = match self {
            Request::Scale => {
                let r = v1::ScaleClusterRequest {
                    name,
                    worker_nodes: Some(2),
                    ..Default::default()
                };
                clusters.scale_cluster(r).await
            }
            Request::Upgrade => {
                let r = v1::UpgradeClusterRequest {
                    name,
                    version: V2.into(),
                    request_id: String::new(),
                    allow_downgrade: false,
                    ..Default::default()
                };
                clusters.upgrade_cluster(r).await
            }
            Request::Stop => {
                let r = v1::StopClusterRequest {
                    name,
                    request_id: String::new(),
                    ..Default::default()
                };
                clusters.stop_cluster(r).await
            }
            Request::Start => {
                let r = v1::StartClusterRequest {
                    name,
                    request_id: String::new(),
                    ..Default::default()
                };
                clusters.start_cluster(r).await
            }
            Request::Destroy => {
                let r = v1::DeleteClusterRequest {
                    name,
                    request_id: String::new(),
                    ..Default::default()
                };
                clusters.delete_cluster(r).await
            }
        };
        answer.expect("accepted").into_inner()
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 100_000.0).round() / 100.0
}

fn mean(samples: &[Sample], of: impl Fn(&Sample) -> Duration) -> Duration {
    let total: Duration = samples.iter().map(of).sum();
    total / samples.len().max(1) as u32
}

fn report(figures: &BTreeMap<&'static str, Vec<Sample>>) -> Value {
    println!(
        "{:<8} {:>3} {:>12} {:>14} {:>12} {:>8}",
        "KIND", "N", "WALL ms", "PROVIDER ms", "DROVER ms", "DROVER %"
    );
    let mut rows = Vec::new();
    for (kind, samples) in figures {
        let wall = mean(samples, |s| s.wall);
        let provider = mean(samples, |s| s.provider.min(s.wall));
        let drover = wall.saturating_sub(provider);
        let share = 100.0 * drover.as_secs_f64() / wall.as_secs_f64().max(1e-9);
        println!(
            "{:<8} {:>3} {:>12.1} {:>14.1} {:>12.1} {:>7.1}%",
            kind,
            samples.len(),
            ms(wall),
            ms(provider),
            ms(drover),
            share
        );
        rows.push(json!({
            "kind": kind,
            "n": samples.len(),
            "wall_ms": ms(wall),
            "provider_ms": ms(provider),
            "drover_ms": ms(drover),
        }));
    }
    Value::Array(rows)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let etcd = EtcdProcess::start().await;
    let provider = Running::start(args.provider).await;
    let endpoint = provider.endpoint();
    let flags = [
        "--provider",
        &endpoint,
        "--lease-ttl",
        "10",
        "--scan-interval",
        "3600",
    ];
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "bench", &flags).await;
    let mut client = replica.client().await;
    let mut figures = BTreeMap::new();
    for round in 0..args.rounds {
        life(
            &mut client,
            &replica,
            &format!("bench-{round}"),
            &mut figures,
        )
        .await;
    }
    let rows = report(&figures);
    let provider_name = match args.provider {
        Kind::Postgres => "postgres",
        Kind::Simulator => "simulator",
    };
    let report = json!({"provider": provider_name, "rounds": args.rounds, "operations": rows});
    let text = serde_json::to_string_pretty(&report).expect("json");
    std::fs::write(&args.json, text).expect("write the JSON report");
}
