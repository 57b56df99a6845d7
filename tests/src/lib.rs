//! Test harness for Drover's end-to-end tests.
//!
//! - [`fixture`]: one test's etcd, simulated provider, replica processes
//!   and client, from a builder.
//! - [`etcd`]: a real etcd process per test.
//! - [`replica`]: a real `drover` replica process.
//! - [`in_process`]: a replica in the test's process, over a store that
//!   injects faults at exact points.
//! - [`provider`]: the simulated provider process and its control client.
//! - [`history`]: replays state-key history and checks it against the table.
//! - [`netns`]: network namespaces on a bridge, cut and healed pairwise,
//!   with random packet loss (nftables).
//! - [`otlp`]: an OpenTelemetry trace receiver, as a collector would be.
//! - [`relay`]: a TCP relay adding latency per chunk, where netem is missing.
//! - [`pki`]: a throwaway CA and certificates for TLS tests.
//! - [`scrape`]: reads a `/metrics` endpoint (etcd's, a replica's).
//! - [`slow_disk`]: etcd on a loop device whose writes a blkio cgroup
//!   throttles.
//! - [`load`]: a bounded load of stops and starts, and its figures.
//! - [`console`]: what the console's browser tests share (tokens, plain
//!   HTTP to the admin port, signing in).
//! - [`conformance`]: the store conformance suite, run against etcd and the
//!   in-memory store alike.

pub mod browser;
pub mod conformance;
pub mod console;
pub mod etcd;
pub mod fixture;
pub mod history;
pub mod in_process;
pub mod load;
pub mod netns;
pub mod otlp;
pub mod pki;
pub mod postgres;
pub mod procfs;
pub mod provider;
pub mod relay;
pub mod replica;
pub mod rollout_bench;
pub mod scrape;
pub mod slow_disk;

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A loopback port that is free now and that no other caller in this
/// process has been given.
///
/// Ports come from below the kernel's ephemeral range (32768 and up on
/// Linux): a port the kernel handed out for `127.0.0.1:0` could be taken
/// again, before the process meant for it binds, as the source port of any
/// outbound connection (a replica's to etcd, say), which once made a replica
/// fail to start with "Address already in use". Each test process starts at
/// its own offset so that concurrent test processes rarely meet.
pub fn free_port() -> u16 {
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU32::new(std::process::id().wrapping_mul(7919) % SPAN));
    for _ in 0..SPAN {
        let port = (FIRST + next.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN);
}

/// Polls `condition` until it holds; panics with `what` after `deadline`.
pub async fn wait_until<F, Fut>(deadline: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if condition().await {
            return;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A deterministic pseudo-random sequence, so that a randomized test's
/// failure can be replayed from its seed.
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number in `0..bound`.
    pub fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound
    }
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let path = std::env::temp_dir().join(format!("drover-{label}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Path of a binary of this workspace, built next to the running
/// executable: a test (`target/<profile>/deps/<test>`) or a tool
/// (`target/<profile>/<tool>`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable directory");
    let candidates = [dir.join(name), dir.parent().unwrap_or(dir).join(name)];
    candidates
        .iter()
        .find(|path| path.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} is missing next to {}: run `cargo build --workspace --bins` first",
                exe.display()
            )
        })
}

/// A plain HTTP/1.0 GET on loopback: the status code and the body.
pub fn http_get(base: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let address = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the admin port");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

/// Polls (linearizable reads) until `cluster` is in `state`; panics after
/// `deadline`.
pub async fn wait_for_state(
    client: &drover_client::Client,
    cluster: &str,
    state: drover_client::v1::ClusterState,
    deadline: Duration,
) {
    let what = format!("cluster {cluster} to be {}", state.as_str_name());
    wait_until(deadline, &what, || {
        let mut client = client.clone();
        async move {
            let status = client
                .get_cluster(cluster)
                .await
                .expect("get cluster")
                .status;
            status.and_then(|s| s.state) == Some(state as i32)
        }
    })
    .await;
}

/// Asks for a stop of `cluster` (`stop`) or a start, with no request id.
pub async fn stop_or_start(
    client: &mut drover_client::Client,
    cluster: &str,
    stop: bool,
) -> Result<drover_client::v1::Operation, tonic::Status> {
    stop_or_start_waiting(client, cluster, stop, Duration::ZERO).await
}

/// [`stop_or_start`] in one call that also waits up to `wait` for the
/// operation's end (`wait_ms`; zero: no wait).
pub async fn stop_or_start_waiting(
    client: &mut drover_client::Client,
    cluster: &str,
    stop: bool,
    wait: Duration,
) -> Result<drover_client::v1::Operation, tonic::Status> {
    use drover_client::v1;
    let (name, wait_ms) = (cluster.to_string(), wait.as_millis() as u64);
    let op = if stop {
        let request = v1::StopClusterRequest {
            name,
            wait_ms,
            ..Default::default()
        };
        client.clusters().stop_cluster(request).await
    } else {
        let request = v1::StartClusterRequest {
            name,
            wait_ms,
            ..Default::default()
        };
        client.clusters().start_cluster(request).await
    };
    op.map(tonic::Response::into_inner)
}

/// Runs a stop then a start of `cluster`, each waited for up to `wait`;
/// both must succeed.
pub async fn stop_and_start(client: &mut drover_client::Client, cluster: &str, wait: Duration) {
    use drover_client::v1;
    for stop in [true, false] {
        let op = stop_or_start(client, cluster, stop)
            .await
            .expect("accepted");
        let done = client.wait_operation(&op, wait).await.expect("wait");
        assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    }
}

/// A repair task (intensity 0.5) that runs once, now.
pub fn repair_now(name: &str) -> drover_client::v1::TaskSpec {
    use drover_client::v1;
    v1::TaskSpec {
        r#type: v1::TaskType::Repair as i32,
        name: name.into(),
        schedule: Some(v1::TaskSchedule {
            start_date: "now".into(),
            ..Default::default()
        }),
        properties: Some(v1::task_spec::Properties::Repair(v1::RepairProperties {
            intensity: "0.5".into(),
            ..Default::default()
        })),
    }
}

/// The status of `cluster`'s repair task `name` (see [`repair_now`]).
pub async fn repair_status(
    client: &drover_client::Client,
    cluster: &str,
    name: &str,
) -> drover_client::v1::TaskStatus {
    use drover_client::v1;
    let request = v1::GetTaskRequest {
        cluster: cluster.into(),
        r#type: v1::TaskType::Repair as i32,
        name: name.into(),
    };
    let task = client.clone().tasks().get_task(request).await;
    let task = task.expect("the task").into_inner();
    task.status.unwrap_or_default()
}

/// Waits (up to 20 s) until `done` holds for the status of `cluster`'s
/// repair task "now" (see [`repair_now`]).
pub async fn wait_for_repair(
    client: &drover_client::Client,
    cluster: &str,
    what: &str,
    done: fn(&drover_client::v1::TaskStatus) -> bool,
) {
    wait_until(Duration::from_secs(20), what, || async {
        done(&repair_status(client, cluster, "now").await)
    })
    .await;
}

/// Whether a task has had a run that ended done.
pub fn has_run(status: &drover_client::v1::TaskStatus) -> bool {
    status.success_count.unwrap_or(0) > 0
}

/// Creates rollout `name`: `cluster` alone upgraded to `version`, in one
/// stage.
pub async fn roll_one(client: &drover_client::Client, name: &str, cluster: &str, version: &str) {
    use drover_client::v1;
    let spec = v1::RolloutSpec {
        clusters: vec![cluster.into()],
        version: version.into(),
        stages: vec![v1::RolloutStage {
            name: "all".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let request = v1::CreateRolloutRequest {
        name: name.into(),
        spec: Some(spec),
    };
    let created = client.clone().rollouts().create_rollout(request).await;
    created.expect("the rollout is created");
}

/// Rollout `name`'s status as it is now.
pub async fn rollout_status(
    client: &drover_client::Client,
    name: &str,
) -> drover_client::v1::RolloutStatus {
    let request = drover_client::v1::GetRolloutRequest { name: name.into() };
    let rollout = client.clone().rollouts().get_rollout(request).await;
    let rollout = rollout.expect("the rollout").into_inner();
    rollout.status.unwrap_or_default()
}

/// Creates `count` clusters `<prefix>-000`... (left Created: a fleet to
/// own, not to run) and returns their names.
pub async fn create_fleet(
    client: &mut drover_client::Client,
    prefix: &str,
    count: usize,
) -> Vec<String> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i:03}")).collect();
    for name in &names {
        let request = create_only(name);
        client.clusters().create_cluster(request).await.unwrap();
    }
    names
}

/// Creates a cluster (version 1.29.0, one control node, `workers` workers)
/// with its first start, waits for the start to succeed, and returns it.
pub async fn create_running(
    client: &mut drover_client::Client,
    name: &str,
    workers: u32,
) -> drover_client::v1::Cluster {
    use drover_client::v1;
    let response = client
        .clusters()
        .create_cluster(v1::CreateClusterRequest {
            name: name.into(),
            spec: Some(v1::ClusterSpec {
                version: "1.29.0".into(),
                control_nodes: 1,
                worker_nodes: workers,
                node_offering: "medium".into(),
                ..Default::default()
            }),
            create_only: false,
            request_id: String::new(),
        })
        .await
        .expect("create")
        .into_inner();
    let start = response.operation.expect("a start");
    let done = client
        .wait_operation(&start, Duration::from_secs(30))
        .await
        .expect("wait");
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    client.get_cluster(name).await.expect("get the new cluster")
}

/// Asks for an upgrade of `cluster` to `version` and returns the accepted
/// operation (panics if it is refused).
pub async fn start_upgrade(
    client: &mut drover_client::Client,
    cluster: &str,
    version: &str,
) -> drover_client::v1::Operation {
    let request = drover_client::v1::UpgradeClusterRequest {
        name: cluster.into(),
        version: version.into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    let accepted = client.clusters().upgrade_cluster(request).await;
    accepted.expect("upgrade accepted").into_inner()
}

/// The first 100 operations of `cluster`, newest first.
pub async fn operations_of(
    client: &drover_client::Client,
    cluster: &str,
) -> Vec<drover_client::v1::Operation> {
    // A fault just healed may still refuse a read or two: asked again.
    client
        .retrying_unavailable(|mut client| async move {
            let request = drover_client::v1::ListOperationsRequest {
                cluster: cluster.into(),
                page_size: 100,
                page_token: String::new(),
            };
            let answer = client.operations().list_operations(request).await?;
            Ok(answer.into_inner().operations)
        })
        .await
        .expect("list operations")
}

pub fn create_only(name: &str) -> drover_client::v1::CreateClusterRequest {
    drover_client::v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(drover_client::v1::ClusterSpec {
            version: "1.29.0".into(),
            control_nodes: 1,
            node_offering: "small".into(),
            ..Default::default()
        }),
        create_only: true,
        request_id: String::new(),
    }
}

/// The owner of `cluster` as the Admin service reports it, if any.
pub async fn owner(
    admin: &mut drover_client::v1::admin_client::AdminClient<tonic::transport::Channel>,
    cluster: &str,
) -> Option<drover_client::v1::Owner> {
    let request = drover_client::v1::GetOwnerRequest {
        cluster: cluster.into(),
    };
    admin.get_owner(request).await.ok().map(|r| r.into_inner())
}

/// Polls until the operation is RUNNING (its first step has begun).
pub async fn wait_running(
    client: &drover_client::Client,
    cluster: &str,
    id: &str,
    deadline: Duration,
) {
    use drover_client::v1;
    wait_until(deadline, "the operation to start running", || {
        let mut client = client.clone();
        let request = v1::GetOperationRequest {
            cluster: cluster.into(),
            id: id.into(),
        };
        async move {
            let op = client
                .operations()
                .get_operation(request)
                .await
                .expect("get operation");
            op.into_inner().state == v1::OperationState::Running as i32
        }
    })
    .await;
}

/// Replica endpoints a load may use; faults (kills, restarts) change them.
pub type Endpoints = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A client of one of the replicas listed, round robin from `turn`.
pub async fn any_client(endpoints: &Endpoints, turn: usize) -> Option<drover_client::Client> {
    let list = endpoints.lock().unwrap().clone();
    for i in 0..list.len() {
        if let Ok(client) = drover_client::Client::connect(&list[(turn + i) % list.len()]).await {
            return Some(client);
        }
    }
    None
}
