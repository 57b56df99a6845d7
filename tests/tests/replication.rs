//! Replication end to end: three replica processes, a real etcd and the
//! simulated provider process; kill -9, SIGSTOP past the TTL, SIGTERM,
//! membership changes and an etcd restart.

use drover_client::v1::{self, ClusterState as S, OperationState as O};
use drover_client::Client;
use drover_proto::provider::v1 as pb;
use drover_proto::v1::admin_client::AdminClient;
use drover_server::store::Store;
use drover_tests::etcd::EtcdProcess;
use drover_tests::fixture::Backends;
use drover_tests::history::assert_transitions_are_edges;
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{
    create_fleet, create_running, owner, scrape, wait_for_state, wait_running, wait_until, TempDir,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const TTL_SECONDS: u64 = 2;
/// Lease expiry is checked every 500 ms by etcd, the peer reconciles every
/// TTL/3 and the scanner runs every second: failover must fit in this.
const FAILOVER: Duration = Duration::from_secs(2 * TTL_SECONDS + 6);
/// kill -9 to a recovered, Running cluster: the TTL plus a small margin
/// (etcd's 500 ms expiry tick, the TTL/3 reconcile, the 1 s scanner).
const RECOVERY: Duration = Duration::from_secs(TTL_SECONDS + 4);

/// The reference's orphan handling (fail it), for the tests written for it.
const ORPHANS_FAIL: &[&str] = &["--orphaned-operations", "fail"];

/// Fields drop in order: replicas first, etcd last.
struct Cluster3 {
    replicas: Vec<(String, ReplicaProcess)>,
    sim: SimProcess,
    etcd: EtcdProcess,
}

impl Cluster3 {
    async fn start(count: usize, ttl: u64) -> Self {
        Self::start_with(count, ttl, &[]).await
    }

    /// Starts `count` replicas with `extra` flags each.
    async fn start_with(count: usize, ttl: u64, extra: &[&str]) -> Self {
        let Backends { sim, etcd } = Backends::start().await;
        let mut this = Self {
            etcd,
            sim,
            replicas: Vec::new(),
        };
        for i in 1..=count {
            this.add_with(&format!("r{i}"), ttl, extra).await;
        }
        this.wait_watched().await;
        this
    }

    /// Waits until no member record says `unwatched`: every replica is
    /// watched by its peers and takes its share, so ownership has settled.
    async fn wait_watched(&self) {
        let store = self.etcd.store().await;
        wait_until(Duration::from_secs(20), "every member watched", || {
            let store = &store;
            async move {
                let members = store
                    .range(drover_server::store::RangeRequest::prefix(
                        "/drover/v1/members/",
                    ))
                    .await
                    .expect("read the members");
                members.kvs.len() == self.replicas.len()
                    && members.kvs.iter().all(|kv| {
                        !String::from_utf8_lossy(&kv.value).contains("\"unwatched\":true")
                    })
            }
        })
        .await;
    }

    async fn add(&mut self, id: &str, ttl: u64) {
        self.add_with(id, ttl, &[]).await;
    }

    /// Adds a replica with `extra` flags.
    async fn add_with(&mut self, id: &str, ttl: u64, extra: &[&str]) {
        let ttl = ttl.to_string();
        let provider = self.sim.endpoint();
        let mut args = vec![
            "--provider",
            provider.as_str(),
            "--scan-interval",
            "1",
            "--lease-ttl",
            ttl.as_str(),
        ];
        args.extend_from_slice(extra);
        let replica = ReplicaProcess::serve_with(&self.etcd.endpoint(), id, &args).await;
        self.replicas.push((id.to_string(), replica));
    }

    fn replica(&self, id: &str) -> &ReplicaProcess {
        &self
            .replicas
            .iter()
            .find(|(r, _)| r == id)
            .expect("known replica")
            .1
    }

    fn replica_mut(&mut self, id: &str) -> &mut ReplicaProcess {
        &mut self
            .replicas
            .iter_mut()
            .find(|(r, _)| r == id)
            .expect("known replica")
            .1
    }

    /// A client of some replica other than `avoid`.
    async fn client_avoiding(&self, avoid: &str) -> Client {
        let (_, replica) = self
            .replicas
            .iter()
            .find(|(id, _)| id != avoid)
            .expect("another replica");
        replica.client().await
    }

    async fn admin_avoiding(&self, avoid: &str) -> AdminClient<tonic::transport::Channel> {
        let (_, replica) = self
            .replicas
            .iter()
            .find(|(id, _)| id != avoid)
            .expect("another replica");
        AdminClient::connect(replica.endpoint())
            .await
            .expect("admin client")
    }
}

/// Waits up to `deadline` until a replica other than `gone` owns `cluster`.
async fn wait_owner_other_than(
    admin: &AdminClient<tonic::transport::Channel>,
    cluster: &str,
    gone: &str,
    deadline: Duration,
) {
    let what = format!("a replica other than {gone} to own {cluster}");
    wait_until(deadline, &what, || {
        let mut admin = admin.clone();
        async move {
            owner(&mut admin, cluster)
                .await
                .is_some_and(|o| o.replica != gone)
        }
    })
    .await;
}

async fn upgrade(client: &mut Client, cluster: &str) -> v1::Operation {
    let request = v1::UpgradeClusterRequest {
        name: cluster.into(),
        version: "1.30.0".into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    client
        .clusters()
        .upgrade_cluster(request)
        .await
        .expect("upgrade")
        .into_inner()
}

#[tokio::test]
async fn kill_9_of_the_owner_mid_upgrade_fails_the_operation_and_recovers_the_cluster() {
    // The reference's behaviour, kept behind --orphaned-operations=fail.
    let mut c = Cluster3::start_with(3, TTL_SECONDS, ORPHANS_FAIL).await;
    let mut client = c.replicas[0].1.client().await;
    let cluster = create_running(&mut client, "victim", 3).await;
    let mut admin = c.admin_avoiding("").await;
    let before = owner(&mut admin, "victim").await.expect("an owner");
    c.sim.set_latency(Duration::from_millis(500)).await;
    let op = upgrade(&mut client, "victim").await;
    wait_running(&client, "victim", &op.id, Duration::from_secs(20)).await;

    c.replica_mut(&before.replica).kill9();
    let killed = Instant::now();
    let mut client = c.client_avoiding(&before.replica).await;
    let failed = client.wait_operation(&op, RECOVERY).await.unwrap();
    assert_eq!(
        failed.state,
        O::Failed as i32,
        "orphan recovered within {RECOVERY:?}: {failed:?}"
    );
    let message = failed.error.unwrap().message;
    assert!(
        message.contains(&format!("replica {}", before.replica)),
        "{message}"
    );
    assert!(message.contains("step"), "{message}");
    c.sim.set_latency(Duration::ZERO).await;
    let mut probe = client.clone();
    let left = RECOVERY.saturating_sub(killed.elapsed());
    wait_for_state(&probe, "victim", S::Running, left).await;
    eprintln!("kill -9 to Running again: {:?}", killed.elapsed());
    let after = owner(&mut c.admin_avoiding(&before.replica).await, "victim")
        .await
        .unwrap();
    assert_ne!(after.replica, before.replica);
    assert!(after.epoch > before.epoch, "a new owner has a newer epoch");
    assert_eq!(probe.get_cluster("victim").await.unwrap().uid, cluster.uid);
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

/// The default (`--orphaned-operations=resume`): the new owner fences the
/// provider, then goes on from the step the lost owner had persisted, and
/// the operation succeeds; its record names both owners.
#[tokio::test]
async fn kill_9_of_the_owner_mid_upgrade_resumes_the_operation_on_a_new_owner() {
    let mut c = Cluster3::start(3, TTL_SECONDS).await;
    let mut client = c.replicas[0].1.client().await;
    create_running(&mut client, "resumed", 3).await;
    let mut admin = c.admin_avoiding("").await;
    let before = owner(&mut admin, "resumed").await.expect("an owner");
    c.sim.set_latency(Duration::from_millis(500)).await;
    let op = upgrade(&mut client, "resumed").await;
    wait_running(&client, "resumed", &op.id, Duration::from_secs(20)).await;

    c.replica_mut(&before.replica).kill9();
    let mut client = c.client_avoiding(&before.replica).await;
    let done = client.wait_operation(&op, FAILOVER * 3).await.unwrap();
    assert_eq!(done.state, O::Succeeded as i32, "resumed: {done:?}");
    let runs: Vec<(&str, i64)> = done
        .runs
        .iter()
        .map(|run| (run.replica.as_str(), run.epoch))
        .collect();
    assert_eq!(runs.len(), 2, "both owners are recorded: {runs:?}");
    assert_eq!(runs[0].0, before.replica);
    assert_ne!(runs[1].0, before.replica);
    assert!(runs[1].1 > runs[0].1, "a newer epoch: {runs:?}");
    let cluster = client.get_cluster("resumed").await.unwrap();
    assert_eq!(cluster.spec.unwrap().version, "1.30.0");
    let status = cluster.status.unwrap();
    assert_eq!(status.state, Some(S::Running as i32));
    let nodes = status.nodes;
    assert!(nodes.iter().all(|n| n.version == "1.30.0"), "{nodes:?}");
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

/// Every node call takes about three claim windows (1.6 s at TTL 2): each
/// call is cut at its deadline and sent again, the provider's work going
/// on across them, and the owner is killed mid-upgrade; the new owner's
/// resumed call carries on with the same work.
#[tokio::test]
async fn an_upgrade_whose_node_calls_outlast_the_claim_window_succeeds_through_a_kill_9() {
    let mut c = Cluster3::start(3, TTL_SECONDS).await;
    let mut client = c.replicas[0].1.client().await;
    let cluster = create_running(&mut client, "slow", 2).await;
    let nodes = node_ids(&c.sim, &cluster.uid).await;
    let mut admin = c.admin_avoiding("").await;
    let before = owner(&mut admin, "slow").await.expect("an owner");
    c.sim.set_latency(Duration::from_millis(5_000)).await;
    let op = upgrade(&mut client, "slow").await;
    let mut client = c.client_avoiding(&before.replica).await;
    wait_step(&client, "slow", &op.id, 2, Duration::from_secs(30)).await;

    c.replica_mut(&before.replica).kill9();
    let done = client
        .wait_operation(&op, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    assert_eq!(
        done.runs.len(),
        2,
        "resumed by a new owner: {:?}",
        done.runs
    );
    assert_upgrade_audit(&c.sim.audit(&cluster.uid).await, &done, &nodes);
    let provider_nodes = c.sim.nodes(&cluster.uid).await;
    assert!(
        provider_nodes.iter().all(|n| n.version == "1.30.0"),
        "{provider_nodes:?}"
    );
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

/// Two processes with one replica id (cloned machines share the default,
/// the host name): the second finds the first answering at its admin port
/// with the member record's lease and refuses to start, naming that
/// address, with exit code 78; the first keeps its lease and its clusters.
#[tokio::test]
async fn a_second_process_with_a_live_replica_id_refuses_to_start_and_revokes_nothing() {
    let c = Cluster3::start(1, TTL_SECONDS).await;
    let mut client = c.replicas[0].1.client().await;
    create_running(&mut client, "kept", 1).await;
    let store = c.etcd.store().await;
    let member = || async {
        let kv = store.get("/drover/v1/members/r1").await.unwrap();
        kv.into_single().expect("r1 is a member").lease
    };
    let lease = member().await;
    let mut admin = c.admin_avoiding("").await;
    let owned = owner(&mut admin, "kept").await.expect("an owner");

    let (port, admin_port) = (drover_tests::free_port(), drover_tests::free_port());
    let mut twin = std::process::Command::new(drover_tests::workspace_binary("drover"));
    twin.arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .args(["--etcd-endpoints", &c.etcd.endpoint()])
        .args(["--provider", &c.sim.endpoint(), "--lease-ttl", "2"])
        .args(["--replica-id", "r1"]);
    let exited = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || twin.output().expect("run drover")),
    )
    .await
    .expect("the twin exits by itself")
    .unwrap();
    let stderr = String::from_utf8_lossy(&exited.stderr);
    assert_eq!(exited.status.code(), Some(78), "{stderr}");
    let first = c.replica("r1").admin_endpoint();
    let first = first.trim_start_matches("http://");
    assert!(stderr.contains(first), "names {first}: {stderr}");
    assert!(stderr.contains("replica id r1"), "{stderr}");
    assert_eq!(member().await, lease, "the first keeps its member record");
    assert!(store.lease_time_to_live(lease).await.unwrap().is_some());
    let now = owner(&mut admin, "kept").await.expect("an owner");
    assert_eq!((now.replica, now.epoch), (owned.replica, owned.epoch));
}

/// A stop RUNNING when its owner is killed, every describe failing from
/// then on: the new owner cannot fence the provider. Returns the cluster
/// and the stop, once the new owner says so in the cluster's status.
async fn orphan_that_cannot_be_fenced(c: &mut Cluster3, cluster: &str) -> (Client, v1::Operation) {
    let mut client = c.replicas[0].1.client().await;
    create_running(&mut client, cluster, 1).await;
    let mut admin = c.admin_avoiding("").await;
    let before = owner(&mut admin, cluster).await.expect("an owner");
    c.sim.set_latency(Duration::from_secs(2)).await;
    let request = v1::StopClusterRequest {
        name: cluster.into(),
        request_id: String::new(),
        ..Default::default()
    };
    let stop = client
        .clusters()
        .stop_cluster(request)
        .await
        .unwrap()
        .into_inner();
    wait_running(&client, cluster, &stop.id, FAILOVER).await;
    c.sim
        .set_faults("DescribeCluster:error=1", 1, Duration::ZERO)
        .await;
    c.replica_mut(&before.replica).kill9();
    let client = c.client_avoiding(&before.replica).await;
    wait_until(FAILOVER, "the new owner to say it cannot fence", || {
        let mut client = client.clone();
        async move {
            let status = client
                .get_cluster(cluster)
                .await
                .ok()
                .and_then(|c| c.status);
            status
                .and_then(|s| s.message)
                .is_some_and(|m| m.contains("cannot fence the provider"))
        }
    })
    .await;
    (client, stop)
}

/// An orphan whose fence cannot succeed ends on a cancel: CANCELLED, its
/// message saying the provider could not be fenced, the cluster moved by
/// the table's OperationFailed edge.
#[tokio::test]
async fn a_cancel_ends_an_orphan_whose_fence_cannot_succeed() {
    let mut c = Cluster3::start(2, TTL_SECONDS).await;
    let (mut client, stop) = orphan_that_cannot_be_fenced(&mut c, "unfenced").await;
    let cancel = v1::CancelOperationRequest {
        cluster: "unfenced".into(),
        id: stop.id.clone(),
    };
    client
        .operations()
        .cancel_operation(cancel)
        .await
        .expect("cancel accepted");
    let done = client.wait_operation(&stop, FAILOVER * 2).await.unwrap();
    assert_eq!(done.state, O::Cancelled as i32, "{done:?}");
    let message = done.error.expect("an error").message;
    assert!(message.contains("could not be fenced"), "{message}");
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

/// The same orphan, its provider gone for good: an admin abandons it. A
/// reason is required (refused without one, nothing written); then it
/// ends FAILED at once, saying Drover cannot prove the provider stopped,
/// and keeps the reason.
#[tokio::test]
async fn an_admin_abandons_an_orphan_whose_fence_cannot_succeed() {
    let mut c = Cluster3::start(2, TTL_SECONDS).await;
    let (mut client, stop) = orphan_that_cannot_be_fenced(&mut c, "unfenced").await;
    let abandon = |reason: &str| v1::AbandonOperationRequest {
        cluster: "unfenced".into(),
        id: stop.id.clone(),
        reason: reason.into(),
    };
    let refused = client
        .operations()
        .abandon_operation(abandon(" "))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().starts_with("reason:"), "{refused:?}");
    let now = client.operations().get_operation(v1::GetOperationRequest {
        cluster: "unfenced".into(),
        id: stop.id.clone(),
    });
    let now = now.await.unwrap().into_inner();
    assert!(
        !now.cancel_requested && now.abandon_reason.is_empty(),
        "{now:?}"
    );

    let reason = "provider decommissioned (ticket 42)";
    client
        .operations()
        .abandon_operation(abandon(reason))
        .await
        .expect("abandon accepted");
    let done = client.wait_operation(&stop, FAILOVER * 2).await.unwrap();
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    assert_eq!(done.abandon_reason, reason);
    let error = done.error.expect("an error");
    assert_eq!(error.code, "Aborted", "{error:?}");
    assert!(
        error
            .message
            .contains("cannot prove that the provider stopped"),
        "{}",
        error.message
    );
    assert!(error.message.contains(reason), "{}", error.message);
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

/// The same orphan with no cancel: its stop timeout (8 s) counts from its
/// acceptance, not from a fence that never comes, and ends it FAILED.
#[tokio::test]
async fn an_orphan_whose_fence_cannot_succeed_times_out_from_its_acceptance() {
    let mut c = Cluster3::start_with(2, TTL_SECONDS, &["--operation-timeout", "stop=8"]).await;
    let (mut client, stop) = orphan_that_cannot_be_fenced(&mut c, "unfenced").await;
    let done = client.wait_operation(&stop, FAILOVER * 2).await.unwrap();
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    let error = done.error.expect("an error");
    assert_eq!(error.code, "DeadlineExceeded", "{error:?}");
    assert!(
        error.message.contains("counted from its acceptance"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("could not be fenced"),
        "{}",
        error.message
    );
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

/// Crashed peers whose member key `admins` removed (the lease is revoked
/// later, once their owner keys are drained: a round may end first).
async fn members_deposed(admins: &[String]) -> f64 {
    let mut deposed = 0.0;
    for admin in admins {
        let samples = drover_tests::scrape::metrics(admin).await;
        deposed += drover_tests::scrape::sum(&samples, "drover_peer_members_deposed_total", "");
    }
    deposed
}

/// Replicas die young when a deployment comes up, in rolling restarts and
/// crash loops. Ten times, two replicas start over clusters nobody owns
/// and a third joins them at once, and is killed -9 as soon as it owns its
/// first cluster (polled every 10 ms), at TTL 15 s. It claims nothing
/// before both peers hold a liveness connection to it, so each crash is
/// seen by a peer and its clusters are with the others long before the
/// TTL (it used to claim at once, and a crash before the peers connected
/// cost a TTL).
///
/// The peers are up before it joins: "both peers" are the members its
/// first look finds. Three processes started in the same instant may not
/// see each other's member records yet, and one that sees none claims at
/// once (a lone replica must); its crash in that first instant is left
/// to the TTL (`replication/liveness.rs`, Caveats). Under a loaded
/// machine that happened in 1 of 10 rounds, which is why they are not
/// started together here.
#[tokio::test]
async fn a_replica_killed_right_after_its_first_claim_costs_no_ttl() {
    const TTL: &str = "15";
    let Backends { sim, etcd } = Backends::start().await;
    let provider = sim.endpoint();
    let args = [
        "--provider",
        provider.as_str(),
        "--lease-ttl",
        TTL,
        "--scan-interval",
        "1",
    ];
    let names: Vec<String> = (0..6).map(|i| format!("young-{i}")).collect();
    {
        let mut first = ReplicaProcess::serve_with(&etcd.endpoint(), "r0", &args).await;
        let mut client = first.client().await;
        for name in &names {
            create_running(&mut client, name, 1).await;
        }
        // A clean stop revokes its lease: the clusters are nobody's.
        first.terminate().await;
    }
    let mut took = Vec::new();
    let mut deposed = 0.0;
    for round in 0..10 {
        let young = format!("y{round}");
        let endpoint = etcd.endpoint();
        let (mut r1, mut r2) = tokio::join!(
            ReplicaProcess::serve_with(&endpoint, "r1", &args),
            ReplicaProcess::serve_with(&endpoint, "r2", &args),
        );
        let mut y = ReplicaProcess::serve_with(&endpoint, &young, &args).await;
        let admin = y.admin_endpoint();
        wait_until(
            Duration::from_secs(20),
            "the young replica's first claim",
            || {
                let admin = admin.clone();
                async move {
                    let samples = drover_tests::scrape::metrics(&admin).await;
                    drover_tests::scrape::sum(&samples, "drover_clusters_owned", "") >= 1.0
                }
            },
        )
        .await;
        y.kill9();
        let killed = Instant::now();
        let mut r1_admin = AdminClient::connect(r1.endpoint()).await.unwrap();
        let what = format!("the clusters of {young} with r1 and r2");
        wait_until(Duration::from_secs(10), &what, || {
            let (mut admin, names) = (r1_admin.clone(), names.clone());
            async move {
                for name in &names {
                    let now = owner(&mut admin, name).await;
                    if !now.is_some_and(|o| o.replica == "r1" || o.replica == "r2") {
                        return false;
                    }
                }
                true
            }
        })
        .await;
        took.push(killed.elapsed());
        // The deposer counts its depose once etcd answered it, which may be
        // after the other peer already claimed what the lease held: read
        // at the round's end, summed over the rounds.
        let peers = [r1.admin_endpoint(), r2.admin_endpoint()];
        deposed += members_deposed(&peers).await;
        let _ = &mut r1_admin;
        r1.terminate().await;
        r2.terminate().await;
    }
    took.sort();
    eprintln!(
        "kill -9 right after the first claim, 10 times at TTL {TTL} s: clusters with the others after {:?} (median), {:?} (slowest)",
        took[took.len() / 2],
        took[took.len() - 1]
    );
    // Rarely (2 full-suite runs of about 10), one round's crash was not
    // counted by the round's end although its clusters had moved well
    // inside the TTL: left for a look (see the closing note); the moves
    // above are the test's claim.
    eprintln!("crashed peers deposed: {deposed}");
    assert!(deposed >= 1.0, "no crash was seen by a peer");
}

#[tokio::test]
async fn a_paused_owner_that_wakes_after_its_lease_expired_changes_nothing() {
    let c = Cluster3::start_with(3, TTL_SECONDS, ORPHANS_FAIL).await;
    let mut client = c.replicas[0].1.client().await;
    let cluster = create_running(&mut client, "zombie", 3).await;
    let mut admin = c.admin_avoiding("").await;
    let paused = owner(&mut admin, "zombie").await.expect("an owner");
    c.sim.set_latency(Duration::from_millis(300)).await;
    let op = upgrade(&mut client, "zombie").await;
    wait_running(&client, "zombie", &op.id, Duration::from_secs(20)).await;

    c.replica(&paused.replica).signal("STOP");
    let mut client = c.client_avoiding(&paused.replica).await;
    let admin = c.admin_avoiding(&paused.replica).await;
    let failed = client.wait_operation(&op, FAILOVER).await.unwrap();
    assert_eq!(failed.state, O::Failed as i32, "{failed:?}");
    let probe = admin.clone();
    wait_owner_other_than(&admin, "zombie", &paused.replica, FAILOVER).await;
    let audited_before_wake = c.sim.audit(&cluster.uid).await.len();

    c.replica(&paused.replica).signal("CONT");
    // It notices it lost its lease and rejoins with a new one.
    wait_until(FAILOVER, "the woken replica to rejoin", || {
        let mut probe = probe.clone();
        let paused = paused.replica.clone();
        async move {
            let members = probe
                .list_members(v1::ListMembersRequest {})
                .await
                .unwrap()
                .into_inner()
                .members;
            members.iter().any(|m| m.id == paused)
        }
    })
    .await;
    let audit = c.sim.audit(&cluster.uid).await;
    let stale: Vec<_> = audit[audited_before_wake..]
        .iter()
        .filter(|e| e.token.as_ref().unwrap().epoch <= paused.epoch)
        .collect();
    assert!(
        stale.is_empty(),
        "provider calls accepted from the woken owner: {stale:?}"
    );
    let record = client
        .operations()
        .get_operation(v1::GetOperationRequest {
            cluster: "zombie".into(),
            id: op.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        record, failed,
        "the woken owner did not rewrite the failed operation"
    );
    // Ownership may move back to the woken replica, but only under a new
    // lease and a newer epoch.
    wait_until(FAILOVER, "an owner with a newer epoch", || {
        let mut admin = admin.clone();
        let old = paused.epoch;
        async move {
            owner(&mut admin, "zombie")
                .await
                .is_some_and(|o| o.epoch > old)
        }
    })
    .await;
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

#[tokio::test]
async fn sigterm_hands_clusters_off_faster_than_the_ttl() {
    // A long TTL: only the revoke on SIGTERM can make the hand-off quick.
    let mut c = Cluster3::start(3, 20).await;
    let mut client = c.replicas[0].1.client().await;
    create_running(&mut client, "handed", 1).await;
    let mut admin = c.admin_avoiding("").await;
    let before = owner(&mut admin, "handed").await.expect("an owner");
    let mut admin = c.admin_avoiding(&before.replica).await;
    let status = c.replica_mut(&before.replica).terminate().await;
    assert!(status.success(), "{status:?}");
    let stopped = Instant::now();
    wait_owner_other_than(&admin, "handed", &before.replica, Duration::from_secs(10)).await;
    eprintln!(
        "SIGTERM hand-off: {:?} after exit (TTL 20 s)",
        stopped.elapsed()
    );
    let members = admin
        .list_members(v1::ListMembersRequest {})
        .await
        .unwrap()
        .into_inner()
        .members;
    assert!(
        members.iter().all(|m| m.id != before.replica),
        "the lease was revoked"
    );
}

/// SIGTERM lets a running operation finish when it needs less than the
/// hand-off grace (5 s), even past the lease TTL: the replica keeps its
/// lease alive until it resigns. Keep-alives used to stop at the signal, so
/// with a 2 s TTL the lease expired mid-operation, its completion was
/// fenced out and a peer failed it as an orphan. Each provider call is
/// shorter than the claim's deadline (a TTL less its margin); the upgrade of
/// four nodes takes longer than the TTL.
#[tokio::test]
async fn sigterm_lets_an_operation_longer_than_the_ttl_finish() {
    let mut c = Cluster3::start(2, 2).await;
    let mut client = c.replicas[0].1.client().await;
    create_running(&mut client, "busy", 3).await;
    let mut admin = c.admin_avoiding("").await;
    let owner_id = owner(&mut admin, "busy").await.expect("an owner").replica;
    let mut peer = c.client_avoiding(&owner_id).await;
    c.sim.set_latency(Duration::from_millis(700)).await;
    let request = v1::UpgradeClusterRequest {
        name: "busy".into(),
        version: "1.30.0".into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    let op = peer
        .clusters()
        .upgrade_cluster(request)
        .await
        .unwrap()
        .into_inner();
    wait_running(&peer, "busy", &op.id, Duration::from_secs(10)).await;
    let status = c.replica_mut(&owner_id).terminate().await;
    assert!(status.success(), "{status:?}");
    let done = peer
        .wait_operation(&op, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    assert_eq!(done.replica.as_deref(), Some(owner_id.as_str()), "{done:?}");
}

/// SIGTERM with an operation that needs longer than the default hand-off
/// grace (5 s): with `--handoff-grace` covering it, it finishes on its
/// owner, which meanwhile shows as draining and hands its other clusters
/// over at once (they used to wait for the lease revoke after the
/// operation); a stop of one of those, accepted meanwhile, runs on the peer.
#[tokio::test]
async fn sigterm_finishes_a_long_operation_and_hands_the_idle_clusters_over_meanwhile() {
    // A long TTL: only the hand-off can move a cluster before the exit.
    let ttl = 20;
    let mut c = Cluster3::start(0, ttl).await;
    for id in ["r1", "r2"] {
        c.add_with(id, ttl, &["--handoff-grace", "40"]).await;
    }
    c.wait_watched().await;
    let mut client = c.replicas[0].1.client().await;
    let mut admin = c.admin_avoiding("").await;
    let mut by_owner: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..5 {
        let name = format!("drain-{i}");
        create_running(&mut client, &name, 1).await;
        let owner = owner(&mut admin, &name).await.expect("an owner").replica;
        by_owner.entry(owner).or_default().push(name);
    }
    let (owner_id, clusters) = by_owner
        .into_iter()
        .find(|(_, clusters)| clusters.len() >= 2)
        .expect("five clusters over two replicas: one owns two");
    let (busy, idle) = (clusters[0].clone(), clusters[1].clone());
    let mut peer = c.client_avoiding(&owner_id).await;
    let mut peer_admin = c.admin_avoiding(&owner_id).await;

    // Longer than the default grace.
    c.sim.set_latency(Duration::from_secs(8)).await;
    let request = v1::StopClusterRequest {
        name: busy.clone(),
        request_id: String::new(),
        ..Default::default()
    };
    let long = peer
        .clusters()
        .stop_cluster(request)
        .await
        .unwrap()
        .into_inner();
    wait_running(&peer, &busy, &long.id, Duration::from_secs(10)).await;
    c.replica(&owner_id).signal("TERM");

    wait_owner_other_than(&peer_admin, &idle, &owner_id, Duration::from_secs(5)).await;
    let request = v1::GetOperationRequest {
        cluster: busy.clone(),
        id: long.id.clone(),
    };
    let still = peer
        .operations()
        .get_operation(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        still.state,
        v1::OperationState::Running as i32,
        "the idle cluster moved before the long operation ended: {still:?}"
    );
    let members = peer_admin
        .list_members(v1::ListMembersRequest {})
        .await
        .unwrap()
        .into_inner()
        .members;
    let draining = members
        .iter()
        .find(|m| m.id == owner_id)
        .unwrap_or_else(|| panic!("{owner_id} still a member: {members:?}"));
    assert!(draining.draining, "{members:?}");
    assert!(members
        .iter()
        .filter(|m| m.id != owner_id)
        .all(|m| !m.draining));
    assert_eq!(
        owner(&mut peer_admin, &busy).await.map(|o| o.replica),
        Some(owner_id.clone()),
        "the busy cluster stays with the replica that runs its operation"
    );

    let request = v1::StopClusterRequest {
        name: idle.clone(),
        request_id: String::new(),
        ..Default::default()
    };
    let moved = peer
        .clusters()
        .stop_cluster(request)
        .await
        .unwrap()
        .into_inner();
    let done = peer
        .wait_operation(&long, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    assert_eq!(done.replica.as_deref(), Some(owner_id.as_str()), "{done:?}");
    let done = peer
        .wait_operation(&moved, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    assert_ne!(done.replica.as_deref(), Some(owner_id.as_str()), "{done:?}");

    let status = c.replica_mut(&owner_id).wait_exit().await;
    assert!(status.success(), "{status:?}");
    wait_owner_other_than(&peer_admin, &busy, &owner_id, Duration::from_secs(5)).await;
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

/// How many ownership passes `replica` has run.
async fn ownership_passes(replica: &ReplicaProcess) -> f64 {
    let samples = drover_tests::scrape::metrics(&replica.admin_endpoint()).await;
    drover_tests::scrape::sum(&samples, "drover_ownership_passes_total", "")
}

async fn owners(
    admin: &mut AdminClient<tonic::transport::Channel>,
    names: &[String],
) -> HashMap<String, String> {
    let mut owners = HashMap::new();
    for name in names {
        if let Some(owner) = owner(admin, name).await {
            owners.insert(name.clone(), owner.replica);
        }
    }
    owners
}

async fn wait_spread(
    admin: &AdminClient<tonic::transport::Channel>,
    names: &[String],
    members: &[&str],
) {
    let what = format!("{} clusters spread over {members:?}", names.len());
    wait_until(Duration::from_secs(30), &what, || {
        let mut admin = admin.clone();
        async move {
            let owners = owners(&mut admin, names).await;
            owners.len() == names.len()
                && names.iter().all(|name| {
                    owners.get(name).map(String::as_str)
                        == drover_server::replication::preferred(name, members.iter().copied())
                })
        }
    })
    .await;
}

#[tokio::test]
async fn two_hundred_clusters_spread_and_respread_over_membership_changes() {
    let mut c = Cluster3::start(3, TTL_SECONDS).await;
    let mut client = c.replicas[0].1.client().await;
    let names = create_fleet(&mut client, "fleet", 200).await;
    let admin = c.admin_avoiding("r3").await;
    wait_spread(&admin, &names, &["r1", "r2", "r3"]).await;
    // The 200 creations queued 200 changes on every replica. A pass takes
    // all that are queued, so the passes settle at the periodic rate (about
    // 1.5 a second at this TTL) as soon as the clusters are spread; taking
    // one change per pass, they ran 10 a second for 20 s more.
    for (id, replica) in &c.replicas {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut before = ownership_passes(replica).await;
        assert!(before > 0.0, "{id} reports no ownership passes");
        loop {
            // A window to count passes in, not a wait for an event.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = ownership_passes(replica).await;
            if now - before <= 3.0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} still runs {} ownership passes a second",
                now - before
            );
            before = now;
        }
    }
    let members = admin
        .clone()
        .list_members(v1::ListMembersRequest {})
        .await
        .unwrap()
        .into_inner()
        .members;
    for member in &members {
        assert!(
            member.clusters_owned >= 30,
            "{} owns only {}",
            member.id,
            member.clusters_owned
        );
    }

    c.replica_mut("r3").kill9();
    wait_spread(&admin, &names, &["r1", "r2"]).await;

    c.add("r4", TTL_SECONDS).await;
    wait_spread(&admin, &names, &["r1", "r2", "r4"]).await;
}

#[tokio::test]
async fn an_etcd_restart_mid_operation_loses_nothing() {
    let mut c = Cluster3::start(1, TTL_SECONDS).await;
    let mut client = c.replicas[0].1.client().await;
    create_running(&mut client, "steady", 3).await;
    c.sim.set_latency(Duration::from_millis(400)).await;
    let op = upgrade(&mut client, "steady").await;
    wait_running(&client, "steady", &op.id, Duration::from_secs(20)).await;
    c.etcd.restart().await;
    let done = client.wait_operation(&op, Duration::from_secs(60)).await;
    // The wait itself may have been cut by the restart: ask again.
    let done = match done {
        Ok(done) if done.state >= O::Succeeded as i32 => done,
        _ => {
            let mut probe = c.replicas[0].1.client().await;
            probe
                .wait_operation(&op, Duration::from_secs(60))
                .await
                .unwrap()
        }
    };
    assert!(
        done.state >= O::Succeeded as i32,
        "the operation ended: {done:?}"
    );
    c.sim.set_latency(Duration::ZERO).await;
    let mut probe = c.replicas[0].1.client().await;
    // Eventually Running (directly, or through Alert and a recovery when the
    // restart outlasted the lease): a liveness check, not a timing one.
    wait_for_state(&probe, "steady", S::Running, Duration::from_secs(30)).await;
    let listed = probe
        .operations()
        .list_operations(v1::ListOperationsRequest {
            cluster: "steady".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.operations.iter().any(|o| o.id == op.id),
        "the operation record survived"
    );
    // The watch cache lost its watch with etcd and re-listed: it serves the
    // cluster as etcd has it now.
    let linearizable = probe.get_cluster("steady").await.unwrap();
    wait_until(
        FAILOVER,
        "the watch cache to re-list after the restart",
        || {
            let mut probe = probe.clone();
            let expected = linearizable.clone();
            async move {
                let request = v1::GetClusterRequest {
                    name: "steady".into(),
                    linearizable: false,
                };
                probe
                    .clusters()
                    .get_cluster(request)
                    .await
                    .unwrap()
                    .into_inner()
                    == expected
            }
        },
    )
    .await;
    assert_transitions_are_edges(&c.etcd.store().await, "/drover/v1/").await;
}

#[tokio::test]
async fn the_client_fails_over_between_replicas_and_retries_lost_races() {
    let mut c = Cluster3::start(3, TTL_SECONDS).await;
    let endpoints: Vec<String> = c.replicas.iter().map(|(_, r)| r.endpoint()).collect();
    let drover = Client::connect_many(&endpoints).unwrap();
    let mut setup = c.replicas[0].1.client().await;
    create_running(&mut setup, "sturdy", 1).await;

    c.sim.set_latency(Duration::from_millis(500)).await;
    let busy = upgrade(&mut setup, "sturdy").await;
    // Busy now: a plain stop loses the race, the retrying one waits it out.
    let plain = setup
        .clusters()
        .stop_cluster(v1::StopClusterRequest {
            name: "sturdy".into(),
            request_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(plain.code(), tonic::Code::Aborted);
    let stop = drover
        .retrying(|mut client| async move {
            let request = v1::StopClusterRequest {
                name: "sturdy".into(),
                request_id: "stop-sturdy".into(),
                ..Default::default()
            };
            Ok(client.clusters().stop_cluster(request).await?.into_inner())
        })
        .await
        .expect("accepted once the upgrade ended");
    let mut waiter = drover.clone();
    assert_eq!(
        waiter.wait_operation(&busy, FAILOVER).await.unwrap().state,
        O::Succeeded as i32
    );
    assert_eq!(
        waiter.wait_operation(&stop, FAILOVER).await.unwrap().state,
        O::Succeeded as i32
    );

    // One replica gone: the same client keeps working through the others.
    c.sim.set_latency(Duration::ZERO).await;
    c.replica_mut("r1").kill9();
    for _ in 0..20 {
        let cluster = drover
            .retrying(|mut client| async move { client.get_cluster("sturdy").await })
            .await
            .expect("served by a live replica");
        assert_eq!(cluster.name, "sturdy");
    }
}

#[tokio::test]
async fn a_new_cluster_is_claimed_without_waiting_for_the_periodic_pass() {
    // With a 30 s TTL the periodic ownership pass runs every 10 s: the
    // first start of a new cluster must not wait for it.
    let ttl = 30;
    let env = Cluster3::start(2, ttl).await;
    let mut client = env.replicas[0].1.client().await;
    let mut admin = env.admin_avoiding("none").await;
    // Both replicas have joined and made their first pass.
    wait_until(Duration::from_secs(20), "two members", || {
        let mut admin = admin.clone();
        async move {
            admin
                .list_members(v1::ListMembersRequest {})
                .await
                .is_ok_and(|r| r.into_inner().members.len() == 2)
        }
    })
    .await;
    for name in ["fresh-a", "fresh-b", "fresh-c"] {
        let started = Instant::now();
        let cluster = create_running(&mut client, name, 1).await;
        let state = cluster.status.and_then(|status| status.state);
        assert_eq!(state, Some(S::Running as i32));
        assert!(
            owner(&mut admin, name).await.is_some(),
            "{name} has an owner"
        );
        assert!(
            started.elapsed() < Duration::from_secs(ttl / 3),
            "{name} waited {:?} for the periodic pass",
            started.elapsed()
        );
    }
}

/// A replica follows etcd through one watch of the key prefix (its cluster
/// cache's), which also feeds its operation waits, its owners view and its
/// ownership loop's member changes: etcd holds one watcher per replica,
/// not one per consumer.
#[tokio::test]
async fn each_replica_holds_one_etcd_watch() {
    let env = Cluster3::start(2, TTL_SECONDS).await;
    // Every consumer at work on both replicas: an operation waited for on
    // each (the feed starts on first use), and ownership passes.
    for (i, (_, replica)) in env.replicas.iter().enumerate() {
        create_running(&mut replica.client().await, &format!("watched-{i}"), 1).await;
    }
    let etcd = env.etcd.endpoint();
    wait_until(Duration::from_secs(10), "one watcher per replica", || {
        let etcd = etcd.clone();
        async move { etcd_watchers(&etcd).await == 2.0 }
    })
    .await;
    // And no other comes and goes with the passes (they run every 100 ms
    // at most, and at least every TTL/3).
    let deadline = Instant::now() + Duration::from_secs(TTL_SECONDS);
    while Instant::now() < deadline {
        assert_eq!(etcd_watchers(&etcd).await, 2.0, "etcd's watchers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The watchers etcd at `endpoint` holds now.
async fn etcd_watchers(endpoint: &str) -> f64 {
    let samples = scrape::metrics(endpoint).await;
    scrape::sum(&samples, "etcd_debugging_mvcc_watcher_total", "")
}

/// A replica whose lease etcd lost (revoked here behind its back) joins
/// again and wins its cluster back under a new epoch. The drive it had in
/// flight ends on the fence; the adoption had found that operation running
/// here and started nothing, so the orphan waited for the executor's 30 s
/// rescan. It is recovered at once now.
#[tokio::test]
async fn a_replica_that_wins_its_cluster_back_recovers_its_own_orphan_at_once() {
    let Backends { sim, etcd } = Backends::start().await;
    let ttl = TTL_SECONDS.to_string();
    let endpoint = sim.endpoint();
    let mut args = vec!["--provider", &endpoint, "--lease-ttl", &ttl];
    args.extend_from_slice(ORPHANS_FAIL);
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "solo", &args).await;
    let mut client = replica.client().await;
    create_running(&mut client, "c", 1).await;
    sim.set_latency(Duration::from_secs(3)).await;
    let request = v1::StopClusterRequest {
        name: "c".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let stop = client.clusters().stop_cluster(request).await.unwrap();
    let stop = stop.into_inner();
    wait_running(&client, "c", &stop.id, FAILOVER).await;
    let store = etcd.store().await;
    let member = store.get("/drover/v1/members/solo").await.unwrap();
    let member: serde_json::Value =
        serde_json::from_slice(&member.into_single().expect("member key").value).unwrap();
    let lease = member["lease"].as_i64().expect("lease id");
    store.revoke_lease(lease).await.expect("revoke");
    sim.set_latency(Duration::ZERO).await;
    let done = client
        .wait_operation(&stop, Duration::from_secs(15))
        .await
        .expect("wait");
    assert_eq!(done.state, O::Failed as i32, "recovered at once: {done:?}");
    assert_transitions_are_edges(&store, "/drover/v1/").await;
}

/// kill -9, then a restart under the same replica id (systemd
/// `Restart=always`): the new incarnation revokes its predecessor's lease
/// when it joins, so the clusters come back after the restart, not after
/// the TTL. The TTL here is far longer than the wait: only the revoke can
/// explain the hand-over.
#[tokio::test]
async fn a_restarted_replica_takes_its_clusters_back_without_waiting_for_the_ttl() {
    let Backends { sim, etcd } = Backends::start().await;
    let args = ["--provider", &sim.endpoint(), "--lease-ttl", "60"];
    let mut replica = ReplicaProcess::serve_with(&etcd.endpoint(), "solo", &args).await;
    let mut client = replica.client().await;
    create_running(&mut client, "c", 1).await;
    let mut admin = AdminClient::connect(replica.endpoint()).await.unwrap();
    let before = owner(&mut admin, "c").await.expect("an owner");

    replica.kill9();
    let restarted = ReplicaProcess::serve_with(&etcd.endpoint(), "solo", &args).await;
    let admin = AdminClient::connect(restarted.endpoint()).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the restarted replica owns c",
        || {
            let mut admin = admin.clone();
            async move {
                owner(&mut admin, "c")
                    .await
                    .is_some_and(|now| now.epoch > before.epoch)
            }
        },
    )
    .await;
    let mut client = restarted.client().await;
    let request = v1::StopClusterRequest {
        name: "c".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let stop = client.clusters().stop_cluster(request).await.unwrap();
    let stopped = client
        .wait_operation(&stop.into_inner(), Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(stopped.state, O::Succeeded as i32, "{stopped:?}");
    let metrics = drover_tests::http_get(&restarted.admin_endpoint(), "/metrics").1;
    assert!(
        metrics.contains("drover_previous_incarnations_revoked_total 1"),
        "{metrics}"
    );
}

/// A metric summed over the replicas other than `avoid`.
async fn peers_metric(c: &Cluster3, avoid: &str, name: &str) -> f64 {
    let mut total = 0.0;
    for (id, replica) in c.replicas.iter().filter(|(id, _)| id != avoid) {
        let samples = drover_tests::scrape::metrics(&replica.admin_endpoint()).await;
        let value = drover_tests::scrape::sum(&samples, name, "");
        eprintln!("{id}: {name} = {value}");
        total += value;
    }
    total
}

/// Waits until every replica holds a liveness connection to each of its
/// peers: before that, a test of what they do when one breaks proves
/// nothing.
async fn wait_liveness_connected(c: &Cluster3) {
    let peers = (c.replicas.len() - 1) as f64;
    for (_, replica) in &c.replicas {
        let admin = replica.admin_endpoint();
        wait_until(Duration::from_secs(10), "liveness connections", || {
            let admin = admin.clone();
            async move {
                let samples = drover_tests::scrape::metrics(&admin).await;
                drover_tests::scrape::sum(&samples, "drover_liveness_peers_connected", "") == peers
            }
        })
        .await;
    }
}

/// The operation as `client`'s replica reports it now.
async fn get_operation(client: &Client, cluster: &str, id: &str) -> v1::Operation {
    let request = v1::GetOperationRequest {
        cluster: cluster.into(),
        id: id.into(),
    };
    client
        .clone()
        .operations()
        .get_operation(request)
        .await
        .expect("get operation")
        .into_inner()
}

/// Polls until the operation is RUNNING at step `step` or a later one, so
/// that a kill lands in the middle of it.
async fn wait_step(client: &Client, cluster: &str, id: &str, step: u32, deadline: Duration) {
    let what = format!("the operation to reach step {step}");
    wait_until(deadline, &what, || async move {
        let now = get_operation(client, cluster, id).await;
        now.state == O::Running as i32 && now.progress.is_some_and(|p| p.step >= step)
    })
    .await;
}

/// Checks the provider's audit log of `done`, an upgrade of `nodes` to
/// 1.30.0 that each of `done.runs` ran in turn: every call carries the
/// epoch of a run and epochs never go back; no call landed once a newer
/// epoch had been accepted (the provider drained the lost owner's call in
/// flight, or it landed before the new owner's first); each node was
/// upgraded once, or once more under the next epoch for the one node in
/// flight when its owner was lost. Returns the calls per epoch.
fn assert_upgrade_audit(
    audit: &[pb::AuditEntry],
    done: &v1::Operation,
    nodes: &[String],
) -> HashMap<i64, usize> {
    let epochs: Vec<i64> = done.runs.iter().map(|run| run.epoch).collect();
    let calls: Vec<(i64, &str)> = audit
        .iter()
        .filter(|e| e.token.as_ref().is_some_and(|t| t.operation_id == done.id))
        .map(|e| {
            let epoch = e.token.as_ref().expect("a token").epoch;
            assert_eq!(e.method, "UpgradeNode", "{e:?}");
            assert!(e.error.is_empty(), "{e:?}");
            assert!(
                epochs.contains(&epoch),
                "an epoch of a run {epochs:?}: {e:?}"
            );
            assert_eq!(
                e.newest_epoch_at_landing, epoch,
                "landed after a fence: {e:?}"
            );
            // "upgraded <node> from <version> to <version>"
            let node = e.detail.split_whitespace().nth(1).expect("a node");
            (epoch, node)
        })
        .collect();
    assert!(
        calls.windows(2).all(|w| w[0].0 <= w[1].0),
        "epochs never go back: {calls:?}"
    );
    let mut per_node: HashMap<&str, Vec<i64>> = HashMap::new();
    for (epoch, node) in &calls {
        per_node.entry(node).or_default().push(*epoch);
    }
    let mut again = 0;
    for node in nodes {
        let upgrades = per_node.get(node.as_str()).cloned().unwrap_or_default();
        match upgrades[..] {
            [_] => {}
            [old, new] if new > old => again += 1,
            _ => panic!("{node} upgraded once, or again under the next epoch: {calls:?}"),
        }
    }
    assert_eq!(per_node.len(), nodes.len(), "only its nodes: {calls:?}");
    assert!(
        again <= 1,
        "only the node in flight is upgraded again: {calls:?}"
    );
    let mut per_epoch = HashMap::new();
    for (epoch, _) in &calls {
        *per_epoch.entry(*epoch).or_insert(0) += 1;
    }
    per_epoch
}

/// The ids of the nodes the provider holds for a cluster.
async fn node_ids(sim: &SimProcess, uid: &str) -> Vec<String> {
    sim.nodes(uid).await.into_iter().map(|n| n.id).collect()
}

/// Fast crash detection: with a 30 s TTL, kill -9 of the owner in the
/// middle of a 6-node upgrade breaks its peers' liveness connections,
/// their probes are refused, and one of them revokes its lease: a peer
/// owns the cluster and finishes the operation long before the TTL could
/// have run out. The provider saw each node upgraded once (or once more
/// under the new epoch), and nothing of the old epoch after the new one.
#[tokio::test]
async fn peers_revoke_a_killed_owners_lease_long_before_its_ttl() {
    let mut c = Cluster3::start(3, 30).await;
    let mut client = c.replicas[0].1.client().await;
    let cluster = create_running(&mut client, "crashed", 5).await;
    let nodes = node_ids(&c.sim, &cluster.uid).await;
    assert_eq!(nodes.len(), 6, "{nodes:?}");
    wait_liveness_connected(&c).await;
    let mut admin = c.admin_avoiding("").await;
    let before = owner(&mut admin, "crashed").await.expect("an owner");
    c.sim.set_latency(Duration::from_millis(500)).await;
    let op = upgrade(&mut client, "crashed").await;
    wait_step(&client, "crashed", &op.id, 3, Duration::from_secs(20)).await;

    c.replica_mut(&before.replica).kill9();
    let killed = Instant::now();
    let admin = c.admin_avoiding(&before.replica).await;
    wait_owner_other_than(&admin, "crashed", &before.replica, Duration::from_secs(5)).await;
    eprintln!("kill -9 to a new owner: {:?} (TTL 30 s)", killed.elapsed());
    let mut client = c.client_avoiding(&before.replica).await;
    let done = client
        .wait_operation(&op, Duration::from_secs(15))
        .await
        .unwrap();
    assert_eq!(done.state, O::Succeeded as i32, "resumed: {done:?}");
    eprintln!("kill -9 to SUCCEEDED: {:?} (TTL 30 s)", killed.elapsed());
    assert!(killed.elapsed() < Duration::from_secs(15), "within the TTL");
    let runs: Vec<(&str, i64)> = done
        .runs
        .iter()
        .map(|r| (r.replica.as_str(), r.epoch))
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0], (before.replica.as_str(), before.epoch));
    assert_ne!(runs[1].0, before.replica);
    assert!(runs[1].1 > runs[0].1, "a newer epoch: {runs:?}");
    let per_epoch = assert_upgrade_audit(&c.sim.audit(&cluster.uid).await, &done, &nodes);
    assert!(
        per_epoch.get(&runs[0].1) >= Some(&2),
        "mid-way: {per_epoch:?}"
    );
    assert!(per_epoch.contains_key(&runs[1].1), "resumed: {per_epoch:?}");
    let provider_nodes = c.sim.nodes(&cluster.uid).await;
    assert!(
        provider_nodes.iter().all(|n| n.version == "1.30.0"),
        "{provider_nodes:?}"
    );
    let detected = peers_metric(&c, &before.replica, "drover_peer_crashes_detected_total").await;
    assert!(detected >= 1.0, "a peer detected the crash");
    let revoked = peers_metric(&c, &before.replica, "drover_peer_leases_revoked_total").await;
    assert!(revoked >= 1.0, "a peer revoked the lease");
}

/// kill -9 of a replica that owns a hundred clusters: its peers remove its
/// member key, delete its owner keys in transactions of at most 64 and
/// claim the clusters, all long before its TTL; revoking its lease first
/// deleted every owner key in one etcd apply (33,000 of them held etcd for
/// 120 ms at 100,000 clusters). The lease is revoked once they are drained.
#[tokio::test]
async fn a_killed_owners_keys_are_drained_in_batches_not_in_one_apply() {
    let mut c = Cluster3::start(3, 30).await;
    let (names, admin, departing) = fleet_of_three(&mut c, "drain").await;
    c.replica_mut("r3").kill9();
    let killed = Instant::now();
    wait_spread(&admin, &names, &["r1", "r2"]).await;
    assert!(killed.elapsed() < Duration::from_secs(15), "within the TTL");
    let (r3_lease, r3_keys) = (departing.lease, departing.keys.len());
    departing.assert_drained_in_batches().await;
    let store = std::sync::Arc::new(c.etcd.store().await);
    wait_until(Duration::from_secs(10), "r3's lease revoked", || {
        let store = store.clone();
        async move { store.lease_time_to_live(r3_lease).await.unwrap().is_none() }
    })
    .await;
    let drained = peers_metric(&c, "r3", "drover_owner_keys_drained_total").await;
    assert_eq!(drained, r3_keys as f64);
}

/// SIGSTOP of a replica that owns a hundred clusters, which liveness
/// cannot see (a paused process keeps its connections open, as does a
/// host that lost power or its network): its lease runs out unrenewed.
/// Its peers remove its member key once etcd counts its lease within their
/// margin of its end (2 s of 10) and drain its owner keys in transactions
/// of at most 64; left to etcd, the lease's revocation deleted them all in
/// one apply.
#[tokio::test]
async fn a_paused_owners_keys_are_drained_in_batches_before_its_lease_expires() {
    let mut c = Cluster3::start(3, 10).await;
    let (names, admin, departing) = fleet_of_three(&mut c, "paused").await;
    c.replica_mut("r3").signal("STOP");
    wait_spread(&admin, &names, &["r1", "r2"]).await;
    departing.assert_drained_in_batches().await;
    let deposed = peers_metric(&c, "r3", "drover_peer_expiring_deposed_total").await;
    assert!(deposed >= 1.0, "a peer deposed r3 before its lease expired");
    let crashes = peers_metric(&c, "r3", "drover_peer_crashes_detected_total").await;
    assert_eq!(crashes, 0.0, "liveness saw nothing: the process was paused");
    c.replica_mut("r3").signal("CONT");
}

/// The owner keys of a replica about to leave, and a watch of every owner
/// key change from before it leaves.
struct Departing {
    lease: i64,
    keys: Vec<String>,
    watch: drover_server::store::WatchStream,
}

impl Departing {
    /// Waits until every owner key of the departing replica is deleted and
    /// asserts that no revision deleted more than 64 of them.
    async fn assert_drained_in_batches(mut self) {
        let mut deletes_per_revision: HashMap<i64, usize> = HashMap::new();
        let mut left: std::collections::HashSet<&String> = self.keys.iter().collect();
        while !left.is_empty() {
            let event = tokio::time::timeout(Duration::from_secs(10), self.watch.next())
                .await
                .expect("every owner key of the departing replica deleted")
                .expect("the watch goes on")
                .unwrap();
            let deleted = event.kind == drover_server::store::EventKind::Delete;
            if deleted && left.remove(&event.kv.key) {
                *deletes_per_revision
                    .entry(event.kv.mod_revision)
                    .or_default() += 1;
            }
        }
        let largest = deletes_per_revision.values().max().copied().unwrap_or(0);
        assert!(
            largest <= 64,
            "{largest} owner keys deleted in one revision"
        );
    }
}

/// 300 clusters spread over r1, r2 and r3, every liveness connection up;
/// r3's owner keys (more than 64) and a watch of the owner keys.
async fn fleet_of_three(
    c: &mut Cluster3,
    prefix: &str,
) -> (
    Vec<String>,
    AdminClient<tonic::transport::Channel>,
    Departing,
) {
    let mut client = c.replicas[0].1.client().await;
    let names = create_fleet(&mut client, prefix, 300).await;
    let admin = c.admin_avoiding("r3").await;
    wait_spread(&admin, &names, &["r1", "r2", "r3"]).await;
    wait_liveness_connected(c).await;
    let store = c.etcd.store().await;
    let owners = store
        .range(drover_server::store::RangeRequest::prefix(
            "/drover/v1/owners/",
        ))
        .await
        .unwrap();
    let member = store.get("/drover/v1/members/r3").await.unwrap();
    let lease = member.kvs[0].lease;
    let keys: Vec<String> = owners
        .kvs
        .iter()
        .filter(|kv| kv.lease == lease)
        .map(|kv| kv.key.clone())
        .collect();
    assert!(keys.len() > 64, "r3 owns {}: too few to tell", keys.len());
    let watch = store
        .watch("/drover/v1/owners/", owners.revision + 1)
        .await
        .unwrap();
    (names, admin, Departing { lease, keys, watch })
}

/// kill -9 of a lone replica mid-upgrade, then a restart under the same
/// replica id: the new incarnation revokes its predecessor's lease when it
/// joins, owns the cluster again under a newer epoch and resumes the
/// operation it was running. The TTL (60 s) is far longer than the wait:
/// only the revoke can explain it.
#[tokio::test]
async fn a_restarted_replica_resumes_its_operation_without_waiting_for_the_ttl() {
    let Backends { sim, etcd } = Backends::start().await;
    let endpoint = sim.endpoint();
    let args = ["--provider", &endpoint, "--lease-ttl", "60"];
    let mut replica = ReplicaProcess::serve_with(&etcd.endpoint(), "solo", &args).await;
    let mut client = replica.client().await;
    let cluster = create_running(&mut client, "c", 3).await;
    let nodes = node_ids(&sim, &cluster.uid).await;
    sim.set_latency(Duration::from_millis(500)).await;
    let op = upgrade(&mut client, "c").await;
    wait_step(&client, "c", &op.id, 2, Duration::from_secs(20)).await;

    replica.kill9();
    let killed = Instant::now();
    // Its log says why, should it not resume in time.
    let dir = TempDir::new("restarted-solo");
    let log = dir.path().join("solo.log");
    let env = [("RUST_LOG", "info")];
    let restarted = ReplicaProcess::serve_logged(&etcd.endpoint(), "solo", &args, &env, &log).await;
    let mut client = restarted.client().await;
    let done = client
        .wait_operation(&op, Duration::from_secs(15))
        .await
        .unwrap();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        done.state,
        O::Succeeded as i32,
        "resumed: {done:?}\nthe restarted replica's log:\n{log}"
    );
    eprintln!(
        "kill -9 to SUCCEEDED after a restart: {:?}",
        killed.elapsed()
    );
    assert!(killed.elapsed() < Duration::from_secs(15), "within the TTL");
    let runs: Vec<(&str, i64)> = done
        .runs
        .iter()
        .map(|r| (r.replica.as_str(), r.epoch))
        .collect();
    assert_eq!(runs.len(), 2, "both incarnations are recorded: {runs:?}");
    assert_eq!((runs[0].0, runs[1].0), ("solo", "solo"));
    assert!(runs[1].1 > runs[0].1, "a newer epoch: {runs:?}");
    let mut admin = AdminClient::connect(restarted.endpoint()).await.unwrap();
    let now = owner(&mut admin, "c").await.expect("an owner");
    assert_eq!((now.replica.as_str(), now.epoch), runs[1]);
    assert_upgrade_audit(&sim.audit(&cluster.uid).await, &done, &nodes);
    let provider_nodes = sim.nodes(&cluster.uid).await;
    assert!(
        provider_nodes.iter().all(|n| n.version == "1.30.0"),
        "{provider_nodes:?}"
    );
}

/// The operation as some replica not in `killed` reports it.
async fn live_operation(c: &Cluster3, killed: &[String], cluster: &str, id: &str) -> v1::Operation {
    let (_, replica) = c
        .replicas
        .iter()
        .find(|(r, _)| !killed.contains(r))
        .expect("a live replica");
    get_operation(&replica.client().await, cluster, id).await
}

/// A poison pill: an operation whose step takes down whichever replica
/// runs it (here the test kill -9s the replica its latest run names as
/// soon as that run is on the step). With `--orphan-resume-limit 1` it is
/// resumed once and failed at its second loss, by the third replica,
/// instead of killing every replica in turn; the error names the replica
/// lost last. Fast crash detection keeps each loss well under a second
/// despite the 30 s TTL.
#[tokio::test]
async fn a_poison_pill_operation_fails_after_the_orphan_resume_limit() {
    const LIMIT: usize = 1;
    let limit = LIMIT.to_string();
    let mut c = Cluster3::start_with(3, 30, &["--orphan-resume-limit", &limit]).await;
    let mut client = c.replicas[0].1.client().await;
    let cluster = create_running(&mut client, "poisoned", 2).await;
    wait_liveness_connected(&c).await;
    let provider_nodes = c.sim.nodes(&cluster.uid).await;
    let control = provider_nodes.iter().find(|n| n.role == "control");
    let poison = format!("upgrade node {} ", control.expect("a control node").id);
    // Each kill lands while the step's call still waits out this latency,
    // so it never lands and every run of the operation meets the step.
    c.sim.set_latency(Duration::from_secs(3)).await;
    let op = upgrade(&mut client, "poisoned").await;
    let started = Instant::now();
    let mut killed: Vec<String> = Vec::new();
    // Bounded: 30 s, and at most LIMIT + 1 kills.
    let done = loop {
        let now = live_operation(&c, &killed, "poisoned", &op.id).await;
        if now.state >= O::Succeeded as i32 {
            break now;
        }
        let at_poison = now.state == O::Running as i32
            && now
                .progress
                .as_ref()
                .is_some_and(|p| p.step_name.starts_with(&poison));
        let runner = now.runs.last().map(|run| run.replica.clone());
        if let Some(runner) = runner.filter(|r| at_poison && !killed.contains(r)) {
            assert!(
                killed.len() <= LIMIT,
                "killed {killed:?}, {runner} next: {now:?}"
            );
            eprintln!("kill -9 of {runner} at {:?}", started.elapsed());
            c.replica_mut(&runner).kill9();
            killed.push(runner);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the operation to end (killed {killed:?}): {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("poison pill FAILED after {:?}", started.elapsed());
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    let runs: Vec<&str> = done.runs.iter().map(|r| r.replica.as_str()).collect();
    assert_eq!(runs.len(), LIMIT + 1, "resumed {LIMIT} time(s): {runs:?}");
    assert_eq!(runs, killed, "each run was lost");
    assert!(
        done.runs.windows(2).all(|w| w[0].epoch < w[1].epoch),
        "{done:?}"
    );
    let message = done.error.expect("an error").message;
    let last = killed.last().expect("a kill");
    assert!(message.contains(&format!("replica {last} ")), "{message}");
}

/// A paused replica (SIGSTOP) keeps its liveness connections open and
/// does not answer probes: its peers cannot tell it from a partition, so
/// nothing is revoked and its TTL (30 s) decides. Woken before it, it goes
/// on owning its clusters under the same epoch.
#[tokio::test]
async fn a_paused_owner_is_not_taken_for_crashed() {
    let c = Cluster3::start(3, 30).await;
    let mut client = c.replicas[0].1.client().await;
    create_running(&mut client, "napping", 1).await;
    wait_liveness_connected(&c).await;
    let mut admin = c.admin_avoiding("").await;
    let before = owner(&mut admin, "napping").await.expect("an owner");
    let admin = c.admin_avoiding(&before.replica).await;

    c.replica(&before.replica).signal("STOP");
    let paused = Instant::now();
    // Bounded: polls for 5 s that the owner stays the paused replica.
    while paused.elapsed() < Duration::from_secs(5) {
        let now = owner(&mut admin.clone(), "napping").await;
        assert_eq!(
            now.as_ref().map(|o| (o.replica.as_str(), o.epoch)),
            Some((before.replica.as_str(), before.epoch)),
            "the paused owner's lease was not revoked"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    c.replica(&before.replica).signal("CONT");
    wait_liveness_connected(&c).await;
    let now = owner(&mut admin.clone(), "napping")
        .await
        .expect("an owner");
    assert_eq!(
        (now.replica, now.epoch),
        (before.replica.clone(), before.epoch)
    );
    let detected = peers_metric(&c, &before.replica, "drover_peer_crashes_detected_total").await;
    assert_eq!(detected, 0.0, "no crash detected");
    let deposed = peers_metric(&c, &before.replica, "drover_peer_members_deposed_total").await;
    assert_eq!(deposed, 0.0, "nobody deposed");
    let revoked = peers_metric(&c, &before.replica, "drover_peer_leases_revoked_total").await;
    assert_eq!(revoked, 0.0, "nothing revoked");
}
