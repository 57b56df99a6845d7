//! `drover serve` runs a replica against etcd; `drover dev` runs the embedded
//! mode (in-memory store) on loopback.

use clap::Parser;
use drover_server::config::{Cli, Command, Config, EXIT_CONFIG};
use drover_server::provider::sim::flags::SimFlags;
use drover_server::provider::{self, Providers};
use drover_server::replica::StartError;
use drover_server::server::{self, ServeError};
use drover_server::store::{EtcdOptions, EtcdStore, MemoryStore, SharedStore, Store};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// A replica allocates and frees small buffers for every request, watch
/// event and record it handles. jemalloc spends about a tenth less of the
/// replica's CPU on that than glibc's malloc, and with background threads
/// and a short decay it hands freed memory back promptly, so RSS at 10,000
/// clusters is no higher (drover-bench, BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` (`_RJEM_MALLOC_CONF` in the
/// environment still overrides them).
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: &[u8] = b"background_thread:true,dirty_decay_ms:200,muzzy_decay_ms:0\0";

/// etcd unreachable at start-up for this long is fatal (EX_UNAVAILABLE).
const ETCD_STARTUP_DEADLINE: Duration = Duration::from_secs(30);
/// The longest wait between two attempts at reaching etcd at start-up.
const ETCD_RETRY_MAX: Duration = Duration::from_secs(2);
const EXIT_UNAVAILABLE: u8 = 69;
/// Another live process holds this replica id (EX_CONFIG).
const EXIT_REPLICA_ID_IN_USE: u8 = 78;
/// A background task panicked (EX_SOFTWARE): a supervisor starts the
/// replica again, and its peers have taken its clusters meanwhile.
const EXIT_SOFTWARE: u8 = 70;
/// How long the tasks still running at exit (a blocking DNS lookup, say)
/// may hold the process up.
const RUNTIME_SHUTDOWN: Duration = Duration::from_millis(500);
/// 128 + SIGINT, as shells report a process stopped by an interrupt.
const EXIT_INTERRUPTED: i32 = 130;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    let (config, embedded) = match cli.command {
        Command::Serve(args) => (Config::from_serve_args(*args), None),
        Command::Dev(args) => {
            let simulator = Simulator {
                listen: args.sim_listen,
                flags: args.simulator.clone(),
            };
            (Config::from_dev_args(*args), Some(simulator))
        }
        Command::HashToken => return hash_token(),
    };
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            eprintln!("drover: {error}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let telemetry = {
        // The trace exporter's channel is made on the runtime.
        let _entered = runtime.enter();
        let endpoint = config.otlp_endpoint.clone();
        drover_server::telemetry::init(config.log_format, "drover", endpoint)
    };
    let telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("drover: {error}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    let code = runtime.block_on(run(config, embedded));
    // The last spans go while the runtime still runs the exporter.
    drop(telemetry);
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    code
}

async fn run(config: Config, embedded: Option<Simulator>) -> ExitCode {
    let (store, providers): (SharedStore, Option<Arc<Providers>>) =
        if let Some(simulator) = embedded {
            tracing::info!(
                "embedded mode: in-memory store and simulated provider, state is lost on exit"
            );
            match start_simulator(simulator).await {
                Ok(providers) => (Arc::new(MemoryStore::new()), Some(Arc::new(providers))),
                Err(error) => {
                    tracing::error!(%error, "cannot start the simulated provider");
                    return ExitCode::FAILURE;
                }
            }
        } else {
            let store = match connect_etcd(&config).await {
                Some(store) => Arc::new(store),
                None => return ExitCode::from(EXIT_UNAVAILABLE),
            };
            let providers = match config
                .providers
                .as_ref()
                .map(Providers::connect)
                .transpose()
            {
                Ok(providers) => providers.map(Arc::new),
                Err(error) => {
                    // The configuration checked every link: not expected.
                    tracing::error!(%error, "cannot set up the providers");
                    return ExitCode::from(EXIT_CONFIG as u8);
                }
            };
            (store, providers)
        };
    match server::serve(&config, store, providers, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error @ ServeError::Start(StartError::ReplicaIdInUse { .. })) => {
            tracing::error!(%error, "refusing to start");
            ExitCode::from(EXIT_REPLICA_ID_IN_USE)
        }
        Err(error @ ServeError::Panicked(_)) => {
            tracing::error!(%error, "exiting: a replica that runs on without one of its tasks would serve half-dead");
            ExitCode::from(EXIT_SOFTWARE)
        }
        Err(error) => {
            tracing::error!(%error, "replica failed");
            ExitCode::FAILURE
        }
    }
}

/// `drover hash-token`: the digest to put in the token file, so the token
/// itself is never stored.
fn hash_token() -> ExitCode {
    let mut token = String::new();
    if std::io::Read::read_to_string(&mut std::io::stdin(), &mut token).is_err() {
        eprintln!("drover: cannot read the token from standard input");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    let token = token.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        eprintln!("drover: no token on standard input");
        return ExitCode::from(EXIT_CONFIG as u8);
    }
    println!("{}", hex::encode(drover_server::auth::hash_token(token)));
    ExitCode::SUCCESS
}

/// The simulated provider `drover dev` runs in process: where it listens
/// and how it behaves.
struct Simulator {
    listen: SocketAddr,
    flags: SimFlags,
}

/// Runs the simulated provider in this process, on a loopback port a
/// person can reach too (grpcurl, through reflection), and links the
/// replica to it.
async fn start_simulator(simulator: Simulator) -> std::io::Result<Providers> {
    let listener = tokio::net::TcpListener::bind(simulator.listen).await?;
    let address = listener.local_addr()?;
    tracing::info!(
        %address,
        step_latency_ms = simulator.flags.step_latency_ms,
        faults = !simulator.flags.faults.is_empty(),
        "simulated provider (Provider and Simulator services; try: grpcurl -plaintext {address} list)"
    );
    let serve = provider::sim::serve(simulator.flags.provider(), listener, std::future::pending());
    tokio::spawn(async move {
        if let Err(error) = serve.await {
            tracing::error!(%error, "the simulated provider stopped");
        }
    });
    let endpoint = format!("http://{address}");
    let client = provider::connect_lazy(&endpoint).expect("a loopback URL");
    Ok(Providers::single(
        drover_server::config::DEFAULT_PROVIDER_NAME,
        &endpoint,
        client,
    ))
}

/// Connects to etcd, retrying for a while: etcd often starts alongside.
async fn connect_etcd(config: &Config) -> Option<EtcdStore> {
    let mut options = EtcdOptions::new(config.etcd_endpoints.clone());
    options.tls = config.security.etcd_tls.clone();
    options.user = config.security.etcd_user.clone();
    let deadline = tokio::time::Instant::now() + ETCD_STARTUP_DEADLINE;
    let mut delays = drover_server::retry::doubling(Duration::from_millis(100), ETCD_RETRY_MAX);
    loop {
        let delay = delays.next().unwrap_or(ETCD_RETRY_MAX);
        let attempt = async {
            let store = EtcdStore::connect(&options).await?;
            store.get(&config.key_prefix).await?;
            Ok::<_, drover_server::store::StoreError>(store)
        };
        match attempt.await {
            Ok(store) => {
                tracing::info!(endpoints = ?config.etcd_endpoints, "connected to etcd");
                return Some(store);
            }
            // A refused user or certificate will not get better by waiting.
            Err(error) if !error.is_retryable() => {
                tracing::error!(%error, endpoints = ?config.etcd_endpoints, "etcd refused this replica; check the etcd credentials");
                return None;
            }
            Err(error) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(%error, retry_in = ?delay, "etcd not reachable yet");
                tokio::time::sleep(delay).await;
            }
            Err(error) => {
                tracing::error!(%error, endpoints = ?config.etcd_endpoints, "etcd unreachable; giving up");
                return None;
            }
        }
    }
}

/// Completes on SIGTERM or Ctrl-C, which start the graceful shutdown; a
/// second one exits at once (peers recover what was running, as after a
/// crash).
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received"),
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::warn!("second signal: exiting without finishing the shutdown");
        std::process::exit(EXIT_INTERRUPTED);
    });
}
