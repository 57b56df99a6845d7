//! A cluster's state history, rebuilt from its operations: each one moved
//! the cluster from its `from_state` into its `entered_state` when it was
//! accepted, and the next one found it in its own `from_state`.
//!
//! # Caveats
//! - Only as far back as the operations kept (`--operation-history`);
//!   a change no operation made (a health check's Alert) shows as the
//!   current state's entry, at the time the state key says.
//! - When the state an operation left the cluster in is known only from
//!   the next operation's `from_state`, its time is the first one's
//!   `finished_at`.

use drover_proto::{v1, Timestamp};
use serde::Serialize;

/// The cluster entered `state` at `at` (unknown for the oldest entry when
/// history was collected), through operation `operation` when one did it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entered {
    /// The proto name (`CLUSTER_STATE_RUNNING`).
    pub state: &'static str,
    pub at: Option<Timestamp>,
    pub operation: Option<String>,
}

fn state_name(state: i32) -> &'static str {
    v1::ClusterState::try_from(state)
        .unwrap_or(v1::ClusterState::Unspecified)
        .as_str_name()
}

/// The timeline of `cluster` from `operations` (newest first, as the API
/// lists them), oldest entry first.
pub fn timeline(cluster: &v1::Cluster, operations: &[v1::Operation]) -> Vec<Entered> {
    let mut entries: Vec<Entered> = Vec::new();
    let mut previous: Option<&v1::Operation> = None;
    for op in operations.iter().rev() {
        let from = state_name(op.from_state);
        let at = match previous {
            Some(previous) => previous.finished_at,
            // Only a first start finds the cluster as it was created.
            None => (from == "CLUSTER_STATE_CREATED")
                .then_some(cluster.created_at)
                .flatten(),
        };
        push(&mut entries, from, at, previous.map(|p| p.id.as_str()));
        let entered = state_name(op.entered_state);
        let at = op.started_at.or(op.created_at);
        push(&mut entries, entered, at, Some(&op.id));
        previous = Some(op);
    }
    let status = cluster.status.as_ref();
    let current = state_name(status.and_then(|s| s.state).unwrap_or_default());
    let at = status.and_then(|s| s.state_changed_at);
    let by = previous.map(|p| p.id.as_str());
    push(&mut entries, current, at, by);
    entries
}

/// Adds an entry unless the cluster is in `state` already.
fn push(entries: &mut Vec<Entered>, state: &'static str, at: Option<Timestamp>, by: Option<&str>) {
    if entries.last().is_some_and(|last| last.state == state) {
        return;
    }
    entries.push(Entered {
        state,
        at,
        operation: by.map(str::to_string),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Option<Timestamp> {
        Some(Timestamp { seconds, nanos: 0 })
    }

    fn op(id: &str, from: v1::ClusterState, entered: v1::ClusterState, t: i64) -> v1::Operation {
        v1::Operation {
            id: id.into(),
            from_state: from as i32,
            entered_state: entered as i32,
            created_at: at(t),
            started_at: at(t + 1),
            finished_at: at(t + 5),
            ..Default::default()
        }
    }

    #[test]
    fn operations_make_the_timeline_oldest_first() {
        use v1::ClusterState as S;
        let cluster = v1::Cluster {
            created_at: at(0),
            status: Some(v1::ClusterStatus {
                state: Some(S::Running as i32),
                state_changed_at: at(25),
                ..Default::default()
            }),
            ..Default::default()
        };
        let newest_first = [
            op("up", S::Running, S::Upgrading, 20),
            op("start", S::Created, S::Starting, 10),
        ];
        let got: Vec<_> = timeline(&cluster, &newest_first)
            .into_iter()
            .map(|e| (e.state, e.at.map(|t| t.seconds), e.operation))
            .collect();
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            got,
            [
                ("CLUSTER_STATE_CREATED", Some(0), None),
                ("CLUSTER_STATE_STARTING", Some(11), some("start")),
                ("CLUSTER_STATE_RUNNING", Some(15), some("start")),
                ("CLUSTER_STATE_UPGRADING", Some(21), some("up")),
                ("CLUSTER_STATE_RUNNING", Some(25), some("up")),
            ]
        );
    }
}
