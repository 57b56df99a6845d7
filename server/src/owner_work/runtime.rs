//! The one loop that runs owner work: the executor, the task scheduler
//! and the scanner are [`Reconciler`]s on it, each a
//! `reconcile(cluster, claim) -> Next` and nothing else of a loop.
//!
//! Per controller it keeps a queue of owned clusters to look at, fed by
//! the triggers the controller asks for (a cluster's state key changed in
//! the watch cache, one of its task keys changed, this replica adopted
//! it, a periodic resync, [`OwnerWork::trigger`]) and by the requeues its
//! reconciles ask for. As kube-runtime's applier does:
//!
//! # Guarantees
//! - At most one reconcile per (cluster, controller) runs at a time; a
//!   trigger that comes while one runs is kept and runs it again once it
//!   ends, so no change goes unseen.
//! - Repeats are removed: a cluster waits in a controller's queue once,
//!   at the earliest time asked for.
//! - A reconcile runs only for a cluster this replica owns, under the
//!   claim it holds then (every write still compares the claim's fence).
//! - A reconcile that fails is tried again after an exponential backoff
//!   (1 s to 30 s, per cluster, reset by a success); one that panics is
//!   contained (logged, counted as an error, retried the same way): a
//!   cluster whose reconcile always panics must not take down replica
//!   after replica as it moves.
//! - At most [`Reconciler::concurrency`] reconciles of a controller run
//!   at once.
//! - Once the replica stops taking work, nothing new starts; the loop
//!   ends when the reconciles in flight have (the drain waits for them
//!   through [`OwnerWork::in_flight`]).
//! - Metrics, in one place: queue depth, reconcile duration, requeues by
//!   reason, errors, each by controller.
//!
//! # Caveats
//! - The cache's broadcast may lag (a burst of changes): every
//!   controller then resyncs, as after a re-list.

use super::{Held, InFlight, OwnerWork};
use crate::cluster::{CacheChange, ClusterCache};
use crate::metrics::{ControllerLabels, Metrics, RequeueLabels};
use crate::replication::Claim;
use crate::store::KeyValue;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use prometheus_client::metrics::{gauge::Gauge, histogram::Histogram};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;

/// What a reconcile can fail with: each controller's own error.
pub type ReconcileError = Box<dyn std::error::Error + Send + Sync>;

/// The controllers, by name (a fixed set: they label metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Controller {
    Executor,
    Tasks,
    Scanner,
    Rollouts,
    Remediation,
}

impl Controller {
    pub fn name(self) -> &'static str {
        match self {
            Controller::Executor => "executor",
            Controller::Tasks => "tasks",
            Controller::Scanner => "scanner",
            Controller::Rollouts => "rollouts",
            Controller::Remediation => "remediation",
        }
    }
}

/// When to look at a cluster again, as a reconcile says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// On the next trigger.
    Idle,
    /// After this long (or on a trigger before).
    After(Duration),
}

/// Which triggers reach a controller.
#[derive(Clone, Copy, Debug, Default)]
pub struct Triggers {
    /// A cluster's state key changed.
    pub state: bool,
    /// Another key of a cluster with tasks changed.
    pub tasks: bool,
    /// This replica adopted a cluster.
    pub adoption: bool,
}

/// One controller of owner work.
#[async_trait::async_trait]
pub trait Reconciler: Send + Sync + 'static {
    fn controller(&self) -> Controller;
    fn triggers(&self) -> Triggers;
    /// Every candidate is looked at this often, whatever the triggers.
    fn resync(&self) -> Duration;
    /// At most this many of its reconciles at once.
    fn concurrency(&self) -> usize;
    /// The clusters a resync looks at (those not owned are skipped).
    fn candidates(&self) -> Vec<String>;
    /// This replica's claim on `key`: by default its claim on the cluster
    /// of that name; a controller of other owned things (rollouts) answers
    /// from its own claims.
    fn claim(&self, work: &OwnerWork, key: &str) -> Option<Claim> {
        work.claim(key)
    }
    /// Told before the adoption's trigger that this replica just adopted
    /// `cluster`.
    fn adopted(&self, _cluster: &str) {}
    /// Whether a change of `cluster` (its state key as written, for a
    /// state change) is worth a reconcile: a quick look, so that changes
    /// of no concern to the controller cost it no task.
    fn wants(&self, _cluster: &str, _state: Option<&KeyValue>) -> bool {
        true
    }
    /// Looks at `cluster`, owned here under `claim`.
    async fn reconcile(
        self: Arc<Self>,
        cluster: String,
        claim: Claim,
    ) -> Result<Next, ReconcileError>;
}

/// Events taken in one turn of the loop before it dispatches (see
/// [`Runtime::take_ready`]).
const READY_BATCH: usize = 1024;

/// The loop's inputs besides its own reconciles.
struct Inputs<'a> {
    adoptions: &'a mut mpsc::UnboundedReceiver<String>,
    requests: &'a mut mpsc::UnboundedReceiver<(Controller, String)>,
    changes: &'a mut broadcast::Receiver<CacheChange>,
    following: &'a mut bool,
}

/// A requeue after [`Next::After`] is never sooner than this: a wake a
/// hair early (clocks) would otherwise ask again at once.
const MIN_REQUEUE: Duration = Duration::from_millis(10);

fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(30))
        .without_max_times()
        .build()
}

/// One controller's queue.
struct Lane {
    reconciler: Arc<dyn Reconciler>,
    labels: ControllerLabels,
    /// Its series, looked up once (a lookup hashes the labels: per event,
    /// that was a visible share of a takeover of thousands of clusters).
    depth: Gauge,
    took: Histogram,
    /// Each queued cluster's due time, and the same in due order.
    due: HashMap<String, Instant>,
    order: BTreeSet<(Instant, String)>,
    /// Clusters being reconciled, and those triggered meanwhile (when).
    running: HashSet<String>,
    pending: HashMap<String, Instant>,
    /// Clusters whose last reconcile failed: their backoff.
    failing: HashMap<String, ExponentialBackoff>,
    next_resync: Instant,
}

impl Lane {
    fn new(reconciler: Arc<dyn Reconciler>, metrics: &Metrics) -> Self {
        let labels = ControllerLabels {
            controller: reconciler.controller().name(),
        };
        let depth = metrics
            .owner_work_queue_depth
            .get_or_create(&labels)
            .clone();
        let took = metrics
            .owner_work_reconcile_seconds
            .get_or_create(&labels)
            .clone();
        Self {
            reconciler,
            labels,
            depth,
            took,
            due: HashMap::new(),
            order: BTreeSet::new(),
            running: HashSet::new(),
            pending: HashMap::new(),
            failing: HashMap::new(),
            next_resync: Instant::now(),
        }
    }

    /// Queues `cluster` at `at`, or sooner if it already waits sooner; one
    /// being reconciled waits until that ends.
    fn push(&mut self, cluster: String, at: Instant) {
        if self.running.contains(&cluster) {
            let pending = self.pending.entry(cluster).or_insert(at);
            *pending = (*pending).min(at);
            return;
        }
        match self.due.get(&cluster) {
            Some(queued) if *queued <= at => return,
            Some(queued) => {
                self.order.remove(&(*queued, cluster.clone()));
            }
            None => {}
        }
        self.due.insert(cluster.clone(), at);
        self.order.insert((at, cluster));
    }

    fn pop_due(&mut self, now: Instant) -> Option<String> {
        let (at, _) = self.order.first()?;
        if *at > now || self.running.len() >= self.reconciler.concurrency() {
            return None;
        }
        let (_, cluster) = self.order.pop_first()?;
        self.due.remove(&cluster);
        Some(cluster)
    }

    /// When this lane next needs the loop: its first due cluster or its
    /// resync.
    fn wake(&self) -> Instant {
        let first = self.order.first().map(|(at, _)| *at);
        first.map_or(self.next_resync, |at| at.min(self.next_resync))
    }

    fn clear(&mut self) {
        self.due.clear();
        self.order.clear();
        self.pending.clear();
    }
}

/// What a finished reconcile reports back to the loop.
struct Done {
    lane: usize,
    cluster: String,
    result: Result<Next, ReconcileError>,
    took: Duration,
}

/// The loop, with its controllers.
pub struct Runtime {
    work: Arc<OwnerWork>,
    cache: Arc<ClusterCache>,
    metrics: Arc<Metrics>,
    lanes: Vec<Lane>,
    running: JoinSet<Done>,
    /// Which lane and cluster each running reconcile is, for a panic.
    tasks: HashMap<Id, (usize, String)>,
}

impl Runtime {
    pub fn new(work: Arc<OwnerWork>, cache: Arc<ClusterCache>, metrics: Arc<Metrics>) -> Self {
        Self {
            work,
            cache,
            metrics,
            lanes: Vec::new(),
            running: JoinSet::new(),
            tasks: HashMap::new(),
        }
    }

    /// Adds a controller.
    pub fn with(mut self, reconciler: Arc<dyn Reconciler>) -> Self {
        self.lanes.push(Lane::new(reconciler, &self.metrics));
        self
    }

    /// Runs the controllers until `stop` turns true and the reconciles in
    /// flight then have ended. `adoptions` names the clusters this replica
    /// adopts.
    pub async fn run(
        mut self,
        mut adoptions: mpsc::UnboundedReceiver<String>,
        mut stop: watch::Receiver<bool>,
    ) {
        // Subscribed before the first resync, so no change after it is
        // missed.
        let mut changes = self.cache.subscribe();
        let mut requests = self
            .work
            .take_requests()
            .expect("one runtime per owner work");
        // A closed channel would answer at once on every turn: it stops
        // being polled.
        let mut following = true;
        while !*stop.borrow() && !self.work.is_stopping() {
            self.dispatch();
            let wake = self.lanes.iter().map(Lane::wake).min();
            let wake = wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                Some(joined) = self.running.join_next_with_id(), if !self.running.is_empty() => {
                    self.finished(joined);
                }
                Some(cluster) = adoptions.recv() => self.adopt(cluster),
                Some((controller, cluster)) = requests.recv() => {
                    self.requested(controller, cluster);
                }
                change = changes.recv(), if following => {
                    following = !matches!(change, Err(broadcast::error::RecvError::Closed));
                    self.changed(change);
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
            let mut inputs = Inputs {
                adoptions: &mut adoptions,
                requests: &mut requests,
                changes: &mut changes,
                following: &mut following,
            };
            self.take_ready(&mut inputs);
        }
        self.lanes.iter_mut().for_each(Lane::clear);
        self.record_depth();
        while let Some(joined) = self.running.join_next_with_id().await {
            self.finished(joined);
        }
        tracing::info!("owner work stopped");
    }

    /// Starts every due reconcile its controller has room for, and every
    /// resync that is due.
    fn dispatch(&mut self) {
        let now = Instant::now();
        for lane in &mut self.lanes {
            if lane.next_resync <= now {
                lane.next_resync = now + lane.reconciler.resync();
                for cluster in lane.reconciler.candidates() {
                    lane.push(cluster, now);
                }
            }
        }
        for index in 0..self.lanes.len() {
            while let Some(cluster) = self.lanes[index].pop_due(now) {
                self.start(index, cluster);
            }
        }
        self.record_depth();
    }

    /// Runs `cluster`'s reconcile of lane `index`, if the cluster is owned
    /// here.
    fn start(&mut self, index: usize, cluster: String) {
        let Some(claim) = self.lanes[index].reconciler.claim(&self.work, &cluster) else {
            self.lanes[index].failing.remove(&cluster);
            return;
        };
        let lane = &mut self.lanes[index];
        let id = format!("{}/{cluster}", lane.reconciler.controller().name());
        let Some(mark) = self.work.mark_as(&id, Held::Reconcile) else {
            return;
        };
        lane.running.insert(cluster.clone());
        let reconciler = Arc::clone(&lane.reconciler);
        let task = self
            .running
            .spawn(reconcile(reconciler, index, cluster.clone(), claim, mark));
        self.tasks.insert(task.id(), (index, cluster));
    }

    /// A reconcile ended: requeue as it asked, or after its backoff.
    fn finished(&mut self, joined: Result<(Id, Done), tokio::task::JoinError>) {
        let (id, done) = match joined {
            Ok((id, done)) => (id, done),
            Err(error) => {
                let Some((lane, cluster)) = self.tasks.remove(&error.id()) else {
                    return;
                };
                let controller = self.lanes[lane].labels.controller;
                tracing::error!(controller, cluster, %error, "a reconcile panicked; trying again after a backoff");
                let result = Err(format!("panicked: {error}").into());
                let done = Done {
                    lane,
                    cluster,
                    result,
                    took: Duration::ZERO,
                };
                (error.id(), done)
            }
        };
        self.tasks.remove(&id);
        let now = Instant::now();
        let metrics = Arc::clone(&self.metrics);
        let lane = &mut self.lanes[done.lane];
        lane.took.observe(done.took.as_secs_f64());
        lane.running.remove(&done.cluster);
        let controller = lane.labels.controller;
        let requeue = move |reason| RequeueLabels { controller, reason };
        match done.result {
            Ok(Next::Idle) => {
                lane.failing.remove(&done.cluster);
            }
            Ok(Next::After(after)) => {
                lane.failing.remove(&done.cluster);
                metrics
                    .owner_work_requeues
                    .get_or_create(&requeue("after"))
                    .inc();
                lane.push(done.cluster.clone(), now + after.max(MIN_REQUEUE));
            }
            Err(error) => {
                tracing::warn!(controller, cluster = done.cluster, %error, "reconcile failed; trying again after a backoff");
                metrics.owner_work_errors.get_or_create(&lane.labels).inc();
                metrics
                    .owner_work_requeues
                    .get_or_create(&requeue("error"))
                    .inc();
                let delays = lane
                    .failing
                    .entry(done.cluster.clone())
                    .or_insert_with(backoff);
                let delay = delays.next().unwrap_or(Duration::from_secs(30));
                lane.push(done.cluster.clone(), now + delay);
            }
        }
        if let Some(at) = lane.pending.remove(&done.cluster) {
            metrics
                .owner_work_requeues
                .get_or_create(&requeue("pending"))
                .inc();
            lane.push(done.cluster, at);
        }
    }

    /// Takes what else is ready now, up to [`READY_BATCH`] turns, before
    /// the next dispatch: a burst (a takeover's thousands of adoptions,
    /// their reconciles ending) then costs a dispatch per batch, not one
    /// per event.
    fn take_ready(&mut self, inputs: &mut Inputs<'_>) {
        for _ in 0..READY_BATCH {
            let mut took = false;
            if let Some(joined) = self.running.try_join_next_with_id() {
                self.finished(joined);
                took = true;
            }
            if let Ok(cluster) = inputs.adoptions.try_recv() {
                self.adopt(cluster);
                took = true;
            }
            if let Ok((controller, cluster)) = inputs.requests.try_recv() {
                self.requested(controller, cluster);
                took = true;
            }
            if *inputs.following {
                took |= self.take_change(inputs);
            }
            if !took {
                return;
            }
        }
    }

    /// Takes a cache change if one is ready; whether it took one.
    fn take_change(&mut self, inputs: &mut Inputs<'_>) -> bool {
        use broadcast::error::{RecvError, TryRecvError};
        match inputs.changes.try_recv() {
            Ok(change) => self.changed(Ok(change)),
            Err(TryRecvError::Lagged(missed)) => self.changed(Err(RecvError::Lagged(missed))),
            Err(TryRecvError::Closed) => *inputs.following = false,
            Err(TryRecvError::Empty) => return false,
        }
        true
    }

    /// A cluster adopted: each controller that follows adoptions is told,
    /// and looks at it if it wants to (as for a change of its state key).
    /// A takeover adopts thousands of idle clusters at once, of which
    /// most no controller has anything to do with; while the cache is not
    /// ready every controller looks.
    fn adopt(&mut self, cluster: String) {
        let now = Instant::now();
        let state = self.cache.is_ready().then(|| self.cache.state_of(&cluster));
        for lane in &mut self.lanes {
            if lane.reconciler.triggers().adoption {
                lane.reconciler.adopted(&cluster);
                let wanted = match &state {
                    Some(state) => lane.reconciler.wants(&cluster, state.as_ref()),
                    None => true,
                };
                if wanted {
                    lane.push(cluster.clone(), now);
                }
            }
        }
    }

    fn requested(&mut self, controller: Controller, cluster: String) {
        let now = Instant::now();
        let lane = self.lanes.iter_mut();
        if let Some(lane) = lane
            .into_iter()
            .find(|l| l.reconciler.controller() == controller)
        {
            lane.push(cluster, now);
        }
    }

    /// A change the watch cache applied: the clusters of owned state and
    /// task keys go to the controllers that follow them; a re-list, or
    /// changes missed, resync every controller.
    fn changed(&mut self, change: Result<CacheChange, broadcast::error::RecvError>) {
        let now = Instant::now();
        let (cluster, state) = match change {
            Ok(CacheChange::State(kv)) => {
                let Some((cluster, _)) = self.cache.keys().split_cluster_key(&kv.key) else {
                    return;
                };
                (cluster.to_string(), Some(kv))
            }
            Ok(CacheChange::Tasks(cluster)) => (cluster, None),
            Ok(CacheChange::Relisted) | Err(broadcast::error::RecvError::Lagged(_)) => {
                self.lanes
                    .iter_mut()
                    .for_each(|lane| lane.next_resync = now);
                return;
            }
            // The cache is gone (the replica is stopping): not followed
            // any more.
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if self.work.claim(&cluster).is_none() {
            return;
        }
        for lane in &mut self.lanes {
            let triggers = lane.reconciler.triggers();
            let follows = triggers.tasks || (state.is_some() && triggers.state);
            if follows && lane.reconciler.wants(&cluster, state.as_ref()) {
                lane.push(cluster.clone(), now);
            }
        }
    }

    fn record_depth(&self) {
        for lane in &self.lanes {
            lane.depth.set(lane.order.len() as i64);
        }
    }
}

async fn reconcile(
    reconciler: Arc<dyn Reconciler>,
    lane: usize,
    cluster: String,
    claim: Claim,
    mark: InFlight,
) -> Done {
    let started = Instant::now();
    let result = reconciler.reconcile(cluster.clone(), claim).await;
    drop(mark);
    Done {
        lane,
        cluster,
        result,
        took: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counting;

    #[async_trait::async_trait]
    impl Reconciler for Counting {
        fn controller(&self) -> Controller {
            Controller::Scanner
        }
        fn triggers(&self) -> Triggers {
            Triggers::default()
        }
        fn resync(&self) -> Duration {
            Duration::from_secs(60)
        }
        fn concurrency(&self) -> usize {
            1
        }
        fn candidates(&self) -> Vec<String> {
            Vec::new()
        }
        async fn reconcile(self: Arc<Self>, _: String, _: Claim) -> Result<Next, ReconcileError> {
            Ok(Next::Idle)
        }
    }

    /// Counts its reconciles of "c" and how many ran at once; the first
    /// asks for another look while it runs, then waits to be released.
    #[derive(Default)]
    struct Gated {
        work: std::sync::OnceLock<Arc<OwnerWork>>,
        calls: std::sync::atomic::AtomicUsize,
        running: std::sync::atomic::AtomicUsize,
        most_at_once: std::sync::atomic::AtomicUsize,
        release: tokio::sync::Notify,
    }

    #[async_trait::async_trait]
    impl Reconciler for Gated {
        fn controller(&self) -> Controller {
            Controller::Scanner
        }
        fn triggers(&self) -> Triggers {
            Triggers::default()
        }
        fn resync(&self) -> Duration {
            Duration::from_secs(3600)
        }
        fn concurrency(&self) -> usize {
            4
        }
        fn candidates(&self) -> Vec<String> {
            vec!["c".into()]
        }
        async fn reconcile(
            self: Arc<Self>,
            cluster: String,
            _: Claim,
        ) -> Result<Next, ReconcileError> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most_at_once.fetch_max(now, SeqCst);
            if self.calls.fetch_add(1, SeqCst) == 0 {
                let work = self.work.get().expect("set");
                work.trigger(Controller::Scanner, &cluster);
                self.release.notified().await;
            }
            self.running.fetch_sub(1, SeqCst);
            Ok(Next::Idle)
        }
    }

    /// A trigger that comes while the cluster's reconcile runs is kept and
    /// runs it again once it ends, never beside it.
    #[tokio::test]
    async fn a_trigger_during_a_reconcile_runs_it_again_after_never_beside() {
        use crate::store::{MemoryStore, SharedStore};
        use std::sync::atomic::Ordering::SeqCst;
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = crate::keys::KeyLayout::new("/t/");
        let replication = crate::replication::owner_of(store.clone(), &keys, &["c"]).await;
        let cache = ClusterCache::new(store, keys, Metrics::new());
        let work = OwnerWork::new(replication);
        let gated = Arc::new(Gated::default());
        let _ = gated.work.set(Arc::clone(&work));
        let runtime = Runtime::new(Arc::clone(&work), cache, Metrics::new()).with(gated.clone());
        let (stop, stopped) = watch::channel(false);
        let (_adopt, adoptions) = mpsc::unbounded_channel();
        let loop_ = tokio::spawn(runtime.run(adoptions, stopped));
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while gated.calls.load(SeqCst) < 1 {
            assert!(std::time::Instant::now() < until, "the first reconcile");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(work.in_flight(), 1, "the reconcile counts for the drain");
        gated.release.notify_one();
        while gated.calls.load(SeqCst) < 2 {
            assert!(std::time::Instant::now() < until, "the trigger's reconcile");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(true).unwrap();
        loop_.await.unwrap();
        assert_eq!(gated.calls.load(SeqCst), 2);
        assert_eq!(gated.most_at_once.load(SeqCst), 1, "never beside");
        assert_eq!(work.in_flight(), 0);
    }

    #[test]
    fn a_cluster_waits_once_at_its_earliest_time_and_after_its_reconcile() {
        let mut lane = Lane::new(Arc::new(Counting), &Metrics::new());
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        lane.push("a".into(), later);
        lane.push("a".into(), now);
        lane.push("a".into(), later);
        assert_eq!(lane.order.len(), 1);
        assert_eq!(lane.pop_due(now).as_deref(), Some("a"));
        assert_eq!(lane.pop_due(now), None);
        lane.running.insert("a".into());
        lane.push("b".into(), now);
        // One at a time (concurrency 1): b waits while a runs.
        assert_eq!(lane.pop_due(now), None);
        lane.push("a".into(), now);
        assert!(lane.pending.contains_key("a"), "triggered while running");
        assert_eq!(lane.order.len(), 1);
    }
}
