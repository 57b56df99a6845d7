//! Security end to end: every RPC against every role, TLS with client
//! certificates on the gRPC port, and etcd over TLS with a user and
//! password. Real etcd and replica processes; certificates from a
//! throwaway CA.

use drover_client::{v1, Client, ClientError, ConnectOptions, Tls};
use drover_server::auth::{all_rpc_roles, Role};
use drover_tests::etcd::{EtcdProcess, EtcdTlsFiles};
use drover_tests::pki::Pki;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_only, workspace_binary};
use std::process::Command;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Code;

const TOKENS: [(&str, &str, Role); 3] = [
    ("dashboards", "viewer-token-1", Role::Viewer),
    ("ci", "operator-token-2", Role::Operator),
    ("oncall", "admin-token-3", Role::Admin),
];

/// A token file for [`TOKENS`], holding only their digests.
fn token_file(pki: &Pki) -> String {
    let roles: Vec<String> = TOKENS.iter().map(|(_, _, role)| role.to_string()).collect();
    let tokens: Vec<(&str, &str, &str)> = TOKENS
        .iter()
        .zip(&roles)
        .map(|((name, token, _), role)| (*name, role.as_str(), *token))
        .collect();
    let path = drover_tests::console::token_file(pki.dir(), &tokens);
    path.to_string_lossy().into_owned()
}

/// Calls `path` with an empty request (every field at its default) and
/// returns the status code; OK when the call got through to a handler that
/// started answering.
async fn call(channel: &Channel, path: &str, token: Option<&str>) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let mut request = tonic::Request::new(());
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header value");
        request.metadata_mut().insert("authorization", value);
    }
    let path = tonic::codegen::http::uri::PathAndQuery::try_from(path).expect("path");
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    match grpc.server_streaming(request, path, codec).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn every_rpc_is_checked_against_its_role() {
    let etcd = EtcdProcess::start().await;
    let pki = Pki::new();
    let tokens = token_file(&pki);
    let replica =
        ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &["--auth-tokens", &tokens]).await;
    let channel = Channel::from_shared(replica.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();

    let mut checked = 0;
    let rpc_roles = all_rpc_roles();
    for (path, needed) in &rpc_roles {
        assert_eq!(
            call(&channel, path, None).await,
            Code::Unauthenticated,
            "{path} without a token"
        );
        assert_eq!(
            call(&channel, path, Some("not-a-token")).await,
            Code::Unauthenticated,
            "{path} with an unknown token"
        );
        for (name, token, role) in TOKENS {
            let code = call(&channel, path, Some(token)).await;
            if role >= *needed {
                assert!(
                    !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
                    "{path} must be open to {name} ({role}): {code:?}"
                );
            } else {
                assert_eq!(
                    code,
                    Code::PermissionDenied,
                    "{path} must be closed to {name} ({role})"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, rpc_roles.len() * TOKENS.len());
    // Probes need no token.
    assert_eq!(
        drover_tests::replica::health(&replica.endpoint()).await,
        Some(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );

    // Through the client library and droverctl: an operator creates, only
    // an admin destroys.
    let connect = |token: &str| {
        let options = ConnectOptions {
            tls: None,
            token: Some(token.to_string()),
            ..Default::default()
        };
        let endpoint = replica.endpoint();
        async move { Client::connect_with(&endpoint, &options).await.unwrap() }
    };
    let mut operator = connect("operator-token-2").await;
    let create = create_only("guarded");
    operator
        .create_cluster(create)
        .await
        .expect("an operator creates");
    let delete = v1::DeleteClusterRequest {
        name: "guarded".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let denied = operator
        .clusters()
        .delete_cluster(delete)
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(
        denied.message().contains("\"ci\" has role operator")
            && denied.message().contains("needs admin"),
        "{}",
        denied.message()
    );
    assert!(
        !denied.message().contains("operator-token-2"),
        "no secret in errors"
    );

    let ctl = |token: Option<&str>, args: &[&str]| {
        let mut command = Command::new(workspace_binary("droverctl"));
        command.args(["--endpoint", &replica.endpoint()]).args(args);
        command.env_remove("DROVER_TOKEN");
        if let Some(token) = token {
            command.env("DROVER_TOKEN", token);
        }
        command.output().expect("run droverctl")
    };
    assert_eq!(
        ctl(None, &["cluster", "get", "guarded"]).status.code(),
        Some(10)
    );
    assert!(ctl(Some("viewer-token-1"), &["cluster", "get", "guarded"])
        .status
        .success());
    assert_eq!(
        ctl(Some("viewer-token-1"), &["cluster", "stop", "guarded"])
            .status
            .code(),
        Some(11)
    );
    assert!(ctl(Some("admin-token-3"), &["members"]).status.success());
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let etcd = EtcdProcess::start().await;
    let pki = Pki::new();
    let server = pki.server("replica");
    let client = pki.client("operator-laptop");
    let tokens = token_file(&pki);
    let (cert, key, ca) = (
        server.cert.to_string_lossy().into_owned(),
        server.key.to_string_lossy().into_owned(),
        pki.ca().to_string_lossy().into_owned(),
    );
    let probe = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem()))
        .identity(Identity::from_pem(&client.cert_pem, &client.key_pem));
    let args = [
        "--tls-cert",
        cert.as_str(),
        "--tls-key",
        key.as_str(),
        "--tls-client-ca",
        ca.as_str(),
        "--auth-tokens",
        tokens.as_str(),
    ];
    let replica = ReplicaProcess::serve_tls(&etcd.endpoint(), "r1", &args, probe).await;
    let endpoint = replica.endpoint();
    assert!(endpoint.starts_with("https://"));

    let options = |identity: bool| ConnectOptions {
        tls: Some(Tls {
            ca_pem: pki.ca_pem(),
            identity: identity.then(|| (client.cert_pem.clone(), client.key_pem.clone())),
            domain: None,
        }),
        token: Some("admin-token-3".into()),
        ..Default::default()
    };
    let mut trusted = Client::connect_with(&endpoint, &options(true))
        .await
        .unwrap();
    let missing = trusted.get_cluster("nothing-here").await.unwrap_err();
    assert!(
        matches!(&missing, ClientError::Status(s) if s.code() == Code::NotFound),
        "a client with a certificate reaches the service: {missing:?}"
    );

    // Without a client certificate the handshake (or the first call) fails.
    let refused = match Client::connect_with(&endpoint, &options(false)).await {
        Err(error) => error.to_string(),
        Ok(mut client) => client
            .get_cluster("nothing-here")
            .await
            .unwrap_err()
            .to_string(),
    };
    assert!(!refused.contains("NotFound"), "{refused}");

    // Plaintext to the TLS port does not work either.
    let plaintext = endpoint.replace("https://", "http://");
    let plain = match Client::connect(&plaintext).await {
        Err(error) => error.to_string(),
        Ok(mut client) => client
            .get_cluster("nothing-here")
            .await
            .unwrap_err()
            .to_string(),
    };
    assert!(!plain.contains("NotFound"), "{plain}");
}

#[tokio::test]
async fn etcd_over_tls_with_a_user_and_password() {
    let pki = Pki::new();
    let etcd = EtcdProcess::start_tls(EtcdTlsFiles::new(&pki)).await;
    etcd.etcdctl(&["user", "add", "root:etcd-s3cret"]);
    etcd.etcdctl(&["auth", "enable"]);
    let password = pki.write("etcd-password", "etcd-s3cret\n");
    let wrong = pki.write("etcd-wrong-password", "wrong-pa55word\n");
    let client = pki.client("drover-etcd-client");
    let (ca, cert, key) = (
        pki.ca().to_string_lossy().into_owned(),
        client.cert.to_string_lossy().into_owned(),
        client.key.to_string_lossy().into_owned(),
    );
    let etcd_args = |password: &std::path::Path| {
        vec![
            "--etcd-ca".to_string(),
            ca.clone(),
            "--etcd-cert".into(),
            cert.clone(),
            "--etcd-key".into(),
            key.clone(),
            "--etcd-username".into(),
            "root".into(),
            "--etcd-password-file".into(),
            password.to_string_lossy().into_owned(),
        ]
    };

    let args = etcd_args(&password);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &args).await;
    let mut client = replica.client().await;
    let create = create_only("secure");
    client
        .create_cluster(create)
        .await
        .expect("create over TLS etcd");
    let stored = etcd.etcdctl(&[
        "--user",
        "root:etcd-s3cret",
        "get",
        "--keys-only",
        "/drover/v1/clusters/secure/state",
    ]);
    assert!(
        stored.contains("/drover/v1/clusters/secure/state"),
        "{stored}"
    );

    // A wrong password is refused at once (not retried for 30 s), and the
    // password never appears in what the replica prints.
    let args = etcd_args(&wrong);
    let endpoint = etcd.endpoint();
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || {
            Command::new(workspace_binary("drover"))
                .args(["serve", "--replica-id", "r2", "--listen", "127.0.0.1:0"])
                .args(["--admin-listen", "127.0.0.1:0"])
                .args(["--etcd-endpoints", &endpoint])
                .args(&args[..])
                .env("RUST_LOG", "debug")
                .output()
                .expect("run drover")
        }),
    );
    let output = output.await.expect("exits promptly").unwrap();
    assert_eq!(output.status.code(), Some(69), "{output:?}");
    let printed = String::from_utf8_lossy(&output.stderr);
    assert!(
        !printed.contains("wrong-pa55word") && !printed.contains("etcd-s3cret"),
        "{printed}"
    );
}
