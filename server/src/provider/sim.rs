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

#[derive(Default)]
struct State {
    clusters: HashMap<String, SimCluster>,
    newest_epoch: HashMap<String, i64>,
    step_latency: Duration,
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
        let token = token.ok_or_else(|| Status::invalid_argument("token: is required"))?;
        if token.cluster_uid.is_empty() {
            return Err(Status::invalid_argument("token.cluster_uid: is required"));
        }
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
        let cluster = state.clusters.entry(token.cluster_uid.clone()).or_default();
        let detail = apply(cluster)?;
        let nodes = cluster.nodes.clone();
        let sequence = state.audit.len() as u64 + 1;
        state.audit.push(pb::AuditEntry {
            sequence,
            method: method.to_string(),
            token: Some(token),
            detail,
        });
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
        let mut state = self.lock();
        if let Some(token) = request.token {
            let newest = state
                .newest_epoch
                .entry(token.cluster_uid.clone())
                .or_insert(i64::MIN);
            if token.epoch < *newest {
                return Err(Status::failed_precondition(format!(
                    "stale fencing token: epoch {} is older than {} for cluster {}",
                    token.epoch, *newest, token.cluster_uid
                )));
            }
            *newest = token.epoch;
        }
        let nodes = state
            .clusters
            .get(&request.cluster_uid)
            .map(|c| c.nodes.clone())
            .unwrap_or_default();
        Ok(Response::new(pb::NodesResponse { nodes }))
    }

    async fn run_task(&self, _: Request<pb::RunTaskRequest>) -> Reply<pb::RunTaskResponse> {
        Err(Status::unimplemented(
            "RunTask is not simulated by this version",
        ))
    }

    async fn stop_task(&self, _: Request<pb::StopTaskRequest>) -> Reply<pb::StopTaskResponse> {
        Err(Status::unimplemented(
            "StopTask is not simulated by this version",
        ))
    }
}

#[tonic::async_trait]
impl Simulator for SimProvider {
    async fn configure(&self, request: Request<pb::SimulatorConfig>) -> Reply<pb::SimulatorReply> {
        self.lock().step_latency = Duration::from_millis(request.into_inner().step_latency_ms);
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
