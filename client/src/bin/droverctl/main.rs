//! droverctl: the command line for Drover.
//!
//! Exit codes: 0 success; 1 any other failure; 2 usage error; 3 not found;
//! 4 already exists; 5 invalid argument; 6 failed precondition; 7 aborted
//! (retry); 8 unavailable (retry); 9 the operation waited for (`--wait`,
//! `op wait`) failed or was cancelled; 10 unauthenticated (no or a wrong
//! token); 11 permission denied (the token's role may not do this); 12 the
//! operation waited for (`op wait`) had not ended at the timeout.

mod cluster;
mod op;
mod task;

use clap::{Parser, Subcommand, ValueEnum};
use drover_client::{v1, Client, ClientError, ConnectOptions, Tls};
use serde_json::{json, Value};
use std::process::ExitCode;

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
    Cluster(cluster::ClusterCommand),
    /// Follow and cancel operations.
    #[command(subcommand)]
    Op(op::OpCommand),
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
    let output = cli.output;
    match cli.command {
        Command::Cluster(command) => cluster::run(&mut client, output, command).await,
        Command::Op(command) => op::run(&mut client, output, command).await,
        Command::Task(command) => task::run(&mut client, output, command).await,
        Command::Members => members(&mut client, output).await,
        Command::Watch {
            name,
            from_revision,
        } => cluster::watch(&mut client, output, name, from_revision).await,
    }
}

/// `droverctl members`: the live replicas.
async fn members(client: &mut Client, output: Output) -> Result<(), ClientError> {
    let members = client
        .admin()
        .list_members(v1::ListMembersRequest {})
        .await?
        .into_inner()
        .members;
    match output {
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
    Ok(())
}

pub fn enum_name<E>(name: Result<&str, E>, prefix: &str) -> String {
    name.map(|n| n.trim_start_matches(prefix).to_string())
        .unwrap_or_default()
}
