//! The replica process itself: configuration errors, health, reflection,
//! graceful exit, and the embedded mode.

use drover_client::v1;
use drover_tests::etcd::EtcdProcess;
use drover_tests::replica::{health, ReplicaProcess};
use drover_tests::workspace_binary;
use std::process::Command;
use tokio_stream::StreamExt;
use tonic_reflection::pb::v1::{
    server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
    server_reflection_response::MessageResponse, ServerReflectionRequest,
};

fn drover(args: &[&str]) -> std::process::Output {
    Command::new(workspace_binary("drover"))
        .args(args)
        .output()
        .expect("run drover")
}

#[test]
fn a_bad_configuration_exits_64_with_one_line() {
    let dir = drover_tests::TempDir::new("config");
    let file = dir.path().join("drover.toml");
    std::fs::write(&file, "lease_ttl = 3\nunknown_setting = 1\n").unwrap();
    let file_arg = file.to_string_lossy().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["serve", "--lease-ttl", "0", "--replica-id", "r"],
            "lease_ttl",
        ),
        (
            vec!["serve", "--listen", "localhost", "--replica-id", "r"],
            "listen",
        ),
        (
            vec![
                "serve",
                "--etcd-endpoints",
                "127.0.0.1:2379",
                "--replica-id",
                "r",
            ],
            "etcd_endpoints",
        ),
        (
            vec!["serve", "--log-format", "xml", "--replica-id", "r"],
            "log_format",
        ),
        (
            vec!["serve", "--config", &file_arg, "--replica-id", "r"],
            "unknown_setting",
        ),
        (vec!["serve", "--lease-ttl", "soon"], "lease-ttl"),
    ];
    for (args, mention) in cases {
        let output = drover(&args);
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(mention), "{args:?}: {stderr}");
    }
    let output = drover(&["serve", "--lease-ttl", "0", "--replica-id", "r"]);
    assert_eq!(
        String::from_utf8_lossy(&output.stderr)
            .trim()
            .lines()
            .count(),
        1
    );
}

#[tokio::test]
async fn reflection_lists_every_service() {
    let replica = ReplicaProcess::dev().await;
    let channel = tonic::transport::Channel::from_shared(replica.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("expected a service list, got {response:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    for service in [
        "drover.v1.Admin",
        "drover.v1.Clusters",
        "drover.v1.Operations",
        "drover.v1.Tasks",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == service),
            "{service} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn embedded_mode_serves_without_etcd() {
    let replica = ReplicaProcess::dev().await;
    let mut client = replica.client().await;
    let created = client
        .create_cluster(v1::CreateClusterRequest {
            name: "local".into(),
            spec: Some(v1::ClusterSpec {
                version: "1.30.0".into(),
                control_nodes: 1,
                node_offering: "small".into(),
                ..Default::default()
            }),
            create_only: true,
            request_id: String::new(),
        })
        .await
        .unwrap()
        .cluster
        .unwrap();
    assert_eq!(client.get_cluster("local").await.unwrap().uid, created.uid);
}

#[tokio::test]
async fn sigterm_stops_serving_and_exits_cleanly() {
    let etcd = EtcdProcess::start().await;
    let mut replica = ReplicaProcess::serve(&etcd.endpoint(), "r1").await;
    let endpoint = replica.endpoint();
    let status = replica.terminate().await;
    assert!(status.success(), "{status:?}");
    assert_eq!(health(&endpoint).await, None, "nothing answers after exit");
}
