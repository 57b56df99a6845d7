//! The admin HTTP port: `/metrics` (Prometheus text format), `/healthz`
//! (the process is up), `/readyz` (serving and not draining),
//! `/liveness` (peers' crash detection, see [`crate::replication::liveness`])
//! and `/ui` (the web console, see [`crate::console`]).
//!
//! # Guarantees
//! - `/liveness` answers one JSON line naming this replica and the lease of
//!   its current membership session, then keeps the response open until
//!   the admin port closes (the process exits): a peer holding it sees the
//!   connection break when this process dies. A replica between sessions
//!   answers 503, one without a provider (never a member) 404.
//!
//! # Caveats
//! - Plain HTTP, no authentication but the console's bearer tokens: bind
//!   it where only operators and peers reach it. `/liveness` tells nothing
//!   but a replica id and a lease id.

use crate::console::{self, Console};
use crate::metrics::Metrics;
use crate::replication::{LivenessLine, Ownership};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Bytes, Frame};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Who answers `/liveness`: this replica's membership, set once its
/// workers start (the admin port is served before).
pub type Incarnation = Arc<OnceLock<Arc<Ownership>>>;

/// A fixed answer, or one that streams (`/liveness`, the console's events).
pub type AdminBody = Either<Full<Bytes>, UnsyncBoxBody<Bytes, Infallible>>;

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

fn route(path: &str, metrics: &Metrics, ready: &AtomicBool) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if ready.load(Ordering::SeqCst) => {
            respond(StatusCode::OK, "text/plain", "ready\n".into())
        }
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready\n".into(),
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// The `/liveness` answer: the first line, then an open body until
/// `closed` (the admin port's shutdown) turns true or its sender goes.
fn liveness(
    incarnation: &Incarnation,
    watcher: Option<&str>,
    closed: watch::Receiver<bool>,
) -> Response<AdminBody> {
    let Some(ownership) = incarnation.get() else {
        let body = Full::new(Bytes::from("not a member: no provider\n"));
        return plain(StatusCode::NOT_FOUND, body);
    };
    let Some(lease) = ownership.session_lease() else {
        let body = Full::new(Bytes::from("not a member now: joining\n"));
        return plain(StatusCode::SERVICE_UNAVAILABLE, body);
    };
    let line = LivenessLine {
        replica: ownership.replica_id().to_string(),
        lease,
    };
    let mut line = serde_json::to_vec(&line).expect("a plain struct serializes");
    line.push(b'\n');
    let mut closed = closed;
    let body = LivenessBody {
        _watcher: watcher.map(|peer| ownership.watcher(peer)),
        line: Some(Bytes::from(line)),
        closed: Box::pin(async move {
            let _ = closed.wait_for(|closed| *closed).await;
        }),
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/x-ndjson")
        .body(Either::Right(body.boxed_unsync()))
        .expect("static response parts are valid")
}

fn plain(status: StatusCode, body: Full<Bytes>) -> Response<AdminBody> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Either::Left(body))
        .expect("static response parts are valid")
}

/// The `/liveness` body: one line, then nothing until the port closes.
struct LivenessBody {
    /// The peer holding this connection, counted while it is open.
    _watcher: Option<crate::replication::Watcher>,
    line: Option<Bytes>,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl hyper::body::Body for LivenessBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(line) = self.line.take() {
            return Poll::Ready(Some(Ok(Frame::data(line))));
        }
        self.closed.as_mut().poll(cx).map(|()| None)
    }
}

/// Serves the admin port until `shutdown` turns true or its sender goes;
/// `/ui` is answered by `console` when there is one.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    incarnation: Incarnation,
    console: Option<Arc<Console>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = crate::net::AcceptBackoff::default();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff.reset();
                stream
            }
            Err(error) => {
                if let Some(wait) = backoff.after(&error) {
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                continue;
            }
        };
        let (metrics, ready) = (Arc::clone(&metrics), Arc::clone(&ready));
        let (incarnation, closed) = (Arc::clone(&incarnation), shutdown.clone());
        let console = console.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let (console, closed) = (console.clone(), closed.clone());
                    // The console's answers need reads: they are awaited below.
                    let path = request.uri().path();
                    let console_path = path == "/ui" || path.starts_with("/ui/");
                    let response = if let (true, Some(console)) = (console_path, console) {
                        Err((console, request))
                    } else if path == "/liveness" {
                        let watcher = request
                            .headers()
                            .get(crate::replication::WATCHER_HEADER)
                            .and_then(|v| v.to_str().ok());
                        Ok(liveness(&incarnation, watcher, closed.clone()))
                    } else {
                        Ok(route(path, &metrics, &ready).map(Either::Left))
                    };
                    async move {
                        Ok::<_, Infallible>(match response {
                            Ok(response) => response,
                            Err((console, request)) => {
                                console::handle(console, request, closed).await
                            }
                        })
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_answer_as_documented() {
        let metrics = Metrics::new();
        metrics.transition("Running", "Alert");
        let ready = AtomicBool::new(false);
        let body = route("/metrics", &metrics, &ready);
        assert_eq!(body.status(), StatusCode::OK);
        let text = metrics.render();
        assert!(
            text.contains("drover_state_transitions_total{from=\"Running\",to=\"Alert\"} 1"),
            "{text}"
        );
        assert_eq!(
            route("/readyz", &metrics, &ready).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        ready.store(true, Ordering::SeqCst);
        assert_eq!(route("/readyz", &metrics, &ready).status(), StatusCode::OK);
        assert_eq!(route("/healthz", &metrics, &ready).status(), StatusCode::OK);
        assert_eq!(
            route("/nope", &metrics, &ready).status(),
            StatusCode::NOT_FOUND
        );
        // A replica without a provider is never a member.
        let (_open, closed) = watch::channel(false);
        let answer = liveness(&Incarnation::default(), None, closed);
        assert_eq!(answer.status(), StatusCode::NOT_FOUND);
    }
}
