//! Upgrade: moves every node to a version, node by node in the order the
//! provider asks for; it succeeds only when the provider shows every node
//! at the target.

use super::{Call, KindRules, LifecycleCall, OperationKind, Step};
use crate::cluster::machine::Event;
use crate::cluster::validate::{self, FieldError};
use crate::cluster::{ClusterRecord, Spec};
use crate::operation::{LifecycleError, OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode, UpgradeOrder};
use drover_proto::v1;

pub struct Upgrade;

impl LifecycleCall for v1::UpgradeClusterRequest {
    const KIND: OperationKind = OperationKind::Upgrade;

    fn into_call(self) -> Result<Call, FieldError> {
        validate::version("version", &self.version)?;
        let params = OperationParams {
            version: Some(self.version),
            allow_downgrade: self.allow_downgrade,
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

/// The highest version the cluster runs, as far as Drover saw: its
/// current version and every node's (a failed upgrade leaves some nodes
/// ahead of the current version). Versions that do not parse (written
/// before versions were semantic) are left out: they cannot be compared.
fn running_version(cluster: &ClusterRecord) -> Option<semver::Version> {
    let status = cluster.status.as_ref()?;
    let nodes = status.nodes.iter().map(|node| &node.version);
    status
        .current_version
        .iter()
        .chain(nodes)
        .filter_map(|version| validate::parse_version(version).ok())
        .max()
}

impl KindRules for Upgrade {
    fn rpc(&self) -> &'static str {
        "/drover.v1.Clusters/UpgradeCluster"
    }

    fn proto(&self) -> v1::OperationKind {
        v1::OperationKind::Upgrade
    }

    fn event(&self, _spec: &Spec, _params: &OperationParams) -> Event {
        Event::UpgradeRequested
    }

    fn edit_spec(&self, spec: &mut Spec, params: &OperationParams) -> Result<bool, FieldError> {
        spec.version = params.version.clone().unwrap_or_default();
        Ok(true)
    }

    /// Refuses a version lower than the one the cluster runs, unless the
    /// caller allowed a downgrade. The same version is allowed: it
    /// completes an interrupted upgrade (nodes already there are skipped).
    fn refuse(
        &self,
        cluster: &ClusterRecord,
        params: &OperationParams,
        _desired: Option<&Spec>,
    ) -> Result<(), LifecycleError> {
        let target = params.version.as_deref().unwrap_or_default();
        let (Some(current), Ok(parsed)) =
            (running_version(cluster), validate::parse_version(target))
        else {
            return Ok(());
        };
        if parsed < current && !params.allow_downgrade {
            return Err(LifecycleError::Downgrade {
                cluster: cluster.spec.name.clone(),
                current: current.to_string(),
                target: target.to_string(),
            });
        }
        Ok(())
    }

    fn needs_nodes(&self, _operation: &OperationRecord) -> bool {
        true
    }

    /// An upgrade of a cluster the provider shows no nodes of would have no
    /// steps and "succeed" with nothing upgraded.
    fn check_plan_input(
        &self,
        _operation: &OperationRecord,
        nodes: &[ProviderNode],
    ) -> Result<(), String> {
        if nodes.is_empty() {
            return Err("the provider shows no nodes for the cluster: nothing to upgrade".into());
        }
        Ok(())
    }

    /// By role in the provider's order (control nodes first unless it says
    /// workers first: a database switches its primary over to an upgraded
    /// replica last); nodes already at the target are skipped, so an
    /// interrupted upgrade can simply be run again. With a surge
    /// (`upgrade_policy.max_surge`), surge workers are added and upgraded
    /// first, and the workers brought back to the spec's count last.
    fn plan(
        &self,
        operation: &OperationRecord,
        spec: &Spec,
        nodes: &[ProviderNode],
        caps: &Capabilities,
    ) -> Vec<Step> {
        let order = caps.upgrade_order();
        let target = self.target_version(operation, spec).unwrap_or_default();
        let pending: Vec<&ProviderNode> = nodes.iter().filter(|n| n.version != target).collect();
        let surge = spec.upgrade_policy.max_surge.unwrap_or(0);
        let workers = nodes.iter().filter(|n| n.role == "worker").count() as u32;
        let mut steps = Vec::new();
        if surge > 0 && !pending.is_empty() {
            steps.push(Step::Surge {
                workers: spec.worker_nodes + surge,
                known: nodes.iter().map(|n| n.id.clone()).collect(),
                version: target.clone(),
            });
        }
        steps.extend(node_steps(pending, &target, spec, order));
        // A surge added workers (now, or before a crash): back to the
        // spec's count.
        if surge > 0 && (!steps.is_empty() || workers > spec.worker_nodes) {
            steps.push(Step::Resize {
                workers: Some(spec.worker_nodes),
                offering: None,
            });
        }
        steps
    }

    fn target_version(&self, operation: &OperationRecord, spec: &Spec) -> Option<String> {
        let params = &operation.params;
        Some(
            params
                .version
                .clone()
                .unwrap_or_else(|| spec.version.clone()),
        )
    }
}

/// The UpgradeNode steps of `pending` in the provider's `order`: control
/// nodes one at a time (a quorum never loses two members to an upgrade),
/// workers `max_unavailable` at a time.
fn node_steps(
    mut pending: Vec<&ProviderNode>,
    target: &str,
    spec: &Spec,
    order: UpgradeOrder,
) -> Vec<Step> {
    let control_last = order == UpgradeOrder::WorkersFirst;
    pending.sort_by_key(|n| ((n.role == "control") == control_last, n.id.clone()));
    let side_by_side = spec.upgrade_policy.max_unavailable.unwrap_or(1).max(1) as usize;
    let (control, workers): (Vec<&ProviderNode>, Vec<&ProviderNode>) =
        pending.into_iter().partition(|n| n.role == "control");
    let control = control.into_iter().map(|n| vec![n.id.clone()]);
    let workers = workers
        .chunks(side_by_side)
        .map(|chunk| chunk.iter().map(|n| n.id.clone()).collect::<Vec<String>>());
    let batches: Vec<Vec<String>> = if control_last {
        workers.chain(control).collect()
    } else {
        control.chain(workers).collect()
    };
    let version = target.to_string();
    batches
        .into_iter()
        .map(|mut ids| match ids.len() {
            1 => Step::UpgradeNode {
                node_id: ids.remove(0),
                version: version.clone(),
            },
            _ => Step::UpgradeNodes {
                node_ids: ids,
                version: version.clone(),
            },
        })
        .collect()
}
