//! The provider: the plugin that does the real work on nodes, reached over
//! drover.provider.v1, and Drover's simulated implementation of it.
//!
//! A replica may reach several providers, each by name; [`Providers`] is
//! where every call for a cluster finds the client of that cluster's
//! provider (`spec.provider`, empty meaning the default one).
//!
//! # Guarantees
//! - Every call through a [`Provider`] of a link with a token carries
//!   `authorization: Bearer <token>`.
//! - A cluster naming a provider this replica is not configured with gets
//!   [`UnknownProvider`], naming it, from [`Providers::for_cluster`]: its
//!   calls fail with that message, nothing goes to another provider.
//!
//! # Assumptions
//! - Replicas of one deployment are configured with the same providers; a
//!   replica without a cluster's provider fails that cluster's operations
//!   rather than guessing.

pub mod sim;

use crate::cluster::Spec;
use crate::config::{ProviderLink, ProviderLinks, Secret};
use drover_proto::provider::v1::provider_client::ProviderClient;
use drover_proto::provider::v1::ProviderNode;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// How long a look at a cluster's nodes (DescribeCluster) may take outside
/// an operation's own deadline: the status scan, and the fencing look of an
/// orphan's recovery. A provider that hangs must not stall either.
pub const DESCRIBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A client of a provider endpoint; cheap to clone.
pub type Provider = ProviderClient<InterceptedService<Channel, Bearer>>;

/// Puts the link's bearer token (if any) on every call.
#[derive(Clone)]
pub struct Bearer(Option<Secret<MetadataValue<Ascii>>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.expose().clone());
        }
        Ok(request)
    }
}

/// A lazily connecting client without TLS or token: the provider may
/// start after the replica.
pub fn connect_lazy(endpoint: &str) -> Result<Provider, tonic::codegen::http::uri::InvalidUri> {
    let channel = Channel::from_shared(endpoint.to_string())?.connect_lazy();
    Ok(ProviderClient::with_interceptor(channel, Bearer(None)))
}

/// A cluster names a provider this replica does not reach.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the cluster's provider {name:?} is not configured on this replica (it has: {known})")]
pub struct UnknownProvider {
    pub name: String,
    /// The configured names, comma-separated.
    pub known: String,
}

impl From<UnknownProvider> for tonic::Status {
    /// Not transient: asking again changes nothing until the replica is
    /// configured with the provider.
    fn from(error: UnknownProvider) -> Self {
        tonic::Status::failed_precondition(error.to_string())
    }
}

/// One configured provider.
pub struct Link {
    pub name: String,
    pub endpoint: String,
    pub tls: bool,
    pub client_certificate: bool,
    pub bearer_token: bool,
    client: Provider,
}

impl Link {
    /// Its client (cheap to clone).
    pub fn client(&self) -> Provider {
        self.client.clone()
    }
}

/// Every provider a replica reaches, by name, and the default one: the
/// registry every provider call goes through.
pub struct Providers {
    /// In name order.
    links: Vec<Link>,
    /// Index of the default one in `links`.
    default: usize,
}

impl Providers {
    /// Lazily connecting clients of every configured provider (they may
    /// start after the replica).
    pub fn connect(config: &ProviderLinks) -> Result<Self, String> {
        let links = config
            .links
            .iter()
            .map(|link| Self::link(link).map_err(|e| format!("provider {}: {e}", link.name)))
            .collect::<Result<Vec<_>, _>>()?;
        for link in links.iter().filter(|l| l.bearer_token && !l.tls) {
            tracing::warn!(provider = %link.name, "the bearer token goes over http:// in the clear");
        }
        let default = links
            .iter()
            .position(|l| l.name == config.default)
            .ok_or_else(|| {
                format!(
                    "the default provider {:?} is not configured",
                    config.default
                )
            })?;
        Ok(Self { links, default })
    }

    fn link(link: &ProviderLink) -> Result<Link, String> {
        let channel = link.transport()?.connect_lazy();
        let token = link
            .token
            .as_ref()
            .map(|t| format!("Bearer {}", t.expose()).parse::<MetadataValue<Ascii>>())
            .transpose()
            .map_err(|e| format!("the token is not a header value: {e}"))?;
        Ok(Link {
            name: link.name.clone(),
            endpoint: link.endpoint.clone(),
            tls: link.tls(),
            client_certificate: link.identity.is_some(),
            bearer_token: token.is_some(),
            client: ProviderClient::with_interceptor(channel, Bearer(token.map(Secret::new))),
        })
    }

    /// One provider, the default (embedded mode, tests).
    pub fn single(name: &str, endpoint: &str, client: Provider) -> Self {
        Self {
            links: vec![Link {
                name: name.to_string(),
                endpoint: endpoint.to_string(),
                tls: false,
                client_certificate: false,
                bearer_token: false,
                client,
            }],
            default: 0,
        }
    }

    /// The default provider's name (what an empty `spec.provider` means).
    pub fn default_name(&self) -> &str {
        &self.links[self.default].name
    }

    /// The provider named `name` (empty: the default).
    pub fn named(&self, name: &str) -> Result<&Link, UnknownProvider> {
        if name.is_empty() {
            return Ok(&self.links[self.default]);
        }
        self.links
            .iter()
            .find(|l| l.name == name)
            .ok_or_else(|| UnknownProvider {
                name: name.to_string(),
                known: self.names(),
            })
    }

    /// The client of the provider of a cluster with `spec`.
    pub fn for_cluster(&self, spec: &Spec) -> Result<Provider, UnknownProvider> {
        self.named(&spec.provider).map(Link::client)
    }

    /// Every provider, in name order.
    pub fn links(&self) -> impl Iterator<Item = (&Link, bool)> {
        self.links
            .iter()
            .enumerate()
            .map(|(i, l)| (l, i == self.default))
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.links.iter().map(|l| l.name.as_str()).collect();
        names.join(", ")
    }
}

/// The client span of one call to a provider (`call`: its RPC's name).
pub fn call_span(call: &str) -> tracing::Span {
    tracing::info_span!(
        "provider",
        otel.name = call,
        otel.kind = "client",
        rpc.system = "grpc",
        rpc.service = "drover.provider.v1.Provider",
    )
}

/// `message` as a request due by `deadline` (the end of the caller's claim,
/// see `Ownership::claim_deadline`): it carries the time left as its gRPC
/// deadline (`grpc-timeout`), which the client enforces (the call ends with
/// CANCELLED once it passes) and the provider learns, so that a call made
/// under a claim is never applied after a peer could have taken over.
///
/// The same deadline also travels as wall-clock time, [`APPLY_BY`]
/// (milliseconds since the Unix epoch): `grpc-timeout` is time left, and the
/// provider's clock for it starts when the call arrives, so a caller paused
/// between making the call and sending it (SIGSTOP, a long GC pause) would
/// hand the provider a deadline past the end of its claim. A provider whose
/// clock is synchronised applies nothing after `drover-apply-by`.
///
/// It also carries the current span's `traceparent` (see [`call_span`]),
/// so the provider's spans continue the operation's trace.
pub fn due_by<T>(deadline: std::time::Instant, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    drover_telemetry::inject(request.metadata_mut());
    // A deadline already past still goes out as the shortest one, for the
    // client to end at once.
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    request.set_timeout(left.max(std::time::Duration::from_millis(1)));
    let apply_by = std::time::SystemTime::now() + left;
    let millis = apply_by
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    if let Ok(value) = millis.to_string().parse() {
        request.metadata_mut().insert(APPLY_BY, value);
    }
    request
}

/// The metadata key of a provider call's deadline as wall-clock time (see
/// [`due_by`]).
pub use drover_proto::provider::deadline::APPLY_BY;

/// A node that is powered on and reports healthy.
pub fn node_ready(node: &ProviderNode) -> bool {
    node.healthy && node.power_state == "on"
}

/// What a cluster's status says of `node`, as the provider showed it.
pub fn node_status(node: &ProviderNode) -> crate::cluster::NodeStatus {
    crate::cluster::NodeStatus {
        id: node.id.clone(),
        role: node.role.clone(),
        power_state: node.power_state.clone(),
        version: node.version.clone(),
        ready: node_ready(node),
        facts: node.facts.clone().into_iter().collect(),
        not_ready_since: None,
        never_ready: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_proto::provider::v1 as pb;
    use std::time::{Duration, Instant};

    fn registry() -> Providers {
        let links = ProviderLinks {
            links: ["pg", "sim"]
                .iter()
                .map(|name| ProviderLink {
                    name: name.to_string(),
                    endpoint: "http://127.0.0.1:1".into(),
                    ca_pem: None,
                    identity: None,
                    token: None,
                })
                .collect(),
            default: "sim".into(),
        };
        Providers::connect(&links).unwrap()
    }

    #[tokio::test]
    async fn a_cluster_finds_its_provider_the_default_or_an_error_naming_it() {
        let providers = registry();
        assert_eq!(providers.default_name(), "sim");
        let spec = |provider: &str| Spec {
            provider: provider.into(),
            ..Spec::default()
        };
        assert_eq!(
            providers.named("").unwrap().name,
            "sim",
            "empty: the default"
        );
        assert_eq!(providers.named("pg").unwrap().name, "pg");
        assert!(providers.for_cluster(&spec("pg")).is_ok());
        let unknown = providers.for_cluster(&spec("aws")).unwrap_err();
        let status = tonic::Status::from(unknown);
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(
            status.message().contains("\"aws\"") && status.message().contains("pg, sim"),
            "{status:?}"
        );
        let defaults: Vec<(&str, bool)> = providers
            .links()
            .map(|(l, d)| (l.name.as_str(), d))
            .collect();
        assert_eq!(defaults, vec![("pg", false), ("sim", true)]);
    }

    /// A provider that never answers: only the deadline ends the call.
    async fn silent_provider() -> (Provider, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let provider = connect_lazy(&format!("http://{address}")).unwrap();
        (provider, accepting)
    }

    #[tokio::test]
    async fn a_call_due_by_a_deadline_ends_there_and_says_so() {
        let (mut provider, accepting) = silent_provider().await;
        let deadline = Instant::now() + Duration::from_millis(300);
        let request = pb::DescribeClusterRequest {
            cluster_uid: "uid".into(),
            token: None,
        };
        let sent = due_by(deadline, request);
        assert!(
            sent.metadata().get("grpc-timeout").is_some(),
            "a gRPC deadline"
        );
        let bound = tokio::time::timeout(Duration::from_secs(5), provider.describe_cluster(sent));
        let status = bound.await.expect("ended by its deadline").unwrap_err();
        assert!(Instant::now() >= deadline, "not before it");
        assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
        accepting.abort();
    }
}
