//! The replica's logs and traces (see `drover_telemetry`), and where a
//! panic goes: into the log, in its format, with where it happened.

use crate::config::LogFormat;
pub use drover_telemetry::{Telemetry, TelemetryError};

/// Sets up logs and, with an OTLP endpoint, traces under `service`; runs
/// inside the Tokio runtime.
pub fn init(
    log_format: LogFormat,
    service: &str,
    otlp_endpoint: Option<String>,
) -> Result<Telemetry, TelemetryError> {
    let telemetry = drover_telemetry::init(drover_telemetry::Options {
        log_format,
        service,
        otlp_endpoint,
    })?;
    // A panic goes into the log in its format (JSON too), with where it
    // happened, rather than only as raw text on stderr.
    std::panic::set_hook(Box::new(|panic| {
        let backtrace = std::backtrace::Backtrace::capture();
        tracing::error!(%panic, %backtrace, "panicked");
    }));
    Ok(telemetry)
}
