//! TLS on the admin port, from the gRPC port's settings: `tls_cert` and
//! `tls_key` serve it, `tls_client_ca` asks for client certificates, and
//! the same certificate is this replica's client certificate towards its
//! peers' `/liveness`.
//!
//! # Guarantees
//! - The server side asks for a client certificate only with
//!   `tls_client_ca`, and never requires one at the handshake: a browser
//!   or a Prometheus without one still reaches the console and `/metrics`.
//!   Whether one was presented (and verified against `tls_client_ca`) is
//!   the connection's to tell; the admin port requires it for `/liveness`.
//! - Both sides speak HTTP/1.1 only (ALPN), as the admin port does.
//!
//! # Assumptions
//! - With `tls_client_ca`, the CA that signs the clients' certificates
//!   signs the replicas' too, each issued for server and client
//!   authentication (extended key usages `serverAuth` and `clientAuth`).
//!
//! # Caveats
//! - A peer's certificate is checked against `tls_client_ca` but not for
//!   its name: peers are reached at the address their member record names
//!   (a pod IP, say), which certificates rarely carry. Without
//!   `tls_client_ca` there is no CA to check it against: the connection is
//!   encrypted, the peer unauthenticated. Either way a forged liveness
//!   answer can at worst have a lease revoked early or left to its TTL,
//!   both safe (every owner write is fenced), and the prober sends no
//!   secret.

use super::ServerTls;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};
use std::sync::{Arc, OnceLock};

/// Why the admin port's TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum AdminTlsError {
    #[error("no PEM certificate in tls_cert: {0}")]
    Certificate(String),
    #[error("no PEM private key in tls_key: {0}")]
    Key(String),
    #[error("no usable PEM CA certificate in tls_client_ca: {0}")]
    ClientCa(String),
    #[error("{0}")]
    Tls(#[from] rustls::Error),
}

/// The admin port's TLS, both sides.
#[derive(Debug, Clone)]
pub struct AdminTls {
    /// What the admin port serves.
    pub server: Arc<ServerConfig>,
    /// How this replica reaches its peers' admin ports.
    pub peers: Arc<ClientConfig>,
    /// Client certificates are asked for (`tls_client_ca`), so `/liveness`
    /// can require one.
    pub client_certificates: bool,
}

const HTTP1: &[u8] = b"http/1.1";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl AdminTls {
    /// Both sides from the gRPC port's settings.
    pub fn new(tls: &ServerTls) -> Result<Self, AdminTlsError> {
        let certs = || {
            CertificateDer::pem_slice_iter(&tls.cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| AdminTlsError::Certificate(e.to_string()))
        };
        let key = || {
            PrivateKeyDer::from_pem_slice(tls.key_pem.expose())
                .map_err(|e| AdminTlsError::Key(e.to_string()))
        };
        let roots = tls.client_ca_pem.as_deref().map(roots).transpose()?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let mut server = match &roots {
            Some(roots) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::clone(roots),
                    provider(),
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| AdminTlsError::ClientCa(e.to_string()))?;
                server.with_client_cert_verifier(verifier)
            }
            None => server.with_no_client_auth(),
        }
        .with_single_cert(certs()?, key()?)?;
        server.alpn_protocols = vec![HTTP1.to_vec()];
        let verifier = PeerVerifier::new(roots)?;
        let peers = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_auth_cert(certs()?, key()?)?;
        Ok(Self {
            server: Arc::new(server),
            peers: Arc::new(with_http1(peers)),
            client_certificates: tls.client_ca_pem.is_some(),
        })
    }
}

/// How a replica without TLS of its own reaches a peer's TLS admin port
/// (replicas configured apart, or half-way through turning TLS on): no
/// client certificate, the peer unauthenticated.
pub fn anonymous_peers() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(anonymous))
}

fn anonymous() -> Arc<ClientConfig> {
    let verifier = PeerVerifier::new(None).expect("no roots, nothing to fail");
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Arc::new(with_http1(config))
}

fn with_http1(mut config: ClientConfig) -> ClientConfig {
    config.alpn_protocols = vec![HTTP1.to_vec()];
    config
}

fn roots(pem: &[u8]) -> Result<Arc<RootCertStore>, AdminTlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| AdminTlsError::ClientCa(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| AdminTlsError::ClientCa(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(AdminTlsError::ClientCa("no certificate".into()));
    }
    Ok(Arc::new(roots))
}

/// Checks a peer's certificate chain against `tls_client_ca` when there is
/// one, never its name (see the module's caveats); the handshake's
/// signatures are always checked.
#[derive(Debug)]
struct PeerVerifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl PeerVerifier {
    fn new(roots: Option<Arc<RootCertStore>>) -> Result<Self, AdminTlsError> {
        let provider = provider();
        let chain = roots
            .map(|roots| {
                WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                    .build()
                    .map_err(|e| AdminTlsError::ClientCa(e.to_string()))
            })
            .transpose()?;
        Ok(Self { chain, provider })
    }
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
