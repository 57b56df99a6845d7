//! A sick etcd: its space quota exhausted (the NOSPACE alarm raised) while
//! an operation runs. Requests that write fail with RESOURCE_EXHAUSTED and
//! say what to do, nothing is half written, reads are still served, the
//! replica keeps its lease and its clusters; once an operator compacts,
//! defragments and disarms the alarm, everything resumes without a restart.
//!
//! Bounded: the fill stops at the alarm or after a fixed number of writes;
//! every wait has a deadline; loopback only.

use drover_client::v1::{self, OperationState as O};
use drover_server::store::{Op, Store, StoreError, Txn};
use drover_tests::etcd::EtcdProcess;
use drover_tests::history::{assert_transitions_are_edges, ends, provider_violations};
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, operations_of, owner, wait_running};
use std::time::{Duration, Instant};

/// etcd's space quota in the test: small, so a few writes exhaust it.
const QUOTA_BYTES: u64 = 16 * 1024 * 1024;
/// One filler value: large, overwritten in place so compaction frees it.
const FILLER_BYTES: usize = 512 * 1024;
/// Filler writes before giving up on raising the alarm.
const MAX_FILLS: usize = 4 * QUOTA_BYTES as usize / FILLER_BYTES;

/// Overwrites one key with large values until etcd refuses with NOSPACE;
/// returns how many writes it took.
async fn fill(store: &dyn Store) -> usize {
    let value = vec![b'x'; FILLER_BYTES];
    for written in 0..MAX_FILLS {
        let txn = Txn::new().and_then([Op::put("/filler", value.clone())]);
        match store.txn(txn).await {
            Ok(_) => {}
            Err(StoreError::NoSpace(_)) => return written,
            Err(error) => panic!("filling etcd: {error}"),
        }
    }
    panic!("etcd never raised its NOSPACE alarm after {MAX_FILLS} writes");
}

/// What PRODUCTION.md tells the operator to do: compact to the current
/// revision, defragment, disarm the alarm.
fn free_space(etcd: &EtcdProcess) {
    let status = etcd.etcdctl(&["endpoint", "status", "-w", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    let revision = status[0]["Status"]["header"]["revision"]
        .as_i64()
        .expect("a revision");
    etcd.etcdctl(&["compact", &revision.to_string(), "--physical"]);
    etcd.etcdctl(&["defrag"]);
    etcd.etcdctl(&["alarm", "disarm"]);
    let alarms = etcd.etcdctl(&["alarm", "list"]);
    assert!(alarms.trim().is_empty(), "alarms left: {alarms}");
}

#[tokio::test]
async fn an_etcd_out_of_space_refuses_writes_clearly_and_recovers_without_restarts() {
    let quota = QUOTA_BYTES.to_string();
    let etcd = EtcdProcess::start_with_args(&["--quota-backend-bytes", &quota]).await;
    let sim = SimProcess::start().await;
    let provider = sim.endpoint();
    let args = ["--provider", provider.as_str(), "--lease-ttl", "2"];
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &args).await;
    let mut client = replica.client().await;
    let cluster = create_running(&mut client, "full", 3).await;

    // An upgrade runs, slowly, when etcd fills up.
    sim.set_latency(Duration::from_millis(400)).await;
    let upgrade = client
        .clusters()
        .upgrade_cluster(v1::UpgradeClusterRequest {
            name: "full".into(),
            version: "1.30.0".into(),
            request_id: String::new(),
            allow_downgrade: false,
        })
        .await
        .expect("upgrade accepted")
        .into_inner();
    wait_running(&client, "full", &upgrade.id, Duration::from_secs(20)).await;
    let store = etcd.store().await;
    let fills = fill(&store).await;
    let alarms = etcd.etcdctl(&["alarm", "list"]);
    assert!(alarms.contains("NOSPACE"), "alarm list: {alarms}");

    // A write through Drover: RESOURCE_EXHAUSTED, saying what to do, and
    // nothing of it in etcd.
    let refused = client
        .clusters()
        .create_cluster(drover_tests::create_only("refused"))
        .await
        .expect_err("a create while etcd is full");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    for hint in ["out of space", "defragment", "etcdctl alarm disarm"] {
        assert!(refused.message().contains(hint), "{}", refused.message());
    }
    let written = etcd.etcdctl(&["get", "--prefix", "--keys-only", "/drover/"]);
    assert!(!written.contains("refused"), "half written: {written}");
    // Reads are served.
    let read = client.get_cluster("full").await.expect("a read");
    assert_eq!(read.uid, cluster.uid);

    // Keep-alives go on under the alarm: past three TTLs the replica is
    // still a member and still owns its cluster.
    let mut admin = v1::admin_client::AdminClient::connect(replica.endpoint())
        .await
        .unwrap();
    let full_since = Instant::now();
    while full_since.elapsed() < Duration::from_secs(6) {
        let members = admin
            .list_members(v1::ListMembersRequest {})
            .await
            .expect("members")
            .into_inner()
            .members;
        assert!(
            members.iter().any(|m| m.id == "r1"),
            "lease lost: {members:?}"
        );
        assert!(owner(&mut admin, "full").await.is_some(), "cluster dropped");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let request = v1::GetOperationRequest {
        cluster: "full".into(),
        id: upgrade.id.clone(),
    };
    let stuck = client.operations().get_operation(request).await.unwrap();
    assert_eq!(stuck.get_ref().state, O::Running as i32, "{stuck:?}");

    // The history so far (compaction will drop it): edges only.
    let history = assert_transitions_are_edges(&store, "/drover/v1/").await;
    assert_eq!(history.len(), 1);

    // The operator frees space: everything resumes, no restart.
    free_space(&etcd);
    let done = client
        .wait_operation(&upgrade, Duration::from_secs(60))
        .await
        .expect("wait");
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    sim.set_latency(Duration::ZERO).await;
    create_running(&mut client, "after", 1).await;

    // The provider's whole history: no stale or late call.
    let mut operations = operations_of(&client, "full").await;
    operations.extend(operations_of(&client, "after").await);
    let violations = provider_violations(&sim.audit("").await, &ends(&operations));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    eprintln!(
        "nospace: alarm after {fills} filler writes, upgrade {} resumed after {:?} refused; {} operations",
        upgrade.id,
        full_since.elapsed(),
        operations.len()
    );
}
