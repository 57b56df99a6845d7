//! The drover.v1.Admin service: members, ownership and the providers.

use super::error::ApiError;
use crate::cluster::from_json;
use crate::cluster::validate;
use crate::keys::KeyLayout;
use crate::operation::LifecycleError;
use crate::provider::{Link, Providers};
use crate::replication::{MemberRecord, OwnerRecord, Ownership};
use crate::store::{RangeRequest, SharedStore};
use drover_proto::provider::v1 as pb;
use drover_proto::v1::{self, admin_server::Admin};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct AdminService {
    store: SharedStore,
    keys: KeyLayout,
    /// Present when this replica is a member.
    replication: Option<Arc<Ownership>>,
    /// The providers this replica reaches; `None` without one.
    providers: Option<Arc<Providers>>,
}

/// How long ListProviders waits for each provider's GetCapabilities: the
/// listing must answer even when a provider does not.
const CAPABILITIES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl AdminService {
    pub fn new(
        store: SharedStore,
        keys: KeyLayout,
        replication: Option<Arc<Ownership>>,
        providers: Option<Arc<Providers>>,
    ) -> Self {
        Self {
            store,
            keys,
            replication,
            providers,
        }
    }

    /// Every provider with what it answers now, asked all at once.
    async fn providers(&self) -> v1::ListProvidersResponse {
        let Some(providers) = &self.providers else {
            return v1::ListProvidersResponse::default();
        };
        let asked: Vec<_> = providers
            .links()
            .map(|(link, is_default)| {
                let info = describe_link(link, is_default);
                let mut client = link.client();
                let answer = tokio::spawn(async move {
                    let call = client.get_capabilities(pb::GetCapabilitiesRequest {});
                    tokio::time::timeout(CAPABILITIES_TIMEOUT, call).await
                });
                (info, answer)
            })
            .collect();
        let mut list = Vec::with_capacity(asked.len());
        for (mut info, answer) in asked {
            match answer.await {
                Ok(Ok(Ok(capabilities))) => {
                    info.capabilities = Some(capabilities_to_proto(capabilities.into_inner()))
                }
                Ok(Ok(Err(status))) => {
                    info.error = format!("{:?}: {}", status.code(), status.message())
                }
                Ok(Err(_)) => {
                    info.error = format!("unreachable: no answer within {CAPABILITIES_TIMEOUT:?}")
                }
                Err(error) => info.error = format!("not asked: {error}"),
            }
            list.push(info);
        }
        v1::ListProvidersResponse { providers: list }
    }

    async fn members(&self) -> Result<v1::ListMembersResponse, ApiError> {
        let members = self
            .store
            .range(RangeRequest::prefix(self.keys.members()))
            .await?;
        let owners = self
            .store
            .range(RangeRequest::prefix(self.keys.owners()))
            .await?;
        let mut owned: HashMap<String, u64> = HashMap::new();
        for kv in &owners.kvs {
            if let Ok(owner) = from_json::<OwnerRecord>(kv) {
                *owned.entry(owner.replica).or_default() += 1;
            }
        }
        let mut list = Vec::new();
        for kv in &members.kvs {
            let member: MemberRecord = from_json(kv)?;
            let ttl_left = self
                .store
                .lease_time_to_live(member.lease)
                .await?
                .unwrap_or(0);
            list.push(v1::Member {
                clusters_owned: owned.get(&member.id).copied().unwrap_or(0),
                id: member.id,
                address: member.address,
                version: member.version,
                lease_ttl_left_seconds: ttl_left,
                draining: member.draining,
            });
        }
        Ok(v1::ListMembersResponse { members: list })
    }

    async fn owner(&self, cluster: &str) -> Result<v1::Owner, ApiError> {
        validate::cluster_name("cluster", cluster)?;
        let kv = self
            .store
            .get(&self.keys.owner(cluster))
            .await?
            .into_single()
            .ok_or_else(|| LifecycleError::NoOwner(cluster.to_string()))?;
        let owner: OwnerRecord = from_json(&kv)?;
        Ok(v1::Owner {
            cluster: cluster.to_string(),
            epoch: owner.epoch(kv.create_revision),
            replica: owner.replica,
        })
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn list_members(
        &self,
        _: Request<v1::ListMembersRequest>,
    ) -> Result<Response<v1::ListMembersResponse>, Status> {
        if let Some(replication) = &self.replication {
            tracing::debug!(owned = replication.owned_count(), "members listed");
        }
        Ok(Response::new(self.members().await?))
    }

    async fn list_providers(
        &self,
        _: Request<v1::ListProvidersRequest>,
    ) -> Result<Response<v1::ListProvidersResponse>, Status> {
        Ok(Response::new(self.providers().await))
    }

    async fn get_owner(
        &self,
        request: Request<v1::GetOwnerRequest>,
    ) -> Result<Response<v1::Owner>, Status> {
        Ok(Response::new(
            self.owner(&request.into_inner().cluster).await?,
        ))
    }
}

/// A link as listed, before its provider is asked.
fn describe_link(link: &Link, is_default: bool) -> v1::ProviderInfo {
    v1::ProviderInfo {
        name: link.name.clone(),
        endpoint: link.endpoint.clone(),
        is_default,
        tls: link.tls,
        client_certificate: link.client_certificate,
        bearer_token: link.bearer_token,
        capabilities: None,
        error: String::new(),
    }
}

fn capabilities_to_proto(c: pb::Capabilities) -> v1::ProviderCapabilities {
    let upgrade_order = match pb::UpgradeOrder::try_from(c.upgrade_order) {
        Ok(pb::UpgradeOrder::WorkersFirst) => "workers-first",
        _ => "control-first",
    };
    v1::ProviderCapabilities {
        kind: c.kind,
        versions: c.versions,
        offerings: c.offerings,
        min_control_nodes: c.min_control_nodes,
        max_control_nodes: c.max_control_nodes,
        min_worker_nodes: c.min_worker_nodes,
        max_worker_nodes: c.max_worker_nodes,
        task_types: c.task_types,
        upgrade_order: upgrade_order.to_string(),
        replace_workers: c.replace_workers,
    }
}
