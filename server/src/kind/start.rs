//! Start: powers a stopped cluster's nodes on, or provisions them the
//! first time (and after a failed provisioning), then checks every node.

use super::rules::name_only_call;
use super::{KindRules, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::{ClusterState, Spec};
use crate::operation::{OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
use drover_proto::v1;

pub struct Start;

name_only_call!(v1::StartClusterRequest, OperationKind::Start);

impl KindRules for Start {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/StartCluster"
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::Start
    }

    fn event(&self, _spec: &Spec, _params: &OperationParams) -> Event {
        Event::StartRequested
    }

    /// Only a cluster in Error may lack its nodes (its provisioning
    /// failed), and its start then creates them. A stopped cluster has its
    /// nodes: should they have vanished behind Drover's back, the start
    /// fails with the provider's NOT_FOUND instead of silently provisioning
    /// new, empty ones.
    fn needs_nodes(&self, operation: &OperationRecord) -> bool {
        operation.from_state == ClusterState::Error
    }

    /// The first start provisions (creating is idempotent); so does a start
    /// of a cluster whose provisioning failed (Error, no nodes).
    fn plan(
        &self,
        operation: &OperationRecord,
        _spec: &Spec,
        nodes: &[ProviderNode],
        _caps: &Capabilities,
    ) -> Vec<Step> {
        let provisions = operation.params.provision
            || operation.from_state == ClusterState::Created
            || (self.needs_nodes(operation) && nodes.is_empty());
        if provisions {
            vec![Step::CreateNodes, Step::HealthCheck]
        } else {
            vec![Step::StartNodes, Step::HealthCheck]
        }
    }

    /// A go-ahead start that works recovers an Error cluster.
    fn go_ahead_moves(&self) -> bool {
        true
    }
}
