//! drover-provider-check: runs the provider conformance kit against a
//! provider endpoint and prints one line per check.
//!
//! Exit codes: 0 every check passed (or was skipped), 1 a check failed,
//! 64 bad arguments (an unknown check name too), 66 a file given cannot be
//! read or holds no usable token, 69 the provider cannot be reached or its
//! GetCapabilities fails.

use clap::Parser;
use drover_provider_check::{checks, run, Config, LinkError, SetupError};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "drover-provider-check",
    version,
    about = "Checks a drover.provider.v1 provider against the contract",
    after_help = format!(
        "Checks, in order: {}.\n\nExit codes: 0 all passed (skips allowed), 1 a check failed, \
         64 bad arguments, 66 unreadable file, 69 provider unreachable.",
        checks::NAMES.join(", ")
    )
)]
struct Args {
    /// Provider endpoint, e.g. http://127.0.0.1:7080 (https:// with --ca-cert).
    #[arg(long)]
    provider: String,
    /// PEM CA certificate to verify the provider's TLS certificate with.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// File holding a bearer token sent with every call.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Run only this check (repeatable).
    #[arg(long = "only", value_name = "NAME")]
    only: Vec<String>,
    /// Deadline of each provider call, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_secs: u64,
    /// Also use the simulator's control service (drover-sim-provider only,
    /// one of its own) so the drain checks can observe calls in flight.
    #[arg(long)]
    simulator: bool,
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
    let config = Config {
        provider: args.provider,
        ca_cert: args.ca_cert,
        token_file: args.token_file,
        only: args.only,
        call_timeout: Duration::from_secs(args.timeout_secs),
        simulator: args.simulator,
    };
    match run(&config, |report| println!("{report}")).await {
        Ok(reports) => {
            let failed = reports.iter().filter(|r| r.failed()).count();
            println!("{} checks, {failed} failed", reports.len());
            ExitCode::from(u8::from(failed > 0))
        }
        Err(error) => {
            eprintln!("drover-provider-check: {error}");
            ExitCode::from(match error {
                SetupError::UnknownCheck(_) | SetupError::Link(LinkError::Url { .. }) => 64,
                SetupError::Link(LinkError::Read { .. } | LinkError::Token) => 66,
                SetupError::Link(LinkError::Connect { .. }) | SetupError::Capabilities(_) => 69,
            })
        }
    }
}
