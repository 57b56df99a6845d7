//! The simulated provider as a real process, with its control client.

use crate::{free_port, replica::health_over, wait_until, workspace_binary};
use drover_proto::provider::v1 as pb;
use pb::simulator_client::SimulatorClient;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic_health::pb::health_check_response::ServingStatus;

pub struct SimProcess {
    child: Child,
    /// The network namespace it runs in, if not this process's.
    node: Option<crate::netns::Node>,
    port: u16,
    /// How the harness reaches it when it serves TLS (`--tls-cert` ...).
    tls: Option<ClientTlsConfig>,
    /// Its flags, for a restart.
    extra: Vec<String>,
}

impl SimProcess {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// As [`Self::start`], with extra flags (e.g. `--faults PLAN`).
    pub async fn start_with(extra: &[&str]) -> Self {
        Self::start_over(extra, None).await
    }

    /// As [`Self::start_with`] for a simulator serving TLS (`--tls-cert`
    /// ... among `extra`); the harness's own calls (health, control) use
    /// `tls`.
    pub async fn start_tls(extra: &[&str], tls: ClientTlsConfig) -> Self {
        Self::start_over(extra, Some(tls)).await
    }

    /// As [`Self::start_with`] inside the network namespace of `node`,
    /// listening on its address.
    pub async fn start_in(node: &crate::netns::Node, extra: &[&str]) -> Self {
        Self::start_at(Some(node.clone()), extra, None).await
    }

    async fn start_over(extra: &[&str], tls: Option<ClientTlsConfig>) -> Self {
        Self::start_at(None, extra, tls).await
    }

    async fn start_at(
        node: Option<crate::netns::Node>,
        extra: &[&str],
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        let port = free_port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = spawn(node.as_ref(), port, &extra);
        let sim = Self {
            child,
            node,
            port,
            tls,
            extra,
        };
        sim.await_serving().await;
        sim
    }

    /// Kills the simulator (SIGKILL) and starts it again on the same port
    /// and flags. Its state (clusters, fencing epochs, audit log) is in
    /// memory: the new process starts empty.
    pub async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.node.as_ref(), self.port, &self.extra);
        self.await_serving().await;
    }

    async fn await_serving(&self) {
        let endpoint = self.endpoint();
        wait_until(Duration::from_secs(20), "the simulated provider", || {
            let (endpoint, tls) = (endpoint.clone(), self.tls.clone());
            async move { health_over(&endpoint, tls, "").await == Some(ServingStatus::Serving) }
        })
        .await;
    }

    /// The provider process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let host = self.node.as_ref().map_or("127.0.0.1", |n| n.ip.as_str());
        format!("{scheme}://{host}:{}", self.port)
    }

    /// A channel to it, over TLS when it serves TLS.
    pub async fn channel(&self) -> Channel {
        let mut endpoint = Channel::from_shared(self.endpoint()).expect("endpoint");
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).expect("TLS config");
        }
        endpoint.connect().await.expect("connect to the simulator")
    }

    /// The simulator's control service; its answers may be large (the
    /// audit log of a fleet of 10,000 clusters is megabytes).
    pub async fn control(&self) -> SimulatorClient<Channel> {
        SimulatorClient::new(self.channel().await).max_decoding_message_size(256 << 20)
    }

    pub async fn set_latency(&self, latency: Duration) {
        self.configure(pb::SimulatorConfig {
            step_latency_ms: Some(latency.as_millis() as u64),
            ..Default::default()
        })
        .await;
    }

    /// How long each task run takes.
    pub async fn set_task_latency(&self, latency: Duration) {
        self.configure(pb::SimulatorConfig {
            task_latency_ms: Some(latency.as_millis() as u64),
            ..Default::default()
        })
        .await;
    }

    /// Switches the seeded random faults to `plan` (see the simulator's
    /// `--faults`; empty: none), each delay at most `max_delay`.
    pub async fn set_faults(&self, plan: &str, seed: u64, max_delay: Duration) {
        self.configure(pb::SimulatorConfig {
            faults: Some(plan.into()),
            fault_seed: Some(seed),
            fault_delay_ms: Some(max_delay.as_millis() as u64),
            ..Default::default()
        })
        .await;
    }

    async fn configure(&self, config: pb::SimulatorConfig) {
        self.control()
            .await
            .configure(config)
            .await
            .expect("configure");
    }

    /// Arms a failure (or a hang) of the `nth` next call of `method`.
    pub async fn fault(&self, method: &str, nth: u32, hang: bool) {
        let fault = pb::Fault {
            method: method.into(),
            nth,
            hang,
            message: format!("simulated {method} failure"),
        };
        self.control()
            .await
            .inject_fault(fault)
            .await
            .expect("inject fault");
    }

    pub async fn set_health(&self, cluster_uid: &str, healthy: bool) {
        self.set_node_health(cluster_uid, &[], healthy).await;
    }

    /// Marks the named nodes of a cluster (every node when none) healthy
    /// or not.
    pub async fn set_node_health(&self, cluster_uid: &str, node_ids: &[&str], healthy: bool) {
        let request = pb::NodeHealth {
            cluster_uid: cluster_uid.into(),
            node_ids: node_ids.iter().map(|id| id.to_string()).collect(),
            healthy,
            lost: false,
        };
        self.control()
            .await
            .set_node_health(request)
            .await
            .expect("set health");
    }

    /// The named nodes of a cluster vanish, as machines deleted out of
    /// band.
    pub async fn lose_nodes(&self, cluster_uid: &str, node_ids: &[&str]) {
        let request = pb::NodeHealth {
            cluster_uid: cluster_uid.into(),
            node_ids: node_ids.iter().map(|id| id.to_string()).collect(),
            healthy: false,
            lost: true,
        };
        self.control()
            .await
            .set_node_health(request)
            .await
            .expect("lose nodes");
    }

    /// Every accepted mutating call for a cluster, oldest first.
    pub async fn audit(&self, cluster_uid: &str) -> Vec<pb::AuditEntry> {
        let request = pb::AuditLogRequest {
            cluster_uid: cluster_uid.into(),
        };
        self.control()
            .await
            .get_audit_log(request)
            .await
            .expect("audit log")
            .into_inner()
            .entries
    }

    /// The whole audit log, with the count of random faults injected.
    pub async fn history(&self) -> pb::AuditLog {
        self.control()
            .await
            .get_audit_log(pb::AuditLogRequest::default())
            .await
            .expect("audit log")
            .into_inner()
    }

    /// The nodes the provider holds for a cluster (an unfenced look).
    pub async fn nodes(&self, cluster_uid: &str) -> Vec<pb::ProviderNode> {
        let request = pb::DescribeClusterRequest {
            cluster_uid: cluster_uid.into(),
            token: None,
        };
        pb::provider_client::ProviderClient::connect(self.endpoint())
            .await
            .expect("connect to the provider")
            .describe_cluster(request)
            .await
            .expect("describe")
            .into_inner()
            .nodes
    }
}

fn spawn(node: Option<&crate::netns::Node>, port: u16, extra: &[String]) -> Child {
    let binary = workspace_binary("drover-sim-provider");
    let (mut command, host) = match node {
        Some(node) => (node.command(binary), node.ip.as_str()),
        None => (Command::new(binary), "127.0.0.1"),
    };
    command
        .args(["--listen", &format!("{host}:{port}")])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn drover-sim-provider")
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
