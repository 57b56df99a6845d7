//! The audit log end to end: a replica with bearer tokens and
//! `--audit-log` gets the role matrix's requests that change something
//! (allowed, refused for the role or the token, invalid), and each leaves
//! exactly one JSON line naming the caller, the method, the target and
//! the outcome, with no token anywhere; reads leave none. SIGHUP reopens
//! the file after logrotate moved it; with client certificates the line
//! names the certificate's subject; the scanner's Recover and a rollout's
//! upgrade are written as Drover's own.

use drover_client::{v1, Client, ConnectOptions, Tls};
use drover_server::auth::{hash_token, Role};
use drover_tests::etcd::EtcdProcess;
use drover_tests::fixture::Fixture;
use drover_tests::pki::Pki;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_only, create_running, wait_for_state, wait_until, TempDir};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

const TOKENS: [(&str, &str, Role); 3] = [
    ("dashboards", "viewer-token-1", Role::Viewer),
    ("ci", "operator-token-2", Role::Operator),
    ("oncall", "admin-token-3", Role::Admin),
];

/// A token file for [`TOKENS`] in `dir` (digests only); its path.
fn token_file(dir: &Path) -> String {
    let roles: Vec<(String, &str)> = TOKENS.iter().map(|(_, t, r)| (r.to_string(), *t)).collect();
    let tokens: Vec<(&str, &str, &str)> = TOKENS
        .iter()
        .zip(&roles)
        .map(|((name, _, _), (role, token))| (*name, role.as_str(), *token))
        .collect();
    let path = drover_tests::console::token_file(dir, &tokens);
    path.to_string_lossy().into_owned()
}

fn hex_of(token: &str) -> String {
    hash_token(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn client_with(endpoint: &str, token: Option<&str>) -> Client {
    let options = ConnectOptions {
        token: token.map(str::to_string),
        ..Default::default()
    };
    Client::connect_with(endpoint, &options)
        .await
        .expect("connect")
}

/// The audit file's lines, parsed; none while it does not exist.
fn lines(path: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The operation an answer started or acted on, as its line names it.
trait OperationOf {
    fn operation(&self) -> Option<String> {
        None
    }
}

impl OperationOf for v1::Operation {
    fn operation(&self) -> Option<String> {
        Some(self.id.clone())
    }
}

impl OperationOf for v1::CreateClusterResponse {}
impl OperationOf for v1::Cluster {}
impl OperationOf for v1::DeleteTaskResponse {}
impl OperationOf for v1::Rollout {}

/// The lines the requests of a test must have left, in order.
#[derive(Default)]
struct Expected(Vec<Value>);

impl Expected {
    /// The line of a request by `caller` to `method` naming `target`
    /// (`("cluster", name)`) with `request_id` (none when refused for its
    /// token or role), answered with `result`.
    fn push<T: OperationOf>(
        &mut self,
        caller: Value,
        method: &str,
        target: (&str, &str),
        request_id: &str,
        result: &Result<tonic::Response<T>, tonic::Status>,
    ) {
        let mut line = json!({ "caller": caller, "method": format!("/drover.v1.{method}") });
        line[target.0] = json!(target.1);
        if !request_id.is_empty() {
            line["request_id"] = json!(request_id);
        }
        match result {
            Ok(answer) => {
                line["outcome"] = json!("accepted");
                if let Some(id) = answer.get_ref().operation() {
                    line["operation_id"] = json!(id);
                }
            }
            Err(status) => {
                line["outcome"] = json!("refused");
                line["code"] = json!(code_name(status.code()));
                line["message"] = json!(status.message());
            }
        }
        self.0.push(line);
    }

    /// The file at `path` has exactly the expected lines.
    fn check(&self, path: &Path) {
        let got = lines(path);
        assert_eq!(got.len(), self.0.len(), "one line per change:\n{got:#?}");
        for (got, want) in got.iter().zip(&self.0) {
            assert_line(got, want);
        }
    }
}

fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        other => panic!("no name in this test for {other:?}"),
    }
}

fn caller(name: &str) -> Value {
    let (_, _, role) = TOKENS.iter().find(|(n, _, _)| *n == name).expect("known");
    json!({ "name": name, "role": role.to_string() })
}

/// Every field `want` names is in `got`, equal, and no other target or
/// outcome field; `got` has a time.
fn assert_line(got: &Value, want: &Value) {
    for (key, value) in want.as_object().expect("an object") {
        assert_eq!(&got[key], value, "{key} of {got}\nwanted {want}");
    }
    for field in ["cluster", "rollout", "request_id", "operation_id", "code"] {
        if want.get(field).is_none() {
            assert!(got.get(field).is_none(), "no {field} in {got}");
        }
    }
    let time = got["time"].as_str().expect("a time");
    let utc = time.len() >= 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T';
    assert!(utc, "an RFC 3339 time in UTC, not {time:?}");
}

#[tokio::test]
async fn each_change_leaves_one_line_with_its_caller_and_outcome() {
    let dir = TempDir::new("audit");
    let tokens = token_file(dir.path());
    let audit = dir.path().join("audit.log");
    let audit_arg = audit.to_string_lossy().into_owned();
    let f = Fixture::builder()
        .replica_args(&["--auth-tokens", &tokens, "--audit-log", &audit_arg])
        .start()
        .await;
    let endpoint = f.replicas[0].endpoint();
    let mut anonymous = client_with(&endpoint, None).await;
    let mut viewer = client_with(&endpoint, Some("viewer-token-1")).await;
    let mut operator = client_with(&endpoint, Some("operator-token-2")).await;
    let mut admin = client_with(&endpoint, Some("admin-token-3")).await;
    let mut want = Expected::default();

    // Refused for the token or the role: no request id.
    let audited = ("cluster", "audited");
    let create = v1::CreateClusterRequest {
        request_id: "create-audited".into(),
        ..create_only("audited")
    };
    let result = anonymous.clusters().create_cluster(create.clone()).await;
    let nobody = json!({ "role": "unauthenticated" });
    want.push(nobody, "Clusters/CreateCluster", audited, "", &result);
    let result = viewer.clusters().create_cluster(create.clone()).await;
    want.push(
        caller("dashboards"),
        "Clusters/CreateCluster",
        audited,
        "",
        &result,
    );
    assert_eq!(result.unwrap_err().code(), tonic::Code::PermissionDenied);
    let result = operator.clusters().create_cluster(create).await;
    want.push(
        caller("ci"),
        "Clusters/CreateCluster",
        audited,
        "create-audited",
        &result,
    );
    result.expect("an operator creates");
    let result = operator
        .clusters()
        .create_cluster(create_only("Not_A_Name"))
        .await;
    let bad = ("cluster", "Not_A_Name");
    want.push(caller("ci"), "Clusters/CreateCluster", bad, "", &result);
    assert_eq!(result.unwrap_err().code(), tonic::Code::InvalidArgument);

    let start = v1::StartClusterRequest {
        name: "audited".into(),
        request_id: "start-audited".into(),
        ..Default::default()
    };
    let result = operator.clusters().start_cluster(start).await;
    want.push(
        caller("ci"),
        "Clusters/StartCluster",
        audited,
        "start-audited",
        &result,
    );
    let started = result.expect("an operator starts").into_inner();
    let delete = v1::DeleteClusterRequest {
        name: "audited".into(),
        request_id: String::new(),
        ..Default::default()
    };
    let result = operator.clusters().delete_cluster(delete).await;
    want.push(caller("ci"), "Clusters/DeleteCluster", audited, "", &result);
    assert_eq!(result.unwrap_err().code(), tonic::Code::PermissionDenied);

    // Reads leave no line.
    viewer.get_cluster("audited").await.expect("a viewer reads");
    let members = admin.admin().list_members(v1::ListMembersRequest {});
    members.await.expect("an admin lists the members");

    let update = v1::UpdateClusterRequest {
        name: "audited".into(),
        labels: [("team".to_string(), "db".to_string())].into(),
        update_labels: true,
        ..Default::default()
    };
    let result = operator.clusters().update_cluster(update).await;
    want.push(caller("ci"), "Clusters/UpdateCluster", audited, "", &result);
    result.expect("an operator labels");

    let wait = viewer.wait_operation(&started, Duration::from_secs(30));
    let started = wait.await.expect("the start ends");
    let cancel = v1::CancelOperationRequest {
        cluster: "audited".into(),
        id: started.id.clone(),
    };
    let result = operator.operations().cancel_operation(cancel).await;
    want.push(
        caller("ci"),
        "Operations/CancelOperation",
        audited,
        "",
        &result,
    );
    let abandon = v1::AbandonOperationRequest {
        cluster: "audited".into(),
        id: started.id.clone(),
        reason: " ".into(),
    };
    let result = admin.operations().abandon_operation(abandon).await;
    want.push(
        caller("oncall"),
        "Operations/AbandonOperation",
        audited,
        "",
        &result,
    );
    assert_eq!(result.unwrap_err().code(), tonic::Code::InvalidArgument);

    let delete_task = v1::DeleteTaskRequest {
        cluster: "audited".into(),
        r#type: v1::TaskType::Repair as i32,
        name: "nightly".into(),
    };
    let result = operator.tasks().delete_task(delete_task).await;
    want.push(caller("ci"), "Tasks/DeleteTask", audited, "", &result);

    let pause = v1::PauseRolloutRequest {
        name: "nope".into(),
    };
    let nope = ("rollout", "nope");
    let result = viewer.rollouts().pause_rollout(pause.clone()).await;
    want.push(
        caller("dashboards"),
        "Rollouts/PauseRollout",
        nope,
        "",
        &result,
    );
    let result = operator.rollouts().pause_rollout(pause).await;
    want.push(caller("ci"), "Rollouts/PauseRollout", nope, "", &result);
    assert_eq!(result.unwrap_err().code(), tonic::Code::NotFound);

    want.check(&audit);
    let text = std::fs::read_to_string(&audit).expect("read the audit log");
    for (_, token, _) in TOKENS {
        assert!(!text.contains(token), "no token in the audit log");
        assert!(!text.contains(&hex_of(token)), "no digest in the audit log");
    }

    // logrotate moves the file and sends SIGHUP: the next lines go to a
    // new file at the configured path, none to the moved one.
    let rotated = dir.path().join("audit.log.1");
    std::fs::rename(&audit, &rotated).expect("rotate");
    f.replicas[0].signal("HUP");
    wait_until(Duration::from_secs(10), "the audit log reopened", || {
        let exists = audit.exists();
        async move { exists }
    })
    .await;
    let pause = v1::PauseRolloutRequest {
        name: "gone".into(),
    };
    let result = operator.rollouts().pause_rollout(pause).await;
    let mut after = Expected::default();
    let gone = ("rollout", "gone");
    after.push(caller("ci"), "Rollouts/PauseRollout", gone, "", &result);
    after.check(&audit);
    want.check(&rotated);
}

#[tokio::test]
async fn a_client_certificate_names_the_caller() {
    let etcd = EtcdProcess::start().await;
    let pki = Pki::new();
    let server = pki.server("replica");
    let client = pki.client("operator-laptop");
    let audit = pki.write("audit.log", "");
    let paths = |p: &Path| p.to_string_lossy().into_owned();
    let (cert, key, ca, audit_arg) = (
        paths(&server.cert),
        paths(&server.key),
        paths(&pki.ca()),
        paths(&audit),
    );
    let probe = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem()))
        .identity(Identity::from_pem(&client.cert_pem, &client.key_pem));
    let args = [
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
        "--audit-log",
        &audit_arg,
    ];
    let replica = ReplicaProcess::serve_tls(&etcd.endpoint(), "r1", &args, probe).await;
    let options = ConnectOptions {
        tls: Some(Tls {
            ca_pem: pki.ca_pem(),
            identity: Some((client.cert_pem.clone(), client.key_pem.clone())),
            domain: None,
        }),
        ..Default::default()
    };
    let mut drover = Client::connect_with(&replica.endpoint(), &options)
        .await
        .expect("connect with a certificate");
    drover
        .create_cluster(create_only("by-cert"))
        .await
        .expect("create");
    let got = lines(&audit);
    assert_eq!(got.len(), 1, "{got:#?}");
    let subject = got[0]["caller"]["subject"].as_str().unwrap_or_default();
    assert!(subject.contains("CN=operator-laptop"), "{}", got[0]);
    assert_eq!(
        got[0]["caller"]["role"], "anonymous",
        "no token file: no role"
    );
    assert_eq!(got[0]["outcome"], "accepted");
}

/// The lines of `method` in the audit file at `path`, waited for until
/// there is one.
async fn lines_of(path: &Path, method: &str) -> Vec<Value> {
    let method = format!("/drover.v1.{method}");
    let of = || -> Vec<Value> {
        let all = lines(path).into_iter();
        all.filter(|line| line["method"] == method.as_str())
            .collect()
    };
    let what = format!("{method} in the audit log");
    wait_until(Duration::from_secs(30), &what, || {
        let found = !of().is_empty();
        async move { found }
    })
    .await;
    of()
}

#[tokio::test]
async fn operations_started_by_drover_are_written_as_its_own() {
    let dir = TempDir::new("audit-system");
    let audit = dir.path().join("audit.log");
    let audit_arg = audit.to_string_lossy().into_owned();
    let mut f = Fixture::builder()
        .scan_interval(1)
        .replica_args(&["--audit-log", &audit_arg])
        .start()
        .await;
    let cluster = create_running(&mut f.client, "watched", 1).await;
    // The create, by a caller without a token file: anonymous.
    let create = &lines(&audit)[0];
    assert_eq!(create["caller"], json!({ "role": "anonymous" }));
    assert_eq!(create["method"], "/drover.v1.Clusters/CreateCluster");
    let system = json!({ "name": "drover", "role": "system", "replica": "r1" });

    // The scanner's Recover of a cluster whose nodes are healthy again.
    f.sim.set_health(&cluster.uid, false).await;
    let wait = Duration::from_secs(30);
    wait_for_state(&f.client, "watched", v1::ClusterState::Alert, wait).await;
    f.sim.set_health(&cluster.uid, true).await;
    let recover = lines_of(&audit, "Clusters/RecoverCluster").await;
    assert_eq!(recover.len(), 1, "{recover:#?}");
    assert_eq!(recover[0]["caller"], system, "{}", recover[0]);
    assert_eq!(recover[0]["cluster"], "watched");
    assert_eq!(recover[0]["outcome"], "accepted");
    let id = recover[0]["operation_id"].as_str().expect("its operation");
    let recovered = v1::Operation {
        cluster: "watched".into(),
        id: id.into(),
        ..Default::default()
    };
    let recovered = f.finish(recovered).await;
    assert_eq!(recovered.kind, v1::OperationKind::Recover as i32);

    // A rollout's upgrade of its cluster.
    let spec = v1::RolloutSpec {
        clusters: vec!["watched".into()],
        version: "1.30.0".into(),
        stages: vec![v1::RolloutStage {
            name: "all".into(),
            max_concurrency: "1".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let request = v1::CreateRolloutRequest {
        name: "fleet".into(),
        spec: Some(spec),
    };
    let rollout = f.client.rollouts().create_rollout(request).await;
    let uid = rollout.expect("a rollout").into_inner().uid;
    let upgrade = lines_of(&audit, "Clusters/UpgradeCluster").await;
    assert_eq!(upgrade[0]["caller"], system, "{}", upgrade[0]);
    assert_eq!(upgrade[0]["cluster"], "watched");
    assert_eq!(upgrade[0]["rollout"], "fleet");
    assert_eq!(upgrade[0]["request_id"], format!("rollout-{uid}-watched"));
    assert_eq!(upgrade[0]["outcome"], "accepted", "{}", upgrade[0]);
    let created = lines_of(&audit, "Rollouts/CreateRollout").await;
    assert_eq!(created[0]["rollout"], "fleet");
}
