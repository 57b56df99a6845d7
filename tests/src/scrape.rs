//! Reads HTTP/1.0 endpoints (plain, or over TLS with a rustls client
//! configuration), enough for the `/metrics` (and etcd's `/debug/pprof`)
//! of a loopback etcd or replica without an HTTP client crate.

use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every sample of `http://host:port/metrics`, by its full series name
/// (`name{labels}`).
pub async fn metrics(base_url: &str) -> BTreeMap<String, f64> {
    samples(&get(base_url, "/metrics").await)
}

/// [`metrics`] of `https://host:port/metrics`, reached with `tls`.
pub async fn metrics_tls(base_url: &str, tls: &Arc<rustls::ClientConfig>) -> BTreeMap<String, f64> {
    let (status, body) = fetch_tls(base_url, "/metrics", tls, &[])
        .await
        .unwrap_or_else(|error| panic!("GET /metrics: {error}"));
    assert_eq!(status, 200, "GET /metrics");
    samples(&body)
}

fn samples(body: &[u8]) -> BTreeMap<String, f64> {
    String::from_utf8_lossy(body)
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The body of `http://host:port<path>`; panics unless it is a 200.
pub async fn get(base_url: &str, path: &str) -> Vec<u8> {
    let (status, body) = fetch(base_url, path)
        .await
        .unwrap_or_else(|error| panic!("GET {path}: {error}"));
    assert_eq!(status, 200, "GET {path}");
    body
}

/// The status code and body of `http://host:port<path>`, or why there is
/// no answer (the port is closed, say).
pub async fn fetch(base_url: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let authority = base_url
        .strip_prefix("http://")
        .expect("a plain http:// URL")
        .trim_end_matches('/');
    let stream = TcpStream::connect(authority).await?;
    exchange(stream, authority, path, &[]).await
}

/// [`fetch`] of `https://host:port<path>` with `headers`, reached with
/// `tls` (the CA to trust, a client certificate if any); the server name
/// is the host's.
pub async fn fetch_tls(
    base_url: &str,
    path: &str,
    tls: &Arc<rustls::ClientConfig>,
    headers: &[(&str, &str)],
) -> std::io::Result<(u16, Vec<u8>)> {
    let authority = base_url
        .strip_prefix("https://")
        .expect("an https:// URL")
        .trim_end_matches('/');
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    let name =
        rustls::pki_types::ServerName::try_from(host.to_string()).map_err(std::io::Error::other)?;
    let stream = TcpStream::connect(authority).await?;
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
        .connect(name, stream)
        .await?;
    exchange(stream, authority, path, headers).await
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    match stream.read_to_end(&mut response).await {
        // A TLS peer that closed without its close_notify: the answer is
        // whole all the same (HTTP/1.0 ends it with the connection).
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {
        }
        read => {
            read?;
        }
    }
    let head_end = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("not an HTTP response"))?;
    let head = String::from_utf8_lossy(&response[..head_end]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, response.split_off(head_end + 4)))
}

/// The sum of every series of `name` whose labels contain `label` (for
/// example `grpc_method="Txn"`); `label` empty sums them all.
pub fn sum(samples: &BTreeMap<String, f64>, name: &str, label: &str) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let (series_name, labels) = series.split_once('{').unwrap_or((series, ""));
            series_name == name && labels.contains(label)
        })
        .map(|(_, value)| value)
        .sum()
}

/// The cumulative buckets of histogram `name` (`name_bucket{le="..."}`),
/// upper bound first, in ascending order; `+Inf` last.
#[derive(Clone, Debug, Default)]
pub struct Histogram(Vec<(f64, f64)>);

impl Histogram {
    /// Histogram `name` as `samples` hold it (empty if absent).
    pub fn of(samples: &BTreeMap<String, f64>, name: &str) -> Self {
        let prefix = format!("{name}_bucket{{");
        let mut buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter_map(|(series, count)| {
                let labels = series.strip_prefix(&prefix)?;
                let bound = labels.split("le=\"").nth(1)?.split('"').next()?;
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().ok()?
                };
                Some((bound, *count))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Self(buckets)
    }

    /// What was observed after `earlier` (a scrape of the same series).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let before = |bound: f64| {
            earlier
                .0
                .iter()
                .find(|(b, _)| *b == bound)
                .map_or(0.0, |(_, c)| *c)
        };
        Self(self.0.iter().map(|&(b, c)| (b, c - before(b))).collect())
    }

    /// How many observations.
    pub fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |(_, c)| *c)
    }

    /// The `q` quantile (0..=1), interpolated within its bucket as
    /// Prometheus's `histogram_quantile` does; `None` without observations.
    /// Past the last finite bound it is that bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let rank = q * self.count();
        if self.count() == 0.0 {
            return None;
        }
        let (mut lower, mut below) = (0.0, 0.0);
        for &(bound, count) in &self.0 {
            if count >= rank {
                if bound.is_infinite() {
                    return Some(lower);
                }
                let share = if count > below {
                    (rank - below) / (count - below)
                } else {
                    0.0
                };
                return Some(lower + (bound - lower) * share);
            }
            (lower, below) = (bound, count);
        }
        Some(lower)
    }
}
