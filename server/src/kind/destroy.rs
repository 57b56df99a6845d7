//! Destroy: deletes every node of the cluster, then its records. The one
//! kind only an admin may ask for.

use super::rules::name_only_call;
use super::{KindRules, OperationKind, Step};
use crate::auth::Role;
use crate::cluster::machine::Event;
use crate::cluster::{ClusterState, Spec};
use crate::operation::{OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
use drover_proto::v1;

pub struct Destroy;

name_only_call!(v1::DeleteClusterRequest, OperationKind::Destroy);

impl KindRules for Destroy {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/DeleteCluster"
    }

    fn role(&self) -> Role {
        Role::Admin
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::Destroy
    }

    fn event(&self, _spec: &Spec, _params: &OperationParams) -> Event {
        Event::DestroyRequested
    }

    /// A cluster never started has nothing at the provider: deleting it
    /// calls nothing.
    fn plan(
        &self,
        operation: &OperationRecord,
        _spec: &Spec,
        _nodes: &[ProviderNode],
        _caps: &Capabilities,
    ) -> Vec<Step> {
        if operation.from_state == ClusterState::Created {
            vec![]
        } else {
            vec![Step::DeleteNodes(Vec::new())]
        }
    }

    /// A go-ahead destroy that works completes.
    fn go_ahead_moves(&self) -> bool {
        true
    }

    fn clears_nodes(&self) -> bool {
        true
    }
}
