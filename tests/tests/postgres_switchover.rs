//! The PostgreSQL provider killed at each step of a switchover and of a
//! repair, through Drover, on real PostgreSQL: a real etcd, a replica, the
//! provider process and its postgres processes. For every named step, the
//! provider aborts there in the middle of an upgrade's switchover (or a
//! Recover's promotion after a kill -9 of the primary), is started again
//! as a supervisor would, and Drover finishes the operation through it.
//! Meanwhile a sampler asks every node `pg_is_in_recovery()` every 100 ms:
//! never more than one node takes writes. Through the switchovers a writer
//! inserts rows through whichever node takes them, and every row a node
//! acknowledged is on the final primary; through the repairs, every killed
//! primary's data directory is kept, not deleted.

use drover_client::v1;
use drover_tests::postgres::{address, postmaster_pid, psql, version, writable, PgDeployment, V1};
use drover_tests::{start_upgrade, wait_for_state};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Every step a switchover names, in its order.
const STEPS: [&str; 7] = [
    "switchover.old_stopped",
    "switchover.caught_up",
    "switchover.intent",
    "switchover.signalled",
    "switchover.promoted",
    "switchover.recorded",
    "switchover.repointed",
];
/// Every step a repair's promotion names, in its order.
const REPAIR_STEPS: [&str; 5] = [
    "repair.intent",
    "repair.signalled",
    "repair.promoted",
    "repair.recorded",
    "repair.repointed",
];
const OPERATION: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_killed_at_each_step_of_a_switchover_leaves_one_primary_and_every_acknowledged_row(
) {
    // Bound by name, so etcd and the replica live to the test's end.
    let (
        PgDeployment {
            mut provider,
            mut client,
            replicas: _replicas,
            etcd: _etcd,
        },
        nodes,
    ) = deployment("pg-sw").await;
    let watch = Watch::start(&nodes, true);

    for (n, step) in (1..).zip(STEPS) {
        provider.restart_with_fault(Some(step)).await;
        let upgrade = start_upgrade(&mut client, "pg", &version(n)).await;
        provider.wait_for_exit(OPERATION).await;
        provider.restart().await;
        let done = client
            .wait_operation(&upgrade, OPERATION)
            .await
            .expect("wait");
        assert_eq!(
            done.state,
            v1::OperationState::Succeeded as i32,
            "killed at {step}: {done:#?}"
        );
        eprintln!(
            "killed at {step}: upgrade to {} succeeded; {} rows acknowledged so far",
            version(n),
            watch.acked.lock().unwrap().len()
        );
    }

    let (acked, most_writable) = watch.stop();
    assert!(
        most_writable <= 1,
        "{most_writable} nodes took writes at once"
    );
    assert!(!acked.is_empty(), "the writer wrote nothing");
    let nodes = nodes_of(&mut client).await;
    let primary = primary_of(&nodes);
    assert_eq!(writable(&nodes), vec![primary.id.clone()], "{nodes:#?}");
    let rows = psql(&address(primary), "SELECT id FROM acked").expect("read rows");
    let on_primary: BTreeSet<u64> = rows.lines().map(|l| l.parse().unwrap()).collect();
    let lost: Vec<&u64> = acked.iter().filter(|id| !on_primary.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "acknowledged rows not on the final primary: {lost:?}"
    );
    eprintln!(
        "{} acknowledged rows all on the final primary; at most {most_writable} writable node at once",
        acked.len()
    );
}

/// A primary killed (kill -9), then a Recover whose promotion the
/// provider dies in, at each of its steps: one node takes writes at any
/// time, every row written before the kill (and replicated) is on the
/// final primary, and each killed primary's data directory is kept aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_killed_at_each_step_of_a_repair_leaves_one_primary_and_keeps_the_old_one() {
    // Bound by name, so etcd and the replica live to the test's end.
    let (
        PgDeployment {
            mut provider,
            mut client,
            replicas: _replicas,
            etcd: _etcd,
        },
        nodes,
    ) = deployment("pg-rp").await;
    let watch = Watch::start(&nodes, false);

    for (n, step) in (1u64..).zip(REPAIR_STEPS) {
        let nodes = replicated_row(&mut client, n).await;
        let primary = primary_of(&nodes);
        provider.restart_with_fault(Some(step)).await;
        let pid = postmaster_pid(primary).expect("the primary's postmaster");
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
        assert!(killed.is_ok_and(|s| s.success()), "kill -9 {pid}");
        wait_for_state(&client, "pg", v1::ClusterState::Alert, OPERATION).await;
        let request = v1::RecoverClusterRequest {
            name: "pg".into(),
            request_id: String::new(),
            ..Default::default()
        };
        let recover = client
            .clusters()
            .recover_cluster(request)
            .await
            .expect("recover");
        provider.wait_for_exit(OPERATION).await;
        provider.restart().await;
        let done = client
            .wait_operation(&recover.into_inner(), OPERATION)
            .await
            .expect("wait");
        assert_eq!(
            done.state,
            v1::OperationState::Succeeded as i32,
            "killed at {step}: {done:#?}"
        );
        let after = nodes_of(&mut client).await;
        let old = after
            .iter()
            .find(|n| n.id == primary.id)
            .expect("the old primary");
        assert!(old.facts.contains_key("kept"), "killed at {step}: {old:#?}");
        eprintln!(
            "killed at {step}: Recover succeeded; {} kept {}",
            old.id, old.facts["kept"]
        );
    }

    let (_, most_writable) = watch.stop();
    assert!(
        most_writable <= 1,
        "{most_writable} nodes took writes at once"
    );
    let nodes = replicated_row(&mut client, 100).await;
    let primary = primary_of(&nodes);
    let rows = psql(&address(primary), "SELECT count(*) FROM acked").expect("read rows");
    assert_eq!(
        rows,
        (REPAIR_STEPS.len() + 1).to_string(),
        "rows on the final primary"
    );
}

/// Writes row `id` through the primary and waits until every node has
/// it; the nodes as Drover shows them.
async fn replicated_row(client: &mut drover_client::Client, id: u64) -> Vec<v1::Node> {
    let nodes = nodes_of(client).await;
    let primary = primary_of(&nodes);
    psql(
        &address(primary),
        &format!("INSERT INTO acked VALUES ({id})"),
    )
    .expect("insert");
    for node in &nodes {
        drover_tests::wait_until(Duration::from_secs(30), "the row on every node", || {
            let found = psql(
                &address(node),
                &format!("SELECT 1 FROM acked WHERE id = {id}"),
            );
            std::future::ready(found.as_deref() == Ok("1"))
        })
        .await;
    }
    nodes
}

fn addresses_of(nodes: &[v1::Node]) -> Vec<String> {
    nodes.iter().map(address).collect()
}

/// etcd, the provider, one replica `replica_id` and a cluster of a primary
/// and a standby with an empty `acked` table; returns the nodes too.
async fn deployment(replica_id: &str) -> (PgDeployment, Vec<v1::Node>) {
    let mut deployment = PgDeployment::start(&[replica_id]).await;
    let nodes = create(&mut deployment.client).await;
    let primary = primary_of(&nodes);
    psql(
        &address(primary),
        "CREATE TABLE acked (id bigint PRIMARY KEY)",
    )
    .expect("create table");
    (deployment, nodes)
}

async fn create(client: &mut drover_client::Client) -> Vec<v1::Node> {
    let request = v1::CreateClusterRequest {
        name: "pg".into(),
        spec: Some(v1::ClusterSpec {
            version: V1.into(),
            control_nodes: 1,
            worker_nodes: 1,
            node_offering: "small".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = client
        .clusters()
        .create_cluster(request)
        .await
        .expect("create");
    let op = created.into_inner().operation.expect("a start");
    let done = client.wait_operation(&op, OPERATION).await.expect("wait");
    assert_eq!(
        done.state,
        v1::OperationState::Succeeded as i32,
        "{done:#?}"
    );
    let nodes = nodes_of(client).await;
    assert_eq!(nodes.len(), 2, "{nodes:#?}");
    nodes
}

/// The cluster's nodes as Drover shows them.
async fn nodes_of(client: &mut drover_client::Client) -> Vec<v1::Node> {
    let cluster = client.get_cluster("pg").await.expect("get");
    cluster.status.unwrap_or_default().nodes
}

/// The node Drover shows as the primary (the control node).
fn primary_of(nodes: &[v1::Node]) -> &v1::Node {
    nodes
        .iter()
        .find(|n| n.role == "control")
        .expect("a primary")
}

/// A writer (when asked for) inserting ids through whichever node takes
/// them (every node is tried: a second writable node would take some),
/// and a sampler
/// counting the nodes that answer `pg_is_in_recovery() = f`, every 100 ms,
/// on threads of their own until [`Watch::stop`].
struct Watch {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeSet<u64>>>,
    most_writable: Arc<Mutex<usize>>,
    threads: Vec<JoinHandle<()>>,
}

impl Watch {
    fn start(nodes: &[v1::Node], with_writer: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let most_writable = Arc::new(Mutex::new(0));
        let addresses = addresses_of(nodes);
        let mut threads = Vec::new();
        if with_writer {
            let (stop, acked) = (stop.clone(), acked.clone());
            threads.push(std::thread::spawn(move || {
                write_rows(&addresses, &stop, &acked)
            }));
        }
        threads.push({
            let (stop, most) = (stop.clone(), most_writable.clone());
            let nodes = nodes.to_vec();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let now = writable(&nodes).len();
                    let mut most = most.lock().unwrap();
                    *most = (*most).max(now);
                    drop(most);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        });
        Self {
            stop,
            acked,
            most_writable,
            threads,
        }
    }

    /// Stops both threads; the acknowledged ids and the most nodes seen
    /// taking writes at once.
    fn stop(self) -> (BTreeSet<u64>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("a watch thread");
        }
        let acked = self.acked.lock().unwrap().clone();
        let most = *self.most_writable.lock().unwrap();
        (acked, most)
    }
}

fn write_rows(addresses: &[String], stop: &AtomicBool, acked: &Mutex<BTreeSet<u64>>) {
    let mut id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        let sql = format!("INSERT INTO acked VALUES ({id})");
        let mut took = false;
        for address in addresses {
            if psql(address, &sql).is_ok() {
                acked.lock().unwrap().insert(id);
                took = true;
            }
        }
        if !took {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
