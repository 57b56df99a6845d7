//! Fleet rollouts end to end: real etcd, the simulated provider, three
//! replica processes. What the provider saw (its audit log) is the
//! witness for order and concurrency, not Drover's own records.

use drover_client::v1;
use drover_server::store::Store;
use drover_tests::fixture::Fixture;
use drover_tests::provider::SimProcess;
use drover_tests::rollout_bench::peak_concurrency;
use drover_tests::{operations_of, scrape};
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::Code;

const FROM: &str = "1.29.0";
const TO: &str = "1.30.0";
const WAIT: Duration = Duration::from_secs(60);

/// Creates `name` with `labels`, started, and returns its uid.
async fn create(f: &mut Fixture, name: &str, labels: &[(&str, &str)], workers: u32) -> String {
    let request = v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(v1::ClusterSpec {
            version: FROM.into(),
            control_nodes: 1,
            worker_nodes: workers,
            node_offering: "medium".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }),
        create_only: false,
        request_id: String::new(),
    };
    let created = f.client.clusters().create_cluster(request).await;
    let created = created.expect("create").into_inner();
    f.finish(created.operation.expect("a start")).await;
    created.cluster.expect("the cluster").uid
}

fn stage(name: &str, max: &str, selector: &[(&str, &str)]) -> v1::RolloutStage {
    v1::RolloutStage {
        name: name.into(),
        max_concurrency: max.into(),
        selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn upgrade_of(selector: &[(&str, &str)], stages: Vec<v1::RolloutStage>) -> v1::RolloutSpec {
    v1::RolloutSpec {
        selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        version: TO.into(),
        stages,
        ..Default::default()
    }
}

async fn create_rollout(f: &mut Fixture, name: &str, spec: v1::RolloutSpec) -> v1::Rollout {
    let request = v1::CreateRolloutRequest {
        name: name.into(),
        spec: Some(spec),
    };
    let created = f.client.rollouts().create_rollout(request).await;
    created.expect("rollout created").into_inner()
}

fn state_of(rollout: &v1::Rollout) -> v1::RolloutState {
    let state = rollout.status.as_ref().map_or(0, |s| s.state);
    v1::RolloutState::try_from(state).unwrap_or(v1::RolloutState::Unspecified)
}

/// Polls the rollout through `client` until `done` holds, for up to
/// [`WAIT`].
async fn wait_for(
    client: &mut drover_client::Client,
    name: &str,
    done: impl Fn(&v1::Rollout) -> bool,
) -> v1::Rollout {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let request = v1::GetRolloutRequest { name: name.into() };
        if let Ok(rollout) = client.rollouts().get_rollout(request).await {
            let rollout = rollout.into_inner();
            if done(&rollout) {
                return rollout;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "rollout {name} still {rollout:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_state(f: &mut Fixture, name: &str, state: v1::RolloutState) -> v1::Rollout {
    wait_for(&mut f.client, name, |r| state_of(r) == state).await
}

fn target<'r>(rollout: &'r v1::Rollout, cluster: &str) -> &'r v1::RolloutCluster {
    let status = rollout.status.as_ref().expect("a status");
    let found = status.clusters.iter().find(|c| c.cluster == cluster);
    found.unwrap_or_else(|| panic!("{cluster} is not a target: {rollout:#?}"))
}

fn target_state(rollout: &v1::Rollout, cluster: &str) -> v1::TargetState {
    v1::TargetState::try_from(target(rollout, cluster).state).expect("a state")
}

/// Each cluster's upgrade as the provider saw it: from its first
/// UpgradeNode admitted to its last landed, in Unix milliseconds.
async fn upgrade_spans(
    sim: &SimProcess,
    uids: &BTreeMap<String, String>,
) -> BTreeMap<String, (u64, u64)> {
    let mut spans = BTreeMap::new();
    for (name, uid) in uids {
        let calls: Vec<_> = sim
            .audit(uid)
            .await
            .into_iter()
            .filter(|e| e.method == "UpgradeNode")
            .collect();
        if let (Some(first), Some(last)) = (calls.first(), calls.last()) {
            spans.insert(name.clone(), (first.admitted_at_ms, last.landed_at_ms));
        }
    }
    spans
}

/// How many upgrades each cluster's history holds.
async fn upgrades_of(f: &Fixture, cluster: &str) -> usize {
    operations_of(&f.client, cluster)
        .await
        .iter()
        .filter(|op| op.kind == v1::OperationKind::Upgrade as i32)
        .count()
}

#[tokio::test]
async fn stages_run_in_order_after_their_soak_and_later_clusters_are_not_swept_in() {
    let mut f = Fixture::builder().replicas(3).start().await;
    let mut uids = BTreeMap::new();
    uids.insert(
        "canary".to_string(),
        create(&mut f, "canary", &[("fleet", "a"), ("ring", "0")], 0).await,
    );
    for name in ["web-1", "web-2", "web-3", "web-4"] {
        uids.insert(
            name.to_string(),
            create(&mut f, name, &[("fleet", "a")], 1).await,
        );
    }
    create(&mut f, "other", &[("fleet", "b")], 0).await;
    let mut canary = stage("canary", "1", &[("ring", "0")]);
    canary.soak_seconds = 2;
    let spec = upgrade_of(&[("fleet", "a")], vec![canary, stage("rest", "50%", &[])]);
    create_rollout(&mut f, "r131", spec).await;
    create(&mut f, "late", &[("fleet", "a")], 0).await;

    let done = wait_state(&mut f, "r131", v1::RolloutState::RolloutSucceeded).await;
    let status = done.status.as_ref().unwrap();
    assert_eq!(status.clusters.len(), 5, "{done:#?}");
    assert!(status
        .clusters
        .iter()
        .all(|c| c.cluster != "late" && c.cluster != "other"));
    assert_eq!(
        (status.stages[0].succeeded, status.stages[1].succeeded),
        (1, 4)
    );
    for name in uids.keys() {
        let cluster = f.client.get_cluster(name).await.unwrap();
        assert_eq!(
            cluster.status.unwrap().current_version.as_deref(),
            Some(TO),
            "{name}"
        );
    }
    for untouched in ["late", "other"] {
        let cluster = f.client.get_cluster(untouched).await.unwrap();
        assert_eq!(
            cluster.status.unwrap().current_version.as_deref(),
            Some(FROM),
            "{untouched}"
        );
    }
    let spans = upgrade_spans(&f.sim, &uids).await;
    let canary_end = spans["canary"].1;
    for (name, (start, _)) in spans.iter().filter(|(n, _)| *n != "canary") {
        assert!(
            *start >= canary_end + 2000,
            "{name} began {} ms after the canary ended, inside its soak",
            start - canary_end
        );
    }
    assert!(peak_concurrency(spans.values()) <= 2, "{spans:?}");
}

#[tokio::test]
async fn the_concurrency_bound_holds_through_a_kill_and_a_sigterm_of_the_owner() {
    let mut f = Fixture::builder().replicas(3).ttl(5).start().await;
    let mut uids = BTreeMap::new();
    for i in 0..10 {
        let name = format!("db-{i}");
        uids.insert(
            name.clone(),
            create(&mut f, &name, &[("fleet", "db")], 1).await,
        );
    }
    f.sim.set_latency(Duration::from_millis(300)).await;
    create_rollout(
        &mut f,
        "wave",
        upgrade_of(&[("fleet", "db")], vec![stage("all", "2", &[])]),
    )
    .await;

    let owner = |r: &v1::Rollout| r.status.as_ref().map_or(String::new(), |s| s.owner.clone());
    let succeeded = |r: &v1::Rollout| r.status.as_ref().map_or(0, |s| s.stages[0].succeeded);
    let running = wait_for(&mut f.client, "wave", |r| {
        succeeded(r) >= 2 && !owner(r).is_empty()
    })
    .await;
    let first = owner(&running);
    // The fixture's replicas are r1, r2, r3, in order.
    let index = |id: &str| id.trim_start_matches('r').parse::<usize>().expect("r<n>") - 1;
    let killed = index(&first);
    f.replicas[killed].kill9();
    let mut survivor = f.replicas[(killed + 1) % 3].client().await;
    let moved = wait_for(&mut survivor, "wave", |r| {
        succeeded(r) >= 5 && owner(r) != first
    })
    .await;
    let second = owner(&moved);
    let terminated = index(&second);
    f.replicas[terminated].terminate().await;
    let last = (0..3)
        .find(|i| *i != killed && *i != terminated)
        .expect("a third replica");
    let mut last_client = f.replicas[last].client().await;
    let done = wait_for(&mut last_client, "wave", |r| {
        state_of(r) == v1::RolloutState::RolloutSucceeded
    })
    .await;
    assert_eq!(
        done.status.as_ref().unwrap().stages[0].succeeded,
        10,
        "{done:#?}"
    );
    f.client = last_client;

    let spans = upgrade_spans(&f.sim, &uids).await;
    assert_eq!(spans.len(), 10);
    let peak = peak_concurrency(spans.values());
    assert!(
        peak <= 2,
        "the provider ran {peak} upgrades at once: {spans:?}"
    );
    for name in uids.keys() {
        assert_eq!(upgrades_of(&f, name).await, 1, "{name} upgraded once");
    }
}

#[tokio::test]
async fn a_spent_failure_budget_pauses_naming_the_failed_clusters_and_resume_goes_on() {
    let mut f = Fixture::builder().replicas(3).start().await;
    for i in 0..4 {
        create(&mut f, &format!("c-{i}"), &[("fleet", "c")], 0).await;
    }
    // The next two upgrades (one node each, one at a time) fail.
    f.sim.fault("UpgradeNode", 1, false).await;
    f.sim.fault("UpgradeNode", 1, false).await;
    let mut spec = upgrade_of(&[("fleet", "c")], vec![stage("all", "1", &[])]);
    spec.max_failures = "1".into();
    create_rollout(&mut f, "budget", spec).await;

    let paused = wait_state(&mut f, "budget", v1::RolloutState::RolloutPaused).await;
    let message = &paused.status.as_ref().unwrap().message;
    assert!(
        message.contains("c-0") && message.contains("c-1"),
        "{message}"
    );
    assert!(message.contains("max_failures 1"), "{message}");
    // Paused, it starts nothing new.
    // Not a synchronization: a window (two owner passes) in which a wrong
    // resume would show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = wait_state(&mut f, "budget", v1::RolloutState::RolloutPaused).await;
    assert_eq!(target_state(&still, "c-2"), v1::TargetState::TargetPending);
    assert_eq!(upgrades_of(&f, "c-2").await, 0);
    // Its owner says so in its metrics: what the alert reads.
    let mut samples = std::collections::BTreeMap::new();
    for replica in &f.replicas {
        samples.extend(scrape::metrics(&replica.admin_endpoint()).await);
    }
    let series = |name: &str, label: &str| scrape::sum(&samples, name, label);
    assert_eq!(
        series("drover_rollout_budget_paused", "rollout=\"budget\""),
        1.0
    );
    assert_eq!(series("drover_rollout_state", "state=\"paused\""), 1.0);
    assert_eq!(series("drover_rollout_clusters", "state=\"failed\""), 2.0);
    assert_eq!(series("drover_rollout_clusters", "state=\"pending\""), 2.0);

    let request = v1::ResumeRolloutRequest {
        name: "budget".into(),
    };
    f.client
        .rollouts()
        .resume_rollout(request)
        .await
        .expect("resume");
    let done = wait_state(&mut f, "budget", v1::RolloutState::RolloutFailed).await;
    for (cluster, state) in [
        ("c-0", v1::TargetState::TargetFailed),
        ("c-1", v1::TargetState::TargetFailed),
        ("c-2", v1::TargetState::TargetSucceeded),
        ("c-3", v1::TargetState::TargetSucceeded),
    ] {
        assert_eq!(target_state(&done, cluster), state, "{cluster}");
    }
    assert!(!target(&done, "c-0").message.is_empty());
}

#[tokio::test]
async fn a_cancel_starts_nothing_new_and_cancels_the_running_when_asked() {
    let mut f = Fixture::builder().replicas(3).start().await;
    for i in 0..4 {
        create(&mut f, &format!("k-{i}"), &[("fleet", "k")], 3).await;
    }
    f.sim.set_latency(Duration::from_millis(400)).await;
    create_rollout(
        &mut f,
        "stopme",
        upgrade_of(&[("fleet", "k")], vec![stage("all", "1", &[])]),
    )
    .await;
    wait_for(&mut f.client, "stopme", |r| {
        target_state(r, "k-0") == v1::TargetState::TargetRunning
    })
    .await;
    let request = v1::CancelRolloutRequest {
        name: "stopme".into(),
        cancel_running: true,
    };
    f.client
        .rollouts()
        .cancel_rollout(request)
        .await
        .expect("cancel");
    let done = wait_for(&mut f.client, "stopme", |r| {
        state_of(r) == v1::RolloutState::RolloutCancelled
            && target_state(r, "k-0") != v1::TargetState::TargetRunning
    })
    .await;
    assert_eq!(
        target_state(&done, "k-0"),
        v1::TargetState::TargetFailed,
        "{done:#?}"
    );
    let first = operations_of(&f.client, "k-0").await;
    assert_eq!(first[0].state, v1::OperationState::Cancelled as i32);
    for name in ["k-1", "k-2", "k-3"] {
        assert_eq!(target_state(&done, name), v1::TargetState::TargetPending);
        assert_eq!(upgrades_of(&f, name).await, 0, "{name}");
    }
    // An ended rollout refuses what cannot apply to it any more.
    let request = v1::PauseRolloutRequest {
        name: "stopme".into(),
    };
    let paused = f.client.rollouts().pause_rollout(request).await;
    assert_eq!(
        paused.map(|_| ()).unwrap_err().code(),
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn busy_clusters_are_waited_for_or_skipped_and_one_at_the_version_is_skipped() {
    let mut f = Fixture::builder().replicas(3).start().await;
    for name in ["busy-wait", "busy-skip", "done"] {
        create(&mut f, name, &[("fleet", name)], 0).await;
    }
    let upgraded = drover_tests::start_upgrade(&mut f.client, "done", TO).await;
    f.finish(upgraded).await;
    f.sim.set_latency(Duration::from_millis(1500)).await;
    let busy_wait = drover_tests::start_upgrade(&mut f.client, "busy-wait", "1.29.5").await;
    let busy_skip = drover_tests::start_upgrade(&mut f.client, "busy-skip", "1.29.5").await;
    let mut waits = upgrade_of(&[("fleet", "busy-wait")], vec![stage("all", "1", &[])]);
    waits.on_busy = v1::OnBusy::Wait as i32;
    create_rollout(&mut f, "waits", waits).await;
    let mut skips = upgrade_of(&[("fleet", "busy-skip")], vec![stage("all", "1", &[])]);
    skips.on_busy = v1::OnBusy::Skip as i32;
    create_rollout(&mut f, "skips", skips).await;
    create_rollout(
        &mut f,
        "at-version",
        upgrade_of(&[("fleet", "done")], vec![stage("all", "1", &[])]),
    )
    .await;

    let skipped = wait_state(&mut f, "skips", v1::RolloutState::RolloutSucceeded).await;
    assert_eq!(
        target_state(&skipped, "busy-skip"),
        v1::TargetState::TargetSkipped
    );
    assert!(
        target(&skipped, "busy-skip").message.contains("busy"),
        "{skipped:#?}"
    );
    let at = wait_state(&mut f, "at-version", v1::RolloutState::RolloutSucceeded).await;
    assert_eq!(target_state(&at, "done"), v1::TargetState::TargetSkipped);
    assert!(target(&at, "done")
        .message
        .contains(&format!("already at {TO}")));
    // The waiting one starts only once the cluster is free.
    let waiting = f
        .client
        .rollouts()
        .get_rollout(v1::GetRolloutRequest {
            name: "waits".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        target_state(&waiting, "busy-wait"),
        v1::TargetState::TargetPending
    );
    f.finish(busy_wait).await;
    f.finish(busy_skip).await;
    f.sim.set_latency(Duration::ZERO).await;
    let waited = wait_state(&mut f, "waits", v1::RolloutState::RolloutSucceeded).await;
    assert_eq!(
        target_state(&waited, "busy-wait"),
        v1::TargetState::TargetSucceeded
    );
    assert_eq!(upgrades_of(&f, "busy-wait").await, 2);
}

#[tokio::test]
async fn an_approval_gate_holds_its_stage_until_approved() {
    let mut f = Fixture::builder().replicas(3).start().await;
    create(&mut f, "g-0", &[("fleet", "g"), ("ring", "0")], 0).await;
    create(&mut f, "g-1", &[("fleet", "g")], 0).await;
    let mut gated = stage("rest", "1", &[]);
    gated.approval_required = true;
    let spec = upgrade_of(
        &[("fleet", "g")],
        vec![stage("canary", "1", &[("ring", "0")]), gated],
    );
    create_rollout(&mut f, "gated", spec).await;
    let waiting = wait_state(&mut f, "gated", v1::RolloutState::RolloutWaitingApproval).await;
    assert!(
        waiting.status.as_ref().unwrap().message.contains("rest"),
        "{waiting:#?}"
    );
    assert_eq!(
        target_state(&waiting, "g-0"),
        v1::TargetState::TargetSucceeded
    );
    assert_eq!(
        target_state(&waiting, "g-1"),
        v1::TargetState::TargetPending
    );
    let wrong = v1::ApproveRolloutRequest {
        name: "gated".into(),
        stage: "nope".into(),
    };
    let refused = f
        .client
        .rollouts()
        .approve_rollout(wrong)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("stage"), "{refused:?}");
    let approve = v1::ApproveRolloutRequest {
        name: "gated".into(),
        stage: "rest".into(),
    };
    f.client
        .rollouts()
        .approve_rollout(approve)
        .await
        .expect("approve");
    let done = wait_state(&mut f, "gated", v1::RolloutState::RolloutSucceeded).await;
    assert_eq!(target_state(&done, "g-1"), v1::TargetState::TargetSucceeded);
}

#[tokio::test]
async fn bad_specs_are_refused_naming_the_field_and_write_nothing() {
    let mut f = Fixture::builder().start().await;
    create(&mut f, "x-0", &[("fleet", "x")], 0).await;
    let good = || {
        upgrade_of(
            &[("fleet", "x")],
            vec![stage("one", "1", &[]), stage("two", "1", &[])],
        )
    };
    let mut cases: Vec<(&str, v1::RolloutSpec)> = Vec::new();
    let mut bad = good();
    bad.stages[1].max_concurrency = "lots".into();
    cases.push(("spec.stages[1].max_concurrency", bad));
    let mut bad = good();
    bad.stages[1].name = "one".into();
    cases.push(("spec.stages[1].name", bad));
    let mut bad = good();
    bad.max_failures = "200%".into();
    cases.push(("spec.max_failures", bad));
    let mut bad = good();
    bad.version = "latest".into();
    cases.push(("spec.version", bad));
    let mut bad = good();
    bad.clusters = vec!["x-0".into()];
    cases.push(("spec.clusters", bad));
    let mut bad = good();
    bad.selector.clear();
    bad.clusters = vec!["nope".into()];
    cases.push(("spec.clusters[0]", bad));
    let mut bad = good();
    bad.stages = vec![stage("only", "1", &[("ring", "9")])];
    cases.push(("spec.stages", bad));
    for (field, spec) in cases {
        let request = v1::CreateRolloutRequest {
            name: "bad".into(),
            spec: Some(spec),
        };
        let refused = f
            .client
            .rollouts()
            .create_rollout(request)
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "{field}: {refused:?}"
        );
        assert!(
            refused.message().starts_with(field),
            "{field}: {}",
            refused.message()
        );
    }
    let request = v1::CreateRolloutRequest {
        name: "Bad_Name".into(),
        spec: Some(good()),
    };
    let refused = f
        .client
        .rollouts()
        .create_rollout(request)
        .await
        .unwrap_err();
    assert!(refused.message().starts_with("name"), "{refused:?}");
    let store = f.etcd.store().await;
    let written = store
        .range(drover_server::store::RangeRequest::prefix(
            "/drover/v1/rollout",
        ))
        .await
        .unwrap();
    assert!(written.kvs.is_empty(), "{:?}", written.kvs);
    let missing = f
        .client
        .rollouts()
        .get_rollout(v1::GetRolloutRequest { name: "bad".into() })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    create_rollout(&mut f, "good", good()).await;
    let again = v1::CreateRolloutRequest {
        name: "good".into(),
        spec: Some(good()),
    };
    let taken = f.client.rollouts().create_rollout(again).await.unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists);
}

#[tokio::test]
async fn the_concurrency_bound_holds_while_a_3_member_etcd_loses_its_leader() {
    let mut etcd = drover_tests::etcd::EtcdCluster::start(3).await;
    let sim = SimProcess::start().await;
    let endpoints = etcd.endpoints().join(",");
    let provider = sim.endpoint();
    let args = ["--provider", provider.as_str(), "--lease-ttl", "3"];
    let mut replicas = Vec::new();
    for id in ["e1", "e2", "e3"] {
        let replica = drover_tests::replica::ReplicaProcess::serve_with(&endpoints, id, &args);
        replicas.push(replica.await);
    }
    let mut client = replicas[0].client().await;
    let mut uids = BTreeMap::new();
    for i in 0..8 {
        let name = format!("e-{i}");
        let cluster = drover_tests::create_running(&mut client, &name, 1).await;
        let labels = [("fleet".to_string(), "e".to_string())].into();
        let update = v1::UpdateClusterRequest {
            name: name.clone(),
            labels,
            update_labels: true,
            ..Default::default()
        };
        client
            .clusters()
            .update_cluster(update)
            .await
            .expect("label it");
        uids.insert(name, cluster.uid);
    }
    sim.set_latency(Duration::from_millis(300)).await;
    let spec = upgrade_of(&[("fleet", "e")], vec![stage("all", "2", &[])]);
    let request = v1::CreateRolloutRequest {
        name: "leader".into(),
        spec: Some(spec),
    };
    client
        .rollouts()
        .create_rollout(request)
        .await
        .expect("the rollout");
    let succeeded = |r: &v1::Rollout| r.status.as_ref().map_or(0, |s| s.stages[0].succeeded);
    wait_for(&mut client, "leader", |r| succeeded(r) >= 2).await;
    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    let done = wait_for(&mut client, "leader", |r| {
        state_of(r) == v1::RolloutState::RolloutSucceeded
    })
    .await;
    assert_eq!(done.status.unwrap().stages[0].succeeded, 8);
    assert_ne!(etcd.leader(), Some(leader), "a new leader was elected");
    let spans = upgrade_spans(&sim, &uids).await;
    assert_eq!(spans.len(), 8);
    let peak = peak_concurrency(spans.values());
    assert!(
        peak <= 2,
        "the provider ran {peak} upgrades at once: {spans:?}"
    );
}

#[tokio::test]
async fn a_paused_rollout_stays_paused_through_its_owners_kill_and_a_restart() {
    let mut f = Fixture::builder().replicas(3).ttl(5).start().await;
    for i in 0..4 {
        create(&mut f, &format!("p-{i}"), &[("fleet", "p")], 0).await;
    }
    f.sim.set_latency(Duration::from_millis(300)).await;
    create_rollout(
        &mut f,
        "held",
        upgrade_of(&[("fleet", "p")], vec![stage("all", "1", &[])]),
    )
    .await;
    wait_for(&mut f.client, "held", |r| {
        target_state(r, "p-0") != v1::TargetState::TargetPending
    })
    .await;
    let request = v1::PauseRolloutRequest {
        name: "held".into(),
    };
    f.client
        .rollouts()
        .pause_rollout(request)
        .await
        .expect("pause");
    let owner = |r: &v1::Rollout| r.status.as_ref().map_or(String::new(), |s| s.owner.clone());
    let paused = wait_state(&mut f, "held", v1::RolloutState::RolloutPaused).await;
    let first = owner(&paused);
    // The fixture's replicas are r1, r2, r3, in order.
    let killed = first
        .trim_start_matches('r')
        .parse::<usize>()
        .expect("r<n>")
        - 1;
    f.replicas[killed].kill9();
    let mut survivor = f.replicas[(killed + 1) % 3].client().await;
    let moved = wait_for(&mut survivor, "held", |r| {
        !owner(r).is_empty() && owner(r) != first
    })
    .await;
    assert_eq!(
        state_of(&moved),
        v1::RolloutState::RolloutPaused,
        "{moved:#?}"
    );
    // A restart of the replica that ran it changes nothing either.
    let args = f
        .replica_args()
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let etcd = f.etcd.endpoint();
    f.replicas[killed] =
        drover_tests::replica::ReplicaProcess::serve_with(&etcd, &first, &args).await;
    // Not a synchronization: a window (two owner passes) in which a wrong
    // resume would show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = wait_for(&mut survivor, "held", |_| true).await;
    assert_eq!(state_of(&still), v1::RolloutState::RolloutPaused);
    assert_eq!(target_state(&still, "p-3"), v1::TargetState::TargetPending);
    let request = v1::ResumeRolloutRequest {
        name: "held".into(),
    };
    survivor
        .rollouts()
        .resume_rollout(request)
        .await
        .expect("resume");
    let done = wait_for(&mut survivor, "held", |r| {
        state_of(r) == v1::RolloutState::RolloutSucceeded
    })
    .await;
    assert_eq!(done.status.unwrap().stages[0].succeeded, 4);
    f.client = survivor;
    for i in 0..4 {
        assert_eq!(upgrades_of(&f, &format!("p-{i}")).await, 1);
    }
}
