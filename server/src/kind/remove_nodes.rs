//! RemoveNodes: deletes the named worker nodes.

use super::{Call, KindRules, LifecycleCall, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::validate::FieldError;
use crate::cluster::{ClusterRecord, Spec};
use crate::operation::{LifecycleError, OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
use drover_proto::v1;
use std::collections::HashSet;

pub struct RemoveNodes;

impl LifecycleCall for v1::RemoveNodesRequest {
    const KIND: OperationKind = OperationKind::RemoveNodes;

    fn into_call(self) -> Result<Call, FieldError> {
        if self.node_ids.is_empty() {
            return Err(FieldError::new(
                "node_ids",
                "at least one node id is required",
            ));
        }
        let mut seen = HashSet::new();
        for (i, id) in self.node_ids.iter().enumerate() {
            if id.is_empty() || id.len() > 128 {
                return Err(FieldError::new(
                    format!("node_ids[{i}]"),
                    "must be 1-128 characters",
                ));
            }
            if !seen.insert(id) {
                return Err(FieldError::new(
                    format!("node_ids[{i}]"),
                    format!("{id:?} is listed twice"),
                ));
            }
        }
        let params = OperationParams {
            node_ids: self.node_ids,
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

impl KindRules for RemoveNodes {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/RemoveNodes"
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::RemoveNodes
    }

    /// Deleting nodes is quick or failed: the reference's 900 s.
    fn default_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(900)
    }

    fn event(&self, _spec: &Spec, _params: &OperationParams) -> Event {
        Event::RemoveNodeRequested
    }

    fn edit_spec(&self, spec: &mut Spec, params: &OperationParams) -> Result<bool, FieldError> {
        let removed = params.node_ids.len() as u32;
        if removed > spec.worker_nodes {
            return Err(FieldError::new(
                "node_ids",
                format!("the cluster has only {} worker nodes", spec.worker_nodes),
            ));
        }
        spec.worker_nodes -= removed;
        Ok(true)
    }

    fn request_field(&self, spec_field: &str) -> Option<&'static str> {
        (spec_field == "worker_nodes").then_some("node_ids")
    }

    /// Checked before anything is written: the spec would lose a worker for
    /// a node the provider then fails to find (or, for a control node,
    /// removes).
    fn refuse_admitted(
        &self,
        cluster: &ClusterRecord,
        params: &OperationParams,
    ) -> Result<(), LifecycleError> {
        let nodes = cluster.status.as_ref().map(|s| s.nodes.as_slice());
        for (i, id) in params.node_ids.iter().enumerate() {
            let worker = nodes
                .unwrap_or_default()
                .iter()
                .any(|node| node.id == *id && node.role == "worker");
            if !worker {
                let name = &cluster.spec.name;
                return Err(FieldError::new(
                    format!("node_ids[{i}]"),
                    format!("{id:?} is not a worker node of cluster {name}"),
                )
                .into());
            }
        }
        Ok(())
    }

    fn plan(
        &self,
        operation: &OperationRecord,
        _spec: &Spec,
        _nodes: &[ProviderNode],
        _caps: &Capabilities,
    ) -> Vec<Step> {
        vec![Step::DeleteNodes(operation.params.node_ids.clone())]
    }
}
