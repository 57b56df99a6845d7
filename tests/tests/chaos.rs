//! Chaos: a bounded operation load over three replicas while random
//! replicas are killed (-9), paused past their lease TTL, or terminated, and
//! restarted. Then a checker replays the whole history: operation records,
//! the state keys' history and the provider's audit log.
//!
//! Bounded: a fixed number of rounds, each with deadlines; loopback only;
//! only processes this test started are signalled, by pid.

use drover_client::v1::{self, OperationState as O};
use drover_client::Client;
use drover_tests::etcd::{EtcdCluster, EtcdProcess};
use drover_tests::history::assert_transitions_are_edges;
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, wait_until};
use std::collections::HashMap;
use std::time::Duration;

const ROUNDS: usize = 6;
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
        let args = [
            "--provider",
            provider.as_str(),
            "--lease-ttl",
            "2",
            "--scan-interval",
            "1",
        ];
        let replica = ReplicaProcess::serve_with(&self.etcd.endpoint(), &id, &args).await;
        self.replicas.push((id, replica));
    }

    async fn client(&self) -> Client {
        self.replicas[0].1.client().await
    }
}

/// A deterministic pseudo-random sequence, so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound
    }
}

/// Submits a request per idle cluster: the first of stop, start and upgrade
/// (rotating by round) that the cluster's state admits. Refusals (busy, no
/// edge, a replica going away) are part of the load.
async fn load(client: &mut Client, round: usize, accepted: &mut Vec<v1::Operation>) {
    for c in 0..CLUSTERS {
        for attempt in 0..3 {
            let name = format!("chaos-{c}");
            let clusters = client.clusters();
            let result = match (round + c + attempt) % 3 {
                0 => {
                    clusters
                        .stop_cluster(v1::StopClusterRequest {
                            name,
                            request_id: String::new(),
                        })
                        .await
                }
                1 => {
                    clusters
                        .start_cluster(v1::StartClusterRequest {
                            name,
                            request_id: String::new(),
                        })
                        .await
                }
                _ => {
                    let version = format!("1.{}.0", 30 + round);
                    clusters
                        .upgrade_cluster(v1::UpgradeClusterRequest {
                            name,
                            version,
                            request_id: String::new(),
                        })
                        .await
                }
            };
            match result {
                Ok(op) => {
                    accepted.push(op.into_inner());
                    break;
                }
                Err(status) if status.code() == tonic::Code::Aborted => break,
                Err(_) => {}
            }
        }
    }
}

#[tokio::test]
async fn faults_under_load_keep_every_invariant() {
    let mut world = World {
        replicas: Vec::new(),
        sim: SimProcess::start().await,
        etcd: EtcdProcess::start().await,
        next_id: 0,
    };
    for _ in 0..3 {
        world.add().await;
    }
    let mut client = world.client().await;
    for c in 0..CLUSTERS {
        create_running(&mut client, &format!("chaos-{c}"), 2).await;
    }
    world.sim.set_latency(Duration::from_millis(150)).await;

    let mut rng = Lcg(0x5eed);
    let mut accepted = Vec::new();
    for round in 0..ROUNDS {
        load(&mut client, round, &mut accepted).await;
        let victim = rng.next(world.replicas.len());
        let (id, mut replica) = world.replicas.remove(victim);
        match rng.next(3) {
            0 => replica.kill9(),
            1 => {
                // Paused past the TTL, then woken: it must notice and rejoin.
                replica.signal("STOP");
                let probe = world.replicas[0].1.endpoint();
                let gone = id.clone();
                wait_until(SETTLE, "the paused replica's lease to expire", || {
                    let (probe, gone) = (probe.clone(), gone.clone());
                    async move {
                        let mut admin =
                            v1::admin_client::AdminClient::connect(probe).await.unwrap();
                        let members = admin
                            .list_members(v1::ListMembersRequest {})
                            .await
                            .unwrap()
                            .into_inner()
                            .members;
                        members.iter().all(|m| m.id != gone)
                    }
                })
                .await;
                replica.signal("CONT");
                world.replicas.push((id.clone(), replica));
                client = world.client().await;
                load(&mut client, round, &mut accepted).await;
                continue;
            }
            _ => {
                let status = replica.terminate().await;
                assert!(status.success(), "{id}: {status:?}");
            }
        }
        drop(replica);
        world.add().await;
        client = world.client().await;
        load(&mut client, round, &mut accepted).await;
    }
    world.sim.set_latency(Duration::ZERO).await;

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
    // 3. The provider never accepted a stale token, and no operation ran
    //    under two owner epochs.
    let audit = sim.audit("").await;
    let mut newest: HashMap<String, i64> = HashMap::new();
    let mut epochs_of_op: HashMap<String, i64> = HashMap::new();
    for entry in &audit {
        let token = entry.token.as_ref().unwrap();
        let newest = newest.entry(token.cluster_uid.clone()).or_insert(i64::MIN);
        assert!(token.epoch >= *newest, "stale token accepted: {entry:?}");
        *newest = token.epoch;
        let first = *epochs_of_op
            .entry(token.operation_id.clone())
            .or_insert(token.epoch);
        assert_eq!(
            first, token.epoch,
            "operation {} ran under two epochs",
            token.operation_id
        );
    }
    // 4. Every transition is an edge of the table.
    let history = assert_transitions_are_edges(store, "/drover/v1/").await;
    assert_eq!(history.len(), clusters);
    eprintln!(
        "chaos: {} operations accepted, {} provider calls audited, histories {:?}",
        accepted.len(),
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
    let mut accepted = Vec::new();
    load(&mut client, 2, &mut accepted).await;

    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    let mut rounds = 0;
    while rounds < 3 {
        load(&mut client, rounds, &mut accepted).await;
        rounds += 1;
    }
    sim.set_latency(Duration::ZERO).await;
    let store = etcd.store().await;
    let admin = replicas[0].endpoint();
    check_invariants(&client, &admin, &sim, &store, &accepted, CLUSTERS).await;
    assert_ne!(etcd.leader(), Some(leader), "a new leader was elected");
}
