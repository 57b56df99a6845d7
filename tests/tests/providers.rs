//! Several providers per deployment, end to end: real etcd, real replica
//! processes and simulator processes, one plaintext and one behind mutual
//! TLS and a bearer token. Each cluster's calls go to the provider its
//! spec names, and only there.

use drover_client::{v1, Client};
use drover_proto::provider::v1 as pb;
use drover_tests::etcd::EtcdProcess;
use drover_tests::pki::{Issued, Pki};
use drover_tests::provider::SimProcess;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_only, free_port, workspace_binary};
use std::collections::BTreeSet;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tonic::Code;

const TOKEN: &str = "provider-token-7";

/// A simulator serving mutual TLS and requiring [`TOKEN`], and the client
/// certificate a replica presents to it.
async fn secure_sim(pki: &Pki) -> (SimProcess, Issued) {
    let server = pki.server("sim-secure");
    let client = pki.client("drover-replica");
    let token = pki.write("sim-token", &format!("{TOKEN}\n"));
    let args = [
        "--tls-cert",
        &server.cert.display().to_string(),
        "--tls-key",
        &server.key.display().to_string(),
        "--client-ca",
        &pki.ca().display().to_string(),
        "--token-file",
        &token.display().to_string(),
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let harness = pki.client("harness");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem()))
        .identity(Identity::from_pem(&harness.cert_pem, &harness.key_pem))
        .domain_name("localhost");
    (SimProcess::start_tls(&args, tls).await, client)
}

/// `--provider secure=https://...,ca=...,cert=...,key=...,token-file=...`.
fn secure_flag(pki: &Pki, sim: &SimProcess, client: &Issued, token_file: &str) -> String {
    format!(
        "secure={},ca={},cert={},key={},token-file={token_file}",
        sim.endpoint(),
        pki.ca().display(),
        client.cert.display(),
        client.key.display()
    )
}

fn create_on(name: &str, provider: &str) -> v1::CreateClusterRequest {
    let mut request = create_only(name);
    request.create_only = false;
    if let Some(spec) = request.spec.as_mut() {
        spec.provider = provider.into();
    }
    request
}

/// Creates `name` on `provider` and waits for its start to succeed.
async fn create_running_on(client: &mut Client, name: &str, provider: &str) -> v1::Cluster {
    let response = client
        .clusters()
        .create_cluster(create_on(name, provider))
        .await
        .expect("create")
        .into_inner();
    let start = response.operation.expect("a start");
    let done = client
        .wait_operation(&start, Duration::from_secs(30))
        .await
        .expect("wait");
    assert_eq!(done.state, v1::OperationState::Succeeded as i32, "{done:?}");
    client.get_cluster(name).await.expect("get")
}

/// The cluster uids in a simulator's whole audit log.
async fn audited_uids(sim: &SimProcess) -> BTreeSet<String> {
    sim.history()
        .await
        .entries
        .into_iter()
        .filter_map(|e| e.token.map(|t| t.cluster_uid))
        .collect()
}

#[tokio::test]
async fn each_cluster_is_built_by_the_provider_its_spec_names() {
    let etcd = EtcdProcess::start().await;
    let pki = Pki::new();
    let plain = SimProcess::start().await;
    let (secure, client_cert) = secure_sim(&pki).await;
    let token_file = pki.write("replica-token", &format!("{TOKEN}\n"));
    let nowhere = format!("gone=http://127.0.0.1:{}", free_port());
    let flags = [
        "--provider".to_string(),
        format!("plain={}", plain.endpoint()),
        "--provider".into(),
        secure_flag(
            &pki,
            &secure,
            &client_cert,
            &token_file.display().to_string(),
        ),
        "--provider".into(),
        nowhere,
        "--default-provider".into(),
        "plain".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &flags).await;
    let mut client = replica.client().await;

    // Empty spec.provider: pinned to the default one, by name.
    let a = create_running_on(&mut client, "on-plain", "").await;
    assert_eq!(a.spec.as_ref().unwrap().provider, "plain");
    let b = create_running_on(&mut client, "on-secure", "secure").await;
    assert_eq!(b.spec.as_ref().unwrap().provider, "secure");
    for cluster in [&a, &b] {
        let state = cluster.status.as_ref().and_then(|s| s.state);
        assert_eq!(state, Some(v1::ClusterState::Running as i32), "{cluster:?}");
    }
    assert_eq!(audited_uids(&plain).await, BTreeSet::from([a.uid.clone()]));
    assert_eq!(audited_uids(&secure).await, BTreeSet::from([b.uid.clone()]));

    // ListProviders: every link as configured, the unreachable one said
    // so without failing the call.
    let listed = client
        .admin()
        .list_providers(v1::ListProvidersRequest {})
        .await
        .expect("list providers")
        .into_inner()
        .providers;
    let names: Vec<&str> = listed.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["gone", "plain", "secure"]);
    let (gone, plain_info, secure_info) = (&listed[0], &listed[1], &listed[2]);
    assert!(plain_info.is_default && !secure_info.is_default && !gone.is_default);
    assert!(!plain_info.tls && !plain_info.bearer_token);
    assert!(secure_info.tls && secure_info.client_certificate && secure_info.bearer_token);
    for answered in [plain_info, secure_info] {
        let kind = answered.capabilities.as_ref().map(|c| c.kind.as_str());
        assert_eq!(kind, Some("simulator"), "{answered:?}");
    }
    assert!(
        gone.capabilities.is_none() && !gone.error.is_empty(),
        "{gone:?}"
    );

    // droverctl provider list, as JSON and as a table.
    let droverctl = |args: &[&str]| {
        let out = std::process::Command::new(workspace_binary("droverctl"))
            .args(["--endpoint", &replica.endpoint()])
            .args(args)
            .output()
            .expect("run droverctl");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let json: serde_json::Value =
        serde_json::from_str(&droverctl(&["provider", "list", "-o", "json"])).expect("JSON");
    assert_eq!(json[1]["name"], "plain");
    assert_eq!(json[1]["is_default"], true);
    assert_eq!(json[2]["client_certificate"], true);
    assert_eq!(json[2]["capabilities"]["kind"], "simulator");
    assert!(
        json[0]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{json}"
    );
    let table = droverctl(&["provider", "list"]);
    let secure_row = table
        .lines()
        .find(|l| l.starts_with("secure"))
        .expect("a row");
    assert!(secure_row.contains("mtls+token"), "{table}");
}

#[tokio::test]
async fn spec_provider_is_checked_at_create_and_fixed_after() {
    let etcd = EtcdProcess::start().await;
    let one = SimProcess::start().await;
    let two = SimProcess::start().await;
    let flags = [
        "--provider".to_string(),
        format!("one={}", one.endpoint()),
        "--provider".into(),
        format!("two={}", two.endpoint()),
        "--default-provider".into(),
        "one".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &flags).await;
    let mut client = replica.client().await;

    let mut unknown = create_only("c1");
    unknown.spec.as_mut().unwrap().provider = "aws".into();
    let status = client
        .clusters()
        .create_cluster(unknown)
        .await
        .expect_err("an unknown provider");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("spec.provider"), "{status:?}");
    assert!(status.message().contains("\"aws\""), "{status:?}");
    let missing = client.get_cluster("c1").await.expect_err("nothing written");
    assert!(missing.to_string().contains("not found"), "{missing}");

    let mut first = create_only("c1");
    first.request_id = "create-c1".into();
    first.spec.as_mut().unwrap().provider = "two".into();
    client
        .clusters()
        .create_cluster(first.clone())
        .await
        .expect("create on two");
    // The same create again is answered; naming another provider is not.
    client
        .clusters()
        .create_cluster(first.clone())
        .await
        .expect("a retry");
    first.spec.as_mut().unwrap().provider = "one".into();
    let status = client
        .clusters()
        .create_cluster(first)
        .await
        .expect_err("another provider");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("spec.provider") && status.message().contains("cannot change"),
        "{status:?}"
    );
    let stored = client.get_cluster("c1").await.expect("get");
    assert_eq!(stored.spec.unwrap().provider, "two");
}

/// A replica not configured with a cluster's provider (replicas
/// configured differently) fails that cluster's operations, naming the
/// provider, and sends nothing to another provider.
#[tokio::test]
async fn a_cluster_whose_provider_this_replica_lacks_fails_its_operations_naming_it() {
    let etcd = EtcdProcess::start().await;
    let one = SimProcess::start().await;
    let two = SimProcess::start().await;
    let both = [
        "--provider".to_string(),
        format!("one={}", one.endpoint()),
        "--provider".into(),
        format!("two={}", two.endpoint()),
        "--default-provider".into(),
        "one".into(),
    ];
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    let mut first = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &both).await;
    let mut request = create_only("c2");
    request.spec.as_mut().unwrap().provider = "two".into();
    first
        .client()
        .await
        .clusters()
        .create_cluster(request)
        .await
        .expect("create on two");
    first.terminate().await;

    let only_one = format!("one={}", one.endpoint());
    let second =
        ReplicaProcess::serve_with(&etcd.endpoint(), "r2", &["--provider", &only_one]).await;
    let mut client = second.client().await;
    let start = client
        .clusters()
        .start_cluster(v1::StartClusterRequest {
            name: "c2".into(),
            ..Default::default()
        })
        .await
        .expect("accepted")
        .into_inner();
    let done = client
        .wait_operation(&start, Duration::from_secs(30))
        .await
        .expect("wait");
    assert_eq!(done.state, v1::OperationState::Failed as i32, "{done:?}");
    let message = done.error.map(|e| e.message).unwrap_or_default();
    assert!(
        message.contains("\"two\"") && message.contains("not configured"),
        "{message}"
    );
    assert!(
        one.history().await.entries.is_empty(),
        "nothing went to one"
    );
    assert!(two.history().await.entries.is_empty(), "nor to two");
}

/// The secure simulator refuses a call without the token or with another
/// one, and so does it a replica configured with the wrong token: the
/// operation fails with the provider's UNAUTHENTICATED.
#[tokio::test]
async fn a_wrong_token_is_refused_by_the_provider() {
    let pki = Pki::new();
    let (secure, client_cert) = secure_sim(&pki).await;
    let mut provider = pb::provider_client::ProviderClient::new(secure.channel().await);
    for token in [None, Some("not-the-token")] {
        let mut request = tonic::Request::new(pb::GetCapabilitiesRequest {});
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        let status = provider
            .get_capabilities(request)
            .await
            .expect_err("refused");
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{token:?}: {status:?}"
        );
    }

    let etcd = EtcdProcess::start().await;
    let wrong = pki.write("wrong-token", "not-the-token\n");
    let flag = secure_flag(&pki, &secure, &client_cert, &wrong.display().to_string());
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &["--provider", &flag]).await;
    let mut client = replica.client().await;
    // The provider is asked whether it builds the shape before anything is
    // written: the wrong token refuses the create itself, and says why.
    let refused = client
        .clusters()
        .create_cluster(create_on("c3", ""))
        .await
        .expect_err("refused at accept");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("wrong bearer token"),
        "{refused:?}"
    );
    let missing = client.get_cluster("c3").await.expect_err("nothing written");
    assert!(format!("{missing:?}").contains("NotFound"), "{missing:?}");
    assert!(secure.history().await.entries.is_empty(), "nothing applied");
}
