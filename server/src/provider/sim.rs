//! The simulated provider: serves drover.provider.v1.Provider over nodes
//! held in memory, plus the Simulator control service for tests.
//!
//! Without a fault plan it is kind: every call lands at once or fails
//! whole. With one ([`faults`]) it is hostile: seeded random errors, extra
//! latency, hangs, calls over several nodes that do some and then fail, and
//! calls admitted now that land later.
//!
//! # Guarantees
//! - A mutating call whose token epoch is older than the newest epoch seen
//!   for that cluster uid on entry is refused (FAILED_PRECONDITION) and
//!   changes nothing; it is not in the audit log.
//! - Every mutating call that changed something (fully, or partly and then
//!   failed) is in the audit log, in the order its effect landed, with its
//!   admission epoch and time, its landing time and the newest epoch the
//!   provider had accepted by then: the history a checker replays.
//! - Every call is idempotent: creating finds the nodes already there (and
//!   makes those still missing), deleting a node already gone succeeds.
//!
//! # Caveats
//! - A call drawn to land late (fault kind `late`) is checked on entry only:
//!   it lands even if a newer epoch was accepted meanwhile, or its caller
//!   went away. That breaks the fencing promise of drover.provider.v1 on
//!   purpose, as a real provider's admitted call would; the audit log shows
//!   it.

pub mod faults;

use drover_proto::provider::v1::{
    self as pb, provider_server::Provider, simulator_server::Simulator,
};
use faults::{Draw, FaultPlan, Faults};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

/// The calls that act on several nodes at once, so can do part of it.
const MULTI_NODE: [&str; 5] = [
    "CreateNodes",
    "StartNodes",
    "StopNodes",
    "DeleteNodes",
    "ResizeNodes",
];

/// How long before its gRPC deadline a late call lands.
const LAND_BEFORE_DEADLINE: Duration = Duration::from_millis(5);

/// The time left of a request's deadline: the earlier of its gRPC deadline
/// and Drover's wall-clock one (`drover-apply-by`), if it has either.
fn time_left<T>(request: &Request<T>) -> Option<Duration> {
    let apply_by = request
        .metadata()
        .get(crate::provider::APPLY_BY)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(|at| Duration::from_millis(at.saturating_sub(now_ms())));
    match (grpc_timeout(request), apply_by) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A request's gRPC deadline as time left (its `grpc-timeout` header:
/// digits and a unit, H M S m u n), if it has one.
fn grpc_timeout<T>(request: &Request<T>) -> Option<Duration> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[derive(Default)]
struct SimCluster {
    nodes: Vec<pb::ProviderNode>,
    next_worker: u32,
    /// A CreateNodes made every node it asked for.
    provisioned: bool,
}

/// What an admitted call did to its cluster.
enum Landed {
    /// All of it; the detail is for the audit log.
    Done(String),
    /// Part of it, then an injected fault: audited, answered with an error.
    Partial(String),
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
    /// Faults armed for the nth next call of a method.
    armed: Vec<pb::Fault>,
    /// The seeded random faults.
    faults: Faults,
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

    /// A simulator drawing random faults from `plan`, seeded, each delay
    /// at most `max_delay`.
    pub fn with_faults(plan: FaultPlan, seed: u64, max_delay: Duration) -> Self {
        let sim = Self::default();
        sim.lock()
            .faults
            .configure(Some(plan), Some(seed), Some(max_delay));
        sim
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts down armed faults for `method`; the one reaching zero fires.
    fn take_fault(&self, method: &str) -> Option<FaultAction> {
        let mut state = self.lock();
        let mut fired = None;
        state.armed.retain_mut(|fault| {
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
        let newest = state.newest_epoch.get(&token.cluster_uid).copied();
        if !drover_machine::fence_admits(newest, token.epoch) {
            return Err(Status::failed_precondition(format!(
                "stale fencing token: epoch {} is older than {} for cluster {}",
                token.epoch,
                newest.unwrap_or(i64::MIN),
                token.cluster_uid
            )));
        }
        state
            .newest_epoch
            .insert(token.cluster_uid.clone(), token.epoch);
        Ok(())
    }

    /// Appends the entry of a call landing now, admitted at `admitted_at`
    /// (`None`: admitted as it lands, atomically).
    fn audit(
        state: &mut State,
        method: &str,
        token: pb::FencingToken,
        admitted_at: Option<u64>,
        detail: String,
        error: String,
    ) {
        let sequence = state.audit.len() as u64 + 1;
        let newest = state.newest_epoch.get(&token.cluster_uid).copied();
        let landed_at = now_ms();
        state.audit.push(pb::AuditEntry {
            sequence,
            method: method.to_string(),
            newest_epoch_at_landing: newest.unwrap_or(token.epoch),
            token: Some(token),
            detail,
            admitted_at_ms: admitted_at.unwrap_or(landed_at),
            landed_at_ms: landed_at,
            error,
        });
    }

    /// What happens to a call before it reaches its cluster: an armed fault,
    /// then the random ones (error, hang, extra latency). Returns the draw,
    /// for the faults that act later (partial, late).
    async fn on_entry(
        &self,
        method: &str,
        multi_node: bool,
        can_land_late: bool,
    ) -> Result<Draw, Status> {
        match self.take_fault(method) {
            Some(FaultAction::Hang) => std::future::pending::<()>().await,
            Some(FaultAction::Fail(message)) => {
                return Err(Status::internal(format!(
                    "injected fault in {method}: {message}"
                )))
            }
            None => {}
        }
        let draw = self.lock().faults.draw(method, multi_node, can_land_late);
        if draw.error {
            return Err(Status::unavailable(format!(
                "injected fault in {method}: the provider is unavailable"
            )));
        }
        if draw.hang {
            std::future::pending::<()>().await;
        }
        if let Some(delay) = draw.delay {
            tokio::time::sleep(delay).await;
        }
        Ok(draw)
    }

    /// Runs a mutating call: latency, faults, fencing, then `apply` and the
    /// audit entry, atomically with the fencing check, or, for a call drawn
    /// to land late, after a delay and whatever was fenced meanwhile. A late
    /// call that carries a gRPC deadline (`due`: the time left at entry)
    /// lands just before it, the latest a provider that honours deadlines
    /// may apply it: the caller's deadline is what keeps it from landing
    /// after a newer owner's first call.
    async fn mutate<F>(
        &self,
        method: &'static str,
        token: Option<pb::FencingToken>,
        due: Option<Duration>,
        apply: F,
    ) -> Result<pb::NodesResponse, Status>
    where
        F: FnOnce(&mut SimCluster, bool) -> Result<Landed, Status> + Send + 'static,
    {
        let due_at = due.map(|left| tokio::time::Instant::now() + left);
        let token = checked_token(token)?;
        let latency = self.lock().step_latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let draw = self
            .on_entry(method, MULTI_NODE.contains(&method), true)
            .await?;
        let Some(delay) = draw.late else {
            let mut state = self.lock();
            Self::fence(&mut state, &token)?;
            return Self::land(&mut state, method, token, None, draw.partial, apply);
        };
        Self::fence(&mut self.lock(), &token)?;
        let admitted_at = Some(now_ms());
        // Detached from the request: the effect lands even if the caller has
        // gone away (timed out, or its process died) in the meantime.
        let (answer, answered) = tokio::sync::oneshot::channel();
        let sim = self.clone();
        let lands_at = match due_at {
            Some(at) => at.checked_sub(LAND_BEFORE_DEADLINE).unwrap_or(at),
            None => tokio::time::Instant::now() + delay,
        };
        tokio::spawn(async move {
            tokio::time::sleep_until(lands_at).await;
            let mut state = sim.lock();
            let landed = Self::land(&mut state, method, token, admitted_at, draw.partial, apply);
            let _ = answer.send(landed);
        });
        answered
            .await
            .map_err(|_| Status::internal(format!("{method}: the late call was lost")))?
    }

    /// Applies an admitted call to its cluster and audits what it did.
    fn land<F>(
        state: &mut State,
        method: &'static str,
        token: pb::FencingToken,
        admitted_at: Option<u64>,
        partial: bool,
        apply: F,
    ) -> Result<pb::NodesResponse, Status>
    where
        F: FnOnce(&mut SimCluster, bool) -> Result<Landed, Status>,
    {
        let cluster = state.clusters.entry(token.cluster_uid.clone()).or_default();
        let landed = apply(cluster, partial)?;
        let nodes = cluster.nodes.clone();
        let (detail, error) = match landed {
            Landed::Done(detail) => (detail, None),
            Landed::Partial(detail) => {
                let error = format!("injected partial failure in {method}: {detail}");
                (detail, Some(error))
            }
        };
        let logged = error.clone().unwrap_or_default();
        Self::audit(state, method, token, admitted_at, detail, logged);
        match error {
            Some(error) => Err(Status::unavailable(error)),
            None => Ok(pb::NodesResponse { nodes }),
        }
    }
}

/// The wall clock in Unix milliseconds: the history's times are compared
/// with operation records written by other processes on the same host.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How many of `n` items a call does: all, or (cut short) the first half.
fn share(n: usize, partial: bool) -> usize {
    if partial {
        n / 2
    } else {
        n
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

fn set_power(cluster: &mut SimCluster, on: bool, partial: bool) -> Result<Landed, Status> {
    if cluster.nodes.is_empty() {
        return Err(Status::not_found("the cluster has no nodes"));
    }
    let power = if on { "on" } else { "off" };
    let done = share(cluster.nodes.len(), partial);
    for node in cluster.nodes.iter_mut().take(done) {
        node.power_state = power.to_string();
    }
    let detail = format!("powered {power} {done} of {} nodes", cluster.nodes.len());
    Ok(if partial {
        Landed::Partial(detail)
    } else {
        Landed::Done(detail)
    })
}

/// Creates the nodes `r` asks for that do not exist yet: a retry after a
/// provisioning that did only part of its work completes it.
fn create(cluster: &mut SimCluster, r: &pb::CreateNodesRequest, partial: bool) -> Landed {
    if cluster.provisioned && !cluster.nodes.is_empty() {
        // Idempotent: a retried provisioning finds its nodes.
        return Landed::Done("nodes already exist".to_string());
    }
    let missing: Vec<pb::ProviderNode> = (0..r.control_nodes)
        .map(|i| node("control", i, &r.version, &r.offering))
        .chain((0..r.worker_nodes).map(|i| node("worker", i, &r.version, &r.offering)))
        .filter(|new| !cluster.nodes.iter().any(|n| n.id == new.id))
        .collect();
    let wanted = missing.len();
    cluster
        .nodes
        .extend(missing.into_iter().take(share(wanted, partial)));
    cluster.next_worker = cluster.next_worker.max(r.worker_nodes);
    if partial {
        let done = share(wanted, partial);
        return Landed::Partial(format!("created {done} of {wanted} missing nodes"));
    }
    cluster.provisioned = true;
    Landed::Done(format!(
        "created {} control and {} worker nodes",
        r.control_nodes, r.worker_nodes
    ))
}

/// Deletes the named nodes (all when none are named). A node already gone
/// is no error: a retried delete succeeds.
fn delete(cluster: &mut SimCluster, ids: &[String], partial: bool) -> Landed {
    let targets: Vec<String> = if ids.is_empty() {
        cluster.nodes.iter().map(|n| n.id.clone()).collect()
    } else {
        ids.iter()
            .filter(|id| cluster.nodes.iter().any(|n| &n.id == *id))
            .cloned()
            .collect()
    };
    let gone: Vec<&str> = ids
        .iter()
        .filter(|id| !targets.contains(id))
        .map(String::as_str)
        .collect();
    let deleted = &targets[..share(targets.len(), partial)];
    cluster.nodes.retain(|n| !deleted.contains(&n.id));
    let mut detail = format!("deleted nodes {}", deleted.join(","));
    if !gone.is_empty() {
        detail.push_str(&format!(" (already gone: {})", gone.join(",")));
    }
    if partial {
        Landed::Partial(format!("{detail} of {}", targets.join(",")))
    } else {
        Landed::Done(detail)
    }
}

/// Sets the worker count and/or offering; cut short, it goes half way to
/// the worker count asked for.
fn resize(
    cluster: &mut SimCluster,
    r: &pb::ResizeNodesRequest,
    partial: bool,
) -> Result<Landed, Status> {
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
        let add = share(target.saturating_sub(workers) as usize, partial) as u32;
        for _ in 0..add {
            let mut new = node("worker", cluster.next_worker, &template.version, &offering);
            new.power_state = template.power_state.clone();
            cluster.nodes.push(new);
            cluster.next_worker += 1;
        }
        let excess = share(workers.saturating_sub(target) as usize, partial);
        for _ in 0..excess {
            if let Some(last) = cluster.nodes.iter().rposition(|n| n.role == "worker") {
                cluster.nodes.remove(last);
            }
        }
    }
    let detail = format!(
        "resized to workers={:?} offering={:?}",
        r.worker_nodes, r.offering
    );
    Ok(if partial {
        Landed::Partial(format!("{detail}, half way"))
    } else {
        Landed::Done(detail)
    })
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Provider for SimProvider {
    async fn create_nodes(
        &self,
        request: Request<pb::CreateNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        let token = r.token.clone();
        self.mutate("CreateNodes", token, due, move |cluster, partial| {
            Ok(create(cluster, &r, partial))
        })
        .await
        .map(Response::new)
    }

    async fn start_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        self.mutate("StartNodes", r.token, due, |c, partial| {
            set_power(c, true, partial)
        })
        .await
        .map(Response::new)
    }

    async fn stop_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        self.mutate("StopNodes", r.token, due, |c, partial| {
            set_power(c, false, partial)
        })
        .await
        .map(Response::new)
    }

    async fn delete_nodes(
        &self,
        request: Request<pb::DeleteNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        self.mutate("DeleteNodes", r.token, due, move |cluster, partial| {
            Ok(delete(cluster, &r.node_ids, partial))
        })
        .await
        .map(Response::new)
    }

    async fn resize_nodes(
        &self,
        request: Request<pb::ResizeNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        let token = r.token.clone();
        self.mutate("ResizeNodes", token, due, move |cluster, partial| {
            resize(cluster, &r, partial)
        })
        .await
        .map(Response::new)
    }

    async fn upgrade_node(
        &self,
        request: Request<pb::UpgradeNodeRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        self.mutate("UpgradeNode", r.token, due, move |cluster, _| {
            let node = cluster
                .nodes
                .iter_mut()
                .find(|n| n.id == r.node_id)
                .ok_or_else(|| Status::not_found(format!("node {} does not exist", r.node_id)))?;
            let from = std::mem::replace(&mut node.version, r.version.clone());
            Ok(Landed::Done(format!(
                "upgraded {} from {from} to {}",
                r.node_id, r.version
            )))
        })
        .await
        .map(Response::new)
    }

    async fn describe_cluster(
        &self,
        request: Request<pb::DescribeClusterRequest>,
    ) -> Reply<pb::NodesResponse> {
        let request = request.into_inner();
        self.on_entry("DescribeCluster", false, false).await?;
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
            Self::audit(&mut state, "RunTask", token, None, detail, String::new());
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
        let detail = format!("stop {}", r.run_id);
        Self::audit(&mut state, "StopTask", token, None, detail, String::new());
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
        let plan = match config.faults.as_deref().map(str::parse::<FaultPlan>) {
            Some(Err(error)) => return Err(Status::invalid_argument(error.to_string())),
            Some(Ok(plan)) => Some(plan),
            None => None,
        };
        let mut state = self.lock();
        state.faults.configure(
            plan,
            config.fault_seed,
            config.fault_delay_ms.map(Duration::from_millis),
        );
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
        self.lock().armed.push(fault);
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
        let injected = state.faults.injected().clone().into_iter().collect();
        Ok(Response::new(pb::AuditLog { entries, injected }))
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
        .serve_with_incoming_shutdown(crate::net::incoming(listener), shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_deadline_reads_in_every_unit() {
        let with = |value: &str| {
            let mut request = Request::new(());
            request
                .metadata_mut()
                .insert("grpc-timeout", value.parse().unwrap());
            time_left(&request)
        };
        assert_eq!(with("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(with("2S"), Some(Duration::from_secs(2)));
        assert_eq!(with("3M"), Some(Duration::from_secs(180)));
        assert_eq!(with("7u"), Some(Duration::from_micros(7)));
        assert_eq!(with("x"), None);
        assert_eq!(time_left(&Request::new(())), None);
    }

    #[test]
    fn the_earlier_of_the_two_deadlines_counts() {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("grpc-timeout", "60S".parse().unwrap());
        let apply_by = now_ms() + 1_000;
        let value = apply_by.to_string().parse().unwrap();
        request
            .metadata_mut()
            .insert(crate::provider::APPLY_BY, value);
        let left = time_left(&request).unwrap();
        assert!(left <= Duration::from_secs(1), "{left:?}");
        let sent = crate::provider::due_by(std::time::Instant::now() + Duration::from_secs(2), ());
        let left = time_left(&sent).unwrap();
        assert!(left > Duration::from_millis(1500) && left <= Duration::from_secs(2));
    }

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

    fn faulty(plan: &str) -> SimProvider {
        SimProvider::with_faults(plan.parse().unwrap(), 1, Duration::from_millis(200))
    }

    async fn created(sim: &SimProvider, workers: u32) {
        let create = pb::CreateNodesRequest {
            token: token(5),
            control_nodes: 1,
            worker_nodes: workers,
            ..Default::default()
        };
        sim.create_nodes(Request::new(create)).await.unwrap();
    }

    async fn audit(sim: &SimProvider) -> pb::AuditLog {
        sim.get_audit_log(Request::new(pb::AuditLogRequest::default()))
            .await
            .unwrap()
            .into_inner()
    }

    #[tokio::test]
    async fn deleting_a_node_already_gone_succeeds() {
        let sim = SimProvider::new();
        created(&sim, 2).await;
        let delete = || {
            sim.delete_nodes(Request::new(pb::DeleteNodesRequest {
                token: token(5),
                node_ids: vec!["worker-1".into()],
            }))
        };
        delete().await.unwrap();
        let again = delete().await.unwrap().into_inner();
        let ids: Vec<&str> = again.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["control-0", "worker-0"]);
        let log = audit(&sim).await;
        assert!(
            log.entries[2].detail.contains("already gone: worker-1"),
            "{log:?}"
        );
    }

    #[tokio::test]
    async fn a_partial_call_does_some_nodes_then_fails_and_a_retry_completes() {
        let sim = faulty("CreateNodes:partial=1");
        let create = pb::CreateNodesRequest {
            token: token(5),
            control_nodes: 1,
            worker_nodes: 3,
            ..Default::default()
        };
        let cut = sim
            .create_nodes(Request::new(create.clone()))
            .await
            .unwrap_err();
        assert_eq!(cut.code(), tonic::Code::Unavailable);
        let log = audit(&sim).await;
        assert!(log.entries[0].error.contains("partial"), "{log:?}");
        assert_eq!(log.injected["CreateNodes/partial"], 1);
        let describe = pb::DescribeClusterRequest {
            cluster_uid: "u1".into(),
            token: None,
        };
        let half = sim.describe_cluster(Request::new(describe.clone())).await;
        assert_eq!(half.unwrap().into_inner().nodes.len(), 2);
        sim.configure(Request::new(pb::SimulatorConfig {
            faults: Some(String::new()),
            ..Default::default()
        }))
        .await
        .unwrap();
        sim.create_nodes(Request::new(create)).await.unwrap();
        let whole = sim.describe_cluster(Request::new(describe)).await;
        assert_eq!(whole.unwrap().into_inner().nodes.len(), 4);
    }

    #[tokio::test]
    async fn a_call_admitted_before_a_fence_lands_after_it_even_without_its_caller() {
        let sim = SimProvider::new();
        created(&sim, 1).await;
        sim.configure(Request::new(pb::SimulatorConfig {
            faults: Some("StopNodes:late=1".into()),
            fault_delay_ms: Some(300),
            ..Default::default()
        }))
        .await
        .unwrap();
        let caller = {
            let sim = sim.clone();
            tokio::spawn(async move {
                sim.stop_nodes(Request::new(pb::PowerRequest { token: token(5) }))
                    .await
            })
        };
        // Admitted (the fence is checked on entry), not landed yet: it lands
        // 150 ms to 300 ms after admission.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(audit(&sim)
            .await
            .entries
            .iter()
            .all(|e| e.method != "StopNodes"));
        let fence = pb::DescribeClusterRequest {
            cluster_uid: "u1".into(),
            token: token(9),
        };
        sim.describe_cluster(Request::new(fence)).await.unwrap();
        caller.abort();
        let mut landed = None;
        for _ in 0..100 {
            landed = audit(&sim)
                .await
                .entries
                .into_iter()
                .find(|e| e.method == "StopNodes");
            if landed.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let landed = landed.expect("the late call landed");
        assert_eq!(landed.token.as_ref().unwrap().epoch, 5);
        assert_eq!(landed.newest_epoch_at_landing, 9);
        assert!(landed.landed_at_ms > landed.admitted_at_ms, "{landed:?}");
    }

    #[tokio::test]
    async fn a_describe_can_fail_at_random() {
        let sim = faulty("DescribeCluster:error=1");
        let describe = pb::DescribeClusterRequest {
            cluster_uid: "u1".into(),
            token: None,
        };
        let failed = sim.describe_cluster(Request::new(describe)).await;
        assert_eq!(failed.unwrap_err().code(), tonic::Code::Unavailable);
        let bad = sim
            .configure(Request::new(pb::SimulatorConfig {
                faults: Some("*:error=3".into()),
                ..Default::default()
            }))
            .await
            .unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    }
}
