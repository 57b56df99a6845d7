//! The admin port over TLS, end to end: with `--tls-cert` the console,
//! `/metrics` and `/liveness` answer over TLS with the gRPC port's
//! certificate; with `--tls-client-ca` `/liveness` needs a client
//! certificate, which peers present, while the console and `/metrics` do
//! not; a plain-HTTP request there is told to use https; peers still see a
//! kill -9 in under a second; and the console sends no token over plain
//! HTTP to a host other than loopback. Real etcd, simulator and replica
//! processes; certificates from a throwaway CA.

use drover_server::auth::hash_token;
use drover_server::store::Store;
use drover_tests::browser::{self, until, Browser};
use drover_tests::fixture::Backends;
use drover_tests::pki::{Issued, Pki};
use drover_tests::replica::ReplicaProcess;
use drover_tests::{scrape, wait_until};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

const ADMIN_TOKEN: &str = "admin-token-3";

/// The certificates of one test: a CA, the replicas' certificate (server
/// and client use) and an operator's client certificate.
struct Certs {
    pki: Pki,
    replica: Issued,
    operator: Issued,
    tokens: String,
}

impl Certs {
    fn new() -> Self {
        let pki = Pki::new();
        let replica = pki.replica("replica");
        let operator = pki.client("operator-laptop");
        let digest: String = hash_token(ADMIN_TOKEN)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let file =
            format!("[[token]]\nname = \"oncall\"\nrole = \"admin\"\nsha256 = \"{digest}\"\n");
        let tokens = pki.write("tokens.toml", &file);
        Self {
            tokens: tokens.to_string_lossy().into_owned(),
            pki,
            replica,
            operator,
        }
    }

    /// The flags of a replica serving TLS, with client certificates when
    /// `client_ca`.
    fn flags(&self, client_ca: bool) -> Vec<String> {
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let mut flags = vec![
            "--tls-cert".to_string(),
            path(&self.replica.cert),
            "--tls-key".into(),
            path(&self.replica.key),
            "--auth-tokens".into(),
            self.tokens.clone(),
        ];
        if client_ca {
            flags.extend(["--tls-client-ca".to_string(), path(&self.pki.ca())]);
        }
        flags
    }

    /// How the harness checks a TLS replica's gRPC health.
    fn grpc(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.pki.ca_pem()))
            .identity(Identity::from_pem(
                &self.operator.cert_pem,
                &self.operator.key_pem,
            ))
    }

    /// An HTTPS client trusting the CA, presenting `identity` if given.
    fn https(&self, identity: Option<&Issued>) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.pki.ca_pem()) {
            roots.add(cert.expect("the CA's PEM")).expect("the CA");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots);
        let config = match identity {
            Some(issued) => {
                let chain = CertificateDer::pem_slice_iter(&issued.cert_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .expect("the certificate's PEM");
                let key = PrivateKeyDer::from_pem_slice(&issued.key_pem).expect("the key's PEM");
                builder
                    .with_client_auth_cert(chain, key)
                    .expect("a client certificate")
            }
            None => builder.with_no_client_auth(),
        };
        Arc::new(config)
    }
}

/// Starts replicas `r1`..`rN` serving TLS with `flags` and more.
async fn tls_replicas(
    backends: &Backends,
    certs: &Certs,
    count: usize,
    client_ca: bool,
    more: &[&str],
) -> Vec<ReplicaProcess> {
    let flags = certs.flags(client_ca);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend_from_slice(more);
    let mut replicas = Vec::new();
    for i in 1..=count {
        let id = format!("r{i}");
        replicas.push(backends.serve_tls(&id, &args, certs.grpc()).await);
    }
    replicas
}

/// Waits until every replica holds a liveness connection to each of its
/// peers, reading `/metrics` over TLS.
async fn wait_liveness_connected(replicas: &[ReplicaProcess], tls: &Arc<rustls::ClientConfig>) {
    let peers = (replicas.len() - 1) as f64;
    for replica in replicas {
        let admin = replica.admin_endpoint();
        wait_until(
            Duration::from_secs(15),
            "liveness connections over TLS",
            || {
                let (admin, tls) = (admin.clone(), Arc::clone(tls));
                async move {
                    let samples = scrape::metrics_tls(&admin, &tls).await;
                    scrape::sum(&samples, "drover_liveness_peers_connected", "") == peers
                }
            },
        )
        .await;
    }
}

/// `/liveness` over TLS with `tls`: the status and, for a 200, the first
/// line (the answer stays open, so it is read up to that line only).
async fn liveness(admin: &str, tls: &Arc<rustls::ClientConfig>) -> (u16, String) {
    let authority = admin.strip_prefix("https://").expect("an https:// URL");
    let stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
    let mut stream = connector.connect(name, stream).await.unwrap();
    let request = format!("GET /liveness HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&read).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
            // Chunked: the first line of the body is the chunk's size.
            let line = body.lines().find(|l| l.starts_with('{'));
            if status != 200 || line.is_some() {
                return (status, line.unwrap_or(body).to_string());
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let mut buffer = [0u8; 1024];
        let n = tokio::time::timeout(left, stream.read(&mut buffer))
            .await
            .expect("an answer within 5 s")
            .unwrap_or(0);
        if n == 0 {
            return (0, String::from_utf8_lossy(&read).into_owned());
        }
        read.extend_from_slice(&buffer[..n]);
    }
}

#[tokio::test]
async fn the_console_metrics_and_liveness_answer_over_tls() {
    let backends = Backends::start().await;
    let certs = Certs::new();
    let replicas = tls_replicas(&backends, &certs, 2, true, &[]).await;
    let admin = replicas[0].admin_endpoint();
    assert!(admin.starts_with("https://"), "{admin}");
    let anonymous = certs.https(None);

    // Peers hold their liveness connections over TLS, with their
    // certificates.
    wait_liveness_connected(&replicas, &anonymous).await;

    // The console and /metrics need no client certificate; the console's
    // API needs its token, over TLS.
    let get = |path, headers| scrape::fetch_tls(&admin, path, &anonymous, headers);
    let (status, page) = get("/ui/", &[]).await.unwrap();
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("app.js"));
    assert_eq!(get("/ui/api/fleet", &[]).await.unwrap().0, 401);
    let bearer = [("Authorization", "Bearer admin-token-3")];
    assert_eq!(get("/ui/api/fleet", &bearer).await.unwrap().0, 200);
    assert_eq!(get("/metrics", &[]).await.unwrap().0, 200);

    // /liveness is for peers: a client certificate the CA signed.
    let (status, body) = liveness(&admin, &anonymous).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("client certificate"), "{body}");
    let (status, line) = liveness(&admin, &certs.https(Some(&certs.operator))).await;
    assert_eq!(status, 200, "{line}");
    assert!(line.contains("\"replica\":\"r1\""), "{line}");

    // Plain HTTP to the TLS port: told, in plain words, to use https.
    let plain = admin.replace("https://", "http://");
    let (status, body) = scrape::fetch(&plain, "/metrics").await.unwrap();
    let body = String::from_utf8_lossy(&body);
    let https = format!("{admin}/metrics");
    assert_eq!(status, 400, "{body}");
    assert_eq!(body, format!("this admin port speaks TLS: use {https}\n"));
}

/// The TLS variant of replication.rs's fast crash detection: peers that
/// hold their liveness connections over mutual TLS see a kill -9 and
/// remove the member key long before its 30 s TTL (usually well under a
/// second; the bound is loose because a loaded host can delay a probe by
/// its timeout, and the figure is printed, not asserted).
#[tokio::test]
async fn peers_detect_a_kill_9_over_tls_long_before_the_ttl() {
    let backends = Backends::start().await;
    let certs = Certs::new();
    let mut replicas = tls_replicas(&backends, &certs, 3, true, &["--lease-ttl", "30"]).await;
    let tls = certs.https(None);
    wait_liveness_connected(&replicas, &tls).await;
    let store = backends.etcd.store().await;
    let member = "/drover/v1/members/r3";
    assert!(store.get(member).await.unwrap().into_single().is_some());

    replicas[2].kill9();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(5);
    while store.get(member).await.unwrap().into_single().is_some() {
        assert!(
            Instant::now() < deadline,
            "r3's member key still there after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let detected = killed.elapsed();
    eprintln!("kill -9 to the member key removed, over TLS: {detected:?} (TTL 30 s)");
    let (mut deposed, mut crashes) = (0.0, 0.0);
    for replica in &replicas[..2] {
        let samples = scrape::metrics_tls(&replica.admin_endpoint(), &tls).await;
        deposed += scrape::sum(&samples, "drover_peer_members_deposed_total", "");
        crashes += scrape::sum(&samples, "drover_peer_crashes_detected_total", "");
    }
    assert!(deposed >= 1.0, "a peer removed the member key");
    assert!(crashes >= 1.0, "a peer's probe saw the crash");
}

/// The console keeps a token to itself on a page served over plain HTTP
/// from a host other than loopback (`drover.test`, resolved to loopback by
/// Chromium alone), and sends it over HTTPS from that host, or over plain
/// HTTP from loopback.
#[tokio::test]
async fn the_console_sends_no_token_over_plain_http_off_loopback() {
    if !browser::available() {
        panic!("chromium is missing: run scripts/install-deps.sh");
    }
    let backends = Backends::start().await;
    let certs = Certs::new();
    let plain = backends
        .serve("p1", &["--auth-tokens", &certs.tokens])
        .await;
    let tls = tls_replicas(&backends, &certs, 1, false, &[]).await;
    let port = |url: String| url.rsplit(':').next().unwrap().to_string();
    let mut browser = Browser::start_with(&[
        "--host-resolver-rules=MAP drover.test 127.0.0.1",
        "--ignore-certificate-errors",
    ]);
    let mut seen = Vec::new();
    let sign_in = format!(
        "document.getElementById('token').value = '{ADMIN_TOKEN}'; \
         document.getElementById('login').requestSubmit(); true"
    );
    let error = "document.getElementById('login-error').textContent";
    let signed_in = "document.getElementById('login').hidden";
    let stored = "sessionStorage.getItem('drover.token')";

    // Plain HTTP, not loopback: refused, said why, and nothing kept.
    let exposed = format!("http://drover.test:{}/ui/", port(plain.admin_endpoint()));
    browser.navigate(&exposed);
    let shown = |v: &serde_json::Value| v.as_str().is_some_and(|t| t.contains("clear text"));
    until(
        &mut browser,
        error,
        Duration::from_secs(10),
        &mut seen,
        shown,
    )
    .await;
    browser.eval(&sign_in);
    until(
        &mut browser,
        error,
        Duration::from_secs(10),
        &mut seen,
        shown,
    )
    .await;
    assert_eq!(browser.eval(stored), serde_json::Value::Null);
    assert_eq!(browser.eval(signed_in), false);

    // The same replica on loopback, and a TLS one off it: signed in.
    let safe = [
        format!("{}/ui/", plain.admin_endpoint()),
        format!("https://drover.test:{}/ui/", port(tls[0].admin_endpoint())),
    ];
    for url in safe {
        browser.navigate(&url);
        let login = |v: &serde_json::Value| v == false;
        until(
            &mut browser,
            signed_in,
            Duration::from_secs(10),
            &mut seen,
            login,
        )
        .await;
        browser.eval(&sign_in);
        let done = |v: &serde_json::Value| v == true;
        until(
            &mut browser,
            signed_in,
            Duration::from_secs(10),
            &mut seen,
            done,
        )
        .await;
        assert_eq!(browser.eval(stored), ADMIN_TOKEN, "{url}");
    }
}
