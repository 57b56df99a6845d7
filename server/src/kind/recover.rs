//! Recover: the provider restarts or rebuilds what is down (or Drover
//! replaces unhealthy workers, or adds back missing ones); then, as for any
//! operation that ends with the cluster up, every node must be ready.

use super::rules::name_only_call;
use super::{KindRules, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::{NodeStatus, Spec};
use crate::health::Policy;
use crate::operation::{OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
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

    /// Planned from the nodes, so a crashed recover re-planned picks up
    /// where it was: the worker count restored, the replaced nodes gone.
    fn needs_nodes(&self, _operation: &OperationRecord) -> bool {
        true
    }

    fn needs_capabilities(&self, operation: &OperationRecord, spec: &Spec) -> bool {
        Policy::of(&spec.health).replace_workers && !operation.params.node_ids.is_empty()
    }

    /// The named nodes (a remediation's; none: every node that needs it)
    /// repaired, or, for workers under a policy of replacement where the
    /// provider can, replaced: a worker added, then the bad ones deleted.
    /// Missing workers are added back (a resize to the spec's count), a
    /// missing control node is the provider's to rebuild (RepairNodes of
    /// every node). Then, as for any operation that ends with the cluster
    /// up, every node must be ready.
    fn plan(
        &self,
        operation: &OperationRecord,
        spec: &Spec,
        nodes: &[ProviderNode],
        caps: &Capabilities,
    ) -> Vec<Step> {
        let named = &operation.params.node_ids;
        let present = |id: &String| nodes.iter().find(|n| &n.id == id);
        let replace: Vec<String> =
            if Policy::of(&spec.health).replace_workers && caps.replace_workers {
                let worker = |id: &&String| present(id).is_some_and(|n| n.role == "worker");
                named.iter().filter(worker).cloned().collect()
            } else {
                Vec::new()
            };
        let repair: Vec<String> = named
            .iter()
            .filter(|id| present(id).is_some() && !replace.contains(id))
            .cloned()
            .collect();
        let control_missing = named
            .iter()
            .any(|id| NodeStatus::missing_role(id) == Some("control"));
        let mut steps = Vec::new();
        if named.is_empty() || control_missing {
            steps.push(Step::RepairNodes(Vec::new()));
        } else if !repair.is_empty() {
            steps.push(Step::RepairNodes(repair));
        }
        let workers = nodes.iter().filter(|n| n.role == "worker").count();
        if workers - replace.len() < spec.worker_nodes as usize {
            steps.push(Step::Resize {
                workers: Some(spec.worker_nodes + replace.len() as u32),
                offering: None,
            });
        }
        if !replace.is_empty() {
            steps.push(Step::DeleteNodes(replace));
        }
        steps.push(Step::HealthCheck);
        steps
    }
}
