//! `spec.upgrade_policy`: an upgrade's node calls are sent again after a
//! failure or a hang (step_retries, step_timeout_seconds), so a flaky node
//! call does not fail the upgrade; without a policy the first failure does.

use drover_client::v1;
use drover_tests::fixture::Fixture;
use drover_tests::{create_running, scrape, start_upgrade};

async fn set_policy(f: &mut Fixture, cluster: &str, policy: v1::UpgradePolicy) {
    let request = v1::UpdateClusterRequest {
        name: cluster.into(),
        upgrade_policy: Some(policy),
        update_upgrade_policy: true,
        ..Default::default()
    };
    let updated = f.client.clusters().update_cluster(request).await;
    let spec = updated.expect("policy set").into_inner().spec.unwrap();
    assert_eq!(spec.upgrade_policy.unwrap().step_retries, Some(2));
}

#[tokio::test]
async fn a_node_call_that_fails_or_hangs_is_sent_again_within_the_policy() {
    let mut f = Fixture::builder().start().await;
    create_running(&mut f.client, "flaky", 2).await;
    let policy = v1::UpgradePolicy {
        step_retries: Some(2),
        step_timeout_seconds: Some(1),
        ..Default::default()
    };
    set_policy(&mut f, "flaky", policy).await;
    // The first node call fails, the next one hangs: two retries.
    f.sim.fault("UpgradeNode", 1, false).await;
    f.sim.fault("UpgradeNode", 1, true).await;
    let op = start_upgrade(&mut f.client, "flaky", "1.30.0").await;
    let done = f.finish(op).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    let cluster = f.client.get_cluster("flaky").await.unwrap();
    let nodes = cluster.status.unwrap().nodes;
    assert!(nodes.iter().all(|n| n.version == "1.30.0"), "{nodes:?}");
    let samples = scrape::metrics(&f.replicas[0].admin_endpoint()).await;
    let retries = scrape::sum(
        &samples,
        "drover_provider_request_retries_total",
        "UpgradeNode",
    );
    assert_eq!(
        retries, 2.0,
        "one retry after the failure, one after the hang"
    );

    // Two workers side by side: one step for them, a failure of either
    // retried as the step.
    create_running(&mut f.client, "wide", 3).await;
    let policy = v1::UpgradePolicy {
        max_unavailable: Some(2),
        step_retries: Some(2),
        ..Default::default()
    };
    set_policy(&mut f, "wide", policy).await;
    f.sim.fault("UpgradeNode", 2, false).await;
    let op = start_upgrade(&mut f.client, "wide", "1.30.0").await;
    let done = f.finish(op).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    let progress = done.progress.expect("progress");
    // control-0, then worker-0 and worker-1 together, then worker-2.
    assert_eq!(progress.total_steps, 3, "{progress:?}");
    let cluster = f.client.get_cluster("wide").await.unwrap();
    let nodes = cluster.status.unwrap().nodes;
    assert!(nodes.iter().all(|n| n.version == "1.30.0"), "{nodes:?}");

    // A surge worker is added and upgraded first, and removed at the end.
    let surged = create_running(&mut f.client, "surged", 2).await;
    let policy = v1::UpgradePolicy {
        max_surge: Some(1),
        step_retries: Some(2),
        ..Default::default()
    };
    set_policy(&mut f, "surged", policy).await;
    let op = start_upgrade(&mut f.client, "surged", "1.30.0").await;
    let done = f.finish(op).await;
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    // The surge, control-0, worker-0, worker-1, the resize back.
    assert_eq!(done.progress.expect("progress").total_steps, 5);
    let calls: Vec<(String, String)> = f
        .sim
        .audit(&surged.uid)
        .await
        .into_iter()
        .filter(|e| e.method == "ResizeNodes" || e.method == "UpgradeNode")
        .map(|e| (e.method, e.detail))
        .collect();
    let methods: Vec<&str> = calls.iter().map(|(m, _)| m.as_str()).collect();
    let upgrade = "UpgradeNode";
    assert_eq!(
        methods,
        [
            "ResizeNodes",
            upgrade,
            upgrade,
            upgrade,
            upgrade,
            "ResizeNodes"
        ],
        "{calls:?}"
    );
    assert!(
        calls[1].1.contains("worker-2"),
        "the surge worker first: {calls:?}"
    );
    let cluster = f.client.get_cluster("surged").await.unwrap();
    let nodes = cluster.status.unwrap().nodes;
    assert_eq!(nodes.len(), 3, "back to the spec's count: {nodes:?}");
    assert!(nodes.iter().all(|n| n.version == "1.30.0"), "{nodes:?}");

    // Without a policy the first failure fails the upgrade, as before.
    create_running(&mut f.client, "strict", 1).await;
    f.sim.fault("UpgradeNode", 1, false).await;
    let op = start_upgrade(&mut f.client, "strict", "1.30.0").await;
    let done = f.finish(op).await;
    assert_eq!(done.state, v1::OperationState::Failed as i32, "{done:?}");
    f.check_history().await;
}
