//! Faults injected between a replica's own steps. The replica runs in this
//! process over etcd seen through [`InjectingStore`], so a change can land,
//! or a write fail, at the exact point a replica process could only be
//! raced into (real etcd, the simulated provider process).

use drover_client::v1::{self, OperationState as O, TaskRunStatus as R, TaskType as T};
use drover_client::Client;
use drover_server::config::Settings;
use drover_server::replication::preferred;
use drover_tests::etcd::EtcdProcess;
use drover_tests::fixture::Backends;
use drover_tests::in_process::{writes, InProcessReplica, InjectingStore, Injection};
use drover_tests::provider::SimProcess;
use drover_tests::replica::{health, ReplicaProcess};
use drover_tests::{create_running, operations_of, stop_or_start, wait_running, wait_until};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic_health::pb::health_check_response::ServingStatus;

/// Long enough for several scheduler ticks (250 ms) and retries (1 s).
const WAIT: Duration = Duration::from_secs(10);

fn task(task_type: T, name: &str, schedule: v1::TaskSchedule) -> v1::TaskSpec {
    let properties = match task_type {
        T::Backup => v1::task_spec::Properties::Backup(v1::BackupProperties {
            location: vec!["dc1:s3:drover-backups".into()],
            ..Default::default()
        }),
        _ => v1::task_spec::Properties::Repair(v1::RepairProperties {
            intensity: "0.5".into(),
            ..Default::default()
        }),
    };
    v1::TaskSpec {
        r#type: task_type as i32,
        name: name.into(),
        schedule: Some(schedule),
        properties: Some(properties),
    }
}

/// A repair at 03:00 every day: reconciling it starts no run, so nothing
/// else touches the cluster's keys afterwards.
fn nightly(name: &str) -> v1::TaskSpec {
    let schedule = v1::TaskSchedule {
        cron: "0 3 * * *".into(),
        ..Default::default()
    };
    task(T::Repair, name, schedule)
}

async fn put_task(client: &mut Client, task: v1::TaskSpec) {
    let request = v1::PutTaskRequest {
        cluster: "db".into(),
        task: Some(task),
    };
    client.tasks().put_task(request).await.expect("put task");
}

async fn task_status(client: &Client, task_type: T, name: &str) -> Option<v1::TaskStatus> {
    let request = v1::GetTaskRequest {
        cluster: "db".into(),
        r#type: task_type as i32,
        name: name.into(),
    };
    let mut client = client.clone();
    let task = client.tasks().get_task(request).await.ok()?.into_inner();
    task.status
}

/// An in-process replica `r1` owning a running cluster `db`, on etcd and a
/// simulator of their own.
///
/// Fields drop in order: the replica first, etcd and the simulator last.
struct DbOwner {
    replica: InProcessReplica,
    client: Client,
    /// The uid of the cluster `db`.
    uid: String,
    backends: Backends,
}

impl DbOwner {
    async fn start() -> Self {
        let backends = Backends::start().await;
        let provider = backends.sim.endpoint();
        let replica = InProcessReplica::serve(&backends.etcd, "r1", &provider, 2).await;
        let mut client = replica.client().await;
        let uid = create_running(&mut client, "db", 1).await.uid;
        Self {
            replica,
            client,
            uid,
            backends,
        }
    }

    async fn stop(self) {
        self.replica.stop().await;
    }

    /// Starts a stop of `cluster` that takes 3 s (the provider is slowed),
    /// then a shutdown, which waits for it in its hand-off; returns the
    /// operation once the replica reports NOT_SERVING.
    async fn drain_holding(&mut self, cluster: &str) -> v1::Operation {
        self.backends.sim.set_latency(Duration::from_secs(3)).await;
        let request = v1::StopClusterRequest {
            name: cluster.into(),
            request_id: String::new(),
            ..Default::default()
        };
        let running = self
            .client
            .clusters()
            .stop_cluster(request)
            .await
            .unwrap()
            .into_inner();
        self.replica.begin_stop();
        let endpoint = self.replica.endpoint().to_string();
        wait_until(WAIT, "the replica to report NOT_SERVING", || {
            let endpoint = endpoint.clone();
            async move { health(&endpoint).await == Some(ServingStatus::NotServing) }
        })
        .await;
        running
    }
}

/// The owner's read after its reconcile shows a spec written since its
/// first read. It used to count that read as reconciled, so the new task
/// waited for the cluster's next unrelated change.
#[tokio::test]
async fn a_task_put_while_the_owner_reconciles_the_previous_one_is_reconciled() {
    let mut f = DbOwner::start().await;
    let mut concurrent = f.client.clone();
    f.replica.store.inject(
        |txn| writes(txn, |key| key.ends_with("/taskset"), None),
        Injection::After(Box::pin(async move {
            put_task(&mut concurrent, nightly("second")).await;
        })),
    );
    put_task(&mut f.client, nightly("first")).await;
    let client = &f.client;
    wait_until(WAIT, "the second task to be reconciled", || async move {
        task_status(client, T::Repair, "second")
            .await
            .is_some_and(|status| status.id.is_some())
    })
    .await;
    assert_eq!(
        f.replica.store.pending(),
        0,
        "the second put came mid-reconcile"
    );
    let first = task_status(client, T::Repair, "first").await.unwrap();
    assert!(first.id.is_some(), "{first:?}");
    f.stop().await;
}

/// The provider finished a run, and recording its end failed. The failed
/// write changed nothing the owner's cache would show, so the owner used
/// to leave the run RUNNING until the cluster's next unrelated change.
#[tokio::test]
async fn a_task_run_whose_end_could_not_be_recorded_is_recorded_on_the_next_look() {
    let mut f = DbOwner::start().await;
    // Longer than a scheduler tick: the owner looks at the cluster (for the
    // run's start) while the run is still in flight.
    f.backends
        .sim
        .set_task_latency(Duration::from_secs(1))
        .await;
    f.replica.store.inject(
        |txn| writes(txn, |key| key.contains("/runs/"), Some("\"DONE\"")),
        Injection::Fail,
    );
    let now = v1::TaskSchedule {
        start_date: "now".into(),
        ..Default::default()
    };
    put_task(&mut f.client, task(T::Backup, "once", now)).await;
    let client = &f.client;
    wait_until(WAIT, "the run's end to be recorded", || async move {
        task_status(client, T::Backup, "once")
            .await
            .and_then(|status| status.last_run)
            .is_some_and(|run| run.status == R::Done as i32)
    })
    .await;
    assert_eq!(
        f.replica.store.pending(),
        0,
        "the first record of the end failed"
    );
    let status = task_status(client, T::Backup, "once").await.unwrap();
    assert_eq!(status.success_count, Some(1), "{status:?}");
    f.stop().await;
}

/// A run that outlasts its timeout is stopped with StopTask, a provider
/// call like any other: only under a claim that still holds. While the
/// replica's session is lapsed (keep-alive replies lost past its belief
/// and the TTL a call waits for etcd's word), it sends none; it used to
/// send StopTask anyway, under an epoch a newer owner may have replaced.
#[tokio::test]
async fn a_timed_out_run_is_not_stopped_without_a_live_claim() {
    let Backends { sim, etcd } = Backends::start().await;
    let settings = Settings {
        lease_ttl: Some(2),
        task_run_timeout: Some(3),
        ..Default::default()
    };
    let owner = InProcessReplica::serve_with(&etcd, "r1", &sim.endpoint(), settings).await;
    let mut client = owner.client().await;
    let uid = create_running(&mut client, "db", 1).await.uid;
    sim.set_task_latency(Duration::from_secs(60)).await;
    let now = v1::TaskSchedule {
        start_date: "now".into(),
        ..Default::default()
    };
    put_task(&mut client, task(T::Backup, "long", now)).await;
    wait_until(WAIT, "the run to start", || {
        let sim = &sim;
        let uid = &uid;
        async move { sim.audit(uid).await.iter().any(|e| e.method == "RunTask") }
    })
    .await;
    owner.store.lose_keep_alive_replies(true);
    // Past the run's timeout (3 s) and the 2 s its StopTask waits for etcd.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let calls = sim.audit(&uid).await;
    assert!(
        !calls.iter().any(|e| e.method == "StopTask"),
        "StopTask without a live claim: {calls:?}"
    );
    owner.store.lose_keep_alive_replies(false);
    owner.stop().await;
}

/// A replica that owned `a-orphan` (first in name order), with a stop in
/// flight, and `idle` more clusters, killed -9: returns the orphaned stop.
async fn orphan_of_a_killed_replica(
    etcd: &EtcdProcess,
    sim: &SimProcess,
    idle: usize,
) -> v1::Operation {
    let args = ["--provider", &sim.endpoint(), "--lease-ttl", "2"];
    let mut lost = ReplicaProcess::serve_with(&etcd.endpoint(), "lost", &args).await;
    let mut client = lost.client().await;
    create_running(&mut client, "a-orphan", 1).await;
    drover_tests::create_fleet(&mut client, "idle", idle).await;
    sim.set_latency(Duration::from_secs(60)).await;
    let request = v1::StopClusterRequest {
        name: "a-orphan".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let orphan = client
        .clusters()
        .stop_cluster(request)
        .await
        .unwrap()
        .into_inner();
    wait_running(&client, "a-orphan", &orphan.id, WAIT).await;
    lost.kill9();
    sim.set_latency(Duration::ZERO).await;
    orphan
}

/// Waits (well under the executor's 30 s rescan; the lost lease expires
/// in 2 s) for the orphan to be recovered by its new owner: resumed to its
/// end (the default `--orphaned-operations=resume`), its record naming
/// both owners.
async fn assert_recovered(client: &Client, orphan: &v1::Operation) {
    let done = client
        .clone()
        .wait_operation(orphan, WAIT)
        .await
        .expect("wait");
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    assert_eq!(done.runs.len(), 2, "resumed by a new owner: {done:?}");
}

/// A replica adopting a dead peer's clusters claims them 100 per
/// transaction. It used to announce each batch's adoptions to its executor
/// before the pass ended and published its claims, so the executor, not
/// yet seeing the cluster owned, dropped the adoption of an orphaned
/// operation: it was recovered by the executor's rescan, 30 s later. Here
/// the batch without the orphan is slow (etcd answering after 1 s).
#[tokio::test]
async fn an_orphan_adopted_in_the_first_of_several_claim_batches_is_recovered_at_once() {
    let Backends { sim, etcd } = Backends::start().await;
    let orphan = orphan_of_a_killed_replica(&etcd, &sim, 120).await;
    // The batch without the orphan is slow (a failed attempt, under a
    // fence record read before a peer rewrote it, is slowed when retried).
    let slow_other_batch = |store: &InjectingStore| {
        store.inject(
            |txn| {
                writes(txn, |key| key.contains("/owners/"), None)
                    && !writes(txn, |key| key.ends_with("/owners/a-orphan"), None)
            },
            Injection::After(Box::pin(tokio::time::sleep(Duration::from_secs(1)))),
        )
    };
    let adopter =
        InProcessReplica::serve_armed(&etcd, "adopter", &sim.endpoint(), 2, slow_other_batch).await;
    assert_recovered(&adopter.client().await, &orphan).await;
    assert_eq!(
        adopter.store.pending(),
        0,
        "the batch without the orphan was slowed"
    );
    adopter.stop().await;
}

/// A new owner fails an orphan only once a provider call under its own
/// epoch has succeeded: until then a call the lost owner made, admitted
/// before, could still land after the operation is FAILED. While the
/// fencing look fails, the operation keeps its slot and the status says
/// why. It used to be failed "anyway" when the look failed.
#[tokio::test]
async fn an_orphan_is_failed_only_once_its_new_owner_has_fenced_the_provider() {
    let Backends { sim, etcd } = Backends::start().await;
    let orphan = orphan_of_a_killed_replica(&etcd, &sim, 0).await;
    sim.fault("DescribeCluster", 1, false).await;
    sim.fault("DescribeCluster", 1, false).await;
    let adopter = InProcessReplica::serve(&etcd, "adopter", &sim.endpoint(), 2).await;
    let client = adopter.client().await;
    wait_until(WAIT, "the status to say that fencing failed", || {
        let mut client = client.clone();
        async move {
            let cluster = client.get_cluster("a-orphan").await.expect("get");
            let message = cluster.status.and_then(|s| s.message);
            message.is_some_and(|m| m.contains("cannot fence"))
        }
    })
    .await;
    let request = v1::GetOperationRequest {
        cluster: "a-orphan".into(),
        id: orphan.id.clone(),
    };
    let held = client.clone().operations().get_operation(request).await;
    let held = held.expect("get operation").into_inner();
    assert_eq!(
        held.state,
        O::Running as i32,
        "kept while unfenced: {held:?}"
    );
    assert_recovered(&client, &orphan).await;
    adopter.stop().await;
}

/// A replica that hears no keep-alive reply for longer than its TTL stops
/// acting as an owner, but its lease lives (the keep-alives reached etcd):
/// the upgrade it was running must go on once etcd answers again. Its
/// provider call, refused for want of a live claim, used to fail the
/// operation (the fenced write still passed: the lease lived), and then
/// nothing resumed it before the executor's 30 s rescan.
#[tokio::test]
async fn an_upgrade_through_a_lapse_whose_lease_lives_goes_on() {
    let Backends { sim, etcd } = Backends::start().await;
    let owner = InProcessReplica::serve(&etcd, "owner", &sim.endpoint(), 2).await;
    let mut client = owner.client().await;
    create_running(&mut client, "db", 3).await;
    // Four node upgrades of 700 ms each: the lapse begins during the first.
    sim.set_latency(Duration::from_millis(700)).await;
    let request = v1::UpgradeClusterRequest {
        name: "db".into(),
        version: "1.30.0".into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    let upgrade = client.clusters().upgrade_cluster(request).await.unwrap();
    let upgrade = upgrade.into_inner();
    wait_running(&client, "db", &upgrade.id, WAIT).await;
    owner.store.lose_keep_alive_replies(true);
    // The fault lasts past the belief (1.6 s) and the TTL a provider call
    // then waits for etcd's word (2 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    owner.store.lose_keep_alive_replies(false);
    sim.set_latency(Duration::ZERO).await;
    let done = client.wait_operation(&upgrade, WAIT).await.expect("wait");
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    let cluster = client.get_cluster("db").await.unwrap();
    let status = cluster.status.unwrap();
    assert_eq!(status.current_version.as_deref(), Some("1.30.0"));
    owner.stop().await;
}

/// The claim of a dead peer's clusters commits and its reply is lost: the
/// pass fails, and the next one finds the clusters owned by this replica in
/// the owner view. They used to be taken as owned without being announced
/// as adopted, so the orphan waited for the executor's 30 s rescan.
#[tokio::test]
async fn an_orphan_whose_claim_reply_was_lost_is_recovered_at_once() {
    let Backends { sim, etcd } = Backends::start().await;
    let orphan = orphan_of_a_killed_replica(&etcd, &sim, 0).await;
    let adopter = InProcessReplica::serve(&etcd, "adopter", &sim.endpoint(), 2).await;
    adopter.store.inject(
        |txn| writes(txn, |key| key.ends_with("/owners/a-orphan"), None),
        Injection::Lose(Box::pin(async {})),
    );
    assert_recovered(&adopter.client().await, &orphan).await;
    assert_eq!(adopter.store.pending(), 0, "the claim's reply was lost");
    adopter.stop().await;
}

/// The owner accepts an operation and claims it in one transaction, marking
/// it as running here first so that no watch event starts it again. When
/// etcd's reply to that transaction is lost, the replica cannot know that
/// it committed; it used to drop the mark and nothing else, so the state
/// change it had skipped for the mark left the committed operation to the
/// executor's rescan, 30 s later.
#[tokio::test]
async fn an_accept_whose_reply_was_lost_after_the_commit_still_runs() {
    let mut f = DbOwner::start().await;
    // The cache sees the commit before the replica hears back.
    f.replica.store.inject(
        |txn| writes(txn, |key| key.contains("/operations/db/"), Some("\"Stop\"")),
        Injection::Lose(Box::pin(tokio::time::sleep(Duration::from_millis(500)))),
    );
    let request = v1::StopClusterRequest {
        name: "db".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let refused = f.client.clusters().stop_cluster(request).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(f.replica.store.pending(), 0);
    let client = &f.client;
    wait_until(WAIT, "the committed stop to run", || async move {
        let mut client = client.clone();
        let cluster = client.get_cluster("db").await.expect("get cluster");
        cluster.status.and_then(|s| s.state) == Some(v1::ClusterState::Stopped as i32)
    })
    .await;
    f.stop().await;
}

/// An accept on a replica that does not own the cluster folds in the
/// owner's claim as its view of the owner keys shows it. When that view is
/// stale (here the owner key goes just before the accept is sent), the
/// accept loses its compare and is tried again on a read from etcd without
/// the claim: the client gets its operation, PENDING, and the owner (which
/// claims the cluster again) runs it. Polled: the replica's view follows
/// the owner keys through its ownership passes, so the first accepts may
/// carry no claim for the owner (and are let through).
#[tokio::test]
async fn an_accept_claiming_for_an_owner_it_saw_stale_is_accepted_without_the_claim() {
    use drover_server::store::{Op as StoreOp, Store, Txn as StoreTxn};
    let mut f = DbOwner::start().await;
    let provider = f.backends.sim.endpoint();
    let other = InProcessReplica::serve(&f.backends.etcd, "r2", &provider, 2).await;
    let name = (0..64)
        .map(|i| format!("stale-{i}"))
        .find(|name| preferred(name, ["r1", "r2"]) == Some("r1"))
        .expect("one of 64 names prefers r1");
    create_running(&mut f.client, &name, 1).await;
    let mut client = other.client().await;
    let etcd = f.backends.etcd.store().await;
    let owner_key = format!("/drover/v1/owners/{name}");
    let deadline = tokio::time::Instant::now() + WAIT * 3;
    for round in 0.. {
        assert!(
            tokio::time::Instant::now() < deadline,
            "r2 never claimed for the owner"
        );
        let (etcd, key) = (etcd.clone(), owner_key.clone());
        let picked = owner_key.clone();
        other.store.inject(
            move |txn| txn.compares.iter().any(|c| c.key == picked) && txn.success.len() > 1,
            Injection::Before(Box::pin(async move {
                let delete = StoreTxn::new().and_then([StoreOp::delete(key)]);
                etcd.txn(delete).await.expect("delete the owner key");
            })),
        );
        let op = stop_or_start(&mut client, &name, round % 2 == 0).await;
        let op = op.expect("accepted");
        let done = client.wait_operation(&op, WAIT).await.expect("wait");
        assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
        if other.store.pending() == 0 {
            assert_eq!(
                op.state,
                O::Pending as i32,
                "accepted without the claim: {op:?}"
            );
            break;
        }
        // Not fired: r2's view did not show the owner yet.
        other.store.clear_rules();
    }
    other.stop().await;
    f.stop().await;
}

/// droverctl without `--request-id`: the stop's reply is lost after its
/// commit (the replica answers UNAVAILABLE). droverctl sends it again under
/// the request id it generated, and gets the operation the first attempt
/// started. It used to send no id and not retry: the command failed
/// although the stop went ahead (and a retry by hand was refused, the
/// cluster being busy with it).
#[tokio::test]
async fn droverctl_sends_a_request_again_whose_reply_was_lost_and_starts_one_operation() {
    let f = DbOwner::start().await;
    f.replica.store.inject(
        |txn| writes(txn, |key| key.contains("/operations/db/"), Some("\"Stop\"")),
        Injection::Lose(Box::pin(async {})),
    );
    let endpoint = f.replica.endpoint().to_string();
    let stop = tokio::task::spawn_blocking(move || {
        std::process::Command::new(drover_tests::workspace_binary("droverctl"))
            .args([
                "--endpoint",
                &endpoint,
                "-o",
                "json",
                "cluster",
                "stop",
                "db",
            ])
            .output()
            .expect("run droverctl")
    })
    .await
    .unwrap();
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    assert_eq!(f.replica.store.pending(), 0, "the reply was lost");
    let printed: serde_json::Value = serde_json::from_slice(&stop.stdout).expect("JSON output");
    let listed = operations_of(&f.client, "db").await;
    let stops: Vec<_> = listed
        .iter()
        .filter(|op| op.kind == v1::OperationKind::Stop as i32)
        .collect();
    assert_eq!(stops.len(), 1, "{listed:?}");
    assert_eq!(printed["id"], stops[0].id.as_str(), "{printed}");
    f.stop().await;
}

/// The owner starts a task run, and etcd's reply comes late (lost after the
/// commit) while a member the cluster prefers joins. The owner used to hold
/// the cluster only once the run was under way, so its ownership pass could
/// hand the idle cluster over meanwhile, and the new owner aborted a run
/// nobody had asked the provider for. Held from before the run exists, the
/// run ends DONE here; only then does the cluster move.
#[tokio::test]
async fn a_run_whose_start_reply_was_lost_while_a_member_joined_still_runs() {
    let mut f = DbOwner::start().await;
    let peer_id = (2..)
        .map(|i| format!("r{i}"))
        .find(|id| preferred("db", ["r1", id.as_str()]) == Some(id.as_str()))
        .unwrap();
    let joined: Arc<Mutex<Option<ReplicaProcess>>> = Arc::default();
    let (etcd, sim) = (f.backends.etcd.endpoint(), f.backends.sim.endpoint());
    let peer = Arc::clone(&joined);
    f.replica.store.inject(
        |txn| writes(txn, |key| key.contains("/runs/"), Some("\"RUNNING\"")),
        Injection::Lose(Box::pin(async move {
            let args = ["--provider", sim.as_str(), "--lease-ttl", "2"];
            let replica = ReplicaProcess::serve_with(&etcd, &peer_id, &args).await;
            *peer.lock().unwrap() = Some(replica);
            // A fault, not a wait for an event: the reply arrives 2 s late,
            // time for several ownership passes (every TTL/3, and at once
            // when a member joins).
            tokio::time::sleep(Duration::from_secs(2)).await;
        })),
    );
    let now = v1::TaskSchedule {
        start_date: "now".into(),
        ..Default::default()
    };
    put_task(&mut f.client, task(T::Backup, "once", now)).await;
    let client = &f.client;
    wait_until(WAIT, "the run to end", || async move {
        task_status(client, T::Backup, "once")
            .await
            .and_then(|status| status.last_run)
            .is_some_and(|run| run.status != R::Running as i32)
    })
    .await;
    assert_eq!(f.replica.store.pending(), 0, "the reply was lost");
    let status = task_status(client, T::Backup, "once").await.unwrap();
    let run = status.last_run.clone().unwrap();
    assert_eq!(run.status, R::Done as i32, "{status:?}");
    assert_eq!(status.error_count, Some(0), "{status:?}");
    let audit = f.backends.sim.audit(&f.uid).await;
    assert!(!audit.iter().any(|e| e.method == "StopTask"), "{audit:#?}");
    drop(joined.lock().unwrap().take());
    f.stop().await;
}

/// A lifecycle request reaching the owner while it shuts down (SIGTERM; a
/// load balancer may route to it until its probes notice) is accepted
/// PENDING for the cluster's next owner. The owner used to fold its claim
/// into the accept and start the operation, which the hand-off then cut
/// short: the next owner failed it as an orphan.
#[tokio::test]
async fn an_accept_on_an_owner_that_shuts_down_is_left_to_the_next_owner() {
    let mut f = DbOwner::start().await;
    let mut client = f.client.clone();
    create_running(&mut client, "busy", 1).await;
    let running = f.drain_holding("busy").await;
    assert_eq!(running.state, O::Running as i32, "claimed at the accept");
    let request = v1::StopClusterRequest {
        name: "db".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let accepted = client
        .clusters()
        .stop_cluster(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(accepted.state, O::Pending as i32, "{accepted:?}");
    f.backends.sim.set_latency(Duration::ZERO).await;
    let next = f.backends.serve("next", &["--lease-ttl", "2"]).await;
    let done = next
        .client()
        .await
        .wait_operation(&accepted, WAIT)
        .await
        .unwrap();
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    assert_eq!(done.replica.as_deref(), Some("next"), "{done:?}");
    f.stop().await;
}

/// WatchClusters reads each changed cluster to send it whole. When that
/// read failed, the change used to be skipped without a word and the stream
/// stayed open, so the client's view stayed stale; now the stream ends with
/// the error and the client resumes from the last revision it received.
#[tokio::test]
async fn a_cluster_watch_whose_read_fails_ends_with_the_error() {
    let mut f = DbOwner::start().await;
    let request = v1::WatchClustersRequest {
        from_revision: 0,
        name: "db".into(),
    };
    let mut events = f
        .client
        .clusters()
        .watch_clusters(request)
        .await
        .unwrap()
        .into_inner();
    // From just before the edit is written, so before the watch can read
    // the cluster (the edit's own answer, read after it, fails too).
    let store = Arc::clone(&f.replica.store);
    f.replica.store.inject(
        |txn| writes(txn, |key| key.ends_with("/clusters/db/spec"), None),
        Injection::Before(Box::pin(async move {
            store.fail_reads(|read| read.prefix.ends_with("/clusters/db/"));
        })),
    );
    let update = v1::UpdateClusterRequest {
        name: "db".into(),
        labels: [("tier".to_string(), "gold".to_string())].into(),
        update_labels: true,
        ..Default::default()
    };
    let _ = f.client.clusters().update_cluster(update).await;
    assert_eq!(f.replica.store.pending(), 0, "the edit committed");
    let next = tokio::time::timeout(WAIT, events.message())
        .await
        .expect("the stream ends instead of going quiet");
    let status = next.expect_err("an error, not an event");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    f.replica.store.heal_reads();
    f.stop().await;
}

/// Ownership passes this replica has run, from its metrics.
async fn ownership_passes(replica: &InProcessReplica) -> f64 {
    let samples = drover_tests::scrape::metrics(replica.admin_endpoint()).await;
    drover_tests::scrape::sum(&samples, "drover_ownership_passes_total", "")
}

/// An ownership pass that fails (here: its read of the members) is tried
/// again after a pause. It used to be retried at once, pass after pass, for
/// as long as the error lasted.
#[tokio::test]
async fn failing_ownership_passes_are_retried_after_a_pause() {
    let f = DbOwner::start().await;
    f.replica
        .store
        .fail_reads(|read| read.prefix.ends_with("/members/"));
    let before = ownership_passes(&f.replica).await;
    // A window to count passes in, not a wait for an event.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let passes = ownership_passes(&f.replica).await - before;
    assert!(
        passes <= 6.0,
        "{passes} passes in 2 s while every pass fails"
    );
    f.replica.store.heal_reads();
    f.stop().await;
}

/// While a replica drains (SIGTERM, waiting for its running operations),
/// its cached reads show what etcd has: its cache stopped following etcd at
/// the signal, and used to go on answering from what it had then.
#[tokio::test]
async fn reads_from_a_draining_replica_are_current() {
    let mut f = DbOwner::start().await;
    let mut client = f.client.clone();
    f.drain_holding("db").await;
    // A change the draining replica's cache would not follow any more.
    let update = v1::UpdateClusterRequest {
        name: "db".into(),
        labels: [("tier".to_string(), "gold".to_string())].into(),
        update_labels: true,
        ..Default::default()
    };
    let updated = client
        .clusters()
        .update_cluster(update)
        .await
        .unwrap()
        .into_inner();
    let cached = v1::GetClusterRequest {
        name: "db".into(),
        linearizable: false,
    };
    let read = client
        .clusters()
        .get_cluster(cached)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.generation, updated.generation, "{read:?}");
    f.backends.sim.set_latency(Duration::ZERO).await;
    f.stop().await;
}

/// The owner's write of an operation's progress commits, its reply is lost,
/// and the read that would recognise it fails too (etcd still unreachable).
/// The owner used to give the operation up there, leaving it RUNNING until
/// its executor's rescan 30 s later; now it keeps retrying while it holds
/// the cluster.
#[tokio::test]
async fn a_progress_write_whose_reply_and_recognition_were_lost_goes_on() {
    let mut f = DbOwner::start().await;
    let store = Arc::clone(&f.replica.store);
    f.replica.store.inject(
        |txn| {
            writes(
                txn,
                |key| key.contains("/operations/db/"),
                Some("\"step\":2"),
            ) && !writes(txn, |key| key.ends_with("/state"), None)
        },
        Injection::Lose(Box::pin(async move {
            store.fail_reads(|read| read.prefix.contains("/operations/db/"));
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                // The outage the retries must outlast.
                tokio::time::sleep(Duration::from_millis(500)).await;
                store.heal_reads();
            });
        })),
    );
    let request = v1::UpgradeClusterRequest {
        name: "db".into(),
        version: "1.30.0".into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    let op = f
        .client
        .clusters()
        .upgrade_cluster(request)
        .await
        .unwrap()
        .into_inner();
    let done = f.client.wait_operation(&op, WAIT).await.unwrap();
    assert_eq!(done.state, O::Succeeded as i32, "{done:?}");
    assert_eq!(
        f.replica.store.pending(),
        0,
        "the progress write's reply was lost"
    );
    f.stop().await;
}

/// An accept under a new request id reads nothing before its transaction
/// (the compare that the request id is unused says it): with every read
/// of the request entries failing, it still commits. Its retry, whose
/// compare fails, reads the entry then and is answered the same operation.
#[tokio::test]
async fn an_accept_under_a_new_request_id_reads_no_request_entry() {
    let mut f = DbOwner::start().await;
    f.replica
        .store
        .fail_reads(|read| read.prefix.contains("/requests/db/"));
    let request = v1::StopClusterRequest {
        name: "db".into(),
        request_id: "stop-once".into(),
        ..Default::default()
    };
    let first = f
        .client
        .clusters()
        .stop_cluster(request.clone())
        .await
        .expect("accepted without reading its request entry")
        .into_inner();
    f.replica.store.heal_reads();
    let again = f
        .client
        .clusters()
        .stop_cluster(request)
        .await
        .expect("the retry is answered")
        .into_inner();
    assert_eq!(again.id, first.id);
    f.stop().await;
}
