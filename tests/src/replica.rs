//! A real `drover` replica process for tests, on a free loopback port,
//! killed (by its pid, which we started) on drop.

use crate::{free_port, wait_until, workspace_binary};
use drover_client::Client;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;
use tonic::transport::ClientTlsConfig;
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};

/// One replica.
pub struct ReplicaProcess {
    child: Child,
    /// The address it listens on: loopback, or its network namespace's.
    host: String,
    port: u16,
    admin_port: u16,
    /// How the harness reaches it over TLS, when it serves TLS.
    tls: Option<ClientTlsConfig>,
}

impl ReplicaProcess {
    /// Starts `drover serve` against `etcd_endpoint` and waits until healthy.
    pub async fn serve(etcd_endpoint: &str, replica_id: &str) -> Self {
        Self::serve_with(etcd_endpoint, replica_id, &[]).await
    }

    /// As [`Self::serve`], with extra flags (e.g. `--provider URL`).
    pub async fn serve_with(etcd_endpoint: &str, replica_id: &str, extra: &[&str]) -> Self {
        Self::serve_over(etcd_endpoint, replica_id, extra, None).await
    }

    /// As [`Self::serve_with`], with environment variables of its own and
    /// its log (stderr) written to `log`.
    pub async fn serve_logged(
        etcd_endpoint: &str,
        replica_id: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> Self {
        let mut command = Command::new(workspace_binary("drover"));
        let file = std::fs::File::create(log).expect("create the replica's log");
        command.envs(env.iter().copied()).stderr(file);
        Self::serve_command(command, "127.0.0.1", etcd_endpoint, replica_id, extra, None).await
    }

    /// As [`Self::serve_with`] for a replica serving TLS (`--tls-cert` ...
    /// among `extra`); the harness checks its health with `tls`.
    pub async fn serve_tls(
        etcd_endpoint: &str,
        replica_id: &str,
        extra: &[&str],
        tls: ClientTlsConfig,
    ) -> Self {
        Self::serve_over(etcd_endpoint, replica_id, extra, Some(tls)).await
    }

    /// As [`Self::serve_with`] inside the network namespace of `node`,
    /// listening on its address; `etcd_endpoints` comma-separated.
    pub async fn serve_in(
        node: &crate::netns::Node,
        etcd_endpoints: &str,
        replica_id: &str,
        extra: &[&str],
    ) -> Self {
        let command = node.command(workspace_binary("drover"));
        Self::serve_command(command, &node.ip, etcd_endpoints, replica_id, extra, None).await
    }

    async fn serve_over(
        etcd_endpoint: &str,
        replica_id: &str,
        extra: &[&str],
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        let command = Command::new(workspace_binary("drover"));
        Self::serve_command(command, "127.0.0.1", etcd_endpoint, replica_id, extra, tls).await
    }

    async fn serve_command(
        mut command: Command,
        host: &str,
        etcd_endpoint: &str,
        replica_id: &str,
        extra: &[&str],
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        let port = free_port();
        command
            .arg("serve")
            .args(["--listen", &format!("{host}:{port}")])
            .args(["--etcd-endpoints", etcd_endpoint])
            .args(["--replica-id", replica_id])
            .args(extra);
        if !extra.contains(&"--lease-ttl") {
            command.args(["--lease-ttl", "2"]);
        }
        Self::start(command, host, port, tls).await
    }

    /// Starts `drover dev` (embedded mode) and waits until healthy.
    pub async fn dev() -> Self {
        Self::dev_with(&[]).await
    }

    /// As [`Self::dev`], with extra flags (e.g. `--step-latency-ms 300`).
    pub async fn dev_with(extra: &[&str]) -> Self {
        let port = free_port();
        let mut command = Command::new(workspace_binary("drover"));
        command
            .arg("dev")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra);
        Self::start(command, "127.0.0.1", port, None).await
    }

    async fn start(
        mut command: Command,
        host: &str,
        port: u16,
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        let admin_port = free_port();
        command.args(["--admin-listen", &format!("{host}:{admin_port}")]);
        // A network namespace's address is not loopback: plain HTTP there
        // (the tests' own network) must be asked for.
        let loopback = host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
        if tls.is_none() && !loopback {
            command.arg("--admin-plain-http");
        }
        // A level the caller set (serve_logged's environment) stands.
        let chosen = command.get_envs().any(|(key, _)| key == "RUST_LOG");
        if !chosen {
            let level = std::env::var("DROVER_TEST_LOG").unwrap_or_else(|_| "warn".into());
            command.env("RUST_LOG", level);
        }
        // stderr is inherited unless the caller chose where it goes.
        let child = command.stdout(Stdio::null()).spawn().expect("spawn drover");
        let mut replica = Self {
            child,
            host: host.to_string(),
            port,
            admin_port,
            tls,
        };
        let endpoint = replica.endpoint();
        let probe_tls = replica.tls.clone();
        wait_until(
            Duration::from_secs(20),
            "the replica to report SERVING",
            || {
                let exited = replica.child.try_wait().expect("poll drover");
                assert!(
                    exited.is_none(),
                    "drover exited during start-up: {exited:?}"
                );
                let (endpoint, tls) = (endpoint.clone(), probe_tls.clone());
                async move { health_over(&endpoint, tls, "").await == Some(ServingStatus::Serving) }
            },
        )
        .await;
        replica
    }

    /// The admin HTTP base URL (/metrics, /healthz, /readyz): https://
    /// when the replica serves TLS.
    pub fn admin_endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.admin_port)
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.port)
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.endpoint())
            .await
            .expect("connect to replica")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`STOP`, `CONT`, `TERM`, ...) to this replica only.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits (without blocking the runtime, so this
    /// process's own connections can close) for the exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit().await
    }

    /// Waits (without blocking the runtime) for the replica to exit, for at
    /// most 30 s.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        self.wait_exit_within(Duration::from_secs(30)).await
    }

    /// As [`Self::wait_exit`], for at most `within`.
    pub async fn wait_exit_within(&mut self, within: Duration) -> ExitStatus {
        let mut exit = None;
        wait_until(within, "the replica to exit", || {
            exit = self.child.try_wait().expect("poll drover");
            std::future::ready(exit.is_some())
        })
        .await;
        exit.expect("exited")
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The overall health a replica reports, or `None` if it does not answer.
pub async fn health(endpoint: &str) -> Option<ServingStatus> {
    service_health(endpoint, "").await
}

/// The health a replica reports for `service` (e.g. `drover.v1.Clusters`;
/// empty: the whole replica).
pub async fn service_health(endpoint: &str, service: &str) -> Option<ServingStatus> {
    health_over(endpoint, None, service).await
}

/// [`service_health`] over TLS when `tls` is given.
pub async fn health_over(
    endpoint: &str,
    tls: Option<ClientTlsConfig>,
    service: &str,
) -> Option<ServingStatus> {
    let mut endpoint = tonic::transport::Channel::from_shared(endpoint.to_string()).ok()?;
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).ok()?;
    }
    let channel = endpoint.connect().await.ok()?;
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(response.into_inner().status).ok()
}
