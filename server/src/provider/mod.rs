//! The provider: the plugin that does the real work on nodes, reached over
//! drover.provider.v1, and Drover's simulated implementation of it.

pub mod sim;

use drover_proto::provider::v1::provider_client::ProviderClient;
use drover_proto::provider::v1::ProviderNode;
use tonic::transport::Channel;

/// How long a look at a cluster's nodes (DescribeCluster) may take outside
/// an operation's own deadline: the status scan, and the fencing look of an
/// orphan's recovery. A provider that hangs must not stall either.
pub const DESCRIBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A client of a provider endpoint; cheap to clone.
pub type Provider = ProviderClient<Channel>;

/// A lazily connecting client: the provider may start after the replica.
pub fn connect_lazy(endpoint: &str) -> Result<Provider, tonic::codegen::http::uri::InvalidUri> {
    Ok(ProviderClient::new(
        Channel::from_shared(endpoint.to_string())?.connect_lazy(),
    ))
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
pub fn due_by<T>(deadline: std::time::Instant, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
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
pub const APPLY_BY: &str = "drover-apply-by";

/// A node that is powered on and reports healthy.
pub fn node_ready(node: &ProviderNode) -> bool {
    node.healthy && node.power_state == "on"
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_proto::provider::v1 as pb;
    use std::time::{Duration, Instant};

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
