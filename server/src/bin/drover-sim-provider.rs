//! The simulated provider as its own process: drover.provider.v1.Provider
//! plus the Simulator control service (latency, faults, audit log).
//! Without `--faults` it is kind; with them, hostile from the first call.

use clap::Parser;
use drover_server::provider::sim::{self, faults::FaultPlan, SimProvider};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "drover-sim-provider",
    version,
    about = "Drover's simulated provider"
)]
struct Args {
    /// gRPC listen address.
    #[arg(long, env = "DROVER_SIM_LISTEN", default_value = "127.0.0.1:7080")]
    listen: std::net::SocketAddr,
    /// Random faults per method, METHOD:KIND=P[,KIND=P...][;METHOD:...]
    /// with kinds error, latency, hang, partial, late and "*" for every
    /// method not named, e.g. "UpgradeNode:error=0.1,late=0.2;*:latency=0.3".
    /// None by default.
    #[arg(long, env = "DROVER_SIM_FAULTS", default_value = "")]
    faults: FaultPlan,
    /// Seed of the random faults: the same seed draws the same faults.
    #[arg(long, env = "DROVER_SIM_FAULT_SEED", default_value_t = 0)]
    fault_seed: u64,
    /// Upper bound of an injected delay (extra latency, late landing), in
    /// milliseconds.
    #[arg(long, env = "DROVER_SIM_FAULT_DELAY_MS", default_value_t = 200)]
    fault_delay_ms: u64,
    /// Versions it builds, comma-separated; ValidateSpec refuses others.
    /// Empty (the default): any.
    #[arg(long, env = "DROVER_SIM_VERSIONS", value_delimiter = ',')]
    versions: Vec<String>,
    /// Node offerings it builds, comma-separated; ValidateSpec refuses
    /// others. Empty (the default): any.
    #[arg(long, env = "DROVER_SIM_OFFERINGS", value_delimiter = ',')]
    offerings: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(64);
        }
    };
    drover_server::telemetry::init(drover_server::config::LogFormat::Text);
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!(
                "drover-sim-provider: cannot listen on {}: {error}",
                args.listen
            );
            return ExitCode::from(69);
        }
    };
    tracing::info!(
        address = %args.listen,
        faults = !args.faults.is_empty(),
        seed = args.fault_seed,
        "simulated provider serving"
    );
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    };
    let delay = Duration::from_millis(args.fault_delay_ms);
    let known = sim::Known {
        versions: args.versions,
        offerings: args.offerings,
    };
    let provider = SimProvider::with_faults(args.faults, args.fault_seed, delay).knowing(known);
    match sim::serve(provider, listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("drover-sim-provider: {error}");
            ExitCode::FAILURE
        }
    }
}
