//! The PostgreSQL provider against real PostgreSQL: create, stop/start,
//! scale, a killed standby, backup and restore, repair task, delete.

mod common;

use common::*;
use drover_proto::provider::v1 as pb;
use drover_proto::v1 as api;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_its_rows_through_stop_start_scale_repair_and_backup_then_leaves_nothing() {
    let mut env = Env::new("lifecycle").await;
    let uid = "c-life";
    let nodes = create(&mut env, uid, 1, 2).await;
    assert_eq!(nodes.len(), 3, "{nodes:#?}");
    assert!(all_healthy(&nodes), "{nodes:#?}");
    primary(&nodes);
    write_rows(&nodes, 100).await;

    // Stop and start keep the data.
    let stopped = env
        .client
        .stop_nodes(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(uid, 1),
        })
        .await
        .unwrap();
    assert!(stopped
        .get_ref()
        .nodes
        .iter()
        .all(|n| n.power_state == "off"));
    assert!(
        psql(&address(primary(&nodes)), "SELECT 1").is_err(),
        "stopped primary answers"
    );
    let started = env
        .client
        .start_nodes(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(uid, 1),
        })
        .await
        .unwrap();
    let nodes = started.into_inner().nodes;
    assert!(all_healthy(&nodes), "{nodes:#?}");
    for node in &nodes {
        assert_eq!(
            count_rows(node),
            "100",
            "rows on {} after a restart",
            node.id
        );
    }

    // Scale to three standbys: the new one has the rows.
    let resize = pb::ResizeNodesRequest {
        token: token(uid, 1),
        worker_nodes: Some(3),
        offering: None,
    };
    let nodes = env
        .client
        .resize_nodes(resize)
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(nodes.len(), 4);
    assert!(all_healthy(&nodes), "{nodes:#?}");
    let new = nodes
        .iter()
        .find(|n| n.id == "pg-3")
        .expect("a new standby pg-3");
    assert_eq!(count_rows(new), "100");

    // A killed standby: unhealthy, then repaired.
    kill9(new);
    describe_until(&mut env, uid, "the killed standby unhealthy", |ns| {
        ns.iter().any(|n| n.id == "pg-3" && !n.healthy)
    })
    .await;
    let repaired = env
        .client
        .repair_nodes(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(uid, 1),
        })
        .await
        .unwrap();
    assert!(all_healthy(&repaired.get_ref().nodes), "{repaired:#?}");

    backup_and_restore(&mut env, uid, &nodes).await;
    repair_task(&mut env, uid).await;

    // Scale down: the removed standby's directory and slot go.
    let removed_dir = new.facts["data_dir"].clone();
    let resize = pb::ResizeNodesRequest {
        token: token(uid, 1),
        worker_nodes: Some(2),
        offering: Some("medium".into()),
    };
    let nodes = env
        .client
        .resize_nodes(resize)
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(nodes.len(), 3);
    assert!(all_healthy(&nodes), "{nodes:#?}");
    assert!(nodes.iter().all(|n| n.offering == "medium"));
    assert_eq!(
        psql(&address(primary(&nodes)), "SHOW max_connections").unwrap(),
        "40"
    );
    assert!(!std::path::Path::new(&removed_dir).exists());
    let slots = psql(
        &address(primary(&nodes)),
        "SELECT count(*) FROM pg_replication_slots",
    )
    .unwrap();
    assert_eq!(slots, "2");

    destroy_leaves_nothing(&mut env, uid, &nodes).await;
}

async fn backup_and_restore(env: &mut Env, uid: &str, nodes: &[pb::ProviderNode]) {
    let location = env.root.join("backups");
    let spec = api::TaskSpec {
        name: "nightly".into(),
        properties: Some(api::task_spec::Properties::Backup(api::BackupProperties {
            location: vec![format!("dc1:file:{}", location.display())],
            ..Default::default()
        })),
        ..Default::default()
    };
    let run = pb::RunTaskRequest {
        token: token(uid, 1),
        task_type: "backup".into(),
        task_name: "nightly".into(),
        run_id: "run-1".into(),
        spec: Some(spec),
    };
    let outcome = env.client.run_task(run.clone()).await.unwrap().into_inner();
    assert_eq!(outcome.status, "DONE", "{outcome:?}");
    let dir = location.join(uid).join("run-1");
    assert!(
        outcome.report.contains(&dir.display().to_string()),
        "{outcome:?}"
    );
    // Idempotent per run id: the same run, not a second one.
    let again = env.client.run_task(run).await.unwrap().into_inner();
    assert_eq!(again, outcome);

    // Restore: a copy of the backup starts and has the rows.
    let scratch = env.root.join("restore");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&dir)
        .arg(&scratch)
        .status()
        .unwrap();
    assert!(copied.success());
    let pg = drover_postgres_provider::pg::Pg::new("postgres").unwrap();
    chown_tree(&pg, &scratch);
    let port = free_port();
    let conf = drover_postgres_provider::pg::NodeConf {
        port,
        shared_buffers: "8MB",
        max_connections: 30,
        follow: None,
        application_name: "restore",
        fsync: false,
    };
    pg.write_conf(&scratch, &conf).unwrap();
    let log = env.root.join("logs").join("restore.log");
    pg.start(BIN.as_ref(), &scratch, &log).await.unwrap();
    let restored = psql(&format!("127.0.0.1:{port}"), "SELECT count(*) FROM items");
    pg.stop(BIN.as_ref(), &scratch).await.unwrap();
    assert_eq!(
        restored.unwrap(),
        "100",
        "rows in the restored backup of {}",
        nodes[0].id
    );
}

fn chown_tree(pg: &drover_postgres_provider::pg::Pg, dir: &std::path::Path) {
    pg.own(dir).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        match entry.file_type().unwrap().is_dir() {
            true => chown_tree(pg, &entry.path()),
            false => pg.own(&entry.path()).unwrap(),
        }
    }
}

async fn repair_task(env: &mut Env, uid: &str) {
    let run = pb::RunTaskRequest {
        token: token(uid, 1),
        task_type: "repair".into(),
        task_name: "weekly".into(),
        run_id: "run-2".into(),
        spec: None,
    };
    let outcome = env.client.run_task(run).await.unwrap().into_inner();
    assert_eq!(outcome.status, "DONE", "{outcome:?}");
    // The items table's primary key is one of the btree indexes checked.
    assert!(outcome.report.contains("no corruption"), "{outcome:?}");
    assert!(!outcome.report.contains(" 0 btree"), "{outcome:?}");
}

async fn destroy_leaves_nothing(env: &mut Env, uid: &str, nodes: &[pb::ProviderNode]) {
    let delete = pb::DeleteNodesRequest {
        token: token(uid, 1),
        node_ids: vec![],
    };
    let left = env
        .client
        .delete_nodes(delete.clone())
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert!(left.is_empty(), "{left:#?}");
    let clusters = env.root.join("clusters");
    eventually(Duration::from_secs(10), "no postgres process left", || {
        postgres_pids(&clusters).is_empty().then_some(())
    })
    .await;
    for node in nodes {
        assert!(
            !std::path::Path::new(&node.facts["data_dir"]).exists(),
            "{} dir left",
            node.id
        );
        let port: u16 = address(node).rsplit(':').next().unwrap().parse().unwrap();
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} still taken"
        );
    }
    // Deleting again converges on the same nothing.
    let again = env
        .client
        .delete_nodes(delete)
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert!(again.is_empty());
}
