//! Stop: powers the cluster's nodes off.

use super::rules::name_only_call;
use super::{KindRules, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::{ClusterState, Spec};
use crate::operation::{OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
use drover_proto::v1;

pub struct Stop;

name_only_call!(v1::StopClusterRequest, OperationKind::Stop);

impl KindRules for Stop {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/StopCluster"
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::Stop
    }

    fn event(&self, _spec: &Spec, _params: &OperationParams) -> Event {
        Event::StopRequested
    }

    /// A go-ahead stop looks first: a cluster never started has no nodes
    /// (and a Created one is not even asked about).
    fn needs_nodes(&self, operation: &OperationRecord) -> bool {
        operation.go_ahead && operation.from_state != ClusterState::Created
    }

    /// A cluster that was never provisioned has nothing to stop.
    fn plan(
        &self,
        operation: &OperationRecord,
        _spec: &Spec,
        nodes: &[ProviderNode],
        _caps: &Capabilities,
    ) -> Vec<Step> {
        if nodes.is_empty() && operation.go_ahead {
            vec![]
        } else {
            vec![Step::StopNodes]
        }
    }
}
