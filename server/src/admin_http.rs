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
//! - With `--tls-cert` the port speaks only TLS, with the gRPC port's
//!   certificate (see [`crate::config::AdminTls`]). A plain-HTTP request
//!   there is answered `400` with the `https://` URL to use, never served.
//! - With `--tls-client-ca` as well, the handshake asks for a client
//!   certificate without requiring one: the console, `/metrics` and the
//!   probes answer without, `/liveness` only with one the CA signed (403
//!   otherwise), as peers present theirs.
//! - Without TLS it serves plain HTTP, on loopback only unless
//!   `--admin-plain-http` (checked with the configuration).
//!
//! # Caveats
//! - No authentication but the console's bearer tokens (and `/liveness`'s
//!   client certificates): bind it where only operators and peers reach
//!   it. `/liveness` tells nothing but a replica id and a lease id.

use crate::config::AdminTls;
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
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

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

/// What every connection of the admin port shares.
#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    incarnation: Incarnation,
    console: Option<Arc<Console>>,
    closed: watch::Receiver<bool>,
    /// Client certificates are asked for: `/liveness` requires one.
    client_certificates: bool,
}

/// How long a connection may take to show what it speaks and finish its
/// TLS handshake: an idle one is not held forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first byte of every TLS connection (a handshake record); an HTTP
/// request starts with a method's letter.
const TLS_HANDSHAKE: u8 = 0x16;
/// The most of a plain request read to answer it.
const PLAIN_HEAD_LIMIT: usize = 8192;

/// Serves the admin port until `shutdown` turns true or its sender goes;
/// over TLS when `tls` is given; `/ui` is answered by `console` when
/// there is one.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    incarnation: Incarnation,
    console: Option<Arc<Console>>,
    tls: Option<AdminTls>,
    mut shutdown: watch::Receiver<bool>,
) {
    let shared = Shared {
        metrics,
        ready,
        incarnation,
        console,
        closed: shutdown.clone(),
        client_certificates: tls.as_ref().is_some_and(|t| t.client_certificates),
    };
    let acceptor = tls.map(|tls| TlsAcceptor::from(tls.server));
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
        let (shared, acceptor) = (shared.clone(), acceptor.clone());
        tokio::spawn(async move {
            match acceptor {
                Some(acceptor) => serve_tls(stream, acceptor, shared).await,
                None => serve_connection(TokioIo::new(stream), shared, false).await,
            }
        });
    }
}

/// One TLS connection; one that starts in plain HTTP instead is told to
/// use https.
async fn serve_tls(stream: TcpStream, acceptor: TlsAcceptor, shared: Shared) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => {}
        Ok(Ok(1)) => return refuse_plain(stream).await,
        _ => return,
    }
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(%error, "admin port: TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    // With `client_certificates`, only a certificate the CA signed passes
    // the handshake: one presented is a verified one.
    let verified = stream.get_ref().1.peer_certificates().is_some();
    serve_connection(TokioIo::new(stream), shared, verified).await;
}

/// Answers a plain-HTTP request on the TLS port with a 400 naming the
/// https:// URL it meant, instead of a handshake error it cannot read.
async fn refuse_plain(mut stream: TcpStream) {
    let mut head = Vec::new();
    let read = async {
        let mut buffer = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < PLAIN_HEAD_LIMIT {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buffer[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, read).await;
    let local = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let url = https_url(&String::from_utf8_lossy(&head), &local);
    tracing::debug!(%url, "admin port: a plain-HTTP request on the TLS port, told to use https");
    let body = format!("this admin port speaks TLS: use {url}\n");
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The https:// URL a plain request's `head` asked for: its Host (else
/// `local`, the port's address) and its path, printable characters only.
fn https_url(head: &str, local: &str) -> String {
    let clean = |text: &str| -> String {
        text.chars()
            .filter(|c| c.is_ascii_graphic())
            .take(512)
            .collect()
    };
    let path = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .filter(|path| path.starts_with('/'))
        .unwrap_or("/");
    let host = head
        .lines()
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
        .map(|(_, value)| value.trim())
        .unwrap_or(local);
    format!("https://{}{}", clean(host), clean(path))
}

/// Serves HTTP/1.1 on one connection; `verified`: it presented a client
/// certificate the CA signed.
async fn serve_connection<I>(io: TokioIo<I>, shared: Shared, verified: bool)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let shared = shared.clone();
        // The console's answers need reads: they are awaited below.
        let path = request.uri().path();
        let console_path = path == "/ui" || path.starts_with("/ui/");
        let response = match (console_path, &shared.console) {
            (true, Some(console)) => Err((Arc::clone(console), request)),
            _ if path == "/liveness" => Ok(liveness_for(&shared, &request, verified)),
            _ => Ok(route(path, &shared.metrics, &shared.ready).map(Either::Left)),
        };
        async move {
            Ok::<_, Infallible>(match response {
                Ok(response) => response,
                Err((console, request)) => console::handle(console, request, shared.closed).await,
            })
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await;
}

/// `/liveness`, for a peer: with client certificates asked for, only a
/// connection that presented one is answered (a watcher counts towards
/// this replica's claims, see [`crate::replication::Watcher`]).
fn liveness_for<B>(shared: &Shared, request: &Request<B>, verified: bool) -> Response<AdminBody> {
    if shared.client_certificates && !verified {
        let body = "/liveness is for peers: present a client certificate signed by the tls_client_ca (a peer presents its tls_cert)\n";
        return plain(StatusCode::FORBIDDEN, Full::new(Bytes::from(body)));
    }
    let watcher = request
        .headers()
        .get(crate::replication::WATCHER_HEADER)
        .and_then(|v| v.to_str().ok());
    liveness(&shared.incarnation, watcher, shared.closed.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_request_is_pointed_at_its_https_url() {
        let head = "GET /ui/#/fleet HTTP/1.1\r\nHost: 127.0.0.1:9070\r\n\r\n";
        assert_eq!(
            https_url(head, "127.0.0.1:1"),
            "https://127.0.0.1:9070/ui/#/fleet"
        );
        // HTTP/1.0 without a Host: the port's own address.
        assert_eq!(
            https_url("GET /metrics HTTP/1.0\r\n\r\n", "127.0.0.1:1"),
            "https://127.0.0.1:1/metrics"
        );
        assert_eq!(
            https_url("\u{1}junk", "127.0.0.1:1"),
            "https://127.0.0.1:1/"
        );
    }

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
