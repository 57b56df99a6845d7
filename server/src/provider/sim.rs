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
//! - A mutating call whose deadline (gRPC or `drover-apply-by`) has passed
//!   by the time it would be admitted applies nothing (DEADLINE_EXCEEDED).
//! - ValidateSpec refuses node counts outside its capabilities, naming the
//!   field.
//! - A newer epoch drains older ones: the call that raises a cluster's
//!   newest epoch ends, before it goes on, every call admitted under an
//!   older epoch that has not landed yet (ABORTED, "superseded by epoch N";
//!   it applies nothing, ever) and stops every task run started under one
//!   (its RunTask reports STOPPED, as after StopTask). Calls and runs of
//!   other clusters, or under the newest epoch itself, go on.
//!
//! # Caveats
//! - A call drawn to land late (fault kind `late`) lands even if its caller
//!   went away, as a real provider's admitted call would; the audit log
//!   shows it, with its admission and landing times.
//! - A call that hangs (fault kind `hang`) or waits out its latency has not
//!   been admitted: it is never drained, and never applies anything either
//!   (a token older than the newest by then is refused once it goes on).
//! - Step latency is work that goes on across repeated calls, as the
//!   contract asks of work longer than one deadline: the first call of a
//!   step (its cluster, method, operation and request, whatever the epoch)
//!   starts it; a call whose deadline comes first answers
//!   DEADLINE_EXCEEDED having applied nothing, and the same call sent
//!   again, by this owner or by the next one, waits only for what is left
//!   and then applies, once. Work done and not asked for again for
//!   [`FORGET_WORK_AFTER`] is forgotten.

pub mod faults;
pub mod flags;

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

/// How long a step's work done is remembered for a call sent again.
pub const FORGET_WORK_AFTER: Duration = Duration::from_secs(300);

/// How long before its gRPC deadline a late call lands.
const LAND_BEFORE_DEADLINE: Duration = Duration::from_millis(5);

/// The time left of a request's deadline (see
/// [`drover_proto::provider::deadline`]).
fn time_left<T>(request: &Request<T>) -> Option<Duration> {
    drover_proto::provider::deadline::time_left(request.metadata())
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
    /// The token it was started under, for the drain of older epochs.
    token: pb::FencingToken,
    outcome: Option<pb::RunTaskResponse>,
    stop: tokio::sync::watch::Sender<bool>,
    /// What GetTaskProgress reports: the type, and the time gone by since
    /// the first call over the task latency then.
    task_type: String,
    started: tokio::time::Instant,
    latency: Duration,
}

impl SimRun {
    /// Ends the run STOPPED unless it already ended.
    fn stop(&mut self) {
        if self.outcome.is_none() {
            self.outcome = Some(run_outcome("STOPPED", String::new()));
        }
        self.stop.send_replace(true);
    }

    /// How far the run has got at `now`: the time it has been going over
    /// its latency, below 100 until it ends DONE (a run stopped or hung
    /// never gets there).
    fn progress(&self, now: tokio::time::Instant) -> pb::TaskProgress {
        let percent = match &self.outcome {
            Some(outcome) if outcome.status == "DONE" => 100,
            _ => {
                let going = now.saturating_duration_since(self.started).as_millis();
                let latency = self.latency.as_millis().max(1);
                (going * 100 / latency).min(99) as u32
            }
        };
        let doing = match self.task_type.as_str() {
            "repair" => "repairing".to_string(),
            "backup" => "backing up".to_string(),
            other => format!("running {other}"),
        };
        pb::TaskProgress {
            percent: Some(percent),
            message: format!("{doing}: {percent}%"),
        }
    }
}

/// One step's work at the provider, the same whichever owner asks (see
/// [`SimProvider::work_through`]): the cluster, the method, the operation
/// and the request without its token.
#[derive(Clone, PartialEq, Eq, Hash)]
struct WorkKey {
    cluster_uid: String,
    method: &'static str,
    operation_id: String,
    request: Vec<u8>,
}

/// The key of the work `request` asks for, its token aside.
fn work_of<M: prost::Message + Clone>(
    request: &M,
    token: impl FnOnce(&mut M) -> &mut Option<pb::FencingToken>,
) -> Vec<u8> {
    let mut request = request.clone();
    *token(&mut request) = None;
    request.encode_to_vec()
}

/// The answer to a mutating call.
type Answer = Result<pb::NodesResponse, Status>;

/// A call admitted and not landed yet (fault kind `late`): what a newer
/// epoch needs to end it.
struct LateCall {
    token: pb::FencingToken,
    admitted_at: u64,
    answer: tokio::sync::oneshot::Sender<Answer>,
    /// The task that lands it when its time comes.
    landing: tokio::task::AbortHandle,
}

#[derive(Default)]
struct State {
    clusters: HashMap<String, SimCluster>,
    newest_epoch: HashMap<String, i64>,
    runs: HashMap<String, SimRun>,
    /// Calls admitted that land later, by admission number.
    late: HashMap<u64, LateCall>,
    /// Late calls admitted so far: the last one's number.
    admitted: u64,
    step_latency: Duration,
    /// When each step's work started with its first call is done.
    work: HashMap<WorkKey, tokio::time::Instant>,
    task_latency: Duration,
    /// Faults armed for the nth next call of a method.
    armed: Vec<pb::Fault>,
    /// The seeded random faults.
    faults: Faults,
    audit: Vec<pb::AuditEntry>,
    /// What ValidateSpec accepts (and GetCapabilities reports).
    known: Known,
}

/// The versions and node offerings the simulator says it builds; an empty
/// list means any, so a simulator told nothing accepts every shape.
#[derive(Default, Clone)]
pub struct Known {
    pub versions: Vec<String>,
    pub offerings: Vec<String>,
}

impl Known {
    /// What is wrong with `shape` for a provider that builds only these.
    fn violations(&self, shape: &pb::ClusterShape) -> Vec<pb::SpecViolation> {
        let unknown = |field: &str, what: &str, value: &str, known: &[String]| {
            (!known.is_empty() && !known.iter().any(|k| k == value)).then(|| pb::SpecViolation {
                field: field.into(),
                reason: format!(
                    "{what} {value:?} is not one this provider builds ({})",
                    known.join(", ")
                ),
            })
        };
        [
            unknown("version", "version", &shape.version, &self.versions),
            unknown(
                "node_offering",
                "node offering",
                &shape.offering,
                &self.offerings,
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
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

    /// Makes ValidateSpec refuse versions and offerings not in `known`.
    pub fn knowing(self, known: Known) -> Self {
        self.lock().known = known;
        self
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
    /// records it as the newest, draining the older epochs' calls and runs
    /// when it is newer; the caller holds the state lock, so the check, the
    /// drain and what follows are atomic.
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
        if newest != Some(token.epoch) {
            Self::drain(state, token);
        }
        state
            .newest_epoch
            .insert(token.cluster_uid.clone(), token.epoch);
        Ok(())
    }

    /// Ends what is still going under an epoch older than `newer`'s for
    /// its cluster, before the call that brought `newer` goes on: a new
    /// owner's first call must not have its predecessor's late call land
    /// after it (a resumed step beside the one it resumes). Late calls end
    /// ABORTED without landing (their landing task is cancelled, and
    /// would find nothing to land); task runs end STOPPED.
    fn drain(state: &mut State, newer: &pb::FencingToken) {
        let older = |token: &pb::FencingToken| {
            token.cluster_uid == newer.cluster_uid && token.epoch < newer.epoch
        };
        let superseded: Vec<u64> = state
            .late
            .iter()
            .filter(|(_, call)| older(&call.token))
            .map(|(number, _)| *number)
            .collect();
        for call in superseded.iter().filter_map(|n| state.late.remove(n)) {
            call.landing.abort();
            let _ = call.answer.send(Err(Status::aborted(format!(
                "superseded by epoch {} for cluster {}: the call under epoch {} was not applied",
                newer.epoch, newer.cluster_uid, call.token.epoch
            ))));
        }
        for run in state.runs.values_mut().filter(|run| older(&run.token)) {
            run.stop();
        }
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
    /// to land late, after a delay, unless a newer epoch drains it first. A
    /// late call that carries a gRPC deadline (`due`: the time left at
    /// entry) lands just before it, the latest a provider that honours
    /// deadlines may apply it.
    async fn mutate<F>(
        &self,
        method: &'static str,
        token: Option<pb::FencingToken>,
        (due, work): (Option<Duration>, Vec<u8>),
        apply: F,
    ) -> Result<pb::NodesResponse, Status>
    where
        F: FnOnce(&mut SimCluster, bool) -> Result<Landed, Status> + Send + 'static,
    {
        let due_at = due.map(|left| tokio::time::Instant::now() + left);
        let token = checked_token(token)?;
        let work = WorkKey {
            cluster_uid: token.cluster_uid.clone(),
            method,
            operation_id: token.operation_id.clone(),
            request: work,
        };
        self.work_through(work, due_at).await?;
        let draw = self
            .on_entry(method, MULTI_NODE.contains(&method), true)
            .await?;
        // Applies nothing after its deadline: a caller past it may no
        // longer own the cluster.
        if due_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
            return Err(Status::deadline_exceeded(format!(
                "{method}: the call's deadline (grpc-timeout or {}) passed before it applied",
                crate::provider::APPLY_BY
            )));
        }
        let Some(delay) = draw.late else {
            let mut state = self.lock();
            Self::fence(&mut state, &token)?;
            return Self::land(&mut state, method, token, None, draw.partial, apply);
        };
        let lands_at = match due_at {
            Some(at) => at.checked_sub(LAND_BEFORE_DEADLINE).unwrap_or(at),
            None => tokio::time::Instant::now() + delay,
        };
        let answered = {
            let mut state = self.lock();
            Self::fence(&mut state, &token)?;
            state.admitted += 1;
            let number = state.admitted;
            // Detached from the request: the effect lands even if the caller
            // has gone away (timed out, or its process died) in the meantime.
            let sim = self.clone();
            let landing = tokio::spawn(async move {
                tokio::time::sleep_until(lands_at).await;
                sim.land_late(number, method, draw.partial, apply);
            });
            let (answer, answered) = tokio::sync::oneshot::channel();
            let call = LateCall {
                token,
                admitted_at: now_ms(),
                answer,
                landing: landing.abort_handle(),
            };
            state.late.insert(number, call);
            answered
        };
        answered
            .await
            .map_err(|_| Status::internal(format!("{method}: the late call was lost")))?
    }

    /// Waits until the step's work (`step_latency`) is done, or answers
    /// DEADLINE_EXCEEDED at the call's deadline if that comes first. The
    /// work started with the step's first call and goes on without a
    /// caller, so a call sent again after a cut waits only for what is
    /// left: a step may take many times one claim's window.
    async fn work_through(
        &self,
        work: WorkKey,
        due_at: Option<tokio::time::Instant>,
    ) -> Result<(), Status> {
        let now = tokio::time::Instant::now();
        let (method, done_at) = {
            let mut state = self.lock();
            if state.step_latency.is_zero() {
                return Ok(());
            }
            state.work.retain(|_, done| *done + FORGET_WORK_AFTER > now);
            let done_at = now + state.step_latency;
            (work.method, *state.work.entry(work).or_insert(done_at))
        };
        match due_at {
            Some(due) if due < done_at => {
                tokio::time::sleep_until(due).await;
                Err(Status::deadline_exceeded(format!(
                    "{method}: the work goes on ({} ms left) but the call's deadline passed; nothing applied yet: send it again",
                    done_at.saturating_duration_since(due).as_millis()
                )))
            }
            _ => {
                tokio::time::sleep_until(done_at).await;
                Ok(())
            }
        }
    }

    /// Lands late call `number` now, unless a newer epoch drained it
    /// meanwhile (it is gone from the calls in flight then, its answer sent).
    fn land_late<F>(&self, number: u64, method: &'static str, partial: bool, apply: F)
    where
        F: FnOnce(&mut SimCluster, bool) -> Result<Landed, Status>,
    {
        let mut state = self.lock();
        let Some(call) = state.late.remove(&number) else {
            return;
        };
        let admitted_at = Some(call.admitted_at);
        let landed = Self::land(&mut state, method, call.token, admitted_at, partial, apply);
        let _ = call.answer.send(landed);
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
    let id = format!("{role}-{index}");
    pb::ProviderNode {
        // As a real provider's: where to reach the node.
        facts: [("address".to_string(), format!("{id}.simulated:5432"))].into(),
        id,
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
        let (token, work) = (r.token.clone(), work_of(&r, |r| &mut r.token));
        self.mutate(
            "CreateNodes",
            token,
            (due, work),
            move |cluster, partial| Ok(create(cluster, &r, partial)),
        )
        .await
        .map(Response::new)
    }

    async fn start_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        let work = work_of(&r, |r| &mut r.token);
        self.mutate("StartNodes", r.token, (due, work), |c, partial| {
            set_power(c, true, partial)
        })
        .await
        .map(Response::new)
    }

    async fn stop_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        let work = work_of(&r, |r| &mut r.token);
        self.mutate("StopNodes", r.token, (due, work), |c, partial| {
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
        let (token, work) = (r.token.clone(), work_of(&r, |r| &mut r.token));
        self.mutate(
            "DeleteNodes",
            token,
            (due, work),
            move |cluster, partial| Ok(delete(cluster, &r.node_ids, partial)),
        )
        .await
        .map(Response::new)
    }

    async fn resize_nodes(
        &self,
        request: Request<pb::ResizeNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        let (token, work) = (r.token.clone(), work_of(&r, |r| &mut r.token));
        self.mutate(
            "ResizeNodes",
            token,
            (due, work),
            move |cluster, partial| resize(cluster, &r, partial),
        )
        .await
        .map(Response::new)
    }

    async fn upgrade_node(
        &self,
        request: Request<pb::UpgradeNodeRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        let (token, work) = (r.token.clone(), work_of(&r, |r| &mut r.token));
        self.mutate("UpgradeNode", token, (due, work), move |cluster, _| {
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
            let latency = state.task_latency;
            let run = state
                .runs
                .entry(r.run_id.clone())
                .or_insert_with(|| SimRun {
                    token: token.clone(),
                    outcome: None,
                    stop: tokio::sync::watch::channel(false).0,
                    task_type: r.task_type.clone(),
                    started: tokio::time::Instant::now(),
                    latency,
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
                _ = tokio::time::sleep(latency) => pb::RunTaskResponse {
                    report: done_report(&r.task_type, r.spec.as_ref()),
                    ..run_outcome("DONE", String::new())
                },
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
        state
            .runs
            .get_mut(&r.run_id)
            .ok_or_else(|| Status::not_found(format!("run {} is unknown", r.run_id)))?
            .stop();
        Ok(Response::new(pb::StopTaskResponse {}))
    }

    /// Not fenced, not audited (Drover asks every few seconds), no faults:
    /// seeded fault plans draw the same faults as before it existed.
    async fn get_task_progress(
        &self,
        request: Request<pb::GetTaskProgressRequest>,
    ) -> Reply<pb::TaskProgress> {
        let r = request.into_inner();
        let state = self.lock();
        let run = state
            .runs
            .get(&r.run_id)
            .filter(|run| run.token.cluster_uid == r.cluster_uid)
            .ok_or_else(|| Status::not_found(format!("run {} is unknown", r.run_id)))?;
        Ok(Response::new(run.progress(tokio::time::Instant::now())))
    }

    async fn repair_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = time_left(&request);
        let r = request.into_inner();
        let work = work_of(&r, |r| &mut r.token);
        let only = r.node_ids;
        self.mutate("RepairNodes", r.token, (due, work), move |c, _| {
            Ok(repair(c, &only))
        })
        .await
        .map(Response::new)
    }

    /// Refuses node counts outside [`capabilities`], and versions and
    /// offerings other than those it was told (any, when told none).
    async fn validate_spec(
        &self,
        request: Request<pb::ValidateSpecRequest>,
    ) -> Reply<pb::ValidateSpecResponse> {
        self.on_entry("ValidateSpec", false, false).await?;
        let shape = request.into_inner().shape.unwrap_or_default();
        let known = self.lock().known.clone();
        let mut violations = violations(&capabilities(&known), &shape);
        violations.extend(known.violations(&shape));
        Ok(Response::new(pb::ValidateSpecResponse { violations }))
    }

    async fn get_capabilities(
        &self,
        _request: Request<pb::GetCapabilitiesRequest>,
    ) -> Reply<pb::Capabilities> {
        self.on_entry("GetCapabilities", false, false).await?;
        let known = self.lock().known.clone();
        Ok(Response::new(capabilities(&known)))
    }
}

/// What the simulator builds: the node counts Drover's own validation
/// allows, the versions and offerings it was told (any, when none), both
/// task types.
fn capabilities(known: &Known) -> pb::Capabilities {
    pb::Capabilities {
        kind: "simulator".into(),
        versions: known.versions.clone(),
        offerings: known.offerings.clone(),
        max_control_nodes: 7,
        min_control_nodes: 1,
        max_worker_nodes: 1000,
        task_types: vec!["repair".into(), "backup".into()],
        replace_workers: true,
        ..Default::default()
    }
}

/// Why `shape` is outside the node counts `caps` allows (a max of 0 is no
/// limit).
fn violations(caps: &pb::Capabilities, shape: &pb::ClusterShape) -> Vec<pb::SpecViolation> {
    let counts = [
        (
            "control_nodes",
            shape.control_nodes,
            caps.min_control_nodes,
            caps.max_control_nodes,
        ),
        (
            "worker_nodes",
            shape.worker_nodes,
            caps.min_worker_nodes,
            caps.max_worker_nodes,
        ),
    ];
    counts
        .into_iter()
        .filter(|(_, n, min, max)| n < min || (*max > 0 && n > max))
        .map(|(field, n, min, max)| pb::SpecViolation {
            field: field.to_string(),
            reason: format!("{n} is outside {min}..={max}"),
        })
        .collect()
}

fn run_outcome(status: &str, error: String) -> pb::RunTaskResponse {
    pb::RunTaskResponse {
        status: status.to_string(),
        error,
        report: String::new(),
    }
}

/// What a simulated run that ended DONE reports: where a backup went (its
/// declared locations), what a repair looked at.
fn done_report(task_type: &str, spec: Option<&drover_proto::v1::TaskSpec>) -> String {
    use drover_proto::v1::task_spec::Properties;
    match spec.and_then(|s| s.properties.as_ref()) {
        Some(Properties::Backup(backup)) => {
            format!("simulated backup to {}", backup.location.join(", "))
        }
        Some(Properties::Repair(_)) => "simulated repair: nothing to fix".into(),
        None => format!("simulated {task_type} run (no spec sent)"),
    }
}

/// Replaces every node that is off or unhealthy by a working one, as a
/// real provider would restart or rebuild it.
/// Powers on and heals the nodes not ready among `only` (every node when
/// empty).
fn repair(cluster: &mut SimCluster, only: &[String]) -> Landed {
    let mut repaired = Vec::new();
    for node in &mut cluster.nodes {
        let named = only.is_empty() || only.contains(&node.id);
        if named && !crate::provider::node_ready(node) {
            node.power_state = "on".to_string();
            node.healthy = true;
            repaired.push(node.id.clone());
        }
    }
    Landed::Done(format!("repaired [{}]", repaired.join(", ")))
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
        if let Some(versions) = config.versions {
            state.known.versions = versions.names;
        }
        if let Some(offerings) = config.offerings {
            state.known.offerings = offerings.names;
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
        if r.lost {
            if r.node_ids.is_empty() {
                return Err(Status::invalid_argument("node_ids: name the nodes lost"));
            }
            cluster.nodes.retain(|node| !r.node_ids.contains(&node.id));
        }
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

/// Why the simulator stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves the simulator (Provider + Simulator + health + reflection) on
/// `listener`.
pub async fn serve(
    provider: SimProvider,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_secured(provider, listener, Security::default(), shutdown).await
}

/// How the simulator's port is secured, so Drover's links to a provider
/// over TLS, mutual TLS and with a bearer token can be tested for real.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// TLS, and client certificates when it names a client CA.
    pub tls: Option<crate::config::ServerTls>,
    /// The token every Provider call must carry as `authorization: Bearer
    /// <token>` (UNAUTHENTICATED otherwise). The Simulator control service
    /// and health checks need none: they are the test's, not Drover's.
    pub token: Option<crate::config::Secret<String>>,
}

/// Refuses a Provider call without the expected bearer token.
#[derive(Clone)]
struct RequireToken(Option<crate::config::Secret<String>>);

impl tonic::service::Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(given) if given == token.expose() => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong bearer token")),
            None => Err(Status::unauthenticated("a bearer token is required")),
        }
    }
}

/// [`serve`] with TLS and a required token as `security` says.
pub async fn serve_secured(
    provider: SimProvider,
    listener: tokio::net::TcpListener,
    security: Security,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    use drover_proto::provider::v1::{
        provider_server::ProviderServer, simulator_server::SimulatorServer,
    };
    use tonic::server::NamedService;
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let mut builder = tonic::transport::Server::builder().trace_fn(drover_telemetry::server_span);
    if let Some(tls) = &security.tls {
        builder = builder.tls_config(tls.config())?;
    }
    // So that a person can drive it with grpcurl or grpcui without the
    // proto files; it lists only the services served here, not the rest
    // of Drover's API sharing the descriptor set.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(drover_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(ProviderServer::<SimProvider>::NAME)
        .with_service_name(SimulatorServer::<SimProvider>::NAME)
        .with_service_name(tonic_health::pb::health_server::HealthServer::<
            tonic_health::server::HealthService,
        >::NAME)
        .build_v1()?;
    let checked = ProviderServer::with_interceptor(provider.clone(), RequireToken(security.token));
    builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(checked)
        .add_service(SimulatorServer::new(provider))
        .serve_with_incoming_shutdown(crate::net::incoming(listener), shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Drover sends is read back as the deadline it meant.
    #[test]
    fn a_call_due_by_a_deadline_reads_as_its_time_left() {
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
            .stop_nodes(Request::new(pb::PowerRequest {
                node_ids: Vec::new(),
                token: token(4),
            }))
            .await
            .unwrap_err();
        assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
        sim.stop_nodes(Request::new(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(5),
        }))
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
            .stop_nodes(Request::new(pb::PowerRequest {
                node_ids: Vec::new(),
                token: token(5),
            }))
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
        let start = || {
            sim.start_nodes(Request::new(pb::PowerRequest {
                node_ids: Vec::new(),
                token: token(1),
            }))
        };
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
    async fn a_call_past_its_apply_by_applies_nothing() {
        let sim = SimProvider::new();
        created(&sim, 1).await;
        let mut request = Request::new(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(5),
        });
        let past = (now_ms() - 1_000).to_string().parse().unwrap();
        request
            .metadata_mut()
            .insert(crate::provider::APPLY_BY, past);
        let refused = sim.stop_nodes(request).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::DeadlineExceeded, "{refused:?}");
        let nodes = nodes_of(&sim, "u1").await;
        assert!(nodes.iter().all(|n| n.power_state == "on"), "{nodes:?}");
    }

    /// A call due in 0.5 s for a step of 1.2 s of work is cut twice, then
    /// the third, sent by the next owner, waits for the rest: it applies
    /// once.
    #[tokio::test]
    async fn work_longer_than_a_deadline_goes_on_across_repeated_calls() {
        let sim = SimProvider::new();
        created(&sim, 1).await;
        sim.configure(Request::new(pb::SimulatorConfig {
            step_latency_ms: Some(1_200),
            ..Default::default()
        }))
        .await
        .unwrap();
        let stop = |epoch| {
            let mut request = Request::new(pb::PowerRequest {
                node_ids: Vec::new(),
                token: token(epoch),
            });
            request
                .metadata_mut()
                .insert("grpc-timeout", "500m".parse().unwrap());
            sim.stop_nodes(request)
        };
        for _ in 0..2 {
            let cut = stop(5).await.unwrap_err();
            assert_eq!(cut.code(), tonic::Code::DeadlineExceeded, "{cut:?}");
            assert!(nodes_of(&sim, "u1")
                .await
                .iter()
                .all(|n| n.power_state == "on"));
        }
        let nodes = stop(6).await.unwrap().into_inner().nodes;
        assert!(nodes.iter().all(|n| n.power_state == "off"), "{nodes:?}");
        let stops = audit(&sim)
            .await
            .entries
            .iter()
            .filter(|e| e.method == "StopNodes")
            .count();
        assert_eq!(stops, 1, "applied once");
        // Another operation's stop is new work.
        let mut other = Request::new(pb::PowerRequest {
            node_ids: Vec::new(),
            token: Some(pb::FencingToken {
                operation_id: "op2".into(),
                ..token(6).unwrap()
            }),
        });
        other
            .metadata_mut()
            .insert("grpc-timeout", "500m".parse().unwrap());
        assert_eq!(
            sim.stop_nodes(other).await.unwrap_err().code(),
            tonic::Code::DeadlineExceeded
        );
    }

    #[tokio::test]
    async fn validate_spec_refuses_node_counts_outside_the_capabilities() {
        let sim = SimProvider::new();
        let validate = |control_nodes, worker_nodes| {
            let shape = pb::ClusterShape {
                control_nodes,
                worker_nodes,
                ..Default::default()
            };
            sim.validate_spec(Request::new(pb::ValidateSpecRequest {
                cluster_uid: String::new(),
                shape: Some(shape),
            }))
        };
        let fine = validate(3, 2).await.unwrap().into_inner();
        assert!(fine.violations.is_empty(), "{fine:?}");
        let bad = validate(8, 1001).await.unwrap().into_inner().violations;
        let fields: Vec<&str> = bad.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["control_nodes", "worker_nodes"]);
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

    /// `sim` with the cluster made under epoch 5, and StopNodes drawn to
    /// land `delay_ms` (at most) after admission.
    async fn with_late_stops(delay_ms: u64) -> SimProvider {
        let sim = SimProvider::new();
        created(&sim, 1).await;
        sim.configure(Request::new(pb::SimulatorConfig {
            faults: Some("StopNodes:late=1".into()),
            fault_delay_ms: Some(delay_ms),
            ..Default::default()
        }))
        .await
        .unwrap();
        sim
    }

    /// Sends StopNodes under `token` from a task of its own, and returns
    /// once the simulator admitted it (drew its late landing and checked
    /// its token: one step, as these tests run on one thread).
    async fn admitted_stop(
        sim: &SimProvider,
        token: Option<pb::FencingToken>,
    ) -> tokio::task::JoinHandle<Result<Response<pb::NodesResponse>, Status>> {
        let before = audit(sim).await.injected.get("StopNodes/late").copied();
        let caller = {
            let sim = sim.clone();
            tokio::spawn(async move {
                sim.stop_nodes(Request::new(pb::PowerRequest {
                    node_ids: Vec::new(),
                    token,
                }))
                .await
            })
        };
        let wanted = before.unwrap_or(0) + 1;
        for _ in 0..200 {
            if audit(sim).await.injected.get("StopNodes/late") == Some(&wanted) {
                return caller;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("StopNodes was not admitted within 1 s");
    }

    fn stops(log: &pb::AuditLog) -> Vec<&pb::AuditEntry> {
        log.entries
            .iter()
            .filter(|e| e.method == "StopNodes")
            .collect()
    }

    async fn nodes_of(sim: &SimProvider, uid: &str) -> Vec<pb::ProviderNode> {
        let describe = pb::DescribeClusterRequest {
            cluster_uid: uid.into(),
            token: None,
        };
        let nodes = sim.describe_cluster(Request::new(describe)).await;
        nodes.unwrap().into_inner().nodes
    }

    #[tokio::test]
    async fn a_call_admitted_late_lands_even_without_its_caller() {
        let sim = with_late_stops(300).await;
        let caller = admitted_stop(&sim, token(5)).await;
        assert!(stops(&audit(&sim).await).is_empty(), "not landed yet");
        caller.abort();
        let mut landed = None;
        for _ in 0..100 {
            landed = stops(&audit(&sim).await).first().map(|e| (*e).clone());
            if landed.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let landed = landed.expect("the late call landed");
        assert_eq!(landed.token.as_ref().unwrap().epoch, 5);
        assert!(landed.landed_at_ms > landed.admitted_at_ms, "{landed:?}");
        assert!(nodes_of(&sim, "u1")
            .await
            .iter()
            .all(|n| n.power_state == "off"));
    }

    #[tokio::test]
    async fn a_newer_epoch_ends_an_older_call_in_flight_before_it_answers() {
        // Lands 5 s to 10 s after admission, unless drained first.
        let sim = with_late_stops(10_000).await;
        let caller = admitted_stop(&sim, token(5)).await;
        let fence = pb::DescribeClusterRequest {
            cluster_uid: "u1".into(),
            token: token(6),
        };
        sim.describe_cluster(Request::new(fence)).await.unwrap();
        // Ended by the time the newer call answered: its answer is already
        // there, long before it would have landed.
        let ended = tokio::time::timeout(Duration::from_millis(500), caller).await;
        let superseded = ended.expect("ended at once").unwrap().unwrap_err();
        assert_eq!(superseded.code(), tonic::Code::Aborted, "{superseded:?}");
        assert!(
            superseded.message().contains("superseded by epoch 6"),
            "{superseded:?}"
        );
        // And it never lands: nothing of it in the nodes or the audit log.
        assert!(stops(&audit(&sim).await).is_empty());
        assert!(nodes_of(&sim, "u1")
            .await
            .iter()
            .all(|n| n.power_state == "on"));
    }

    #[tokio::test]
    async fn a_newer_mutating_call_drains_only_older_epochs_of_its_cluster() {
        let sim = with_late_stops(300).await;
        let u2 = Some(pb::FencingToken {
            cluster_uid: "u2".into(),
            epoch: 5,
            operation_id: "op".into(),
        });
        let other = pb::CreateNodesRequest {
            token: u2.clone(),
            control_nodes: 1,
            ..Default::default()
        };
        sim.create_nodes(Request::new(other)).await.unwrap();
        let old = admitted_stop(&sim, token(5)).await;
        let elsewhere = admitted_stop(&sim, u2).await;
        let started = sim
            .start_nodes(Request::new(pb::PowerRequest {
                node_ids: Vec::new(),
                token: token(6),
            }))
            .await;
        assert!(started.is_ok(), "{started:?}");
        let ended = tokio::time::timeout(Duration::from_millis(100), old).await;
        let old = ended.expect("ended at once").unwrap().unwrap_err();
        assert_eq!(old.code(), tonic::Code::Aborted, "{old:?}");
        // A call under the newest epoch is not drained by another one.
        let same_epoch = admitted_stop(&sim, token(6)).await;
        let fence = pb::DescribeClusterRequest {
            cluster_uid: "u1".into(),
            token: token(6),
        };
        sim.describe_cluster(Request::new(fence)).await.unwrap();
        same_epoch
            .await
            .unwrap()
            .expect("not drained by its own epoch");
        elsewhere
            .await
            .unwrap()
            .expect("not drained by another cluster");
        let log = audit(&sim).await;
        let landed: Vec<(&str, i64)> = stops(&log)
            .iter()
            .map(|e| {
                let token = e.token.as_ref().unwrap();
                (token.cluster_uid.as_str(), token.epoch)
            })
            .collect();
        assert_eq!(landed, [("u2", 5), ("u1", 6)]);
    }

    #[tokio::test]
    async fn a_newer_epoch_stops_an_older_task_run() {
        let sim = SimProvider::new();
        sim.configure(Request::new(pb::SimulatorConfig {
            task_latency_ms: Some(60_000),
            ..Default::default()
        }))
        .await
        .unwrap();
        let run = |epoch, run_id: &str| {
            let sim = sim.clone();
            let request = pb::RunTaskRequest {
                token: token(epoch),
                task_type: "backup".into(),
                task_name: "nightly".into(),
                run_id: run_id.into(),
                spec: None,
            };
            tokio::spawn(async move { sim.run_task(Request::new(request)).await })
        };
        let sim_ref = &sim;
        let started = |runs: usize| async move {
            for _ in 0..200 {
                if audit(sim_ref).await.entries.len() == runs {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("{runs} runs did not start within 1 s");
        };
        let old = run(5, "old");
        started(1).await;
        let fence = |epoch| {
            sim.describe_cluster(Request::new(pb::DescribeClusterRequest {
                cluster_uid: "u1".into(),
                token: token(epoch),
            }))
        };
        fence(6).await.unwrap();
        let ended = tokio::time::timeout(Duration::from_millis(100), old).await;
        let outcome = ended.expect("stopped at once").unwrap().unwrap();
        assert_eq!(outcome.into_inner().status, "STOPPED");
        // A run under the newest epoch goes on.
        let mut current = run(6, "current");
        started(2).await;
        fence(6).await.unwrap();
        let going = tokio::time::timeout(Duration::from_millis(100), &mut current).await;
        assert!(going.is_err(), "{going:?}");
        current.abort();
    }

    /// Progress is the time gone by over the task latency, below 100 until
    /// the run ends DONE; an unknown run, or one of another cluster, is
    /// NOT_FOUND.
    #[tokio::test]
    async fn a_run_reports_progress_from_its_latency() {
        let started = tokio::time::Instant::now();
        let mut run = SimRun {
            token: token(1).unwrap(),
            outcome: None,
            stop: tokio::sync::watch::channel(false).0,
            task_type: "repair".into(),
            started,
            latency: Duration::from_secs(10),
        };
        let at = |secs| started + Duration::from_secs(secs);
        let progress = run.progress(at(4));
        assert_eq!(progress.percent, Some(40));
        assert_eq!(progress.message, "repairing: 40%");
        assert_eq!(run.progress(at(30)).percent, Some(99));
        run.stop();
        assert_eq!(run.progress(at(30)).percent, Some(99));
        run.outcome = Some(run_outcome("DONE", String::new()));
        assert_eq!(run.progress(at(5)).message, "repairing: 100%");

        let sim = SimProvider::new();
        let request = pb::RunTaskRequest {
            token: token(1),
            task_type: "backup".into(),
            task_name: "nightly".into(),
            run_id: "r1".into(),
            spec: None,
        };
        sim.run_task(Request::new(request)).await.unwrap();
        let ask = |cluster_uid: &str, run_id: &str| {
            sim.get_task_progress(Request::new(pb::GetTaskProgressRequest {
                cluster_uid: cluster_uid.into(),
                run_id: run_id.into(),
            }))
        };
        let done = ask("u1", "r1").await.unwrap().into_inner();
        assert_eq!(done.message, "backing up: 100%");
        for (uid, run_id) in [("u1", "r2"), ("u2", "r1")] {
            let unknown = ask(uid, run_id).await.unwrap_err();
            assert_eq!(unknown.code(), tonic::Code::NotFound, "{uid} {run_id}");
        }
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
