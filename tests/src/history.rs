//! The history checker: replays the history of every state key from etcd
//! and checks each change against the state machine table; checks the
//! provider's history of landed calls against the operations' ends; checks
//! that a quiet cluster's status shows the nodes the provider has.
//!
//! The checks that return violations (instead of panicking) let a
//! randomized test print every broken invariant with its seed.

use drover_client::v1;
use drover_proto::provider::v1 as pb;
use drover_server::cluster::machine;
use drover_server::cluster::{ClusterState, StateRecord};
use drover_server::store::{EventKind, RangeRequest, Store};
use std::collections::HashMap;
use std::time::Duration;

/// Every state each cluster (by uid) went through, in order, from revision 1.
pub async fn state_history(store: &dyn Store, prefix: &str) -> HashMap<String, Vec<ClusterState>> {
    let clusters = format!("{prefix}clusters/");
    // The newest change of a state key is the last one to replay (a
    // transaction's other keys may come before it, in the same revision).
    let current = store
        .range(RangeRequest::prefix(&clusters))
        .await
        .expect("read clusters");
    let is_state = |key: &str| {
        let leaf = key
            .strip_prefix(clusters.as_str())
            .map(|rest| rest.split_once('/'));
        matches!(leaf, Some(Some((_, "state"))))
    };
    let states = current.kvs.iter().filter(|kv| is_state(&kv.key));
    let Some(head) = states.map(|kv| kv.mod_revision).max() else {
        return HashMap::new();
    };
    let mut watch = store.watch(&clusters, 1).await.expect("watch history");
    let mut history: HashMap<String, Vec<ClusterState>> = HashMap::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("history replays promptly")
            .expect("watch open")
            .expect("history is not compacted");
        // `<clusters>/<name>/state`, not a task's key that ends the same.
        let state_key = is_state(&event.kv.key);
        if event.kind == EventKind::Put && state_key {
            let record: StateRecord = serde_json::from_slice(&event.kv.value).expect("state JSON");
            let states = history.entry(record.uid.clone()).or_default();
            if states.last() != Some(&record.state) {
                states.push(record.state);
            }
        }
        if (state_key && event.kv.mod_revision >= head) || event.kv.mod_revision > head {
            return history;
        }
    }
}

/// Asserts every observed change is an edge of the table and returns the
/// histories for further checks.
pub async fn assert_transitions_are_edges(
    store: &dyn Store,
    prefix: &str,
) -> HashMap<String, Vec<ClusterState>> {
    let history = state_history(store, prefix).await;
    let violations = transition_violations(&history);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    history
}

/// Every change in `history` that is not an edge of the table, and every
/// cluster that began elsewhere than Created or Starting.
pub fn transition_violations(history: &HashMap<String, Vec<ClusterState>>) -> Vec<String> {
    let mut violations = Vec::new();
    for (uid, states) in history {
        if !matches!(
            states.first(),
            Some(ClusterState::Created | ClusterState::Starting)
        ) {
            violations.push(format!("cluster {uid} began in {:?}", states.first()));
        }
        for pair in states.windows(2) {
            if !machine::is_edge(pair[0], pair[1]) {
                violations.push(format!(
                    "cluster {uid} moved {} -> {}, which is not an edge (history {states:?})",
                    pair[0], pair[1]
                ));
            }
        }
    }
    violations
}

/// When each operation ended (Unix milliseconds), by id; operations still
/// going are absent.
pub fn ends(operations: &[v1::Operation]) -> HashMap<String, u64> {
    operations
        .iter()
        .filter_map(|op| {
            let at = op.finished_at.as_ref()?;
            let ms = at.seconds.max(0) as u64 * 1000 + at.nanos.max(0) as u64 / 1_000_000;
            Some((op.id.clone(), ms))
        })
        .collect()
}

/// Checks the provider's history (its audit log, in landing order) against
/// the operations' ends: no call landed under an epoch older than one the
/// provider had already accepted for its cluster (a fence, or another
/// call), and none landed after its operation ended.
///
/// Both clocks are this host's wall clock; times are in whole milliseconds,
/// so only a landing a millisecond or more after the end is flagged.
pub fn provider_violations(entries: &[pb::AuditEntry], ends: &HashMap<String, u64>) -> Vec<String> {
    let mut violations = Vec::new();
    let mut newest: HashMap<&str, i64> = HashMap::new();
    for entry in entries {
        let Some(token) = entry.token.as_ref() else {
            violations.push(format!("a call landed without a token: {entry:?}"));
            continue;
        };
        let seen = newest.entry(token.cluster_uid.as_str()).or_insert(i64::MIN);
        let fenced = entry.newest_epoch_at_landing.max(*seen);
        if token.epoch < fenced {
            violations.push(format!(
                "{} of operation {} landed under epoch {} after epoch {fenced} was accepted \
                 for cluster {} (admitted at {} ms, landed at {} ms)",
                entry.method,
                token.operation_id,
                token.epoch,
                token.cluster_uid,
                entry.admitted_at_ms,
                entry.landed_at_ms
            ));
        }
        *seen = fenced;
        if let Some(&end) = ends.get(&token.operation_id) {
            if entry.landed_at_ms > end {
                violations.push(format!(
                    "{} of operation {} landed at {} ms, {} ms after the operation ended",
                    entry.method,
                    token.operation_id,
                    entry.landed_at_ms,
                    entry.landed_at_ms - end
                ));
            }
        }
    }
    violations
}

/// Whether a cluster's `status.nodes` shows exactly the provider's nodes.
/// Facts are left out: they change on their own (a replication lag) and
/// the status shows them as of its last write, which they never cause.
pub fn node_violations(
    cluster: &str,
    status: &[v1::Node],
    provider: &[pb::ProviderNode],
) -> Option<String> {
    type Shown = (String, String, String, String, bool);
    let mut shown: Vec<Shown> = status
        .iter()
        .map(|n| {
            let (id, role, power) = (n.id.clone(), n.role.clone(), n.power_state.clone());
            (id, role, power, n.version.clone(), n.ready)
        })
        .collect();
    let mut real: Vec<Shown> = provider
        .iter()
        .map(|n| {
            let (id, role, power) = (n.id.clone(), n.role.clone(), n.power_state.clone());
            let ready = drover_server::provider::node_ready(n);
            (id, role, power, n.version.clone(), ready)
        })
        .collect();
    shown.sort();
    real.sort();
    (shown != real)
        .then(|| format!("cluster {cluster}: status.nodes {shown:?} but the provider has {real:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn landed(method: &str, op: &str, epoch: i64, newest: i64, landed_at: u64) -> pb::AuditEntry {
        pb::AuditEntry {
            method: method.into(),
            token: Some(pb::FencingToken {
                cluster_uid: "u1".into(),
                epoch,
                operation_id: op.into(),
            }),
            newest_epoch_at_landing: newest,
            admitted_at_ms: landed_at - 5,
            landed_at_ms: landed_at,
            ..Default::default()
        }
    }

    #[test]
    fn a_kind_history_has_no_violation() {
        let entries = [
            landed("CreateNodes", "a", 3, 3, 100),
            landed("StopNodes", "b", 7, 7, 200),
        ];
        let ends = HashMap::from([("a".to_string(), 150), ("b".to_string(), 200)]);
        assert!(provider_violations(&entries, &ends).is_empty());
    }

    #[test]
    fn a_call_landing_after_a_fence_is_a_violation() {
        // Admitted under 3, landed after a fence under 7 was accepted.
        let late = [landed("StopNodes", "a", 3, 7, 100)];
        let found = provider_violations(&late, &HashMap::new());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("under epoch 3 after epoch 7"),
            "{found:?}"
        );
        // Or after another call under a newer epoch landed.
        let crossed = [
            landed("StopNodes", "b", 7, 7, 100),
            landed("StartNodes", "a", 3, 3, 120),
        ];
        assert_eq!(provider_violations(&crossed, &HashMap::new()).len(), 1);
    }

    #[test]
    fn a_call_landing_after_its_operation_ended_is_a_violation() {
        let entries = [landed("UpgradeNode", "a", 3, 3, 300)];
        let ends = HashMap::from([("a".to_string(), 250)]);
        let found = provider_violations(&entries, &ends);
        assert!(
            found[0].contains("50 ms after the operation ended"),
            "{found:?}"
        );
    }

    #[test]
    fn a_status_showing_other_nodes_than_the_provider_is_a_violation() {
        let real = pb::ProviderNode {
            id: "worker-0".into(),
            role: "worker".into(),
            power_state: "on".into(),
            version: "1.29.0".into(),
            healthy: true,
            offering: "m".into(),
            // Moved on since the status was written: not a difference.
            facts: [("lag".to_string(), "5".to_string())].into(),
        };
        let shown = v1::Node {
            id: "worker-0".into(),
            role: "worker".into(),
            power_state: "on".into(),
            version: "1.29.0".into(),
            ready: true,
            facts: [("lag".to_string(), "0".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            node_violations(
                "c",
                std::slice::from_ref(&shown),
                std::slice::from_ref(&real)
            ),
            None
        );
        assert!(node_violations("c", &[], std::slice::from_ref(&real)).is_some());
        let off = v1::Node {
            power_state: "off".into(),
            ready: false,
            ..shown
        };
        assert!(node_violations("c", &[off], &[real]).is_some());
    }

    #[test]
    fn a_move_off_the_table_is_a_violation() {
        let history = HashMap::from([(
            "u1".to_string(),
            vec![
                ClusterState::Starting,
                ClusterState::Running,
                ClusterState::Stopping,
            ],
        )]);
        assert!(transition_violations(&history).is_empty());
        let broken = HashMap::from([(
            "u1".to_string(),
            vec![ClusterState::Starting, ClusterState::Stopped],
        )]);
        assert_eq!(transition_violations(&broken).len(), 1);
    }
}
