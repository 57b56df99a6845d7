//! The gRPC service: fencing, draining and deadlines around the calls of
//! [`crate::lifecycle`], validation, capabilities and task runs.

use crate::config::Config;
use crate::lifecycle;
use crate::ops::Ctx;
use crate::store::{ClusterRecord, RunRecord, Store, StoreError};
use crate::{pg, tasks, Inner};
use drover_proto::provider::v1::{self as pb, provider_server::Provider};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

type Reply<T> = Result<Response<T>, Status>;

/// A task run in progress: its stop signal and, once ended, its outcome.
struct Run {
    uid: String,
    epoch: i64,
    stop: watch::Sender<bool>,
    outcome: watch::Receiver<Option<pb::RunTaskResponse>>,
}

/// The provider; clones share everything.
#[derive(Clone)]
pub struct PostgresProvider {
    inner: Arc<Inner>,
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    runs: Arc<Mutex<HashMap<String, Run>>>,
    calls: Arc<AtomicU64>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Pg(#[from] crate::pg::PgError),
}

/// A fenced call's work on its cluster, under the cluster's lock.
enum Op {
    Create(pb::CreateNodesRequest),
    Start,
    Stop,
    Delete(Vec<String>),
    Resize(Option<u32>, Option<String>),
    Upgrade(String, String),
    /// The nodes named (empty: every node that needs it).
    Repair(Vec<String>),
    Describe,
}

impl PostgresProvider {
    /// Opens (or creates) the root: its directories and the state store.
    pub fn open(cfg: Config) -> Result<Self, OpenError> {
        let pg = pg::Pg::new(&cfg.run_as)?;
        for dir in [
            cfg.root.clone(),
            cfg.root.join("clusters"),
            cfg.root.join("logs"),
        ] {
            pg.make_dir(&dir)?;
        }
        let store = Store::open(&cfg.root.join("state.redb"))?;
        for (call, what) in store.calls_in_flight()? {
            tracing::warn!(call, what, "a call was in flight when the provider stopped");
            store.end_call(&call)?;
        }
        Ok(Self {
            inner: Arc::new(Inner { cfg, pg, store }),
            locks: Arc::default(),
            runs: Arc::default(),
            calls: Arc::default(),
        })
    }

    /// Checks `token` against the newest epoch of its cluster and records
    /// it; a newer epoch stops the older epochs' task runs at once.
    fn fence(&self, token: &pb::FencingToken) -> Result<(), Status> {
        let old = self
            .inner
            .store
            .raise_epoch(&token.cluster_uid, token.epoch)?;
        if let Some(newest) = old.filter(|o| *o > token.epoch) {
            return Err(Status::failed_precondition(format!(
                "stale fencing token: epoch {} is older than {newest} for cluster {}",
                token.epoch, token.cluster_uid
            )));
        }
        if old.is_none_or(|o| o < token.epoch) {
            let runs = self.runs.lock().expect("runs lock");
            let older = runs
                .values()
                .filter(|r| r.uid == token.cluster_uid && r.epoch < token.epoch);
            older.for_each(|r| {
                let _ = r.stop.send(true);
            });
        }
        Ok(())
    }

    fn cluster_lock(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().expect("locks lock");
        locks.entry(uid.to_string()).or_default().clone()
    }

    /// Runs a fenced call: fence, then the cluster's lock (the drain: an
    /// older call holding it runs to its end first), the fence again (a
    /// newer epoch may have come while it waited: then it applies nothing),
    /// then the work, in a task of its own so a caller that goes away does
    /// not cut a step in half. Answers with every node as the call left
    /// them.
    async fn fenced(
        &self,
        method: &str,
        token: Option<pb::FencingToken>,
        due: Option<Instant>,
        op: Op,
    ) -> Reply<pb::NodesResponse> {
        let token = checked_token(token)?;
        self.fence(&token)?;
        let this = self.clone();
        let key = format!(
            "{}/{}/{}/{method}#{}",
            token.cluster_uid,
            token.epoch,
            token.operation_id,
            self.calls.fetch_add(1, Ordering::Relaxed)
        );
        let work = async move {
            let lock = this.cluster_lock(&token.cluster_uid);
            let _held = match due {
                Some(due) => tokio::time::timeout_at(due.into(), lock.lock())
                    .await
                    .map_err(|_| {
                        Status::deadline_exceeded(
                            "deadline reached waiting for the cluster's call in progress; nothing applied",
                        )
                    })?,
                None => lock.lock().await,
            };
            let inner = &this.inner;
            let cluster = inner.store.cluster(&token.cluster_uid)?;
            let exists = cluster.is_some();
            let cluster = cluster.unwrap_or_else(|| ClusterRecord {
                uid: token.cluster_uid.clone(),
                ..Default::default()
            });
            let mut ctx = Ctx {
                inner,
                epoch: token.epoch,
                deadline: due,
                cluster,
            };
            ctx.admit()?;
            inner.store.begin_call(&key, "running")?;
            let result = apply(&mut ctx, exists, op).await;
            inner.store.end_call(&key)?;
            result?;
            let nodes = lifecycle::describe(inner, &token.cluster_uid).await?;
            Ok(Response::new(pb::NodesResponse { nodes }))
        };
        tokio::spawn(work)
            .await
            .map_err(|e| Status::internal(format!("call failed: {e}")))?
    }
}

async fn apply(ctx: &mut Ctx<'_>, exists: bool, op: Op) -> Result<(), Status> {
    let needs_cluster = !matches!(op, Op::Create(_) | Op::Delete(_) | Op::Describe);
    if needs_cluster && !exists {
        return Err(Status::not_found(format!(
            "cluster {} is unknown",
            ctx.cluster.uid
        )));
    }
    let destroys = matches!(&op, Op::Delete(ids) if ids.is_empty());
    if exists && !destroys && !matches!(op, Op::Describe) {
        ctx.reconcile_roles().await?;
    }
    match op {
        Op::Create(r) => {
            if !exists {
                ctx.cluster.version = r.version;
                ctx.cluster.offering = r.offering;
            }
            lifecycle::add_nodes(ctx, r.worker_nodes)?;
            lifecycle::converge(ctx).await
        }
        Op::Start => lifecycle::converge(ctx).await,
        Op::Repair(ids) => lifecycle::repair(ctx, &ids).await,
        Op::Stop => lifecycle::stop_all(ctx).await,
        Op::Delete(ids) if ids.is_empty() => match exists {
            true => lifecycle::destroy(ctx).await,
            false => Ok(()),
        },
        Op::Delete(ids) => delete_named(ctx, &ids).await,
        Op::Resize(workers, offering) => lifecycle::resize(ctx, workers, offering).await,
        Op::Upgrade(id, version) => lifecycle::upgrade(ctx, &id, &version).await,
        Op::Describe => Ok(()),
    }
}

async fn delete_named(ctx: &mut Ctx<'_>, ids: &[String]) -> Result<(), Status> {
    for id in ids {
        match ctx.node(id).map(|n| n.role) {
            // Already gone: deleting it again succeeds.
            None => continue,
            Some(crate::store::Role::Primary) => {
                return Err(Status::invalid_argument(format!(
                    "node_ids: {id} is the primary; only standbys can be deleted by name"
                )))
            }
            Some(crate::store::Role::Standby) => lifecycle::remove_standby(ctx, id).await?,
        }
    }
    Ok(())
}

fn checked_token(token: Option<pb::FencingToken>) -> Result<pb::FencingToken, Status> {
    let token = token.ok_or_else(|| Status::invalid_argument("token: is required"))?;
    if token.cluster_uid.is_empty() {
        return Err(Status::invalid_argument("token.cluster_uid: is required"));
    }
    Ok(token)
}

/// The end of a request's deadline: the earlier of its gRPC deadline and
/// Drover's wall-clock one, if it has either.
fn deadline<T>(request: &Request<T>) -> Option<Instant> {
    let left = drover_proto::provider::deadline::time_left(request.metadata())?;
    Some(Instant::now() + left)
}

impl PostgresProvider {
    /// Why `shape` cannot be built, field by field (empty: it can).
    fn violations(&self, shape: &pb::ClusterShape) -> Vec<pb::SpecViolation> {
        let cfg = &self.inner.cfg;
        let mut out = Vec::new();
        let mut refuse = |field: &str, reason: String| {
            out.push(pb::SpecViolation {
                field: field.into(),
                reason,
            })
        };
        if shape.control_nodes != 1 {
            refuse(
                "control_nodes",
                format!(
                    "a PostgreSQL cluster has exactly 1 primary, not {}",
                    shape.control_nodes
                ),
            );
        }
        if shape.worker_nodes > cfg.max_workers {
            refuse(
                "worker_nodes",
                format!(
                    "at most {} standbys, not {}",
                    cfg.max_workers, shape.worker_nodes
                ),
            );
        }
        if !cfg.offerings.contains_key(&shape.offering) {
            let known: Vec<&String> = cfg.offerings.keys().collect();
            refuse(
                "node_offering",
                format!("offering {:?} is unknown; known: {known:?}", shape.offering),
            );
        }
        if !cfg.versions.contains_key(&shape.version) {
            let known: Vec<&String> = cfg.versions.keys().collect();
            refuse(
                "version",
                format!(
                    "version {:?} is not configured; known: {known:?}",
                    shape.version
                ),
            );
        }
        out
    }

    fn refuse_invalid(&self, shape: pb::ClusterShape) -> Result<(), Status> {
        match self.violations(&shape).first() {
            Some(v) => Err(Status::invalid_argument(format!(
                "{}: {}",
                v.field, v.reason
            ))),
            None => Ok(()),
        }
    }

    fn shape_of(&self, uid: &str) -> Result<Option<pb::ClusterShape>, Status> {
        Ok(self.inner.store.cluster(uid)?.map(|c| pb::ClusterShape {
            control_nodes: 1,
            worker_nodes: c
                .nodes
                .iter()
                .filter(|n| n.role == crate::store::Role::Standby)
                .count() as u32,
            offering: c.offering.clone(),
            // What a standby added now would run (see `join_version`).
            version: c.join_version(),
        }))
    }
}

#[tonic::async_trait]
impl Provider for PostgresProvider {
    async fn create_nodes(
        &self,
        request: Request<pb::CreateNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        let r = request.into_inner();
        // The token first: a call without one is refused for that alone.
        checked_token(r.token.clone())?;
        self.refuse_invalid(pb::ClusterShape {
            control_nodes: r.control_nodes,
            worker_nodes: r.worker_nodes,
            offering: r.offering.clone(),
            version: r.version.clone(),
        })?;
        self.fenced("CreateNodes", r.token.clone(), due, Op::Create(r))
            .await
    }

    async fn start_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        self.fenced("StartNodes", request.into_inner().token, due, Op::Start)
            .await
    }

    async fn stop_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        self.fenced("StopNodes", request.into_inner().token, due, Op::Stop)
            .await
    }

    async fn delete_nodes(
        &self,
        request: Request<pb::DeleteNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        let r = request.into_inner();
        self.fenced("DeleteNodes", r.token, due, Op::Delete(r.node_ids))
            .await
    }

    async fn resize_nodes(
        &self,
        request: Request<pb::ResizeNodesRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        let r = request.into_inner();
        let uid = checked_token(r.token.clone())?.cluster_uid;
        if let Some(mut shape) = self.shape_of(&uid)? {
            shape.worker_nodes = r.worker_nodes.unwrap_or(shape.worker_nodes);
            shape.offering = r.offering.clone().unwrap_or(shape.offering);
            self.refuse_invalid(shape)?;
        }
        self.fenced(
            "ResizeNodes",
            r.token,
            due,
            Op::Resize(r.worker_nodes, r.offering),
        )
        .await
    }

    async fn upgrade_node(
        &self,
        request: Request<pb::UpgradeNodeRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        let r = request.into_inner();
        checked_token(r.token.clone())?;
        if !self.inner.cfg.versions.contains_key(&r.version) {
            return Err(Status::invalid_argument(format!(
                "version: {:?} is not configured",
                r.version
            )));
        }
        self.fenced(
            "UpgradeNode",
            r.token,
            due,
            Op::Upgrade(r.node_id, r.version),
        )
        .await
    }

    async fn describe_cluster(
        &self,
        request: Request<pb::DescribeClusterRequest>,
    ) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        let r = request.into_inner();
        if r.token.is_some() {
            return self
                .fenced("DescribeCluster", r.token, due, Op::Describe)
                .await;
        }
        let nodes = lifecycle::describe(&self.inner, &r.cluster_uid).await?;
        Ok(Response::new(pb::NodesResponse { nodes }))
    }

    async fn run_task(&self, request: Request<pb::RunTaskRequest>) -> Reply<pb::RunTaskResponse> {
        let r = request.into_inner();
        let token = checked_token(r.token.clone())?;
        if r.run_id.is_empty() {
            return Err(Status::invalid_argument("run_id: is required"));
        }
        self.fence(&token)?;
        let mut outcome = self.start_run(&token, &r)?;
        let ended = outcome
            .wait_for(|o| o.is_some())
            .await
            .map_err(|_| Status::internal("run lost"))?;
        Ok(Response::new(ended.clone().expect("waited for an outcome")))
    }

    async fn stop_task(
        &self,
        request: Request<pb::StopTaskRequest>,
    ) -> Reply<pb::StopTaskResponse> {
        let r = request.into_inner();
        let token = checked_token(r.token)?;
        self.fence(&token)?;
        if let Some(run) = self.runs.lock().expect("runs lock").get(&r.run_id) {
            let _ = run.stop.send(true);
            return Ok(Response::new(pb::StopTaskResponse {}));
        }
        match self.inner.store.run(&r.run_id)? {
            Some(_) => Ok(Response::new(pb::StopTaskResponse {})),
            None => Err(Status::not_found(format!("run {} is unknown", r.run_id))),
        }
    }

    /// pg_basebackup, VACUUM and amcheck are run to their end without
    /// reporting as they go: no progress to tell, so Drover shows none.
    async fn get_task_progress(
        &self,
        _request: Request<pb::GetTaskProgressRequest>,
    ) -> Reply<pb::TaskProgress> {
        Err(Status::unimplemented(
            "the postgres provider does not report task progress",
        ))
    }

    async fn repair_nodes(&self, request: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let due = deadline(&request);
        let r = request.into_inner();
        self.fenced("RepairNodes", r.token, due, Op::Repair(r.node_ids))
            .await
    }

    async fn validate_spec(
        &self,
        request: Request<pb::ValidateSpecRequest>,
    ) -> Reply<pb::ValidateSpecResponse> {
        let shape = request.into_inner().shape.unwrap_or_default();
        Ok(Response::new(pb::ValidateSpecResponse {
            violations: self.violations(&shape),
        }))
    }

    async fn get_capabilities(
        &self,
        _request: Request<pb::GetCapabilitiesRequest>,
    ) -> Reply<pb::Capabilities> {
        let cfg = &self.inner.cfg;
        Ok(Response::new(pb::Capabilities {
            kind: "postgres".into(),
            versions: cfg.versions.keys().cloned().collect(),
            offerings: cfg.offerings.keys().cloned().collect(),
            min_control_nodes: 1,
            max_control_nodes: 1,
            min_worker_nodes: 0,
            max_worker_nodes: cfg.max_workers,
            task_types: vec!["repair".into(), "backup".into()],
            upgrade_order: pb::UpgradeOrder::WorkersFirst as i32,
            // A bad standby is rebuilt in place by RepairNodes (a fresh
            // base backup): nothing a replacement would do better.
            replace_workers: false,
        }))
    }
}

/// Where a backup run writes, `None` for a repair; an unknown task type is
/// refused before anything about the run is recorded.
fn backup_dir_of(r: &pb::RunTaskRequest) -> Result<Option<PathBuf>, Status> {
    match r.task_type.as_str() {
        "backup" => Ok(Some(tasks::backup_dir(r.spec.as_ref())?)),
        "repair" => Ok(None),
        other => Err(Status::invalid_argument(format!(
            "task_type: {other:?} is not repair or backup"
        ))),
    }
}

fn outcome(status: &str, error: String, report: String) -> pb::RunTaskResponse {
    pb::RunTaskResponse {
        status: status.into(),
        error,
        report,
    }
}

impl PostgresProvider {
    /// The outcome watch of run `r.run_id`: a run already ended or in
    /// progress is joined, a new one is started (and recorded first).
    fn start_run(
        &self,
        token: &pb::FencingToken,
        r: &pb::RunTaskRequest,
    ) -> Result<watch::Receiver<Option<pb::RunTaskResponse>>, Status> {
        // Held until a new run is in `runs`, so two calls with one run id
        // start it once.
        let mut runs = self.runs.lock().expect("runs lock");
        if let Some(run) = runs.get(&r.run_id) {
            return Ok(run.outcome.clone());
        }
        let store = &self.inner.store;
        if let Some(record) = store.run(&r.run_id)? {
            let ended = self.recorded_outcome(&r.run_id, record)?;
            return Ok(watch::channel(Some(ended)).1);
        }
        let backup_to = backup_dir_of(r)?;
        let record = RunRecord {
            cluster_uid: token.cluster_uid.clone(),
            epoch: token.epoch,
            outcome: None,
        };
        store.put_run(&r.run_id, &record)?;
        Ok(self.spawn_run(&mut runs, &r.run_id, record, backup_to))
    }

    /// The outcome of run `run_id`, in the store but not in progress: the
    /// one it ended with, or an error if a restart of the provider cut it
    /// short, written to its record either way.
    fn recorded_outcome(
        &self,
        run_id: &str,
        mut record: RunRecord,
    ) -> Result<pb::RunTaskResponse, StoreError> {
        // Ended, or cut short by a restart of the provider: never run twice.
        let (status, error, report) = record.outcome.take().unwrap_or_else(|| {
            (
                "ERROR".into(),
                "the provider restarted during the run".into(),
                String::new(),
            )
        });
        let ended = outcome(&status, error, report);
        self.save_outcome(run_id, record, &ended)?;
        Ok(ended)
    }

    /// Enters run `run_id` in `runs` (where a newer epoch finds it to stop
    /// it) and runs its task in a tokio task of its own, so a caller that
    /// goes away does not cut it short. When the task ends or is stopped,
    /// its outcome is recorded, the run leaves `runs` and the watch
    /// returned gets the outcome.
    fn spawn_run(
        &self,
        runs: &mut HashMap<String, Run>,
        run_id: &str,
        record: RunRecord,
        backup_to: Option<PathBuf>,
    ) -> watch::Receiver<Option<pb::RunTaskResponse>> {
        let (stop, mut stopped) = watch::channel(false);
        let (done, outcome_rx) = watch::channel(None);
        runs.insert(
            run_id.to_string(),
            Run {
                uid: record.cluster_uid.clone(),
                epoch: record.epoch,
                stop,
                outcome: outcome_rx.clone(),
            },
        );
        let this = self.clone();
        let run_id = run_id.to_string();
        tokio::spawn(async move {
            let work = this.task(&record.cluster_uid, backup_to, &run_id);
            let ended = tokio::select! {
                result = work => match result {
                    Ok(report) => outcome("DONE", String::new(), report),
                    Err(e) => outcome("ERROR", e.message().to_string(), String::new()),
                },
                _ = stopped.wait_for(|s| *s) => outcome("STOPPED", String::new(), String::new()),
            };
            if let Err(e) = this.save_outcome(&run_id, record, &ended) {
                tracing::error!(run_id, error = %e, "could not record a run's outcome");
            }
            this.runs.lock().expect("runs lock").remove(&run_id);
            let _ = done.send(Some(ended));
        });
        outcome_rx
    }

    /// Writes `record` back with `ended` as its outcome.
    fn save_outcome(
        &self,
        run_id: &str,
        record: RunRecord,
        ended: &pb::RunTaskResponse,
    ) -> Result<(), StoreError> {
        let saved = (
            ended.status.clone(),
            ended.error.clone(),
            ended.report.clone(),
        );
        let record = RunRecord {
            outcome: Some(saved),
            ..record
        };
        self.inner.store.put_run(run_id, &record)
    }

    async fn task(
        &self,
        uid: &str,
        backup_to: Option<PathBuf>,
        run_id: &str,
    ) -> Result<String, Status> {
        let cluster = self
            .inner
            .store
            .cluster(uid)?
            .ok_or_else(|| Status::not_found(format!("cluster {uid} is unknown")))?;
        match backup_to {
            Some(dir) => tasks::backup(&self.inner, &cluster, dir, run_id).await,
            None => tasks::repair(&self.inner, &cluster).await,
        }
    }
}
