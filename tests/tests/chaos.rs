//! Chaos: a continuous operation load (one loop per cluster, each request
//! with a request id and waited for) and a task run every 2 s per cluster,
//! over three replicas, while rounds of faults hit: kill -9, a pause past
//! the lease TTL, SIGTERM (each replaced by a fresh replica), and restarts
//! of etcd; and, in a 3-member etcd, the loss of the leader with failing
//! and hanging provider steps. Then a checker replays the whole history:
//! operation records, the state keys' history and the provider's audit log.
//!
//! Bounded: a fixed number of rounds, each waiting (with a deadline) for the
//! load to make progress; the load stops when the rounds are over;
//! loopback only; only processes this test started are signalled, by pid.

use drover_client::v1::{self, OperationState as O};
use drover_client::Client;
use drover_server::store::{EtcdOptions, EtcdStore, Store};
use drover_tests::etcd::{EtcdCluster, EtcdProcess};
use drover_tests::fixture::Backends;
use drover_tests::history::assert_transitions_are_edges;
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{any_client, create_running, wait_until, Endpoints, Lcg};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ROUNDS: usize = 10;
const CLUSTERS: usize = 4;
const SETTLE: Duration = Duration::from_secs(30);

struct World {
    replicas: Vec<(String, ReplicaProcess)>,
    sim: SimProcess,
    etcd: EtcdProcess,
    next_id: usize,
}

impl World {
    async fn add(&mut self) {
        self.next_id += 1;
        let id = format!("c{}", self.next_id);
        let provider = self.sim.endpoint();
        // The checker reads back every accepted operation: none may be
        // collected as history meanwhile (a fast load makes hundreds).
        let args = [
            "--provider",
            provider.as_str(),
            "--lease-ttl",
            "2",
            "--scan-interval",
            "1",
            "--operation-history",
            "10000",
        ];
        let replica = ReplicaProcess::serve_with(&self.etcd.endpoint(), &id, &args).await;
        self.replicas.push((id, replica));
    }

    async fn client(&self) -> Client {
        self.replicas[0].1.client().await
    }

    fn endpoints(&self) -> Vec<String> {
        self.replicas.iter().map(|(_, r)| r.endpoint()).collect()
    }
}

/// One cluster's background load until `stop`: submit the next request its
/// state admits (with a request id, so a submit whose answer was lost can
/// be asked again and never runs twice), wait for it to end, repeat.
/// Bounded by `stop`, which the test sets after its last fault.
async fn cluster_load(
    cluster: usize,
    endpoints: Endpoints,
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<v1::Operation>>>,
) {
    let name = format!("chaos-{cluster}");
    let mut turn = cluster;
    while !stop.load(Ordering::SeqCst) {
        turn += 1;
        let Some(mut client) = any_client(&endpoints, turn).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let request_id = format!("{name}-{turn}");
        let mut submitted = None;
        for _ in 0..5 {
            let clusters = client.clusters();
            let result = match turn % 3 {
                0 => {
                    let request = v1::StopClusterRequest {
                        name: name.clone(),
                        request_id: request_id.clone(),
                        ..Default::default()
                    };
                    clusters.stop_cluster(request).await
                }
                1 => {
                    let request = v1::StartClusterRequest {
                        name: name.clone(),
                        request_id: request_id.clone(),
                        ..Default::default()
                    };
                    clusters.start_cluster(request).await
                }
                _ => {
                    let request = v1::UpgradeClusterRequest {
                        name: name.clone(),
                        version: format!("1.{}.0", 30 + turn % 7),
                        request_id: request_id.clone(),
                        // Random versions: some lower than the last.
                        allow_downgrade: true,
                        ..Default::default()
                    };
                    clusters.upgrade_cluster(request).await
                }
            };
            match result {
                Ok(op) => {
                    submitted = Some(op.into_inner());
                    break;
                }
                // Unknown outcome: ask again with the same request id.
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::Unknown
                    ) =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    match any_client(&endpoints, turn).await {
                        Some(other) => client = other,
                        None => continue,
                    }
                }
                // Busy, no edge from this state: part of the load.
                Err(_) => break,
            }
        }
        let Some(op) = submitted else { continue };
        accepted.lock().unwrap().push(op.clone());
        // Wait (bounded) for it to end before the next request.
        let deadline = tokio::time::Instant::now() + SETTLE;
        while tokio::time::Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
            match client.wait_operation(&op, Duration::from_secs(2)).await {
                Ok(done) if done.state >= O::Succeeded as i32 => break,
                Ok(_) => {}
                Err(_) => match any_client(&endpoints, turn + 1).await {
                    Some(other) => client = other,
                    None => tokio::time::sleep(Duration::from_millis(100)).await,
                },
            }
        }
    }
}

/// The background load: one [`cluster_load`] per cluster.
struct Load {
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<v1::Operation>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(endpoints: &Endpoints) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..CLUSTERS)
            .map(|c| {
                tokio::spawn(cluster_load(
                    c,
                    Arc::clone(endpoints),
                    Arc::clone(&stop),
                    Arc::clone(&accepted),
                ))
            })
            .collect();
        Self {
            stop,
            accepted,
            tasks,
        }
    }

    /// Waits (with a deadline) until `by` more operations were accepted.
    async fn progressed(&self, by: usize) {
        let before = self.accepted.lock().unwrap().len();
        wait_until(SETTLE, "the load to make progress", || {
            let accepted = Arc::clone(&self.accepted);
            async move { accepted.lock().unwrap().len() >= before + by }
        })
        .await;
    }

    /// Stops the load and returns every operation it got accepted.
    async fn finish(self) -> Vec<v1::Operation> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let accepted = self.accepted.lock().unwrap().clone();
        accepted
    }
}

/// The faults a round may inject.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill9,
    PausePastTtl,
    Terminate,
    RestartEtcd,
}

#[tokio::test]
async fn faults_under_load_keep_every_invariant() {
    let Backends { sim, etcd } = Backends::start().await;
    let mut world = World {
        replicas: Vec::new(),
        sim,
        etcd,
        next_id: 0,
    };
    for _ in 0..3 {
        world.add().await;
    }
    let mut client = world.client().await;
    for c in 0..CLUSTERS {
        create_running(&mut client, &format!("chaos-{c}"), 2).await;
        // A maintenance task runs every 2 s when the cluster is idle.
        let task = v1::TaskSpec {
            r#type: v1::TaskType::Repair as i32,
            name: "frequent".into(),
            schedule: Some(v1::TaskSchedule {
                interval: "2s".into(),
                retry_wait: "1s".into(),
                ..Default::default()
            }),
            properties: None,
        };
        let request = v1::PutTaskRequest {
            cluster: format!("chaos-{c}"),
            task: Some(task),
        };
        client.tasks().put_task(request).await.unwrap();
    }
    world.sim.set_latency(Duration::from_millis(100)).await;
    world.sim.set_task_latency(Duration::from_millis(300)).await;

    let endpoints: Endpoints = Arc::new(Mutex::new(world.endpoints()));
    let load = Load::start(&endpoints);

    let mut rng = Lcg(0x5eed);
    let faults = [
        Fault::Kill9,
        Fault::PausePastTtl,
        Fault::Terminate,
        Fault::RestartEtcd,
    ];
    let mut injected = Vec::new();
    for round in 0..ROUNDS {
        // Let the load make progress before each fault.
        load.progressed(3).await;
        // Every kind of fault at least once, then at random.
        let fault = if round < faults.len() {
            faults[round]
        } else {
            faults[rng.next(faults.len())]
        };
        injected.push(fault);
        if let Fault::RestartEtcd = fault {
            world.etcd.restart().await;
            continue;
        }
        let victim = rng.next(world.replicas.len());
        let (id, mut replica) = world.replicas.remove(victim);
        *endpoints.lock().unwrap() = world.endpoints();
        match fault {
            Fault::Kill9 => replica.kill9(),
            Fault::PausePastTtl => {
                // Paused past the TTL, then woken: it must notice and rejoin.
                replica.signal("STOP");
                let probe = world.replicas[0].1.endpoint();
                let gone = id.clone();
                wait_until(SETTLE, "the paused replica's lease to expire", || {
                    let (probe, gone) = (probe.clone(), gone.clone());
                    async move {
                        let Ok(mut admin) = v1::admin_client::AdminClient::connect(probe).await
                        else {
                            return false;
                        };
                        match admin.list_members(v1::ListMembersRequest {}).await {
                            Ok(members) => {
                                members.into_inner().members.iter().all(|m| m.id != gone)
                            }
                            Err(_) => false,
                        }
                    }
                })
                .await;
                replica.signal("CONT");
                world.replicas.push((id, replica));
                *endpoints.lock().unwrap() = world.endpoints();
                continue;
            }
            Fault::Terminate => {
                let status = replica.terminate().await;
                assert!(status.success(), "{id}: {status:?}");
            }
            Fault::RestartEtcd => unreachable!("handled above"),
        }
        drop(replica);
        world.add().await;
        *endpoints.lock().unwrap() = world.endpoints();
    }
    let accepted = load.finish().await;
    world.sim.set_latency(Duration::ZERO).await;
    assert!(
        accepted.len() >= ROUNDS * 2,
        "the load was too light: {} operations",
        accepted.len()
    );
    eprintln!("chaos: faults {injected:?}");
    let client = world.client().await;
    let store = world.etcd.store().await;
    let admin = world.replicas[0].1.endpoint();
    check_invariants(&client, &admin, &world.sim, &store, &accepted, CLUSTERS).await;
}

/// The checker, over the whole history: every accepted operation ended; no
/// cluster sits in an operation state or without a live owner; the provider
/// never accepted a stale token and no operation ran under two epochs; every
/// state change is an edge of the table.
async fn check_invariants(
    client: &Client,
    admin: &str,
    sim: &SimProcess,
    store: &dyn drover_server::store::Store,
    accepted: &[v1::Operation],
    clusters: usize,
) {
    // 1. Every accepted operation ended. (Reads may meet a brief
    // UNAVAILABLE while etcd elects a leader: clients retry those.)
    for op in accepted {
        let done = client
            .retrying(|mut c| async move { c.wait_operation(op, SETTLE).await })
            .await
            .unwrap();
        assert!(done.state >= O::Succeeded as i32, "never ended: {done:?}");
    }
    // 2. No cluster sits in an operation state without a live owner.
    let probe = client.clone();
    wait_until(SETTLE, "every cluster idle with a live owner", || {
        let mut probe = probe.clone();
        let endpoint = admin.to_string();
        async move {
            let mut admin = v1::admin_client::AdminClient::connect(endpoint)
                .await
                .unwrap();
            for c in 0..clusters {
                let name = format!("chaos-{c}");
                let cluster = match probe.get_cluster(&name).await {
                    Ok(cluster) => cluster,
                    Err(_) => return false,
                };
                let status = cluster.status.unwrap();
                let owned = admin
                    .get_owner(v1::GetOwnerRequest {
                        cluster: name.clone(),
                    })
                    .await
                    .is_ok();
                if status.current_operation.is_some() || !owned {
                    return false;
                }
            }
            true
        }
    })
    .await;
    // 3. The provider never accepted a stale token, and no operation went
    //    back to an older owner epoch once a newer one resumed it.
    //    A task run is asked for once (RunTask is never repeated for a run
    //    id; a new owner aborts an orphaned run and retries it in a new
    //    slot), and StopTask is the new owner's fence, not a run.
    let audit = sim.audit("").await;
    let mut newest: HashMap<String, i64> = HashMap::new();
    let mut epochs_of_op: HashMap<String, i64> = HashMap::new();
    let mut runs = HashSet::new();
    for entry in &audit {
        let token = entry.token.as_ref().unwrap();
        let newest = newest.entry(token.cluster_uid.clone()).or_insert(i64::MIN);
        assert!(token.epoch >= *newest, "stale token accepted: {entry:?}");
        *newest = token.epoch;
        if entry.method == "RunTask" {
            assert!(
                runs.insert(token.operation_id.clone()),
                "task run asked for twice: {entry:?}"
            );
        }
        if entry.method == "StopTask" {
            continue;
        }
        // A new owner may resume an operation whose owner was lost, under
        // its newer epoch; an older owner never acts again after it.
        let latest = epochs_of_op
            .entry(token.operation_id.clone())
            .or_insert(token.epoch);
        assert!(
            token.epoch >= *latest,
            "operation {} went back to an older epoch: {entry:?}",
            token.operation_id
        );
        *latest = token.epoch;
    }
    // 4. Every transition is an edge of the table.
    let history = assert_transitions_are_edges(store, "/drover/v1/").await;
    assert_eq!(history.len(), clusters);
    eprintln!(
        "chaos: {} operations accepted, {} task runs, {} provider calls audited, histories {:?}",
        accepted.len(),
        runs.len(),
        audit.len(),
        history.values().map(Vec::len).collect::<Vec<_>>()
    );
}

/// A 3-member etcd loses its leader while operations run and provider
/// calls fail and hang: Drover rides the election out.
#[tokio::test]
async fn losing_the_etcd_leader_under_load_keeps_every_invariant() {
    let mut etcd = EtcdCluster::start(3).await;
    let sim = SimProcess::start().await;
    let endpoints = etcd.endpoints().join(",");
    let provider = sim.endpoint();
    let args = [
        "--provider",
        provider.as_str(),
        "--lease-ttl",
        "3",
        "--scan-interval",
        "1",
        "--operation-timeout",
        "upgrade=5",
    ];
    let mut replicas = Vec::new();
    for id in ["l1", "l2", "l3"] {
        replicas.push(ReplicaProcess::serve_with(&endpoints, id, &args).await);
    }
    let mut client = replicas[0].client().await;
    for c in 0..CLUSTERS {
        create_running(&mut client, &format!("chaos-{c}"), 2).await;
    }
    sim.set_latency(Duration::from_millis(200)).await;
    // Provider trouble on top: one failing and one hanging upgrade step.
    sim.fault("UpgradeNode", 2, false).await;
    sim.fault("UpgradeNode", 5, true).await;
    let endpoints: Endpoints = Arc::new(Mutex::new(
        replicas.iter().map(ReplicaProcess::endpoint).collect(),
    ));
    let load = Load::start(&endpoints);
    load.progressed(4).await;
    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    load.progressed(8).await;
    let accepted = load.finish().await;
    sim.set_latency(Duration::ZERO).await;
    let store = etcd.store().await;
    let admin = replicas[0].endpoint();
    check_invariants(&client, &admin, &sim, &store, &accepted, CLUSTERS).await;
    assert_ne!(etcd.leader(), Some(leader), "a new leader was elected");
}

/// A member cut off from its peers has no leader and will learn of no new
/// write, but a watch on it would stay open and silent: the replica would
/// follow a view that no longer moves. The store asks etcd to end such
/// watches (require-leader), so the replica re-lists, through another
/// member when it has several endpoints.
#[tokio::test]
async fn a_watch_on_a_member_that_lost_its_leader_ends() {
    let etcd = EtcdCluster::start(3).await;
    let isolated = etcd.leader().map_or(0, |leader| (leader + 1) % 3);
    let options = EtcdOptions::new(vec![etcd.endpoints()[isolated].clone()]);
    let store = EtcdStore::connect(&options).await.expect("connect");
    let mut watch = store.watch("/cut-off/", 0).await.expect("watch");
    let peers: Vec<usize> = (0..3).filter(|&m| m != isolated).collect();
    for &peer in &peers {
        etcd.signal(peer, "STOP");
    }
    let ended = tokio::time::timeout(Duration::from_secs(30), watch.next()).await;
    for &peer in &peers {
        etcd.signal(peer, "CONT");
    }
    assert!(
        matches!(ended, Ok(Some(Err(_)) | None)),
        "the watch stayed open on a member without a leader: {ended:?}"
    );
}
