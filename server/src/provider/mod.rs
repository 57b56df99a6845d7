//! The provider: the plugin that does the real work on nodes, reached over
//! drover.provider.v1, and Drover's simulated implementation of it.

pub mod sim;

use drover_proto::provider::v1::provider_client::ProviderClient;
use drover_proto::provider::v1::ProviderNode;
use tonic::transport::Channel;

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
