//! An OTLP/gRPC trace receiver in the test's process: what an
//! OpenTelemetry collector would receive from the replicas and providers,
//! kept for the test to read.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// A span as exported, with the service that sent it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub span: Span,
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT`, for `--otlp-endpoint`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    _stop: oneshot::Sender<()>,
}

struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = service_name(&resource_spans.resource);
            let spans = resource_spans.scope_spans.into_iter().flat_map(|s| s.spans);
            kept.extend(spans.map(|span| ReceivedSpan {
                service: service.clone(),
                span,
            }));
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn service_name(resource: &Option<opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    let attributes = resource.iter().flat_map(|r| &r.attributes);
    attributes
        .filter(|kv| kv.key == "service.name")
        .find_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(name) => Some(name.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

impl OtlpReceiver {
    /// Serves on a free loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let collector = Collector {
            spans: Arc::clone(&spans),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                }),
        );
        Self {
            endpoint,
            spans,
            _stop: stop,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits up to `limit` until `done` holds of the spans received; then
    /// returns them. Panics naming `what` (and what arrived) otherwise.
    pub async fn wait_for(
        &self,
        limit: Duration,
        what: &str,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if tokio::time::Instant::now() >= deadline {
                let names: Vec<(&str, &str)> = spans
                    .iter()
                    .map(|s| (s.service.as_str(), s.span.name.as_str()))
                    .collect();
                panic!("{what}: not within {limit:?}; received {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The trace id and span id a W3C `traceparent` names, as bytes.
pub fn traceparent_ids(traceparent: &str) -> (Vec<u8>, Vec<u8>) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "a traceparent: {traceparent}");
    (hex_bytes(parts[1]), hex_bytes(parts[2]))
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}
