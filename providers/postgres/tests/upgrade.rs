//! Rolling upgrade with a switchover, and a killed primary replaced by
//! repair, on real PostgreSQL (two version labels on the same binaries).

mod common;

use common::*;
use drover_proto::provider::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_switches_over_and_a_killed_primary_is_replaced() {
    let mut env = Env::new("upgrade").await;
    let uid = "c-up";
    let nodes = create(&mut env, uid, 1, 2).await;
    write_rows(&nodes, 50).await;
    let first_primary = primary(&nodes).id.clone();

    // Standbys first, then the primary, as the capabilities ask.
    let caps = env
        .client
        .get_capabilities(pb::GetCapabilitiesRequest {})
        .await
        .unwrap();
    assert_eq!(
        caps.get_ref().upgrade_order,
        pb::UpgradeOrder::WorkersFirst as i32
    );
    let mut order: Vec<String> = nodes
        .iter()
        .filter(|n| n.role == "worker")
        .map(|n| n.id.clone())
        .collect();
    order.push(first_primary.clone());
    let mut nodes = nodes;
    for id in &order {
        let request = pb::UpgradeNodeRequest {
            token: token(uid, 1),
            node_id: id.clone(),
            version: V2.into(),
        };
        nodes = env
            .client
            .upgrade_node(request.clone())
            .await
            .unwrap()
            .into_inner()
            .nodes;
        assert!(all_healthy(&nodes), "after upgrading {id}: {nodes:#?}");
        primary(&nodes);
        assert_eq!(nodes.iter().find(|n| &n.id == id).unwrap().version, V2);
        // Already at the target: nothing changes.
        let again = env
            .client
            .upgrade_node(request)
            .await
            .unwrap()
            .into_inner()
            .nodes;
        assert_eq!(primary(&again).id, primary(&nodes).id);
    }
    assert!(nodes.iter().all(|n| n.version == V2), "{nodes:#?}");
    let new_primary = primary(&nodes).clone();
    assert_ne!(new_primary.id, first_primary, "the primary switched over");
    for node in &nodes {
        assert_eq!(count_rows(node), "50", "rows on {}", node.id);
    }
    // The old primary follows the new one.
    psql(
        &address(&new_primary),
        "INSERT INTO items VALUES (51, 'after')",
    )
    .unwrap();
    let old = nodes
        .iter()
        .find(|n| n.id == first_primary)
        .unwrap()
        .clone();
    eventually(
        std::time::Duration::from_secs(20),
        "the old primary follows",
        || (count_rows(&old) == "51").then_some(()),
    )
    .await;
    assert!(
        psql(&address(&old), "INSERT INTO items VALUES (52, 'x')").is_err(),
        "old primary writable"
    );

    // A killed primary: repair promotes a standby, the rows stay.
    kill9(&new_primary);
    describe_until(&mut env, uid, "the cluster unhealthy", |ns| {
        !all_healthy(ns)
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
    let nodes = repaired.into_inner().nodes;
    assert!(all_healthy(&nodes), "{nodes:#?}");
    let promoted = primary(&nodes);
    assert_ne!(promoted.id, new_primary.id, "a standby was promoted");
    for node in &nodes {
        assert_eq!(count_rows(node), "51", "rows on {}", node.id);
    }
    // Repair of a healthy cluster changes nothing.
    let again = env
        .client
        .repair_nodes(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(uid, 1),
        })
        .await
        .unwrap();
    assert_eq!(primary(&again.get_ref().nodes).id, promoted.id);
    assert!(all_healthy(&again.get_ref().nodes));
}

async fn upgrade(env: &mut Env, uid: &str, id: &str) -> Vec<pb::ProviderNode> {
    let request = pb::UpgradeNodeRequest {
        token: token(uid, 1),
        node_id: id.into(),
        version: V2.into(),
    };
    let nodes = env.client.upgrade_node(request).await.unwrap();
    nodes.into_inner().nodes
}

async fn resize(env: &mut Env, uid: &str, workers: u32) -> Vec<pb::ProviderNode> {
    let request = pb::ResizeNodesRequest {
        token: token(uid, 1),
        worker_nodes: Some(workers),
        offering: None,
    };
    let nodes = env.client.resize_nodes(request).await.unwrap();
    nodes.into_inner().nodes
}

/// The one node of `after` that `before` did not have.
fn added(before: &[pb::ProviderNode], after: &[pb::ProviderNode]) -> pb::ProviderNode {
    let new: Vec<_> = after
        .iter()
        .filter(|n| before.iter().all(|b| b.id != n.id))
        .collect();
    assert_eq!(new.len(), 1, "one node added: {after:#?}");
    new[0].clone()
}

/// A standby added after every node was upgraded (ResizeNodes, as Drover's
/// remediation adds back a missing worker), also after a provider restart,
/// and a standby rebuilt by RepairNodes (its data directory gone), join at
/// the version the cluster runs now, not the one it was created at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_added_or_rebuilt_after_an_upgrade_joins_at_the_upgraded_version() {
    let mut env = Env::new("upgrade-join").await;
    let uid = "c-join";
    let nodes = create(&mut env, uid, 1, 1).await;
    assert!(nodes.iter().all(|n| n.version == V1), "{nodes:#?}");
    write_rows(&nodes, 20).await;
    // Standbys first, then the primary (it switches over).
    let mut order: Vec<String> = nodes
        .iter()
        .filter(|n| n.role == "worker")
        .map(|n| n.id.clone())
        .collect();
    order.push(primary(&nodes).id.clone());
    let mut nodes = nodes;
    for id in &order {
        nodes = upgrade(&mut env, uid, id).await;
    }
    assert!(all_healthy(&nodes), "{nodes:#?}");
    assert!(nodes.iter().all(|n| n.version == V2), "{nodes:#?}");

    // ResizeNodes +1: the new standby runs the upgraded version.
    let grown = resize(&mut env, uid, 2).await;
    assert!(all_healthy(&grown), "{grown:#?}");
    let new = added(&nodes, &grown);
    assert_eq!(new.role, "worker", "{grown:#?}");
    assert_eq!(new.version, V2, "the answer to ResizeNodes: {grown:#?}");
    let described = describe(&mut env, uid).await;
    let seen = described.iter().find(|n| n.id == new.id).unwrap();
    assert_eq!(seen.version, V2, "DescribeCluster: {described:#?}");
    assert_eq!(count_rows(&new), "20");

    // So too after the provider restarts on its state.
    env.restart().await;
    let again = resize(&mut env, uid, 3).await;
    assert!(all_healthy(&again), "{again:#?}");
    let newer = added(&grown, &again);
    assert_eq!(newer.version, V2, "after a restart: {again:#?}");
    let described = describe(&mut env, uid).await;
    assert!(
        described.iter().all(|n| n.version == V2),
        "DescribeCluster after a restart: {described:#?}"
    );

    // RepairNodes rebuilds a standby whose data directory is gone at the
    // upgraded version.
    let dir = newer.facts["data_dir"].clone();
    kill9(&newer);
    std::fs::remove_dir_all(&dir).unwrap();
    describe_until(&mut env, uid, "the standby down", |ns| {
        ns.iter()
            .any(|n| n.id == newer.id && n.power_state == "off")
    })
    .await;
    let repaired = env
        .client
        .repair_nodes(pb::PowerRequest {
            node_ids: vec![newer.id.clone()],
            token: token(uid, 1),
        })
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert!(all_healthy(&repaired), "{repaired:#?}");
    let rebuilt = repaired.iter().find(|n| n.id == newer.id).unwrap();
    assert_eq!(rebuilt.version, V2, "{repaired:#?}");
    assert!(std::path::Path::new(&dir).join("PG_VERSION").exists());
    assert_eq!(count_rows(rebuilt), "20");
    let described = describe(&mut env, uid).await;
    assert!(
        described.iter().all(|n| n.version == V2),
        "DescribeCluster after the repair: {described:#?}"
    );
}
