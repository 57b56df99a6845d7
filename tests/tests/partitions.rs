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
use drover_tests::netns::Net;
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, operations_of, owner, wait_running, wait_until};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The replicas' lease TTL (seconds) and safety margin (percent).
const TTL: u64 = 2;
const MARGIN_PERCENT: u64 = 20;

/// Etcd (one member), two replicas and the provider, each in its own
/// namespace. Fields drop in order: processes first, the network last.
struct World {
    replicas: Vec<ReplicaProcess>,
    sim: SimProcess,
    etcd: EtcdCluster,
    net: Net,
}

impl World {
    /// `None` where namespaces cannot be made (the test then skips).
    async fn start(extra: &[&str]) -> Option<Self> {
        let net = Net::new(&["etcd", "r1", "r2", "sim"])?;
        let etcd = EtcdCluster::start_in(&[net.node("etcd").clone()]).await;
        let sim = SimProcess::start_in(net.node("sim"), &[]).await;
        let endpoints = etcd.endpoints().join(",");
        let provider = sim.endpoint();
        let ttl = TTL.to_string();
        let margin = MARGIN_PERCENT.to_string();
        let mut args = vec!["--provider", &provider, "--lease-ttl", &ttl];
        args.extend(["--lease-margin-percent", &margin, "--scan-interval", "1"]);
        args.extend(extra);
        let mut replicas = Vec::new();
        for id in ["r1", "r2"] {
            replicas.push(ReplicaProcess::serve_in(net.node(id), &endpoints, id, &args).await);
        }
        Some(Self {
            replicas,
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
        let upgrade = client
            .clusters()
            .upgrade_cluster(v1::UpgradeClusterRequest {
                name: name.into(),
                version: "1.30.0".into(),
                request_id: String::new(),
            })
            .await
            .expect("upgrade accepted")
            .into_inner();
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
        let cluster = client.clone().get_cluster(name).await.expect("get");
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
