//! droverctl: the command line for Drover.
//!
//! Exit codes: 0 success; 1 any other failure; 2 usage error; 3 not found;
//! 4 already exists; 5 invalid argument; 6 failed precondition; 7 aborted
//! (retry); 8 unavailable (retry).

use clap::{Parser, Subcommand, ValueEnum};
use drover_client::{v1, Client, ClientError};
use serde_json::{json, Value};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "droverctl", version, about = "Command line for Drover")]
struct Cli {
    /// Replica gRPC endpoint.
    #[arg(
        long,
        global = true,
        env = "DROVER_ENDPOINT",
        default_value = "http://127.0.0.1:7070"
    )]
    endpoint: String,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Manage clusters.
    #[command(subcommand)]
    Cluster(ClusterCommand),
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
        /// Idempotency key.
        #[arg(long, default_value = "")]
        request_id: String,
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
        ClientError::Status(status) => match status.code() {
            Code::NotFound => 3,
            Code::AlreadyExists => 4,
            Code::InvalidArgument => 5,
            Code::FailedPrecondition => 6,
            Code::Aborted => 7,
            Code::Unavailable => 8,
            _ => 1,
        },
    }
}

async fn run(cli: Cli) -> Result<(), ClientError> {
    let mut client = Client::connect(&cli.endpoint).await?;
    match cli.command {
        Command::Cluster(ClusterCommand::Create {
            name,
            version,
            control_nodes,
            workers,
            offering,
            labels,
            create_only,
            request_id,
        }) => {
            let response = client
                .create_cluster(v1::CreateClusterRequest {
                    name,
                    spec: Some(v1::ClusterSpec {
                        version,
                        control_nodes,
                        worker_nodes: workers,
                        node_offering: offering,
                        labels: labels.into_iter().collect(),
                        ..Default::default()
                    }),
                    create_only,
                    request_id,
                })
                .await?;
            if let Some(cluster) = response.cluster {
                print_clusters(cli.output, &[cluster]);
            }
        }
        Command::Cluster(ClusterCommand::Get { name }) => {
            let cluster = client.get_cluster(&name).await?;
            print_clusters(cli.output, &[cluster]);
        }
        Command::Cluster(ClusterCommand::List {
            selector,
            page_size,
        }) => {
            let mut clusters = Vec::new();
            let mut page_token = String::new();
            loop {
                let page = client
                    .list_clusters(v1::ListClustersRequest {
                        page_size,
                        page_token,
                        label_selector: selector.clone(),
                        ..Default::default()
                    })
                    .await?;
                clusters.extend(page.clusters);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            print_clusters(cli.output, &clusters);
        }
    }
    Ok(())
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

fn print_clusters(output: Output, clusters: &[v1::Cluster]) {
    match output {
        Output::Json => {
            let value = if clusters.len() == 1 {
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
