//! Soak: a seeded random load of every kind of lifecycle request over
//! several clusters and three replica processes, with the simulated provider
//! hostile (random errors, extra latency, hangs, calls over several nodes
//! that do some and then fail, calls admitted on their token that land
//! later, just before their gRPC deadline, failing describes), while replicas are killed (SIGKILL), paused
//! (SIGSTOP, then SIGCONT) and terminated (SIGTERM, then replaced). Then the
//! history checker: every accepted operation ended; no provider call landed
//! under an epoch older than one the provider had accepted, nor after its
//! operation ended; every state change is an edge of the table; at rest,
//! every cluster's `status.nodes` is what the provider has.
//!
//! Environment:
//! - `DROVER_SOAK_SEED`: the seed (printed at start); the same seed draws
//!   the same requests, replica faults and provider faults, though calls
//!   racing each other may meet them in another order.
//! - `DROVER_SOAK_OPS` (default 400) and `DROVER_SOAK_SECONDS` (default
//!   60): the run stops at whichever bound comes first; raise both for a
//!   longer soak.
//!
//! Bounded: the load stops at its count or time bound, every wait has a
//! deadline; loopback only; only processes this test started are
//! signalled, by pid.

use drover_client::v1::{self, ClusterState as S, OperationState as O};
use drover_client::Client;
use drover_tests::etcd::EtcdProcess;
use drover_tests::fixture::Backends;
use drover_tests::history::{
    ends, node_violations, provider_violations, state_history, transition_violations,
};
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{any_client, create_running, owner, Endpoints, Lcg};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLUSTERS: usize = 5;
const REPLICAS: usize = 3;
/// How long an operation may take to end once its submitter waits for it;
/// above the operation timeout the replicas are given, plus a hand-over.
const SETTLE: Duration = Duration::from_secs(30);

/// The provider faults drawn in every run: random errors, extra latency,
/// hangs, partial calls and late landings on every method, and failing or
/// hanging describes. Delays are at most 200 ms, far below the 2 s lease
/// TTL. These found an upgrade planned from a failed describe that ended
/// SUCCEEDED with no node upgraded, and failed operations that wiped
/// `status.nodes` or left it showing nodes from before a partial call.
const FAULTS: &str = "*:error=0.05,latency=0.2,hang=0.01,partial=0.1,late=0.1;\
     DescribeCluster:error=0.1,latency=0.2,hang=0.01";

struct Settings {
    seed: u64,
    ops: usize,
    time: Duration,
}

impl Settings {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let number = |name: &str, default: u64| {
            var(name).map_or(default, |v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
            })
        };
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Self {
            seed: number("DROVER_SOAK_SEED", clock % 1_000_000_007),
            ops: number("DROVER_SOAK_OPS", 400) as usize,
            time: Duration::from_secs(number("DROVER_SOAK_SECONDS", 60)),
        }
    }
}

/// Shared bounds and tallies of the load.
struct Load {
    accepted: Mutex<Vec<v1::Operation>>,
    count: AtomicUsize,
    refused: AtomicUsize,
    stop: AtomicBool,
    until: Instant,
    ops: usize,
}

impl Load {
    fn over(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
            || self.count.load(Ordering::SeqCst) >= self.ops
            || Instant::now() >= self.until
    }
}

/// The next request for a cluster in `state`, drawn from those the table
/// admits there. `None`: nothing to ask in this state.
fn next_request(
    rng: &mut Lcg,
    name: &str,
    cluster: &v1::Cluster,
    request_id: &str,
) -> Option<Request> {
    let status = cluster.status.clone().unwrap_or_default();
    let state = S::try_from(status.state.unwrap_or_default()).unwrap_or(S::Unspecified);
    let workers: Vec<String> = status
        .nodes
        .iter()
        .filter(|n| n.role == "worker")
        .map(|n| n.id.clone())
        .collect();
    let choices: &[Kind] = match state {
        S::Running => &[
            Kind::Stop,
            Kind::Upgrade,
            Kind::Scale,
            Kind::AddNodes,
            Kind::RemoveNodes,
        ],
        S::Stopped => &[Kind::Start, Kind::Start, Kind::Scale],
        S::Alert => &[Kind::Start, Kind::Recover, Kind::Stop, Kind::RemoveNodes],
        S::Created | S::Error => &[Kind::Start],
        _ => return None,
    };
    let kind = choices[rng.next(choices.len())];
    let remove = match (kind, workers.len()) {
        // Keep one worker, so that the cluster stays worth upgrading.
        (Kind::RemoveNodes, 0 | 1) => return None,
        (Kind::RemoveNodes, n) => vec![workers[rng.next(n)].clone()],
        _ => Vec::new(),
    };
    let version = format!("1.{}.0", 30 + rng.next(8));
    let workers = 1 + rng.next(4) as u32;
    Some(Request {
        kind,
        name: name.to_string(),
        request_id: request_id.to_string(),
        version,
        workers,
        remove,
    })
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Start,
    Stop,
    Upgrade,
    Scale,
    AddNodes,
    RemoveNodes,
    Recover,
}

struct Request {
    kind: Kind,
    name: String,
    request_id: String,
    version: String,
    workers: u32,
    remove: Vec<String>,
}

impl Request {
    async fn send(&self, client: &mut Client) -> Result<v1::Operation, tonic::Status> {
        let (name, request_id) = (self.name.clone(), self.request_id.clone());
        let clusters = client.clusters();
        let reply = match self.kind {
            Kind::Start => {
                let r = v1::StartClusterRequest {
                    name,
                    request_id,
                    ..Default::default()
                };
                clusters.start_cluster(r).await
            }
            Kind::Stop => {
                let r = v1::StopClusterRequest {
                    name,
                    request_id,
                    ..Default::default()
                };
                clusters.stop_cluster(r).await
            }
            Kind::Recover => {
                let r = v1::RecoverClusterRequest {
                    name,
                    request_id,
                    ..Default::default()
                };
                clusters.recover_cluster(r).await
            }
            Kind::Upgrade => {
                let version = self.version.clone();
                let r = v1::UpgradeClusterRequest {
                    name,
                    version,
                    request_id,
                    // Random versions: some lower than the last.
                    allow_downgrade: true,
                    ..Default::default()
                };
                clusters.upgrade_cluster(r).await
            }
            Kind::Scale => {
                let r = v1::ScaleClusterRequest {
                    name,
                    worker_nodes: Some(self.workers),
                    request_id,
                    ..Default::default()
                };
                clusters.scale_cluster(r).await
            }
            Kind::AddNodes => {
                let r = v1::AddNodesRequest {
                    name,
                    count: 1,
                    request_id,
                    ..Default::default()
                };
                clusters.add_nodes(r).await
            }
            Kind::RemoveNodes => {
                let node_ids = self.remove.clone();
                let r = v1::RemoveNodesRequest {
                    name,
                    node_ids,
                    request_id,
                    ..Default::default()
                };
                clusters.remove_nodes(r).await
            }
        };
        reply.map(tonic::Response::into_inner)
    }
}

/// Submits `request`, asking again with the same request id while the
/// answer is unknown (so it never runs twice). `None`: refused.
async fn submit(request: &Request, endpoints: &Endpoints, turn: usize) -> Option<v1::Operation> {
    for attempt in 0..5 {
        let mut client = any_client(endpoints, turn + attempt).await?;
        match request.send(&mut client).await {
            Ok(op) => return Some(op),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal
                ) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Busy, or no edge from the state: part of the load.
            Err(_) => return None,
        }
    }
    None
}

/// Waits (bounded) for `op` to end, through whichever replica answers.
async fn wait_ended(
    op: &v1::Operation,
    endpoints: &Endpoints,
    turn: usize,
) -> Option<v1::Operation> {
    let deadline = Instant::now() + SETTLE;
    let mut turn = turn;
    while Instant::now() < deadline {
        turn += 1;
        let Some(mut client) = any_client(endpoints, turn).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if let Ok(done) = client.wait_operation(op, Duration::from_secs(2)).await {
            if done.state >= O::Succeeded as i32 {
                return Some(done);
            }
        }
    }
    None
}

/// One cluster's load until the bounds: read the cluster, wait for the
/// operation it holds if any, else submit a request its state admits and
/// wait for it to end.
async fn cluster_load(cluster: usize, seed: u64, endpoints: Endpoints, load: Arc<Load>) {
    let name = format!("soak-{cluster}");
    let mut rng = Lcg(seed ^ (cluster as u64).wrapping_mul(0x9e37_79b9));
    let mut turn = cluster;
    while !load.over() {
        turn += 1;
        let Some(mut client) = any_client(&endpoints, turn).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(current) = client.get_cluster(&name).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let holding = current
            .status
            .as_ref()
            .and_then(|s| s.current_operation.clone());
        if let Some(id) = holding {
            // The scanner's, or one whose submit answer was lost.
            let op = v1::Operation {
                id,
                cluster: name.clone(),
                ..Default::default()
            };
            wait_ended(&op, &endpoints, turn).await;
            continue;
        }
        let request_id = format!("{name}-{turn}");
        let Some(request) = next_request(&mut rng, &name, &current, &request_id) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(op) = submit(&request, &endpoints, turn).await else {
            load.refused.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        load.count.fetch_add(1, Ordering::SeqCst);
        load.accepted.lock().unwrap().push(op.clone());
        wait_ended(&op, &endpoints, turn).await;
    }
}

/// The replicas, the provider and etcd of a run.
struct World {
    replicas: Vec<ReplicaProcess>,
    sim: SimProcess,
    etcd: EtcdProcess,
    endpoints: Endpoints,
}

impl World {
    async fn add_replica(&mut self, id: usize) {
        let provider = self.sim.endpoint();
        let timeouts = "start=8,stop=8,scale=8,upgrade=8,add-nodes=8,remove-nodes=8,recover=8";
        let args = [
            "--provider",
            provider.as_str(),
            "--lease-ttl",
            "2",
            "--scan-interval",
            "1",
            "--handoff-grace",
            "1",
            "--operation-history",
            "1000",
            "--operation-timeout",
            timeouts,
        ];
        let replica_id = format!("s{id}");
        let replica = ReplicaProcess::serve_with(&self.etcd.endpoint(), &replica_id, &args).await;
        self.replicas.push(replica);
        self.publish();
    }

    fn publish(&self) {
        *self.endpoints.lock().unwrap() = self.replicas.iter().map(|r| r.endpoint()).collect();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ReplicaFault {
    Kill,
    Pause,
    Terminate,
}

/// Hits replicas until the load is over: a pause of 0.5 to 2.5 s between
/// faults (the pace of the faults, not a wait for anything); every kind of
/// fault once first, then at random. Returns the faults injected.
async fn disrupt(world: &mut World, rng: &mut Lcg, load: &Load) -> Vec<ReplicaFault> {
    const KINDS: [ReplicaFault; 3] = [
        ReplicaFault::Kill,
        ReplicaFault::Pause,
        ReplicaFault::Terminate,
    ];
    let mut injected = Vec::new();
    let mut next_id = REPLICAS;
    while !load.over() {
        tokio::time::sleep(Duration::from_millis(500 + rng.next(2000) as u64)).await;
        if load.over() {
            break;
        }
        let fault = KINDS
            .get(injected.len())
            .copied()
            .unwrap_or(KINDS[rng.next(KINDS.len())]);
        injected.push(fault);
        let victim = rng.next(world.replicas.len());
        if fault == ReplicaFault::Pause {
            // Sometimes past the 2 s lease TTL, sometimes not.
            world.replicas[victim].signal("STOP");
            tokio::time::sleep(Duration::from_millis(500 + rng.next(3500) as u64)).await;
            world.replicas[victim].signal("CONT");
            continue;
        }
        let mut replica = world.replicas.remove(victim);
        world.publish();
        if fault == ReplicaFault::Kill {
            replica.kill9();
        } else {
            let status = replica.terminate().await;
            assert!(
                status.success(),
                "a terminated replica exited with {status:?}"
            );
        }
        drop(replica);
        next_id += 1;
        world.add_replica(next_id).await;
    }
    injected
}

#[tokio::test]
async fn a_random_load_under_provider_and_replica_faults_keeps_every_invariant() {
    let settings = Settings::from_env();
    eprintln!(
        "soak: seed {} (DROVER_SOAK_SEED={} replays it), up to {} operations or {:?}",
        settings.seed, settings.seed, settings.ops, settings.time,
    );
    let started = Instant::now();
    let Backends { sim, etcd } = Backends::start().await;
    let mut world = World {
        replicas: Vec::new(),
        sim,
        etcd,
        endpoints: Arc::new(Mutex::new(Vec::new())),
    };
    for id in 0..REPLICAS {
        world.add_replica(id).await;
    }
    let mut client = world.replicas[0].client().await;
    let mut uids = BTreeMap::new();
    for c in 0..CLUSTERS {
        let name = format!("soak-{c}");
        uids.insert(
            name.clone(),
            create_running(&mut client, &name, 2).await.uid,
        );
    }
    let max_delay = Duration::from_millis(200);
    world.sim.set_faults(FAULTS, settings.seed, max_delay).await;

    let load = Arc::new(Load {
        accepted: Mutex::new(Vec::new()),
        count: AtomicUsize::new(0),
        refused: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        until: Instant::now() + settings.time,
        ops: settings.ops,
    });
    let tasks: Vec<_> = (0..CLUSTERS)
        .map(|c| {
            let (endpoints, load) = (Arc::clone(&world.endpoints), Arc::clone(&load));
            tokio::spawn(cluster_load(c, settings.seed, endpoints, load))
        })
        .collect();
    let mut rng = Lcg(settings.seed);
    let replica_faults = disrupt(&mut world, &mut rng, &load).await;
    load.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("a load task");
    }
    // At rest: the provider kind again, so that what is left can end.
    world.sim.set_faults("", settings.seed, max_delay).await;
    let accepted = load.accepted.lock().unwrap().clone();
    let violations = check(&world, &uids, &accepted).await;
    let history = world.sim.history().await;
    let late = history
        .entries
        .iter()
        .filter(|e| e.landed_at_ms > e.admitted_at_ms)
        .count();
    eprintln!(
        "soak: seed {}: {} operations accepted ({}), {} requests refused, replica faults {:?}, \
         provider faults injected {:?}, {} provider calls landed ({late} late), {:.1} s",
        settings.seed,
        accepted.len(),
        outcomes(&world, &accepted).await,
        load.refused.load(Ordering::SeqCst),
        tally(&replica_faults),
        history.injected.iter().collect::<BTreeMap<_, _>>(),
        history.entries.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        accepted.len() >= settings.ops.min(100),
        "soak seed {}: the load was too light: {} operations",
        settings.seed,
        accepted.len()
    );
    assert!(
        violations.is_empty(),
        "soak seed {} (rerun with DROVER_SOAK_SEED={}) broke invariants:\n{}",
        settings.seed,
        settings.seed,
        violations.join("\n")
    );
}

fn tally(faults: &[ReplicaFault]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for fault in faults {
        *counts.entry(format!("{fault:?}")).or_default() += 1;
    }
    counts
}

/// How the accepted operations ended, e.g. "SUCCEEDED 250, FAILED 40".
async fn outcomes(world: &World, accepted: &[v1::Operation]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let client = world.replicas[0].client().await;
    for op in accepted {
        let state = match client
            .clone()
            .wait_operation(op, Duration::from_secs(1))
            .await
        {
            Ok(done) => O::try_from(done.state).map_or("?", |s| s.as_str_name()),
            Err(_) => "unknown",
        };
        *counts
            .entry(state.trim_start_matches("OPERATION_STATE_"))
            .or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
    parts.join(", ")
}

/// The history checker over the whole run; returns every violation.
async fn check(
    world: &World,
    uids: &BTreeMap<String, String>,
    accepted: &[v1::Operation],
) -> Vec<String> {
    let client = world.replicas[0].client().await;
    let mut violations = Vec::new();
    // 1. Every accepted operation ended.
    let mut ended = Vec::new();
    for op in accepted {
        let done = client
            .retrying(|mut c| async move { c.wait_operation(op, SETTLE).await })
            .await;
        match done {
            Ok(done) if done.state >= O::Succeeded as i32 => ended.push(done),
            other => violations.push(format!("operation {} never ended: {other:?}", op.id)),
        }
    }
    // 2. Every cluster comes to rest: no operation held, a live owner.
    if !at_rest(world, uids).await {
        violations.push(format!(
            "the clusters did not come to rest within {SETTLE:?}"
        ));
    }
    // Operations the replicas started themselves (the scanner's) too.
    for name in uids.keys() {
        ended.extend(drover_tests::operations_of(&client, name).await);
    }
    // 3. The provider's history against the operations' ends.
    let history = world.sim.history().await;
    violations.extend(provider_violations(&history.entries, &ends(&ended)));
    // 4. Every state change is an edge.
    let store = world.etcd.store().await;
    let states = state_history(&store, "/drover/v1/").await;
    violations.extend(transition_violations(&states));
    // 5. At rest, the status shows the provider's nodes.
    for (name, uid) in uids {
        violations.extend(nodes_match(&client, &world.sim, name, uid).await);
    }
    violations
}

/// Polls (for at most [`SETTLE`]) until no cluster holds an operation and
/// each has a live owner; whether they came to rest.
async fn at_rest(world: &World, uids: &BTreeMap<String, String>) -> bool {
    let endpoint = world.replicas[0].endpoint();
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        let endpoint = endpoint.clone();
        let rested = async move {
            let Ok(mut client) = Client::connect(&endpoint).await else {
                return false;
            };
            let Ok(mut admin) = v1::admin_client::AdminClient::connect(endpoint).await else {
                return false;
            };
            for name in uids.keys() {
                let Ok(cluster) = client.get_cluster(name).await else {
                    return false;
                };
                let busy = cluster.status.and_then(|s| s.current_operation).is_some();
                if busy || owner(&mut admin, name).await.is_none() {
                    return false;
                }
            }
            true
        };
        if rested.await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The status of a cluster at rest shows the provider's nodes; a status
/// write may trail the provider's answer briefly, so this looks for a few
/// scan intervals before it reports a difference.
async fn nodes_match(client: &Client, sim: &SimProcess, name: &str, uid: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let status = match client.clone().get_cluster(name).await {
            Ok(cluster) => cluster.status.unwrap_or_default(),
            Err(error) => return Some(format!("cluster {name} cannot be read: {error}")),
        };
        let difference = node_violations(name, &status.nodes, &sim.nodes(uid).await);
        if difference.is_none() || Instant::now() >= deadline {
            return difference;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The simulator process takes its random faults from its flags.
#[tokio::test]
async fn the_simulator_process_takes_its_faults_from_flags() {
    let sim =
        SimProcess::start_with(&["--faults", "DescribeCluster:error=1", "--fault-seed", "3"]).await;
    let request = drover_proto::provider::v1::DescribeClusterRequest {
        cluster_uid: "u1".into(),
        token: None,
    };
    let mut provider =
        drover_proto::provider::v1::provider_client::ProviderClient::connect(sim.endpoint())
            .await
            .expect("connect");
    let failed = provider.describe_cluster(request).await.unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    let injected = sim.history().await.injected;
    assert_eq!(
        injected.get("DescribeCluster/error"),
        Some(&1),
        "{injected:?}"
    );
}
