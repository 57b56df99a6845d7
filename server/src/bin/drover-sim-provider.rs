//! The simulated provider as its own process: drover.provider.v1.Provider
//! plus the Simulator control service (latency, faults, audit log).

use clap::Parser;
use drover_server::provider::sim::{self, SimProvider};
use std::process::ExitCode;

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
    tracing::info!(address = %args.listen, "simulated provider serving");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    };
    match sim::serve(SimProvider::new(), listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("drover-sim-provider: {error}");
            ExitCode::FAILURE
        }
    }
}
