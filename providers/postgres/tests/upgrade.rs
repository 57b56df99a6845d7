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
