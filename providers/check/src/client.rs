//! The link to the provider under test: the channel (plain, or TLS with a
//! CA of the caller's choosing), the bearer token, and requests shaped as
//! Drover sends them (a gRPC deadline plus `drover-apply-by`).

use drover_proto::provider::v1::provider_client::ProviderClient;
use drover_proto::provider::v1::simulator_client::SimulatorClient;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

/// The metadata key of a call's deadline as wall-clock time, milliseconds
/// since the Unix epoch (see provider.proto, "Deadlines").
pub use drover_proto::provider::deadline::APPLY_BY;

/// A client of the provider under test.
pub type Provider = ProviderClient<InterceptedService<Channel, Bearer>>;
/// A client of the simulator's control service (the optional extra).
pub type Simulator = SimulatorClient<InterceptedService<Channel, Bearer>>;

/// Why the kit could not set up its link to the provider.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("--provider {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the token file holds no usable bearer token (empty, or not printable ASCII)")]
    Token,
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        source: tonic::transport::Error,
    },
}

/// Adds `authorization: Bearer TOKEN` to every call when a token is set.
#[derive(Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The connected provider, and the per-call deadline the kit gives it.
#[derive(Clone)]
pub struct Link {
    channel: Channel,
    bearer: Bearer,
    /// The deadline of every call (its gRPC deadline and `drover-apply-by`).
    pub call_timeout: Duration,
}

impl Link {
    /// Connects to `url`; `ca_cert` (PEM) turns on TLS verified against it,
    /// `token_file` holds a bearer token (surrounding whitespace ignored).
    pub async fn connect(
        url: &str,
        ca_cert: Option<&Path>,
        token_file: Option<&Path>,
        call_timeout: Duration,
    ) -> Result<Self, LinkError> {
        let bad_url = |reason: String| LinkError::Url {
            url: url.to_string(),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| bad_url(e.to_string()))?
            .connect_timeout(call_timeout);
        if let Some(path) = ca_cert {
            let pem = read(path)?;
            let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| bad_url(e.to_string()))?;
        }
        let bearer = match token_file {
            Some(path) => {
                let text = String::from_utf8(read(path)?).map_err(|_| LinkError::Token)?;
                let value = format!("Bearer {}", text.trim());
                if text.trim().is_empty() {
                    return Err(LinkError::Token);
                }
                Bearer(Some(value.parse().map_err(|_| LinkError::Token)?))
            }
            None => Bearer(None),
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| LinkError::Connect {
                url: url.to_string(),
                source,
            })?;
        Ok(Self {
            channel,
            bearer,
            call_timeout,
        })
    }

    pub fn provider(&self) -> Provider {
        ProviderClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    pub fn simulator(&self) -> Simulator {
        SimulatorClient::with_interceptor(self.channel.clone(), self.bearer.clone())
    }

    /// `message` due in one call timeout, as Drover sends a fenced call.
    pub fn due<T>(&self, message: T) -> Request<T> {
        let apply_by = now_ms() + self.call_timeout.as_millis() as u64;
        with_deadlines(message, self.call_timeout, apply_by)
    }

    /// `message` due in `window`, shorter than a call timeout: the kit's
    /// way of cutting a call whose work takes longer.
    pub fn due_in<T>(&self, message: T, window: Duration) -> Request<T> {
        with_deadlines(message, window, now_ms() + window.as_millis() as u64)
    }

    /// `message` whose `drover-apply-by` passed a second ago, while its gRPC
    /// deadline is still a whole call timeout away: a provider must go by
    /// the earlier of the two and apply nothing.
    pub fn past_due<T>(&self, message: T) -> Request<T> {
        with_deadlines(message, self.call_timeout, now_ms().saturating_sub(1_000))
    }
}

fn with_deadlines<T>(message: T, timeout: Duration, apply_by_ms: u64) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    if let Ok(value) = apply_by_ms.to_string().parse() {
        request.metadata_mut().insert(APPLY_BY, value);
    }
    request
}

fn read(path: &Path) -> Result<Vec<u8>, LinkError> {
    std::fs::read(path).map_err(|source| LinkError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
