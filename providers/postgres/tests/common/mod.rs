//! Test harness: a provider served in-process over a root of its own,
//! real PostgreSQL under it, and a guard that kills every postgres process
//! under the root and removes it when the test ends, failed or not.

#![allow(dead_code)]

use drover_postgres_provider::config::{self, Config};
use drover_postgres_provider::{serve, PostgresProvider};
use drover_proto::provider::v1::{self as pb, provider_client::ProviderClient};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub const BIN: &str = "/usr/lib/postgresql/15/bin";
pub const V1: &str = "15.0.0";
pub const V2: &str = "15.1.0";

pub struct Env {
    pub root: PathBuf,
    ports: (u16, u16),
    server: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
    pub client: ProviderClient<Channel>,
    /// The provider's gRPC URL.
    pub endpoint: String,
}

/// A range of `n` ports nothing listens on, overlapping no range handed
/// out before in this process, and below the kernel's ephemeral ports (32768
/// and up on Linux): there, the source port of any outgoing connection on
/// the machine could be a node's port while the node is down (killed,
/// rebuilt), and the node could not start again ("Address already in use").
/// Each test process starts at its own offset.
fn free_range(n: u16) -> (u16, u16) {
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU32::new(std::process::id().wrapping_mul(7919) % SPAN));
    let width = u32::from(n) + 1;
    for _ in 0..SPAN / width {
        // One modulus for every width: ranges handed out one after another
        // never overlap before the counter comes round again.
        let from = FIRST + next.fetch_add(width, Ordering::Relaxed) % SPAN;
        if from + width > FIRST + SPAN {
            continue;
        }
        let (from, to) = (from as u16, (from + u32::from(n)) as u16);
        if (from..=to).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return (from, to);
        }
    }
    panic!("no free port range of {n} in {FIRST}..{}", FIRST + SPAN);
}

/// One port, as [`free_range`] gives them.
pub fn free_port() -> u16 {
    free_range(0).0
}

pub fn config(root: &Path, ports: (u16, u16)) -> Config {
    assert!(
        Path::new(BIN).join("postgres").exists(),
        "PostgreSQL 15 is not installed (scripts/install-deps.sh installs it)"
    );
    Config {
        root: root.to_path_buf(),
        versions: [(V1.to_string(), BIN.into()), (V2.to_string(), BIN.into())].into(),
        offerings: [
            config::parse_offering("small=8MB:30").unwrap(),
            config::parse_offering("medium=16MB:40").unwrap(),
        ]
        .into(),
        ports,
        run_as: "postgres".into(),
        max_workers: 4,
        unsafe_no_fsync: true,
        fault_point: None,
    }
}

impl Env {
    pub async fn new(name: &str) -> Env {
        let root = std::env::temp_dir().join(format!("drover-pg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ports = free_range(40);
        let (server, client, endpoint) = start(&root, ports).await;
        Env {
            root,
            ports,
            server: Some(server),
            client,
            endpoint,
        }
    }

    /// Stops the provider (the databases go on) and starts it again over
    /// the same root.
    pub async fn restart(&mut self) {
        let (stop, handle) = self.server.take().expect("running");
        let _ = stop.send(());
        handle.await.unwrap();
        let (server, client, endpoint) = start(&self.root, self.ports).await;
        self.server = Some(server);
        self.client = client;
        self.endpoint = endpoint;
    }
}

async fn start(
    root: &Path,
    ports: (u16, u16),
) -> (
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    ProviderClient<Channel>,
    String,
) {
    let provider = PostgresProvider::open(config(root, ports)).expect("provider opens");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        serve(provider, listener, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let endpoint = format!("http://{addr}");
    let client = ProviderClient::connect(endpoint.clone()).await.unwrap();
    ((stop, handle), client, endpoint)
}

impl Drop for Env {
    fn drop(&mut self) {
        for pid in postgres_pids(&self.root) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Processes whose command line names a path under `root` (postgres runs
/// as `postgres -D <data dir>`).
pub fn postgres_pids(root: &Path) -> Vec<u32> {
    pids_with(&[&root.display().to_string()])
}

/// Live processes whose command line contains every one of `words`.
pub fn pids_with(words: &[&str]) -> Vec<u32> {
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
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !zombie && words.iter().all(|w| cmdline.contains(w)) {
            pids.push(pid);
        }
    }
    pids
}

pub fn token(uid: &str, epoch: i64) -> Option<pb::FencingToken> {
    Some(pb::FencingToken {
        cluster_uid: uid.into(),
        epoch,
        operation_id: format!("op-{epoch}"),
    })
}

/// Runs `sql` through psql against `address` (host:port).
pub fn psql(address: &str, sql: &str) -> Result<String, String> {
    let (host, port) = address.split_once(':').unwrap();
    let out = std::process::Command::new(Path::new(BIN).join("psql"))
        .args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .args(["-h", host, "-p", port, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .map_err(|e| e.to_string())?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        false => Err(String::from_utf8_lossy(&out.stderr).to_string()),
    }
}

/// Polls `f` every 200 ms until it yields, for at most `within`.
pub async fn eventually<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn describe(env: &mut Env, uid: &str) -> Vec<pb::ProviderNode> {
    let request = pb::DescribeClusterRequest {
        cluster_uid: uid.into(),
        token: None,
    };
    env.client
        .describe_cluster(request)
        .await
        .unwrap()
        .into_inner()
        .nodes
}

/// Polls describe until `pred` holds of the nodes.
pub async fn describe_until(
    env: &mut Env,
    uid: &str,
    what: &str,
    pred: impl Fn(&[pb::ProviderNode]) -> bool,
) -> Vec<pb::ProviderNode> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = describe(env, uid).await;
        if pred(&nodes) {
            return nodes;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {nodes:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn all_healthy(nodes: &[pb::ProviderNode]) -> bool {
    !nodes.is_empty() && nodes.iter().all(|n| n.healthy && n.power_state == "on")
}

pub fn primary(nodes: &[pb::ProviderNode]) -> &pb::ProviderNode {
    let controls: Vec<_> = nodes.iter().filter(|n| n.role == "control").collect();
    assert_eq!(controls.len(), 1, "exactly one primary: {nodes:#?}");
    controls[0]
}

pub fn address(node: &pb::ProviderNode) -> String {
    node.facts["address"].clone()
}

/// Sends signal `name` (STOP, CONT, 9) to `pid`; whether it was sent.
fn signal(pid: u32, name: &str) -> bool {
    std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// The pid of the postmaster of the node whose data directory is `dir`.
pub fn postmaster_pid(dir: &str) -> u32 {
    let text = std::fs::read_to_string(Path::new(dir).join("postmaster.pid")).unwrap();
    text.lines().next().unwrap().trim().parse().unwrap()
}

/// A postmaster held with SIGSTOP until this is dropped (SIGCONT): it
/// takes connections and signals but acts on none, so a call or a run
/// that needs it stays in progress. Its children (a standby's WAL
/// receiver) go on.
pub struct Paused(u32);

impl Paused {
    pub fn postmaster(dir: &str) -> Paused {
        let pid = postmaster_pid(dir);
        assert!(signal(pid, "STOP"), "SIGSTOP {pid}");
        Paused(pid)
    }

    /// Any process; None when it has exited already.
    pub fn process(pid: u32) -> Option<Paused> {
        signal(pid, "STOP").then_some(Paused(pid))
    }
}

/// The live processes whose parent is `pid` (a postmaster's children).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // After the command name (in parentheses): state, then the ppid.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

impl Drop for Paused {
    fn drop(&mut self) {
        // Not asserted: a drop while a failed test unwinds must not panic.
        signal(self.0, "CONT");
    }
}

/// Kills the node's postmaster with SIGKILL.
pub fn kill9(node: &pb::ProviderNode) {
    let pid = postmaster_pid(&node.facts["data_dir"]);
    assert!(signal(pid, "9"), "SIGKILL {pid}");
}

pub async fn create(env: &mut Env, uid: &str, epoch: i64, workers: u32) -> Vec<pb::ProviderNode> {
    let request = pb::CreateNodesRequest {
        token: token(uid, epoch),
        control_nodes: 1,
        worker_nodes: workers,
        offering: "small".into(),
        version: V1.into(),
    };
    env.client
        .create_nodes(request)
        .await
        .unwrap()
        .into_inner()
        .nodes
}

/// Creates a table of `n` rows through the primary and waits until every
/// node can read them.
pub async fn write_rows(nodes: &[pb::ProviderNode], n: u32) {
    let sql = format!(
        "CREATE TABLE items (id int PRIMARY KEY, name text); \
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, {n}) g"
    );
    psql(&address(primary(nodes)), &sql).unwrap();
    for node in nodes {
        let addr = address(node);
        eventually(Duration::from_secs(20), "rows replicated", || {
            (psql(&addr, "SELECT count(*) FROM items").ok()? == n.to_string()).then_some(())
        })
        .await;
    }
}

pub fn count_rows(node: &pb::ProviderNode) -> String {
    psql(&address(node), "SELECT count(*) FROM items").unwrap_or_else(|e| e)
}
