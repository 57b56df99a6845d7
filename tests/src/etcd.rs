//! A real etcd process for tests: loopback only, free ports, a temporary
//! data directory, killed (by its pid, which we started) on drop.

use crate::pki::{Issued, Pki};
use crate::{free_port, TempDir};
use drover_server::store::{EtcdOptions, EtcdStore, Store};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One single-member etcd cluster.
pub struct EtcdProcess {
    child: Option<Child>,
    data_dir: TempDir,
    client_port: u16,
    peer_port: u16,
    tls: Option<EtcdTlsFiles>,
    /// Serve Go's profiler at `/debug/pprof` on the client URL.
    pprof: bool,
    /// More flags for etcd (e.g. `--quota-backend-bytes`).
    extra: Vec<String>,
    /// Where its data lives, if not in `data_dir` (a slow disk, say).
    data: Option<PathBuf>,
    /// The `cgroup.procs` file of the cgroup etcd runs in from its first
    /// instruction, if not this process's.
    cgroup_procs: Option<PathBuf>,
}

/// Certificates for an etcd that serves clients over TLS and requires
/// client certificates.
pub struct EtcdTlsFiles {
    pub ca: std::path::PathBuf,
    pub server: Issued,
    pub client: Issued,
}

impl EtcdTlsFiles {
    pub fn new(pki: &Pki) -> Self {
        Self {
            ca: pki.ca(),
            server: pki.server("etcd"),
            client: pki.client("drover-etcd-client"),
        }
    }

    fn options(&self) -> drover_server::config::EtcdTls {
        drover_server::config::EtcdTls {
            ca_pem: std::fs::read(&self.ca).expect("read CA"),
            identity: Some((
                self.client.cert_pem.clone(),
                drover_server::config::Secret::new(self.client.key_pem.clone()),
            )),
        }
    }
}

impl EtcdProcess {
    /// Starts etcd and waits until it answers.
    pub async fn start() -> Self {
        Self::start_with(None, false).await
    }

    /// Starts etcd serving Go's profiler too (see [`Self::cpu_profile`]).
    pub async fn start_profiled() -> Self {
        Self::start_with(None, true).await
    }

    /// Starts etcd serving clients over TLS, client certificates required.
    pub async fn start_tls(files: EtcdTlsFiles) -> Self {
        Self::start_with(Some(files), false).await
    }

    /// Starts etcd with more flags (kept across restarts).
    pub async fn start_with_args(extra: &[&str]) -> Self {
        Self::start_over(None, false, extra).await
    }

    async fn start_with(tls: Option<EtcdTlsFiles>, pprof: bool) -> Self {
        Self::start_over(tls, pprof, &[]).await
    }

    /// Starts etcd with its data in `data` (a directory it may create),
    /// running in the cgroup whose `cgroup.procs` is `cgroup_procs` from
    /// before its first write, so that the cgroup's limits (blkio
    /// throttles) apply to all its I/O.
    pub async fn start_in_cgroup(data: PathBuf, cgroup_procs: PathBuf) -> Self {
        let mut etcd = Self::unstarted(None, false, &[]);
        etcd.data = Some(data);
        etcd.cgroup_procs = Some(cgroup_procs);
        etcd.launch().await
    }

    async fn start_over(tls: Option<EtcdTlsFiles>, pprof: bool, extra: &[&str]) -> Self {
        Self::unstarted(tls, pprof, extra).launch().await
    }

    fn unstarted(tls: Option<EtcdTlsFiles>, pprof: bool, extra: &[&str]) -> Self {
        Self {
            child: None,
            data_dir: TempDir::new("etcd"),
            client_port: free_port(),
            peer_port: free_port(),
            tls,
            pprof,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            data: None,
            cgroup_procs: None,
        }
    }

    async fn launch(mut self) -> Self {
        for attempt in 1.. {
            match self.spawn().await {
                Ok(()) => break,
                Err(report) if attempt < START_ATTEMPTS => {
                    // A port free a moment ago may have been taken since
                    // (another test's connection): start over on new ones,
                    // with no data.
                    eprintln!("etcd did not start ({report}); retrying on new ports");
                    self.kill();
                    let _ = std::fs::remove_dir_all(self.data_path());
                    self.data_dir = TempDir::new("etcd");
                    self.client_port = free_port();
                    self.peer_port = free_port();
                }
                Err(report) => panic!("etcd did not start: {report}"),
            }
        }
        self
    }

    /// Its data directory.
    fn data_path(&self) -> PathBuf {
        self.data
            .clone()
            .unwrap_or_else(|| self.data_dir.path().join("data"))
    }

    /// The etcd process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn options(&self) -> EtcdOptions {
        let mut options = EtcdOptions::new(vec![self.endpoint()]);
        options.tls = self.tls.as_ref().map(EtcdTlsFiles::options);
        options
    }

    /// A CPU profile of etcd over the next `seconds` (gzipped pprof
    /// protobuf: `go tool pprof -top -cum FILE`); needs
    /// [`Self::start_profiled`].
    pub async fn cpu_profile(&self, seconds: u64) -> Vec<u8> {
        assert!(self.pprof, "etcd was started without --enable-pprof");
        let path = format!("/debug/pprof/profile?seconds={seconds}");
        crate::scrape::get(&self.endpoint(), &path).await
    }

    /// A store connected to this etcd.
    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(&self.options())
            .await
            .expect("connect to test etcd")
    }

    /// Runs etcdctl against this etcd (with the TLS files, if any) and
    /// returns its standard output; panics when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint()]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.cert)
                .arg("--key")
                .arg(&tls.client.key);
        }
        run_etcdctl(command.args(args), args)
    }

    /// Kills etcd (SIGKILL) and waits for it to exit; the data stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub async fn restart(&mut self) {
        self.kill();
        if let Err(report) = self.spawn().await {
            panic!("etcd did not restart: {report}");
        }
    }

    /// Saves a snapshot of etcd's data to `path` (`etcdctl snapshot save`).
    pub fn snapshot_save(&self, path: &std::path::Path) {
        self.etcdctl(&["snapshot", "save", &path.to_string_lossy()]);
    }

    /// What an operator does to restore a backup: stops etcd, moves its
    /// data directory aside, restores `snapshot` into a new one
    /// (`etcdctl snapshot restore`, same member name and peer URL) and
    /// starts etcd on it, on the same ports.
    pub async fn restore(&mut self, snapshot: &std::path::Path) {
        self.kill();
        let data = self.data_path();
        let aside = data.with_extension("before-restore");
        // A drill restores more than once: keep only the newest aside.
        if aside.exists() {
            std::fs::remove_dir_all(&aside).expect("remove an older data directory set aside");
        }
        std::fs::rename(&data, &aside).expect("move the data directory aside");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let output = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore", &snapshot.to_string_lossy()])
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(&data)
            .args(["--initial-cluster", &format!("test={peer}")])
            .args(["--initial-advertise-peer-urls", &peer])
            .output()
            .expect("etcdctl must be installed");
        assert!(
            output.status.success(),
            "etcdctl snapshot restore: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        if let Err(report) = self.spawn().await {
            panic!("etcd did not start on the restored data: {report}");
        }
    }

    /// Starts the process and waits until it answers; on failure, says why.
    async fn spawn(&mut self) -> Result<(), String> {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.data_dir.path().join("etcd.log")).expect("etcd log");
        let mut command = match &self.cgroup_procs {
            // The shell joins the cgroup, then becomes etcd (same pid).
            Some(procs) => {
                let mut shell = Command::new("sh");
                shell
                    .arg("-c")
                    .arg(r#"echo $$ > "$0" && exec etcd "$@""#)
                    .arg(procs);
                shell
            }
            None => Command::new("etcd"),
        };
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server.cert)
                .arg("--key-file")
                .arg(&tls.server.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        if self.pprof {
            command.arg("--enable-pprof");
        }
        let child = command
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(self.data_path())
            .args(["--listen-client-urls", &self.endpoint()])
            .args(["--advertise-client-urls", &self.endpoint()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (apt-get install etcd-server)");
        self.child = Some(child);
        let options = self.options();
        let mut processes = [("etcd", &mut self.child, self.data_dir.path())];
        await_answer(&options, &mut processes).await
    }
}

/// How many times a test etcd is started on fresh ports before giving up.
const START_ATTEMPTS: u32 = 3;

/// How long one start may take to answer.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// Waits until etcd answers at `options`. Fails at once when one of
/// `processes` (name, child, data directory holding `etcd.log`) exits, or at
/// the deadline, with each one's state and the end of its log.
async fn await_answer(
    options: &EtcdOptions,
    processes: &mut [(&str, &mut Option<Child>, &std::path::Path)],
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + START_DEADLINE;
    loop {
        let answered = match EtcdStore::connect(options).await {
            Ok(store) => store.get("/health-probe").await.is_ok(),
            Err(_) => false,
        };
        // A cluster answers with a member down; the tests need all of them.
        let exited = processes.iter_mut().any(|(_, child, _)| {
            child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
        });
        if answered && !exited {
            return Ok(());
        }
        if exited || std::time::Instant::now() > deadline {
            let reports: Vec<String> = processes
                .iter_mut()
                .map(|(name, child, dir)| {
                    let state = match child.as_mut().map(Child::try_wait) {
                        Some(Ok(Some(status))) => format!("exited ({status})"),
                        Some(Ok(None)) => "running".to_string(),
                        _ => "not started".to_string(),
                    };
                    let log = std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    format!("{name} {state}; log ends: {}", tail.join(" | "))
                })
                .collect();
            return Err(reports.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A multi-member etcd cluster on loopback, for leader-loss tests.
pub struct EtcdCluster {
    members: Vec<Member>,
    /// Every member serves Go's profiler at `/debug/pprof`.
    pprof: bool,
}

struct Member {
    name: String,
    /// The network namespace it runs in, if not this process's.
    node: Option<crate::netns::Node>,
    child: Option<Child>,
    data_dir: TempDir,
    client_port: u16,
    peer_port: u16,
}

impl Member {
    fn host(&self) -> &str {
        self.node.as_ref().map_or("127.0.0.1", |n| n.ip.as_str())
    }

    fn client_url(&self) -> String {
        format!("http://{}:{}", self.host(), self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://{}:{}", self.host(), self.peer_port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl EtcdCluster {
    /// Starts `size` members and waits until the cluster answers.
    pub async fn start(size: usize) -> Self {
        Self::start_at(&vec![None; size], false).await
    }

    /// Starts `size` members serving Go's profiler too (see
    /// [`Self::cpu_profile`]).
    pub async fn start_profiled(size: usize) -> Self {
        Self::start_at(&vec![None; size], true).await
    }

    /// Starts one member in the network namespace of each of `nodes`, on
    /// its address, and waits until the cluster answers.
    pub async fn start_in(nodes: &[crate::netns::Node]) -> Self {
        let nodes: Vec<_> = nodes.iter().cloned().map(Some).collect();
        Self::start_at(&nodes, false).await
    }

    async fn start_at(nodes: &[Option<crate::netns::Node>], pprof: bool) -> Self {
        for attempt in 1.. {
            let mut cluster = Self::spawn(nodes, pprof);
            match cluster.await_answer().await {
                Ok(()) => return cluster,
                Err(report) if attempt < START_ATTEMPTS => {
                    // A port free a moment ago may have been taken since
                    // (another test's connection): start over on new ones.
                    eprintln!("the etcd cluster did not start ({report}); retrying on new ports");
                }
                Err(report) => panic!("the etcd cluster did not start: {report}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    fn spawn(nodes: &[Option<crate::netns::Node>], pprof: bool) -> Self {
        let mut members: Vec<Member> = (0..nodes.len())
            .map(|i| Member {
                name: format!("m{i}"),
                node: nodes[i].clone(),
                child: None,
                data_dir: TempDir::new("etcd-member"),
                client_port: free_port(),
                peer_port: free_port(),
            })
            .collect();
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        let initial = initial.join(",");
        for member in &mut members {
            let log =
                std::fs::File::create(member.data_dir.path().join("etcd.log")).expect("etcd log");
            let mut command = match &member.node {
                Some(node) => node.command("etcd"),
                None => Command::new("etcd"),
            };
            if pprof {
                command.arg("--enable-pprof");
            }
            let child = command
                .args(["--name", &member.name])
                .arg("--data-dir")
                .arg(member.data_dir.path().join("data"))
                .args(["--listen-client-urls", &member.client_url()])
                .args(["--advertise-client-urls", &member.client_url()])
                .args(["--listen-peer-urls", &member.peer_url()])
                .args(["--initial-advertise-peer-urls", &member.peer_url()])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("etcd must be installed (apt-get install etcd-server)");
            member.child = Some(child);
        }
        Self { members, pprof }
    }

    async fn await_answer(&mut self) -> Result<(), String> {
        let options = EtcdOptions::new(self.endpoints());
        let mut processes: Vec<_> = self
            .members
            .iter_mut()
            .map(|m| (m.name.as_str(), &mut m.child, m.data_dir.path()))
            .collect();
        await_answer(&options, &mut processes).await
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// A store over every member.
    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(&EtcdOptions::new(self.endpoints()))
            .await
            .expect("connect to the test etcd cluster")
    }

    /// The process id of each running member, in member order.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(Child::id))
            .collect()
    }

    /// A CPU profile of member `index` over the next `seconds` (gzipped
    /// pprof protobuf); needs [`Self::start_profiled`].
    pub async fn cpu_profile(&self, index: usize, seconds: u64) -> Vec<u8> {
        assert!(
            self.pprof,
            "the etcd cluster was started without --enable-pprof"
        );
        let path = format!("/debug/pprof/profile?seconds={seconds}");
        crate::scrape::get(&self.members[index].client_url(), &path).await
    }

    /// Runs etcdctl against every running member and returns its standard
    /// output; panics when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.live_endpoints()])
            .args(args);
        run_etcdctl(&mut command, args)
    }

    /// The client URLs of the running members, comma-separated.
    fn live_endpoints(&self) -> String {
        let live: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(Member::client_url)
            .collect();
        live.join(",")
    }

    /// Index of the current leader, as the members report it.
    pub fn leader(&self) -> Option<usize> {
        let output = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &self.live_endpoints(),
                "endpoint",
                "status",
                "-w",
                "json",
            ])
            .output()
            .ok()?;
        let statuses: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        let statuses = statuses.as_array()?;
        let leader = statuses.first()?["Status"]["leader"].as_u64()?;
        let endpoint = statuses
            .iter()
            .find(|s| s["Status"]["header"]["member_id"].as_u64() == Some(leader))?["Endpoint"]
            .as_str()?
            .to_string();
        self.members.iter().position(|m| m.client_url() == endpoint)
    }

    /// Kills one member (SIGKILL); its data stays.
    pub fn kill(&mut self, index: usize) {
        self.members[index].kill();
    }

    /// Sends `signal` (`STOP`, `CONT`) to one member.
    pub fn signal(&self, index: usize, signal: &str) {
        let pid = self.members[index]
            .child
            .as_ref()
            .expect("a running member")
            .id();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
    }
}

/// Runs an etcdctl `command` (made with `args`), asserting it succeeds;
/// its standard output.
fn run_etcdctl(command: &mut Command, args: &[&str]) -> String {
    let output = command.output().expect("etcdctl must be installed");
    assert!(
        output.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
