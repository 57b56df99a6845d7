//! CreateCluster, GetCluster and ListClusters end to end: a real etcd, a real
//! `drover serve` process, a gRPC client, and etcdctl for what operators see.

use drover_client::v1;
use drover_tests::etcd::EtcdProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::wait_until;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::Code;

fn spec() -> v1::ClusterSpec {
    v1::ClusterSpec {
        version: "1.29.4".into(),
        control_nodes: 1,
        worker_nodes: 3,
        node_offering: "medium".into(),
        ..Default::default()
    }
}

fn create(name: &str) -> v1::CreateClusterRequest {
    v1::CreateClusterRequest {
        name: name.into(),
        spec: Some(spec()),
        create_only: true,
        request_id: String::new(),
    }
}

/// `etcdctl get --prefix` as key -> value.
fn etcdctl_get_prefix(etcd: &EtcdProcess, prefix: &str) -> BTreeMap<String, String> {
    let output = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.endpoint(), "get", "--prefix", prefix])
        .output()
        .expect("etcdctl must be installed (apt-get install etcd-client)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("etcdctl prints text");
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|pair| (pair[0].to_string(), pair.get(1).unwrap_or(&"").to_string()))
        .collect()
}

fn status_code(error: drover_client::ClientError) -> tonic::Status {
    match error {
        drover_client::ClientError::Status(status) => status,
        other => panic!("expected a gRPC status, got {other}"),
    }
}

#[tokio::test]
async fn created_cluster_is_readable_with_etcdctl() {
    let etcd = EtcdProcess::start().await;
    let replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let mut client = replica.client().await;
    let mut request = create("web");
    request
        .spec
        .as_mut()
        .unwrap()
        .labels
        .insert("team".into(), "payments".into());
    let created = client
        .create_cluster(request)
        .await
        .unwrap()
        .cluster
        .unwrap();
    assert_eq!(created.name, "web");
    assert!(
        uuid::Uuid::parse_str(&created.uid).is_ok(),
        "{}",
        created.uid
    );
    assert_eq!(created.generation, 1);

    let keys = etcdctl_get_prefix(&etcd, "/drover/v1/");
    let state: Value =
        serde_json::from_str(&keys["/drover/v1/clusters/web/state"]).expect("state is JSON");
    assert_eq!(state["state"], "Created");
    assert_eq!(state["uid"], created.uid.as_str());
    assert_eq!(state["operation"], Value::Null);
    assert_eq!(state["schema"], 1);
    let spec: Value =
        serde_json::from_str(&keys["/drover/v1/clusters/web/spec"]).expect("spec is JSON");
    assert_eq!(spec["spec"]["worker_nodes"], 3);
    assert_eq!(spec["spec"]["labels"]["team"], "payments");
    assert_eq!(spec["generation"], 1);

    let fetched = client.get_cluster("web").await.unwrap();
    assert_eq!(fetched.uid, created.uid);
    assert_eq!(fetched.spec, created.spec);
    let status = fetched.status.unwrap();
    assert_eq!(status.state, Some(v1::ClusterState::Created as i32));
    assert_eq!(
        status.current_version, None,
        "nothing observed yet: no spec defaults in status"
    );
    assert_eq!(status.current_operation, None);
}

#[tokio::test]
async fn bad_input_names_the_field_and_writes_nothing() {
    let etcd = EtcdProcess::start().await;
    let replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let mut client = replica.client().await;
    let with_spec = |edit: fn(&mut v1::ClusterSpec)| {
        let mut request = create("ok-name");
        edit(request.spec.as_mut().unwrap());
        request
    };
    let cases = vec![
        (create("Bad_Name"), "name"),
        (create(""), "name"),
        (create(&"a".repeat(64)), "name"),
        (
            v1::CreateClusterRequest {
                spec: None,
                ..create("ok-name")
            },
            "spec",
        ),
        (with_spec(|s| s.version = "latest".into()), "spec.version"),
        (with_spec(|s| s.control_nodes = 0), "spec.control_nodes"),
        (with_spec(|s| s.worker_nodes = 100_000), "spec.worker_nodes"),
        (
            with_spec(|s| s.node_offering = String::new()),
            "spec.node_offering",
        ),
        (
            with_spec(|s| {
                s.labels.insert("k".into(), "spaces are bad".into());
            }),
            "spec.labels[\"k\"]",
        ),
        (
            with_spec(|s| {
                s.autoscaling = Some(v1::Autoscaling {
                    enabled: true,
                    min: 9,
                    max: 1,
                });
            }),
            "spec.autoscaling",
        ),
        (
            v1::CreateClusterRequest {
                request_id: "x".repeat(200),
                ..create("ok-name")
            },
            "request_id",
        ),
    ];
    for (request, field) in cases {
        let status = status_code(client.create_cluster(request).await.unwrap_err());
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "the message names {field}: {:?}",
            status.message()
        );
    }
    assert!(
        etcdctl_get_prefix(&etcd, "/drover/").is_empty(),
        "nothing was written"
    );
}

#[tokio::test]
async fn names_are_unique_uids_are_new_and_retries_are_idempotent() {
    let etcd = EtcdProcess::start().await;
    let replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let mut client = replica.client().await;
    let first = client
        .create_cluster(create("db"))
        .await
        .unwrap()
        .cluster
        .unwrap();
    let status = status_code(client.create_cluster(create("db")).await.unwrap_err());
    assert_eq!(status.code(), Code::AlreadyExists);
    assert!(status.message().contains("\"db\""), "{}", status.message());
    assert_eq!(
        client.get_cluster("db").await.unwrap().uid,
        first.uid,
        "the refused create changed nothing"
    );

    let other = client
        .create_cluster(create("db2"))
        .await
        .unwrap()
        .cluster
        .unwrap();
    assert_ne!(other.uid, first.uid);

    let keyed = v1::CreateClusterRequest {
        request_id: "req-1".into(),
        ..create("keyed")
    };
    let once = client
        .create_cluster(keyed.clone())
        .await
        .unwrap()
        .cluster
        .unwrap();
    let twice = client.create_cluster(keyed).await.unwrap().cluster.unwrap();
    assert_eq!(
        once.uid, twice.uid,
        "a retried request_id returns the first result"
    );
}

#[tokio::test]
async fn get_and_list_page_through_clusters_in_key_order() {
    // Linearizable reads throughout; the watch cache is checked at the end.
    let etcd = EtcdProcess::start().await;
    let replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let mut client = replica.client().await;
    let names = ["foo", "foobar", "foo-bar", "a", "zz", "foo0", "m"];
    for name in names {
        let mut request = create(name);
        if name.starts_with("foo") {
            request
                .spec
                .as_mut()
                .unwrap()
                .labels
                .insert("family".into(), "foo".into());
        }
        client.create_cluster(request).await.unwrap();
    }
    let status = status_code(client.get_cluster("absent").await.unwrap_err());
    assert_eq!(status.code(), Code::NotFound);

    let mut seen = Vec::new();
    let mut page_token = String::new();
    let mut pages = 0;
    loop {
        let page = client
            .list_clusters(v1::ListClustersRequest {
                linearizable: true,
                page_size: 3,
                page_token,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.clusters.len() <= 3);
        seen.extend(page.clusters.into_iter().map(|c| c.name));
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    // Key order: a name sorts as if followed by '/', so "foo-bar" < "foo".
    let mut expected: Vec<&str> = names.to_vec();
    expected.sort_by_key(|name| format!("{name}/"));
    assert_eq!(seen, expected);
    assert_eq!(pages, 3);

    let foo_family = client
        .list_clusters(v1::ListClustersRequest {
            linearizable: true,
            label_selector: "family=foo".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let family: Vec<String> = foo_family.clusters.into_iter().map(|c| c.name).collect();
    assert_eq!(family, ["foo-bar", "foo", "foo0", "foobar"]);

    let created = client
        .list_clusters(v1::ListClustersRequest {
            linearizable: true,
            state: v1::ClusterState::Created as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(created.clusters.len(), names.len());
    let running = client
        .list_clusters(v1::ListClustersRequest {
            linearizable: true,
            state: v1::ClusterState::Running as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(running.clusters.is_empty());

    for (request, field) in [
        (
            v1::ListClustersRequest {
                linearizable: true,
                page_size: 5000,
                ..Default::default()
            },
            "page_size",
        ),
        (
            v1::ListClustersRequest {
                linearizable: true,
                page_token: "??".into(),
                ..Default::default()
            },
            "page_token",
        ),
        (
            v1::ListClustersRequest {
                linearizable: true,
                state: 99,
                ..Default::default()
            },
            "state",
        ),
        (
            v1::ListClustersRequest {
                linearizable: true,
                label_selector: "novalue".into(),
                ..Default::default()
            },
            "label_selector",
        ),
    ] {
        let status = status_code(client.list_clusters(request).await.unwrap_err());
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }

    // The watch cache serves the same answers once it has caught up.
    let linearizable = client
        .list_clusters(v1::ListClustersRequest {
            linearizable: true,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the watch cache to catch up",
        || {
            let mut client = client.clone();
            let expected = linearizable.clone();
            async move {
                client
                    .list_clusters(v1::ListClustersRequest::default())
                    .await
                    .unwrap()
                    == expected
            }
        },
    )
    .await;
    let cached = client
        .clusters()
        .get_cluster(v1::GetClusterRequest {
            name: "foo".into(),
            linearizable: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cached, client.get_cluster("foo").await.unwrap());
    let missing = client
        .clusters()
        .get_cluster(v1::GetClusterRequest {
            name: "absent".into(),
            linearizable: false,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

/// A list carries the store revision it was read at, so a client can watch
/// from just after it without missing a change, however long ago the
/// clusters themselves last changed: their own revisions may be compacted
/// away, and watching from them then fails for ever with OUT_OF_RANGE.
#[tokio::test]
async fn a_watch_from_a_listing_survives_compaction() {
    use drover_server::store::Store;
    let etcd = EtcdProcess::start().await;
    let replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let mut client = replica.client().await;
    let created = client.create_cluster(create("quiet")).await.unwrap();
    let old = created.cluster.unwrap().revision;
    // Other writes, then etcd's history compacted up to now.
    client.create_cluster(create("busy")).await.unwrap();
    let store = etcd.store().await;
    let now = store.get("/unrelated").await.unwrap().revision;
    store.compact(now).await.unwrap();

    let listed = client
        .list_clusters(v1::ListClustersRequest::default())
        .await
        .unwrap();
    assert!(listed.revision >= now, "{listed:?}");
    let from_cluster = v1::WatchClustersRequest {
        from_revision: old,
        name: "quiet".into(),
    };
    let mut stale = client
        .clusters()
        .watch_clusters(from_cluster)
        .await
        .unwrap()
        .into_inner();
    let refused = stale.message().await.unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");

    let from_list = v1::WatchClustersRequest {
        from_revision: listed.revision + 1,
        name: "quiet".into(),
    };
    let mut events = client
        .clusters()
        .watch_clusters(from_list)
        .await
        .unwrap()
        .into_inner();
    let update = v1::UpdateClusterRequest {
        name: "quiet".into(),
        labels: [("tier".to_string(), "gold".to_string())].into(),
        update_labels: true,
        ..Default::default()
    };
    client.clusters().update_cluster(update).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("an event")
        .unwrap()
        .expect("the update");
    assert_eq!(event.cluster.unwrap().spec.unwrap().labels["tier"], "gold");
}

/// A read from the watch cache (`linearizable: false`, as the Python client
/// and the console read) right after a create or an update answered by the
/// same replica shows that write: the answer waits until the replica's cache
/// has applied it. Repeated: the race it guards against does not lose every
/// time (the watch usually delivers first).
#[tokio::test]
async fn a_cached_read_right_after_a_write_on_the_same_replica_sees_it() {
    let etcd = EtcdProcess::start().await;
    let replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let mut client = replica.client().await;
    let cached = |name: &str| v1::GetClusterRequest {
        name: name.into(),
        linearizable: false,
    };
    for i in 0..100 {
        let name = format!("ryw-{i}");
        let created = client.create_cluster(create(&name)).await.unwrap();
        let read = client.clusters().get_cluster(cached(&name)).await;
        let read = read.unwrap_or_else(|e| panic!("{name} read right after its create: {e}"));
        assert_eq!(read.into_inner().uid, created.cluster.unwrap().uid);
        let update = v1::UpdateClusterRequest {
            name: name.clone(),
            labels: [("round".to_string(), i.to_string())].into(),
            update_labels: true,
            ..Default::default()
        };
        client.clusters().update_cluster(update).await.unwrap();
        let read = client.clusters().get_cluster(cached(&name)).await.unwrap();
        let labels = read.into_inner().spec.unwrap().labels;
        assert_eq!(
            labels.get("round"),
            Some(&i.to_string()),
            "{name} after its update"
        );
    }
}
