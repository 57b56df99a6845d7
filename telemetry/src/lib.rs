//! Logs and traces, shared by the replica and the providers: one
//! `tracing` subscriber writing logs to standard error (text or JSON) and,
//! when an OTLP endpoint is configured, exporting spans as OpenTelemetry
//! traces; and the W3C trace context carried in gRPC metadata, so that an
//! operation is one trace from the client through the replicas to the
//! provider.
//!
//! Reading order: [`init`] (what is turned on, and from where), then the
//! propagation helpers ([`server_span`], [`inject`], [`traceparent`],
//! [`context_from`]).
//!
//! # Guarantees
//! - Tracing is on only with an endpoint (`--otlp-endpoint`, or the
//!   standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). Off, no OpenTelemetry layer is
//!   installed and [`server_span`] makes no span, so a request costs what it
//!   cost before.
//! - The standard variables hold: `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`
//!   / `OTEL_TRACES_SAMPLER_ARG` (e.g. `parentbased_traceidratio`, `0.01`),
//!   `OTEL_BSP_SCHEDULE_DELAY` and the other batch settings.
//! - Text logs are coloured only on a terminal (and not with `NO_COLOR`),
//!   so logs piped to a file or a collector carry no ANSI escape codes.
//!
//! # Assumptions
//! - [`init`] runs inside a Tokio runtime: the OTLP exporter's gRPC channel
//!   is made on it.
//!
//! # Caveats
//! - Spans are exported in batches: a process killed with `kill -9` loses
//!   the spans it had not sent yet (by default up to 5 s of them;
//!   `OTEL_BSP_SCHEDULE_DELAY` shortens it), and the span that was open
//!   when it died never arrives. The operation's next owner links to it.
//! - A log line that cannot be written is dropped: a replica that owns
//!   clusters should not stop because its log reader went away (writing
//!   about the failed write, the subscriber's default, would panic on the
//!   same closed stream).

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use tonic::codegen::http;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use opentelemetry::Context;

/// Whether spans are exported: [`server_span`] makes none otherwise.
static TRACING: AtomicBool = AtomicBool::new(false);

/// The variables that, set, turn tracing on without `--otlp-endpoint`.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// What [`init`] sets up.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    pub log_format: LogFormat,
    /// The service name spans carry unless `OTEL_SERVICE_NAME` says another.
    pub service: &'a str,
    /// Where spans go (`http://host:4317`); `None` leaves it to the
    /// standard variables, and tracing off when none is set.
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The running telemetry: dropping it sends the spans not sent yet.
#[must_use = "dropping it at once stops exporting spans"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Flushes what is batched; a collector that is gone only costs
            // the export timeout.
            let _ = provider.shutdown();
        }
    }
}

/// Installs the logs and, when an endpoint is configured, the trace
/// exporter; returns the guard that flushes spans when dropped.
pub fn init(options: Options<'_>) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .log_internal_errors(false);
    let logs = match options.log_format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let provider = tracer_provider(&options)?;
    // Spans at info and above, whatever RUST_LOG says of the logs: quieter
    // logs must not cut the traces.
    let traces = provider.as_ref().map(|provider| {
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("drover"));
        layer.with_filter(LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
    TRACING.store(provider.is_some(), Ordering::Relaxed);
    Ok(Telemetry { provider })
}

/// The tracer provider exporting over OTLP/gRPC, when an endpoint is set.
fn tracer_provider(options: &Options<'_>) -> Result<Option<SdkTracerProvider>, TelemetryError> {
    let from_environment = ENDPOINT_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
    if options.otlp_endpoint.is_none() && !from_environment {
        return Ok(None);
    }
    use opentelemetry_otlp::WithExportConfig;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if let Some(endpoint) = &options.otlp_endpoint {
        exporter = exporter.with_endpoint(endpoint);
    }
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(options.service.to_string());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter.build()?)
        .with_resource(resource.build())
        .build();
    Ok(Some(provider))
}

/// Whether spans are exported.
pub fn tracing_on() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// The span a gRPC server wraps each request in (tonic's `trace_fn`): a
/// child of the caller's `traceparent`, when it sent one. No span when
/// tracing is off.
pub fn server_span(request: &http::Request<()>) -> tracing::Span {
    if !tracing_on() {
        return tracing::Span::none();
    }
    // The caller, once the handler knows it (a change's audit context).
    let span = tracing::info_span!(
        "grpc",
        otel.name = request.uri().path(),
        otel.kind = "server",
        rpc.system = "grpc",
        enduser.id = tracing::field::Empty,
        enduser.role = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
    let _ = span.set_parent(parent);
    span
}

/// Puts the current span's context into `metadata` as `traceparent`, so
/// the callee's spans are its children.
pub fn inject(metadata: &mut MetadataMap) {
    if !tracing_on() {
        return;
    }
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut Metadata(metadata));
}

/// `span`'s W3C `traceparent`, to persist it; `None` when it is not traced.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if !tracing_on() {
        return None;
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut fields = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut fields);
    fields.remove("traceparent")
}

/// The context a persisted `traceparent` names.
pub fn context_from(traceparent: &str) -> Context {
    let fields = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    TraceContextPropagator::new().extract(&fields)
}

/// The trace id of `span` (32 hex digits), when it is traced: for log
/// lines, so logs and traces join.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

/// Makes `span` a child of the persisted `parent` with links to the
/// persisted `earlier` spans (the runs of the same operation by owners
/// that were lost).
pub fn continue_trace<'a>(
    span: &tracing::Span,
    parent: Option<&str>,
    earlier: impl IntoIterator<Item = &'a str>,
) {
    if !tracing_on() {
        return;
    }
    if let Some(parent) = parent {
        let _ = span.set_parent(context_from(parent));
    }
    for earlier in earlier {
        let context = context_from(earlier);
        let linked = context.span().span_context().clone();
        if linked.is_valid() {
            span.add_link(linked);
        }
    }
}

/// An HTTP request's headers, read as a trace context carrier.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|key| key.as_str()).collect()
    }
}

/// Outgoing gRPC metadata, written as a trace context carrier.
struct Metadata<'a>(&'a mut MetadataMap);

impl Injector for Metadata<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value),
        ) {
            self.0.insert(key, value);
        }
    }
}
