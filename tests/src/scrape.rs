//! Reads a Prometheus text endpoint over plain HTTP/1.0, enough for the
//! `/metrics` of a loopback etcd or replica without an HTTP client crate.

use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every sample of `http://host:port/metrics`, by its full series name
/// (`name{labels}`).
pub async fn metrics(base_url: &str) -> BTreeMap<String, f64> {
    let authority = base_url
        .strip_prefix("http://")
        .expect("a plain http:// URL")
        .trim_end_matches('/');
    let mut stream = TcpStream::connect(authority)
        .await
        .expect("connect to /metrics");
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {authority}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read /metrics");
    let (_, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
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
