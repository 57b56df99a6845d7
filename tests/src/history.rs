//! Replays the history of every state key from etcd and checks each change
//! against the state machine table.

use drover_server::cluster::machine;
use drover_server::cluster::{ClusterState, StateRecord};
use drover_server::store::{EventKind, RangeRequest, Store};
use std::collections::HashMap;
use std::time::Duration;

/// Every state each cluster (by uid) went through, in order, from revision 1.
pub async fn state_history(store: &dyn Store, prefix: &str) -> HashMap<String, Vec<ClusterState>> {
    let clusters = format!("{prefix}clusters/");
    // Every write under clusters/ puts at least one key there, so the newest
    // mod revision among the keys is the last change to replay.
    let current = store
        .range(RangeRequest::prefix(&clusters))
        .await
        .expect("read clusters");
    let Some(head) = current.kvs.iter().map(|kv| kv.mod_revision).max() else {
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
        if event.kind == EventKind::Put && event.kv.key.ends_with("/state") {
            let record: StateRecord = serde_json::from_slice(&event.kv.value).expect("state JSON");
            let states = history.entry(record.uid.clone()).or_default();
            if states.last() != Some(&record.state) {
                states.push(record.state);
            }
        }
        if event.kv.mod_revision >= head {
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
    for (uid, states) in &history {
        assert!(
            matches!(
                states.first(),
                Some(ClusterState::Created | ClusterState::Starting)
            ),
            "cluster {uid} began in {:?}",
            states.first()
        );
        for pair in states.windows(2) {
            assert!(
                machine::is_edge(pair[0], pair[1]),
                "cluster {uid} moved {} -> {}, which is not an edge (history {states:?})",
                pair[0],
                pair[1]
            );
        }
    }
    history
}
