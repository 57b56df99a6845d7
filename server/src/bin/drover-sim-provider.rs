//! The simulated provider as its own process: drover.provider.v1.Provider
//! plus the Simulator control service (latency, faults, audit log) and
//! gRPC reflection. Without `--faults` it is kind; with them, hostile from
//! the first call; `--step-latency-ms` slows every step as a real provider
//! would.
//! With `--tls-cert`/`--tls-key` it serves TLS (`--client-ca`: mutual TLS),
//! with `--token-file` its Provider service requires that bearer token.

use clap::Parser;
use drover_server::config::{Secret, ServerTls};
use drover_server::provider::sim::{self, flags::SimFlags};
use std::path::PathBuf;
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
    #[command(flatten)]
    simulator: SimFlags,
    /// PEM certificate chain: serve TLS (with --tls-key).
    #[arg(long, env = "DROVER_SIM_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "DROVER_SIM_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA: callers must present a certificate it signed (mutual TLS).
    #[arg(long, env = "DROVER_SIM_CLIENT_CA", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// File whose first line is the bearer token every Provider call must
    /// carry.
    #[arg(long, env = "DROVER_SIM_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Where OpenTelemetry traces go over OTLP/gRPC [default: the standard
    /// OTEL_EXPORTER_OTLP_ENDPOINT; neither: no traces].
    #[arg(long, env = "DROVER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

impl Args {
    /// TLS and the token as the flags say, files read.
    fn security(&self) -> Result<sim::Security, String> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls {
                cert_pem: read(cert)?,
                key_pem: Secret::new(read(key)?),
                client_ca_pem: self.client_ca.as_ref().map(read).transpose()?,
            }),
            _ => None,
        };
        let token = match &self.token_file {
            Some(path) => {
                let text = String::from_utf8(read(path)?).unwrap_or_default();
                let token = text.lines().next().unwrap_or_default().trim().to_string();
                if token.is_empty() {
                    return Err(format!("{} holds no token", path.display()));
                }
                Some(Secret::new(token))
            }
            None => None,
        };
        Ok(sim::Security { tls, token })
    }
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
    let security = match args.security() {
        Ok(security) => security,
        Err(error) => {
            eprintln!("drover-sim-provider: {error}");
            return ExitCode::from(64);
        }
    };
    let format = drover_server::config::LogFormat::Text;
    let telemetry =
        drover_server::telemetry::init(format, "drover-sim-provider", args.otlp_endpoint.clone());
    let _telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("drover-sim-provider: {error}");
            return ExitCode::from(64);
        }
    };
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
        step_latency_ms = args.simulator.step_latency_ms,
        faults = !args.simulator.faults.is_empty(),
        seed = args.simulator.fault_seed,
        tls = security.tls.is_some(),
        token = security.token.is_some(),
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
    let provider = args.simulator.provider();
    match sim::serve_secured(provider, listener, security, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("drover-sim-provider: {error}");
            ExitCode::FAILURE
        }
    }
}
