//! Planning an operation: its kind's steps (see `crate::kind`), and where
//! a resumed run picks up.

use crate::cluster::Spec;
use crate::operation::OperationRecord;
use drover_proto::provider::v1::{Capabilities, ProviderNode};

pub use crate::kind::Step;

/// Whether planning `operation` depends on the nodes as they are now; when
/// it does not, the executor skips describing them first.
pub fn needs_nodes(operation: &OperationRecord) -> bool {
    operation.kind.rules().needs_nodes(operation)
}

/// Why `operation` cannot be planned from `nodes` (the provider's answer).
pub fn check_plan_input(operation: &OperationRecord, nodes: &[ProviderNode]) -> Result<(), String> {
    operation.kind.rules().check_plan_input(operation, nodes)
}

/// Where a RUNNING operation resumed under the claim that ran it picks up:
/// the persisted step, when the plan made now is the one it was on (same
/// length, same step there); otherwise the start of the new plan (an
/// upgrade re-planned from the nodes already skips those it upgraded).
pub fn resume_index(operation: &OperationRecord, steps: &[Step]) -> usize {
    let Some(progress) = &operation.progress else {
        return 0;
    };
    let index = progress.step.saturating_sub(1) as usize;
    let same_plan = progress.total_steps as usize == steps.len()
        && steps
            .get(index)
            .is_some_and(|s| s.name() == progress.step_name);
    if same_plan {
        index
    } else {
        0
    }
}

/// The steps of `operation` on a cluster with `spec` (already the desired
/// spec) and `nodes` as the provider reports them now; an upgrade goes
/// through the roles in the provider's `order`.
pub fn plan(
    operation: &OperationRecord,
    spec: &Spec,
    nodes: &[ProviderNode],
    caps: &Capabilities,
) -> Vec<Step> {
    operation.kind.rules().plan(operation, spec, nodes, caps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::machine::Event;
    use crate::cluster::ClusterState;
    use crate::operation::{OperationKind, OperationParams};
    use drover_proto::provider::v1::UpgradeOrder;

    /// The capabilities of a provider that says nothing but its upgrade
    /// `order`.
    const fn upgrading(order: UpgradeOrder) -> Capabilities {
        Capabilities {
            kind: String::new(),
            versions: Vec::new(),
            offerings: Vec::new(),
            min_control_nodes: 0,
            max_control_nodes: 0,
            min_worker_nodes: 0,
            max_worker_nodes: 0,
            task_types: Vec::new(),
            upgrade_order: order as i32,
            replace_workers: false,
        }
    }
    /// The defaults.
    const CONTROL_FIRST: Capabilities = upgrading(UpgradeOrder::ControlFirst);
    const WORKERS_FIRST: Capabilities = upgrading(UpgradeOrder::WorkersFirst);

    fn node(id: &str, role: &str, version: &str) -> ProviderNode {
        ProviderNode {
            id: id.into(),
            role: role.into(),
            version: version.into(),
            power_state: "on".into(),
            healthy: true,
            offering: "m".into(),
            facts: Default::default(),
        }
    }

    fn start_from(from: ClusterState) -> OperationRecord {
        OperationRecord::pending(
            "op".into(),
            "c",
            "uid",
            OperationKind::Start,
            Event::StartRequested,
            OperationParams::default(),
            from,
            ClusterState::Starting,
            "",
            String::new(),
        )
    }

    #[test]
    fn only_a_start_from_error_looks_at_the_nodes_first() {
        let powered_on = vec![Step::StartNodes, Step::HealthCheck];
        let created = vec![Step::CreateNodes, Step::HealthCheck];
        let stopped = start_from(ClusterState::Stopped);
        assert!(!needs_nodes(&stopped));
        assert_eq!(
            plan(&stopped, &Spec::default(), &[], &CONTROL_FIRST),
            powered_on
        );
        let fresh = start_from(ClusterState::Created);
        assert!(!needs_nodes(&fresh));
        assert_eq!(plan(&fresh, &Spec::default(), &[], &CONTROL_FIRST), created);
        let failed = start_from(ClusterState::Error);
        assert!(needs_nodes(&failed));
        assert_eq!(
            plan(&failed, &Spec::default(), &[], &CONTROL_FIRST),
            created
        );
        let nodes = [node("control-0", "control", "1.29.0")];
        assert_eq!(
            plan(&failed, &Spec::default(), &nodes, &CONTROL_FIRST),
            powered_on
        );
    }

    #[test]
    fn a_cluster_never_started_is_stopped_and_deleted_without_the_provider() {
        let never_started = |kind, event, entered| {
            OperationRecord::pending(
                "op".into(),
                "c",
                "uid",
                kind,
                event,
                OperationParams::default(),
                ClusterState::Created,
                entered,
                "",
                String::new(),
            )
        };
        let stop = never_started(
            OperationKind::Stop,
            Event::StopRequested,
            ClusterState::Created,
        );
        assert!(!needs_nodes(&stop), "not even a look at the nodes");
        assert_eq!(plan(&stop, &Spec::default(), &[], &CONTROL_FIRST), vec![]);
        let delete = never_started(
            OperationKind::Destroy,
            Event::DestroyRequested,
            ClusterState::Destroying,
        );
        assert!(!needs_nodes(&delete));
        assert_eq!(plan(&delete, &Spec::default(), &[], &CONTROL_FIRST), vec![]);
    }

    #[test]
    fn upgrade_is_rolling_control_first_and_skips_upgraded_nodes() {
        let op = OperationRecord::pending(
            "op".into(),
            "c",
            "uid",
            OperationKind::Upgrade,
            Event::UpgradeRequested,
            OperationParams {
                version: Some("1.30.0".into()),
                ..Default::default()
            },
            ClusterState::Running,
            ClusterState::Upgrading,
            "",
            String::new(),
        );
        let nodes = [
            node("worker-0", "worker", "1.29.0"),
            node("worker-1", "worker", "1.30.0"),
            node("control-0", "control", "1.29.0"),
        ];
        let ids = upgraded(&plan(&op, &Spec::default(), &nodes, &CONTROL_FIRST));
        assert_eq!(ids, ["control-0", "worker-0"]);
    }

    fn upgraded(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::UpgradeNode { node_id, .. } => node_id.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// A provider that switches its primary over to an upgraded replica
    /// wants the workers first and the control node last.
    #[test]
    fn upgrade_goes_workers_first_when_the_provider_says_so() {
        let nodes = [
            node("worker-1", "worker", "1.29.0"),
            node("control-0", "control", "1.29.0"),
            node("worker-0", "worker", "1.29.0"),
            node("worker-2", "worker", "1.30.0"),
        ];
        let op = upgrade_to("1.30.0");
        let steps = plan(&op, &Spec::default(), &nodes, &WORKERS_FIRST);
        assert_eq!(upgraded(&steps), ["worker-0", "worker-1", "control-0"]);
        let steps = plan(&op, &Spec::default(), &nodes, &CONTROL_FIRST);
        assert_eq!(upgraded(&steps), ["control-0", "worker-0", "worker-1"]);
    }

    /// `max_unavailable` workers in one step, control nodes one by one,
    /// in the provider's order.
    #[test]
    fn workers_are_upgraded_max_unavailable_at_a_time() {
        let nodes = [
            node("control-0", "control", "1.29.0"),
            node("worker-0", "worker", "1.29.0"),
            node("worker-1", "worker", "1.29.0"),
            node("worker-2", "worker", "1.29.0"),
        ];
        let mut spec = Spec::default();
        spec.upgrade_policy.max_unavailable = Some(2);
        let op = upgrade_to("1.30.0");
        let names: Vec<String> = plan(&op, &spec, &nodes, &WORKERS_FIRST)
            .iter()
            .map(Step::name)
            .collect();
        assert_eq!(
            names,
            [
                "upgrade nodes worker-0,worker-1 to 1.30.0",
                "upgrade node worker-2 to 1.30.0",
                "upgrade node control-0 to 1.30.0",
            ]
        );
    }

    /// A surge: workers added and upgraded first, the count restored
    /// last, also when only the restore is left (a crash after the last
    /// node's upgrade).
    #[test]
    fn a_surge_adds_workers_first_and_removes_them_last() {
        let mut spec = Spec {
            worker_nodes: 1,
            ..Spec::default()
        };
        spec.upgrade_policy.max_surge = Some(1);
        let op = upgrade_to("1.30.0");
        let nodes = [
            node("control-0", "control", "1.29.0"),
            node("worker-0", "worker", "1.29.0"),
        ];
        let names: Vec<String> = plan(&op, &spec, &nodes, &CONTROL_FIRST)
            .iter()
            .map(Step::name)
            .collect();
        assert_eq!(
            names,
            [
                "surge to 2 workers, the new ones at 1.30.0",
                "upgrade node control-0 to 1.30.0",
                "upgrade node worker-0 to 1.30.0",
                "resize to 1 workers",
            ]
        );
        let after_crash = [
            node("control-0", "control", "1.30.0"),
            node("worker-0", "worker", "1.30.0"),
            node("worker-1", "worker", "1.30.0"),
        ];
        let steps = plan(&op, &spec, &after_crash, &CONTROL_FIRST);
        assert_eq!(
            steps.iter().map(Step::name).collect::<Vec<_>>(),
            ["resize to 1 workers"]
        );
    }

    #[test]
    fn recover_repairs_then_checks_health() {
        let op = OperationRecord::pending(
            "op".into(),
            "c",
            "uid",
            OperationKind::Recover,
            Event::RecoveryRequested,
            OperationParams::default(),
            ClusterState::Alert,
            ClusterState::Recovering,
            "",
            String::new(),
        );
        let steps = plan(&op, &Spec::default(), &[], &CONTROL_FIRST);
        let every = Step::RepairNodes(Vec::new());
        assert_eq!(steps, [every.clone(), Step::HealthCheck]);
        assert_eq!(every.name(), "repair nodes");
        assert!(every.is_mutating());
    }

    fn recover_of(node_ids: &[&str]) -> OperationRecord {
        OperationRecord::pending(
            "op".into(),
            "c",
            "uid",
            OperationKind::Recover,
            Event::RecoveryRequested,
            OperationParams {
                node_ids: node_ids.iter().map(|id| id.to_string()).collect(),
                ..OperationParams::default()
            },
            ClusterState::Alert,
            ClusterState::Recovering,
            "",
            String::new(),
        )
    }

    fn names(steps: &[Step]) -> Vec<String> {
        steps.iter().map(Step::name).collect()
    }

    /// A remediation repairs the nodes it names; a missing worker is added
    /// back by a resize to the spec's count, a missing control node is
    /// the provider's to rebuild (every node repaired).
    #[test]
    fn a_recover_repairs_the_named_nodes_and_adds_back_missing_workers() {
        let spec = Spec {
            control_nodes: 1,
            worker_nodes: 3,
            ..Spec::default()
        };
        let nodes = vec![
            node("control-0", "control", "1.30.0"),
            node("worker-0", "worker", "1.30.0"),
            node("worker-1", "worker", "1.30.0"),
        ];
        let steps = plan(&recover_of(&["worker-1"]), &spec, &nodes, &CONTROL_FIRST);
        assert_eq!(
            names(&steps),
            [
                "repair nodes worker-1",
                "resize to 3 workers",
                "health check"
            ]
        );
        let steps = plan(
            &recover_of(&["missing-worker-1"]),
            &spec,
            &nodes,
            &CONTROL_FIRST,
        );
        assert_eq!(names(&steps), ["resize to 3 workers", "health check"]);
        let steps = plan(
            &recover_of(&["missing-control-1"]),
            &spec,
            &nodes[1..],
            &CONTROL_FIRST,
        );
        assert_eq!(names(&steps)[0], "repair nodes");
    }

    /// Under a policy of replacement, with a provider that can: a worker
    /// added, then the bad one deleted; re-planned after a crash at any
    /// point, nothing is added twice. A control node is still repaired; a
    /// provider that cannot replace repairs.
    #[test]
    fn a_recover_replaces_named_workers_once_through_a_crash() {
        let mut spec = Spec {
            control_nodes: 1,
            worker_nodes: 2,
            ..Spec::default()
        };
        spec.health.remediation = crate::health::policy::REPLACE.into();
        let can = Capabilities {
            replace_workers: true,
            ..Capabilities::default()
        };
        let op = recover_of(&["worker-1"]);
        let mut nodes = vec![
            node("control-0", "control", "1.30.0"),
            node("worker-0", "worker", "1.30.0"),
            node("worker-1", "worker", "1.30.0"),
        ];
        assert_eq!(
            names(&plan(&op, &spec, &nodes, &can)),
            [
                "resize to 3 workers",
                "delete nodes worker-1",
                "health check"
            ]
        );
        assert_eq!(
            names(&plan(&op, &spec, &nodes, &CONTROL_FIRST)),
            ["repair nodes worker-1", "health check"],
            "a provider that cannot replace repairs"
        );
        nodes.push(node("worker-2", "worker", "1.30.0"));
        assert_eq!(
            names(&plan(&op, &spec, &nodes, &can)),
            ["delete nodes worker-1", "health check"],
            "added before a crash: not added again"
        );
        nodes.retain(|n| n.id != "worker-1");
        assert_eq!(names(&plan(&op, &spec, &nodes, &can)), ["health check"]);
        let control = recover_of(&["control-0"]);
        assert_eq!(
            names(&plan(&control, &spec, &nodes, &can)),
            ["repair nodes control-0", "health check"]
        );
    }

    fn upgrade_to(version: &str) -> OperationRecord {
        OperationRecord::pending(
            "op".into(),
            "c",
            "uid",
            OperationKind::Upgrade,
            Event::UpgradeRequested,
            crate::operation::OperationParams {
                version: Some(version.into()),
                ..Default::default()
            },
            ClusterState::Running,
            ClusterState::Upgrading,
            "",
            String::new(),
        )
    }

    #[test]
    fn an_upgrade_of_a_cluster_without_nodes_is_refused_not_planned_empty() {
        let op = upgrade_to("1.30.0");
        let refused = check_plan_input(&op, &[]).unwrap_err();
        assert!(refused.contains("no nodes"), "{refused}");
        let nodes = [node("control-0", "control", "1.30.0")];
        assert_eq!(check_plan_input(&op, &nodes), Ok(()));
        assert_eq!(
            check_plan_input(&start_from(ClusterState::Error), &[]),
            Ok(())
        );
    }

    #[test]
    fn a_resumed_operation_picks_up_at_its_persisted_step_of_the_same_plan() {
        let mut op = start_from(ClusterState::Created);
        let steps = plan(&op, &Spec::default(), &[], &CONTROL_FIRST);
        assert_eq!(resume_index(&op, &steps), 0, "never started");
        op.progress = Some(crate::operation::Progress {
            step: 2,
            total_steps: 2,
            step_name: Step::HealthCheck.name(),
        });
        assert_eq!(resume_index(&op, &steps), 1);
        // Another plan (an upgrade re-planned from the nodes): from its start.
        op.progress = Some(crate::operation::Progress {
            step: 2,
            total_steps: 3,
            step_name: Step::HealthCheck.name(),
        });
        assert_eq!(resume_index(&op, &steps), 0);
    }

    /// Every call a step sends has its retry series created at 0 (the
    /// alert on provider retries compares increases).
    #[test]
    fn every_step_call_is_a_labelled_retry_series() {
        let steps = [
            Step::CreateNodes,
            Step::StartNodes,
            Step::StopNodes,
            Step::Resize {
                workers: None,
                offering: None,
            },
            Step::UpgradeNode {
                node_id: String::new(),
                version: String::new(),
            },
            Step::DeleteNodes(Vec::new()),
            Step::RepairNodes(Vec::new()),
            Step::HealthCheck,
        ];
        for step in steps {
            let call = step.provider_call();
            assert!(
                crate::metrics::RETRIED_PROVIDER_CALLS.contains(&call),
                "{call} has no retry series"
            );
        }
    }
}
