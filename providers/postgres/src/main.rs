//! `drover-postgres-provider`: serves drover.provider.v1.Provider over
//! real PostgreSQL clusters on loopback (see the library's docs).

use clap::Parser;
use drover_postgres_provider::config::{self, Config, Offering};
use drover_postgres_provider::PostgresProvider;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    version,
    about = "A Drover provider running real PostgreSQL clusters on loopback"
)]
struct Args {
    /// Address to serve the provider API on.
    #[arg(long, default_value = "127.0.0.1:7090")]
    listen: String,
    /// Where OpenTelemetry traces go over OTLP/gRPC [default: the standard
    /// OTEL_EXPORTER_OTLP_ENDPOINT; neither: no traces].
    #[arg(long, env = "DROVER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Directory for data directories, logs and the state store.
    #[arg(long)]
    root: PathBuf,
    /// A version label and its binaries, LABEL=BINDIR (e.g.
    /// 15.0.0=/usr/lib/postgresql/15/bin); repeatable.
    #[arg(long = "pg-version", value_parser = config::parse_version, required = true)]
    versions: Vec<(String, PathBuf)>,
    /// An offering, NAME=SHARED_BUFFERS:MAX_CONNECTIONS (e.g.
    /// small=16MB:50); repeatable. Default: small, medium, large.
    #[arg(long = "offering", value_parser = config::parse_offering)]
    offerings: Vec<(String, Offering)>,
    /// Ports nodes may use, FROM-TO.
    #[arg(long, default_value = "54320-54420", value_parser = config::parse_port_range)]
    port_range: (u16, u16),
    /// The user PostgreSQL runs as when the provider runs as root.
    #[arg(long, default_value = "postgres")]
    run_as: String,
    /// Most standbys a cluster may have.
    #[arg(long, default_value_t = 8)]
    max_workers: u32,
    /// Run PostgreSQL with fsync off (fast; loses data on a machine crash).
    #[arg(long)]
    unsafe_no_fsync: bool,
    /// Abort at this named step (tests: a crash at each step of a
    /// switchover or a repair, e.g. `switchover.promoted`).
    #[arg(long, env = "DROVER_PG_FAULT", hide = true)]
    fault_point: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Traces to --otlp-endpoint or the standard OTEL_* variables (the
    // replica's spans continue here through the traceparent it sends).
    let _telemetry = drover_telemetry::init(drover_telemetry::Options {
        log_format: drover_telemetry::LogFormat::Text,
        service: "drover-postgres-provider",
        otlp_endpoint: args.otlp_endpoint.clone(),
    })?;
    let offerings = match args.offerings.is_empty() {
        true => config::default_offerings(),
        false => args.offerings.into_iter().collect(),
    };
    let cfg = Config {
        root: args.root,
        versions: args.versions.into_iter().collect(),
        offerings,
        ports: args.port_range,
        run_as: args.run_as,
        max_workers: args.max_workers,
        unsafe_no_fsync: args.unsafe_no_fsync,
        fault_point: args.fault_point,
    };
    warn_if_outgoing_connections_may_take_node_ports(cfg.ports);
    let provider = PostgresProvider::open(cfg)?;
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving drover.provider.v1.Provider");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    drover_postgres_provider::serve(provider, listener, shutdown).await?;
    Ok(())
}

/// Says so when the kernel may give node ports to outgoing connections as
/// their source ports: a node down for a moment (a restart, a rebuild by
/// RepairNodes) then fails to start while such a connection holds its
/// port ("Address already in use" in its server log).
fn warn_if_outgoing_connections_may_take_node_ports(ports: (u16, u16)) {
    let Some(outgoing) = config::OutgoingPorts::read() else {
        return;
    };
    let shared = outgoing.shared_with(ports);
    if shared > 0 {
        tracing::warn!(
            port_range = %format!("{}-{}", ports.0, ports.1),
            shared,
            "node ports are among the kernel's source ports for outgoing connections: \
             reserve them (sysctl net.ipv4.ip_local_reserved_ports) or choose a \
             --port-range outside net.ipv4.ip_local_port_range"
        );
    }
}
