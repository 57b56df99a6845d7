//! Recover: the provider restarts or rebuilds what is down; then, as for
//! any operation that ends with the cluster up, every node must be ready.

use super::rules::name_only_call;
use super::{KindRules, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::Spec;
use crate::operation::{OperationParams, OperationRecord};
use drover_proto::provider::v1::{ProviderNode, UpgradeOrder};
use drover_proto::v1;

pub struct Recover;

name_only_call!(v1::RecoverClusterRequest, OperationKind::Recover);

impl KindRules for Recover {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/RecoverCluster"
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::Recover
    }

    fn event(&self, _spec: &Spec, _params: &OperationParams) -> Event {
        Event::RecoveryRequested
    }

    fn plan(
        &self,
        _operation: &OperationRecord,
        _spec: &Spec,
        _nodes: &[ProviderNode],
        _order: UpgradeOrder,
    ) -> Vec<Step> {
        vec![Step::RepairNodes, Step::HealthCheck]
    }
}
