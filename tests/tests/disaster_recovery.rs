//! Disaster recovery: etcd restored from a snapshot taken while clusters
//! existed and an upgrade was in flight, after more work had shown the
//! provider newer fencing epochs than the snapshot's revision. Drover comes
//! back on the restored data with no manual edit (replicas stopped before
//! the restore and started after it, as PRODUCTION.md says): the upgrade in
//! flight at the snapshot is recovered like an orphan, the provider accepts
//! the new owners' calls, and the history checker finds nothing wrong.
//!
//! Bounded: every wait has a deadline; loopback only; only processes this
//! test started are signalled.

use drover_client::v1::{self, OperationState as O};
use drover_server::store::Store;
use drover_tests::fixture::Backends;
use drover_tests::history::{assert_transitions_are_edges, ends, provider_violations};
use drover_tests::replica::ReplicaProcess;
use drover_tests::{
    create_running, operations_of, owner, start_upgrade, stop_and_start, wait_running, TempDir,
};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// Replica processes `ids` on `backends`, each waited for until it serves.
async fn replicas(backends: &Backends, ids: &[&str]) -> Vec<ReplicaProcess> {
    let args = ["--lease-ttl", "2", "--scan-interval", "1"];
    let mut started = Vec::new();
    for id in ids {
        started.push(backends.serve(id, &args).await);
    }
    started
}

/// The owner epoch of `cluster`, once it has an owner.
async fn epoch_of(replica: &ReplicaProcess, cluster: &str) -> i64 {
    let mut admin = v1::admin_client::AdminClient::connect(replica.endpoint())
        .await
        .unwrap();
    for _ in 0..100 {
        if let Some(owner) = owner(&mut admin, cluster).await {
            return owner.epoch;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{cluster} has no owner");
}

#[tokio::test]
async fn restoring_etcd_from_a_snapshot_recovers_in_flight_work_and_fencing() {
    let mut b = Backends::start().await;
    let mut before = replicas(&b, &["r1", "r2"]).await;
    let mut client = before[0].client().await;
    create_running(&mut client, "dr-busy", 3).await;
    create_running(&mut client, "dr-idle", 1).await;

    // The snapshot is taken while an upgrade runs.
    b.sim.set_latency(Duration::from_millis(300)).await;
    let upgrade = start_upgrade(&mut client, "dr-busy", "1.30.0").await;
    wait_running(&client, "dr-busy", &upgrade.id, WAIT).await;
    let backups = TempDir::new("etcd-backup");
    let snapshot = backups.path().join("snapshot.db");
    b.etcd.snapshot_save(&snapshot);
    let snapshot_revision = b.etcd.store().await.get("/").await.unwrap().revision;

    // More work after the snapshot: the upgrade ends, the idle cluster is
    // stopped and started, then new owners claim every cluster, so the
    // provider sees epochs above anything the restored etcd has written.
    let done = client.wait_operation(&upgrade, WAIT).await.expect("wait");
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    b.sim.set_latency(Duration::ZERO).await;
    stop_and_start(&mut client, "dr-idle", WAIT).await;
    for replica in &mut before {
        replica.kill9();
    }
    let later = replicas(&b, &["r3"]).await;
    let mut later_client = later[0].client().await;
    stop_and_start(&mut later_client, "dr-idle", WAIT).await;
    let newest_seen = epoch_of(&later[0], "dr-idle").await;
    assert!(newest_seen > snapshot_revision);
    drop(later);

    // The restore: every replica stopped, etcd restored, replicas started.
    b.etcd.restore(&snapshot).await;
    let after = replicas(&b, &["r1", "r2"]).await;
    let mut client = after[0].client().await;

    // The upgrade in flight at the snapshot was recovered like an orphan
    // (resumed, the default policy) and ended.
    let recovered = client.wait_operation(&upgrade, WAIT).await.expect("wait");
    assert_eq!(recovered.state, O::Succeeded as i32, "{recovered:?}");
    assert!(recovered.runs.len() >= 2, "not taken over: {recovered:?}");
    // The provider accepts the new owners: both clusters work, and a new
    // cluster reaches RUNNING.
    stop_and_start(&mut client, "dr-idle", WAIT).await;
    stop_and_start(&mut client, "dr-busy", WAIT).await;
    create_running(&mut client, "dr-new", 1).await;
    let epoch = epoch_of(&after[0], "dr-idle").await;
    assert!(epoch > newest_seen, "epoch {epoch} <= {newest_seen}");

    // The whole history: edges only in the restored etcd; the provider
    // never accepted a stale token nor a call after its operation ended.
    let store = b.etcd.store().await;
    let history = assert_transitions_are_edges(&store, "/drover/v1/").await;
    assert_eq!(history.len(), 3);
    let mut operations = Vec::new();
    for cluster in ["dr-busy", "dr-idle", "dr-new"] {
        operations.extend(operations_of(&client, cluster).await);
    }
    let audit = b.sim.audit("").await;
    let violations = provider_violations(&audit, &ends(&operations));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    eprintln!(
        "restore: snapshot at revision {snapshot_revision}, provider had seen epoch {newest_seen}, \
         new epoch {epoch}; {} operations, {} provider calls audited",
        operations.len(),
        audit.len()
    );
}

/// Stops and starts each of `clusters`, then has a new replica own them
/// (every replica killed, `id` started), and stops and starts them again:
/// the provider sees new owners' epochs at revisions well past the
/// snapshot's. Returns the newest owner epoch.
async fn work_then_new_owners(b: &Backends, clusters: &[&str], id: &str) -> i64 {
    let first = replicas(b, &["r1", "r2"]).await;
    let mut client = first[0].client().await;
    for cluster in clusters {
        stop_and_start(&mut client, cluster, WAIT).await;
    }
    drop(first);
    let later = replicas(b, &[id]).await;
    let mut client = later[0].client().await;
    let mut newest = 0;
    for cluster in clusters {
        stop_and_start(&mut client, cluster, WAIT).await;
        newest = newest.max(epoch_of(&later[0], cluster).await);
    }
    newest
}

/// A recovery drill restores one snapshot, runs for a while, then restores
/// the same snapshot again. Epochs never go backwards: after the second
/// restore every cluster is operable with no manual edit and no call is
/// refused as stale (the old scheme repeated the first restore's epochs).
#[tokio::test]
async fn restoring_one_snapshot_twice_keeps_every_cluster_operable() {
    let mut b = Backends::start().await;
    let clusters = ["drill-a", "drill-b"];
    {
        let before = replicas(&b, &["r1"]).await;
        let mut client = before[0].client().await;
        for cluster in clusters {
            create_running(&mut client, cluster, 1).await;
        }
    }
    let backups = TempDir::new("etcd-drill");
    let snapshot = backups.path().join("snapshot.db");
    b.etcd.snapshot_save(&snapshot);

    b.etcd.restore(&snapshot).await;
    let first = work_then_new_owners(&b, &clusters, "r3").await;
    b.etcd.restore(&snapshot).await;
    let second = work_then_new_owners(&b, &clusters, "r4").await;
    assert!(
        second > first,
        "epoch {second} after the second restore <= {first}"
    );

    let after = replicas(&b, &["r5"]).await;
    let client = after[0].client().await;
    let mut operations = Vec::new();
    for cluster in clusters {
        operations.extend(operations_of(&client, cluster).await);
    }
    let audit = b.sim.audit("").await;
    let violations = provider_violations(&audit, &ends(&operations));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    eprintln!("restored one snapshot twice: newest epoch {first} after the first, {second} after the second");
}
