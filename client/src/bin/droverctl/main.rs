//! droverctl: the command line for Drover.
//!
//! Exit codes: 0 success; 1 any other failure; 2 usage error; 3 not found;
//! 4 already exists; 5 invalid argument; 6 failed precondition; 7 aborted
//! (retry); 8 unavailable (retry); 9 the operation waited for (`--wait`,
//! `op wait`) failed or was cancelled; 10 unauthenticated (no or a wrong
//! token); 11 permission denied (the token's role may not do this); 12 the
//! operation waited for (`op wait`) had not ended at the timeout.

mod task;

use clap::{Parser, Subcommand, ValueEnum};
use drover_client::{v1, Client, ClientError, ConnectOptions, Tls};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "droverctl", version, about = "Command line for Drover")]
struct Cli {
    /// Replica gRPC endpoints, comma-separated; with several, calls go to
    /// whichever answers. https:// URLs use TLS.
    #[arg(
        long,
        global = true,
        env = "DROVER_ENDPOINT",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7070"
    )]
    endpoint: Vec<String>,
    /// Bearer token (prefer DROVER_TOKEN or --token-file: a flag shows in
    /// the process list).
    #[arg(long, global = true, env = "DROVER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the bearer token.
    #[arg(long, global = true, env = "DROVER_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// PEM CA that signed the replicas' certificates (TLS).
    #[arg(long, global = true, env = "DROVER_CA_CERT")]
    ca_cert: Option<std::path::PathBuf>,
    /// PEM client certificate, for replicas that require one (with --key).
    #[arg(long, global = true, env = "DROVER_CERT", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, global = true, env = "DROVER_KEY", requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Manage clusters.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Follow and cancel operations.
    #[command(subcommand)]
    Op(OpCommand),
    /// Scheduled repair and backup tasks.
    #[command(subcommand)]
    Task(task::TaskCommand),
    /// List the live replicas.
    Members,
    /// Stream cluster changes (one line each) until interrupted.
    Watch {
        /// Only this cluster.
        name: Option<String>,
        /// Start at this store revision (0: changes from now on).
        #[arg(long, default_value_t = 0)]
        from_revision: i64,
    },
}

#[derive(Subcommand)]
enum OpCommand {
    /// Show one operation.
    Get { cluster: String, id: String },
    /// List a cluster's operations, newest first.
    List { cluster: String },
    /// Wait until an operation ends.
    Wait {
        cluster: String,
        id: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Cancel an operation at its next step boundary.
    Cancel { cluster: String, id: String },
}

/// Flags shared by every lifecycle command.
#[derive(clap::Args)]
struct Lifecycle {
    /// Wait for the operation to end, showing its steps.
    #[arg(long)]
    wait: bool,
    /// Idempotency key [default: a new one per command]: the same key
    /// again returns the operation it started instead of a new one.
    #[arg(long, default_value = "")]
    request_id: String,
}

impl Lifecycle {
    /// The key given, or a new one: the request is sent again while no
    /// replica answers, and the key makes sure it starts one operation.
    fn request_id(&self) -> String {
        if self.request_id.is_empty() {
            format!("droverctl-{}", uuid::Uuid::new_v4())
        } else {
            self.request_id.clone()
        }
    }
}

/// Sends a lifecycle request, again while no replica answers (an answer
/// lost with a replica that went away): it carries a request id, so a
/// request that was carried out returns its operation instead of starting
/// another.
async fn send<R, T, F, Fut>(client: &Client, request: R, call: F) -> Result<T, ClientError>
where
    R: Clone,
    F: Fn(Client, R) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    client
        .retrying_unavailable(|c| call(c, request.clone()))
        .await
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Create a cluster.
    Create {
        name: String,
        #[arg(long)]
        version: String,
        #[arg(long, default_value_t = 1)]
        control_nodes: u32,
        #[arg(long, default_value_t = 0)]
        workers: u32,
        #[arg(long, default_value = "medium")]
        offering: String,
        /// A label, key=value; repeatable.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Leave the cluster Created instead of starting it.
        #[arg(long)]
        create_only: bool,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Start a cluster.
    Start {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Stop a cluster.
    Stop {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Change worker count and/or node offering.
    Scale {
        name: String,
        #[arg(long)]
        workers: Option<u32>,
        #[arg(long)]
        offering: Option<String>,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Rolling upgrade to a version.
    Upgrade {
        name: String,
        #[arg(long)]
        version: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Add worker nodes.
    AddNodes {
        name: String,
        #[arg(long)]
        count: u32,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Remove worker nodes by id.
    RemoveNodes {
        name: String,
        #[arg(required = true)]
        node_ids: Vec<String>,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Recover a cluster in Alert.
    Recover {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Replace a cluster's labels (bumps its generation).
    Update {
        name: String,
        /// A label, key=value; repeatable. The labels given replace all.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Apply only if the cluster is still at this generation.
        #[arg(long, default_value_t = 0)]
        expected_generation: i64,
    },
    /// Destroy a cluster.
    Delete {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Show one cluster.
    Get { name: String },
    /// List clusters.
    List {
        /// Only clusters carrying these labels ("k=v,k2=v2").
        #[arg(long, default_value = "")]
        selector: String,
        /// Clusters per page.
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        /// Read the replica's watch cache (faster, may lag by milliseconds)
        /// instead of etcd.
        #[arg(long)]
        cached: bool,
    },
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not key=value"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("droverctl: {error}");
            ExitCode::from(exit_code(&error))
        }
    }
}

fn exit_code(error: &ClientError) -> u8 {
    use tonic::Code;
    match error {
        ClientError::Connect { .. } => 8,
        ClientError::OperationFailed { .. } => 9,
        ClientError::StillRunning { .. } => 12,
        ClientError::Status(status) => match status.code() {
            Code::NotFound => 3,
            Code::AlreadyExists => 4,
            Code::InvalidArgument => 5,
            Code::FailedPrecondition => 6,
            Code::Aborted => 7,
            Code::Unavailable => 8,
            Code::Unauthenticated => 10,
            Code::PermissionDenied => 11,
            _ => 1,
        },
    }
}

/// TLS and token options from the flags; files that cannot be read are
/// usage errors.
fn connect_options(cli: &Cli) -> Result<ConnectOptions, String> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let token = match (&cli.token, &cli.token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(
            String::from_utf8(read(path)?)
                .map_err(|_| format!("{} is not UTF-8", path.display()))?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    let identity = match (&cli.cert, &cli.key) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        _ => None,
    };
    let tls = match &cli.ca_cert {
        Some(ca) => Some(Tls {
            ca_pem: read(ca)?,
            identity,
            domain: None,
        }),
        None if identity.is_some() => return Err("--cert needs --ca-cert".into()),
        None => None,
    };
    Ok(ConnectOptions { tls, token })
}

async fn connect(cli: &Cli) -> Result<Client, ClientError> {
    let options = connect_options(cli)
        .map_err(|message| ClientError::Status(tonic::Status::invalid_argument(message)))?;
    match cli.endpoint.as_slice() {
        [one] => Client::connect_with(one, &options).await,
        many => Client::connect_many_with(many, &options),
    }
}

async fn run(cli: Cli) -> Result<(), ClientError> {
    let mut client = connect(&cli).await?;
    match cli.command {
        Command::Task(command) => task::run(&mut client, cli.output, command).await?,
        Command::Cluster(ClusterCommand::Create {
            name,
            version,
            control_nodes,
            workers,
            offering,
            labels,
            create_only,
            lifecycle,
        }) => {
            let request = v1::CreateClusterRequest {
                name: name.clone(),
                spec: Some(v1::ClusterSpec {
                    version,
                    control_nodes,
                    worker_nodes: workers,
                    node_offering: offering,
                    labels: labels.into_iter().collect(),
                    ..Default::default()
                }),
                create_only,
                request_id: lifecycle.request_id(),
            };
            let response = send(&client, request, |mut c, r| async move {
                c.create_cluster(r).await
            })
            .await?;
            match response.operation {
                Some(op) => follow(&mut client, cli.output, op, lifecycle.wait).await?,
                None => {
                    if let Some(cluster) = response.cluster {
                        print_clusters(cli.output, &[cluster], false);
                    }
                }
            }
        }
        Command::Cluster(ClusterCommand::Start { name, lifecycle }) => {
            let request = v1::StartClusterRequest {
                name,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().start_cluster(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Cluster(ClusterCommand::Stop { name, lifecycle }) => {
            let request = v1::StopClusterRequest {
                name,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().stop_cluster(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Cluster(ClusterCommand::Scale {
            name,
            workers,
            offering,
            lifecycle,
        }) => {
            let request = v1::ScaleClusterRequest {
                name,
                worker_nodes: workers,
                node_offering: offering,
                autoscaling: None,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().scale_cluster(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Cluster(ClusterCommand::Upgrade {
            name,
            version,
            lifecycle,
        }) => {
            let request = v1::UpgradeClusterRequest {
                name,
                version,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().upgrade_cluster(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Cluster(ClusterCommand::AddNodes {
            name,
            count,
            lifecycle,
        }) => {
            let request = v1::AddNodesRequest {
                name,
                count,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().add_nodes(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Cluster(ClusterCommand::RemoveNodes {
            name,
            node_ids,
            lifecycle,
        }) => {
            let request = v1::RemoveNodesRequest {
                name,
                node_ids,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().remove_nodes(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Cluster(ClusterCommand::Recover { name, lifecycle }) => {
            let request = v1::RecoverClusterRequest {
                name,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().recover_cluster(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Cluster(ClusterCommand::Delete { name, lifecycle }) => {
            let request = v1::DeleteClusterRequest {
                name,
                request_id: lifecycle.request_id(),
            };
            let op = send(&client, request, |mut c, r| async move {
                Ok(c.clusters().delete_cluster(r).await?.into_inner())
            })
            .await?;
            follow(&mut client, cli.output, op, lifecycle.wait).await?;
        }
        Command::Op(OpCommand::Get { cluster, id }) => {
            let op = client
                .operations()
                .get_operation(v1::GetOperationRequest { cluster, id })
                .await?
                .into_inner();
            print_operation(cli.output, &op);
        }
        Command::Op(OpCommand::List { cluster }) => {
            let mut operations = Vec::new();
            let mut page_token = String::new();
            loop {
                let request = v1::ListOperationsRequest {
                    cluster: cluster.clone(),
                    page_size: 100,
                    page_token,
                };
                let page = client
                    .operations()
                    .list_operations(request)
                    .await?
                    .into_inner();
                operations.extend(page.operations);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            print_operation_list(cli.output, &operations);
        }
        Command::Op(OpCommand::Wait {
            cluster,
            id,
            timeout,
        }) => {
            let op = client
                .operations()
                .get_operation(v1::GetOperationRequest { cluster, id })
                .await?
                .into_inner();
            let waited = Duration::from_secs(timeout);
            let op = client.wait_operation(&op, waited).await?;
            print_operation(cli.output, &op);
            if op.state < v1::OperationState::Succeeded as i32 {
                return Err(ClientError::StillRunning {
                    id: op.id.clone(),
                    state: operation_json(&op)["state"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    waited,
                });
            }
            operation_outcome(&op)?;
        }
        Command::Op(OpCommand::Cancel { cluster, id }) => {
            let request = v1::CancelOperationRequest { cluster, id };
            let op = client
                .operations()
                .cancel_operation(request)
                .await?
                .into_inner();
            print_operation(cli.output, &op);
        }
        Command::Cluster(ClusterCommand::Update {
            name,
            labels,
            expected_generation,
        }) => {
            let request = v1::UpdateClusterRequest {
                name,
                labels: labels.into_iter().collect(),
                update_labels: true,
                expected_generation,
                ..Default::default()
            };
            let cluster = client
                .clusters()
                .update_cluster(request)
                .await?
                .into_inner();
            print_clusters(cli.output, &[cluster], false);
        }
        Command::Watch {
            name,
            from_revision,
        } => {
            let request = v1::WatchClustersRequest {
                from_revision,
                name: name.unwrap_or_default(),
            };
            let mut events = client
                .clusters()
                .watch_clusters(request)
                .await?
                .into_inner();
            while let Some(event) = events.message().await? {
                let cluster = event.cluster.unwrap_or_default();
                let kind = if event.kind == v1::cluster_event::Kind::Delete as i32 {
                    "DELETE"
                } else {
                    "PUT"
                };
                match cli.output {
                    Output::Json => {
                        let mut line = cluster_json(&cluster);
                        line["event"] = json!(kind);
                        line["event_revision"] = json!(event.revision);
                        println!("{line}");
                    }
                    Output::Table => println!(
                        "{:<8} {:<8} {:<24} {:<24} gen {}",
                        event.revision,
                        kind,
                        cluster.name,
                        state_name(&cluster),
                        cluster.generation
                    ),
                }
            }
        }
        Command::Members => {
            let members = client
                .admin()
                .list_members(v1::ListMembersRequest {})
                .await?
                .into_inner()
                .members;
            match cli.output {
                Output::Json => {
                    let list: Vec<Value> = members
                        .iter()
                        .map(|m| json!({"id": m.id, "address": m.address, "version": m.version, "lease_ttl_left_seconds": m.lease_ttl_left_seconds, "clusters_owned": m.clusters_owned, "draining": m.draining}))
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&list).expect("json"));
                }
                Output::Table => {
                    println!(
                        "{:<20} {:<22} {:<8} {:>9} {:>8}  STATE",
                        "ID", "ADDRESS", "VERSION", "LEASE(S)", "CLUSTERS"
                    );
                    for m in &members {
                        println!(
                            "{:<20} {:<22} {:<8} {:>9} {:>8}  {}",
                            m.id,
                            m.address,
                            m.version,
                            m.lease_ttl_left_seconds,
                            m.clusters_owned,
                            if m.draining { "draining" } else { "serving" }
                        );
                    }
                }
            }
        }
        Command::Cluster(ClusterCommand::Get { name }) => {
            let cluster = client.get_cluster(&name).await?;
            print_clusters(cli.output, &[cluster], false);
        }
        Command::Cluster(ClusterCommand::List {
            selector,
            page_size,
            cached,
        }) => {
            let mut clusters = Vec::new();
            let mut page_token = String::new();
            loop {
                let page = client
                    .list_clusters(v1::ListClustersRequest {
                        page_size,
                        page_token,
                        label_selector: selector.clone(),
                        linearizable: !cached,
                        ..Default::default()
                    })
                    .await?;
                clusters.extend(page.clusters);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            print_clusters(cli.output, &clusters, true);
        }
    }
    Ok(())
}

/// Prints an accepted operation, or follows it to its end with `wait`.
async fn follow(
    client: &mut Client,
    output: Output,
    op: v1::Operation,
    wait: bool,
) -> Result<(), ClientError> {
    if !wait {
        print_operation(output, &op);
        return Ok(());
    }
    let mut progress = Progress::new();
    let mut current = op;
    loop {
        progress.show(&current);
        if current.state >= v1::OperationState::Succeeded as i32 {
            break;
        }
        // Short waits, so each new step is shown as it starts; a replica
        // that goes away meanwhile is retried (waiting is idempotent).
        let waited = &current;
        current = client
            .retrying(|mut client| async move {
                client
                    .wait_operation(waited, Duration::from_millis(500))
                    .await
            })
            .await?;
    }
    progress.finish();
    print_operation(output, &current);
    operation_outcome(&current)
}

/// The progress of a followed operation on standard error: a bar redrawn in
/// place on a terminal, one line per step otherwise (logs, CI).
struct Progress {
    terminal: bool,
    last: String,
}

impl Progress {
    const WIDTH: u32 = 24;

    fn new() -> Self {
        use std::io::IsTerminal;
        Self {
            terminal: std::io::stderr().is_terminal(),
            last: String::new(),
        }
    }

    fn show(&mut self, op: &v1::Operation) {
        let Some(p) = &op.progress else { return };
        let total = p.total_steps.max(1);
        let line = if self.terminal {
            let done = (p.step.saturating_sub(1)).min(total) * Self::WIDTH / total;
            format!(
                "[{}{}] {}/{} {}",
                "#".repeat(done as usize),
                ".".repeat((Self::WIDTH - done) as usize),
                p.step,
                p.total_steps,
                p.step_name
            )
        } else {
            format!("[{}/{}] {}", p.step, p.total_steps, p.step_name)
        };
        if line == self.last {
            return;
        }
        if self.terminal {
            // Clear the line, then redraw.
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
        self.last = line;
    }

    fn finish(&self) {
        if self.terminal && !self.last.is_empty() {
            eprintln!();
        }
    }
}

/// A failed or cancelled operation is a failure of the command.
fn operation_outcome(op: &v1::Operation) -> Result<(), ClientError> {
    if op.state == v1::OperationState::Succeeded as i32 {
        return Ok(());
    }
    Err(ClientError::OperationFailed {
        id: op.id.clone(),
        state: operation_json(op)["state"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        message: op
            .error
            .as_ref()
            .map_or_else(String::new, |e| e.message.clone()),
    })
}

fn operation_json(op: &v1::Operation) -> Value {
    json!({
        "id": op.id,
        "cluster": op.cluster,
        "kind": enum_name(v1::OperationKind::try_from(op.kind).map(|k| k.as_str_name()), "OPERATION_KIND_"),
        "state": enum_name(v1::OperationState::try_from(op.state).map(|s| s.as_str_name()), "OPERATION_STATE_"),
        "progress": op.progress.as_ref().map(|p| json!({"step": p.step, "total_steps": p.total_steps, "step_name": p.step_name})),
        "error": op.error.as_ref().map(|e| json!({"code": e.code, "message": e.message})),
        "replica": op.replica,
        "owner_epoch": op.owner_epoch,
    })
}

pub fn enum_name<E>(name: Result<&str, E>, prefix: &str) -> String {
    name.map(|n| n.trim_start_matches(prefix).to_string())
        .unwrap_or_default()
}

/// One operation: a JSON object with `-o json`.
fn print_operation(output: Output, op: &v1::Operation) {
    print_operations(output, std::slice::from_ref(op), false);
}

/// A list of operations: a JSON array with `-o json`, whatever its length.
fn print_operation_list(output: Output, ops: &[v1::Operation]) {
    print_operations(output, ops, true);
}

fn print_operations(output: Output, ops: &[v1::Operation], list: bool) {
    match output {
        Output::Json => {
            let value = match ops {
                [one] if !list => operation_json(one),
                many => Value::Array(many.iter().map(operation_json).collect()),
            };
            println!("{}", serde_json::to_string_pretty(&value).expect("json"));
        }
        Output::Table => {
            println!(
                "{:<38} {:<14} {:<10} {:<8}  DETAIL",
                "ID", "KIND", "STATE", "STEP"
            );
            for op in ops {
                let json = operation_json(op);
                let step = op
                    .progress
                    .as_ref()
                    .map(|p| format!("{}/{}", p.step, p.total_steps))
                    .unwrap_or_default();
                let detail = op
                    .error
                    .as_ref()
                    .map(|e| e.message.clone())
                    .unwrap_or_default();
                println!(
                    "{:<38} {:<14} {:<10} {:<8}  {}",
                    op.id,
                    json["kind"].as_str().unwrap_or_default(),
                    json["state"].as_str().unwrap_or_default(),
                    step,
                    detail
                );
            }
        }
    }
}

fn state_name(cluster: &v1::Cluster) -> String {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.state)
        .and_then(|s| v1::ClusterState::try_from(s).ok())
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("CLUSTER_STATE_")
                .to_string()
        })
        .unwrap_or_default()
}

fn cluster_json(cluster: &v1::Cluster) -> Value {
    let spec = cluster.spec.clone().unwrap_or_default();
    let status = cluster.status.clone().unwrap_or_default();
    json!({
        "name": cluster.name,
        "uid": cluster.uid,
        "generation": cluster.generation,
        "revision": cluster.revision,
        "spec": {
            "version": spec.version,
            "control_nodes": spec.control_nodes,
            "worker_nodes": spec.worker_nodes,
            "node_offering": spec.node_offering,
            "labels": spec.labels,
        },
        "status": {
            "state": state_name(cluster),
            "current_version": status.current_version,
            "current_operation": status.current_operation,
            "observed_generation": status.observed_generation,
            "message": status.message,
        },
    })
}

/// Clusters; with `-o json` a `list` is an array whatever its length, and
/// a single cluster otherwise an object.
fn print_clusters(output: Output, clusters: &[v1::Cluster], list: bool) {
    match output {
        Output::Json => {
            let value = if clusters.len() == 1 && !list {
                cluster_json(&clusters[0])
            } else {
                Value::Array(clusters.iter().map(cluster_json).collect())
            };
            println!("{}", serde_json::to_string_pretty(&value).expect("json"));
        }
        Output::Table => {
            println!(
                "{:<24} {:<24} {:<10} {:>7} {:>7}  UID",
                "NAME", "STATE", "VERSION", "CONTROL", "WORKERS"
            );
            for cluster in clusters {
                let spec = cluster.spec.clone().unwrap_or_default();
                println!(
                    "{:<24} {:<24} {:<10} {:>7} {:>7}  {}",
                    cluster.name,
                    state_name(cluster),
                    spec.version,
                    spec.control_nodes,
                    spec.worker_nodes,
                    cluster.uid
                );
            }
        }
    }
}
