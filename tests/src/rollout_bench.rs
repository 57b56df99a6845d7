//! drover-bench's rollout phase: a rollout over many simulated clusters,
//! one stage at a concurrency limit, the provider slowed to a fixed
//! latency per call; then a second one (to the next version) whose owner
//! is killed (-9) part way.
//!
//! Figures: the wall time against the ideal (targets ÷ concurrency × one
//! upgrade's time, measured alone in the same run), the most upgrades the
//! provider ran at once (from its audit log), the CPU per cluster of each
//! process (etcd, replicas, provider, this benchmark) and the ratio that
//! CPU leaves room for on this machine's cores, and the time from the kill
//! of the rollout's owner to the next target's operation accepted (by the
//! owner that took the rollout over).

use crate::procfs::CpuTimes;
use crate::provider::SimProcess;
use crate::replica::ReplicaProcess;
use drover_client::v1;
use drover_server::store::{EtcdStore, Store};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

const LABEL: (&str, &str) = ("fleet", "bench-rollout");
/// The version the probes upgrade to: the rollouts' first.
const TARGET_VERSION: &str = "1.30.0";

/// What the phase measured.
pub struct RolloutFigures {
    pub clusters: usize,
    pub concurrency: usize,
    pub latency: Duration,
    pub wall: Duration,
    pub one_upgrade: Duration,
    pub peak: usize,
    /// The rollout's upgrades, accept to end, summed (from the replicas'
    /// operation duration histograms).
    pub busy: Duration,
    /// CPU used during the rollout, per process (`clients`: this one).
    pub cpu: CpuTimes,
    /// The CPUs the processes share.
    pub cores: usize,
    /// From the kill of the rollout's owner to the next target's operation
    /// accepted.
    pub kill_to_next_start: Option<Duration>,
    /// The rollout controller's reconciles on every replica: how many, and
    /// their mean duration.
    pub reconciles: (f64, Duration),
}

impl RolloutFigures {
    /// The wall time if every wave took one upgrade's time.
    pub fn ideal(&self) -> Duration {
        let waves = self.clusters.div_ceil(self.concurrency.max(1));
        self.one_upgrade * waves as u32
    }

    pub fn ratio(&self) -> f64 {
        self.ideal().as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }

    /// How full the stage's slots were: the upgrades' durations summed over
    /// concurrency × wall time. Low with a low ratio: the rollout left
    /// slots empty; high: each upgrade took longer than alone (the machine
    /// busier).
    pub fn utilization(&self) -> f64 {
        self.busy.as_secs_f64() / (self.concurrency as f64 * self.wall.as_secs_f64()).max(1e-9)
    }

    /// The best ratio the CPU the rollout used allows on `cores` CPUs: no
    /// rollout finishes before its CPU time ÷ cores. At about the measured
    /// ratio, the CPU bounds it; reaching a goal above it takes less CPU
    /// per cluster, or more cores.
    pub fn cpu_bound(&self) -> f64 {
        let shortest = self.cpu.total().as_secs_f64() / self.cores.max(1) as f64;
        self.ideal().as_secs_f64() / shortest.max(1e-9)
    }

    /// CPU per cluster, in µs.
    fn per_cluster(&self, cpu: Duration) -> f64 {
        (cpu.as_secs_f64() * 1e6 / self.clusters.max(1) as f64).round()
    }

    /// The mean upgrade during the rollout, accept to end.
    pub fn mean_span(&self) -> Duration {
        self.busy / self.clusters.max(1) as u32
    }

    pub fn json(&self) -> Value {
        let ms = |d: Duration| (d.as_secs_f64() * 10_000.0).round() / 10.0;
        json!({
            "clusters": self.clusters,
            "max_concurrency": self.concurrency,
            "provider_latency_ms": ms(self.latency),
            "wall_ms": ms(self.wall),
            "one_upgrade_ms": ms(self.one_upgrade),
            "ideal_ms": ms(self.ideal()),
            "ratio_to_ideal": (self.ratio() * 100.0).round() / 100.0,
            "peak_concurrency_at_provider": self.peak,
            "slot_utilization": (self.utilization() * 100.0).round() / 100.0,
            "mean_upgrade_ms": ms(self.mean_span()),
            "replica_cpu_us_per_cluster": self.per_cluster(self.cpu.replicas),
            "cpu_us_per_cluster": {
                "etcd": self.per_cluster(self.cpu.etcd),
                "replicas": self.per_cluster(self.cpu.replicas),
                "provider": self.per_cluster(self.cpu.provider),
                "bench": self.per_cluster(self.cpu.clients),
            },
            "cores": self.cores,
            "ratio_the_cpu_allows": (self.cpu_bound() * 100.0).round() / 100.0,
            "kill_to_next_cluster_started_ms": self.kill_to_next_start.map(ms),
            "reconciles": {"count": self.reconciles.0, "mean_ms": ms(self.reconciles.1)},
        })
    }

    /// The table rows: (measure, value, goal).
    pub fn rows(&self) -> Vec<(String, String, String)> {
        let cpu = &self.cpu;
        vec![
            (
                format!(
                    "rollout of {} at {} (wall / ideal ms)",
                    self.clusters, self.concurrency
                ),
                format!(
                    "{:.0} / {:.0}",
                    self.wall.as_secs_f64() * 1e3,
                    self.ideal().as_secs_f64() * 1e3
                ),
                String::new(),
            ),
            (
                "rollout ratio to ideal".into(),
                format!("{:.2}", self.ratio()),
                ">= 0.8".into(),
            ),
            (
                "rollout peak concurrency at provider".into(),
                self.peak.to_string(),
                format!("<= {}", self.concurrency),
            ),
            (
                "rollout slot utilization; mean upgrade ms".into(),
                format!(
                    "{:.2}; {:.0}",
                    self.utilization(),
                    self.mean_span().as_secs_f64() * 1e3
                ),
                String::new(),
            ),
            (
                "rollout reconciles: count, mean ms".into(),
                format!(
                    "{:.0}, {:.1}",
                    self.reconciles.0,
                    self.reconciles.1.as_secs_f64() * 1e3
                ),
                String::new(),
            ),
            (
                "rollout CPU us per cluster: etcd / replicas / provider / bench".into(),
                format!(
                    "{} / {} / {} / {}",
                    self.per_cluster(cpu.etcd),
                    self.per_cluster(cpu.replicas),
                    self.per_cluster(cpu.provider),
                    self.per_cluster(cpu.clients)
                ),
                String::new(),
            ),
            (
                format!("rollout ratio that CPU allows on {} cores", self.cores),
                format!("{:.2}", self.cpu_bound()),
                String::new(),
            ),
            (
                "rollout owner kill -9 to next start (ms)".into(),
                self.kill_to_next_start
                    .map_or("-".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3)),
                "<= 1000".into(),
            ),
        ]
    }
}

/// The phase's settings.
pub struct RolloutPhase {
    /// etcd's members' pids, for their CPU.
    pub etcd: Vec<u32>,
    /// The CPUs etcd, the replicas, the provider and the bench share.
    pub cores: usize,
    pub clusters: usize,
    pub concurrency: usize,
    pub latency: Duration,
    pub clients: usize,
}

impl RolloutPhase {
    /// Runs the phase on `replicas` (one of which it kills and removes).
    pub async fn run(
        &self,
        store: &EtcdStore,
        sim: &SimProcess,
        replicas: &mut Vec<(String, ReplicaProcess)>,
    ) -> RolloutFigures {
        sim.set_latency(Duration::ZERO).await;
        eprintln!("rollout: starting {} clusters...", self.clusters);
        let uids = self.create_fleet(replicas).await;
        sim.set_latency(self.latency).await;
        let mut client = replicas[0].1.client().await;
        let one_upgrade = one_upgrade(&mut client).await;
        eprintln!(
            "rollout: {} clusters at {}...",
            self.clusters, self.concurrency
        );
        let cpu_now = |replicas: &[(String, ReplicaProcess)]| {
            let pids: Vec<u32> = replicas.iter().map(|(_, r)| r.pid()).collect();
            CpuTimes::of(&self.etcd, &pids, sim.pid())
        };
        let cpu_before = cpu_now(replicas);
        let upgrades_before = Upgrades::of(replicas).await;
        let from = unix_ms();
        let started = Instant::now();
        create_rollout(&mut client, "bench", "1.30.0", self.concurrency).await;
        wait_succeeded(store, "bench").await;
        let wall = started.elapsed();
        let cpu = cpu_now(replicas).since(&cpu_before);
        let reconciles = reconciles(replicas).await;
        let upgrades_after = Upgrades::of(replicas).await;
        let audit = sim.history().await.entries;
        let spans = upgrade_spans(&audit, &uids, from);
        eprintln!("rollout: again, its owner killed part way...");
        let kill_after = one_upgrade * (self.clusters.div_ceil(self.concurrency) as u32) / 3;
        create_rollout(&mut client, "bench-kill", "1.31.0", self.concurrency).await;
        tokio::time::sleep(kill_after).await;
        let killed_at = kill_owner(store, "bench-kill", replicas).await;
        wait_succeeded(store, "bench-kill").await;
        RolloutFigures {
            clusters: self.clusters,
            concurrency: self.concurrency,
            latency: self.latency,
            wall,
            one_upgrade,
            peak: peak_concurrency(spans.values()),
            busy: upgrades_after.since(&upgrades_before),
            cpu,
            cores: self.cores,
            reconciles,
            kill_to_next_start: next_accept_after(store, "bench-kill", killed_at).await,
        }
    }

    /// Creates and starts the clusters, `clients` at a time; their uids.
    async fn create_fleet(&self, replicas: &[(String, ReplicaProcess)]) -> Vec<String> {
        let per_client = self.clusters.div_ceil(self.clients);
        let mut tasks = Vec::new();
        for c in 0..self.clients {
            let mut client = replicas[c % replicas.len()].1.client().await;
            let range = (c * per_client)..((c + 1) * per_client).min(self.clusters);
            tasks.push(tokio::spawn(async move {
                let mut uids = Vec::new();
                for i in range {
                    uids.push(create_started(&mut client, &format!("roll-{i:05}"), true).await);
                }
                uids
            }));
        }
        let mut uids = Vec::new();
        for task in tasks {
            uids.extend(task.await.expect("a creating task"));
        }
        uids
    }
}

/// A started cluster of one control node and one worker, labelled as a
/// target when `target`; its uid.
async fn create_started(client: &mut drover_client::Client, name: &str, target: bool) -> String {
    let labels = if target {
        [(LABEL.0.to_string(), LABEL.1.to_string())].into()
    } else {
        HashMap::new()
    };
    let request = v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(v1::ClusterSpec {
            version: "1.29.0".into(),
            control_nodes: 1,
            worker_nodes: 1,
            node_offering: "m".into(),
            labels,
            ..Default::default()
        }),
        create_only: false,
        request_id: String::new(),
    };
    let created = client
        .clusters()
        .create_cluster(request)
        .await
        .expect("create");
    let created = created.into_inner();
    let start = created.operation.expect("a start");
    let done = client
        .wait_operation(&start, Duration::from_secs(300))
        .await
        .expect("wait");
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    created.cluster.expect("the cluster").uid
}

/// The median of three upgrades of a cluster alone, accept to end.
async fn one_upgrade(client: &mut drover_client::Client) -> Duration {
    let mut times = Vec::new();
    for i in 0..3 {
        let name = format!("roll-probe-{i}");
        create_started(client, &name, false).await;
        let started = Instant::now();
        let op = crate::start_upgrade(client, &name, TARGET_VERSION).await;
        let done = client
            .wait_operation(&op, Duration::from_secs(60))
            .await
            .expect("wait");
        assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
        times.push(started.elapsed());
    }
    times.sort();
    times[1]
}

async fn create_rollout(
    client: &mut drover_client::Client,
    name: &str,
    version: &str,
    concurrency: usize,
) {
    let spec = v1::RolloutSpec {
        selector: [(LABEL.0.to_string(), LABEL.1.to_string())].into(),
        version: version.into(),
        stages: vec![v1::RolloutStage {
            name: "all".into(),
            max_concurrency: concurrency.to_string(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let request = v1::CreateRolloutRequest {
        name: name.into(),
        spec: Some(spec),
    };
    client
        .rollouts()
        .create_rollout(request)
        .await
        .expect("the rollout");
}

/// The upgrades the replicas ended so far: the sum of their durations.
struct Upgrades(f64);

impl Upgrades {
    async fn of(replicas: &[(String, ReplicaProcess)]) -> Self {
        let mut seconds = 0.0;
        for (_, replica) in replicas {
            let samples = crate::scrape::metrics(&replica.admin_endpoint()).await;
            let name = "drover_operation_duration_seconds_sum";
            seconds += crate::scrape::sum(&samples, name, "kind=\"upgrade\"");
        }
        Self(seconds)
    }

    fn since(&self, earlier: &Upgrades) -> Duration {
        Duration::from_secs_f64((self.0 - earlier.0).max(0.0))
    }
}

/// The rollout controller's reconciles so far on `replicas`: their count
/// and mean duration.
async fn reconciles(replicas: &[(String, ReplicaProcess)]) -> (f64, Duration) {
    let (mut count, mut seconds) = (0.0, 0.0);
    for (_, replica) in replicas {
        let samples = crate::scrape::metrics(&replica.admin_endpoint()).await;
        let name = "drover_owner_work_reconcile_duration_seconds";
        let label = "controller=\"rollouts\"";
        count += crate::scrape::sum(&samples, &format!("{name}_count"), label);
        seconds += crate::scrape::sum(&samples, &format!("{name}_sum"), label);
    }
    (
        count,
        Duration::from_secs_f64(seconds / f64::max(count, 1.0)),
    )
}

/// The rollout's status record, read from etcd (not through a replica,
/// whose CPU the phase measures).
async fn status(store: &EtcdStore, name: &str) -> Value {
    let key = format!("/drover/v1/rollout-status/{name}");
    let kv = store
        .get(&key)
        .await
        .expect("read the status")
        .into_single();
    kv.map_or(Value::Null, |kv| {
        serde_json::from_slice(&kv.value).expect("JSON")
    })
}

/// Kills the owner of rollout `name`; when (Unix ms).
async fn kill_owner(
    store: &drover_server::store::EtcdStore,
    name: &str,
    replicas: &mut Vec<(String, ReplicaProcess)>,
) -> u64 {
    let owner = status(store, name).await["owner"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let index = replicas.iter().position(|(id, _)| *id == owner);
    let index =
        index.unwrap_or_else(|| panic!("the owner {owner:?} is not a replica of the bench"));
    let (_, mut victim) = replicas.remove(index);
    let at = unix_ms();
    victim.kill9();
    at
}

async fn wait_succeeded(store: &drover_server::store::EtcdStore, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status = status(store, name).await;
        match status["state"].as_str() {
            Some("Succeeded") => return,
            Some("Failed" | "Cancelled" | "Paused") => panic!("the rollout ended {status}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "the rollout still {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn unix_ms() -> u64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    since.unwrap_or_default().as_millis() as u64
}

/// Each target's upgrade at the provider since `from` (Unix ms): its first
/// UpgradeNode admitted and its last landed.
fn upgrade_spans(
    audit: &[drover_proto::provider::v1::AuditEntry],
    uids: &[String],
    from: u64,
) -> HashMap<String, (u64, u64)> {
    let targets: std::collections::HashSet<&str> = uids.iter().map(String::as_str).collect();
    let mut spans: HashMap<String, (u64, u64)> = HashMap::new();
    let upgrades = audit
        .iter()
        .filter(|e| e.method == "UpgradeNode" && e.admitted_at_ms >= from);
    for entry in upgrades {
        let uid = entry.token.as_ref().map_or("", |t| t.cluster_uid.as_str());
        if !targets.contains(uid) {
            continue;
        }
        let span = spans
            .entry(uid.to_string())
            .or_insert((entry.admitted_at_ms, entry.landed_at_ms));
        span.0 = span.0.min(entry.admitted_at_ms);
        span.1 = span.1.max(entry.landed_at_ms);
    }
    spans
}

/// The most spans (start, end) open at one instant: an end before a start
/// at the same millisecond (touching is not overlap).
pub fn peak_concurrency<'s>(spans: impl IntoIterator<Item = &'s (u64, u64)>) -> usize {
    let mut edges: Vec<(u64, i32)> = spans
        .into_iter()
        .flat_map(|(start, end)| [(*start, 1), (*end, -1)])
        .collect();
    edges.sort();
    let (mut open, mut peak) = (0i32, 0i32);
    for (_, delta) in edges {
        open += delta;
        peak = peak.max(open);
    }
    peak as usize
}

/// From `killed_at` to the first target operation accepted after it (its
/// id is a UUIDv7: the first 48 bits are its Unix milliseconds).
async fn next_accept_after(
    store: &drover_server::store::EtcdStore,
    name: &str,
    killed_at: u64,
) -> Option<Duration> {
    let prefix = format!("/drover/v1/rollout-clusters/{name}/");
    let request = drover_server::store::RangeRequest::prefix(prefix);
    let targets = store.range(request).await.expect("read the targets").kvs;
    let accepted = targets.iter().filter_map(|kv| {
        let record: Value = serde_json::from_slice(&kv.value).ok()?;
        let id = record["operation_id"].as_str()?.replace('-', "");
        u64::from_str_radix(id.get(..12)?, 16).ok()
    });
    let first = accepted.filter(|at| *at > killed_at).min()?;
    Some(Duration::from_millis(first - killed_at))
}
