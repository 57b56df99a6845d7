//! Draining and stopping on real PostgreSQL: a call of an older epoch in
//! flight when a newer epoch arrives either ends before the newer epoch's
//! call answers (which then shows its effect) or answers ABORTED having
//! applied nothing; StopTask stops a running backup.

mod common;

use common::*;
use drover_proto::provider::v1 as pb;
use drover_proto::v1 as api;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::Code;

/// What a call answered and when its answer came.
type Answer<T> = (Result<tonic::Response<T>, tonic::Status>, Instant);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_call_in_flight_ends_before_the_newer_epoch_answers_or_applies_nothing() {
    let mut env = Env::new("drain").await;
    let uid = "c-drain";
    let nodes = create(&mut env, uid, 1, 2).await;
    assert!(all_healthy(&nodes), "{nodes:#?}");
    let dir = |id: &str| {
        let node = nodes.iter().find(|n| n.id == id).expect("node");
        node.facts["data_dir"].clone()
    };
    let (pg0, pg1) = (dir("pg-0"), dir("pg-1"));
    // StopNodes stops pg-0, pg-1, pg-2 in turn; a paused pg-1 holds it
    // inside its second step, after its first effect.
    let paused = Paused::postmaster(&pg1);
    let started = Instant::now();
    let mut client = env.client.clone();
    let older = tokio::spawn(async move {
        let stop = pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(uid, 1),
        };
        let answer = client.stop_nodes(stop).await;
        (answer, Instant::now())
    });
    eventually(
        Duration::from_secs(30),
        "pg-0 off and pg-1 stopping",
        || {
            let pg0_off = postgres_pids(Path::new(&pg0)).is_empty();
            let pg1_stopping = !pids_with(&["pg_ctl", "stop", &pg1]).is_empty();
            (pg0_off && pg1_stopping).then_some(())
        },
    )
    .await;
    let mut client = env.client.clone();
    let newer = tokio::spawn(async move {
        let fence = pb::DescribeClusterRequest {
            cluster_uid: uid.into(),
            token: token(uid, 2),
        };
        let answer = client.describe_cluster(fence).await;
        (answer, Instant::now())
    });
    wait_until_stale(&mut env, uid, 1).await;
    drop(paused);
    let (older, older_at) = older.await.unwrap();
    let (newer, newer_at): Answer<pb::NodesResponse> = newer.await.unwrap();
    let newer = newer
        .expect("the fenced describe under epoch 2")
        .into_inner();
    let after = describe(&mut env, uid).await;
    let times = format!(
        "older answered at {} ms, newer at {} ms",
        older_at.duration_since(started).as_millis(),
        newer_at.duration_since(started).as_millis()
    );
    let cluster = env.root.join("clusters").join(uid);
    match older {
        Ok(_) => {
            // The newer epoch's answer shows every node the older call
            // stopped, pg-2 (its last step) too: it waited for the call to
            // end. (The instants each task took its answer at are printed,
            // not compared: both answers come over one connection, and the
            // two tasks may run in either order once it delivers them.)
            for nodes in [&newer.nodes, &after] {
                assert!(all_off(nodes), "{times}: {nodes:#?}");
            }
            eventually(Duration::from_secs(10), "no postgres process", || {
                postgres_pids(&cluster).is_empty().then_some(())
            })
            .await;
        }
        Err(status) => {
            assert_eq!(status.code(), Code::Aborted, "{status:?} ({times})");
            for nodes in [&newer.nodes, &after] {
                assert!(
                    all_healthy(nodes),
                    "ABORTED but applied: {times}: {nodes:#?}"
                );
            }
            for id in ["pg-0", "pg-1", "pg-2"] {
                assert!(!postgres_pids(Path::new(&dir(id))).is_empty(), "{id} down");
            }
        }
    }
}

fn all_off(nodes: &[pb::ProviderNode]) -> bool {
    !nodes.is_empty() && nodes.iter().all(|n| n.power_state == "off")
}

/// Polls until the provider refuses `epoch` as stale, i.e. it took a newer
/// one. The probe is a StopTask of an unknown run: it fences and touches
/// nothing.
async fn wait_until_stale(env: &mut Env, uid: &str, epoch: i64) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = pb::StopTaskRequest {
            token: token(uid, epoch),
            run_id: "no-such-run".into(),
        };
        let refused = env.client.stop_task(probe).await.unwrap_err();
        if refused.code() == Code::FailedPrecondition {
            return;
        }
        assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
        assert!(Instant::now() < until, "epoch {epoch} never became stale");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_task_stops_a_running_backup_and_leaves_no_partial_copy() {
    let mut env = Env::new("stoptask").await;
    let uid = "c-stoptask";
    let nodes = create(&mut env, uid, 1, 0).await;
    assert!(all_healthy(&nodes), "{nodes:#?}");
    let location = env.root.join("backups");
    let spec = api::TaskSpec {
        name: "nightly".into(),
        properties: Some(api::task_spec::Properties::Backup(api::BackupProperties {
            location: vec![format!("file:{}", location.display())],
            ..Default::default()
        })),
        ..Default::default()
    };
    let run = pb::RunTaskRequest {
        token: token(uid, 1),
        task_type: "backup".into(),
        task_name: "nightly".into(),
        run_id: "run-stopped".into(),
        spec: Some(spec),
    };
    // A paused primary serves no copy: the run stays in progress until it
    // is stopped (pg_basebackup gives up connecting after 5 s; the stop
    // comes well before).
    let paused = Paused::postmaster(&primary(&nodes).facts["data_dir"]);
    let mut client = env.client.clone();
    let request = run.clone();
    let running = tokio::spawn(async move { client.run_task(request).await });
    let copy = location.join(uid).join("run-stopped");
    let copy_arg = copy.display().to_string();
    eventually(Duration::from_secs(10), "pg_basebackup running", || {
        (!pids_with(&["pg_basebackup", &copy_arg]).is_empty()).then_some(())
    })
    .await;
    let stop = pb::StopTaskRequest {
        token: token(uid, 1),
        run_id: run.run_id.clone(),
    };
    env.client.stop_task(stop).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("RunTask answers once stopped")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(outcome.status, "STOPPED", "{outcome:?}");
    eventually(Duration::from_secs(10), "pg_basebackup gone", || {
        pids_with(&["pg_basebackup", &copy_arg])
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(!copy.exists(), "a stopped backup left a partial copy");
    drop(paused);
    // The same run, asked again, is the same stopped run: not run anew.
    let again = env.client.run_task(run).await.unwrap().into_inner();
    assert_eq!(again, outcome);
    assert!(!copy.exists());
    describe_until(&mut env, uid, "the primary healthy", all_healthy).await;
}
