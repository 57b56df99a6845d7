//! A lost provider: the simulator killed (kill -9) and restarted while an
//! upgrade runs. The simulator keeps its clusters and fencing epochs in
//! memory, so the new process has forgotten both: Drover must still end
//! the operation (no hang), every call the new process accepts carries the
//! current owner's epoch, and no step runs under two epochs.
//!
//! Bounded: every wait has a deadline; loopback only; only processes this
//! test started are signalled.

use drover_client::v1::{self, OperationState as O};
use drover_tests::fixture::Fixture;
use drover_tests::history::{assert_transitions_are_edges, ends, provider_violations};
use drover_tests::{create_running, operations_of, owner, start_upgrade, wait_running, wait_until};
use std::time::Duration;

#[tokio::test]
async fn a_provider_restarted_mid_upgrade_ends_the_operation_under_one_epoch() {
    let mut f = Fixture::builder().ttl(2).start().await;
    let (sim, client) = (&mut f.sim, &mut f.client);
    let cluster = create_running(client, "lost", 4).await;
    sim.set_latency(Duration::from_millis(300)).await;
    let upgrade = start_upgrade(client, "lost", "1.30.0").await;
    wait_running(client, "lost", &upgrade.id, Duration::from_secs(20)).await;
    // Mid-upgrade: at least one node upgraded, more to go.
    wait_until(Duration::from_secs(20), "a node upgraded", || {
        let sim = &*sim;
        async move {
            sim.audit("")
                .await
                .iter()
                .any(|e| e.method == "UpgradeNode")
        }
    })
    .await;
    sim.restart().await;
    sim.set_latency(Duration::from_millis(300)).await;

    let done = client
        .wait_operation(&upgrade, Duration::from_secs(60))
        .await
        .expect("the upgrade ends");
    assert!(done.state >= O::Succeeded as i32, "{done:?}");
    eprintln!(
        "lost provider: upgrade ended {:?}: {}",
        O::try_from(done.state),
        done.error.as_ref().map_or("", |e| e.message.as_str())
    );

    // The restarted provider saw only the owner's current epoch, and the
    // operation ran under one epoch.
    let mut admin = v1::admin_client::AdminClient::connect(f.replicas[0].endpoint())
        .await
        .unwrap();
    let epoch = owner(&mut admin, "lost").await.expect("an owner").epoch;
    let audit = sim.audit("").await;
    for entry in &audit {
        let token = entry.token.as_ref().expect("a token");
        assert_eq!(token.epoch, epoch, "a call under another epoch: {entry:?}");
    }
    let epochs: Vec<i64> = done.runs.iter().map(|r| r.epoch).collect();
    assert!(epochs.iter().all(|&e| e == epoch), "runs {epochs:?}");
    let operations = operations_of(client, "lost").await;
    let violations = provider_violations(&audit, &ends(&operations));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    assert_transitions_are_edges(&f.etcd.store().await, "/drover/v1/").await;

    // The cluster is usable afterwards: a repair (Recover) or a stop is
    // accepted and ends.
    sim.set_latency(Duration::ZERO).await;
    let stop = client
        .clusters()
        .stop_cluster(v1::StopClusterRequest {
            name: "lost".into(),
            request_id: String::new(),
            ..Default::default()
        })
        .await;
    if let Ok(stop) = stop {
        let stopped = client
            .wait_operation(&stop.into_inner(), Duration::from_secs(30))
            .await
            .expect("the stop ends");
        assert!(stopped.state >= O::Succeeded as i32, "{stopped:?}");
    }
    eprintln!(
        "lost provider: cluster {} ended in {:?}; {} calls audited by the restarted provider",
        cluster.uid,
        client
            .get_cluster("lost")
            .await
            .unwrap()
            .status
            .map(|s| s.state),
        audit.len()
    );
}

/// A replica over etcd and a simulator that answers UNAVAILABLE to every
/// node upgrade, and an upgrade of cluster `name` (2 workers) accepted.
async fn refusing(name: &str) -> (Fixture, v1::Operation) {
    let mut f = Fixture::builder().ttl(2).start().await;
    create_running(&mut f.client, name, 2).await;
    f.sim
        .set_faults("UpgradeNode:error=1", 7, Duration::ZERO)
        .await;
    let upgrade = start_upgrade(&mut f.client, name, "1.30.0").await;
    (f, upgrade)
}

/// Every accepted operation ended, no provider call stale or late, the
/// transitions on the table.
async fn check(f: &Fixture, name: &str) {
    let operations = operations_of(&f.client, name).await;
    let audit = f.sim.audit("").await;
    let violations = provider_violations(&audit, &ends(&operations));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    f.check_history().await;
}

/// A provider that keeps answering UNAVAILABLE (it is up, and says the
/// call may pass, but it does not): the step is asked again a bounded
/// number of times, about 16 s of waits, then the upgrade fails with the
/// provider's own message, not at its hour-long timeout.
#[tokio::test]
async fn an_upgrade_the_provider_keeps_refusing_fails_with_its_message() {
    let (mut f, upgrade) = refusing("refused").await;
    let started = std::time::Instant::now();
    let done = f
        .client
        .wait_operation(&upgrade, Duration::from_secs(40))
        .await
        .expect("the upgrade ends");
    assert_eq!(done.state, O::Failed as i32, "{done:?}");
    let message = done.error.as_ref().map_or("", |e| e.message.as_str());
    assert!(
        message.contains("injected fault in UpgradeNode"),
        "{message}"
    );
    let retries = upgrade_retries(&f.replicas[0].admin_endpoint()).await;
    assert_eq!(retries, 7.0, "8 attempts, 7 of them again");
    eprintln!(
        "refusing provider: the upgrade failed after {:?} and {retries} retries",
        started.elapsed()
    );
    check(&f, "refused").await;
}

/// A provider that answers UNAVAILABLE to every node upgrade: the owner
/// keeps asking (the upgrade waits, it does not fail at the first refusal)
/// and counts each retry; a cancel request ends the wait at the next
/// retry, not at the operation's timeout.
#[tokio::test]
async fn an_upgrade_waiting_for_an_unavailable_provider_ends_when_cancelled() {
    let (mut f, upgrade) = refusing("waiting").await;
    let metrics = f.replicas[0].admin_endpoint();
    wait_until(Duration::from_secs(30), "three retries", || {
        let metrics = metrics.clone();
        async move { upgrade_retries(&metrics).await >= 3.0 }
    })
    .await;
    let id = upgrade.id.clone();
    let request = v1::GetOperationRequest {
        cluster: "waiting".into(),
        id: id.clone(),
    };
    let waiting = f.client.operations().get_operation(request).await;
    let waiting = waiting.expect("get").into_inner();
    assert_eq!(waiting.state, O::Running as i32, "{waiting:?}");

    let cancel = v1::CancelOperationRequest {
        cluster: "waiting".into(),
        id,
    };
    let cancelled = f.client.operations().cancel_operation(cancel).await;
    cancelled.expect("cancel accepted");
    // The next retry (within 2 s here) sees the cancel.
    let done = f
        .client
        .wait_operation(&upgrade, Duration::from_secs(15))
        .await
        .expect("the upgrade ends");
    assert_eq!(done.state, O::Cancelled as i32, "{done:?}");
    let message = done.error.as_ref().map_or("", |e| e.message.as_str());
    assert!(
        message.contains("cancelled while waiting for the provider"),
        "{message}"
    );
    check(&f, "waiting").await;
}

/// `drover_provider_request_retries_total{request="UpgradeNode"}` of a
/// replica.
async fn upgrade_retries(admin: &str) -> f64 {
    let metrics = drover_tests::scrape::metrics(admin).await;
    metrics
        .get("drover_provider_request_retries_total{request=\"UpgradeNode\"}")
        .copied()
        .unwrap_or_default()
}
