//! drover-bench: Drover measured against raw etcd, side by side, in one run
//! on the same etcd.
//!
//! Phases: raw etcd CAS transactions per second; complete Drover operations
//! (stop/start pairs on a zero-latency simulated provider) through three
//! replicas; failover (kill -9 of an owner with an operation in flight, and
//! SIGTERM hand-off); crashes side by side at lease TTLs of 5 s and 15 s, with
//! fast crash detection on and off (kill -9 of an owner mid-upgrade, kill -9
//! then restart of the same replica id, SIGSTOP past the TTL); bulk recovery
//! of many clusters when one replica dies, with each replica's RSS; a
//! rollout over many clusters at a concurrency limit, its owner killed part
//! way (`drover_tests::rollout_bench`). The throughput phase runs again
//! with every replica exporting OpenTelemetry traces at `--trace-sample`
//! (1 % by default), so tracing's cost shows beside its absence.
//!
//! The bulk phase also lists the whole fleet with ListClusters (500 a page,
//! from the watch cache and from etcd, and a filtered share of it), each
//! page timed, and resumes WatchClusters from the listing's revision.
//! `--etcd-members 3` runs everything on a three-member etcd on loopback.
//!
//! `--phases` runs only some of them (throughput, tracing, failover,
//! handoff, crash, bulk, rollout). Each prints its figures under a heading
//! `== <phase> ==` as it ends; the JSON is written at the end. The bench
//! fails (non-zero exit) on a panic, and when a phase it ran produced no
//! figure where one is expected (no samples, NaN, zero): a missing figure is
//! an error, a slow number is not. Every process it starts (etcd, the
//! provider, the replicas) is killed by pid when it ends, also on a panic
//! and on SIGINT, SIGTERM or SIGHUP.

use clap::Parser;
use drover_client::v1::{self, admin_client::AdminClient, OperationState as O};
use drover_client::Client;
use drover_server::store::{
    CmpOp, Compare, EtcdOptions, EtcdStore, LeaseId, Op, RangeRequest, Store, Txn,
};
use drover_tests::etcd::{EtcdCluster, EtcdProcess};
use drover_tests::procfs::{cpu_time, rss_kib, CpuTimes};
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::rollout_bench::{RolloutFigures, RolloutPhase};
use drover_tests::scrape;
use drover_tests::{owner, stop_or_start_waiting, wait_running, wait_until};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "drover-bench", about = "Drover vs raw etcd, side by side")]
struct Args {
    /// The phases to run, comma-separated (default: all); they run in the
    /// order listed here whatever the order given.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Phase::ALL)]
    phases: Vec<Phase>,
    /// Concurrent clients in the throughput phases.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Length of each throughput phase, seconds.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds of the two throughput phases, alternated.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Replica lease TTL, seconds.
    #[arg(long, default_value_t = 2)]
    ttl: u64,
    /// kill -9 failovers to measure.
    #[arg(long, default_value_t = 5)]
    failovers: usize,
    /// Lease TTLs (seconds) of the crash phase, each run with fast crash
    /// detection on and then off.
    #[arg(long, value_delimiter = ',', default_values_t = [5, 15])]
    crash_ttls: Vec<u64>,
    /// kill -9 of an owner mid-upgrade per crash variant.
    #[arg(long, default_value_t = 10)]
    crash_kills: usize,
    /// kill -9 mid-upgrade for the lease-bound variants at a TTL above 5 s,
    /// each of which waits a whole TTL.
    #[arg(long, default_value_t = 4)]
    slow_crash_kills: usize,
    /// kill -9 then restart of the same replica id per crash variant.
    #[arg(long, default_value_t = 3)]
    crash_restarts: usize,
    /// Clusters in the bulk-recovery phase.
    #[arg(long, default_value_t = 10_000)]
    bulk_clusters: usize,
    /// Create the bulk clusters through the API, one call each (slow at
    /// 100,000), rather than copies of the first written straight into etcd.
    #[arg(long)]
    bulk_through_api: bool,
    /// Run the bulk phase's replicas with `--peer-liveness off`: the dead
    /// replica's clusters wait for its lease to expire (`--ttl`), and etcd
    /// then deletes all their owner keys in one apply (the worst case: a
    /// partition, or fast detection turned off).
    #[arg(long)]
    bulk_lease_bound: bool,
    /// Clusters in the rollout phase (0: no rollout phase).
    #[arg(long, default_value_t = 10_000)]
    rollout_clusters: usize,
    /// The rollout's max_concurrency.
    #[arg(long, default_value_t = 500)]
    rollout_concurrency: usize,
    /// The simulated provider's latency per call in the rollout phase, ms.
    #[arg(long, default_value_t = 50)]
    rollout_latency_ms: u64,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench.json")]
    json: std::path::PathBuf,
    /// Pin etcd to this CPU and everything else (the benchmark, the
    /// provider, the replicas) to the other CPUs, so etcd has the same
    /// compute in every phase instead of sharing it with Drover.
    #[arg(long)]
    etcd_cpu: Option<usize>,
    /// Write CPU profiles of etcd during the first raw and the first Drover
    /// round, and at rest with the bulk clusters, to this directory
    /// (`etcd-raw.pprof`, `etcd-drover.pprof`, `etcd-rest.pprof`; read them
    /// with `go tool pprof -top -cum FILE`). Profiling costs etcd CPU:
    /// quote figures from runs without it.
    #[arg(long)]
    etcd_profiles: Option<std::path::PathBuf>,
    /// After the throughput phase, run it again with every replica
    /// exporting OpenTelemetry traces (to a receiver in this process),
    /// sampling this share of operations; 0 skips it.
    #[arg(long, default_value_t = 0.01)]
    trace_sample: f64,
    /// Drover rounds send each stop or start, then a WaitOperation: two
    /// calls per operation, as clients did before a lifecycle call could
    /// wait (`wait_ms`). Default: one call that waits.
    #[arg(long)]
    accept_then_wait: bool,
    /// etcd members on loopback (1: a single-member etcd, as before). With
    /// more, the replicas and the raw-CAS clients are given every member's
    /// endpoint, and `--etcd-cpu` pins every member; the report says which
    /// member each etcd figure is from.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=7))]
    etcd_members: u64,
}

/// Which members each etcd figure is from, said in the report (it matters
/// with `--etcd-members` above 1).
const ETCD_FIGURES: &str = "etcd CPU, RSS per member and request counters: every member, summed; \
fsync ms and writes per fsync: the members' mean; database size and CPU profiles: the leader's";

/// The etcd the bench runs on: one member started as every test starts it,
/// or `--etcd-members` members on loopback.
enum BenchEtcd {
    // Boxed: the single process is far larger than the cluster's handle.
    One(Box<EtcdProcess>),
    Many(EtcdCluster),
}

impl BenchEtcd {
    async fn start(members: u64, profiled: bool) -> Self {
        match (members, profiled) {
            (1, false) => Self::One(Box::new(EtcdProcess::start().await)),
            (1, true) => Self::One(Box::new(EtcdProcess::start_profiled().await)),
            (n, false) => Self::Many(EtcdCluster::start(n as usize).await),
            (n, true) => Self::Many(EtcdCluster::start_profiled(n as usize).await),
        }
    }

    /// Every member's client URL.
    fn endpoints(&self) -> Vec<String> {
        match self {
            Self::One(etcd) => vec![etcd.endpoint()],
            Self::Many(cluster) => cluster.endpoints(),
        }
    }

    /// What `--etcd-endpoints` takes.
    fn endpoint_list(&self) -> String {
        self.endpoints().join(",")
    }

    /// A store over every member that sends each transaction as a request
    /// of its own, as a plain etcd client does: the raw loop's.
    async fn unbatched_store(&self) -> EtcdStore {
        let mut options = EtcdOptions::new(self.endpoints());
        options.group_commit = false;
        EtcdStore::connect(&options)
            .await
            .expect("connect to the bench's etcd")
    }

    /// A store over every member.
    async fn store(&self) -> EtcdStore {
        match self {
            Self::One(etcd) => etcd.store().await,
            Self::Many(cluster) => cluster.store().await,
        }
    }

    /// Every member's process id.
    fn pids(&self) -> Vec<u32> {
        let pids = match self {
            Self::One(etcd) => etcd.pid().into_iter().collect(),
            Self::Many(cluster) => cluster.pids(),
        };
        assert!(!pids.is_empty(), "etcd is not running");
        pids
    }

    /// CPU time of every member together.
    fn cpu(&self) -> Duration {
        self.pids().into_iter().map(cpu_time).sum()
    }

    /// Each member's `/metrics`.
    async fn metrics(&self) -> Vec<std::collections::BTreeMap<String, f64>> {
        let mut all = Vec::new();
        for endpoint in self.endpoints() {
            all.push(scrape::metrics(&endpoint).await);
        }
        all
    }

    /// The leader's index among the members (0 with one member).
    fn leader(&self) -> usize {
        match self {
            Self::One(_) => 0,
            Self::Many(cluster) => cluster.leader().expect("an etcd leader"),
        }
    }

    /// Who a leader-only figure is from, for the report.
    fn whose(&self) -> String {
        match self {
            Self::One(_) => "the only member".into(),
            Self::Many(_) => format!("the leader, member m{}", self.leader()),
        }
    }

    /// `etcdctl endpoint status` of the leader.
    fn leader_status(&self) -> Value {
        let args = ["endpoint", "status", "-w", "json"];
        let status = match self {
            Self::One(etcd) => etcd.etcdctl(&args),
            Self::Many(cluster) => cluster.etcdctl(&args),
        };
        let status: Value = serde_json::from_str(&status).expect("etcdctl's JSON");
        let statuses = status.as_array().expect("one status per member");
        let leader = statuses[0]["Status"]["leader"].as_u64();
        statuses
            .iter()
            .find(|s| s["Status"]["header"]["member_id"].as_u64() == leader)
            .unwrap_or(&statuses[0])
            .clone()
    }

    /// A CPU profile over the next `seconds` of the leader (the member
    /// that orders every write).
    async fn cpu_profile(&self, seconds: u64) -> Vec<u8> {
        match self {
            Self::One(etcd) => etcd.cpu_profile(seconds).await,
            Self::Many(cluster) => cluster.cpu_profile(self.leader(), seconds).await,
        }
    }
}

/// Pins every thread of process `pid` to `cpus` (a taskset list).
fn pin(pid: u32, cpus: &str) {
    let status = std::process::Command::new("taskset")
        .args(["--all-tasks", "--cpu-list", "--pid", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run taskset");
    assert!(status.success(), "taskset {cpus} {pid} failed");
}

/// Splits the machine: etcd (every member) on `etcd_cpu`, this process
/// (and so every process it starts from now on) on the rest.
fn split_cpus(etcd: &BenchEtcd, etcd_cpu: usize) -> (String, String) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        etcd_cpu < cpus && cpus > 1,
        "--etcd-cpu {etcd_cpu} needs at least two CPUs and a valid index (this machine has {cpus})"
    );
    let rest: Vec<String> = (0..cpus)
        .filter(|cpu| *cpu != etcd_cpu)
        .map(|cpu| cpu.to_string())
        .collect();
    let rest = rest.join(",");
    pin(std::process::id(), &rest);
    for pid in etcd.pids() {
        pin(pid, &etcd_cpu.to_string());
    }
    (etcd_cpu.to_string(), rest)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// `x` rounded to two decimals, for the JSON report.
fn hundredths(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn us(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e7).round() / 10.0
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

async fn revision(store: &dyn Store) -> i64 {
    store.get("/").await.expect("read revision").revision
}

/// Raw etcd: `clients` tasks, each compare-and-swapping its own key.
async fn raw_cas(etcd: &BenchEtcd, clients: usize, length: Duration) -> f64 {
    let store = Arc::new(etcd.unbatched_store().await);
    let deadline = Instant::now() + length;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let key = format!("/bench/raw/{i}");
            let mut last = store
                .txn(Txn::new().and_then([Op::put(&key, "0")]))
                .await
                .unwrap()
                .revision;
            let mut done = 0u64;
            while Instant::now() < deadline {
                let txn = Txn::new()
                    .when([Compare::mod_revision(&key, CmpOp::Equal, last)])
                    .and_then([Op::put(&key, done.to_string())]);
                last = store.cas(txn).await.expect("uncontended CAS").revision;
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / length.as_secs_f64()
}

fn spec(workers: u32) -> v1::ClusterSpec {
    v1::ClusterSpec {
        version: "1.29.0".into(),
        control_nodes: 1,
        worker_nodes: workers,
        node_offering: "m".into(),
        ..Default::default()
    }
}

async fn create(client: &mut Client, name: &str, start: bool) -> Option<v1::Operation> {
    client
        .clusters()
        .create_cluster(v1::CreateClusterRequest {
            name: name.into(),
            spec: Some(spec(1)),
            create_only: !start,
            request_id: String::new(),
        })
        .await
        .expect("create")
        .into_inner()
        .operation
}

/// The longest the bench waits for one operation.
const OPERATION_WAIT: Duration = Duration::from_secs(60);

async fn finish(client: &mut Client, op: &v1::Operation) -> v1::Operation {
    let done = client
        .wait_operation(op, OPERATION_WAIT)
        .await
        .expect("wait");
    assert!(
        done.state >= O::Succeeded as i32,
        "operation still running: {done:?}"
    );
    done
}

/// The throughput phases, pooled over every round.
struct Throughput {
    raw_per_second: f64,
    ops_per_second: f64,
    p50: Duration,
    p99: Duration,
    writes_per_op: f64,
    /// What etcd served per operation, from its own counters: why an
    /// operation costs what it does.
    etcd_per_op: EtcdRequests,
    /// Each round's ops/s against its own goal, to show the spread.
    round_ratios: Vec<f64>,
    /// etcd's write-ahead log in the raw and in the Drover rounds: fewer
    /// writes per fsync mean more of etcd's per-batch work per write.
    raw_wal: EtcdWal,
    drover_wal: EtcdWal,
    /// Mean etcd transaction and provider call, as the replicas saw them.
    waits: ReplicaWaits,
    /// CPU time etcd spent per raw CAS: steadier than rates on a machine
    /// whose speed drifts.
    etcd_cpu_per_raw_txn: Duration,
    /// CPU time per Drover operation: etcd's, the three replicas' together,
    /// the provider's.
    cpu_per_op: CpuTimes,
    /// The CPUs the rounds ran on.
    cores: Cores,
    /// Provider calls the replicas made per operation.
    provider_calls_per_op: f64,
    /// API calls a client made per operation: 1 (a call that waits), or 2
    /// (an accept, then WaitOperation).
    served_calls_per_op: u32,
    /// Replica CPU per health check, the cheapest call a replica serves:
    /// what one call costs here, all in (HTTP/2, tonic, loopback TCP), the
    /// floor under every call an operation makes.
    replica_cpu_per_call: Duration,
}

/// One Drover round.
struct DroverRound {
    latencies: Vec<Duration>,
    revisions: i64,
    requests: EtcdRequests,
}

impl DroverRound {
    fn ops(&self) -> f64 {
        self.latencies.len() as f64
    }
}

fn goal(raw_per_second: f64, writes_per_op: f64) -> f64 {
    0.7 * raw_per_second / writes_per_op
}

/// etcd's request counters over a phase.
#[derive(Default)]
struct EtcdRequests {
    txns: f64,
    ranges: f64,
    watch_events: f64,
    /// Watch responses etcd sent: one message per watcher per transaction
    /// that touched its range.
    watch_responses: f64,
}

impl EtcdRequests {
    /// Summed over the members: each serves the clients connected to it.
    async fn read(etcd: &BenchEtcd) -> Self {
        let mut requests = Self::default();
        for samples in etcd.metrics().await {
            let handled = |method: &str| {
                scrape::sum(
                    &samples,
                    "grpc_server_handled_total",
                    &format!("grpc_method=\"{method}\""),
                )
            };
            let watch = "grpc_method=\"Watch\"";
            requests.add(&Self {
                txns: handled("Txn"),
                ranges: handled("Range"),
                watch_events: scrape::sum(&samples, "etcd_debugging_mvcc_events_total", ""),
                watch_responses: scrape::sum(&samples, "grpc_server_msg_sent_total", watch),
            });
        }
        requests
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            txns: self.txns - before.txns,
            ranges: self.ranges - before.ranges,
            watch_events: self.watch_events - before.watch_events,
            watch_responses: self.watch_responses - before.watch_responses,
        }
    }

    fn add(&mut self, other: &Self) {
        self.txns += other.txns;
        self.ranges += other.ranges;
        self.watch_events += other.watch_events;
        self.watch_responses += other.watch_responses;
    }

    fn per(&self, count: f64) -> Self {
        let count = count.max(1.0);
        Self {
            txns: self.txns / count,
            ranges: self.ranges / count,
            watch_events: self.watch_events / count,
            watch_responses: self.watch_responses / count,
        }
    }

    fn json(&self) -> Value {
        json!({
            "txn_requests": hundredths(self.txns),
            "range_requests": hundredths(self.ranges),
            "watch_events_sent": hundredths(self.watch_events),
            "watch_responses_sent": hundredths(self.watch_responses),
        })
    }
}

/// etcd's write-ahead log over a phase: every write waits for an fsync, and
/// etcd batches the writes that arrive meanwhile into one.
#[derive(Default)]
struct EtcdWal {
    fsyncs: f64,
    fsync_seconds: f64,
    writes: f64,
}

impl EtcdWal {
    /// Summed over the members: every member logs and fsyncs every write,
    /// so the ratios (ms per fsync, writes per fsync) are the members' mean.
    async fn read(etcd: &BenchEtcd) -> Self {
        let mut wal = Self::default();
        for samples in etcd.metrics().await {
            let metric = |name: &str| scrape::sum(&samples, name, "");
            wal.fsyncs += metric("etcd_disk_wal_fsync_duration_seconds_count");
            wal.fsync_seconds += metric("etcd_disk_wal_fsync_duration_seconds_sum");
            wal.writes += metric("etcd_server_proposals_committed_total");
        }
        wal
    }

    fn add_since(&mut self, now: &Self, before: &Self) {
        self.fsyncs += now.fsyncs - before.fsyncs;
        self.fsync_seconds += now.fsync_seconds - before.fsync_seconds;
        self.writes += now.writes - before.writes;
    }

    fn fsync_ms(&self) -> f64 {
        self.fsync_seconds * 1000.0 / self.fsyncs.max(1.0)
    }

    fn writes_per_fsync(&self) -> f64 {
        self.writes / self.fsyncs.max(1.0)
    }

    fn json(&self) -> Value {
        json!({
            "fsync_ms": hundredths(self.fsync_ms()),
            "writes_per_fsync": hundredths(self.writes_per_fsync()),
        })
    }
}

/// What the replicas waited on over a phase, summed over every replica,
/// from their own `/metrics`: the links of an operation's chain.
#[derive(Default)]
struct ReplicaWaits {
    txns: f64,
    txn_seconds: f64,
    provider_calls: f64,
    provider_seconds: f64,
}

impl ReplicaWaits {
    async fn read(replicas: &[(String, ReplicaProcess)]) -> Self {
        let mut waits = Self::default();
        for (_, replica) in replicas {
            let samples = scrape::metrics(&replica.admin_endpoint()).await;
            let txn = "request=\"txn\"";
            waits.txns += scrape::sum(&samples, "drover_etcd_request_duration_seconds_count", txn);
            waits.txn_seconds +=
                scrape::sum(&samples, "drover_etcd_request_duration_seconds_sum", txn);
            waits.provider_calls += scrape::sum(
                &samples,
                "drover_provider_request_duration_seconds_count",
                "",
            );
            waits.provider_seconds +=
                scrape::sum(&samples, "drover_provider_request_duration_seconds_sum", "");
        }
        waits
    }

    fn add_since(&mut self, now: &Self, before: &Self) {
        self.txns += now.txns - before.txns;
        self.txn_seconds += now.txn_seconds - before.txn_seconds;
        self.provider_calls += now.provider_calls - before.provider_calls;
        self.provider_seconds += now.provider_seconds - before.provider_seconds;
    }

    fn txn_ms(&self) -> f64 {
        self.txn_seconds * 1000.0 / self.txns.max(1.0)
    }

    fn provider_ms(&self) -> f64 {
        self.provider_seconds * 1000.0 / self.provider_calls.max(1.0)
    }
}

/// Raw etcd and Drover in alternating rounds of `length` each, so a
/// machine whose speed drifts affects both alike.
/// Runs `phase`; with `profiles`, profiles etcd's CPU meanwhile (for all
/// but the last second of `length`) into `<profiles>/etcd-<name>.pprof`.
async fn profiled<F: std::future::Future>(
    etcd: &BenchEtcd,
    profiles: Option<&std::path::Path>,
    name: &str,
    length: Duration,
    phase: F,
) -> F::Output {
    let Some(dir) = profiles else {
        return phase.await;
    };
    let seconds = length.as_secs().saturating_sub(1).max(1);
    let (output, profile) = tokio::join!(phase, etcd.cpu_profile(seconds));
    let path = dir.join(format!("etcd-{name}.pprof"));
    std::fs::write(&path, profile)
        .unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
    eprintln!(
        "etcd CPU profile of the {name} round ({}): {}",
        etcd.whose(),
        path.display()
    );
    output
}

/// The throughput phases on clusters `<prefix>-0` ... (one per client,
/// created first).
#[allow(clippy::too_many_arguments)]
async fn throughput(
    etcd: &BenchEtcd,
    replicas: &[(String, ReplicaProcess)],
    clients: usize,
    length: Duration,
    rounds: usize,
    processes: &Processes,
    profiles: Option<&std::path::Path>,
    prefix: &str,
    accept_then_wait: bool,
) -> Throughput {
    let mut setup = replicas[0].1.client().await;
    for i in 0..clients {
        let op = create(&mut setup, &format!("{prefix}-{i}"), true)
            .await
            .expect("a start");
        finish(&mut setup, &op).await;
    }
    let mut stop_next = vec![true; clients];
    let (mut raws, mut drovers) = (Vec::new(), Vec::new());
    let (mut raw_cpu, mut drover_cpu) = (CpuTimes::default(), CpuTimes::default());
    let (mut raw_wal, mut drover_wal) = (EtcdWal::default(), EtcdWal::default());
    let mut waits = ReplicaWaits::default();
    for round in 1..=rounds {
        // Only the first round is profiled: profiling costs etcd CPU.
        let profiles = profiles.filter(|_| round == 1);
        eprintln!("round {round}/{rounds}: raw etcd CAS, {clients} clients, {length:?}...");
        let (before, wal_before) = (processes.cpu(), EtcdWal::read(etcd).await);
        let raw = raw_cas(etcd, clients, length);
        raws.push(profiled(etcd, profiles, "raw", length, raw).await);
        raw_cpu.add(&processes.cpu().since(&before));
        raw_wal.add_since(&EtcdWal::read(etcd).await, &wal_before);
        eprintln!("round {round}/{rounds}: drover stop/start, {clients} clients, {length:?}...");
        let (before, wal_before) = (processes.cpu(), EtcdWal::read(etcd).await);
        let waits_before = ReplicaWaits::read(replicas).await;
        let drover = drover_round(
            etcd,
            replicas,
            length,
            &mut stop_next,
            prefix,
            accept_then_wait,
        );
        drovers.push(profiled(etcd, profiles, "drover", length, drover).await);
        drover_cpu.add(&processes.cpu().since(&before));
        drover_wal.add_since(&EtcdWal::read(etcd).await, &wal_before);
        waits.add_since(&ReplicaWaits::read(replicas).await, &waits_before);
    }
    let replica_cpu_per_call = health_checks(replicas, clients, length / 2, processes).await;
    let provider_calls_per_op = waits.provider_calls / ops_of(&drovers).max(1.0);
    let raw_txns = raws.iter().sum::<f64>() * length.as_secs_f64();
    let seconds = length.as_secs_f64() * rounds as f64;
    let ops = ops_of(&drovers);
    let revisions: i64 = drovers.iter().map(|r| r.revisions).sum();
    let mut requests = EtcdRequests::default();
    let mut latencies = Vec::new();
    for drover in &drovers {
        requests.add(&drover.requests);
        latencies.extend(&drover.latencies);
    }
    latencies.sort();
    let round_ratios = raws
        .iter()
        .zip(&drovers)
        .map(|(raw, drover)| {
            let writes_per_op = drover.revisions as f64 / drover.ops().max(1.0);
            let ops_per_second = drover.ops() / length.as_secs_f64();
            ops_per_second / goal(*raw, writes_per_op)
        })
        .collect();
    Throughput {
        raw_per_second: raws.iter().sum::<f64>() / rounds as f64,
        ops_per_second: ops / seconds,
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        writes_per_op: revisions as f64 / ops.max(1.0),
        etcd_per_op: requests.per(ops),
        round_ratios,
        raw_wal,
        drover_wal,
        waits,
        etcd_cpu_per_raw_txn: raw_cpu.etcd.div_f64(raw_txns.max(1.0)),
        cpu_per_op: drover_cpu.per(ops),
        cores: processes.cores,
        provider_calls_per_op,
        served_calls_per_op: if accept_then_wait { 2 } else { 1 },
        replica_cpu_per_call,
    }
}

fn ops_of(rounds: &[DroverRound]) -> f64 {
    rounds.iter().map(DroverRound::ops).sum()
}

/// Health checks from `clients` clients spread over the replicas for
/// `length`: the replicas' CPU per check.
async fn health_checks(
    replicas: &[(String, ReplicaProcess)],
    clients: usize,
    length: Duration,
    processes: &Processes,
) -> Duration {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    eprintln!("health checks, {clients} clients, {length:?}...");
    let before = processes.cpu();
    let deadline = Instant::now() + length;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let endpoint = replicas[i % replicas.len()].1.endpoint();
        tasks.push(tokio::spawn(async move {
            let channel = tonic::transport::Channel::from_shared(endpoint)
                .expect("an endpoint")
                .connect()
                .await
                .expect("connect");
            let mut health = HealthClient::new(channel);
            let mut checks = 0u64;
            while Instant::now() < deadline {
                let request = HealthCheckRequest::default();
                health.check(request).await.expect("a health check");
                checks += 1;
            }
            checks
        }));
    }
    let mut checks = 0;
    for task in tasks {
        checks += task.await.expect("a health-check client");
    }
    processes.cpu().since(&before).per(checks as f64).replicas
}

/// Stop/start pairs for `length` on one cluster per client, spread over the
/// replicas; `stop_next` says, per client, which comes next.
async fn drover_round(
    etcd: &BenchEtcd,
    replicas: &[(String, ReplicaProcess)],
    length: Duration,
    stop_next: &mut [bool],
    prefix: &str,
    accept_then_wait: bool,
) -> DroverRound {
    let store = etcd.store().await;
    let before = revision(&store).await;
    let requests_before = EtcdRequests::read(etcd).await;
    let deadline = Instant::now() + length;
    let mut tasks = Vec::new();
    for (i, first_stop) in stop_next.iter().enumerate() {
        let mut client = replicas[i % replicas.len()].1.client().await;
        let mut stop_next = *first_stop;
        let name = format!("{prefix}-{i}");
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let started = Instant::now();
                // One call (wait_ms), or an accept and then a wait.
                let wait = match accept_then_wait {
                    true => Duration::ZERO,
                    false => OPERATION_WAIT,
                };
                let op = stop_or_start_waiting(&mut client, &name, stop_next, wait)
                    .await
                    .expect("accepted");
                let done = match op.state >= O::Succeeded as i32 {
                    true => op,
                    false => finish(&mut client, &op).await,
                };
                assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
                latencies.push(started.elapsed());
                stop_next = !stop_next;
            }
            (latencies, stop_next)
        }));
    }
    let mut latencies = Vec::new();
    for (task, next) in tasks.into_iter().zip(stop_next.iter_mut()) {
        let (done, stop) = task.await.unwrap();
        latencies.extend(done);
        *next = stop;
    }
    DroverRound {
        latencies,
        revisions: revision(&store).await - before,
        requests: EtcdRequests::read(etcd).await.since(&requests_before),
    }
}

/// Fields drop in order: replicas first, etcd last.
struct Bench {
    cores: Cores,
    replicas: Vec<(String, ReplicaProcess)>,
    sim: SimProcess,
    etcd: BenchEtcd,
    ttl: u64,
    /// `--peer-liveness` of the replicas added.
    liveness: bool,
    /// Where the replicas added send traces (`--otlp-endpoint`), if anywhere.
    otlp: Option<String>,
    next_id: usize,
}

impl Bench {
    async fn add_replica(&mut self) {
        self.next_id += 1;
        let id = format!("b{}", self.next_id);
        let replica = self.spawn(&id).await;
        self.replicas.push((id, replica));
    }

    /// A replica process with id `id`, serving.
    async fn spawn(&self, id: &str) -> ReplicaProcess {
        let (provider, ttl) = (self.sim.endpoint(), self.ttl.to_string());
        let liveness = if self.liveness { "on" } else { "off" };
        let mut args = vec![
            "--provider",
            provider.as_str(),
            "--lease-ttl",
            ttl.as_str(),
            "--peer-liveness",
            liveness,
        ];
        if let Some(endpoint) = &self.otlp {
            args.extend(["--otlp-endpoint", endpoint.as_str()]);
        }
        ReplicaProcess::serve_with(&self.etcd.endpoint_list(), id, &args).await
    }

    /// Replaces every replica by a new one with the same id (SIGTERM,
    /// then start): to change their flags.
    async fn restart_replicas(&mut self) {
        for i in 0..self.replicas.len() {
            let id = self.replicas[i].0.clone();
            self.replicas[i].1.terminate().await;
            self.replicas[i].1 = self.spawn(&id).await;
        }
    }

    /// The processes whose CPU time a phase counts.
    fn processes(&self) -> Processes {
        Processes {
            etcd: self.etcd.pids(),
            replicas: self.replicas.iter().map(|(_, r)| r.pid()).collect(),
            provider: self.sim.pid(),
            cores: self.cores,
        }
    }

    fn remove(&mut self, id: &str) -> ReplicaProcess {
        let index = self
            .replicas
            .iter()
            .position(|(r, _)| r == id)
            .expect("known replica");
        self.replicas.remove(index).1
    }

    async fn admin(&self) -> AdminClient<tonic::transport::Channel> {
        AdminClient::connect(self.replicas[0].1.endpoint())
            .await
            .expect("admin")
    }
}

/// kill -9 of the owner of a cluster whose operation is in flight, until
/// a peer has taken the orphaned operation up: resumed it (its run is
/// recorded, after the fence) or, with `--orphaned-operations=fail`, failed it.
async fn failover(bench: &mut Bench, rounds: usize) -> Vec<Duration> {
    let mut times = Vec::new();
    for round in 0..rounds {
        let name = format!("failover-{round}");
        let mut client = bench.replicas[0].1.client().await;
        let op = create(&mut client, &name, true).await.expect("start");
        finish(&mut client, &op).await;
        bench.sim.set_latency(Duration::from_secs(3)).await;
        let request = v1::StopClusterRequest {
            name: name.clone(),
            request_id: String::new(),
            ..Default::default()
        };
        let op = client
            .clusters()
            .stop_cluster(request)
            .await
            .expect("stop")
            .into_inner();
        let mut admin = bench.admin().await;
        let id = op.id.clone();
        wait_running(&client, &name, &id, Duration::from_secs(30)).await;
        let victim = owner(&mut admin, &name).await.expect("an owner").replica;
        let mut replica = bench.remove(&victim);
        let killed = Instant::now();
        replica.kill9();
        let mut survivor = bench.replicas[0].1.client().await;
        // Polled every 10 ms: with a peer seeing the crash, it takes a
        // fraction of a second.
        loop {
            let request = v1::GetOperationRequest {
                cluster: name.clone(),
                id: id.clone(),
            };
            let now = survivor.operations().get_operation(request).await;
            let taken_up = now.is_ok_and(|now| {
                let now = now.into_inner();
                now.state == O::Failed as i32 || now.runs.iter().any(|r| r.replica != victim)
            });
            if taken_up {
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(60),
                "no peer took the orphan up 60 s after kill -9"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        times.push(killed.elapsed());
        let done = survivor
            .wait_operation(&op, Duration::from_secs(60))
            .await
            .expect("wait");
        assert!(
            done.state == O::Failed as i32 || done.state == O::Succeeded as i32,
            "{done:?}"
        );
        bench.sim.set_latency(Duration::ZERO).await;
        bench.add_replica().await;
    }
    times.sort();
    times
}

/// SIGTERM of an owner until a peer owns its cluster.
async fn handoff(bench: &mut Bench) -> Duration {
    let mut client = bench.replicas[0].1.client().await;
    let op = create(&mut client, "handoff", true).await.expect("start");
    finish(&mut client, &op).await;
    let mut admin = bench.admin().await;
    let victim = owner(&mut admin, "handoff")
        .await
        .expect("an owner")
        .replica;
    let mut replica = bench.remove(&victim);
    let admin = bench.admin().await;
    let mut admin = admin.clone();
    let started = Instant::now();
    replica.signal("TERM");
    // Polled every 5 ms: the hand-off itself takes tens of milliseconds.
    while owner(&mut admin, "handoff")
        .await
        .is_none_or(|o| o.replica == victim)
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no peer owns the cluster 60 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let _ = replica.terminate().await;
    bench.add_replica().await;
    elapsed
}

/// The processes whose CPU time the throughput phases account for.
struct Processes {
    /// Every etcd member: their CPU is summed.
    etcd: Vec<u32>,
    replicas: Vec<u32>,
    provider: u32,
    cores: Cores,
}

/// The CPUs the processes share.
#[derive(Clone, Copy)]
struct Cores {
    /// Every CPU the bench was given.
    all: usize,
    /// etcd alone on one of them (`--etcd-cpu`), everything else on the
    /// rest.
    etcd_pinned: bool,
}

impl Cores {
    /// The most operations per second CPU time `per_op` allows: etcd's
    /// and everything else's apart when etcd has a CPU of its own.
    fn ops_allowed(&self, per_op: &CpuTimes) -> f64 {
        let per_second = |cpu: Duration, cores: usize| cores as f64 / cpu.as_secs_f64().max(1e-9);
        let rest = per_op.replicas + per_op.provider + per_op.clients;
        if self.etcd_pinned {
            per_second(per_op.etcd, 1).min(per_second(rest, self.all.saturating_sub(1).max(1)))
        } else {
            per_second(per_op.etcd + rest, self.all)
        }
    }
}

impl Processes {
    fn cpu(&self) -> CpuTimes {
        CpuTimes::of(&self.etcd, &self.replicas, self.provider)
    }
}

struct Bulk {
    /// Creating the clusters (through the API, `--clients` at a time).
    create: Duration,
    /// From the first create until every cluster had an owner.
    owned: Duration,
    recovery: Duration,
    slowest_request: Duration,
    rss_mib: Vec<f64>,
    /// CPU used at rest with every cluster owned, as a share of one CPU:
    /// etcd's and the three replicas' together.
    rest_cpu: (f64, f64),
    /// Keys and values under Drover's prefix, per cluster (what a
    /// cluster costs etcd before history), and etcd's database size then.
    stored: Stored,
    /// The whole fleet listed page by page, and a watch resumed after it.
    listings: Listings,
}

/// ListClusters page size in the bulk phase.
const LIST_PAGE: u32 = 500;

/// Every how-many-th bulk cluster carries [`SHARE_LABEL`]: the filtered
/// listing matches one in this many.
const LABEL_EVERY: usize = 100;

/// The label of the filtered listing's small share.
const SHARE_LABEL: (&str, &str) = ("bench-share", "one-percent");

/// One listing of the fleet, page by page.
struct Listing {
    /// Each page's time (the call as the client sees it), sorted.
    pages: Vec<Duration>,
    clusters: usize,
    /// The first page's store revision.
    revision: i64,
}

/// The bulk phase's listings and the watch resumed after one.
struct Listings {
    /// From the replica's watch cache (`linearizable: false`).
    cached: Listing,
    /// From etcd (`linearizable: true`).
    linearizable: Listing,
    /// State CREATED and [`SHARE_LABEL`], from the watch cache.
    filtered: Listing,
    /// Clusters labelled with [`SHARE_LABEL`].
    labelled: usize,
    /// From a change made after the cached listing until a WatchClusters
    /// from that listing's revision + 1 (opened after the change) delivered
    /// it.
    watch: Duration,
}

/// Every page of ListClusters with this filter, timed.
async fn list_all(
    client: &mut Client,
    state: v1::ClusterState,
    labels: &str,
    linearizable: bool,
) -> Listing {
    let mut listing = Listing {
        pages: Vec::new(),
        clusters: 0,
        revision: 0,
    };
    let mut token = String::new();
    loop {
        let request = v1::ListClustersRequest {
            page_size: LIST_PAGE,
            page_token: token,
            state: state as i32,
            label_selector: labels.into(),
            linearizable,
        };
        let started = Instant::now();
        let page = client.clusters().list_clusters(request).await;
        listing.pages.push(started.elapsed());
        let page = page.expect("list clusters").into_inner();
        if listing.revision == 0 {
            listing.revision = page.revision;
        }
        listing.clusters += page.clusters.len();
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    listing.pages.sort();
    listing
}

/// Labels every [`LABEL_EVERY`]th bulk cluster with [`SHARE_LABEL`]
/// (UpdateCluster, `clients` at a time); how many.
async fn label_share(bench: &Bench, clusters: usize, clients: usize) -> usize {
    let names: Vec<String> = (0..clusters).step_by(LABEL_EVERY).map(bulk_name).collect();
    let labelled = names.len();
    let per_client = names.len().div_ceil(clients.max(1)).max(1);
    let mut tasks = Vec::new();
    for (c, chunk) in names.chunks(per_client).enumerate() {
        let mut client = bench.replicas[c % bench.replicas.len()].1.client().await;
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            for name in chunk {
                relabel(&mut client, &name, SHARE_LABEL).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    labelled
}

/// Sets the labels of `name` to the one `label` (UpdateCluster).
async fn relabel(client: &mut Client, name: &str, (key, value): (&str, &str)) {
    let request = v1::UpdateClusterRequest {
        name: name.into(),
        labels: [(key.to_string(), value.to_string())].into_iter().collect(),
        update_labels: true,
        ..Default::default()
    };
    client
        .clusters()
        .update_cluster(request)
        .await
        .expect("relabel a cluster");
}

/// Changes the labels of `name`, then opens WatchClusters from `from`;
/// the time from the change until its event arrived.
async fn watch_change(client: &mut Client, name: &str, from: i64) -> Duration {
    let started = Instant::now();
    relabel(client, name, ("bench-watch", "seen")).await;
    let request = v1::WatchClustersRequest {
        from_revision: from,
        name: String::new(),
    };
    let mut events = client
        .clusters()
        .watch_clusters(request)
        .await
        .expect("watch clusters")
        .into_inner();
    let deadline = Duration::from_secs(30);
    loop {
        let event =
            tokio::time::timeout(deadline.saturating_sub(started.elapsed()), events.message())
                .await
                .unwrap_or_else(|_| panic!("no event of {name}'s change within {deadline:?}"))
                .expect("the watch stream")
                .expect("the watch ended before the change");
        assert!(
            event.revision >= from,
            "an event from before the listing: {event:?}"
        );
        let cluster = event.cluster.unwrap_or_default();
        let labels = cluster.spec.map(|s| s.labels).unwrap_or_default();
        if cluster.name == name && labels.contains_key("bench-watch") {
            return started.elapsed();
        }
    }
}

/// The fleet listed from the watch cache and from etcd, a small share of
/// it by a filter, and a watch resumed after the listing.
async fn listings(bench: &Bench, clusters: usize, clients: usize) -> Listings {
    eprintln!("bulk: labelling one cluster in {LABEL_EVERY}...");
    let labelled = label_share(bench, clusters, clients).await;
    let mut client = bench.replicas[1].1.client().await;
    eprintln!("bulk: listing {clusters} clusters by {LIST_PAGE}...");
    let all = v1::ClusterState::Unspecified;
    let cached = list_all(&mut client, all, "", false).await;
    // Resumed from the listing: what a client that listed, then watches,
    // would miss if the revision were wrong.
    let changed = bulk_name(clusters.max(1) - 1);
    let watch = watch_change(&mut client, &changed, cached.revision + 1).await;
    let linearizable = list_all(&mut client, all, "", true).await;
    let selector = format!("{}={}", SHARE_LABEL.0, SHARE_LABEL.1);
    let created = v1::ClusterState::Created;
    let filtered = list_all(&mut client, created, &selector, false).await;
    Listings {
        cached,
        linearizable,
        filtered,
        labelled,
        watch,
    }
}

impl Listing {
    fn json(&self) -> Value {
        json!({
            "pages": self.pages.len(),
            "clusters": self.clusters,
            "page_p50_ms": ms(percentile(&self.pages, 0.5)),
            "page_p99_ms": ms(percentile(&self.pages, 0.99)),
            "page_max_ms": ms(self.pages.last().copied().unwrap_or_default()),
        })
    }

    /// "pages; p50 / p99 / max (ms)".
    fn summary(&self) -> String {
        format!(
            "{}; {:.1} / {:.1} / {:.1}",
            self.pages.len(),
            ms(percentile(&self.pages, 0.5)),
            ms(percentile(&self.pages, 0.99)),
            ms(self.pages.last().copied().unwrap_or_default())
        )
    }
}

impl Listings {
    fn json(&self) -> Value {
        let mut filtered = self.filtered.json();
        filtered["state"] = json!("CREATED");
        filtered["label_selector"] = json!(format!("{}={}", SHARE_LABEL.0, SHARE_LABEL.1));
        filtered["labelled"] = json!(self.labelled);
        json!({
            "page_size": LIST_PAGE,
            "watch_cache": self.cached.json(),
            "linearizable": self.linearizable.json(),
            "filtered": filtered,
            "watch_from_listing_revision_change_seen_ms": ms(self.watch),
        })
    }

    fn check(&self, clusters: usize, needed: &mut Needed) {
        let lists = [
            ("watch cache", &self.cached),
            ("linearizable", &self.linearizable),
            ("filtered", &self.filtered),
        ];
        for (name, listing) in lists {
            let p99 = ms(percentile(&listing.pages, 0.99));
            needed.positive("bulk", &format!("ListClusters ({name}) page times"), p99);
        }
        let every = |l: &Listing| l.clusters >= clusters;
        needed.need(
            "bulk",
            "ListClusters (watch cache) listed every bulk cluster",
            every(&self.cached),
        );
        needed.need(
            "bulk",
            "ListClusters (linearizable) listed every bulk cluster",
            every(&self.linearizable),
        );
        let share = self.filtered.clusters == self.labelled && self.labelled > 0;
        needed.need(
            "bulk",
            "ListClusters (filtered) listed the labelled share",
            share,
        );
        needed.positive(
            "bulk",
            "WatchClusters from the listing's revision",
            ms(self.watch),
        );
    }

    fn rows(&self, row: Row) {
        let goal = || "p99 <= 50".to_string();
        let head = format!("ListClusters by {LIST_PAGE}");
        row(
            &format!("{head}, cache: pages; p50/p99/max ms"),
            self.cached.summary(),
            goal(),
        );
        row(
            &format!("{head}, etcd: pages; p50/p99/max ms"),
            self.linearizable.summary(),
            goal(),
        );
        row(
            &format!(
                "{head}, filtered ({} match): pages; p50/p99/max ms",
                self.filtered.clusters
            ),
            self.filtered.summary(),
            goal(),
        );
        row(
            "WatchClusters from listing rev+1: change seen (ms)",
            format!("{:.1}", ms(self.watch)),
            String::new(),
        );
    }
}

/// What the bulk clusters take in etcd.
struct Stored {
    bytes_per_cluster: f64,
    /// The leader's database (every member holds the same keys).
    db_mib: f64,
    /// etcd's RSS, per member.
    etcd_rss_mib: Vec<f64>,
}

/// What Drover's keys take in `etcd`, per cluster of `clusters`.
async fn stored(etcd: &BenchEtcd, store: &EtcdStore, clusters: usize) -> Stored {
    let all = store
        .range(RangeRequest::prefix("/drover/v1/"))
        .await
        .expect("every Drover key");
    let bytes: usize = all.kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
    let status = etcd.leader_status();
    let db = status["Status"]["dbSize"].as_f64().expect("dbSize");
    let mib = |kib: u64| hundredths(kib as f64 / 1024.0);
    Stored {
        bytes_per_cluster: bytes as f64 / clusters.max(1) as f64,
        db_mib: db / (1024.0 * 1024.0),
        etcd_rss_mib: etcd
            .pids()
            .into_iter()
            .map(|pid| mib(rss_kib(pid)))
            .collect(),
    }
}

/// How long the CPU at rest is sampled: one whole `--scan-interval` (the
/// replicas' default, 10 s), so each periodic cost (a controller's resync,
/// the scanner's looks) is counted once, not by whether its burst falls
/// in the window (5 s read 0.06 to 0.25 cores over runs of one build).
const REST_SAMPLE: Duration = Duration::from_secs(10);

/// Many clusters over the replicas; kill one and time until every cluster
/// is owned by a live replica again, probing etcd latency meanwhile.
async fn bulk(
    bench: &mut Bench,
    clusters: usize,
    clients: usize,
    through_api: bool,
    profiles: Option<&std::path::Path>,
) -> Bulk {
    let store = Arc::new(bench.etcd.store().await);
    let creating = Instant::now();
    if through_api {
        create_bulk(bench, clusters, clients).await;
    } else {
        seed_bulk(bench, &store, clusters, clients).await;
    }
    let create = creating.elapsed();
    eprintln!("bulk: {clusters} clusters created in {create:?}; waiting for owners...");
    let bound = Duration::from_secs(300);
    wait_owned(
        &store,
        clusters,
        None,
        bound,
        "every bulk cluster to be owned",
    )
    .await;
    let owned = creating.elapsed();
    let rss_mib = bench
        .replicas
        .iter()
        .map(|(_, r)| rss_kib(r.pid()) as f64 / 1024.0)
        .collect();
    let rest_cpu = rest_cpu(bench, profiles).await;
    let stored = stored(&bench.etcd, &store, clusters).await;
    // After the CPU at rest: the listings and their labels are load.
    let listings = listings(bench, clusters, clients).await;

    let victim = bench.replicas[0].0.clone();
    let victim_lease = member_lease(&store, &victim).await;
    let mut replica = bench.remove(&victim);
    let probe_store = Arc::clone(&store);
    let probing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probe_flag = Arc::clone(&probing);
    let probe = tokio::spawn(async move {
        let mut slowest = Duration::ZERO;
        while probe_flag.load(std::sync::atomic::Ordering::SeqCst) {
            let started = Instant::now();
            let _ = probe_store.get("/drover/v1/probe").await;
            slowest = slowest.max(started.elapsed());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        slowest
    });
    let killed = Instant::now();
    replica.kill9();
    let what = "the dead replica's clusters to be owned again";
    wait_owned(&store, clusters, Some(victim_lease), bound, what).await;
    let recovery = killed.elapsed();
    probing.store(false, std::sync::atomic::Ordering::SeqCst);
    let slowest_request = probe.await.unwrap();
    Bulk {
        create,
        owned,
        recovery,
        slowest_request,
        rss_mib,
        rest_cpu,
        stored,
        listings,
    }
}

/// The name of bulk cluster `i`.
fn bulk_name(i: usize) -> String {
    format!("bulk-{i:05}")
}

/// Creates (create-only) the bulk clusters through the API, `clients` at a
/// time. Creates slow down as the replicas hold more clusters: on two
/// cores, 57,851 of 100,000 took 4 min 50 s, the last at 75 a second.
async fn create_bulk(bench: &Bench, clusters: usize, clients: usize) {
    let per_client = clusters.div_ceil(clients);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = bench.replicas[c % bench.replicas.len()].1.client().await;
        tasks.push(tokio::spawn(async move {
            for i in (c * per_client)..((c + 1) * per_client).min(clusters) {
                create(&mut client, &bulk_name(i), false).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Bulk clusters written per etcd transaction (two keys each: etcd takes
/// at most 128 operations per transaction by default).
const SEED_BATCH: usize = 50;

/// Creates the bulk clusters quickly: the first (create-only) through the
/// API, the rest written straight into etcd as copies of its records (every
/// key holding its name but its owner key, with the name and uid replaced
/// by fresh ones), [`SEED_BATCH`] clusters per transaction, `clients`
/// transactions in flight. The replicas learn of them through their watch,
/// as of any cluster another replica created. The records are copied, not
/// built, so the bench follows whatever the server writes.
async fn seed_bulk(bench: &Bench, store: &Arc<EtcdStore>, clusters: usize, clients: usize) {
    if clusters == 0 {
        return;
    }
    let template = bulk_name(0);
    let mut client = bench.replicas[0].1.client().await;
    create(&mut client, &template, false).await;
    let uid = client
        .get_cluster(&template)
        .await
        .expect("get cluster")
        .uid;
    let all = store
        .range(RangeRequest::prefix("/drover/v1/"))
        .await
        .expect("read the template");
    let records: Vec<(String, String)> = all
        .kvs
        .iter()
        .filter(|kv| kv.key.contains(&format!("/{template}")))
        .filter(|kv| !kv.key.starts_with("/drover/v1/owners/"))
        .map(|kv| {
            let value = String::from_utf8(kv.value.clone()).expect("a UTF-8 record");
            (kv.key.clone(), value)
        })
        .collect();
    assert!(
        records.iter().any(|(_, value)| value.contains(&uid)),
        "no record of {template} holds its uid {uid}: {records:?}"
    );
    let records = Arc::new(records);
    let batch = (SEED_BATCH * 2 / records.len().max(1)).max(1);
    let batches: Vec<std::ops::Range<usize>> = (1..clusters)
        .step_by(batch)
        .map(|first| first..(first + batch).min(clusters))
        .collect();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let batches = Arc::new(batches);
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (store, records, batches, next) = (
            Arc::clone(store),
            Arc::clone(&records),
            Arc::clone(&batches),
            Arc::clone(&next),
        );
        let (template, uid) = (template.clone(), uid.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(range) = batches.get(n) else {
                    return;
                };
                let mut puts = Vec::new();
                for i in range.clone() {
                    let (name, new_uid) = (bulk_name(i), uuid::Uuid::new_v4().to_string());
                    for (key, value) in records.iter() {
                        let key = key.replace(&template, &name);
                        let value = value.replace(&template, &name).replace(&uid, &new_uid);
                        puts.push(Op::put(key, value));
                    }
                }
                store
                    .txn(Txn::new().and_then(puts))
                    .await
                    .expect("seed bulk clusters");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// The CPU etcd and the replicas (together) use at rest, each as a share of
/// one CPU. Nothing runs now; what is left is lease renewals, ownership
/// passes and the watches: the standing cost of this many clusters.
async fn rest_cpu(bench: &Bench, profiles: Option<&std::path::Path>) -> (f64, f64) {
    let replica_pids: Vec<u32> = bench.replicas.iter().map(|(_, r)| r.pid()).collect();
    let cpu_now = || {
        let replicas: Duration = replica_pids.iter().map(|pid| cpu_time(*pid)).sum();
        (bench.etcd.cpu(), replicas)
    };
    let before = cpu_now();
    let rest = tokio::time::sleep(REST_SAMPLE);
    profiled(
        &bench.etcd,
        profiles,
        "rest",
        REST_SAMPLE + Duration::from_secs(1),
        rest,
    )
    .await;
    let after = cpu_now();
    let share = |used: Duration| hundredths(used.as_secs_f64() / REST_SAMPLE.as_secs_f64());
    (share(after.0 - before.0), share(after.1 - before.1))
}

/// Waits (for at most `bound`) until `clusters` bulk clusters are owned,
/// none under `dead` (a lease). etcd counts the owner keys (no values
/// sent) every 50 ms. Every owner key is bound to its owner's lease, so
/// once `dead` is gone (revoked by a peer, or expired) none of the owner
/// keys counted is the dead replica's: no value need be read. (Reading
/// every owner, megabytes at 100,000, took seconds under the takeover's
/// load and hid up to four times that of the recovery.)
async fn wait_owned(
    store: &EtcdStore,
    clusters: usize,
    dead: Option<LeaseId>,
    bound: Duration,
    what: &str,
) {
    let started = Instant::now();
    loop {
        // The lease first: its keys went with it, so a count made after
        // it is gone counts no key of the dead replica.
        let dead_gone = match dead {
            None => true,
            Some(lease) => store
                .lease_time_to_live(lease)
                .await
                .expect("a lease's TTL")
                .is_none(),
        };
        let count = store
            .range(RangeRequest::prefix("/drover/v1/owners/bulk-").limit(1))
            .await
            .expect("count owners")
            .count;
        if dead_gone && count >= clusters {
            return;
        }
        assert!(
            started.elapsed() < bound,
            "timed out after {bound:?} waiting for {what} ({count} of {clusters} have an owner key)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The lease of replica `id`'s member record.
async fn member_lease(store: &EtcdStore, id: &str) -> LeaseId {
    let key = format!("/drover/v1/members/{id}");
    let found = store.get(&key).await.expect("a member record");
    let kv = found
        .kvs
        .first()
        .unwrap_or_else(|| panic!("no member record {key}"));
    let record: Value = serde_json::from_slice(&kv.value).expect("a member record");
    record["lease"].as_i64().expect("a member's lease")
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("drover-bench: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Starts the processes, runs the phases asked for, stops the processes
/// (by pid, when `Bench` drops: also on a panic, which unwinds through here,
/// and on SIGINT, SIGTERM or SIGHUP), then writes the JSON and checks that
/// every phase run produced its figures.
async fn run(args: &Args) -> Result<(), String> {
    let mut signals = Signals::new();
    let (mut bench, pinned) = tokio::select! {
        started = start(args) => started,
        signal = signals.next() => return Err(format!("{signal} while starting; stopped")),
    };
    let mut report = Report::new(pinned, args);
    println!(
        "etcd: {} member(s) on loopback ({ETCD_FIGURES})",
        args.etcd_members
    );
    tokio::select! {
        () = measure(&mut bench, args, &mut report) => {}
        signal = signals.next() => {
            drop(bench);
            return Err(format!(
                "{signal} during the phases; every process it started is stopped"
            ));
        }
    }
    // etcd, the provider and every replica, killed by pid and reaped.
    drop(bench);
    let json = serde_json::to_string_pretty(&report.json(args)).unwrap();
    std::fs::write(&args.json, json).expect("write the JSON report");
    println!("JSON: {}", args.json.display());
    let missing = report.missing(args);
    if missing.is_empty() {
        let ran: Vec<&str> = report.phases.iter().map(|p| p.name()).collect();
        println!("every figure present ({})", ran.join(", "));
        Ok(())
    } else {
        Err(format!(
            "{} figure(s) missing: {}",
            missing.len(),
            missing.join("; ")
        ))
    }
}

/// The signals that end the bench early (its processes stopped first).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| signal(kind).expect("listen for signals");
        Self {
            term: listen(SignalKind::terminate()),
            int: listen(SignalKind::interrupt()),
            hup: listen(SignalKind::hangup()),
        }
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// etcd (`--etcd-members` of it; pinned to `--etcd-cpu` when asked: the
/// CPUs of etcd and of everything else), the simulated provider and three
/// replicas.
async fn start(args: &Args) -> (Bench, Option<(String, String)>) {
    if let Some(dir) = &args.etcd_profiles {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|error| panic!("create {}: {error}", dir.display()));
    }
    let profiled = args.etcd_profiles.is_some();
    let etcd = BenchEtcd::start(args.etcd_members, profiled).await;
    let cores = Cores {
        all: std::thread::available_parallelism().map_or(1, usize::from),
        etcd_pinned: args.etcd_cpu.is_some(),
    };
    let pinned = args.etcd_cpu.map(|cpu| split_cpus(&etcd, cpu));
    let sim = SimProcess::start().await;
    let mut bench = Bench {
        cores,
        etcd,
        sim,
        replicas: Vec::new(),
        ttl: args.ttl,
        liveness: true,
        otlp: None,
        next_id: 0,
    };
    for _ in 0..3 {
        bench.add_replica().await;
    }
    (bench, pinned)
}

/// The phases asked for, in the bench's order (whatever order `--phases`
/// named them in), each printed under its heading as it ends.
async fn measure(bench: &mut Bench, args: &Args, report: &mut Report) {
    let length = Duration::from_secs(args.seconds);
    for phase in report.phases.clone() {
        // A phase before may have killed one (bulk does).
        while bench.replicas.len() < 3 {
            bench.add_replica().await;
        }
        eprintln!("== phase {} ==", phase.name());
        let started = Instant::now();
        match phase {
            Phase::Throughput => {
                let drover = throughput(
                    &bench.etcd,
                    &bench.replicas,
                    args.clients,
                    length,
                    args.rounds.max(1),
                    &bench.processes(),
                    args.etcd_profiles.as_deref(),
                    "bench",
                    args.accept_then_wait,
                )
                .await;
                report.drover = Some(drover);
            }
            Phase::Tracing => report.traced = traced(bench, args).await,
            Phase::Failover => {
                eprintln!("failover x{}...", args.failovers);
                report.failovers = Some(failover(bench, args.failovers).await);
            }
            Phase::Handoff => {
                eprintln!("SIGTERM hand-off...");
                report.handoff = Some(handoff(bench).await);
            }
            Phase::Crash => report.crash = Some(crash_phase(bench, args).await),
            Phase::Bulk => report.bulk = Some(bulk_phase(bench, args).await),
            Phase::Rollout => report.rollout = rollout(bench, args).await,
        }
        report.print_section(phase, args, started.elapsed());
    }
}

/// The bulk phase; under `--bulk-lease-bound`, on replicas with peer
/// liveness off for its length.
async fn bulk_phase(bench: &mut Bench, args: &Args) -> Bulk {
    eprintln!("bulk recovery of {} clusters...", args.bulk_clusters);
    let ttl = bench.ttl;
    if args.bulk_lease_bound {
        let liveness = false;
        reconfigure(bench, Variant { ttl, liveness }).await;
    }
    let figures = bulk(
        bench,
        args.bulk_clusters,
        args.clients,
        args.bulk_through_api,
        args.etcd_profiles.as_deref(),
    )
    .await;
    if args.bulk_lease_bound {
        let liveness = true;
        reconfigure(bench, Variant { ttl, liveness }).await;
    }
    figures
}

/// The throughput phase with tracing on.
struct Traced {
    /// The share of operations sampled.
    sample: f64,
    throughput: Throughput,
    /// Spans the receiver got.
    spans: usize,
}

/// The throughput phase again (on clusters of its own) with every replica
/// exporting traces to a receiver in this process, sampling
/// `--trace-sample` of the operations; then the replicas as they were.
async fn traced(bench: &mut Bench, args: &Args) -> Option<Traced> {
    if args.trace_sample <= 0.0 {
        return None;
    }
    let receiver = drover_tests::otlp::OtlpReceiver::start().await;
    // Read by the replicas started now (the standard variables).
    std::env::set_var("OTEL_TRACES_SAMPLER", "parentbased_traceidratio");
    std::env::set_var("OTEL_TRACES_SAMPLER_ARG", args.trace_sample.to_string());
    bench.otlp = Some(receiver.endpoint.clone());
    bench.restart_replicas().await;
    eprintln!("tracing on, {} sampled:", args.trace_sample);
    let throughput = throughput(
        &bench.etcd,
        &bench.replicas,
        args.clients,
        Duration::from_secs(args.seconds),
        args.rounds.max(1),
        &bench.processes(),
        None,
        "traced",
        args.accept_then_wait,
    )
    .await;
    std::env::remove_var("OTEL_TRACES_SAMPLER");
    std::env::remove_var("OTEL_TRACES_SAMPLER_ARG");
    bench.otlp = None;
    bench.restart_replicas().await;
    Some(Traced {
        sample: args.trace_sample,
        throughput,
        spans: receiver.spans().len(),
    })
}

/// The rollout phase on three replicas (the bulk phase killed one).
async fn rollout(bench: &mut Bench, args: &Args) -> Option<RolloutFigures> {
    if args.rollout_clusters == 0 {
        return None;
    }
    while bench.replicas.len() < 3 {
        bench.add_replica().await;
    }
    let store = bench.etcd.store().await;
    let phase = RolloutPhase {
        etcd: bench.etcd.pids(),
        cores: bench.cores.all,
        clusters: args.rollout_clusters,
        concurrency: args.rollout_concurrency,
        latency: Duration::from_millis(args.rollout_latency_ms),
        clients: args.clients,
    };
    Some(phase.run(&store, &bench.sim, &mut bench.replicas).await)
}

/// The bench's phases, in the order they run.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, clap::ValueEnum)]
enum Phase {
    /// Raw etcd CAS and Drover stop/start in alternating rounds.
    Throughput,
    /// The throughput phase again with every replica exporting traces.
    Tracing,
    /// kill -9 of an owner with an operation in flight.
    Failover,
    /// SIGTERM of an owner until a peer owns its cluster.
    Handoff,
    /// Crashes at each `--crash-ttls`, fast detection on and off.
    Crash,
    /// Recovery of `--bulk-clusters` clusters when one replica dies.
    Bulk,
    /// A rollout over `--rollout-clusters` clusters, its owner killed.
    Rollout,
}

impl Phase {
    const ALL: [Phase; 7] = [
        Phase::Throughput,
        Phase::Tracing,
        Phase::Failover,
        Phase::Handoff,
        Phase::Crash,
        Phase::Bulk,
        Phase::Rollout,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::Throughput => "throughput",
            Phase::Tracing => "tracing",
            Phase::Failover => "failover",
            Phase::Handoff => "handoff",
            Phase::Crash => "crash",
            Phase::Bulk => "bulk",
            Phase::Rollout => "rollout",
        }
    }
}

/// The figures a phase must have produced: each one absent (no samples,
/// NaN, zero where only a positive number makes sense) is named.
#[derive(Default)]
struct Needed(Vec<String>);

impl Needed {
    fn need(&mut self, phase: &str, figure: &str, present: bool) {
        if !present {
            self.0.push(format!("{phase}: {figure}"));
        }
    }

    /// A positive, finite number.
    fn positive(&mut self, phase: &str, figure: &str, value: f64) {
        self.need(phase, figure, value.is_finite() && value > 0.0);
    }
}

/// One table row: measure, value, goal.
type Row<'a> = &'a dyn Fn(&str, String, String);

fn print_row(name: &str, value: String, goal: String) {
    println!("{name:<44} {value:>24} {goal:>14}");
}

impl Throughput {
    /// The Drover operations/s goal for the raw etcd CAS rate measured.
    fn target(&self) -> f64 {
        goal(self.raw_per_second, self.writes_per_op)
    }

    /// How many raw CAS worth of etcd CPU one Drover write costs (reads and
    /// watch deliveries included): 1 would mean no overhead at all.
    fn etcd_cost_per_write(&self) -> f64 {
        hundredths(
            self.cpu_per_op.etcd.as_secs_f64()
                / self.writes_per_op
                / self.etcd_cpu_per_raw_txn.as_secs_f64().max(1e-9),
        )
    }

    /// Each round's ratio to its goal, to two decimals.
    fn round_ratios(&self) -> Vec<f64> {
        self.round_ratios.iter().map(|r| hundredths(*r)).collect()
    }

    fn json(&self) -> Value {
        let target = self.target();
        json!({
            "operations_per_second": (self.ops_per_second * 10.0).round() / 10.0,
            "latency_p50_ms": ms(self.p50),
            "latency_p99_ms": ms(self.p99),
            "etcd_writes_per_operation": hundredths(self.writes_per_op),
            "goal_operations_per_second": target.round(),
            "ratio_to_goal": hundredths(self.ops_per_second / target),
            "ratio_to_goal_per_round": self.round_ratios(),
            "etcd_per_operation": self.etcd_per_op.json(),
            "etcd_wal": {"raw": self.raw_wal.json(), "drover": self.drover_wal.json()},
            "replica_waits_ms": {
                "etcd_txn": hundredths(self.waits.txn_ms()),
                "provider_call": hundredths(self.waits.provider_ms()),
            },
            "cpu_us_per_operation": {
                "etcd": us(self.cpu_per_op.etcd),
                "replicas": us(self.cpu_per_op.replicas),
                "provider": us(self.cpu_per_op.provider),
                "benchmark_clients": us(self.cpu_per_op.clients),
            },
            "provider_calls_per_operation": hundredths(self.provider_calls_per_op),
            "replica_cpu_us_per_health_check": us(self.replica_cpu_per_call),
            "etcd_cpu_us_per_raw_cas": us(self.etcd_cpu_per_raw_txn),
            "etcd_cpu_per_write_in_raw_cas": self.etcd_cost_per_write(),
            "ops_per_raw_cas": self.ops_per_second / self.raw_per_second.max(1.0),
            "ops_per_raw_cas_cpu_allows": self.cores.ops_allowed(&self.cpu_per_op) / self.raw_per_second.max(1.0),
        })
    }

    /// The figures without which the phase said nothing.
    fn check(&self, phase: &str, needed: &mut Needed) {
        needed.positive(phase, "raw etcd CAS txn/s", self.raw_per_second);
        needed.positive(phase, "drover operations/s", self.ops_per_second);
        needed.positive(phase, "drover op latency (no samples)", ms(self.p50));
        needed.positive(phase, "etcd writes per operation", self.writes_per_op);
        needed.positive(phase, "etcd txn requests per op", self.etcd_per_op.txns);
        needed.positive(phase, "etcd fsyncs (raw rounds)", self.raw_wal.fsyncs);
        needed.positive(phase, "etcd fsyncs (drover rounds)", self.drover_wal.fsyncs);
        needed.positive(phase, "replicas' etcd txn waits", self.waits.txns);
        needed.positive(phase, "replicas' provider calls", self.waits.provider_calls);
        let etcd_cpu = self.cpu_per_op.etcd.as_secs_f64();
        needed.positive(phase, "etcd CPU per op", etcd_cpu);
        let replica_cpu = self.cpu_per_op.replicas.as_secs_f64();
        needed.positive(phase, "replica CPU per op", replica_cpu);
        let raw_cpu = self.etcd_cpu_per_raw_txn.as_secs_f64();
        needed.positive(phase, "etcd CPU per raw CAS", raw_cpu);
        let call_cpu = self.replica_cpu_per_call.as_secs_f64();
        needed.positive(phase, "replica CPU per health check", call_cpu);
    }

    /// The table rows: rates, latency, the goal; then what an operation
    /// cost.
    fn rows(&self, row: Row) {
        let target = self.target();
        let raw = self.raw_per_second;
        row("raw etcd CAS txn/s", format!("{raw:.0}"), String::new());
        row(
            "drover operations/s",
            format!("{:.1}", self.ops_per_second),
            format!(">= {target:.0}"),
        );
        row(
            "drover op latency p50 / p99 (ms)",
            format!("{:.1} / {:.1}", ms(self.p50), ms(self.p99)),
            String::new(),
        );
        let ratios: Vec<String> = self
            .round_ratios()
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect();
        row(
            "ratio to goal (pooled; per round)",
            format!("{:.2}; {}", self.ops_per_second / target, ratios.join(" ")),
            ">= 1".into(),
        );
        let allowed = self.cores.ops_allowed(&self.cpu_per_op) / raw.max(1.0);
        row(
            "ops / raw CAS; most that CPU per op allows",
            format!("{:.3}; {allowed:.3}", self.ops_per_second / raw.max(1.0)),
            ">= 0.3 pinned".into(),
        );
        self.cost_rows(row);
    }

    /// What an operation cost: etcd requests, fsyncs, waits and CPU.
    fn cost_rows(&self, row: Row) {
        row(
            "etcd writes per operation",
            format!("{:.2}", self.writes_per_op),
            "<= 3 (1 step)".into(),
        );
        row(
            "etcd per op: txn / range / watch events (responses)",
            format!(
                "{:.2} / {:.2} / {:.2} ({:.2})",
                self.etcd_per_op.txns,
                self.etcd_per_op.ranges,
                self.etcd_per_op.watch_events,
                self.etcd_per_op.watch_responses
            ),
            String::new(),
        );
        row(
            "etcd fsync ms; writes per fsync: raw / drover",
            format!(
                "{:.2} / {:.2}; {:.1} / {:.1}",
                self.raw_wal.fsync_ms(),
                self.drover_wal.fsync_ms(),
                self.raw_wal.writes_per_fsync(),
                self.drover_wal.writes_per_fsync()
            ),
            String::new(),
        );
        row(
            "replicas' mean wait ms: etcd txn / provider",
            format!(
                "{:.2} / {:.2}",
                self.waits.txn_ms(),
                self.waits.provider_ms()
            ),
            String::new(),
        );
        row(
            "CPU us per op: etcd / replicas / provider / clients",
            format!(
                "{:.0} / {:.0} / {:.0} / {:.0}",
                us(self.cpu_per_op.etcd),
                us(self.cpu_per_op.replicas),
                us(self.cpu_per_op.provider),
                us(self.cpu_per_op.clients)
            ),
            String::new(),
        );
        row(
            "replica calls per op: served / etcd / provider",
            format!(
                "{} / {:.2} / {:.2}",
                self.served_calls_per_op,
                self.etcd_per_op.txns + self.etcd_per_op.ranges,
                self.provider_calls_per_op
            ),
            String::new(),
        );
        row(
            "replica CPU us per health check; per op, in checks",
            format!(
                "{:.0}; {:.1}",
                us(self.replica_cpu_per_call),
                self.cpu_per_op.replicas.as_secs_f64()
                    / self.replica_cpu_per_call.as_secs_f64().max(1e-9)
            ),
            "<= 300 us per op".into(),
        );
        row(
            "etcd CPU us per raw CAS; per write, in CAS",
            format!(
                "{:.0}; {:.2}",
                us(self.etcd_cpu_per_raw_txn),
                self.etcd_cost_per_write()
            ),
            String::new(),
        );
    }
}

impl Bulk {
    fn json(&self, args: &Args) -> Value {
        json!({
            "clusters": args.bulk_clusters,
            "detection": if args.bulk_lease_bound { "lease" } else { "fast" },
            "create_ms": ms(self.create),
            "owned_ms": ms(self.owned),
            "recovery_ms": ms(self.recovery),
            "slowest_etcd_request_ms": ms(self.slowest_request),
            "replica_rss_mib": self.rss_mib,
            "cpu_at_rest": {"etcd": self.rest_cpu.0, "replicas": self.rest_cpu.1},
            "etcd_bytes_per_cluster": self.stored.bytes_per_cluster.round(),
            "etcd_db_mib": self.stored.db_mib,
            "etcd_rss_mib": self.stored.etcd_rss_mib,
            "list_clusters": self.listings.json(),
        })
    }

    fn check(&self, args: &Args, needed: &mut Needed) {
        needed.positive("bulk", "recovery time", ms(self.recovery));
        needed.positive("bulk", "slowest etcd request", ms(self.slowest_request));
        let rss = self.rss_mib.len() == 3 && self.rss_mib.iter().all(|m| *m > 0.0);
        needed.need("bulk", "RSS of each of three replicas", rss);
        let cpu = self.rest_cpu.0.is_finite() && self.rest_cpu.1.is_finite();
        needed.need("bulk", "CPU at rest", cpu);
        needed.positive(
            "bulk",
            "bytes per cluster in etcd",
            self.stored.bytes_per_cluster,
        );
        needed.positive("bulk", "etcd's database size", self.stored.db_mib);
        let rss = &self.stored.etcd_rss_mib;
        let rss = rss.len() == args.etcd_members as usize && rss.iter().all(|m| *m > 0.0);
        needed.need("bulk", "RSS of each etcd member", rss);
        self.listings.check(args.bulk_clusters, needed);
    }

    fn rows(&self, args: &Args, row: Row) {
        row(
            &format!(
                "bulk: create {} clusters; all owned (s)",
                args.bulk_clusters
            ),
            format!(
                "{:.1}; {:.1}",
                self.create.as_secs_f64(),
                self.owned.as_secs_f64()
            ),
            String::new(),
        );
        let detection = if args.bulk_lease_bound {
            ", lease-bound"
        } else {
            ""
        };
        row(
            &format!(
                "bulk recovery, {} clusters{detection} (ms)",
                args.bulk_clusters
            ),
            format!("{:.0}", ms(self.recovery)),
            "<= 2000".into(),
        );
        row(
            "slowest etcd request meanwhile (ms)",
            format!("{:.1}", ms(self.slowest_request)),
            "<= 50".into(),
        );
        let rss: Vec<String> = self.rss_mib.iter().map(|m| format!("{m:.0}")).collect();
        row(
            "replica RSS at bulk size (MiB)",
            rss.join(" / "),
            "<= 150".into(),
        );
        row(
            "CPU at rest, bulk size (cores): etcd / replicas",
            format!("{:.2} / {:.2}", self.rest_cpu.0, self.rest_cpu.1),
            "replicas <= 0.05".into(),
        );
        row(
            "etcd: Drover's keys per cluster (bytes); database (MiB)",
            format!(
                "{:.0}; {:.1}",
                self.stored.bytes_per_cluster, self.stored.db_mib
            ),
            String::new(),
        );
        let rss: Vec<String> = self
            .stored
            .etcd_rss_mib
            .iter()
            .map(|m| format!("{m:.0}"))
            .collect();
        row("etcd RSS per member (MiB)", rss.join(" / "), String::new());
        self.listings.rows(row);
    }
}

/// What every phase run measured (`None`: not run, or skipped by its
/// settings): written as JSON, and printed phase by phase as each ends.
struct Report {
    /// The phases asked for, in the order they run.
    phases: Vec<Phase>,
    /// The CPUs of etcd and of everything else, with `--etcd-cpu`.
    pinned: Option<(String, String)>,
    drover: Option<Throughput>,
    /// The throughput phase again with tracing on.
    traced: Option<Traced>,
    /// kill -9 failovers, sorted.
    failovers: Option<Vec<Duration>>,
    handoff: Option<Duration>,
    crash: Option<Vec<Crashes>>,
    bulk: Option<Bulk>,
    rollout: Option<RolloutFigures>,
}

impl Report {
    fn new(pinned: Option<(String, String)>, args: &Args) -> Self {
        let mut phases = args.phases.clone();
        phases.sort();
        phases.dedup();
        Self {
            phases,
            pinned,
            drover: None,
            traced: None,
            failovers: None,
            handoff: None,
            crash: None,
            bulk: None,
            rollout: None,
        }
    }

    /// Why a phase asked for may rightly have no figures: its settings
    /// turn it off.
    fn skipped(phase: Phase, args: &Args) -> Option<&'static str> {
        match phase {
            Phase::Tracing if args.trace_sample <= 0.0 => Some("--trace-sample 0"),
            Phase::Rollout if args.rollout_clusters == 0 => Some("--rollout-clusters 0"),
            _ => None,
        }
    }

    /// Every figure a phase that ran should have produced and did not.
    fn missing(&self, args: &Args) -> Vec<String> {
        let mut needed = Needed::default();
        for &phase in &self.phases {
            if Self::skipped(phase, args).is_some() {
                continue;
            }
            let name = phase.name();
            match phase {
                Phase::Throughput => match &self.drover {
                    Some(drover) => drover.check(name, &mut needed),
                    None => needed.need(name, "every figure", false),
                },
                Phase::Tracing => match &self.traced {
                    Some(traced) => {
                        traced.throughput.check(name, &mut needed);
                        // Ten sampled operations expected: none arriving
                        // is not chance.
                        let expected = traced.sample
                            * traced.throughput.ops_per_second
                            * (args.seconds * args.rounds.max(1) as u64) as f64;
                        let spans = traced.spans > 0 || expected < 10.0;
                        needed.need(name, "spans received", spans);
                    }
                    None => needed.need(name, "every figure", false),
                },
                Phase::Failover => {
                    let failovers = self.failovers.as_deref().unwrap_or_default();
                    let all = failovers.len() == args.failovers && !failovers.is_empty();
                    needed.need(name, "a time for each kill -9 (--failovers)", all);
                    let positive = failovers.iter().all(|d| !d.is_zero());
                    needed.need(name, "kill -9 to taken up (a zero sample)", positive);
                }
                Phase::Handoff => {
                    let handoff = self.handoff.map_or(0.0, ms);
                    needed.positive(name, "SIGTERM hand-off time", handoff);
                }
                Phase::Crash => {
                    let crash = self.crash.as_deref().unwrap_or_default();
                    needed.need(name, "a variant (--crash-ttls)", !crash.is_empty());
                    for figures in crash {
                        figures.check(args, &mut needed);
                    }
                }
                Phase::Bulk => match &self.bulk {
                    Some(bulk) => bulk.check(args, &mut needed),
                    None => needed.need(name, "every figure", false),
                },
                Phase::Rollout => match &self.rollout {
                    Some(rollout) => {
                        needed.positive(name, "wall time", ms(rollout.wall));
                        needed.positive(name, "one upgrade alone", ms(rollout.one_upgrade));
                        needed.need(name, "peak concurrency at provider", rollout.peak > 0);
                        needed.positive(name, "upgrades' durations", ms(rollout.busy));
                        needed.positive(name, "reconciles", rollout.reconciles.0);
                        needed.positive(name, "etcd CPU", rollout.cpu.etcd.as_secs_f64());
                        needed.positive(name, "replica CPU", rollout.cpu.replicas.as_secs_f64());
                        let next = rollout.kill_to_next_start.is_some();
                        needed.need(name, "owner kill -9 to next start", next);
                    }
                    None => needed.need(name, "every figure", false),
                },
            }
        }
        needed.0
    }

    fn json(&self, args: &Args) -> Value {
        let drover = self.drover.as_ref();
        let failovers = self.failovers.as_deref();
        json!({
            "machine": {"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)},
            "phases": self.phases.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "clients": args.clients,
            "rounds": args.rounds,
            "seconds_per_phase": args.seconds,
            "cpus": self.pinned.as_ref().map(|(etcd, rest)| json!({"etcd": etcd, "everything_else": rest})),
            "lease_ttl_seconds": args.ttl,
            "etcd_members": args.etcd_members,
            "etcd_figures": ETCD_FIGURES,
            "raw_etcd_cas_per_second": drover.map(|d| d.raw_per_second.round()),
            "drover": drover.map(Throughput::json),
            "failover_ms": failovers.map(|failovers| json!({
                "p50": ms(percentile(failovers, 0.5)),
                "p99": ms(percentile(failovers, 0.99)),
                "samples": failovers.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            })),
            "tracing": self.traced.as_ref().map(|traced| {
                let ratio = |t: &Throughput| {
                    hundredths(100.0 * t.ops_per_second / t.raw_per_second.max(1.0)) / 100.0
                };
                json!({
                    "sample": traced.sample,
                    "spans_received": traced.spans,
                    "ops_per_raw_off": drover.map(ratio),
                    "ops_per_raw_on": ratio(&traced.throughput),
                    "operations_per_second_on": (traced.throughput.ops_per_second * 10.0).round() / 10.0,
                    "replica_cpu_us_per_operation_off": drover.map(|d| us(d.cpu_per_op.replicas)),
                    "replica_cpu_us_per_operation_on": us(traced.throughput.cpu_per_op.replicas),
                })
            }),
            "sigterm_handoff_ms": self.handoff.map(ms),
            "crash": self.crash.as_ref().map(|crash| crash.iter().map(Crashes::json).collect::<Vec<_>>()),
            "bulk": self.bulk.as_ref().map(|bulk| bulk.json(args)),
            "rollout": self.rollout.as_ref().map(RolloutFigures::json),
        })
    }

    /// The figures of `phase`, under a heading `== <phase> ==`.
    fn print_section(&self, phase: Phase, args: &Args, took: Duration) {
        println!();
        println!("== {} == ({:.1} s)", phase.name(), took.as_secs_f64());
        if let Some(why) = Self::skipped(phase, args) {
            println!("(skipped: {why})");
            return;
        }
        println!("{:<44} {:>24} {:>14}", "measure", "value", "goal");
        let row: Row = &print_row;
        match phase {
            Phase::Throughput => self.drover.iter().for_each(|d| d.rows(row)),
            Phase::Tracing => self.traced_rows(row),
            Phase::Failover => self.failover_rows(args, row),
            Phase::Handoff => {
                if let Some(handoff) = self.handoff {
                    row(
                        "SIGTERM hand-off (ms)",
                        format!("{:.0}", ms(handoff)),
                        "<= 1000".into(),
                    );
                }
            }
            Phase::Crash => {
                for figures in self.crash.iter().flatten() {
                    crash_rows(figures, row);
                }
            }
            Phase::Bulk => self.bulk.iter().for_each(|b| b.rows(args, row)),
            Phase::Rollout => {
                for (name, value, goal) in self.rollout.iter().flat_map(RolloutFigures::rows) {
                    row(&name, value, goal);
                }
            }
        }
    }

    /// The table rows of the traced throughput phase beside the untraced
    /// (when that ran too).
    fn traced_rows(&self, row: Row) {
        let Some(traced) = &self.traced else {
            return;
        };
        let on = &traced.throughput;
        let ratio = |t: &Throughput| t.ops_per_second / t.raw_per_second.max(1.0);
        let cpu = |t: &Throughput| us(t.cpu_per_op.replicas);
        let (ratio_off, cpu_off) = match &self.drover {
            Some(off) => (format!("{:.3}", ratio(off)), format!("{:.0}", cpu(off))),
            None => ("-".into(), "-".into()),
        };
        row(
            &format!("ops/raw: tracing off / on ({} sampled)", traced.sample),
            format!("{ratio_off} / {:.3}", ratio(on)),
            String::new(),
        );
        row(
            "replica CPU us per op: tracing off / on",
            format!("{cpu_off} / {:.0}", cpu(on)),
            String::new(),
        );
        row("spans received", traced.spans.to_string(), String::new());
        on.rows(&|name, value, goal| row(&format!("traced: {name}"), value, goal));
    }

    /// The table rows of the failover phase.
    fn failover_rows(&self, args: &Args, row: Row) {
        let Some(failovers) = &self.failovers else {
            return;
        };
        row(
            "kill -9 to orphan recovered p50 / p99 (ms)",
            format!(
                "{:.0} / {:.0}",
                ms(percentile(failovers, 0.5)),
                ms(percentile(failovers, 0.99))
            ),
            format!("<= {} (p99)", args.ttl * 1000 + 1000),
        );
    }
}

/// One configuration of the crash phase: a lease TTL, and fast crash
/// detection (`--peer-liveness`) on or off.
#[derive(Clone, Copy)]
struct Variant {
    ttl: u64,
    liveness: bool,
}

impl Variant {
    fn label(&self) -> String {
        let path = if self.liveness { "fast" } else { "lease-bound" };
        format!("TTL {} s, {path}", self.ttl)
    }
}

/// What the crash phase measured for one [`Variant`].
struct Crashes {
    variant: Variant,
    /// kill -9 of the owner mid-upgrade until the provider admitted the first
    /// mutating call under a newer epoch (the resumed step), by the
    /// provider's audit clock (milliseconds).
    first_call: Vec<Duration>,
    /// kill -9 until the operation showed a peer's run (polled every 10 ms).
    taken_up: Vec<Duration>,
    /// Upgrades that did not end SUCCEEDED with every node at the target.
    failed: usize,
    /// kill -9 then restart of the same replica id until its cluster had an
    /// owner again (a newer epoch).
    restart: Vec<Duration>,
    /// Of those, the clusters the restarted process owned (not a peer).
    restart_own: usize,
    /// SIGSTOP of an owner until a peer owned its cluster.
    pause: Duration,
}

/// One kill -9 in the middle of an upgrade.
struct Kill {
    first_call: Option<Duration>,
    taken_up: Duration,
    succeeded: bool,
}

fn unix_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.expect("a clock after 1970").as_millis() as u64
}

/// Every replica replaced by three new ones of `variant`.
async fn reconfigure(bench: &mut Bench, variant: Variant) {
    for (_, mut replica) in std::mem::take(&mut bench.replicas) {
        let _ = replica.terminate().await;
    }
    bench.ttl = variant.ttl;
    bench.liveness = variant.liveness;
    for _ in 0..3 {
        bench.add_replica().await;
    }
}

/// Nodes of the crash phase's clusters: one control node and the workers.
const CRASH_WORKERS: u32 = 8;

/// Provider latency per call while an upgrade is killed: short, as it adds to
/// the time until the new epoch's first call lands (the fenced describe and
/// the call itself each wait it), but long enough that the owner dies with a
/// node's call in flight and most nodes still to do.
const CRASH_LATENCY: Duration = Duration::from_millis(50);

/// A cluster of nine nodes created and started at zero latency; its uid,
/// owner and owner epoch.
async fn owned_cluster(bench: &Bench, name: &str) -> (String, String, i64) {
    settle(bench).await;
    let mut client = bench.replicas[0].1.client().await;
    let request = v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(spec(CRASH_WORKERS)),
        create_only: false,
        request_id: String::new(),
    };
    let created = client.clusters().create_cluster(request).await;
    let op = created.expect("create").into_inner().operation;
    finish(&mut client, &op.expect("a start")).await;
    let uid = client.get_cluster(name).await.expect("get cluster").uid;
    let mut admin = bench.admin().await;
    let owner = owner(&mut admin, name).await.expect("an owner");
    (uid, owner.replica, owner.epoch)
}

/// With fast detection on, waits until every replica holds a liveness
/// connection to every other: a replica that crashes before its peers saw
/// it answer is left to the TTL by design, and a replacement killed a few
/// hundred milliseconds after it started would measure that instead.
async fn settle(bench: &Bench) {
    if !bench.liveness {
        return;
    }
    let peers = (bench.replicas.len() - 1) as f64;
    wait_until(Duration::from_secs(10), "liveness connections", || async {
        for (_, replica) in &bench.replicas {
            let samples = scrape::metrics(&replica.admin_endpoint()).await;
            if scrape::sum(&samples, "drover_liveness_peers_connected", "") != peers {
                return false;
            }
        }
        true
    })
    .await;
}

/// Polls (every 10 ms, for at most `bound`) until `cluster` has an owner of
/// an epoch other than `old`; its replica.
async fn owned_again(bench: &Bench, cluster: &str, old: i64, bound: Duration) -> String {
    let mut admin = bench.admin().await;
    let started = Instant::now();
    loop {
        if let Some(now) = owner(&mut admin, cluster).await.filter(|o| o.epoch != old) {
            return now.replica;
        }
        assert!(
            started.elapsed() < bound,
            "{cluster} not owned again within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The upgrade of a nine-node cluster, its owner killed (-9) once the first
/// node's call has landed, so that the next node's call is in flight: a peer
/// must fence the provider and resume the upgrade at its persisted step.
async fn kill_mid_upgrade(bench: &mut Bench, name: &str) -> Kill {
    let (uid, victim, epoch) = owned_cluster(bench, name).await;
    let mut client = bench.replicas[0].1.client().await;
    let before = bench.sim.audit(&uid).await.len();
    bench.sim.set_latency(CRASH_LATENCY).await;
    let request = v1::UpgradeClusterRequest {
        name: name.into(),
        version: "1.30.0".into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    let op = client.clusters().upgrade_cluster(request).await;
    let op = op.expect("upgrade").into_inner();
    wait_until(Duration::from_secs(30), "a node upgraded", || async {
        bench.sim.audit(&uid).await.len() > before
    })
    .await;
    let mut replica = bench.remove(&victim);
    let (killed, killed_ms) = (Instant::now(), unix_ms());
    replica.kill9();
    let mut survivor = bench.replicas[0].1.client().await;
    let bound = Duration::from_secs(bench.ttl + 30);
    loop {
        let request = v1::GetOperationRequest {
            cluster: name.into(),
            id: op.id.clone(),
        };
        let now = survivor.operations().get_operation(request).await;
        let now = now.map(|n| n.into_inner());
        if now
            .is_ok_and(|n| n.state >= O::Succeeded as i32 || n.runs.iter().any(|r| r.epoch > epoch))
        {
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "{name}: no peer took the upgrade up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let taken_up = killed.elapsed();
    let done = survivor.wait_operation(&op, Duration::from_secs(60)).await;
    let nodes = bench.sim.nodes(&uid).await;
    let succeeded = done.is_ok_and(|d| d.state == O::Succeeded as i32)
        && nodes.len() == CRASH_WORKERS as usize + 1
        && nodes.iter().all(|n| n.version == "1.30.0");
    let first_ms = bench
        .sim
        .audit(&uid)
        .await
        .iter()
        .filter(|e| e.token.as_ref().is_some_and(|t| t.epoch > epoch))
        .map(|e| e.admitted_at_ms)
        .min();
    bench.sim.set_latency(Duration::ZERO).await;
    bench.add_replica().await;
    Kill {
        // None: no call under a newer epoch, the old owner's calls did it
        // all (counted as a failure if they did not).
        first_call: first_ms.map(|at| Duration::from_millis(at.saturating_sub(killed_ms))),
        taken_up,
        succeeded,
    }
}

/// kill -9 of a cluster's owner and at once a new process with its replica
/// id, until the cluster has an owner again. The new process revokes its
/// dead incarnation's lease as it joins; with fast detection on, a peer may
/// take the cluster first.
async fn kill_and_restart(bench: &mut Bench, name: &str) -> (Duration, bool) {
    let (_, victim, epoch) = owned_cluster(bench, name).await;
    let mut replica = bench.remove(&victim);
    let killed = Instant::now();
    replica.kill9();
    let restarted = bench.spawn(&victim).await;
    bench.replicas.push((victim.clone(), restarted));
    let bound = Duration::from_secs(bench.ttl + 30);
    let now = owned_again(bench, name, epoch, bound).await;
    (killed.elapsed(), now == victim)
}

/// SIGSTOP of a cluster's owner until a peer owns the cluster: a paused
/// process proves nothing to liveness, so this is bound by the TTL (less
/// the margin, at TTLs where peers depose a lease about to expire).
async fn pause_owner(bench: &mut Bench, name: &str) -> Duration {
    let (_, victim, epoch) = owned_cluster(bench, name).await;
    let mut replica = bench.remove(&victim);
    let paused = Instant::now();
    replica.signal("STOP");
    owned_again(bench, name, epoch, Duration::from_secs(bench.ttl + 30)).await;
    let elapsed = paused.elapsed();
    replica.signal("CONT");
    let _ = replica.terminate().await;
    bench.add_replica().await;
    elapsed
}

/// The crash phase for one variant, on three fresh replicas of it.
async fn crashes(bench: &mut Bench, variant: Variant, kills: usize, restarts: usize) -> Crashes {
    reconfigure(bench, variant).await;
    let tag = format!(
        "{}-{}",
        variant.ttl,
        if variant.liveness { "on" } else { "off" }
    );
    let mut figures = Crashes {
        variant,
        first_call: Vec::new(),
        taken_up: Vec::new(),
        failed: 0,
        restart: Vec::new(),
        restart_own: 0,
        pause: Duration::ZERO,
    };
    for round in 0..kills {
        let kill = kill_mid_upgrade(bench, &format!("crash-{tag}-{round}")).await;
        figures.first_call.extend(kill.first_call);
        figures.taken_up.push(kill.taken_up);
        figures.failed += usize::from(!kill.succeeded);
    }
    for round in 0..restarts {
        let name = format!("restart-{tag}-{round}");
        let (elapsed, own) = kill_and_restart(bench, &name).await;
        figures.restart.push(elapsed);
        figures.restart_own += usize::from(own);
    }
    figures.pause = pause_owner(bench, &format!("pause-{tag}")).await;
    figures.first_call.sort();
    figures.taken_up.sort();
    figures.restart.sort();
    figures
}

/// p50, p99 and every sample, in milliseconds.
fn spread(sorted: &[Duration]) -> Value {
    json!({
        "p50": ms(percentile(sorted, 0.5)),
        "p99": ms(percentile(sorted, 0.99)),
        "samples": sorted.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
    })
}

impl Crashes {
    /// The figures without which this variant said nothing. Failed
    /// upgrades are a figure (printed against its goal of 0), not an
    /// absence.
    fn check(&self, args: &Args, needed: &mut Needed) {
        let phase = format!("crash ({})", self.variant.label());
        let kills = self.taken_up.len();
        needed.need(&phase, "a kill -9 mid-upgrade", kills > 0);
        let first = !self.first_call.is_empty();
        needed.need(&phase, "kill -9 to the new epoch's first call", first);
        let restarts = self.restart.len() == args.crash_restarts;
        needed.need(&phase, "kill -9 then restart to owned", restarts);
        needed.positive(&phase, "SIGSTOP to peer owner", ms(self.pause));
    }

    fn json(&self) -> Value {
        json!({
            "lease_ttl_seconds": self.variant.ttl,
            "peer_liveness": self.variant.liveness,
            "kills": self.taken_up.len(),
            "kills_without_a_call_of_the_new_epoch": self.taken_up.len() - self.first_call.len(),
            "kill9_to_first_call_of_new_epoch_ms": spread(&self.first_call),
            "kill9_to_taken_up_ms": spread(&self.taken_up),
            "upgrades_failed": self.failed,
            "kill9_then_restart_to_owned_again_ms": spread(&self.restart),
            "restarts_owned_again_by_the_restarted_process": self.restart_own,
            "sigstop_to_peer_owner_ms": ms(self.pause),
        })
    }
}

/// Every crash variant, then three replicas as before (`--ttl`, fast
/// detection on) for the phases after it.
async fn crash_phase(bench: &mut Bench, args: &Args) -> Vec<Crashes> {
    let mut all = Vec::new();
    for &ttl in &args.crash_ttls {
        for liveness in [true, false] {
            let variant = Variant { ttl, liveness };
            let kills = if !liveness && ttl > 5 {
                args.slow_crash_kills
            } else {
                args.crash_kills
            };
            eprintln!("crashes, {}: {kills} kills...", variant.label());
            all.push(crashes(bench, variant, kills, args.crash_restarts).await);
        }
    }
    reconfigure(
        bench,
        Variant {
            ttl: args.ttl,
            liveness: true,
        },
    )
    .await;
    all
}

/// The table rows of one crash variant.
fn crash_rows(figures: &Crashes, row: &dyn Fn(&str, String, String)) {
    let label = figures.variant.label();
    let pair = |sorted: &[Duration]| {
        format!(
            "{:.0} / {:.0}",
            ms(percentile(sorted, 0.5)),
            ms(percentile(sorted, 0.99))
        )
    };
    let goal = if figures.variant.liveness {
        "<= 1000 (p99)".to_string()
    } else {
        String::new()
    };
    row(
        &format!("{label}: kill -9 to new epoch's 1st call p50/p99 (ms)"),
        pair(&figures.first_call),
        goal,
    );
    row(
        &format!("{label}: kill -9 to taken up p50/p99 (ms)"),
        pair(&figures.taken_up),
        String::new(),
    );
    row(
        &format!("{label}: upgrades failed of {}", figures.taken_up.len()),
        figures.failed.to_string(),
        "0".into(),
    );
    row(
        &format!("{label}: kill -9, restart to owned p50/p99 (ms; by itself)",),
        format!("{}; {}", pair(&figures.restart), figures.restart_own),
        String::new(),
    );
    row(
        &format!("{label}: SIGSTOP to peer owner (ms)"),
        format!("{:.0}", ms(figures.pause)),
        format!("<= TTL ({} ms)", figures.variant.ttl * 1000),
    );
}
