//! droverctl: the command line for Drover.
//!
//! Exit codes: 0 success; 1 any other failure; 2 usage error; 3 not found;
//! 4 already exists; 5 invalid argument; 6 failed precondition; 7 aborted
//! (retry); 8 unavailable (retry); 9 the operation waited for (`--wait`,
//! `op wait`) failed or was cancelled, or the rollout watched (`rollout
//! watch`) did not succeed; 10 unauthenticated (no or a wrong
//! token); 11 permission denied (the token's role may not do this); 12 the
//! operation waited for (`op wait`) had not ended at the timeout; 13 a
//! file named by a flag (`--token-file`, `--ca-cert`, `--cert`, `--key`,
//! `rollout create -f`) cannot be read (a usage error: nothing was sent).
//!
//! Output goes to standard output line by line; a reader that stops reading
//! (`droverctl cluster list | head`) ends droverctl quietly, with 0.

/// `println!` through [`write_line`] (defined before the modules that use
/// it).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_line(format_args!($($arg)*))
    };
}

mod cluster;
mod describe;
mod docs;
mod op;
mod output;
mod policy;
mod provider;
mod rollout;
mod task;

use clap::{CommandFactory, Parser, Subcommand};
use drover_client::{v1, Client, ClientError, ConnectOptions, Tls};
use output::{Output, Table};
use std::io::Write;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "droverctl", version, about = "Command line for Drover")]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

/// Where the replicas are and how to reach them.
#[derive(clap::Args)]
struct Connection {
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
    /// Print the trace id of this command's requests (on standard error),
    /// to find them in the replicas' traces and logs.
    #[arg(short, long, global = true)]
    verbose: bool,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Remote(Remote),
    /// Print a shell completion script, e.g. `source <(droverctl completion
    /// bash)`.
    Completion { shell: clap_complete::Shell },
    /// Write man pages (droverctl.1 and one per subcommand) into a
    /// directory.
    Man {
        /// Directory to write into (created if missing).
        dir: std::path::PathBuf,
    },
}

/// The commands that talk to the replicas.
#[derive(Subcommand)]
enum Remote {
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
    /// The providers the answering replica reaches.
    #[command(subcommand)]
    Provider(provider::ProviderCommand),
    /// Carry one change (an upgrade, a node offering) across many
    /// clusters, in stages.
    #[command(subcommand)]
    Rollout(rollout::RolloutCommand),
    /// Stream cluster changes (one line each) until interrupted.
    Watch {
        /// Only this cluster.
        name: Option<String>,
        /// Start at this store revision (0: changes from now on).
        #[arg(long, default_value_t = 0)]
        from_revision: i64,
    },
}

/// Why droverctl failed: a local problem, found before anything was sent,
/// or the answer (or silence) of the replicas.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    LocalFile(String),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("rollout {name} ended {state}: {message}")]
    RolloutEnded {
        name: String,
        state: String,
        message: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let done = match cli.command {
        Command::Remote(command) => run(&cli.connection, cli.output, command).await,
        Command::Completion { shell } => {
            let script = docs::completion(&mut Cli::command(), shell);
            outln!("{}", script.trim_end());
            Ok(())
        }
        Command::Man { dir } => man_pages(&dir),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // Standard error may be gone too (`2>&1 | head`): nothing to do.
            let _ = writeln!(std::io::stderr(), "droverctl: {failure}");
            ExitCode::from(match &failure {
                Failure::LocalFile(_) => 13,
                Failure::Usage(_) => 2,
                Failure::Client(error) => exit_code(error),
                Failure::RolloutEnded { .. } => 9,
            })
        }
    }
}

/// Writes one line of output (what `println!` does, without its panic when
/// the reader has gone). A reader that closed the pipe has all it wanted:
/// droverctl ends there, with success, as `head`'s writer should.
pub fn write_line(line: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(line).and_then(|()| out.write_all(b"\n"));
    match written {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "droverctl: cannot write output: {error}");
            std::process::exit(1);
        }
    }
}

fn exit_code(error: &ClientError) -> u8 {
    use tonic::Code;
    match error {
        ClientError::Connect { .. }
        | ClientError::SpeaksTls { .. }
        | ClientError::Unreachable(_) => 8,
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
/// usage errors of their own.
fn connect_options(cli: &Connection) -> Result<ConnectOptions, Failure> {
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| Failure::LocalFile(format!("{flag}: cannot read {}: {e}", path.display())))
    };
    let token = match (&cli.token, &cli.token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(
            String::from_utf8(read("--token-file", path)?)
                .map_err(|_| {
                    Failure::LocalFile(format!("--token-file: {} is not UTF-8", path.display()))
                })?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    let identity = match (&cli.cert, &cli.key) {
        (Some(cert), Some(key)) => Some((read("--cert", cert)?, read("--key", key)?)),
        _ => None,
    };
    let tls = match &cli.ca_cert {
        Some(ca) => Some(Tls {
            ca_pem: read("--ca-cert", ca)?,
            identity,
            domain: None,
        }),
        None if identity.is_some() => return Err(Failure::Usage("--cert needs --ca-cert".into())),
        None => None,
    };
    Ok(ConnectOptions {
        tls,
        token,
        traceparent: None,
    })
}

fn man_pages(dir: &std::path::Path) -> Result<(), Failure> {
    let pages = docs::man_pages(Cli::command(), dir)
        .map_err(|e| Failure::LocalFile(format!("cannot write {}: {e}", dir.display())))?;
    outln!("wrote {} man pages into {}", pages.len(), dir.display());
    Ok(())
}

async fn run(connection: &Connection, output: Output, command: Remote) -> Result<(), Failure> {
    let mut options = connect_options(connection)?;
    // Every request of one command is one trace.
    let traceparent = drover_client::new_traceparent();
    if connection.verbose {
        let trace_id = drover_client::trace_id_of(&traceparent).unwrap_or_default();
        eprintln!("trace id: {trace_id}");
    }
    options.traceparent = Some(traceparent);
    let mut client = Client::connect_first_with(&connection.endpoint, &options).await?;
    let done = match command {
        Remote::Cluster(command) => cluster::run(&mut client, output, command).await,
        Remote::Op(command) => op::run(&mut client, output, command).await,
        Remote::Task(command) => task::run(&mut client, output, command).await,
        Remote::Members => members(&mut client, output).await,
        Remote::Provider(command) => provider::run(&mut client, output, command).await,
        // Its failures that are not the replicas' answer are final; the
        // others are explained below like any command's.
        Remote::Rollout(command) => match rollout::run(&mut client, output, command).await {
            Err(Failure::Client(error)) => Err(error),
            done => return done,
        },
        Remote::Watch {
            name,
            from_revision,
        } => cluster::watch(&mut client, output, name, from_revision).await,
    };
    match done {
        Err(error) if drover_client::may_be_plaintext_to_tls(&error) => {
            Err(explain_plaintext(&connection.endpoint, error).await.into())
        }
        done => Ok(done?),
    }
}

/// `error`, or that an `http://` endpoint is a replica speaking TLS when
/// one is: the call then broke off with a bare "operation was canceled".
async fn explain_plaintext(endpoints: &[String], error: ClientError) -> ClientError {
    for endpoint in endpoints.iter().filter(|e| e.starts_with("http://")) {
        if drover_client::speaks_tls(endpoint).await {
            return ClientError::SpeaksTls {
                endpoint: endpoint.clone(),
            };
        }
    }
    error
}

/// Sends a request, again while no replica answers (another endpoint may;
/// or the answer was lost with a replica that went away). Safe for every
/// request droverctl sends this way: a read changes nothing, and a
/// lifecycle request carries a request id, so one that was carried out
/// returns its operation instead of starting another.
pub async fn send<R, T, F, Fut>(client: &Client, request: R, call: F) -> Result<T, ClientError>
where
    R: Clone,
    F: Fn(Client, R) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    client
        .retrying_unavailable(|c| call(c, request.clone()))
        .await
}

/// `droverctl members`: the live replicas.
async fn members(client: &mut Client, output: Output) -> Result<(), ClientError> {
    let request = v1::ListMembersRequest {};
    let members = send(client, request, |mut c, r| async move {
        Ok(c.admin().list_members(r).await?.into_inner().members)
    })
    .await?;
    if output.messages(&members, true) {
        return Ok(());
    }
    if output == Output::Name {
        members.iter().for_each(|m| outln!("{}", m.id));
        return Ok(());
    }
    let mut table = Table::new(["ID", "ADDRESS", "VERSION", "LEASE", "CLUSTERS", "STATE"]);
    for m in &members {
        table.row([
            m.id.clone(),
            m.address.clone(),
            m.version.clone(),
            format!("{}s", m.lease_ttl_left_seconds),
            m.clusters_owned.to_string(),
            (if m.draining { "draining" } else { "serving" }).to_string(),
        ]);
    }
    table.print();
    Ok(())
}

pub fn enum_name<E>(name: Result<&str, E>, prefix: &str) -> String {
    name.map(|n| n.trim_start_matches(prefix).to_string())
        .unwrap_or_default()
}
