//! The drover.v1.Admin service: members and ownership.

use super::error::ApiError;
use crate::cluster::from_json;
use crate::cluster::validate;
use crate::keys::KeyLayout;
use crate::operation::LifecycleError;
use crate::replication::{MemberRecord, OwnerRecord, Ownership};
use crate::store::{RangeRequest, SharedStore};
use drover_proto::v1::{self, admin_server::Admin};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct AdminService {
    store: SharedStore,
    keys: KeyLayout,
    /// Present when this replica is a member.
    replication: Option<Arc<Ownership>>,
}

impl AdminService {
    pub fn new(store: SharedStore, keys: KeyLayout, replication: Option<Arc<Ownership>>) -> Self {
        Self {
            store,
            keys,
            replication,
        }
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
            replica: owner.replica,
            epoch: crate::replication::fencing_epoch(owner.generation, kv.create_revision),
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

    async fn get_owner(
        &self,
        request: Request<v1::GetOwnerRequest>,
    ) -> Result<Response<v1::Owner>, Status> {
        Ok(Response::new(
            self.owner(&request.into_inner().cluster).await?,
        ))
    }
}
