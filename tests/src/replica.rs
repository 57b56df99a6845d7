//! A real `drover` replica process for tests, on a free loopback port,
//! killed (by its pid, which we started) on drop.

use crate::{free_port, wait_until, workspace_binary};
use drover_client::Client;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};

/// One replica.
pub struct ReplicaProcess {
    child: Child,
    port: u16,
    admin_port: u16,
}

impl ReplicaProcess {
    /// Starts `drover serve` against `etcd_endpoint` and waits until healthy.
    pub async fn serve(etcd_endpoint: &str, replica_id: &str) -> Self {
        Self::serve_with(etcd_endpoint, replica_id, &[]).await
    }

    /// As [`Self::serve`], with extra flags (e.g. `--provider URL`).
    pub async fn serve_with(etcd_endpoint: &str, replica_id: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let mut command = Command::new(workspace_binary("drover"));
        command
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--etcd-endpoints", etcd_endpoint])
            .args(["--replica-id", replica_id])
            .args(extra);
        if !extra.contains(&"--lease-ttl") {
            command.args(["--lease-ttl", "2"]);
        }
        Self::start(command, port).await
    }

    /// Starts `drover dev` (embedded mode) and waits until healthy.
    pub async fn dev() -> Self {
        let port = free_port();
        let mut command = Command::new(workspace_binary("drover"));
        command
            .arg("dev")
            .args(["--listen", &format!("127.0.0.1:{port}")]);
        Self::start(command, port).await
    }

    async fn start(mut command: Command, port: u16) -> Self {
        let admin_port = free_port();
        command.args(["--admin-listen", &format!("127.0.0.1:{admin_port}")]);
        let child = command
            .env(
                "RUST_LOG",
                std::env::var("DROVER_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn drover");
        let mut replica = Self {
            child,
            port,
            admin_port,
        };
        let endpoint = replica.endpoint();
        wait_until(
            Duration::from_secs(20),
            "the replica to report SERVING",
            || {
                let exited = replica.child.try_wait().expect("poll drover");
                assert!(
                    exited.is_none(),
                    "drover exited during start-up: {exited:?}"
                );
                let endpoint = endpoint.clone();
                async move { health(&endpoint).await == Some(ServingStatus::Serving) }
            },
        )
        .await;
        replica
    }

    /// The admin HTTP base URL (/metrics, /healthz, /readyz).
    pub fn admin_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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
        let mut exit = None;
        wait_until(Duration::from_secs(30), "the replica to exit", || {
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
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
        .ok()?
        .connect()
        .await
        .ok()?;
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(response.into_inner().status).ok()
}
