//! The drover.v1.Clusters service.

use super::convert::{cluster_to_proto, spec_from_proto, state_from_proto};
use super::error::{ApiError, ApiResult};
use crate::cluster::validate::{self, FieldError};
use crate::cluster::{ClusterFilter, Registry};
use drover_proto::v1::{self, clusters_server::Clusters};
use std::pin::Pin;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;

/// Serves cluster CRUD and lifecycle requests.
pub struct ClustersService {
    registry: Registry,
}

impl ClustersService {
    pub fn new(registry: Registry) -> Self {
        Self { registry }
    }

    async fn create(
        &self,
        request: v1::CreateClusterRequest,
    ) -> ApiResult<v1::CreateClusterResponse> {
        validate::cluster_name("name", &request.name)?;
        let spec = spec_from_proto("spec", request.spec)?;
        validate::request_id("request_id", &request.request_id)?;
        let cluster = self
            .registry
            .create(&request.name, spec, &request.request_id)
            .await?;
        tracing::info!(cluster = %request.name, uid = %cluster.spec.uid, "cluster created");
        Ok(v1::CreateClusterResponse {
            cluster: Some(cluster_to_proto(cluster)),
            operation: None,
        })
    }

    async fn get(&self, request: v1::GetClusterRequest) -> ApiResult<v1::Cluster> {
        validate::cluster_name("name", &request.name)?;
        Ok(cluster_to_proto(self.registry.get(&request.name).await?))
    }

    async fn list(&self, request: v1::ListClustersRequest) -> ApiResult<v1::ListClustersResponse> {
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n <= MAX_PAGE_SIZE => n,
            _ => {
                return Err(FieldError::new(
                    "page_size",
                    format!("must be at most {MAX_PAGE_SIZE}"),
                )
                .into())
            }
        };
        let after = (!request.page_token.is_empty()).then_some(request.page_token.as_str());
        if let Some(after) = after {
            validate::cluster_name("page_token", after)
                .map_err(|_| FieldError::new("page_token", "is not a token this API returned"))?;
        }
        let state = v1::ClusterState::try_from(request.state).map_err(|_| {
            FieldError::new("state", format!("{} is not a cluster state", request.state))
        })?;
        let filter = ClusterFilter {
            state: state_from_proto(state),
            labels: parse_label_selector(&request.label_selector)?,
        };
        let page = self
            .registry
            .list(&filter, after, page_size as usize)
            .await?;
        Ok(v1::ListClustersResponse {
            clusters: page.clusters.into_iter().map(cluster_to_proto).collect(),
            next_page_token: page.next_after.unwrap_or_default(),
        })
    }
}

/// Parses `k=v,k2=v2`.
fn parse_label_selector(selector: &str) -> Result<Vec<(String, String)>, FieldError> {
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    selector
        .split(',')
        .map(|pair| {
            let (key, value) = pair.trim().split_once('=').ok_or_else(|| {
                FieldError::new(
                    "label_selector",
                    format!("{pair:?} is not of the form key=value"),
                )
            })?;
            let labels = [(key.to_string(), value.to_string())].into_iter().collect();
            validate::labels("label_selector", &labels)?;
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

type ClusterEventStream = Pin<Box<dyn Stream<Item = Result<v1::ClusterEvent, Status>> + Send>>;

fn unimplemented<T>(rpc: &'static str) -> Result<Response<T>, Status> {
    Err(ApiError::Unimplemented(rpc).into())
}

#[tonic::async_trait]
impl Clusters for ClustersService {
    async fn create_cluster(
        &self,
        request: Request<v1::CreateClusterRequest>,
    ) -> Result<Response<v1::CreateClusterResponse>, Status> {
        Ok(Response::new(self.create(request.into_inner()).await?))
    }

    async fn get_cluster(
        &self,
        request: Request<v1::GetClusterRequest>,
    ) -> Result<Response<v1::Cluster>, Status> {
        Ok(Response::new(self.get(request.into_inner()).await?))
    }

    async fn list_clusters(
        &self,
        request: Request<v1::ListClustersRequest>,
    ) -> Result<Response<v1::ListClustersResponse>, Status> {
        Ok(Response::new(self.list(request.into_inner()).await?))
    }

    type WatchClustersStream = ClusterEventStream;

    async fn watch_clusters(
        &self,
        _: Request<v1::WatchClustersRequest>,
    ) -> Result<Response<Self::WatchClustersStream>, Status> {
        unimplemented("WatchClusters")
    }

    async fn update_cluster(
        &self,
        _: Request<v1::UpdateClusterRequest>,
    ) -> Result<Response<v1::Cluster>, Status> {
        unimplemented("UpdateCluster")
    }

    async fn delete_cluster(
        &self,
        _: Request<v1::DeleteClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("DeleteCluster")
    }

    async fn start_cluster(
        &self,
        _: Request<v1::StartClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("StartCluster")
    }

    async fn stop_cluster(
        &self,
        _: Request<v1::StopClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("StopCluster")
    }

    async fn scale_cluster(
        &self,
        _: Request<v1::ScaleClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("ScaleCluster")
    }

    async fn upgrade_cluster(
        &self,
        _: Request<v1::UpgradeClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("UpgradeCluster")
    }

    async fn add_nodes(
        &self,
        _: Request<v1::AddNodesRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("AddNodes")
    }

    async fn remove_nodes(
        &self,
        _: Request<v1::RemoveNodesRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("RemoveNodes")
    }

    async fn recover_cluster(
        &self,
        _: Request<v1::RecoverClusterRequest>,
    ) -> Result<Response<v1::Operation>, Status> {
        unimplemented("RecoverCluster")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_parse_or_name_the_field() {
        assert_eq!(parse_label_selector("").unwrap(), vec![]);
        assert_eq!(
            parse_label_selector("team=db, env=prod").unwrap(),
            vec![("team".into(), "db".into()), ("env".into(), "prod".into())]
        );
        assert_eq!(
            parse_label_selector("team").unwrap_err().field,
            "label_selector"
        );
        assert_eq!(
            parse_label_selector("a=b/c").unwrap_err().field,
            "label_selector[\"a\"]"
        );
    }
}
