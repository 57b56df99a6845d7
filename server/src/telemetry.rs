//! Structured logs through `tracing`, as text or JSON, on standard error.
//! The level comes from `RUST_LOG` (default `info`).
//!
//! Guarantees: text logs are coloured only on a terminal (and not with
//! `NO_COLOR` set), so logs piped to a file or a collector carry no ANSI
//! escape codes.
//!
//! Caveats: a log line that cannot be written is dropped. When the reader of
//! standard error goes away (`drover dev 2>&1 | head`) the replica keeps
//! serving without logs: a replica that owns clusters should not stop
//! because its log reader did (stop it with a signal). Writing about the
//! failed write, the subscriber's default, would panic on the same closed
//! stream.

use crate::config::LogFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    // A panic goes into the log in its format (JSON too), with where it
    // happened, rather than only as raw text on stderr.
    std::panic::set_hook(Box::new(|panic| {
        let backtrace = std::backtrace::Backtrace::capture();
        tracing::error!(%panic, %backtrace, "panicked");
    }));
}
