//! The console's live feed: the cluster cache's state changes and every
//! operation write the replica's one watch delivers, turned into
//! server-sent events for every open page, and the steps of recent
//! operations with the time each was first seen while a page was open.
//!
//! One follower per replica, not per page: the pages share a broadcast
//! channel of ready-made event frames.
//!
//! # Guarantees
//! - After a `reset` event a page has missed nothing it does not read
//!   again: `reset` is sent whenever the feed (re)subscribes, the cache
//!   listed anew, or a page fell behind the broadcast buffer.
//!
//! # Caveats
//! - Events say what changed, not everything about it: a page reads the
//!   JSON it shows again (a cluster's status and nodes are not in them).

use crate::api::convert::{operation_to_proto, state_to_proto};
use crate::cluster::{from_json, CacheChange, ClusterCache, StateRecord};
use crate::keys::KeyLayout;
use crate::operation::OperationRecord;
use crate::store::{EventKind, KeyValue};
use hyper::body::Bytes;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// Frames buffered per page; a page further behind is sent `reset`.
const EVENTS_BUFFER: usize = 1024;
/// Operations whose steps are remembered; the oldest is forgotten first.
const REMEMBERED_OPERATIONS: usize = 1024;
/// Steps remembered per operation (a provider's plans have a few dozen).
const REMEMBERED_STEPS: usize = 256;
const RESUBSCRIBE_DELAY: Duration = Duration::from_millis(200);

/// When this replica first saw an operation at a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepSeen {
    pub step: u32,
    pub total_steps: u32,
    pub step_name: String,
    /// RFC 3339, milliseconds.
    pub seen_at: String,
}

#[derive(Default)]
struct StepLog {
    steps: HashMap<String, Vec<StepSeen>>,
    /// Insertion order of `steps`' keys, for eviction.
    order: VecDeque<String>,
}

impl StepLog {
    fn observe(&mut self, record: &OperationRecord, now: &str) {
        let Some(progress) = &record.progress else {
            return;
        };
        let key = format!("{}/{}", record.cluster, record.id);
        if !self.steps.contains_key(&key) {
            if self.order.len() >= REMEMBERED_OPERATIONS {
                if let Some(oldest) = self.order.pop_front() {
                    self.steps.remove(&oldest);
                }
            }
            self.order.push_back(key.clone());
        }
        let steps = self.steps.entry(key).or_default();
        let same =
            |seen: &StepSeen| seen.step == progress.step && seen.step_name == progress.step_name;
        if steps.last().is_some_and(same) || steps.len() >= REMEMBERED_STEPS {
            return;
        }
        steps.push(StepSeen {
            step: progress.step,
            total_steps: progress.total_steps,
            step_name: progress.step_name.clone(),
            seen_at: now.to_string(),
        });
    }
}

/// The feed every console page of this replica follows.
pub struct ConsoleFeed {
    events: broadcast::Sender<Bytes>,
    steps: Mutex<StepLog>,
}

/// One server-sent event frame.
pub(super) fn frame(event: &str, data: &impl Serialize) -> Bytes {
    let data = serde_json::to_string(data).expect("event data serializes");
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

#[derive(Serialize)]
struct ClusterChanged<'a> {
    name: &'a str,
    state: &'static str,
    operation: Option<&'a str>,
    revision: i64,
}

impl ConsoleFeed {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            events: broadcast::channel(EVENTS_BUFFER).0,
            steps: Mutex::default(),
        })
    }

    /// The event frames from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Bytes> {
        self.events.subscribe()
    }

    /// The steps seen of operation `id` of `cluster`, oldest first.
    pub fn steps(&self, cluster: &str, id: &str) -> Vec<StepSeen> {
        let log = self.steps.lock().unwrap_or_else(|p| p.into_inner());
        log.steps
            .get(&format!("{cluster}/{id}"))
            .cloned()
            .unwrap_or_default()
    }

    fn send(&self, frame: Bytes) {
        // The last page may have closed since: nobody to tell.
        let _ = self.events.send(frame);
    }

    /// Follows `cache` until `stop` turns true or its sender goes.
    pub async fn run(
        self: Arc<Self>,
        cache: Arc<ClusterCache>,
        keys: KeyLayout,
        mut stop: watch::Receiver<bool>,
    ) {
        let prefix = keys.all_operations();
        while !*stop.borrow() {
            let mut states = cache.subscribe();
            let Some((mut operations, _)) = cache.watch_keys(&prefix) else {
                // The watch is starting or listing again.
                tokio::select! {
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(RESUBSCRIBE_DELAY) => {}
                }
                continue;
            };
            self.send(frame("reset", &serde_json::json!({})));
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    change = states.recv() => match change {
                        Ok(CacheChange::State(kv)) => self.state_changed(&keys, &kv),
                        Ok(CacheChange::Tasks(_)) => {}
                        Ok(CacheChange::Relisted) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            self.send(frame("reset", &serde_json::json!({})));
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    event = operations.next() => match event {
                        Some(Ok(event)) if event.kind == EventKind::Put => {
                            self.operation_written(&event.kv);
                        }
                        Some(Ok(_)) => {}
                        // The watch restarted: subscribe again.
                        Some(Err(_)) | None => break,
                    },
                }
            }
        }
    }

    /// Whether a console page follows the feed: without one, a change is
    /// not worth a frame (every replica sees every operation's writes).
    fn followed(&self) -> bool {
        self.events.receiver_count() > 0
    }

    fn state_changed(&self, keys: &KeyLayout, kv: &KeyValue) {
        if !self.followed() {
            return;
        }
        let Some((name, _)) = keys.split_cluster_key(&kv.key) else {
            return;
        };
        let Ok(state) = from_json::<StateRecord>(kv) else {
            return;
        };
        let changed = ClusterChanged {
            name,
            state: state_to_proto(state.state).as_str_name(),
            operation: state.operation.as_ref().map(|slot| slot.id.as_str()),
            revision: kv.mod_revision,
        };
        self.send(frame("cluster", &changed));
    }

    fn operation_written(&self, kv: &KeyValue) {
        // Parsing every operation write of the fleet on every replica cost
        // about a twentieth of a replica's CPU with no page open.
        if !self.followed() {
            return;
        }
        let Ok(record) = from_json::<OperationRecord>(kv) else {
            return;
        };
        let now = crate::cluster::now_rfc3339();
        self.steps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(&record, &now);
        self.send(frame("operation", &operation_to_proto(record)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::Progress;

    /// Operation op1 of cluster c, an upgrade at no step yet.
    fn running_upgrade() -> OperationRecord {
        serde_json::from_value(serde_json::json!({
            "schema": 1, "id": "op1", "cluster": "c", "cluster_uid": "u",
            "kind": "Upgrade", "event": "UpgradeRequested", "params": {}, "state": "Running",
            "from_state": "Running", "entered_state": "Upgrading",
            "created_at": "2024-01-01T00:00:00Z"
        }))
        .expect("a record")
    }

    #[test]
    fn steps_are_logged_only_while_a_page_is_open() {
        let mut record = running_upgrade();
        record.progress = Some(Progress {
            step: 1,
            total_steps: 2,
            step_name: "upgrade n1".into(),
        });
        let kv = KeyValue {
            key: "/d/operations/c/op1".into(),
            value: serde_json::to_vec(&record).unwrap(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        };
        let feed = ConsoleFeed::new();
        feed.operation_written(&kv);
        assert!(feed.steps("c", "op1").is_empty(), "no page: nothing parsed");
        let _page = feed.subscribe();
        feed.operation_written(&kv);
        assert_eq!(feed.steps("c", "op1").len(), 1);
    }

    #[test]
    fn steps_are_logged_once_each_and_old_operations_forgotten() {
        let mut record = running_upgrade();
        let mut log = StepLog::default();
        for (step, at) in [(1, "t1"), (1, "t2"), (2, "t3")] {
            record.progress = Some(Progress {
                step,
                total_steps: 2,
                step_name: format!("step {step}"),
            });
            log.observe(&record, at);
        }
        let seen: Vec<_> = log.steps["c/op1"]
            .iter()
            .map(|s| (s.step, s.seen_at.as_str()))
            .collect();
        assert_eq!(seen, [(1, "t1"), (2, "t3")]);
        for i in 0..REMEMBERED_OPERATIONS {
            record.id = format!("other{i}");
            log.observe(&record, "t");
        }
        assert!(!log.steps.contains_key("c/op1"));
        assert_eq!(log.steps.len(), REMEMBERED_OPERATIONS);
    }
}
