//! Network partitions: etcd, two replicas and the simulated provider each
//! in a network namespace of their own (see `drover_tests::netns`), the
//! test process a client on the bridge. Each test cuts links mid-operation
//! and then checks the history: every accepted operation ended, no state
//! change outside the table, no provider call landed under a stale epoch or
//! after its operation ended, and the status shows the provider's nodes.
//!
//! Bounded: every wait has a deadline; addresses only inside namespaces the
//! test made, all removed on drop; only processes this test started are
//! killed. Skipped (with a message) where namespaces cannot be made.

use drover_client::v1::{self, OperationState as O};
use drover_client::Client;
use drover_tests::etcd::EtcdCluster;
use drover_tests::history::provider_violations;
use drover_tests::history::{assert_transitions_are_edges, ends, node_violations};
use drover_tests::load::{assert_accepted_once, resumed, stops_and_starts, Figures};
use drover_tests::netns::Net;
use drover_tests::provider::SimProcess;
use drover_tests::relay::Relay;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, operations_of, owner, start_upgrade, wait_running, wait_until};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The replicas' lease TTL (seconds) and safety margin (percent).
const TTL: u64 = 2;
const MARGIN_PERCENT: u64 = 20;

/// Etcd (one member), two replicas and the provider, each in its own
/// namespace. Fields drop in order: processes first, then the relay (if
/// any), the network last.
struct World {
    replicas: Vec<ReplicaProcess>,
    relay: Option<Relay>,
    sim: SimProcess,
    etcd: EtcdCluster,
    net: Net,
}

impl World {
    /// `None` where namespaces cannot be made (the test then skips).
    async fn start(extra: &[&str]) -> Option<Self> {
        Self::start_with(&["etcd"], extra).await
    }

    /// As [`Self::start`] over one etcd member per name in `members`.
    async fn start_with(members: &[&str], extra: &[&str]) -> Option<Self> {
        Self::start_over(members, &["r1", "r2"], TTL, extra, None).await
    }

    /// As [`Self::start`] with three replicas.
    async fn start_three(extra: &[&str]) -> Option<Self> {
        Self::start_over(&["etcd"], &["r1", "r2", "r3"], TTL, extra, None).await
    }

    /// As [`Self::start`] with a lease TTL of `ttl` seconds, the replicas
    /// reaching etcd through a [`Relay`] (no delay yet) whose delays are
    /// drawn from `seed`.
    async fn start_relayed(ttl: u64, extra: &[&str], seed: u64) -> Option<Self> {
        Self::start_over(&["etcd"], &["r1", "r2"], ttl, extra, Some(seed)).await
    }

    async fn start_over(
        members: &[&str],
        replica_ids: &[&str],
        ttl: u64,
        extra: &[&str],
        relay_seed: Option<u64>,
    ) -> Option<Self> {
        let mut names = members.to_vec();
        names.extend(replica_ids);
        names.push("sim");
        let net = Net::new(&names)?;
        let nodes: Vec<_> = members.iter().map(|m| net.node(m).clone()).collect();
        let etcd = EtcdCluster::start_in(&nodes).await;
        let sim = SimProcess::start_in(net.node("sim"), &[]).await;
        let mut endpoints = etcd.endpoints().join(",");
        let relay = match relay_seed {
            // On the bridge's address, which every namespace reaches.
            Some(seed) => {
                let listen = SocketAddr::new(net.host_ip.parse().expect("host ip"), 0);
                let member = etcd.endpoints()[0]
                    .trim_start_matches("http://")
                    .to_string();
                let upstream = member.parse().expect("an etcd address");
                let relay = Relay::start(listen, upstream, Duration::ZERO..=Duration::ZERO, seed)
                    .await
                    .expect("start the relay");
                endpoints = format!("http://{}", relay.address());
                Some(relay)
            }
            None => None,
        };
        let provider = sim.endpoint();
        let ttl = ttl.to_string();
        let margin = MARGIN_PERCENT.to_string();
        let mut args = vec!["--provider", &provider, "--lease-ttl", &ttl];
        args.extend(["--lease-margin-percent", &margin, "--scan-interval", "1"]);
        args.extend(extra);
        let mut replicas = Vec::new();
        for id in replica_ids {
            replicas.push(ReplicaProcess::serve_in(net.node(id), &endpoints, id, &args).await);
        }
        Some(Self {
            replicas,
            relay,
            sim,
            etcd,
            net,
        })
    }

    /// The replica (index, id) owning `cluster`, as `via` reports it.
    async fn owner(&self, via: usize, cluster: &str) -> Option<String> {
        let endpoint = self.replicas[via].endpoint();
        let mut admin = v1::admin_client::AdminClient::connect(endpoint)
            .await
            .ok()?;
        owner(&mut admin, cluster).await.map(|o| o.replica)
    }

    /// Starts a 4-worker cluster and a slow upgrade of it, and waits until
    /// the first node was upgraded; returns the upgrade and the owner.
    async fn upgrade_underway(&self, name: &str) -> (v1::Operation, usize) {
        let mut client = self.replicas[0].client().await;
        create_running(&mut client, name, 4).await;
        self.sim.set_latency(Duration::from_millis(400)).await;
        let upgrade = start_upgrade(&mut client, name, "1.30.0").await;
        wait_running(&client, name, &upgrade.id, Duration::from_secs(20)).await;
        wait_until(Duration::from_secs(20), "a node upgraded", || async {
            let audit = self.sim.audit("").await;
            audit.iter().any(|e| e.method == "UpgradeNode")
        })
        .await;
        let id = self.owner(0, name).await.expect("an owner");
        let index = if id == "r1" { 0 } else { 1 };
        (upgrade, index)
    }

    /// The history checker over everything: operations ended, transitions
    /// on the table, the provider's audit log, the status's nodes.
    async fn check(&self, client: &Client, name: &str) -> Vec<v1::Operation> {
        let operations = operations_of(client, name).await;
        for op in &operations {
            assert!(op.state >= O::Succeeded as i32, "did not end: {op:?}");
        }
        let audit = self.sim.audit("").await;
        let violations = provider_violations(&audit, &ends(&operations));
        assert!(violations.is_empty(), "{}", violations.join("\n"));
        assert_transitions_are_edges(&self.etcd.store().await, "/drover/v1/").await;
        let cluster = client
            .retrying_unavailable(|mut client| async move { client.get_cluster(name).await })
            .await
            .expect("get");
        let shown = cluster.status.map(|s| s.nodes).unwrap_or_default();
        let real = self.sim.nodes(&cluster.uid).await;
        if let Some(violation) = node_violations(name, &shown, &real) {
            panic!("{violation}");
        }
        operations
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// A replica cut from etcd (not from its clients nor the provider) while it
/// runs an upgrade: it stops calling the provider by the time etcd can
/// expire its lease, the peer takes the cluster over and finishes the
/// upgrade, and no call of the old epoch lands after the new one's.
#[tokio::test]
async fn a_replica_cut_from_etcd_mid_upgrade_stops_and_its_peer_takes_over() {
    let Some(world) = World::start(&[]).await else {
        return;
    };
    let (upgrade, old) = world.upgrade_underway("cut-etcd").await;
    let (old_id, peer) = (["r1", "r2"][old], 1 - old);
    let old_epoch = {
        let endpoint = world.replicas[peer].endpoint();
        let mut admin = v1::admin_client::AdminClient::connect(endpoint)
            .await
            .unwrap();
        owner(&mut admin, "cut-etcd").await.expect("an owner").epoch
    };
    let cut_at = now_ms();
    world.net.cut(old_id, "etcd");
    eprintln!("cut {old_id} (owner, epoch {old_epoch}) from etcd at {cut_at} ms");

    // The peer owns the cluster after the TTL.
    let peer_id = ["r1", "r2"][peer];
    wait_until(Duration::from_secs(20), "the peer to take over", || async {
        world.owner(peer, "cut-etcd").await.as_deref() == Some(peer_id)
    })
    .await;
    let took_over = now_ms() - cut_at;
    let mut client = world.replicas[peer].client().await;
    let done = client
        .wait_operation(&upgrade, Duration::from_secs(60))
        .await
        .expect("the upgrade ends");
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");

    // Within its margin: no call of the old epoch landed after etcd could
    // have expired the lease (the last renewal came before the cut).
    let audit = world.sim.audit("").await;
    let stale: Vec<_> = audit
        .iter()
        .filter(|e| e.token.as_ref().is_some_and(|t| t.epoch == old_epoch))
        .filter(|e| e.landed_at_ms > cut_at + TTL * 1000)
        .collect();
    assert!(
        stale.is_empty(),
        "old epoch's calls after its lease: {stale:?}"
    );
    let new_calls = audit
        .iter()
        .filter(|e| e.token.as_ref().is_some_and(|t| t.epoch > old_epoch))
        .count();
    assert!(new_calls > 0, "the peer made no call: {audit:?}");

    world.net.heal(old_id, "etcd");
    let operations = world.check(&client, "cut-etcd").await;
    eprintln!(
        "cut from etcd: peer took over after {took_over} ms; {} operations, {} provider \
         calls ({new_calls} under the new epoch), lost: none",
        operations.len(),
        audit.len()
    );
}

/// The operation timeout of upgrades in the gray-failure tests, seconds.
const UPGRADE_TIMEOUT: u64 = 10;
/// How long a replica goes without reaching the provider before it hands
/// its clusters over, in the gray-failure tests (seconds). Probes go every
/// second then: when the provider goes away for both replicas, each sees
/// its probes fail within two seconds, a second before either has failed
/// for this long (the margin the second test relies on).
const HANDOVER_AFTER: u64 = 3;

/// A replica cut from the provider only (it keeps its lease, a gray
/// failure) mid-upgrade: after `--provider-handover-after` it hands the
/// cluster to its peer, which reaches the provider, resumes the upgrade
/// from its last persisted step and finishes it, long before the
/// upgrade's timeout; the history is clean.
#[tokio::test]
async fn a_replica_cut_from_the_provider_hands_its_operation_to_a_peer() {
    let handover = HANDOVER_AFTER.to_string();
    let Some(world) = World::start(&["--provider-handover-after", &handover]).await else {
        return;
    };
    let (upgrade, old) = world.upgrade_underway("gray").await;
    let (old_id, new_id) = (["r1", "r2"][old], ["r1", "r2"][1 - old]);
    let started = Instant::now();
    world.net.cut(old_id, "sim");
    let mut client = world.replicas[old].client().await;
    // The hand-over, a probe period, an ownership pass and the rest of the
    // upgrade (three more nodes at 400 ms).
    let bound = Duration::from_secs(HANDOVER_AFTER + TTL + 15);
    let done = client
        .wait_operation(&upgrade, bound)
        .await
        .expect("the upgrade ends, run by the peer");
    let took = started.elapsed();
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    let runners: Vec<&str> = done.runs.iter().map(|r| r.replica.as_str()).collect();
    assert_eq!(runners, [old_id, new_id], "{:#?}", done.runs);
    assert_eq!(world.owner(1 - old, "gray").await.as_deref(), Some(new_id));
    eprintln!("cut from the provider: {new_id} finished the upgrade {took:?} after the cut");
    world.net.heal(old_id, "sim");
    world.sim.set_latency(Duration::ZERO).await;
    let operations = world.check(&client, "gray").await;
    eprintln!(
        "cut from the provider: {} operations, lost: none",
        operations.len()
    );
}

/// `drover_clusters_claimed_total` summed over the replicas: every owner
/// change there was.
async fn owner_changes(world: &World) -> f64 {
    let mut changes = 0.0;
    for replica in &world.replicas {
        let samples = drover_tests::scrape::metrics(&replica.admin_endpoint()).await;
        changes += drover_tests::scrape::sum(&samples, "drover_clusters_claimed_total", "");
    }
    changes
}

/// One of three replicas loses the provider twice for longer than
/// `--provider-handover-after`, reaching it again between the losses for
/// a while (2.5 s: time for a probe or two, not for the run of successes
/// that recovery takes, about `--provider-handover-after`), then for good. Its clusters move away once
/// and back once: a success amid failures does not make it preferable
/// again (it used to, moving them back and away again), and the peers'
/// probes, never failing, pass nobody else over.
#[tokio::test]
async fn a_replica_whose_provider_link_flaps_moves_its_clusters_away_and_back_once() {
    let handover = HANDOVER_AFTER.to_string();
    let Some(world) = World::start_three(&["--provider-handover-after", &handover]).await else {
        return;
    };
    let mut client = world.replicas[0].client().await;
    let names: Vec<String> = (0..9).map(|i| format!("flap-{i}")).collect();
    for name in &names {
        create_running(&mut client, name, 1).await;
    }
    let mut own = Vec::new();
    for name in &names {
        if world.owner(0, name).await.as_deref() == Some("r3") {
            own.push(name.clone());
        }
    }
    assert!(!own.is_empty(), "r3 owns none of {names:?}");
    let before = owner_changes(&world).await;

    // The fault schedule: r3's connections to the provider refused past
    // the window, then allowed for a few probes, refused again, allowed
    // for good. Refused, not dropped: probes fail and succeed at once.
    let sim = world.net.node("sim").ip.clone();
    let port: u16 = world
        .sim
        .endpoint()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the provider's port");
    let loss = Duration::from_secs(HANDOVER_AFTER + 2);
    let provider = [(sim, port)];
    world.net.reject("r3", &provider);
    tokio::time::sleep(loss).await;
    world.net.stop_rejecting("r3");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    world.net.reject("r3", &provider);
    tokio::time::sleep(loss).await;
    world.net.stop_rejecting("r3");
    wait_until(
        Duration::from_secs(30),
        "r3 to own its clusters again",
        || async {
            for name in &own {
                if world.owner(0, name).await.as_deref() != Some("r3") {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let moves = owner_changes(&world).await - before;
    eprintln!(
        "flapping provider link: {} clusters of r3, {moves} owner changes",
        own.len()
    );
    assert!(
        moves <= 2.0 * own.len() as f64,
        "{moves} owner changes for {} clusters: more than away and back once",
        own.len()
    );
}

/// The (ip, port) of `replica`'s admin port.
fn admin_target(replica: &ReplicaProcess) -> (String, u16) {
    let address = replica.admin_endpoint();
    let (ip, port) = address
        .trim_start_matches("http://")
        .rsplit_once(':')
        .expect("host:port");
    (ip.to_string(), port.parse().expect("a port"))
}

/// The prober's own network refuses: r1's egress to its peers' admin
/// ports is rejected with a TCP reset and its liveness connections are
/// destroyed (a local proxy restarting, an egress REJECT rule). Every
/// refusal r1 sees is its own doing: no lease is revoked, no cluster moves.
/// (A peer killed alone breaks one connection of three replicas' two:
/// `replication`'s `peers_revoke_a_killed_owners_lease_long_before_its_ttl`.)
#[tokio::test]
async fn a_prober_whose_own_network_refuses_revokes_no_lease() {
    let Some(world) = World::start_three(&[]).await else {
        return;
    };
    let mut client = world.replicas[0].client().await;
    for i in 0..6 {
        create_running(&mut client, &format!("own-{i}"), 1).await;
    }
    let r1 = world.replicas[0].admin_endpoint();
    let connected = |admin: String| async move {
        let samples = drover_tests::scrape::metrics(&admin).await;
        drover_tests::scrape::sum(&samples, "drover_liveness_peers_connected", "")
    };
    wait_until(Duration::from_secs(10), "r1's liveness connections", || {
        let r1 = r1.clone();
        async move { connected(r1).await == 2.0 }
    })
    .await;
    let before = owner_changes(&world).await;

    let peers: Vec<(String, u16)> = world.replicas[1..].iter().map(admin_target).collect();
    world.net.reject("r1", &peers);
    for (ip, port) in &peers {
        world.net.kill_connections("r1", ip, *port);
    }
    wait_until(
        Duration::from_secs(10),
        "r1's liveness connections to break",
        || {
            let r1 = r1.clone();
            async move { connected(r1).await == 0.0 }
        },
    )
    .await;
    // Several probe rounds, well within the TTL: any revoke would show.
    let r1_metrics = r1.clone();
    wait_until(
        Duration::from_secs(10),
        "r1 to suspect its own network",
        || {
            let r1 = r1_metrics.clone();
            async move {
                let samples = drover_tests::scrape::metrics(&r1).await;
                drover_tests::scrape::sum(&samples, "drover_liveness_self_suspected_total", "")
                    >= 4.0
            }
        },
    )
    .await;
    let samples = drover_tests::scrape::metrics(&r1).await;
    for taken in [
        "drover_peer_members_deposed_total",
        "drover_peer_leases_revoked_total",
    ] {
        let count = drover_tests::scrape::sum(&samples, taken, "");
        assert_eq!(
            count, 0.0,
            "{taken}: r1 took a peer for crashed over its own network"
        );
    }
    assert_eq!(owner_changes(&world).await, before, "a cluster moved");

    world.net.stop_rejecting("r1");
    wait_until(
        Duration::from_secs(10),
        "r1's liveness connections again",
        || {
            let r1 = r1.clone();
            async move { connected(r1).await == 2.0 }
        },
    )
    .await;
    assert_eq!(owner_changes(&world).await, before, "a cluster moved");
}

/// The provider cut from both replicas: it is down as far as anyone can
/// tell, so nobody hands the cluster around; the upgrade waits for it and
/// ends (failed) at its timeout plus a bound, run by one replica; the
/// cluster is usable once the links are back; the history is clean.
#[tokio::test]
async fn a_provider_no_replica_reaches_is_waited_for_not_handed_around() {
    let timeout = format!("upgrade={UPGRADE_TIMEOUT}");
    let handover = HANDOVER_AFTER.to_string();
    let args = [
        "--operation-timeout",
        &timeout,
        "--provider-handover-after",
        &handover,
    ];
    let Some(world) = World::start(&args).await else {
        return;
    };
    let (upgrade, old) = world.upgrade_underway("down").await;
    let started = Instant::now();
    world.net.cut("r1", "sim");
    world.net.cut("r2", "sim");
    let mut client = world.replicas[old].client().await;
    let bound = Duration::from_secs(UPGRADE_TIMEOUT + 10);
    let done = client
        .wait_operation(&upgrade, bound)
        .await
        .expect("the upgrade ends within its timeout and a bound");
    let took = started.elapsed();
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    assert_eq!(done.runs.len(), 1, "handed around: {:#?}", done.runs);
    eprintln!(
        "provider down: the upgrade failed after {took:?} ({})",
        done.error.as_ref().map_or("", |e| e.message.as_str())
    );
    world.net.heal("r1", "sim");
    world.net.heal("r2", "sim");
    world.sim.set_latency(Duration::ZERO).await;
    // The cluster is usable again once the links are back.
    let stop = client
        .retrying(|mut client| async move {
            let request = v1::StopClusterRequest {
                name: "down".into(),
                request_id: "stop-down".into(),
                ..Default::default()
            };
            Ok(client.clusters().stop_cluster(request).await?.into_inner())
        })
        .await
        .expect("a stop accepted");
    let stopped = client
        .wait_operation(&stop, Duration::from_secs(30))
        .await
        .expect("the stop ends");
    assert!(stopped.state >= O::Succeeded as i32, "{stopped:?}");
    let operations = world.check(&client, "down").await;
    eprintln!("provider down: {} operations, lost: none", operations.len());
}

/// A 3-member etcd whose first member (the replicas' first endpoint) is cut
/// from the other two: requests through it are refused ("no leader") or
/// hang until it learns it has none, and are sent again to the majority;
/// lease keep-alives that hang are sent again within the TTL. Every
/// request ends within a bound, answered or UNAVAILABLE (which a client
/// retries under the same request id, as `drover_client` does), and every
/// operation succeeds once.
#[tokio::test]
async fn an_etcd_member_in_the_minority_does_not_stall_requests() {
    let Some(world) = World::start_with(&["e0", "e1", "e2"], &[]).await else {
        return;
    };
    let mut client = world.replicas[0].client().await;
    create_running(&mut client, "minority", 1).await;
    world.net.cut("e0", "e1");
    world.net.cut("e0", "e2");
    let bound = Duration::from_secs(10);
    let (mut slowest, mut retried) = (Duration::ZERO, 0);
    for round in 0..6 {
        let started = Instant::now();
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let submitted = client.retrying_unavailable(|mut client| {
            attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let request_id = format!("minority-{round}");
                let name = "minority".to_string();
                let answer = if round % 2 == 0 {
                    let request = v1::StopClusterRequest {
                        name,
                        request_id,
                        ..Default::default()
                    };
                    tokio::time::timeout(bound, client.clusters().stop_cluster(request)).await
                } else {
                    let request = v1::StartClusterRequest {
                        name,
                        request_id,
                        ..Default::default()
                    };
                    tokio::time::timeout(bound, client.clusters().start_cluster(request)).await
                };
                let answer =
                    answer.unwrap_or_else(|_| panic!("round {round}: no answer within {bound:?}"));
                Ok(answer?.into_inner())
            }
        });
        let op = submitted
            .await
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        slowest = slowest.max(started.elapsed());
        retried += attempts.into_inner() - 1;
        let done = client
            .wait_operation(&op, Duration::from_secs(30))
            .await
            .expect("the operation ends");
        assert_eq!(done.state, O::Succeeded as i32, "round {round}: {done:?}");
    }
    world.net.heal("e0", "e1");
    world.net.heal("e0", "e2");
    let operations = world.check(&client, "minority").await;
    eprintln!(
        "etcd minority: {} operations, slowest submit {slowest:?}, {retried} submits retried by the client, lost: none",
        operations.len()
    );
}

/// The lease TTL (seconds) of the replicas behind the relay. A keep-alive
/// makes a round trip of 200-1000 ms through it, more when a lost segment
/// waits for its retransmission, and each attempt is given a third of the
/// TTL: at the other tests' 2 s (667 ms an attempt) most attempts time out,
/// the replicas lose their leases over and over and this load made no
/// progress in a minute. At 6 s (2 s an attempt) they keep them.
const RELAYED_TTL: u64 = 6;

/// Clusters under load, and operations on each per phase (stop and start
/// in turn, one at a time per cluster: a busy cluster refuses a second).
const LOADED_CLUSTERS: usize = 3;
const OPERATIONS_PER_CLUSTER: usize = 4;

/// One phase: on each loaded cluster, through r1 or r2 in turn, stops and
/// starts it [`OPERATIONS_PER_CLUSTER`] times. The faults are between the
/// replicas and etcd only: the provider answers every call, so every
/// operation must succeed.
async fn load(world: &World, phase: &str) -> Figures {
    let mut clients = Vec::new();
    for replica in &world.replicas {
        clients.push(replica.client().await);
    }
    let clusters: Vec<String> = (0..LOADED_CLUSTERS)
        .map(|c| format!("loaded-{c}"))
        .collect();
    stops_and_starts(&clients, &clusters, OPERATIONS_PER_CLUSTER, phase).await
}

/// The seed of the relay's delays: `DROVER_TEST_SEED`, or the clock.
fn seed() -> u64 {
    std::env::var("DROVER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// Latency (100-500 ms each way, a relay between the replicas and etcd)
/// and packet loss (10 % each way, nftables in the replicas' namespaces)
/// under a bounded load of stops and starts, after a baseline of the same
/// load without faults: every operation accepted once (a request id per
/// operation; submits asked again are not accepted twice) and succeeded,
/// and the history is clean. Prints ops/s and submit and end-to-end
/// latency per phase.
#[tokio::test]
async fn latency_and_loss_between_replicas_and_etcd_lose_nothing() {
    let seed = seed();
    eprintln!("seed {seed} (DROVER_TEST_SEED={seed} draws the same delays)");
    let Some(world) = World::start_relayed(RELAYED_TTL, &[], seed).await else {
        return;
    };
    if !world.net.nft_available() {
        eprintln!("SKIPPED: no packet loss without nftables (install nftables)");
        return;
    }
    let relay = world.relay.as_ref().expect("a relay");
    let mut client = world.replicas[0].client().await;
    for c in 0..LOADED_CLUSTERS {
        create_running(&mut client, &format!("loaded-{c}"), 1).await;
    }
    let baseline = tokio::time::timeout(Duration::from_secs(30), load(&world, "baseline"))
        .await
        .expect("the baseline within 30 s");
    eprintln!("{}", baseline.line("baseline"));

    let (host, port) = (world.net.host_ip.clone(), relay.address().port());
    relay.set_delay(Duration::from_millis(100)..=Duration::from_millis(500));
    for replica in ["r1", "r2"] {
        world.net.lose(replica, &host, Some(port), 10);
    }
    let faulty = tokio::time::timeout(Duration::from_secs(60), load(&world, "faulty"))
        .await
        .expect("the faulty phase within 60 s");
    let dropped: u64 = ["r1", "r2"].map(|r| world.net.dropped(r)).iter().sum();
    eprintln!(
        "{}; {dropped} packets dropped",
        faulty.line("latency 100-500 ms + loss 10 %")
    );
    assert!(dropped > 0, "the loss dropped nothing: is it in place?");
    relay.set_delay(Duration::ZERO..=Duration::ZERO);
    for replica in ["r1", "r2"] {
        world.net.stop_losing(replica);
    }

    let mut operations = Vec::new();
    for c in 0..LOADED_CLUSTERS {
        operations.extend(world.check(&client, &format!("loaded-{c}")).await);
    }
    // Once each: every request id names one operation, the one accepted.
    let accepted: Vec<_> = baseline.accepted.iter().chain(&faulty.accepted).collect();
    assert_accepted_once(&operations, &accepted);
    // Nothing else ran: the first starts and the operations accepted.
    assert_eq!(operations.len(), LOADED_CLUSTERS + accepted.len());
    let resumed = resumed(&operations);
    eprintln!(
        "latency and loss: {} operations, all succeeded once ({resumed} resumed by a new \
         owner), lost: none",
        accepted.len()
    );
}
