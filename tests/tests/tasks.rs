//! Scheduled tasks end to end: a real etcd, the simulated provider process
//! and real `drover serve` processes. Validation, reconciliation by name
//! within type, status split from spec, error propagation, the reference's
//! old-generation bug as a regression test, and a kill -9 of the owner
//! during a run.

use drover_client::v1::{self, TaskRunStatus as R, TaskType as T};
use drover_client::Client;
use drover_proto::provider::v1 as pb;
use drover_proto::v1::admin_client::AdminClient;
use drover_server::cluster::{from_json, Registry, SpecRecord};
use drover_server::keys::KeyLayout;
use drover_server::metrics::Metrics;
use drover_server::replication::{Claim, OwnerRecord, Ownership, OwnershipConfig};
use drover_server::store::SharedStore;
use drover_server::task::{ReconcileOutcome, TaskScheduler, TaskStore};
use drover_tests::fixture::{Fixture, FixtureBuilder};
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, owner, repair_now, wait_until};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);
const PREFIX: &str = "/drover/v1/";

/// `replicas` replicas scanning every second.
fn fixture(replicas: usize) -> FixtureBuilder {
    Fixture::builder().replicas(replicas).scan_interval(1)
}

/// The task calls these tests make through the fixture's client, and its
/// etcd as the server's own code sees it.
trait Tasks {
    async fn put(&mut self, cluster: &str, task: v1::TaskSpec) -> Result<v1::Task, tonic::Status>;
    async fn get(
        &mut self,
        cluster: &str,
        task_type: T,
        name: &str,
    ) -> Result<v1::Task, tonic::Status>;
    async fn runs(&mut self, cluster: &str, task_type: T, name: &str) -> Vec<v1::TaskRun>;
    async fn store(&self) -> SharedStore;
}

impl Tasks for Fixture {
    async fn put(&mut self, cluster: &str, task: v1::TaskSpec) -> Result<v1::Task, tonic::Status> {
        let request = v1::PutTaskRequest {
            cluster: cluster.into(),
            task: Some(task),
        };
        self.client
            .tasks()
            .put_task(request)
            .await
            .map(|r| r.into_inner())
    }

    async fn get(
        &mut self,
        cluster: &str,
        task_type: T,
        name: &str,
    ) -> Result<v1::Task, tonic::Status> {
        let request = v1::GetTaskRequest {
            cluster: cluster.into(),
            r#type: task_type as i32,
            name: name.into(),
        };
        self.client
            .tasks()
            .get_task(request)
            .await
            .map(|r| r.into_inner())
    }

    async fn runs(&mut self, cluster: &str, task_type: T, name: &str) -> Vec<v1::TaskRun> {
        runs(&mut self.client, cluster, task_type, name).await
    }

    async fn store(&self) -> SharedStore {
        Arc::new(self.etcd.store().await)
    }
}

async fn runs(client: &mut Client, cluster: &str, task_type: T, name: &str) -> Vec<v1::TaskRun> {
    let request = v1::ListTaskRunsRequest {
        cluster: cluster.into(),
        r#type: task_type as i32,
        name: name.into(),
        page_size: 0,
    };
    client
        .tasks()
        .list_task_runs(request)
        .await
        .expect("list runs")
        .into_inner()
        .runs
}

/// Polls GetTask until `condition` holds for the task's status.
async fn wait_status(
    client: &Client,
    cluster: &str,
    task_type: T,
    name: &str,
    what: &str,
    condition: impl Fn(&v1::TaskStatus) -> bool,
) -> v1::TaskStatus {
    let deadline = Instant::now() + WAIT;
    let mut client = client.clone();
    loop {
        let request = v1::GetTaskRequest {
            cluster: cluster.into(),
            r#type: task_type as i32,
            name: name.into(),
        };
        let status = client
            .tasks()
            .get_task(request)
            .await
            .ok()
            .and_then(|t| t.into_inner().status);
        if let Some(status) = &status {
            if condition(status) {
                return status.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}; last status: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn backup(name: &str) -> v1::TaskSpec {
    v1::TaskSpec {
        r#type: T::Backup as i32,
        name: name.into(),
        schedule: Some(v1::TaskSchedule {
            start_date: "now".into(),
            ..Default::default()
        }),
        properties: Some(v1::task_spec::Properties::Backup(v1::BackupProperties {
            location: vec!["dc1:s3:drover-backups".into()],
            ..Default::default()
        })),
    }
}

fn with_schedule(mut task: v1::TaskSpec, edit: impl FnOnce(&mut v1::TaskSchedule)) -> v1::TaskSpec {
    edit(task.schedule.get_or_insert_with(Default::default));
    task
}

fn is_done(status: &v1::TaskStatus) -> bool {
    status
        .last_run
        .as_ref()
        .is_some_and(|run| run.status == R::Done as i32)
}

fn run_task_entries(audit: &[pb::AuditEntry]) -> Vec<&pb::AuditEntry> {
    audit.iter().filter(|e| e.method == "RunTask").collect()
}

/// Every RunTask call names a run id no other RunTask call named: no run
/// was started (or asked for) twice.
fn assert_each_run_asked_once(audit: &[pb::AuditEntry]) {
    let mut seen = HashSet::new();
    for entry in run_task_entries(audit) {
        assert!(
            entry.detail.starts_with("run "),
            "a repeated RunTask: {entry:?}"
        );
        let run_id = entry.token.as_ref().unwrap().operation_id.clone();
        assert!(seen.insert(run_id), "RunTask twice for one run: {audit:#?}");
    }
}

#[tokio::test]
async fn bad_tasks_are_refused_naming_the_field_and_nothing_is_written() {
    let mut f = fixture(1).start().await;
    let spec = |tasks| v1::ClusterSpec {
        version: "1.29.0".into(),
        control_nodes: 1,
        worker_nodes: 1,
        node_offering: "medium".into(),
        tasks,
        ..Default::default()
    };
    let create = |name: &str, tasks| v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(spec(tasks)),
        create_only: true,
        request_id: String::new(),
    };
    let bad_cron = with_schedule(repair_now("weekly"), |s| s.cron = "TZ=UTC 0 3 * * 1".into());
    let cases = [
        (
            vec![repair_now("a"), backup("b"), bad_cron],
            "spec.tasks[2].schedule.cron: ",
        ),
        (
            vec![repair_now("a"), repair_now("a")],
            "spec.tasks[1].name: ",
        ),
        (
            vec![with_schedule(repair_now("a"), |s| {
                s.timezone = "Europe/Warsaw".into()
            })],
            "spec.tasks[0].schedule.timezone: ",
        ),
        (
            vec![with_schedule(repair_now("a"), |s| {
                s.cron = "0 3 * * *".into();
                s.interval = "24h".into();
            })],
            "spec.tasks[0].schedule.interval: ",
        ),
        (
            vec![repair_now("6d3f4a1e-8f7b-4c1a-9a57-5f0e3a1b2c3d")],
            "spec.tasks[0].name: ",
        ),
        // Accepted, it crashed the owner's scheduler (date arithmetic).
        (
            vec![with_schedule(repair_now("a"), |s| {
                s.start_date = "now+1000000y".into()
            })],
            "spec.tasks[0].schedule.start_date: ",
        ),
    ];
    for (tasks, field) in cases {
        let refused = f
            .client
            .clusters()
            .create_cluster(create("web", tasks))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().starts_with(field),
            "{field}: {}",
            refused.message()
        );
    }
    // A name no task can have is bad input, not a task that is missing.
    let refused = f.get("web", T::Repair, "no such name!").await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("name: "), "{refused:?}");
    let store = f.store().await;
    let written = store
        .range(drover_server::store::RangeRequest::prefix(
            KeyLayout::new(PREFIX).clusters(),
        ))
        .await
        .unwrap();
    assert!(
        written.kvs.is_empty(),
        "refused requests wrote {:?}",
        written.kvs
    );

    // The same name in two types is fine.
    f.client
        .clusters()
        .create_cluster(create("web", vec![repair_now("daily"), backup("daily")]))
        .await
        .expect("one name, two types");
    let generation = f.client.get_cluster("web").await.unwrap().generation;
    let mut bad_intensity = repair_now("daily");
    bad_intensity.properties = Some(v1::task_spec::Properties::Repair(v1::RepairProperties {
        intensity: "fast".into(),
        ..Default::default()
    }));
    let mut no_location = backup("daily");
    no_location.properties = None;
    let mut bad_location = backup("daily");
    bad_location.properties = Some(v1::task_spec::Properties::Backup(v1::BackupProperties {
        location: vec!["ftp:bucket".into()],
        ..Default::default()
    }));
    for (task, field) in [
        (bad_intensity, "task.repair.intensity: "),
        (no_location, "task.backup.location: "),
        (bad_location, "task.backup.location[0]: "),
    ] {
        let refused = f.put("web", task).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused.message().starts_with(field),
            "{}",
            refused.message()
        );
    }
    assert_eq!(
        f.client.get_cluster("web").await.unwrap().generation,
        generation,
        "a refused PutTask wrote nothing"
    );
    let missing = f.get("web", T::Repair, "nope").await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn tasks_run_once_per_slot_with_status_split_from_spec() {
    let mut f = fixture(1).start().await;
    let created = create_running(&mut f.client, "db", 1).await;
    let put = f.put("db", repair_now("nightly")).await.unwrap();
    assert_eq!(put.spec.as_ref().unwrap().name, "nightly");
    f.put("db", backup("nightly"))
        .await
        .expect("same name, other type");

    let repair_status = wait_status(
        &f.client,
        "db",
        T::Repair,
        "nightly",
        "the repair to run",
        is_done,
    )
    .await;
    let backup_status = wait_status(
        &f.client,
        "db",
        T::Backup,
        "nightly",
        "the backup to run",
        is_done,
    )
    .await;
    for status in [&repair_status, &backup_status] {
        assert!(status.id.is_some());
        assert_eq!(status.success_count, Some(1));
        assert_eq!(status.error_count, Some(0));
        assert_eq!(
            status.next_activation, None,
            "a one-shot task has no next run"
        );
        assert_eq!(status.error, None);
        let start = &status.schedule.as_ref().unwrap().start_date;
        assert!(
            start.ends_with('Z') && start != "now",
            "evaluated once: {start}"
        );
    }
    assert_ne!(repair_status.id, backup_status.id);
    // The spec still says what the user wrote.
    let task = f.get("db", T::Repair, "nightly").await.unwrap();
    assert_eq!(task.spec.unwrap().schedule.unwrap().start_date, "now");

    let audit = f.sim.audit(&created.uid).await;
    assert_each_run_asked_once(&audit);
    assert_eq!(run_task_entries(&audit).len(), 2, "{audit:#?}");
    let runs = f.runs("db", T::Repair, "nightly").await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, R::Done as i32);
    assert!(runs[0].id.starts_with(repair_status.id.as_deref().unwrap()));

    // A change keeps the id and re-runs nothing already run; a new start
    // date is evaluated anew and runs again.
    let changed = with_schedule(repair_now("nightly"), |s| s.retry_wait = "1s".into());
    f.put("db", changed).await.unwrap();
    let changed = with_schedule(repair_now("nightly"), |s| s.start_date = "now+1s".into());
    f.put("db", changed).await.unwrap();
    let again = wait_status(
        &f.client,
        "db",
        T::Repair,
        "nightly",
        "the repair's new start",
        |s| s.success_count == Some(2),
    )
    .await;
    assert_eq!(again.id, repair_status.id, "the id is kept across changes");

    // Deleting the backup deletes its status and runs.
    let delete = v1::DeleteTaskRequest {
        cluster: "db".into(),
        r#type: T::Backup as i32,
        name: "nightly".into(),
    };
    f.client.tasks().delete_task(delete.clone()).await.unwrap();
    let gone = f.client.tasks().delete_task(delete).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    let listed = f
        .client
        .tasks()
        .list_tasks(v1::ListTasksRequest {
            cluster: "db".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), 1);
    let store = f.store().await;
    let keys = KeyLayout::new(PREFIX);
    wait_until(WAIT, "the backup's record and runs to go", || {
        let store = store.clone();
        let (record, runs) = (
            keys.task("db", "backup", "nightly"),
            keys.task_runs("db", backup_status.id.as_deref().unwrap()),
        );
        async move {
            let record = store.get(&record).await.unwrap().kvs.is_empty();
            let runs = store
                .range(drover_server::store::RangeRequest::prefix(runs))
                .await
                .unwrap()
                .kvs
                .is_empty();
            record && runs
        }
    })
    .await;
    let audit = f.sim.audit(&created.uid).await;
    assert_each_run_asked_once(&audit);
    assert_eq!(run_task_entries(&audit).len(), 3, "{audit:#?}");
}

#[tokio::test]
async fn runs_wait_for_a_running_cluster_with_no_operation() {
    let mut f = fixture(1).start().await;
    let request = v1::CreateClusterRequest {
        name: "idle".into(),
        spec: Some(v1::ClusterSpec {
            version: "1.29.0".into(),
            control_nodes: 1,
            worker_nodes: 1,
            node_offering: "medium".into(),
            tasks: vec![repair_now("soon")],
            ..Default::default()
        }),
        create_only: true,
        request_id: String::new(),
    };
    f.client.create_cluster(request).await.unwrap();
    let waiting = wait_status(
        &f.client,
        "idle",
        T::Repair,
        "soon",
        "the task to wait",
        |s| s.error.is_some(),
    )
    .await;
    assert!(
        waiting
            .error
            .as_deref()
            .unwrap()
            .contains("cluster is Created"),
        "{waiting:?}"
    );
    assert_eq!(waiting.last_run, None);
    assert!(waiting.id.is_some(), "scheduled, only waiting");

    let start = v1::StartClusterRequest {
        name: "idle".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = f
        .client
        .clusters()
        .start_cluster(start)
        .await
        .unwrap()
        .into_inner();
    let done = wait_status(
        &f.client,
        "idle",
        T::Repair,
        "soon",
        "the run after the start",
        is_done,
    )
    .await;
    assert_eq!(done.error, None);
    let finished = f.client.wait_operation(&op, WAIT).await.unwrap();
    let run = done.last_run.unwrap();
    assert!(
        run.started_at.unwrap().seconds >= finished.finished_at.unwrap().seconds,
        "the run began only once the start had ended"
    );
}

#[tokio::test]
async fn run_errors_and_scheduling_errors_propagate_for_repair_and_backup() {
    let mut f = fixture(1).start().await;
    create_running(&mut f.client, "db", 1).await;
    // Provider-side failures: both types, no retries.
    // Two armed faults: the next two RunTask calls fail, whichever runs first.
    f.sim.fault("RunTask", 1, false).await;
    f.sim.fault("RunTask", 1, false).await;
    let no_retry = |task: v1::TaskSpec| with_schedule(task, |s| s.num_retries = Some(0));
    f.put("db", no_retry(repair_now("r"))).await.unwrap();
    f.put("db", no_retry(backup("b"))).await.unwrap();
    for (task_type, name) in [(T::Repair, "r"), (T::Backup, "b")] {
        let failed = wait_status(&f.client, "db", task_type, name, "the run to fail", |s| {
            s.error_count == Some(1)
        })
        .await;
        let run = failed.last_run.expect("the failed run");
        assert_eq!(run.status, R::Error as i32);
        assert!(run.error.unwrap().contains("injected fault in RunTask"));
        assert_eq!(failed.success_count, Some(0));
        assert_eq!(failed.next_activation, None, "no retries left");
    }

    // Client-side errors (a schedule that never fires): only name and error.
    let never = |task: v1::TaskSpec, cron: &str| {
        let cron = cron.to_string();
        with_schedule(task, move |s| {
            s.start_date = String::new();
            s.cron = cron;
        })
    };
    f.put("db", never(repair_now("feb30"), "0 0 30 2 *"))
        .await
        .unwrap();
    f.put("db", never(backup("apr31"), "0 0 31 4 *"))
        .await
        .unwrap();
    for (task_type, name) in [(T::Repair, "feb30"), (T::Backup, "apr31")] {
        let status = wait_status(
            &f.client,
            "db",
            task_type,
            name,
            "the scheduling error",
            |s| s.error.is_some(),
        )
        .await;
        assert_eq!(
            status,
            v1::TaskStatus {
                name: Some(name.into()),
                error: status.error.clone(),
                ..Default::default()
            },
            "only the name and the error"
        );
        assert!(status.error.unwrap().contains("no next activation"));
    }
    // Fixed, the error clears and the task is scheduled.
    f.put("db", never(repair_now("feb30"), "0 0 28 2 *"))
        .await
        .unwrap();
    let fixed = wait_status(&f.client, "db", T::Repair, "feb30", "the fix", |s| {
        s.id.is_some()
    })
    .await;
    assert_eq!(fixed.error, None);
    assert!(fixed.next_activation.is_some());
}

/// The reference's bug: reconciling an older generation whose view has no
/// task ids deleted the tasks and created them again. Here the current
/// owner is handed the first generation of the spec (which had fewer tasks
/// and other settings) after a newer one was reconciled: nothing may be
/// deleted, recreated or re-keyed.
#[tokio::test]
async fn an_older_generation_never_deletes_or_recreates_tasks() {
    let mut f = fixture(1).start().await;
    let created = create_running(&mut f.client, "db", 1).await;
    let store = f.store().await;
    let keys = KeyLayout::new(PREFIX);
    let registry = Registry::new(store.clone(), keys.clone());
    f.put("db", repair_now("r1")).await.unwrap();
    let old_generation: SpecRecord = registry.get("db").await.unwrap().spec;
    f.put("db", backup("b1")).await.unwrap();
    f.put(
        "db",
        with_schedule(repair_now("r1"), |s| s.retry_wait = "5m".into()),
    )
    .await
    .unwrap();
    let newest = registry.get("db").await.unwrap().spec.generation;
    assert!(newest > old_generation.generation);
    for (task_type, name) in [(T::Repair, "r1"), (T::Backup, "b1")] {
        wait_status(&f.client, "db", task_type, name, "the run", is_done).await;
    }
    let tasks = TaskStore::new(store.clone(), keys.clone());
    wait_until(WAIT, "the newest generation to be reconciled", || {
        let tasks = tasks.clone();
        async move {
            let read = tasks.read("db").await.unwrap().unwrap();
            read.reconciled.map(|(generation, _)| generation) == Some(newest)
        }
    })
    .await;
    let before = tasks.read("db").await.unwrap().unwrap();

    // Act as the owner (its lease and epoch), with the old generation.
    let owner_kv = store
        .get(&keys.owner("db"))
        .await
        .unwrap()
        .into_single()
        .unwrap();
    let owner: OwnerRecord = from_json(&owner_kv).unwrap();
    let claim = Claim::new(owner.lease, owner.base(), owner_kv.create_revision);
    let (replication, _) = Ownership::new(
        store.clone(),
        keys.clone(),
        OwnershipConfig {
            replica_id: "stale-reader".into(),
            address: "127.0.0.1:1".into(),
            admin_address: String::new(),
            admin_tls: None,
            lease_ttl: Duration::from_secs(2),
            lease_margin: Duration::from_millis(400),
            peer_liveness: false,
        },
        Metrics::new(),
    );
    let endpoint = f.sim.endpoint();
    let provider = drover_server::provider::connect_lazy(&endpoint).unwrap();
    let providers = drover_server::provider::Providers::single("default", &endpoint, provider);
    let cache =
        drover_server::cluster::ClusterCache::new(store.clone(), keys.clone(), Metrics::new());
    let scheduler = TaskScheduler::new(
        tasks.clone(),
        Arc::new(providers),
        drover_server::owner_work::OwnerWork::new(replication),
        cache,
        Metrics::new(),
        Duration::from_secs(3600),
    );
    let outcome = scheduler.reconcile(&old_generation, claim).await.unwrap();
    assert_eq!(
        outcome,
        ReconcileOutcome::Stale {
            generation: old_generation.generation,
            reconciled: newest
        }
    );
    // The same owner with the current spec: nothing to do either.
    let current = registry.get("db").await.unwrap().spec;
    assert_eq!(
        scheduler.reconcile(&current, claim).await.unwrap(),
        ReconcileOutcome::Unchanged
    );

    let after = tasks.read("db").await.unwrap().unwrap();
    assert_eq!(after.tasks.len(), 2);
    for (old, new) in before.tasks.iter().zip(&after.tasks) {
        assert_eq!(new.record.id, old.record.id, "ids are kept");
        assert_eq!(new.revision, old.revision, "records untouched");
    }
    // The provider saw each task's runs under its one id, and no stop.
    let audit = f.sim.audit(&created.uid).await;
    assert_each_run_asked_once(&audit);
    assert!(!audit.iter().any(|e| e.method == "StopTask"), "{audit:#?}");
    let ids: HashSet<String> = after
        .tasks
        .iter()
        .filter_map(|e| e.record.id.clone())
        .collect();
    for entry in run_task_entries(&audit) {
        let run = &entry.token.as_ref().unwrap().operation_id;
        let task_id = run.split_once('.').unwrap().0;
        assert!(ids.contains(task_id), "run {run} of an unknown task id");
    }
}

#[tokio::test]
async fn removing_a_task_stops_its_run() {
    let mut f = fixture(1).start().await;
    let created = create_running(&mut f.client, "db", 1).await;
    f.sim.set_task_latency(Duration::from_secs(60)).await;
    f.put("db", repair_now("long")).await.unwrap();
    let running = wait_status(
        &f.client,
        "db",
        T::Repair,
        "long",
        "the run to start",
        |s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.status == R::Running as i32)
        },
    )
    .await;
    let run_id = running.last_run.unwrap().id;
    let delete = v1::DeleteTaskRequest {
        cluster: "db".into(),
        r#type: T::Repair as i32,
        name: "long".into(),
    };
    f.client.tasks().delete_task(delete).await.unwrap();
    let (sim, uid, stop) = (&f.sim, &created.uid, format!("stop {run_id}"));
    wait_until(WAIT, "the run to be stopped", || {
        let stop = stop.clone();
        async move {
            sim.audit(uid)
                .await
                .iter()
                .any(|e| e.method == "StopTask" && e.detail == stop)
        }
    })
    .await;
    let store = f.store().await;
    let key = KeyLayout::new(PREFIX).task("db", "repair", "long");
    wait_until(WAIT, "the task record to go", || {
        let (store, key) = (store.clone(), key.clone());
        async move { store.get(&key).await.unwrap().kvs.is_empty() }
    })
    .await;
}

/// kill -9 of the owner while a run is in progress: the new owner fences
/// the provider, records the run ABORTED, and retries it in a new slot;
/// no slot runs twice and the old run is never resumed.
#[tokio::test]
async fn kill_9_of_the_owner_during_a_run_aborts_and_retries_it() {
    let mut f = fixture(2).start().await;
    let created = create_running(&mut f.client, "db", 1).await;
    f.sim.set_task_latency(Duration::from_secs(60)).await;
    let task = with_schedule(repair_now("nightly"), |s| {
        s.num_retries = Some(3);
        s.retry_wait = "1s".into();
    });
    f.put("db", task).await.unwrap();
    let running = wait_status(
        &f.client,
        "db",
        T::Repair,
        "nightly",
        "the run to start",
        |s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.status == R::Running as i32)
        },
    )
    .await;
    let first = running.last_run.unwrap();

    let endpoints: Vec<String> = f.replicas.iter().map(ReplicaProcess::endpoint).collect();
    let mut admin = AdminClient::connect(endpoints[0].clone()).await.unwrap();
    let lost = owner(&mut admin, "db").await.expect("an owner").replica;
    let (dead, alive) = if lost == "r1" { (0, 1) } else { (1, 0) };
    f.replicas[dead].kill9();
    f.sim.set_task_latency(Duration::ZERO).await;
    let mut survivor = Client::connect(&endpoints[alive]).await.unwrap();

    let status = wait_status(
        &survivor,
        "db",
        T::Repair,
        "nightly",
        "the retry to succeed",
        is_done,
    )
    .await;
    assert_eq!(status.id, running.id, "same task, same id");
    assert_eq!(status.error_count, Some(1), "the aborted run");
    assert_eq!(status.success_count, Some(1), "the retry");
    let runs = runs(&mut survivor, "db", T::Repair, "nightly").await;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let (retry, aborted) = (&runs[0], &runs[1]);
    assert_eq!(aborted.id, first.id);
    assert_eq!(aborted.status, R::Aborted as i32);
    assert!(aborted
        .error
        .as_deref()
        .unwrap()
        .contains(&format!("replica {lost}")));
    assert_eq!(retry.status, R::Done as i32);
    assert_eq!(retry.attempt, 1);
    assert_ne!(retry.slot, aborted.slot, "one slot, one run");

    let audit = f.sim.audit(&created.uid).await;
    assert_each_run_asked_once(&audit);
    let asked = run_task_entries(&audit);
    assert_eq!(asked.len(), 2, "{audit:#?}");
    let epoch = |e: &pb::AuditEntry| e.token.as_ref().unwrap().epoch;
    assert!(
        epoch(asked[1]) > epoch(asked[0]),
        "the retry runs under the new epoch"
    );
    let stop = audit
        .iter()
        .find(|e| e.method == "StopTask")
        .expect("the new owner fenced the old run");
    assert_eq!(stop.detail, format!("stop {}", first.id));
    assert_eq!(epoch(stop), epoch(asked[1]));
    assert!(stop.sequence < asked[1].sequence, "fenced before the retry");
}

/// A cluster with a task run in progress is not handed to a replica that
/// joins (which would abort the run); it moves once the run has ended.
#[tokio::test]
async fn a_running_task_keeps_its_cluster_through_a_membership_change() {
    let mut f = fixture(1).start().await;
    let names: Vec<String> = (0..6).map(|i| format!("busy-{i}")).collect();
    let idle: Vec<String> = (0..6).map(|i| format!("idle-{i}")).collect();
    f.sim.set_task_latency(Duration::from_secs(120)).await;
    for name in names.iter().chain(&idle) {
        create_running(&mut f.client, name, 1).await;
    }
    for name in &names {
        f.put(name, repair_now("long")).await.unwrap();
        wait_status(
            &f.client,
            name,
            T::Repair,
            "long",
            "the run to start",
            |s| {
                s.last_run
                    .as_ref()
                    .is_some_and(|r| r.status == R::Running as i32)
            },
        )
        .await;
    }
    let members = ["r1", "r2"];
    let moves = |list: &[String]| -> Vec<String> {
        list.iter()
            .filter(|c| drover_server::replication::preferred(c, members) == Some("r2"))
            .cloned()
            .collect()
    };
    let (busy_moving, idle_moving) = (moves(&names), moves(&idle));
    assert!(
        !busy_moving.is_empty() && !idle_moving.is_empty(),
        "pick other names"
    );

    f.add_replica("r2").await;
    let mut admin = AdminClient::connect(f.replicas[0].endpoint())
        .await
        .unwrap();
    // The idle clusters that prefer r2 move: the hand-over has happened.
    for name in &idle_moving {
        let what = format!("{name} to move to r2");
        wait_until(WAIT, &what, || {
            let mut admin = admin.clone();
            async move {
                owner(&mut admin, name)
                    .await
                    .is_some_and(|o| o.replica == "r2")
            }
        })
        .await;
    }
    for name in &busy_moving {
        let held = owner(&mut admin, name).await.expect("an owner");
        assert_eq!(held.replica, "r1", "{name} moved with its run in progress");
    }
    // Once the runs end, they move too, and no run was aborted.
    f.sim.set_task_latency(Duration::ZERO).await;
    for name in &busy_moving {
        f.client
            .tasks()
            .delete_task(v1::DeleteTaskRequest {
                cluster: name.clone(),
                r#type: T::Repair as i32,
                name: "long".into(),
            })
            .await
            .unwrap();
        let what = format!("{name} to move to r2 after its run");
        wait_until(WAIT, &what, || {
            let mut admin = admin.clone();
            async move {
                owner(&mut admin, name)
                    .await
                    .is_some_and(|o| o.replica == "r2")
            }
        })
        .await;
    }
    let audit = f.sim.audit("").await;
    let stops = audit.iter().filter(|e| e.method == "StopTask").count();
    assert_eq!(
        stops,
        busy_moving.len(),
        "only the deletes stopped runs: {audit:#?}"
    );
}

#[tokio::test]
async fn a_run_that_outlasts_the_timeout_is_stopped_and_counted_an_error() {
    let mut f = fixture(1)
        .replica_args(&["--task-run-timeout", "2"])
        .start()
        .await;
    let created = create_running(&mut f.client, "db", 1).await;
    f.sim.fault("RunTask", 1, true).await;
    let task = with_schedule(backup("hangs"), |s| s.num_retries = Some(0));
    f.put("db", task).await.unwrap();
    let failed = wait_status(
        &f.client,
        "db",
        T::Backup,
        "hangs",
        "the run to time out",
        |s| s.error_count == Some(1),
    )
    .await;
    let run = failed.last_run.expect("the run");
    assert_eq!(run.status, R::Error as i32);
    assert!(
        run.error.as_deref().unwrap().contains("longer than 2s"),
        "{run:?}"
    );
    let audit = f.sim.audit(&created.uid).await;
    assert!(
        audit
            .iter()
            .any(|e| e.method == "StopTask" && e.detail == format!("stop {}", run.id)),
        "the hung run was stopped: {audit:#?}"
    );
}

/// A run carries its task's spec to the provider, and the provider's report
/// is kept on the run: the simulator reports where a backup went, from the
/// spec's locations (here a `file:` directory). A relative directory is
/// refused naming the field.
#[tokio::test]
async fn a_run_carries_its_spec_and_keeps_the_providers_report() {
    let mut f = fixture(1).start().await;
    create_running(&mut f.client, "db", 1).await;
    let mut relative = backup("local");
    if let Some(v1::task_spec::Properties::Backup(b)) = relative.properties.as_mut() {
        b.location = vec!["file:var/backups".into()];
    }
    let refused = f.put("db", relative).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().starts_with("task.backup.location[0]: "),
        "{}",
        refused.message()
    );
    let mut local = backup("local");
    if let Some(v1::task_spec::Properties::Backup(b)) = local.properties.as_mut() {
        b.location = vec!["dc1:file:/var/backups/drover".into()];
    }
    f.put("db", local).await.expect("a file: location");
    let status = wait_status(&f.client, "db", T::Backup, "local", "the backup", is_done).await;
    let report = status.last_run.unwrap().report;
    assert_eq!(
        report.as_deref(),
        Some("simulated backup to dc1:file:/var/backups/drover")
    );
    let runs = f.runs("db", T::Backup, "local").await;
    assert_eq!(runs[0].report, report, "kept on the run record too");
}
