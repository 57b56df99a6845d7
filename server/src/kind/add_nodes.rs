//! AddNodes: adds `count` worker nodes.

use super::{Call, KindRules, LifecycleCall, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::validate::FieldError;
use crate::cluster::Spec;
use crate::operation::{OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
use drover_proto::v1;

/// The most nodes one request adds.
const MAX_ADD_NODES: u32 = 100;

pub struct AddNodes;

impl LifecycleCall for v1::AddNodesRequest {
    const KIND: OperationKind = OperationKind::AddNodes;

    fn into_call(self) -> Result<Call, FieldError> {
        if !(1..=MAX_ADD_NODES).contains(&self.count) {
            return Err(FieldError::new(
                "count",
                format!("must be between 1 and {MAX_ADD_NODES}"),
            ));
        }
        let params = OperationParams {
            add_count: Some(self.count),
            ..OperationParams::default()
        };
        Ok(Call {
            name: self.name,
            request_id: self.request_id,
            params,
            wait_ms: self.wait_ms,
        })
    }
}

impl KindRules for AddNodes {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/AddNodes"
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::AddNodes
    }

    fn event(&self, _spec: &Spec, _params: &OperationParams) -> Event {
        Event::AddNodeRequested
    }

    fn edit_spec(&self, spec: &mut Spec, params: &OperationParams) -> Result<bool, FieldError> {
        spec.worker_nodes += params.add_count.unwrap_or(0);
        Ok(true)
    }

    fn request_field(&self, spec_field: &str) -> Option<&'static str> {
        (spec_field == "worker_nodes").then_some("count")
    }

    fn plan(
        &self,
        _operation: &OperationRecord,
        spec: &Spec,
        _nodes: &[ProviderNode],
        _caps: &Capabilities,
    ) -> Vec<Step> {
        vec![Step::Resize {
            workers: Some(spec.worker_nodes),
            offering: None,
        }]
    }
}
