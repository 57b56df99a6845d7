//! Node health checks and automatic remediation (after Cluster API's
//! MachineHealthCheck and KubeadmControlPlane remediation).
//!
//! Reading order: [`policy`] (a cluster's `spec.health` with its defaults
//! and how a node is judged under it), [`decide`] (what to remediate now,
//! a pure function of the cluster's records and the time), [`remediator`]
//! (the reconciler on the owner-work runtime that records a remediation
//! and asks for it through the normal accept path).
//!
//! How a node's readiness is remembered: the status scanner writes each
//! node as the provider shows it, and [`merge_nodes`] keeps since when a
//! node has not been ready across those writes, so a timeout measures the
//! fault, not the last write.

pub mod decide;
pub mod policy;
pub mod remediator;

pub use decide::{decide, Decision};
pub use policy::{judge, Judged, NodeHealth, Policy};
pub use remediator::Remediator;

use crate::cluster::{NodeStatus, Spec};

/// `shown` (the nodes as the provider shows them now) with a placeholder
/// for each node `spec` has and the provider no longer shows (see
/// [`with_missing`]), each with its `not_ready_since` and `never_ready`
/// carried over from `previous` (the status as it was): a node not ready
/// keeps the time it was first seen so; one seen not ready for the first
/// time gets `now`, and is `never_ready` when it was not in `previous` at
/// all (a new node, or the first nodes of a new cluster; never a missing
/// one). A status written before health checks (nodes without
/// `not_ready_since`) starts their clocks now.
pub fn merge_nodes(
    previous: &[NodeStatus],
    shown: Vec<NodeStatus>,
    spec: &Spec,
    now: &str,
) -> Vec<NodeStatus> {
    with_missing(shown, spec)
        .into_iter()
        .map(|mut node| {
            let before = previous.iter().find(|p| p.id == node.id);
            if node.ready {
                node.not_ready_since = None;
                node.never_ready = false;
                return node;
            }
            match before {
                Some(before) if !before.ready && before.not_ready_since.is_some() => {
                    node.not_ready_since = before.not_ready_since.clone();
                    node.never_ready = before.never_ready;
                }
                Some(_) => {
                    node.not_ready_since = Some(now.to_string());
                    node.never_ready = false;
                }
                None => {
                    node.not_ready_since = Some(now.to_string());
                    node.never_ready = !node.is_missing();
                }
            }
            node
        })
        .collect()
}

/// `shown` and, when the provider shows fewer nodes of a role than `spec`
/// asks for, a placeholder for each one short ([`missing`]).
pub fn with_missing(mut shown: Vec<NodeStatus>, spec: &Spec) -> Vec<NodeStatus> {
    let missing = missing(spec, shown.iter().map(|n| n.role.as_str()));
    shown.extend(missing);
    shown
}

/// A placeholder ([`NodeStatus::missing`]) for each node of a role `spec`
/// asks for beyond those of `roles` (the roles of the nodes the provider
/// shows). A cluster the provider shows no node of is not created yet, or
/// destroyed: none is missing.
pub fn missing<'a>(spec: &Spec, roles: impl Iterator<Item = &'a str>) -> Vec<NodeStatus> {
    let (mut control, mut worker, mut any) = (0, 0, false);
    for role in roles {
        any = true;
        match role {
            "control" => control += 1,
            _ => worker += 1,
        }
    }
    if !any {
        return Vec::new();
    }
    let short = |role: &'static str, present: u32, wanted: u32| {
        (1..=wanted.saturating_sub(present) as usize).map(move |n| NodeStatus::missing(role, n))
    };
    let control = short("control", control, spec.control_nodes);
    control
        .chain(short("worker", worker, spec.worker_nodes))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, ready: bool) -> NodeStatus {
        NodeStatus {
            id: id.into(),
            role: "worker".into(),
            power_state: "on".into(),
            version: "1.30.0".into(),
            ready,
            facts: Default::default(),
            not_ready_since: None,
            never_ready: false,
        }
    }

    fn spec(control_nodes: u32, worker_nodes: u32) -> Spec {
        Spec {
            control_nodes,
            worker_nodes,
            ..Spec::default()
        }
    }

    /// A node the spec has and the provider no longer shows is a missing
    /// placeholder whose clock is kept like any node's (judged by the
    /// unhealthy timeout, not the startup one); a cluster without nodes
    /// has none.
    #[test]
    fn a_node_the_provider_no_longer_shows_is_missing_since_first_seen_so() {
        let (t1, t2) = ("2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z");
        let shown = || vec![node("a", true)];
        let first = merge_nodes(
            &[node("a", true), node("b", true)],
            shown(),
            &spec(0, 2),
            t1,
        );
        assert_eq!(first.len(), 2);
        assert_eq!(first[1].id, "missing-worker-1");
        assert!(first[1].is_missing() && !first[1].ready && !first[1].never_ready);
        assert_eq!(first[1].not_ready_since.as_deref(), Some(t1));
        let again = merge_nodes(&first, shown(), &spec(0, 2), t2);
        assert_eq!(again[1].not_ready_since.as_deref(), Some(t1), "kept");
        let back = merge_nodes(
            &again,
            vec![node("a", true), node("c", true)],
            &spec(0, 2),
            t2,
        );
        assert!(back.iter().all(|n| !n.is_missing()));
        assert!(merge_nodes(&again, Vec::new(), &spec(1, 2), t2).is_empty());
    }

    #[test]
    fn a_node_keeps_since_when_it_is_not_ready_and_a_new_one_is_never_ready() {
        let t1 = "2026-01-01T00:00:00Z";
        let t2 = "2026-01-01T00:05:00Z";
        let first = merge_nodes(&[node("a", true)], vec![node("a", false)], &spec(0, 1), t1);
        assert_eq!(first[0].not_ready_since.as_deref(), Some(t1));
        assert!(!first[0].never_ready, "it was ready before");
        let again = merge_nodes(
            &first,
            vec![node("a", false), node("b", false)],
            &spec(0, 2),
            t2,
        );
        assert_eq!(again[0].not_ready_since.as_deref(), Some(t1), "kept");
        assert_eq!(again[1].not_ready_since.as_deref(), Some(t2));
        assert!(again[1].never_ready, "b appeared not ready");
        let healed = merge_nodes(
            &again,
            vec![node("a", true), node("b", true)],
            &spec(0, 2),
            t2,
        );
        assert!(healed
            .iter()
            .all(|n| n.not_ready_since.is_none() && !n.never_ready));
    }

    #[test]
    fn a_status_from_before_health_checks_starts_the_clock_now() {
        let now = "2026-01-01T00:00:00Z";
        let shown = merge_nodes(
            &[node("a", false)],
            vec![node("a", false)],
            &spec(0, 1),
            now,
        );
        assert_eq!(shown[0].not_ready_since.as_deref(), Some(now));
        assert!(!shown[0].never_ready);
    }
}
