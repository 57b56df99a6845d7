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

pub use drover_proto::v1;
use tonic::transport::Channel;
use v1::clusters_client::ClustersClient;
use v1::operations_client::OperationsClient;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: tonic::transport::Error,
    },
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    #[error("operation {id} ended {state}: {message}")]
    OperationFailed {
        id: String,
        state: String,
        message: String,
    },
}

/// A connection to one Drover replica.
#[derive(Clone)]
pub struct Client {
    clusters: ClustersClient<Channel>,
    operations: OperationsClient<Channel>,
}

impl Client {
    /// Connects to a replica's gRPC endpoint, e.g. `http://127.0.0.1:7070`.
    pub async fn connect(endpoint: &str) -> Result<Self, ClientError> {
        let channel = Channel::from_shared(endpoint.to_string())
            .map_err(|_| {
                ClientError::Status(tonic::Status::invalid_argument(format!(
                    "{endpoint:?} is not a URL"
                )))
            })?
            .connect()
            .await
            .map_err(|source| ClientError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(Self {
            clusters: ClustersClient::new(channel.clone()),
            operations: OperationsClient::new(channel),
        })
    }

    /// The generated Clusters client, for every lifecycle RPC.
    pub fn clusters(&mut self) -> &mut ClustersClient<Channel> {
        &mut self.clusters
    }

    /// The generated Operations client.
    pub fn operations(&mut self) -> &mut OperationsClient<Channel> {
        &mut self.operations
    }

    /// Waits until the operation is terminal or `timeout` passes and returns
    /// it as last seen (check its `state`).
    pub async fn wait_operation(
        &mut self,
        operation: &v1::Operation,
        timeout: std::time::Duration,
    ) -> Result<v1::Operation, ClientError> {
        let request = v1::WaitOperationRequest {
            cluster: operation.cluster.clone(),
            id: operation.id.clone(),
            timeout_ms: timeout.as_millis() as u64,
        };
        Ok(self.operations.wait_operation(request).await?.into_inner())
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
