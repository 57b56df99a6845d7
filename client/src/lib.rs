//! Rust client for Drover.
//!
//! ```no_run
//! # async fn example() -> Result<(), drover_client::ClientError> {
//! let mut drover = drover_client::Client::connect("http://127.0.0.1:7070").await?;
//! let clusters = drover.list_clusters(Default::default()).await?;
//! for cluster in clusters.clusters {
//!     println!("{}", cluster.name);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The generated messages are re-exported as [`v1`].
//!
//! Over TLS with a bearer token (a replica started with `--tls-cert` and
//! `--auth-tokens`):
//!
//! ```no_run
//! # async fn example() -> Result<(), drover_client::ClientError> {
//! use drover_client::{Client, ConnectOptions, Tls};
//! let options = ConnectOptions {
//!     token: Some(std::env::var("DROVER_TOKEN").unwrap_or_default()),
//!     tls: Some(Tls {
//!         ca_pem: std::fs::read("ca.pem").unwrap(),
//!         identity: None,
//!         domain: None,
//!     }),
//!     ..Default::default()
//! };
//! let mut drover = Client::connect_with("https://drover.example:7070", &options).await?;
//! let cluster = drover.get_cluster("web").await?;
//! # Ok(())
//! # }
//! ```

pub use drover_proto::v1;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use v1::admin_client::AdminClient;
use v1::clusters_client::ClustersClient;
use v1::operations_client::OperationsClient;
use v1::rollouts_client::RolloutsClient;
use v1::tasks_client::TasksClient;

/// The channel every generated client uses: the connection plus the
/// caller's credentials on each request.
pub type Transport = InterceptedService<Channel, Credentials>;

/// Adds `authorization: Bearer <token>` and a `traceparent` to every
/// request, each when set.
#[derive(Clone, Default)]
pub struct Credentials {
    bearer: Option<MetadataValue<Ascii>>,
    traceparent: Option<MetadataValue<Ascii>>,
}

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(bearer) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        if let Some(traceparent) = &self.traceparent {
            let metadata = request.metadata_mut();
            metadata.insert("traceparent", traceparent.clone());
        }
        Ok(request)
    }
}

/// TLS towards the replicas.
#[derive(Clone, Default)]
pub struct Tls {
    /// PEM CA that signed the replicas' certificates.
    pub ca_pem: Vec<u8>,
    /// PEM client certificate and key, for replicas that require them.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify in the certificate; default: the URL's host.
    pub domain: Option<String>,
}

/// How to reach replicas: TLS and a bearer token, both optional.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    pub tls: Option<Tls>,
    pub token: Option<String>,
    /// A W3C `traceparent` sent with every request (see [`new_traceparent`]):
    /// the replicas' spans of what the requests start are its children.
    pub traceparent: Option<String>,
}

/// How long connecting to one endpoint may take (TCP and TLS): ample on a
/// network that works, and an address that never answers is reported in
/// seconds instead of after the operating system's minutes.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

impl ConnectOptions {
    fn endpoint(&self, url: &str) -> Result<Endpoint, ClientError> {
        // Without a scheme the URL parses (as host:port) and only the
        // connection fails, with a bare "transport error".
        if !url.contains("://") {
            return Err(ClientError::Status(tonic::Status::invalid_argument(
                format!("{url:?} has no scheme: write http://{url} (https://{url} for TLS)"),
            )));
        }
        let endpoint = Channel::from_shared(url.to_string())
            .map_err(|_| {
                ClientError::Status(tonic::Status::invalid_argument(format!(
                    "{url:?} is not a URL"
                )))
            })?
            .connect_timeout(CONNECT_TIMEOUT);
        let Some(tls) = &self.tls else {
            return Ok(endpoint);
        };
        // tonic speaks TLS only to https:// URLs: an http:// one would send
        // the token in the clear, certificates given or not.
        if !url.starts_with("https://") {
            return Err(ClientError::Status(tonic::Status::invalid_argument(
                format!("{url:?}: TLS options need an https:// URL"),
            )));
        }
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &tls.domain {
            config = config.domain_name(domain.clone());
        }
        endpoint
            .tls_config(config)
            .map_err(|source| ClientError::Connect {
                endpoint: url.to_string(),
                source,
            })
    }

    fn credentials(&self) -> Result<Credentials, ClientError> {
        let bearer = self
            .token
            .as_ref()
            .filter(|token| !token.is_empty())
            .map(|token| {
                format!("Bearer {token}").parse().map_err(|_| {
                    ClientError::Status(tonic::Status::invalid_argument(
                        "the token contains characters not allowed in a header",
                    ))
                })
            })
            .transpose()?;
        let traceparent = match &self.traceparent {
            Some(value) => Some(value.parse().map_err(|_| {
                ClientError::Status(tonic::Status::invalid_argument(
                    "the traceparent contains characters not allowed in a header",
                ))
            })?),
            None => None,
        };
        Ok(Credentials {
            bearer,
            traceparent,
        })
    }
}

/// A new W3C trace context (`00-<trace id>-<span id>-01`, sampled) for
/// [`ConnectOptions::traceparent`]: a fresh trace whose id
/// [`trace_id_of`] reads back.
pub fn new_traceparent() -> String {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let span = uuid::Uuid::new_v4().simple().to_string();
    format!("00-{trace}-{}-01", &span[..16])
}

/// The trace id (32 hex digits) of a `traceparent`.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    traceparent.split('-').nth(1)
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {endpoint}: {}", explain_connect(.endpoint, .source))]
    Connect {
        endpoint: String,
        source: tonic::transport::Error,
    },
    /// A plaintext (`http://`) endpoint where the replica speaks TLS: the
    /// connection is made, and the first call breaks off.
    #[error("cannot connect to {endpoint}: the replica speaks TLS: use https:// and --ca-cert")]
    SpeaksTls { endpoint: String },
    /// No endpoint could be connected to: why, for each, in order.
    #[error("no replica answered: {}", join(.0))]
    Unreachable(Vec<ClientError>),
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    #[error("operation {id} ended {state}: {message}")]
    OperationFailed {
        id: String,
        state: String,
        message: String,
    },
    #[error("operation {id} is still {state} after {waited:?}")]
    StillRunning {
        id: String,
        state: String,
        waited: std::time::Duration,
    },
}

impl ClientError {
    /// Whether the same call may succeed later: [unavailable](Self::is_unavailable),
    /// or ABORTED for a lost race or a busy cluster (not for an
    /// `expected_generation` that is not the cluster's: only a new read can
    /// fix that).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Status(status) if status.code() == tonic::Code::Aborted => {
                let reason = status.metadata().get(drover_proto::REASON_METADATA);
                reason.is_none_or(|r| r != drover_proto::REASON_GENERATION_MISMATCH)
            }
            _ => self.is_unavailable(),
        }
    }

    /// Whether no replica could answer: UNAVAILABLE, no connection, or a
    /// connection that broke during the call. The request may have been
    /// carried out all the same.
    pub fn is_unavailable(&self) -> bool {
        match self {
            ClientError::Connect { .. }
            | ClientError::SpeaksTls { .. }
            | ClientError::Unreachable(_) => true,
            ClientError::Status(status) => match status.code() {
                tonic::Code::Unavailable => true,
                // A connection that broke mid-call (the replica died).
                tonic::Code::Unknown => std::error::Error::source(status)
                    .is_some_and(|source| source.is::<tonic::transport::Error>()),
                _ => false,
            },
            ClientError::OperationFailed { .. } | ClientError::StillRunning { .. } => false,
        }
    }
}

fn join(errors: &[ClientError]) -> String {
    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
    errors.join("; ")
}

/// Why connecting to `endpoint` failed, in words, with the likely fix.
/// The causes are recognised by their text: the TLS library's error types
/// are not part of tonic's API.
fn explain_connect(endpoint: &str, error: &tonic::transport::Error) -> String {
    let mut causes = Vec::new();
    let mut refused = false;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        let io_kind = error.downcast_ref::<std::io::Error>().map(|e| e.kind());
        refused |= io_kind == Some(std::io::ErrorKind::ConnectionRefused);
        causes.push(error.to_string());
        cause = error.source();
    }
    let text = causes.join(": ");
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if refused {
        "connection refused: no replica listens there (check the address and port)".into()
    } else if has(&["timed out", "Elapsed", "elapsed"]) {
        format!("no answer within {CONNECT_TIMEOUT:?} (a wrong address, or a firewall in the way?)")
    } else if has(&["InvalidContentType", "corrupt message"]) {
        let plain = endpoint.replacen("https://", "http://", 1);
        format!("the replica does not speak TLS there: use {plain}")
    } else if has(&["UnknownIssuer", "BadSignature"]) {
        "the replica's certificate is not signed by the CA given (--ca-cert): give the CA that signed it".into()
    } else if has(&["NotValidForName"]) {
        "the replica's certificate does not name this host: connect by a name it carries".into()
    } else if has(&["CertificateRequired", "certificate required"]) {
        "the replica requires a client certificate (--cert and --key)".into()
    } else {
        // The innermost cause is the most specific one.
        causes.last().cloned().unwrap_or_default()
    }
}

/// Whether a failed call may be a plaintext connection to a TLS server:
/// tonic reports the connection the server broke off as CANCELLED, or, when
/// the server's TLS alert arrived first, as an HTTP/2 protocol error
/// (INTERNAL); either way a status made on this side, with a source, not
/// one the server sent.
pub fn may_be_plaintext_to_tls(error: &ClientError) -> bool {
    match error {
        ClientError::Status(status) => match status.code() {
            tonic::Code::Cancelled => true,
            tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Internal => {
                std::error::Error::source(status).is_some()
            }
            _ => false,
        },
        _ => false,
    }
}

/// Whether the server at the `http://` URL `url` speaks TLS: sent the
/// HTTP/2 preface, a TLS server answers with a TLS alert record (content
/// type 21, version 3.x) where an HTTP/2 server answers with its settings.
/// Bounded by [`CONNECT_TIMEOUT`]; anything else (no answer, a closed
/// connection) is not taken for TLS.
pub async fn speaks_tls(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let Some(authority) = url
        .strip_prefix("http://")
        .map(|rest| rest.split('/').next().unwrap_or(rest).to_string())
    else {
        return false;
    };
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await.ok()?;
        stream.write_all(PREFACE).await.ok()?;
        let mut header = [0u8; 2];
        stream.read_exact(&mut header).await.ok()?;
        Some(header)
    };
    let answer = tokio::time::timeout(CONNECT_TIMEOUT, probe).await;
    matches!(answer, Ok(Some([21, 3])))
}

/// A connection to Drover replicas.
#[derive(Clone)]
pub struct Client {
    clusters: ClustersClient<Transport>,
    operations: OperationsClient<Transport>,
    tasks: TasksClient<Transport>,
    rollouts: RolloutsClient<Transport>,
    admin: AdminClient<Transport>,
}

impl Client {
    /// Connects to several replicas at once: requests are spread over the
    /// endpoints that answer, and a replica that goes away is skipped. The
    /// connections are made lazily, so this only checks the URLs.
    pub fn connect_many(endpoints: &[String]) -> Result<Self, ClientError> {
        Self::connect_many_with(endpoints, &ConnectOptions::default())
    }

    /// [`Client::connect_many`] with TLS and/or a bearer token.
    pub fn connect_many_with(
        endpoints: &[String],
        options: &ConnectOptions,
    ) -> Result<Self, ClientError> {
        let endpoints = endpoints
            .iter()
            .map(|url| options.endpoint(url))
            .collect::<Result<Vec<_>, _>>()?;
        let channel = Channel::balance_list(endpoints.into_iter());
        Ok(Self::over(channel, options.credentials()?))
    }

    /// Connects to the first of `endpoints` that answers, trying them in
    /// order, then (with several) spreads requests over all of them as
    /// [`Client::connect_many_with`] does. Unlike that lazy call, this one
    /// finds out at once when no replica answers, and says why for each
    /// endpoint ([`ClientError::Unreachable`]; with one endpoint, its
    /// [`ClientError::Connect`]).
    pub async fn connect_first_with(
        endpoints: &[String],
        options: &ConnectOptions,
    ) -> Result<Self, ClientError> {
        for url in endpoints {
            options.endpoint(url)?;
        }
        let mut failures = Vec::new();
        for url in endpoints {
            match Self::connect_with(url, options).await {
                Ok(client) if endpoints.len() == 1 => return Ok(client),
                Ok(_) => return Self::connect_many_with(endpoints, options),
                Err(error) if error.is_unavailable() => failures.push(error),
                Err(error) => return Err(error),
            }
        }
        match failures.len() {
            1 => Err(failures.remove(0)),
            _ => Err(ClientError::Unreachable(failures)),
        }
    }

    /// Runs `call` until it succeeds or fails with something that is not
    /// [retryable](ClientError::is_retryable), backing off exponentially with jitter from 50 ms to
    /// 2 s, at most 10 times.
    ///
    /// Retrying an UNAVAILABLE lifecycle request is only safe with a
    /// `request_id`: the first attempt may have been accepted.
    ///
    /// ```no_run
    /// # async fn example(drover: drover_client::Client) -> Result<(), drover_client::ClientError> {
    /// use drover_client::v1;
    /// let op = drover
    ///     .retrying(|mut c| async move {
    ///         let request = v1::StopClusterRequest {
    ///             name: "web".into(),
    ///             request_id: "stop-web-1".into(),
    ///             ..Default::default()
    ///         };
    ///         Ok(c.clusters().stop_cluster(request).await?.into_inner())
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn retrying<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        self.retrying_when(call, ClientError::is_retryable).await
    }

    /// [`Client::retrying`] for UNAVAILABLE and broken connections only: a
    /// busy cluster or a lost race is answered at once (what a person at a
    /// terminal wants to know).
    pub async fn retrying_unavailable<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        self.retrying_when(call, ClientError::is_unavailable).await
    }

    async fn retrying_when<T, F, Fut>(
        &self,
        mut call: F,
        retry: fn(&ClientError) -> bool,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        use backon::{ExponentialBuilder, Retryable};
        let backoff = ExponentialBuilder::default()
            .with_min_delay(std::time::Duration::from_millis(50))
            .with_max_delay(std::time::Duration::from_secs(2))
            .with_max_times(10)
            .with_jitter();
        (|| call(self.clone())).retry(backoff).when(retry).await
    }

    /// Connects to a replica's gRPC endpoint, e.g. `http://127.0.0.1:7070`.
    pub async fn connect(endpoint: &str) -> Result<Self, ClientError> {
        Self::connect_with(endpoint, &ConnectOptions::default()).await
    }

    /// Connects to one replica with TLS and/or a bearer token
    /// (`https://` URLs for TLS).
    pub async fn connect_with(
        endpoint: &str,
        options: &ConnectOptions,
    ) -> Result<Self, ClientError> {
        let channel = options
            .endpoint(endpoint)?
            .connect()
            .await
            .map_err(|source| ClientError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(Self::over(channel, options.credentials()?))
    }

    fn over(channel: Channel, credentials: Credentials) -> Self {
        let transport = InterceptedService::new(channel, credentials);
        Self {
            clusters: ClustersClient::new(transport.clone()),
            operations: OperationsClient::new(transport.clone()),
            tasks: TasksClient::new(transport.clone()),
            rollouts: RolloutsClient::new(transport.clone()),
            admin: AdminClient::new(transport),
        }
    }

    /// The generated Clusters client, for every lifecycle RPC.
    pub fn clusters(&mut self) -> &mut ClustersClient<Transport> {
        &mut self.clusters
    }

    /// The generated Operations client.
    pub fn operations(&mut self) -> &mut OperationsClient<Transport> {
        &mut self.operations
    }

    /// The generated Tasks client: scheduled repair and backup tasks.
    ///
    /// ```no_run
    /// # async fn example(mut drover: drover_client::Client) -> Result<(), drover_client::ClientError> {
    /// use drover_client::v1;
    /// let task = v1::TaskSpec {
    ///     r#type: v1::TaskType::Repair as i32,
    ///     name: "nightly".into(),
    ///     schedule: Some(v1::TaskSchedule { cron: "0 3 * * *".into(), ..Default::default() }),
    ///     properties: None,
    /// };
    /// let request = v1::PutTaskRequest { cluster: "web".into(), task: Some(task) };
    /// let put = drover.tasks().put_task(request).await?.into_inner();
    /// println!("{:?}", put.status);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tasks(&mut self) -> &mut TasksClient<Transport> {
        &mut self.tasks
    }

    /// The generated Rollouts client: changes carried across many clusters
    /// in stages.
    pub fn rollouts(&mut self) -> &mut RolloutsClient<Transport> {
        &mut self.rollouts
    }

    /// The generated Admin client: members and owners (admin role).
    pub fn admin(&mut self) -> &mut AdminClient<Transport> {
        &mut self.admin
    }

    /// Waits until the operation is terminal or `timeout` passes and returns
    /// it as last seen (check its `state`).
    ///
    /// Waiting is idempotent, so a replica that goes away meanwhile is
    /// retried (the next call may reach another endpoint) until `timeout`;
    /// a replica that stops answering without closing the connection does
    /// not hold the caller past it either. Waits longer than the server's
    /// limit of an hour are made of several calls.
    pub async fn wait_operation(
        &mut self,
        operation: &v1::Operation,
        timeout: std::time::Duration,
    ) -> Result<v1::Operation, ClientError> {
        use std::time::Duration;
        const LONGEST_CALL: Duration = Duration::from_secs(3600);
        const SLACK: Duration = Duration::from_secs(5);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = operation.clone();
        let mut backoff = {
            use backon::BackoffBuilder;
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(2))
                .without_max_times()
                .build()
        };
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let call = left.clamp(Duration::from_millis(1), LONGEST_CALL);
            let request = v1::WaitOperationRequest {
                cluster: operation.cluster.clone(),
                id: operation.id.clone(),
                timeout_ms: call.as_millis() as u64,
            };
            let answer =
                tokio::time::timeout(call + SLACK, self.operations.wait_operation(request)).await;
            let out_of_time = tokio::time::Instant::now() >= deadline;
            match answer {
                Ok(Ok(reply)) => {
                    last = reply.into_inner();
                    let terminal = last.state >= v1::OperationState::Succeeded as i32;
                    if terminal || out_of_time {
                        return Ok(last);
                    }
                }
                Ok(Err(status)) => {
                    let error = ClientError::from(status);
                    if !error.is_retryable() || out_of_time {
                        return Err(error);
                    }
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let wait = backoff.next().unwrap_or(Duration::from_secs(2));
                    tokio::time::sleep(wait.min(left)).await;
                }
                // No answer at all (the replica went silent).
                Err(_) if out_of_time => return Ok(last),
                Err(_) => {}
            }
        }
    }

    pub async fn create_cluster(
        &mut self,
        request: v1::CreateClusterRequest,
    ) -> Result<v1::CreateClusterResponse, ClientError> {
        Ok(self.clusters.create_cluster(request).await?.into_inner())
    }

    /// Reads a cluster linearizably: every write acknowledged before the
    /// call is visible. (Set `linearizable: false` on the raw request to read
    /// the replica's watch cache instead.)
    pub async fn get_cluster(&mut self, name: &str) -> Result<v1::Cluster, ClientError> {
        let request = v1::GetClusterRequest {
            name: name.to_string(),
            linearizable: true,
        };
        Ok(self.clusters.get_cluster(request).await?.into_inner())
    }

    pub async fn list_clusters(
        &mut self,
        request: v1::ListClustersRequest,
    ) -> Result<v1::ListClustersResponse, ClientError> {
        Ok(self.clusters.list_clusters(request).await?.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_mismatch_is_not_retried_but_a_lost_race_is() {
        let mut mismatch = tonic::Status::aborted("cluster web is at generation 3, not 2");
        mismatch.metadata_mut().insert(
            drover_proto::REASON_METADATA,
            tonic::metadata::MetadataValue::from_static(drover_proto::REASON_GENERATION_MISMATCH),
        );
        let mismatch = ClientError::Status(mismatch);
        assert!(!mismatch.is_retryable());
        assert!(!mismatch.is_unavailable());
        let raced = ClientError::Status(tonic::Status::aborted("lost a race; retry"));
        assert!(raced.is_retryable());
        assert!(!raced.is_unavailable());
        let down = ClientError::Status(tonic::Status::unavailable("etcd unreachable"));
        assert!(down.is_retryable());
        assert!(down.is_unavailable());
    }
}
