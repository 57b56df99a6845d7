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

/// A node that is powered on and reports healthy.
pub fn node_ready(node: &ProviderNode) -> bool {
    node.healthy && node.power_state == "on"
}
