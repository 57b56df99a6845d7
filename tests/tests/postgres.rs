//! End to end through Drover on real PostgreSQL: a real etcd, three
//! replicas, the PostgreSQL provider process and the postgres processes it
//! runs. One cluster goes through its life (create, rows written through
//! psql, scale, rolling upgrade with a switchover, a standby killed,
//! Recover, a backup restored elsewhere, destroy), and at every step the
//! databases are checked, not only what Drover says.

use drover_client::v1;
use drover_tests::postgres::{
    address, data_dir, kill_postmaster, primary, psql, rows_everywhere, writable, PgDeployment,
    WritableSampler, BIN, V1, V2,
};
use drover_tests::replica::ReplicaProcess;
use drover_tests::{scrape, start_upgrade, wait_for_state, wait_until};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const OPERATION: Duration = Duration::from_secs(180);
const ROWS: u32 = 100;

/// Three replicas in front of the PostgreSQL provider, and a client.
async fn deployment() -> PgDeployment {
    PgDeployment::start(&["pg-r1", "pg-r2", "pg-r3"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_cluster_lives_its_whole_life_through_drover() {
    let mut d = deployment().await;
    let nodes = create(&mut d).await;
    let sql = format!(
        "CREATE TABLE items (id int PRIMARY KEY, name text); \
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, {ROWS}) g"
    );
    psql(&address(&primary(&nodes)), &sql).expect("write rows");
    rows_everywhere(&nodes, ROWS).await;

    let nodes = scale_to_three_standbys(&mut d, &nodes).await;
    let nodes = rolling_upgrade(&mut d, &nodes).await;
    kill_a_standby_and_recover(&mut d, &nodes).await;
    backup_and_restore(&mut d).await;
    destroy(&mut d, &nodes).await;
}

/// The provider process killed (kill -9) while it runs one of an upgrade's
/// node steps, then started again as a supervisor would: Drover asks the
/// unavailable provider again under the same epoch, the restarted provider
/// (its fencing state and topology in its redb file) answers, and the
/// upgrade finishes: every node at the new version, one primary, the rows
/// everywhere, one run under one epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_restarted_mid_upgrade_finishes_the_upgrade() {
    let mut d = deployment().await;
    let nodes = create(&mut d).await;
    let sql = format!(
        "CREATE TABLE items (id int PRIMARY KEY); \
         INSERT INTO items SELECT generate_series(1, {ROWS})"
    );
    psql(&address(&primary(&nodes)), &sql).expect("write rows");
    let upgrade = start_upgrade(&mut d.client, "pg", V2).await;
    // Mid-upgrade: the second node's step has begun (the first node is
    // done), more to go.
    wait_until(Duration::from_secs(60), "the second upgrade step", || {
        let mut client = d.client.clone();
        let request = v1::GetOperationRequest {
            cluster: "pg".into(),
            id: upgrade.id.clone(),
        };
        async move {
            let op = client.operations().get_operation(request).await;
            let progress = op.ok().and_then(|op| op.into_inner().progress);
            progress.is_some_and(|p| p.step >= 2 && p.step_name.starts_with("upgrade"))
        }
    })
    .await;
    d.provider.restart().await;

    let done = d.succeeds(upgrade).await;
    assert_eq!(done.runs.len(), 1, "one run, one epoch: {:#?}", done.runs);
    let retries = provider_retries(&d.replicas).await;
    assert!(retries > 0.0, "the upgrade went on without asking again");
    eprintln!(
        "lost provider (PostgreSQL): upgrade succeeded after {retries} provider calls asked again"
    );

    let nodes = d.nodes().await;
    assert!(
        nodes.iter().all(|n| n.version == V2 && n.ready),
        "{nodes:#?}"
    );
    assert_eq!(writable(&nodes), vec![primary(&nodes).id]);
    rows_everywhere(&nodes, ROWS).await;
    stale_epochs_are_still_refused(&mut d, done.runs[0].epoch).await;
}

/// The restarted provider still knows the newest epoch it saw before the
/// kill: a call under an older one is refused, and changes nothing.
async fn stale_epochs_are_still_refused(d: &mut PgDeployment, epoch: i64) {
    use drover_proto::provider::v1 as pb;
    let uid = d.client.get_cluster("pg").await.expect("get").uid;
    let mut provider = pb::provider_client::ProviderClient::connect(d.provider.endpoint())
        .await
        .expect("connect to the provider");
    let stale = pb::PowerRequest {
        node_ids: Vec::new(),
        token: Some(pb::FencingToken {
            cluster_uid: uid,
            epoch: epoch - 1,
            operation_id: "stale".into(),
        }),
    };
    let refused = provider.stop_nodes(stale).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    let nodes = d.nodes().await;
    assert!(nodes.iter().all(|n| n.ready), "{nodes:#?}");
}

/// Provider calls the replicas sent again, by their metrics.
async fn provider_retries(replicas: &[ReplicaProcess]) -> f64 {
    let mut total = 0.0;
    for replica in replicas {
        let metrics = scrape::metrics(&replica.admin_endpoint()).await;
        total += metrics
            .iter()
            .filter(|(series, _)| series.starts_with("drover_provider_request_retries_total"))
            .map(|(_, value)| value)
            .sum::<f64>();
    }
    total
}

async fn create(d: &mut PgDeployment) -> Vec<v1::Node> {
    let request = v1::CreateClusterRequest {
        name: "pg".into(),
        spec: Some(v1::ClusterSpec {
            version: V1.into(),
            control_nodes: 1,
            worker_nodes: 2,
            node_offering: "small".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = d
        .client
        .clusters()
        .create_cluster(request)
        .await
        .expect("create");
    d.succeeds(created.into_inner().operation.expect("a start"))
        .await;
    let nodes = d.nodes().await;
    assert_eq!(nodes.len(), 3, "{nodes:#?}");
    assert!(
        nodes.iter().all(|n| n.ready && !address(n).is_empty()),
        "{nodes:#?}"
    );
    nodes
}

async fn scale_to_three_standbys(d: &mut PgDeployment, before: &[v1::Node]) -> Vec<v1::Node> {
    let request = v1::ScaleClusterRequest {
        name: "pg".into(),
        worker_nodes: Some(3),
        ..Default::default()
    };
    let op = d
        .client
        .clusters()
        .scale_cluster(request)
        .await
        .expect("scale");
    d.succeeds(op.into_inner()).await;
    let nodes = d.nodes().await;
    assert_eq!(nodes.len(), 4, "{nodes:#?}");
    let new: Vec<_> = nodes
        .iter()
        .filter(|n| !before.iter().any(|b| b.id == n.id))
        .collect();
    assert_eq!(new.len(), 1, "{nodes:#?}");
    rows_everywhere(&nodes, ROWS).await;
    nodes
}

/// The upgrade rolls node by node, standbys first, then switches the
/// primary over; a sampler checks every 100 ms that at most one node
/// accepts writes.
async fn rolling_upgrade(d: &mut PgDeployment, before: &[v1::Node]) -> Vec<v1::Node> {
    let old_primary = primary(before).id;
    let sampler = WritableSampler::start(before);
    let op = start_upgrade(&mut d.client, "pg", V2).await;
    d.succeeds(op).await;
    let (most, _) = sampler.finish().await;
    assert!(most.len() <= 1, "two writable primaries at once: {most:?}");

    let nodes = d.nodes().await;
    assert!(
        nodes.iter().all(|n| n.version == V2 && n.ready),
        "{nodes:#?}"
    );
    let new_primary = primary(&nodes);
    assert_ne!(new_primary.id, old_primary, "the primary switched over");
    assert_eq!(writable(&nodes), vec![new_primary.id.clone()]);
    rows_everywhere(&nodes, ROWS).await;
    nodes
}

async fn kill_a_standby_and_recover(d: &mut PgDeployment, nodes: &[v1::Node]) {
    let standby = nodes
        .iter()
        .find(|n| n.role == "worker")
        .expect("a standby");
    kill_postmaster(standby);
    // The scanner sees it unhealthy.
    wait_for_state(
        &d.client,
        "pg",
        v1::ClusterState::Alert,
        Duration::from_secs(60),
    )
    .await;
    let request = v1::RecoverClusterRequest {
        name: "pg".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = d
        .client
        .clusters()
        .recover_cluster(request)
        .await
        .expect("recover");
    d.succeeds(op.into_inner()).await;
    wait_for_state(
        &d.client,
        "pg",
        v1::ClusterState::Running,
        Duration::from_secs(30),
    )
    .await;
    let after = d.nodes().await;
    assert!(after.iter().all(|n| n.ready), "{after:#?}");
    rows_everywhere(&after, ROWS).await;
}

/// A backup task writes a base backup into a `file:` location; a copy of
/// it, started as a database of its own, has the rows.
async fn backup_and_restore(d: &mut PgDeployment) {
    let location = d.provider.root().join("backups");
    let task = v1::TaskSpec {
        r#type: v1::TaskType::Backup as i32,
        name: "now".into(),
        schedule: Some(v1::TaskSchedule {
            start_date: "now".into(),
            ..Default::default()
        }),
        properties: Some(v1::task_spec::Properties::Backup(v1::BackupProperties {
            location: vec![format!("file:{}", location.display())],
            ..Default::default()
        })),
    };
    let request = v1::PutTaskRequest {
        cluster: "pg".into(),
        task: Some(task),
    };
    d.client
        .tasks()
        .put_task(request)
        .await
        .expect("put the backup task");
    let run = wait_for_backup(d).await;
    let uid = d.client.get_cluster("pg").await.unwrap().uid;
    let backup = location.join(uid).join(&run.id);
    let report = run.report.unwrap_or_default();
    assert!(report.contains(&backup.display().to_string()), "{report}");
    assert_eq!(restored_rows(d, &backup).await, ROWS.to_string());
}

async fn wait_for_backup(d: &mut PgDeployment) -> v1::TaskRun {
    let done = v1::TaskRunStatus::Done as i32;
    let last = Arc::new(Mutex::new(None));
    wait_until(OPERATION, "the backup run to be DONE", || {
        let mut client = d.client.clone();
        let last = last.clone();
        let request = v1::GetTaskRequest {
            cluster: "pg".into(),
            r#type: v1::TaskType::Backup as i32,
            name: "now".into(),
        };
        async move {
            let task = client.tasks().get_task(request).await.ok();
            let run = task.and_then(|t| t.into_inner().status?.last_run);
            let ended = run.as_ref().is_some_and(|r| r.status == done);
            *last.lock().unwrap() = run;
            ended
        }
    })
    .await;
    let run = last.lock().unwrap().take();
    run.expect("a run")
}

/// Starts PostgreSQL on a copy of `backup` and counts its rows.
async fn restored_rows(d: &PgDeployment, backup: &std::path::Path) -> String {
    use drover_postgres_provider::pg::{NodeConf, Pg};
    let scratch = d.provider.root().join("restored");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(backup)
        .arg(&scratch)
        .status()
        .unwrap();
    assert!(copied.success());
    let chowned = std::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&scratch)
        .status()
        .unwrap();
    assert!(chowned.success());
    let pg = Pg::new("postgres").expect("the postgres user");
    let port = drover_tests::free_port();
    let conf = NodeConf {
        port,
        shared_buffers: "8MB",
        max_connections: 30,
        follow: None,
        application_name: "restored",
        fsync: false,
    };
    pg.write_conf(&scratch, &conf).expect("configure the copy");
    let log = d.provider.root().join("restored.log");
    pg.start(BIN.as_ref(), &scratch, &log)
        .await
        .expect("start the copy");
    let rows = psql(&format!("127.0.0.1:{port}"), "SELECT count(*) FROM items");
    pg.stop(BIN.as_ref(), &scratch)
        .await
        .expect("stop the copy");
    rows.unwrap_or_else(|e| e)
}

/// Destroy leaves nothing: no process, no data directory, every port free.
async fn destroy(d: &mut PgDeployment, nodes: &[v1::Node]) {
    let request = v1::DeleteClusterRequest {
        name: "pg".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let op = d
        .client
        .clusters()
        .delete_cluster(request)
        .await
        .expect("delete");
    d.succeeds(op.into_inner()).await;
    let left = d.provider.postgres_pids();
    assert!(left.is_empty(), "postgres processes left: {left:?}");
    for node in nodes {
        assert!(!data_dir(node).exists(), "{} left its data", node.id);
        let addr = address(node);
        assert!(
            std::net::TcpListener::bind(&addr).is_ok(),
            "{addr} still taken"
        );
    }
}
