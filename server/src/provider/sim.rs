//! The simulated provider: serves drover.provider.v1.Provider over nodes
//! held in memory, plus the Simulator control service for tests.
//!
//! # Guarantees
//! - A mutating call whose token epoch is older than the newest epoch seen
//!   for that cluster uid is refused (FAILED_PRECONDITION) and changes
//!   nothing; it is not in the audit log.
//! - Every accepted mutating call is in the audit log, in order.

use drover_proto::provider::v1::{
    self as pb, provider_server::Provider, simulator_server::Simulator,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};

#[derive(Default)]
struct SimCluster {
    nodes: Vec<pb::ProviderNode>,
    next_worker: u32,
}

/// One task run: its outcome once it ended, and the switch StopTask flips.
struct SimRun {
    outcome: Option<pb::RunTaskResponse>,
    stop: tokio::sync::watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    clusters: HashMap<String, SimCluster>,
    newest_epoch: HashMap<String, i64>,
    runs: HashMap<String, SimRun>,
    step_latency: Duration,
    task_latency: Duration,
    faults: Vec<pb::Fault>,
    audit: Vec<pb::AuditEntry>,
}

/// The simulator; clones share one state. Serve it as both services.
#[derive(Clone, Default)]
pub struct SimProvider {
    state: Arc<Mutex<State>>,
}

enum FaultAction {
    Fail(String),
    Hang,
}

impl SimProvider {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts down armed faults for `method`; the one reaching zero fires.
    fn take_fault(&self, method: &str) -> Option<FaultAction> {
        let mut state = self.lock();
        let mut fired = None;
        state.faults.retain_mut(|fault| {
            if fault.method != method || fired.is_some() {
                return true;
            }
            fault.nth = fault.nth.saturating_sub(1);
            if fault.nth == 0 {
                fired = Some(if fault.hang {
                    FaultAction::Hang
                } else {
                    FaultAction::Fail(fault.message.clone())
                });
                return false;
            }
            true
        });
        fired
    }

    /// Checks `token` against the newest epoch seen for its cluster and
    /// records it as the newest; the caller holds the state lock, so the
    /// check and what follows are atomic.
    fn fence(state: &mut State, token: &pb::FencingToken) -> Result<(), Status> {
        let newest = state
            .newest_epoch
            .get(&token.cluster_uid)
            .copied()
            .unwrap_or(i64::MIN);
        if token.epoch < newest {
            return Err(Status::failed_precondition(format!(
                "stale fencing token: epoch {} is older than {newest} for cluster {}",
                token.epoch, token.cluster_uid
            )));
        }
        state
            .newest_epoch
            .insert(token.cluster_uid.clone(), token.epoch);
        Ok(())
    }

    fn audit(state: &mut State, method: &str, token: pb::FencingToken, detail: String) {
        let sequence = state.audit.len() as u64 + 1;
        state.audit.push(pb::AuditEntry {
            sequence,
            method: method.to_string(),
            token: Some(token),
            detail,
        });
    }

    /// Runs a mutating call: latency, faults, fencing, then `apply` and the
    /// audit entry, atomically with the fencing check.
    async fn mutate<F>(
        &self,
        method: &str,
        token: Option<pb::FencingToken>,
        apply: F,
    ) -> Result<pb::NodesResponse, Status>
    where
        F: FnOnce(&mut SimCluster) -> Result<String, Status>,
    {
        let token = checked_token(token)?;
        let latency = self.lock().step_latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match self.take_fault(method) {
            Some(FaultAction::Hang) => std::future::pending::<()>().await,
            Some(FaultAction::Fail(message)) => {
                return Err(Status::internal(format!(
                    "injected fault in {method}: {message}"
                )))
            }
            None => {}
        }
        let mut state = self.lock();
        Self::fence(&mut state, &token)?;
        let cluster = state.clusters.entry(token.cluster_uid.clone()).or_default();
        let detail = apply(cluster)?;
        let nodes = cluster.nodes.clone();
        Self::audit(&mut state, method, token, detail);
        Ok(pb::NodesResponse { nodes })
    }
}

fn node(role: &str, index: u32, version: &str, offering: &str) -> pb::ProviderNode {
    pb::ProviderNode {
        id: format!("{role}-{index}"),
        role: role.to_string(),
        power_state: "on".to_string(),
        version: version.to_string(),
        healthy: true,
        offering: offering.to_string(),
    }
}

fn set_power(cluster: &mut SimCluster, on: bool) -> Result<String, Status> {
    if cluster.nodes.is_empty() {
        return Err(Status::not_found("the cluster has no nodes"));
    }
    for node in &mut cluster.nodes {
        node.power_state = if on { "on" } else { "off" }.to_string();
    }
    Ok(format!(
        "powered {} {} nodes",
        if on { "on" } else { "off" },
        cluster.nodes.len()
    ))
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Provider for SimProvider {
    async fn create_nodes(
        &self,
        request: Request<pb::CreateNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let r = request.into_inner();
        self.mutate("CreateNodes", r.token, |cluster| {
            if !cluster.nodes.is_empty() {
                // Idempotent: a retried provisioning finds its nodes.
                return Ok("nodes already exist".to_string());
            }
            cluster.nodes = (0..r.control_nodes)
                .map(|i| node("control", i, &r.version, &r.offering))
                .chain((0..r.worker_nodes).map(|i| node("worker", i, &r.version, &r.offering)))
                .collect();
            cluster.next_worker = r.worker_nodes;
            Ok(format!(
                "created {} control and {} worker nodes",
                r.control_nodes, r.worker_nodes
            ))
        })
        .await
        .map(Response::new)
    }

    async fn start_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let r = request.into_inner();
        self.mutate("StartNodes", r.token, |c| set_power(c, true))
            .await
            .map(Response::new)
    }

    async fn stop_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let r = request.into_inner();
        self.mutate("StopNodes", r.token, |c| set_power(c, false))
            .await
            .map(Response::new)
    }

    async fn delete_nodes(
        &self,
        request: Request<pb::DeleteNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let r = request.into_inner();
        self.mutate("DeleteNodes", r.token, |cluster| {
            if r.node_ids.is_empty() {
                let count = cluster.nodes.len();
                cluster.nodes.clear();
                return Ok(format!("deleted all {count} nodes"));
            }
            for id in &r.node_ids {
                if !cluster.nodes.iter().any(|n| &n.id == id) {
                    return Err(Status::not_found(format!("node {id} does not exist")));
                }
            }
            cluster.nodes.retain(|n| !r.node_ids.contains(&n.id));
            Ok(format!("deleted nodes {}", r.node_ids.join(",")))
        })
        .await
        .map(Response::new)
    }

    async fn resize_nodes(
        &self,
        request: Request<pb::ResizeNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let r = request.into_inner();
        self.mutate("ResizeNodes", r.token, |cluster| {
            let template = cluster
                .nodes
                .first()
                .cloned()
                .ok_or_else(|| Status::not_found("the cluster has no nodes"))?;
            if let Some(offering) = &r.offering {
                for node in &mut cluster.nodes {
                    node.offering = offering.clone();
                }
            }
            if let Some(target) = r.worker_nodes {
                let workers = cluster.nodes.iter().filter(|n| n.role == "worker").count() as u32;
                let offering = r.offering.clone().unwrap_or(template.offering.clone());
                for _ in workers..target {
                    let mut new = node("worker", cluster.next_worker, &template.version, &offering);
                    new.power_state = template.power_state.clone();
                    cluster.nodes.push(new);
                    cluster.next_worker += 1;
                }
                let mut excess = workers.saturating_sub(target);
                while excess > 0 {
                    if let Some(last) = cluster.nodes.iter().rposition(|n| n.role == "worker") {
                        cluster.nodes.remove(last);
                    }
                    excess -= 1;
                }
            }
            Ok(format!(
                "resized to workers={:?} offering={:?}",
                r.worker_nodes, r.offering
            ))
        })
        .await
        .map(Response::new)
    }

    async fn upgrade_node(
        &self,
        request: Request<pb::UpgradeNodeRequest>,
    ) -> Reply<pb::NodesResponse> {
        let r = request.into_inner();
        self.mutate("UpgradeNode", r.token, |cluster| {
            let node = cluster
                .nodes
                .iter_mut()
                .find(|n| n.id == r.node_id)
                .ok_or_else(|| Status::not_found(format!("node {} does not exist", r.node_id)))?;
            let from = std::mem::replace(&mut node.version, r.version.clone());
            Ok(format!(
                "upgraded {} from {from} to {}",
                r.node_id, r.version
            ))
        })
        .await
        .map(Response::new)
    }

    async fn describe_cluster(
        &self,
        request: Request<pb::DescribeClusterRequest>,
    ) -> Reply<pb::NodesResponse> {
        let request = request.into_inner();
        match self.take_fault("DescribeCluster") {
            Some(FaultAction::Hang) => std::future::pending::<()>().await,
            Some(FaultAction::Fail(message)) => {
                return Err(Status::internal(format!(
                    "injected fault in DescribeCluster: {message}"
                )))
            }
            None => {}
        }
        let mut state = self.lock();
        if let Some(token) = &request.token {
            Self::fence(&mut state, token)?;
        }
        let nodes = state
            .clusters
            .get(&request.cluster_uid)
            .map(|c| c.nodes.clone())
            .unwrap_or_default();
        Ok(Response::new(pb::NodesResponse { nodes }))
    }

    async fn run_task(&self, request: Request<pb::RunTaskRequest>) -> Reply<pb::RunTaskResponse> {
        let r = request.into_inner();
        let token = checked_token(r.token)?;
        if r.run_id.is_empty() {
            return Err(Status::invalid_argument("run_id: is required"));
        }
        // Admission, fencing and the audit entry are one step; a repeated
        // call is audited too, so tests can tell that a run was asked twice.
        let (mut stopped, ended, latency) = {
            let mut state = self.lock();
            Self::fence(&mut state, &token)?;
            let repeat = state.runs.contains_key(&r.run_id);
            let run = state
                .runs
                .entry(r.run_id.clone())
                .or_insert_with(|| SimRun {
                    outcome: None,
                    stop: tokio::sync::watch::channel(false).0,
                });
            let watch = (run.stop.subscribe(), run.outcome.clone());
            let detail = format!(
                "{} {} {}/{}",
                if repeat { "repeat" } else { "run" },
                r.run_id,
                r.task_type,
                r.task_name
            );
            Self::audit(&mut state, "RunTask", token, detail);
            (watch.0, watch.1, state.task_latency)
        };
        if let Some(outcome) = ended {
            return Ok(Response::new(outcome));
        }
        let outcome = match self.take_fault("RunTask") {
            Some(FaultAction::Fail(message)) => {
                run_outcome("ERROR", format!("injected fault in RunTask: {message}"))
            }
            Some(FaultAction::Hang) => {
                let _ = stopped.wait_for(|stop| *stop).await;
                run_outcome("STOPPED", String::new())
            }
            None => tokio::select! {
                _ = tokio::time::sleep(latency) => run_outcome("DONE", String::new()),
                _ = stopped.wait_for(|stop| *stop) => run_outcome("STOPPED", String::new()),
            },
        };
        // Whatever ended the run first (the run itself or a stop) wins.
        let mut state = self.lock();
        let run = state
            .runs
            .get_mut(&r.run_id)
            .expect("runs are never forgotten");
        Ok(Response::new(run.outcome.get_or_insert(outcome).clone()))
    }

    async fn stop_task(
        &self,
        request: Request<pb::StopTaskRequest>,
    ) -> Reply<pb::StopTaskResponse> {
        let r = request.into_inner();
        let token = checked_token(r.token)?;
        let mut state = self.lock();
        Self::fence(&mut state, &token)?;
        Self::audit(&mut state, "StopTask", token, format!("stop {}", r.run_id));
        let run = state
            .runs
            .get_mut(&r.run_id)
            .ok_or_else(|| Status::not_found(format!("run {} is unknown", r.run_id)))?;
        if run.outcome.is_none() {
            run.outcome = Some(run_outcome("STOPPED", String::new()));
        }
        run.stop.send_replace(true);
        Ok(Response::new(pb::StopTaskResponse {}))
    }
}

fn run_outcome(status: &str, error: String) -> pb::RunTaskResponse {
    pb::RunTaskResponse {
        status: status.to_string(),
        error,
    }
}

/// A token that names its cluster.
fn checked_token(token: Option<pb::FencingToken>) -> Result<pb::FencingToken, Status> {
    let token = token.ok_or_else(|| Status::invalid_argument("token: is required"))?;
    if token.cluster_uid.is_empty() {
        return Err(Status::invalid_argument("token.cluster_uid: is required"));
    }
    Ok(token)
}

#[tonic::async_trait]
impl Simulator for SimProvider {
    async fn configure(&self, request: Request<pb::SimulatorConfig>) -> Reply<pb::SimulatorReply> {
        let config = request.into_inner();
        let mut state = self.lock();
        if let Some(step_latency) = config.step_latency_ms {
            state.step_latency = Duration::from_millis(step_latency);
        }
        if let Some(task_latency) = config.task_latency_ms {
            state.task_latency = Duration::from_millis(task_latency);
        }
        Ok(Response::new(pb::SimulatorReply {}))
    }

    async fn inject_fault(&self, request: Request<pb::Fault>) -> Reply<pb::SimulatorReply> {
        let fault = request.into_inner();
        if fault.method.is_empty() {
            return Err(Status::invalid_argument("method: is required"));
        }
        let fault = pb::Fault {
            nth: fault.nth.max(1),
            ..fault
        };
        self.lock().faults.push(fault);
        Ok(Response::new(pb::SimulatorReply {}))
    }

    async fn set_node_health(&self, request: Request<pb::NodeHealth>) -> Reply<pb::SimulatorReply> {
        let r = request.into_inner();
        let mut state = self.lock();
        let cluster = state
            .clusters
            .get_mut(&r.cluster_uid)
            .ok_or_else(|| Status::not_found(format!("cluster {} has no nodes", r.cluster_uid)))?;
        for node in &mut cluster.nodes {
            if r.node_ids.is_empty() || r.node_ids.contains(&node.id) {
                node.healthy = r.healthy;
            }
        }
        Ok(Response::new(pb::SimulatorReply {}))
    }

    async fn get_audit_log(&self, request: Request<pb::AuditLogRequest>) -> Reply<pb::AuditLog> {
        let uid = request.into_inner().cluster_uid;
        let state = self.lock();
        let entries = state
            .audit
            .iter()
            .filter(|e| uid.is_empty() || e.token.as_ref().is_some_and(|t| t.cluster_uid == uid))
            .cloned()
            .collect();
        Ok(Response::new(pb::AuditLog { entries }))
    }
}

/// Serves the simulator (Provider + Simulator + health) on `listener`.
pub async fn serve(
    provider: SimProvider,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    use drover_proto::provider::v1::{
        provider_server::ProviderServer, simulator_server::SimulatorServer,
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(ProviderServer::new(provider.clone()))
        .add_service(SimulatorServer::new(provider))
        .serve_with_incoming_shutdown(crate::server::incoming(listener), shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(epoch: i64) -> Option<pb::FencingToken> {
        Some(pb::FencingToken {
            cluster_uid: "u1".into(),
            epoch,
            operation_id: "op".into(),
        })
    }

    #[tokio::test]
    async fn stale_tokens_are_refused_and_not_audited() {
        let sim = SimProvider::new();
        let create = pb::CreateNodesRequest {
            token: token(5),
            control_nodes: 1,
            worker_nodes: 2,
            offering: "m".into(),
            version: "1.0.0".into(),
        };
        sim.create_nodes(Request::new(create)).await.unwrap();
        let stale = sim
            .stop_nodes(Request::new(pb::PowerRequest { token: token(4) }))
            .await
            .unwrap_err();
        assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
        sim.stop_nodes(Request::new(pb::PowerRequest { token: token(5) }))
            .await
            .unwrap();
        let log = sim
            .get_audit_log(Request::new(pb::AuditLogRequest::default()))
            .await
            .unwrap()
            .into_inner();
        let methods: Vec<&str> = log.entries.iter().map(|e| e.method.as_str()).collect();
        assert_eq!(methods, ["CreateNodes", "StopNodes"]);
    }

    #[tokio::test]
    async fn a_fenced_describe_refuses_older_epochs_from_then_on() {
        let sim = SimProvider::new();
        let create = pb::CreateNodesRequest {
            token: token(5),
            control_nodes: 1,
            ..Default::default()
        };
        sim.create_nodes(Request::new(create)).await.unwrap();
        let fence = pb::DescribeClusterRequest {
            cluster_uid: "u1".into(),
            token: token(9),
        };
        sim.describe_cluster(Request::new(fence)).await.unwrap();
        let late = sim
            .stop_nodes(Request::new(pb::PowerRequest { token: token(5) }))
            .await
            .unwrap_err();
        assert_eq!(late.code(), tonic::Code::FailedPrecondition);
    }

    #[tokio::test]
    async fn the_nth_call_fails_once() {
        let sim = SimProvider::new();
        sim.inject_fault(Request::new(pb::Fault {
            method: "StartNodes".into(),
            nth: 2,
            hang: false,
            message: "boom".into(),
        }))
        .await
        .unwrap();
        let create = pb::CreateNodesRequest {
            token: token(1),
            control_nodes: 1,
            ..Default::default()
        };
        sim.create_nodes(Request::new(create)).await.unwrap();
        let start = || sim.start_nodes(Request::new(pb::PowerRequest { token: token(1) }));
        assert!(start().await.is_ok());
        assert_eq!(start().await.unwrap_err().code(), tonic::Code::Internal);
        assert!(start().await.is_ok());
    }
}
