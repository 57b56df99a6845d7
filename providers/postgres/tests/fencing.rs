//! Fencing that survives a provider restart, convergent create, and the
//! spec checks, on real PostgreSQL.

mod common;

use common::*;
use drover_proto::provider::v1 as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_tokens_are_refused_also_after_a_restart_and_a_repeated_create_converges() {
    let mut env = Env::new("fencing").await;
    let uid = "c-fence";
    let first = create(&mut env, uid, 5, 1).await;
    assert!(all_healthy(&first), "{first:#?}");
    let again = create(&mut env, uid, 5, 1).await;
    let ids = |ns: &[pb::ProviderNode]| {
        ns.iter()
            .map(|n| (n.id.clone(), address(n)))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&again),
        ids(&first),
        "a repeated create makes nothing new"
    );
    assert!(all_healthy(&again));

    let stale = pb::PowerRequest {
        node_ids: Vec::new(),
        token: token(uid, 4),
    };
    let refused = env.client.stop_nodes(stale.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("stale fencing token"),
        "{refused:?}"
    );

    env.restart().await;
    let refused = env.client.stop_nodes(stale).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    // The databases went on while the provider restarted, and it knows them.
    let nodes = describe(&mut env, uid).await;
    assert_eq!(ids(&nodes), ids(&first));
    assert!(all_healthy(&nodes), "{nodes:#?}");
    // A newer epoch is accepted; the one before it is stale from then on.
    let stop = env
        .client
        .stop_nodes(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(uid, 6),
        })
        .await
        .unwrap();
    assert!(stop.get_ref().nodes.iter().all(|n| n.power_state == "off"));
    let refused = env
        .client
        .start_nodes(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token(uid, 5),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);

    let unknown = env
        .client
        .start_nodes(pb::PowerRequest {
            node_ids: Vec::new(),
            token: token("c-none", 1),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let delete = pb::DeleteNodesRequest {
        token: token(uid, 6),
        node_ids: vec![],
    };
    assert!(env
        .client
        .delete_nodes(delete)
        .await
        .unwrap()
        .into_inner()
        .nodes
        .is_empty());
}

#[tokio::test]
async fn unsupported_shapes_are_refused_naming_the_field() {
    let mut env = Env::new("validate").await;
    let shape = |control, version: &str, offering: &str| pb::ValidateSpecRequest {
        cluster_uid: String::new(),
        shape: Some(pb::ClusterShape {
            control_nodes: control,
            worker_nodes: 2,
            offering: offering.into(),
            version: version.into(),
        }),
    };
    let fields = |r: pb::ValidateSpecResponse| {
        r.violations
            .into_iter()
            .map(|v| v.field)
            .collect::<Vec<_>>()
    };
    let ok = env
        .client
        .validate_spec(shape(1, V1, "small"))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.violations.is_empty(), "{ok:?}");
    let two = env
        .client
        .validate_spec(shape(2, V1, "small"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fields(two), ["control_nodes"]);
    let bad = env
        .client
        .validate_spec(shape(1, "14.0.0", "huge"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fields(bad), ["node_offering", "version"]);

    let create = pb::CreateNodesRequest {
        token: token("c-bad", 1),
        control_nodes: 2,
        worker_nodes: 1,
        offering: "small".into(),
        version: V1.into(),
    };
    let refused = env.client.create_nodes(create).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().starts_with("control_nodes"),
        "{refused:?}"
    );
    assert!(
        describe(&mut env, "c-bad").await.is_empty(),
        "nothing was made"
    );

    let caps = env
        .client
        .get_capabilities(pb::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.kind, "postgres");
    assert_eq!(caps.versions, [V1, V2]);
    assert_eq!((caps.min_control_nodes, caps.max_control_nodes), (1, 1));
}

#[tokio::test]
async fn a_call_past_its_apply_by_deadline_applies_nothing() {
    let mut env = Env::new("deadline").await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut request = tonic::Request::new(pb::CreateNodesRequest {
        token: token("c-late", 1),
        control_nodes: 1,
        worker_nodes: 0,
        offering: "small".into(),
        version: V1.into(),
    });
    let past = (now_ms - 1).to_string();
    request
        .metadata_mut()
        .insert("drover-apply-by", past.parse().unwrap());
    let late = env.client.create_nodes(request).await.unwrap_err();
    assert_eq!(late.code(), tonic::Code::DeadlineExceeded, "{late:?}");
    assert!(
        describe(&mut env, "c-late").await.is_empty(),
        "nothing was made"
    );
    assert!(postgres_pids(&env.root).is_empty());
}
