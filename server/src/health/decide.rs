//! What to remediate now: a pure function of a cluster's records, its
//! maintenance window and the time, so the model and the tests ask the
//! same question the controller does.
//!
//! # Guarantees
//! - Nothing is remediated while the cluster holds an operation, is
//!   paused, or is not in Alert (the only state a Recover leaves from).
//! - The short-circuit: when more nodes are unhealthy than
//!   `max_unhealthy` allows, none is remediated, and the decision says so.
//! - A node is remediated at most `max_retry` times, never twice within
//!   `retry_period`; a node that has been healthy for
//!   `min_healthy_period` since its last remediation has its retries back.
//! - At most `max_in_flight` nodes per remediation, and at most one
//!   control node.
//! - The quorum guard: a control node is remediated only when the other
//!   control nodes that are ready still make a quorum of all of them (a
//!   cluster with a single control node has no quorum to lose). With 3
//!   control nodes and one already down, the second is not touched.
//! - Outside the maintenance window only an urgent fault is remediated: a
//!   cluster with no ready control node.
//!
//! # Caveats
//! - "Healthy since" is not recorded; a node's healthy period after a
//!   remediation is measured from the remediation's start to now (ready)
//!   or to when it was next seen not ready, so it includes the
//!   remediation's own run.

use super::policy::{judge, NodeHealth, Policy};
use crate::cluster::{ClusterRecord, ClusterState, NodeRemediation, NodeStatus};
use crate::task::schedule::parse_time;
use chrono::{DateTime, Utc};

/// What the remediation controller does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Remediate these nodes; `kept` is the remediation record with their
    /// attempts not yet counted (entries reset or gone dropped).
    Remediate {
        nodes: Vec<String>,
        kept: Vec<NodeRemediation>,
    },
    /// Nothing now: why (empty when there is nothing to remediate), and
    /// when to look again (a timeout or a retry period ending).
    Wait {
        message: String,
        short_circuited: bool,
        kept: Vec<NodeRemediation>,
        look_at: Option<DateTime<Utc>>,
    },
}

/// Why the maintenance window holds remediation back now, and when it
/// opens; `None`: open.
pub type WindowClosed = Option<(String, Option<DateTime<Utc>>)>;

/// Decides for `cluster` at `now`; `window` says whether its maintenance
/// window is closed.
pub fn decide(cluster: &ClusterRecord, window: WindowClosed, now: DateTime<Utc>) -> Decision {
    let spec = &cluster.spec.spec;
    let policy = Policy::of(&spec.health);
    let status = cluster.status.clone().unwrap_or_default();
    let nodes = &status.nodes;
    let kept = kept_entries(&status.remediation.nodes, nodes, &policy, now);
    let wait = |message: String, look_at| Decision::Wait {
        message,
        short_circuited: false,
        kept: kept.clone(),
        look_at,
    };
    let judged: Vec<_> = nodes.iter().map(|n| (n, judge(n, &policy, now))).collect();
    let unhealthy: Vec<&NodeStatus> = judged
        .iter()
        .filter(|(_, j)| j.health == NodeHealth::Unhealthy)
        .map(|(n, _)| *n)
        .collect();
    let turns_unhealthy = judged
        .iter()
        .filter(|(_, j)| j.health == NodeHealth::NotReady)
        .filter_map(|(_, j)| j.unhealthy_at)
        .min();
    if cluster.state.operation.is_some() || cluster.state.state != ClusterState::Alert {
        return wait(String::new(), None);
    }
    if unhealthy.is_empty() {
        return wait(String::new(), turns_unhealthy);
    }
    let names = names(&unhealthy);
    if spec.paused {
        return wait(
            format!("paused: unhealthy nodes {names} are not remediated until unpaused"),
            None,
        );
    }
    if policy.max_retry == 0 {
        return wait(
            format!("remediation is off (max_retry 0): unhealthy nodes {names}"),
            None,
        );
    }
    let allowed = policy.max_unhealthy.of(nodes.len());
    if unhealthy.len() > allowed {
        return Decision::Wait {
            message: format!(
                "short-circuited: {} of {} nodes unhealthy ({names}), more than max_unhealthy {} ({allowed}); none is remediated",
                unhealthy.len(),
                nodes.len(),
                match spec.health.max_unhealthy.as_str() {
                    "" => super::policy::DEFAULT_MAX_UNHEALTHY,
                    given => given,
                },
            ),
            short_circuited: true,
            kept,
            look_at: None,
        };
    }
    if let Some((why, opens)) = window {
        if !control_plane_down(nodes) {
            return wait(format!("{why}: unhealthy nodes {names} wait for it"), opens);
        }
    }
    pick(&unhealthy, nodes, kept.clone(), &policy, now)
}

/// The remediation record without the entries of nodes gone, or healthy
/// for `min_healthy_period` since their last remediation.
fn kept_entries(
    entries: &[NodeRemediation],
    nodes: &[NodeStatus],
    policy: &Policy,
    now: DateTime<Utc>,
) -> Vec<NodeRemediation> {
    let healthy_for_long = |entry: &NodeRemediation, node: &NodeStatus| {
        let Some(started) = parse_time(&entry.last_started_at) else {
            return true;
        };
        let healthy_until = match &node.not_ready_since {
            None => now,
            Some(since) => parse_time(since).unwrap_or(started),
        };
        let period = chrono::Duration::from_std(policy.min_healthy_period).unwrap_or_default();
        healthy_until - started >= period
    };
    entries
        .iter()
        .filter(|entry| {
            let node = nodes.iter().find(|n| n.id == entry.node_id);
            node.is_some_and(|node| !healthy_for_long(entry, node))
        })
        .cloned()
        .collect()
}

/// The unhealthy nodes to remediate now, within retries, the retry period,
/// the in-flight limit and the quorum guard; or why none.
fn pick(
    unhealthy: &[&NodeStatus],
    nodes: &[NodeStatus],
    kept: Vec<NodeRemediation>,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Decision {
    let mut picked: Vec<String> = Vec::new();
    let mut held = Vec::new();
    let mut look_at: Option<DateTime<Utc>> = None;
    for node in unhealthy {
        let entry = kept.iter().find(|e| e.node_id == node.id);
        let attempts = entry.map_or(0, |e| e.attempts);
        if attempts >= policy.max_retry {
            held.push(format!(
                "{}: retries used up ({attempts} of {})",
                node.id, policy.max_retry
            ));
            continue;
        }
        let retry_at = entry
            .and_then(|e| parse_time(&e.last_started_at))
            .map(|t| t + chrono::Duration::from_std(policy.retry_period).unwrap_or_default());
        if let Some(at) = retry_at.filter(|at| *at > now) {
            held.push(format!(
                "{}: next try after {}",
                node.id,
                at.format("%H:%M:%S")
            ));
            look_at = Some(look_at.map_or(at, |l| l.min(at)));
            continue;
        }
        if node.role == "control" {
            if let Some(why) = quorum_refusal(node, nodes, &picked) {
                held.push(format!("{}: {why}", node.id));
                continue;
            }
        }
        if picked.len() < policy.max_in_flight as usize {
            picked.push(node.id.clone());
        }
    }
    if picked.is_empty() {
        return Decision::Wait {
            message: format!("not remediated: {}", held.join("; ")),
            short_circuited: false,
            kept,
            look_at,
        };
    }
    Decision::Remediate {
        nodes: picked,
        kept,
    }
}

/// Why remediating control node `node` is refused, when it is: another
/// control node is already picked, or the ready control nodes besides it
/// would not make a quorum of all of them.
fn quorum_refusal(node: &NodeStatus, nodes: &[NodeStatus], picked: &[String]) -> Option<String> {
    let control: Vec<&NodeStatus> = nodes.iter().filter(|n| n.role == "control").collect();
    if control.iter().any(|n| picked.contains(&n.id)) {
        return Some("one control node at a time".into());
    }
    if control.len() <= 1 {
        return None;
    }
    let quorum = control.len() / 2 + 1;
    let ready_others = control
        .iter()
        .filter(|n| n.id != node.id && n.ready)
        .count();
    (ready_others < quorum).then(|| {
        format!(
            "would lose the control plane's quorum ({ready_others} of {} control nodes ready besides it, {quorum} needed)",
            control.len()
        )
    })
}

/// No control node is ready: the cluster is down, which no window holds.
fn control_plane_down(nodes: &[NodeStatus]) -> bool {
    let mut control = nodes.iter().filter(|n| n.role == "control").peekable();
    control.peek().is_some() && control.all(|n| !n.ready)
}

fn names(nodes: &[&NodeStatus]) -> String {
    let ids: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    ids.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{
        HealthPolicy, OperationSlot, RemediationStatus, Spec, SpecRecord, StateRecord, StatusRecord,
    };

    const NOW: &str = "2026-01-01T01:00:00Z";
    /// Long enough ago for any default timeout.
    const LONG_AGO: &str = "2026-01-01T00:00:00Z";

    fn at(text: &str) -> DateTime<Utc> {
        parse_time(text).unwrap()
    }

    fn node(id: &str, role: &str, ready: bool) -> NodeStatus {
        NodeStatus {
            id: id.into(),
            role: role.into(),
            power_state: "on".into(),
            version: "1.30.0".into(),
            ready,
            facts: Default::default(),
            not_ready_since: (!ready).then(|| LONG_AGO.to_string()),
            never_ready: false,
        }
    }

    fn cluster(nodes: Vec<NodeStatus>, health: HealthPolicy) -> ClusterRecord {
        ClusterRecord {
            spec: SpecRecord {
                schema: 1,
                name: "c".into(),
                uid: "u".into(),
                generation: 1,
                spec: Spec {
                    health,
                    ..Default::default()
                },
                created_at: LONG_AGO.into(),
                request_id: String::new(),
            },
            spec_revision: 1,
            state: StateRecord {
                schema: 1,
                uid: "u".into(),
                state: ClusterState::Alert,
                operation: None,
                changed_at: LONG_AGO.into(),
            },
            state_revision: 1,
            status: Some(StatusRecord {
                nodes,
                ..Default::default()
            }),
            status_revision: 1,
        }
    }

    fn remediated(decision: &Decision) -> Vec<String> {
        match decision {
            Decision::Remediate { nodes, .. } => nodes.clone(),
            Decision::Wait { .. } => Vec::new(),
        }
    }

    fn message(decision: &Decision) -> String {
        match decision {
            Decision::Wait { message, .. } => message.clone(),
            Decision::Remediate { .. } => String::new(),
        }
    }

    fn workers(unhealthy: usize, total: usize) -> Vec<NodeStatus> {
        let mut nodes = vec![node("c1", "control", true)];
        nodes.extend((0..total).map(|i| node(&format!("w{i}"), "worker", i >= unhealthy)));
        nodes
    }

    #[test]
    fn an_unhealthy_node_is_remediated_one_in_flight_at_a_time() {
        let c = cluster(workers(2, 4), HealthPolicy::default());
        assert_eq!(remediated(&decide(&c, None, at(NOW))), ["w0"]);
        let health = HealthPolicy {
            max_in_flight: Some(2),
            ..Default::default()
        };
        let c = cluster(workers(2, 4), health);
        assert_eq!(remediated(&decide(&c, None, at(NOW))), ["w0", "w1"]);
    }

    #[test]
    fn more_unhealthy_than_max_unhealthy_remediates_none_and_says_so() {
        // 3 of 5 nodes: above 40% (2).
        let c = cluster(workers(3, 4), HealthPolicy::default());
        let decision = decide(&c, None, at(NOW));
        assert!(matches!(
            decision,
            Decision::Wait {
                short_circuited: true,
                ..
            }
        ));
        assert!(
            message(&decision).contains("short-circuited: 3 of 5"),
            "{decision:?}"
        );
    }

    #[test]
    fn a_node_within_its_timeout_waits_and_says_when_to_look_again() {
        let mut nodes = workers(0, 2);
        nodes[1].ready = false;
        nodes[1].not_ready_since = Some("2026-01-01T00:59:00Z".into());
        let c = cluster(nodes, HealthPolicy::default());
        let decision = decide(&c, None, at(NOW));
        let look_at = at("2026-01-01T01:04:00Z");
        assert!(
            matches!(&decision, Decision::Wait { look_at: Some(t), .. } if *t == look_at),
            "{decision:?}"
        );
    }

    #[test]
    fn the_quorum_guard_leaves_a_second_control_node_alone() {
        let one_down = vec![
            node("c1", "control", false),
            node("c2", "control", true),
            node("c3", "control", true),
        ];
        let c = cluster(one_down, HealthPolicy::default());
        assert_eq!(remediated(&decide(&c, None, at(NOW))), ["c1"]);
        let two_down = vec![
            node("c1", "control", false),
            node("c2", "control", false),
            node("c3", "control", true),
        ];
        let c = cluster(two_down, HealthPolicy::default());
        let decision = decide(&c, None, at(NOW));
        assert!(remediated(&decision).is_empty(), "{decision:?}");
        assert!(message(&decision).contains("quorum"), "{decision:?}");
        // A single control node has no quorum to lose.
        let single = vec![node("c1", "control", false), node("w1", "worker", true)];
        let c = cluster(single, HealthPolicy::default());
        assert_eq!(remediated(&decide(&c, None, at(NOW))), ["c1"]);
    }

    #[test]
    fn one_control_node_per_remediation_even_with_room() {
        let nodes = vec![
            node("c1", "control", false),
            node("c2", "control", true),
            node("c3", "control", true),
            node("c4", "control", true),
            node("c5", "control", false),
        ];
        let health = HealthPolicy {
            max_in_flight: Some(3),
            ..Default::default()
        };
        let c = cluster(nodes, health);
        assert_eq!(remediated(&decide(&c, None, at(NOW))), ["c1"]);
    }

    #[test]
    fn retries_are_limited_spaced_and_reset_after_a_healthy_period() {
        let mut c = cluster(workers(1, 3), HealthPolicy::default());
        let entry = |attempts, at: &str| NodeRemediation {
            node_id: "w0".into(),
            attempts,
            last_started_at: at.into(),
        };
        let set = |c: &mut ClusterRecord, e: NodeRemediation| {
            c.status.as_mut().unwrap().remediation = RemediationStatus {
                nodes: vec![e],
                ..Default::default()
            };
        };
        // Tried 2 minutes ago: the retry period (5 min) holds it.
        set(&mut c, entry(1, "2026-01-01T00:58:00Z"));
        let node = &mut c.status.as_mut().unwrap().nodes[1];
        node.not_ready_since = Some("2026-01-01T00:50:00Z".into());
        let decision = decide(&c, None, at(NOW));
        assert!(
            message(&decision).contains("next try after"),
            "{decision:?}"
        );
        // Three tries used, the node never ready since: given up.
        set(&mut c, entry(3, "2026-01-01T00:40:00Z"));
        let node = &mut c.status.as_mut().unwrap().nodes[1];
        node.not_ready_since = Some("2026-01-01T00:30:00Z".into());
        let decision = decide(&c, None, at(NOW));
        assert!(
            message(&decision).contains("retries used up (3 of 3)"),
            "{decision:?}"
        );
        // Healthy for 10 minutes after its last try, then down again: new.
        set(&mut c, entry(3, "2026-01-01T00:20:00Z"));
        let node = &mut c.status.as_mut().unwrap().nodes[1];
        node.not_ready_since = Some("2026-01-01T00:40:00Z".into());
        let decision = decide(&c, None, at(NOW));
        assert_eq!(remediated(&decision), ["w0"], "{decision:?}");
        assert!(matches!(&decision, Decision::Remediate { kept, .. } if kept.is_empty()));
    }

    #[test]
    fn nothing_while_busy_paused_off_or_outside_the_window_unless_down() {
        let mut c = cluster(workers(1, 3), HealthPolicy::default());
        c.state.operation = Some(OperationSlot {
            id: "op".into(),
            kind: "upgrade".into(),
        });
        assert!(remediated(&decide(&c, None, at(NOW))).is_empty());
        c.state.operation = None;
        c.spec.spec.paused = true;
        assert!(message(&decide(&c, None, at(NOW))).starts_with("paused"));
        c.spec.spec.paused = false;
        c.spec.spec.health.max_retry = Some(0);
        assert!(message(&decide(&c, None, at(NOW))).contains("remediation is off"));
        c.spec.spec.health.max_retry = None;
        let closed = || Some(("outside the maintenance window".to_string(), None));
        let decision = decide(&c, closed(), at(NOW));
        assert!(
            message(&decision).contains("maintenance window"),
            "{decision:?}"
        );
        // The only control node down: urgent, the window does not hold it.
        let down = cluster(vec![node("c1", "control", false)], HealthPolicy::default());
        assert_eq!(remediated(&decide(&down, closed(), at(NOW))), ["c1"]);
        c.state.state = ClusterState::Running;
        assert!(
            remediated(&decide(&c, None, at(NOW))).is_empty(),
            "only from Alert"
        );
    }
}
