//! The PostgreSQL provider as a real process over a root of its own, and
//! what a test needs to look at the databases it runs: psql, the postgres
//! processes under the root, a node's postmaster. On drop the provider is
//! killed (by the pid we started) and so is every postgres process whose
//! command line names the root; the root is removed.

use crate::etcd::EtcdProcess;
use crate::replica::{health, ReplicaProcess};
use crate::{free_port, wait_until, workspace_binary, TempDir};
use drover_client::{v1, Client};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic_health::pb::health_check_response::ServingStatus;

/// Binaries of the one PostgreSQL major version Debian 12 ships.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";
/// Two version labels mapped to [`BIN`]: the rolling upgrade between them
/// is real (every node restarts on the "new" binaries, the primary
/// switches over), only the binaries are the same.
pub const V1: &str = "15.0.0";
pub const V2: &str = "15.1.0";
/// Labels `15.0.0` to `15.<LABELS - 1>.0`, all mapped to [`BIN`]: a test
/// may upgrade that many times in a row.
pub const LABELS: u32 = 10;

/// etcd, the PostgreSQL provider, replica processes in front of it and a
/// client of the first: what every PostgreSQL end-to-end test runs on.
///
/// Fields drop in order: the replicas first, etcd last.
pub struct PgDeployment {
    pub replicas: Vec<ReplicaProcess>,
    pub client: Client,
    pub provider: PgProviderProcess,
    pub etcd: EtcdProcess,
}

impl PgDeployment {
    /// Starts etcd, the provider and replicas `ids`, each scanning every
    /// second. Their lease is long enough (10 s) that most provider calls
    /// (an initdb, a pg_basebackup) end within one claim deadline; longer
    /// ones are sent again and converge.
    pub async fn start(ids: &[&str]) -> Self {
        let etcd = EtcdProcess::start().await;
        let provider = PgProviderProcess::start().await;
        let endpoint = provider.endpoint();
        let args = [
            "--provider",
            &endpoint,
            "--lease-ttl",
            "10",
            "--scan-interval",
            "1",
        ];
        let mut replicas = Vec::new();
        for id in ids {
            replicas.push(ReplicaProcess::serve_with(&etcd.endpoint(), id, &args).await);
        }
        let client = replicas[0].client().await;
        Self {
            replicas,
            client,
            provider,
            etcd,
        }
    }

    /// The nodes of cluster `pg` as its status shows them.
    pub async fn nodes(&mut self) -> Vec<v1::Node> {
        let cluster = self.client.get_cluster("pg").await.expect("get");
        cluster.status.unwrap_or_default().nodes
    }

    /// Polls cluster `pg`'s nodes, as its status shows them (the scanner
    /// refreshes them each scan), until `pred` holds of them, for at most
    /// `within`; returns them. On timeout, fails naming `what` and the
    /// nodes last seen.
    pub async fn wait_for_nodes(
        &mut self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[v1::Node]) -> bool,
    ) -> Vec<v1::Node> {
        let until = Instant::now() + within;
        loop {
            let nodes = self.nodes().await;
            if pred(&nodes) {
                return nodes;
            }
            assert!(
                Instant::now() < until,
                "timed out after {within:?} waiting for {what}: {nodes:#?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for `op` to end (an initdb or a pg_basebackup per node may
    /// take a while here), asserts it succeeded, and returns it ended.
    pub async fn succeeds(&mut self, op: v1::Operation) -> v1::Operation {
        let within = Duration::from_secs(180);
        let done = self.client.wait_operation(&op, within).await.expect("wait");
        assert_eq!(
            done.state,
            v1::OperationState::Succeeded as i32,
            "{done:#?}"
        );
        done
    }
}

/// Whether `nodes` are exactly one primary and `standbys` standbys, every
/// one ready: a cluster back to its spec (for [`PgDeployment::wait_for_nodes`]).
pub fn one_primary_all_ready(nodes: &[v1::Node], standbys: usize) -> bool {
    let controls = nodes.iter().filter(|n| n.role == "control").count();
    nodes.len() == 1 + standbys && controls == 1 && nodes.iter().all(|n| n.ready)
}

/// The `n`th version label (`version(0)` is [`V1`]).
pub fn version(n: u32) -> String {
    assert!(n < LABELS, "the provider maps {LABELS} labels");
    format!("15.{n}.0")
}

pub struct PgProviderProcess {
    child: Child,
    port: u16,
    node_ports: (u16, u16),
    root: TempDir,
    /// More flags, kept for restarts.
    extra: Vec<String>,
}

impl PgProviderProcess {
    /// Starts `drover-postgres-provider` on a free port, with node ports
    /// from a free range, fsync off, offerings `small` and `medium`.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// As [`Self::start`], with more flags (e.g. `--otlp-endpoint URL`).
    pub async fn start_with(extra: &[&str]) -> Self {
        assert!(
            Path::new(BIN).join("postgres").exists(),
            "PostgreSQL 15 is not installed (scripts/install-deps.sh installs it)"
        );
        let root = TempDir::new("pg-provider");
        // The provider's own port is the first of its range: a port taken
        // elsewhere could fall in another provider's node range, and a node
        // started there while this provider restarts would take it.
        let (port, last) = free_range(40);
        let node_ports = (port + 1, last);
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn(root.path(), port, node_ports, None, &extra);
        let provider = Self {
            child,
            port,
            node_ports,
            root,
            extra,
        };
        provider.wait_serving().await;
        provider
    }

    /// Kills the provider process (kill -9, the postgres processes it runs
    /// are left running) and starts it again on the same port and root,
    /// as a supervisor would; returns once it serves.
    pub async fn restart(&mut self) {
        self.restart_with_fault(None).await;
    }

    /// As [`Self::restart`], the new process aborting at the named step
    /// (`--fault-point`, e.g. `switchover.promoted`) when it gets there.
    pub async fn restart_with_fault(&mut self, fault_point: Option<&str>) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (root, ports) = (self.root.path(), self.node_ports);
        self.child = spawn(root, self.port, ports, fault_point, &self.extra);
        self.wait_serving().await;
    }

    /// Waits for the process to end by itself (a fault point fired).
    pub async fn wait_for_exit(&mut self, within: Duration) {
        let child = &mut self.child;
        let until = std::time::Instant::now() + within;
        while child.try_wait().expect("the provider's status").is_none() {
            assert!(
                std::time::Instant::now() < until,
                "the PostgreSQL provider did not end within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_serving(&self) {
        let endpoint = self.endpoint();
        wait_until(Duration::from_secs(20), "the PostgreSQL provider", || {
            let endpoint = endpoint.clone();
            async move { health(&endpoint).await == Some(ServingStatus::Serving) }
        })
        .await;
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The postgres processes running under this provider's root (the
    /// provider's own command line names the root too: not counted).
    pub fn postgres_pids(&self) -> Vec<u32> {
        let provider = self.child.id();
        let mut pids = postgres_pids(self.root.path());
        pids.retain(|pid| *pid != provider);
        pids
    }
}

impl Drop for PgProviderProcess {
    fn drop(&mut self) {
        let left = self.postgres_pids();
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in left {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

fn spawn(
    root: &Path,
    port: u16,
    (from, to): (u16, u16),
    fault_point: Option<&str>,
    extra: &[String],
) -> Child {
    let mut cmd = Command::new(workspace_binary("drover-postgres-provider"));
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--root")
        .arg(root);
    for n in 0..LABELS {
        cmd.args(["--pg-version", &format!("{}={BIN}", version(n))]);
    }
    if let Some(point) = fault_point {
        cmd.args(["--fault-point", point]);
    }
    cmd.args(extra);
    cmd.args(["--offering", "small=8MB:30", "--offering", "medium=16MB:40"])
        .args(["--port-range", &format!("{from}-{to}"), "--unsafe-no-fsync"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn drover-postgres-provider")
}

/// A range of `n` ports nothing listens on, starting at one the kernel
/// handed out, and overlapping no range handed to another provider of this
/// test process: tests run side by side, and two providers choosing node
/// ports from one range would race for them (a node then cannot start).
fn free_range(n: u16) -> (u16, u16) {
    static GIVEN: std::sync::Mutex<Vec<(u16, u16)>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..50 {
        let from = free_port();
        let Some(to) = from.checked_add(n) else {
            continue;
        };
        let overlaps = given.iter().any(|&(a, b)| from <= b && a <= to);
        if !overlaps && (from..=to).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            given.push((from, to));
            return (from, to);
        }
    }
    panic!("no free port range of {n}");
}

/// Processes (not zombies) whose command line names a path under `root`:
/// postgres runs as `postgres -D <data dir>`.
pub fn postgres_pids(root: &Path) -> Vec<u32> {
    let needle = root.display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(&needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Runs `sql` through psql against `address` (host:port), as the
/// `postgres` database user (loopback connections are trusted).
pub fn psql(address: &str, sql: &str) -> Result<String, String> {
    let (host, port) = address.split_once(':').expect("host:port");
    let out = Command::new(Path::new(BIN).join("psql"))
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
        .args(["-U", "postgres", "-d", "postgres", "-h", host, "-p", port])
        .args(["-c", sql])
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .map_err(|e| e.to_string())?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    }
}

/// Where a node listens, as the provider reports it in the node's facts.
pub fn address(node: &v1::Node) -> String {
    node.facts.get("address").cloned().unwrap_or_default()
}

/// The node's data directory, from its facts.
pub fn data_dir(node: &v1::Node) -> PathBuf {
    PathBuf::from(node.facts.get("data_dir").cloned().unwrap_or_default())
}

/// The pid of the node's postmaster (first line of postmaster.pid).
pub fn postmaster_pid(node: &v1::Node) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir(node).join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Nodes that accept writes now (not in recovery); nodes that do not
/// answer are not counted.
pub fn writable(nodes: &[v1::Node]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| psql(&address(n), "SELECT pg_is_in_recovery()").as_deref() == Ok("f"))
        .map(|n| n.id.clone())
        .collect()
}

/// The one node in the control role (the primary); panics unless there is
/// exactly one.
pub fn primary(nodes: &[v1::Node]) -> v1::Node {
    let controls: Vec<_> = nodes.iter().filter(|n| n.role == "control").collect();
    assert_eq!(controls.len(), 1, "one primary: {nodes:#?}");
    controls[0].clone()
}

/// `SELECT count(*) FROM items` on the node.
pub fn count_rows(node: &v1::Node) -> Result<String, String> {
    psql(&address(node), "SELECT count(*) FROM items")
}

/// Polls until every node serves `rows` rows of `items`.
pub async fn rows_everywhere(nodes: &[v1::Node], rows: u32) {
    for node in nodes {
        let what = format!("{rows} rows on {}", node.id);
        wait_until(Duration::from_secs(30), &what, || {
            let counted = count_rows(node);
            std::future::ready(counted == Ok(rows.to_string()))
        })
        .await;
    }
}

/// Kills the node's postmaster (kill -9, by the pid in its
/// postmaster.pid); its children end by themselves.
pub fn kill_postmaster(node: &v1::Node) {
    let pid = postmaster_pid(node).expect("its postmaster");
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success(), "kill -9 {pid}");
}

/// Asks every node every 100 ms, on a thread of its own, which accept
/// writes, and keeps the largest set seen at once.
pub struct WritableSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    most: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    samples: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: tokio::task::JoinHandle<()>,
}

impl WritableSampler {
    /// Starts sampling `nodes` (by their addresses: a node rebuilt in
    /// place keeps its own).
    pub fn start(nodes: &[v1::Node]) -> Self {
        Self::following(std::sync::Arc::new(std::sync::Mutex::new(nodes.to_vec())))
    }

    /// As [`Self::start`], over whichever nodes `nodes` holds at each
    /// sample: a test that sees nodes come and go (a surge worker added,
    /// then removed) keeps it up to date.
    pub fn following(nodes: std::sync::Arc<std::sync::Mutex<Vec<v1::Node>>>) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let most = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let samples = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let thread = {
            let (stop, most, samples) = (stop.clone(), most.clone(), samples.clone());
            tokio::task::spawn_blocking(move || {
                while !stop.load(Ordering::SeqCst) {
                    let now_nodes = nodes.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let now = writable(&now_nodes);
                    samples.fetch_add(1, Ordering::SeqCst);
                    let mut most = most.lock().unwrap_or_else(|p| p.into_inner());
                    if now.len() > most.len() {
                        *most = now;
                    }
                    drop(most);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self {
            stop,
            most,
            samples,
            thread,
        }
    }

    /// Stops sampling; the most nodes seen writable at once, and how many
    /// samples were taken.
    pub async fn finish(self) -> (Vec<String>, u64) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::SeqCst);
        self.thread.await.expect("the sampler");
        let most = self.most.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (most, self.samples.load(Ordering::SeqCst))
    }
}
