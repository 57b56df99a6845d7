//! The provider conformance kit (drover-provider-check) against real
//! providers: the simulator process passes every check, the Python example
//! provider passes through the kit's binary, and providers broken in one
//! way each fail exactly the check for that rule, so the kit is shown to
//! catch what it claims to.

use drover_proto::provider::v1::{self as pb, provider_server::Provider};
use drover_provider_check::{run, Config, Report, Verdict};
use drover_server::provider::sim::SimProvider;
use drover_tests::{free_port, provider::SimProcess, wait_until, workspace_binary};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};

fn config(endpoint: String, simulator: bool) -> Config {
    Config {
        provider: endpoint,
        ca_cert: None,
        token_file: None,
        only: Vec::new(),
        call_timeout: Duration::from_secs(10),
        simulator,
    }
}

async fn reports(config: Config) -> Vec<Report> {
    run(&config, |report| println!("{report}"))
        .await
        .expect("the kit runs")
}

fn failed(reports: &[Report]) -> Vec<&'static str> {
    reports
        .iter()
        .filter(|r| r.failed())
        .map(|r| r.check)
        .collect()
}

#[tokio::test]
async fn the_simulator_passes_every_check() {
    let sim = SimProcess::start().await;
    // With the simulator's control service the kit can hold calls and runs
    // in flight, so the drain checks prove the rule instead of skipping.
    let reports = reports(config(sim.endpoint(), true)).await;
    assert_eq!(reports.len(), drover_provider_check::checks::NAMES.len());
    let not_passed: Vec<String> = reports
        .iter()
        .filter(|r| !matches!(r.verdict, Verdict::Pass(_)))
        .map(Report::to_string)
        .collect();
    assert!(not_passed.is_empty(), "{not_passed:#?}");
    let drain = reports.iter().find(|r| r.check == "drain").unwrap();
    assert!(drain.to_string().contains("Aborted"), "{drain}");
    // It cleaned up: nothing is left of the clusters it made.
    let log = sim.history().await;
    let uids: std::collections::BTreeSet<String> = log
        .entries
        .iter()
        .filter_map(|e| e.token.as_ref().map(|t| t.cluster_uid.clone()))
        .collect();
    assert!(uids.len() > 10, "{uids:?}");
    for uid in uids {
        assert!(sim.nodes(&uid).await.is_empty(), "{uid} left nodes");
    }
}

/// One way a provider breaks the contract.
#[derive(Clone, Copy)]
enum Flaw {
    /// StopNodes lets a stale token through (as if it were the newest).
    StopIgnoresFencing,
    /// A repeated CreateNodes adds its workers again.
    CreateNotIdempotent,
    /// Calls are applied whatever their `drover-apply-by` says.
    IgnoresApplyBy,
}

/// The simulator with one flaw.
#[derive(Clone)]
struct Flawed {
    inner: SimProvider,
    flaw: Flaw,
    /// The newest epoch seen per cluster, to pass stale StopNodes off as new.
    newest: Arc<Mutex<HashMap<String, i64>>>,
}

type Reply<T> = Result<Response<T>, Status>;

impl Flawed {
    /// Notes the request's token, and drops `drover-apply-by` when the flaw
    /// is to ignore it.
    fn pass_on<T>(&self, mut request: Request<T>, token: Option<&pb::FencingToken>) -> Request<T> {
        if let Some(token) = token {
            let mut newest = self.newest.lock().unwrap();
            let epoch = newest
                .entry(token.cluster_uid.clone())
                .or_insert(token.epoch);
            *epoch = (*epoch).max(token.epoch);
        }
        if matches!(self.flaw, Flaw::IgnoresApplyBy) {
            request
                .metadata_mut()
                .remove(drover_provider_check::APPLY_BY);
        }
        request
    }
}

#[tonic::async_trait]
impl Provider for Flawed {
    async fn create_nodes(&self, r: Request<pb::CreateNodesRequest>) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        let r = self.pass_on(r, token.as_ref());
        if !matches!(self.flaw, Flaw::CreateNotIdempotent) {
            return self.inner.create_nodes(r).await;
        }
        let uid = token
            .as_ref()
            .map(|t| t.cluster_uid.clone())
            .unwrap_or_default();
        let describe = pb::DescribeClusterRequest {
            cluster_uid: uid,
            token: None,
        };
        let nodes = self.inner.describe_cluster(Request::new(describe)).await?;
        let workers = nodes
            .get_ref()
            .nodes
            .iter()
            .filter(|n| n.role == "worker")
            .count() as u32;
        if workers == 0 {
            return self.inner.create_nodes(r).await;
        }
        let more = pb::ResizeNodesRequest {
            token,
            worker_nodes: Some(workers + r.get_ref().worker_nodes),
            offering: None,
        };
        self.inner.resize_nodes(Request::new(more)).await
    }

    async fn start_nodes(&self, r: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        self.inner
            .start_nodes(self.pass_on(r, token.as_ref()))
            .await
    }

    async fn stop_nodes(&self, r: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        let mut r = self.pass_on(r, token.as_ref());
        if let (Flaw::StopIgnoresFencing, Some(token)) = (self.flaw, r.get_mut().token.as_mut()) {
            token.epoch = self.newest.lock().unwrap()[&token.cluster_uid];
        }
        self.inner.stop_nodes(r).await
    }

    async fn delete_nodes(&self, r: Request<pb::DeleteNodesRequest>) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        self.inner
            .delete_nodes(self.pass_on(r, token.as_ref()))
            .await
    }

    async fn resize_nodes(&self, r: Request<pb::ResizeNodesRequest>) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        self.inner
            .resize_nodes(self.pass_on(r, token.as_ref()))
            .await
    }

    async fn upgrade_node(&self, r: Request<pb::UpgradeNodeRequest>) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        self.inner
            .upgrade_node(self.pass_on(r, token.as_ref()))
            .await
    }

    async fn describe_cluster(
        &self,
        r: Request<pb::DescribeClusterRequest>,
    ) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        self.inner
            .describe_cluster(self.pass_on(r, token.as_ref()))
            .await
    }

    async fn run_task(&self, r: Request<pb::RunTaskRequest>) -> Reply<pb::RunTaskResponse> {
        let token = r.get_ref().token.clone();
        self.inner.run_task(self.pass_on(r, token.as_ref())).await
    }

    async fn stop_task(&self, r: Request<pb::StopTaskRequest>) -> Reply<pb::StopTaskResponse> {
        let token = r.get_ref().token.clone();
        self.inner.stop_task(self.pass_on(r, token.as_ref())).await
    }

    async fn get_task_progress(
        &self,
        r: Request<pb::GetTaskProgressRequest>,
    ) -> Reply<pb::TaskProgress> {
        self.inner.get_task_progress(r).await
    }

    async fn repair_nodes(&self, r: Request<pb::PowerRequest>) -> Reply<pb::NodesResponse> {
        let token = r.get_ref().token.clone();
        self.inner
            .repair_nodes(self.pass_on(r, token.as_ref()))
            .await
    }

    async fn validate_spec(
        &self,
        r: Request<pb::ValidateSpecRequest>,
    ) -> Reply<pb::ValidateSpecResponse> {
        self.inner.validate_spec(r).await
    }

    async fn get_capabilities(
        &self,
        r: Request<pb::GetCapabilitiesRequest>,
    ) -> Reply<pb::Capabilities> {
        self.inner.get_capabilities(r).await
    }
}

/// Serves the simulator with `flaw` on a loopback port; its endpoint.
async fn serve_flawed(flaw: Flaw) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let provider = Flawed {
        inner: SimProvider::new(),
        flaw,
        newest: Arc::default(),
    };
    let serving = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(pb::provider_server::ProviderServer::new(provider))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("serve the flawed provider");
    });
    (endpoint, serving)
}

/// Runs the kit against the simulator with `flaw`; the checks that failed.
async fn failed_with(flaw: Flaw) -> Vec<&'static str> {
    let (endpoint, serving) = serve_flawed(flaw).await;
    let reports = reports(config(endpoint, false)).await;
    serving.abort();
    failed(&reports)
}

#[tokio::test]
async fn a_provider_that_lets_a_stale_token_through_fails_the_fencing_check() {
    assert_eq!(
        failed_with(Flaw::StopIgnoresFencing).await,
        ["stale-token-refused"]
    );
}

#[tokio::test]
async fn a_provider_whose_repeated_create_adds_nodes_fails_the_idempotency_check() {
    assert_eq!(
        failed_with(Flaw::CreateNotIdempotent).await,
        ["create-idempotent"]
    );
}

#[tokio::test]
async fn a_provider_that_ignores_the_apply_by_deadline_fails_the_deadline_check() {
    assert_eq!(failed_with(Flaw::IgnoresApplyBy).await, ["deadline"]);
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Python example provider on a free port (`args` added), once it
/// accepts connections; killed when dropped.
async fn python_provider(args: &[&str]) -> (Killed, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    // grpcio and grpcio-tools come from the workspace's virtual
    // environment, which scripts/install-deps.sh makes.
    let python = root.join(".venv/bin/python3");
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let provider = Killed(
        Command::new(&python)
            .arg(root.join("providers/python-example/provider.py"))
            .arg(root.join("proto"))
            .args(["--listen", &address])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/install-deps.sh)", python.display())),
    );
    wait_until(Duration::from_secs(30), "the Python provider", || {
        let address = address.clone();
        async move { tokio::net::TcpStream::connect(address).await.is_ok() }
    })
    .await;
    (provider, format!("http://{address}"))
}

/// Runs the kit's binary against `endpoint` with `args`; its stdout, after
/// checking that it exited with success.
fn kit_binary(endpoint: &str, args: &[&str]) -> String {
    let output = Command::new(workspace_binary("drover-provider-check"))
        .args(["--provider", endpoint, "--timeout-secs", "10"])
        .args(args)
        .output()
        .expect("run drover-provider-check");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{:?}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test]
async fn the_python_example_provider_passes_the_kit_binary() {
    let (_provider, endpoint) = python_provider(&[]).await;
    let stdout = kit_binary(&endpoint, &[]);
    let checks = drover_provider_check::checks::NAMES.len();
    assert!(
        stdout.contains(&format!("{checks} checks, 0 failed")),
        "{stdout}"
    );
    assert!(!stdout.lines().any(|l| l.starts_with("FAIL ")), "{stdout}");
}

/// Every step taking 1.5 s, three of the kit's cut windows: the work goes
/// on across the repeated calls and the nodes are made once.
#[tokio::test]
async fn the_python_example_provider_carries_long_work_across_calls() {
    let (_provider, endpoint) = python_provider(&["--work-ms", "1500"]).await;
    let stdout = kit_binary(&endpoint, &["--only", "long-work"]);
    let line = stdout.lines().find(|l| l.contains("long-work"));
    assert!(
        line.is_some_and(|l| l.starts_with("PASS") && l.contains("cut")),
        "{stdout}"
    );
}
