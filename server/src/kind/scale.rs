//! Scale: changes the worker count, the node offering or the autoscaling
//! bounds. Scaling a Created cluster only edits what will be created; a
//! Stopped one may change only its node offering.

use super::{Call, KindRules, LifecycleCall, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::validate::{self, FieldError};
use crate::cluster::{Autoscaling, ClusterRecord, ClusterState, Spec};
use crate::operation::{LifecycleError, OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
use drover_proto::v1;

pub struct Scale;

impl LifecycleCall for v1::ScaleClusterRequest {
    const KIND: OperationKind = OperationKind::Scale;

    fn into_call(self) -> Result<Call, FieldError> {
        if self.worker_nodes.is_none() && self.node_offering.is_none() && self.autoscaling.is_none()
        {
            return Err(FieldError::new(
                "worker_nodes",
                "one of worker_nodes, node_offering or autoscaling is required",
            ));
        }
        if let Some(offering) = &self.node_offering {
            validate::node_offering("node_offering", offering)?;
        }
        if self
            .worker_nodes
            .is_some_and(|n| n > validate::MAX_WORKER_NODES)
        {
            return Err(FieldError::new(
                "worker_nodes",
                format!("must be at most {}", validate::MAX_WORKER_NODES),
            ));
        }
        let params = OperationParams {
            worker_nodes: self.worker_nodes,
            node_offering: self.node_offering,
            autoscaling: self.autoscaling.map(|a| Autoscaling {
                enabled: a.enabled,
                min: a.min,
                max: a.max,
            }),
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

impl KindRules for Scale {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/ScaleCluster"
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::Scale
    }

    fn event(&self, spec: &Spec, params: &OperationParams) -> Event {
        if params.autoscaling.is_some() {
            Event::AutoscaleRequested
        } else if params.worker_nodes.is_some_and(|n| n < spec.worker_nodes) {
            Event::ScaleDownRequested
        } else {
            Event::ScaleUpRequested
        }
    }

    fn edit_spec(&self, spec: &mut Spec, params: &OperationParams) -> Result<bool, FieldError> {
        if let Some(workers) = params.worker_nodes {
            spec.worker_nodes = workers;
        }
        if let Some(offering) = &params.node_offering {
            spec.node_offering = offering.clone();
        }
        if let Some(autoscaling) = &params.autoscaling {
            spec.autoscaling = autoscaling.clone();
        }
        Ok(true)
    }

    /// A stopped cluster has no running nodes to add or remove: only its
    /// offering (applied when it starts) may change.
    fn refuse(
        &self,
        cluster: &ClusterRecord,
        _params: &OperationParams,
        desired: Option<&Spec>,
    ) -> Result<(), LifecycleError> {
        let spec = &cluster.spec.spec;
        let only_offering = desired.is_none_or(|d| {
            d.worker_nodes == spec.worker_nodes && d.autoscaling == spec.autoscaling
        });
        if cluster.state.state == ClusterState::Stopped && !only_offering {
            return Err(LifecycleError::StoppedClusterScale(
                cluster.spec.name.clone(),
            ));
        }
        Ok(())
    }

    /// Nothing exists yet: scaling only edits what will be created.
    fn spec_only(&self, state: ClusterState) -> bool {
        state == ClusterState::Created
    }

    fn plan(
        &self,
        operation: &OperationRecord,
        spec: &Spec,
        _nodes: &[ProviderNode],
        _caps: &Capabilities,
    ) -> Vec<Step> {
        let params = &operation.params;
        vec![Step::Resize {
            workers: (params.worker_nodes.is_some() || params.autoscaling.is_some())
                .then_some(spec.worker_nodes),
            offering: params.node_offering.clone(),
        }]
    }
}
