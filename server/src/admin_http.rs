//! The admin HTTP port: `/metrics` (Prometheus text format), `/healthz`
//! (the process is up) and `/readyz` (serving and not draining).

use crate::metrics::Metrics;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

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

/// Serves the admin port until `shutdown` turns true or its sender goes.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let (metrics, ready) = (Arc::clone(&metrics), Arc::clone(&ready));
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let response = route(request.uri().path(), &metrics, &ready);
                    async move { Ok::<_, std::convert::Infallible>(response) }
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
    }
}
