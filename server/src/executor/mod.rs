//! The executor: finds accepted operations and runs them step by step
//! through the provider.
//!
//! It lists every cluster state holding an operation slot, then watches the
//! state keys from the list's revision + 1 (re-listing after compaction or a
//! broken watch, and periodically, to catch anything missed).
//!
//! # Guarantees
//! - Every write the executor makes goes through [`run::Holding::commit`],
//!   which compares the state key's and the operation's revisions: an
//!   operation only moves the cluster while it still holds it.
//! - An operation runs at most once per replica at a time.
//!
//! # Caveats
//! - One replica: ownership (and its compare in every write) comes with
//!   replication. An operation found RUNNING at start-up was left by a
//!   previous incarnation of a replica and is failed, never resumed blindly.

mod plan;
mod run;

pub use plan::{plan, Step};

use crate::cluster::{from_json, StateRecord};
use crate::operation::{OperationKind, Operations};
use crate::provider::Provider;
use crate::store::{EventKind, RangeRequest};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const RESCAN_INTERVAL: Duration = Duration::from_secs(30);
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Per-kind operation timeouts.
#[derive(Debug, Clone)]
pub struct Timeouts(HashMap<OperationKind, Duration>);

impl Default for Timeouts {
    /// The reference's defaults: 3600 s, remove-nodes 900 s.
    fn default() -> Self {
        let mut map: HashMap<OperationKind, Duration> = OperationKind::ALL
            .into_iter()
            .map(|k| (k, Duration::from_secs(3600)))
            .collect();
        map.insert(OperationKind::RemoveNodes, Duration::from_secs(900));
        Self(map)
    }
}

impl Timeouts {
    pub fn set(&mut self, kind: OperationKind, timeout: Duration) {
        self.0.insert(kind, timeout);
    }

    pub fn get(&self, kind: OperationKind) -> Duration {
        self.0
            .get(&kind)
            .copied()
            .unwrap_or(Duration::from_secs(3600))
    }
}

/// Runs accepted operations.
pub struct Executor {
    operations: Operations,
    provider: Provider,
    replica_id: String,
    /// Fencing epoch of this replica incarnation: the store revision when it
    /// started, so a later incarnation always carries a newer one.
    epoch: i64,
    timeouts: Timeouts,
    in_flight: Mutex<HashSet<String>>,
}

impl Executor {
    pub fn new(
        operations: Operations,
        provider: Provider,
        replica_id: String,
        epoch: i64,
        timeouts: Timeouts,
    ) -> Arc<Self> {
        Arc::new(Self {
            operations,
            provider,
            replica_id,
            epoch,
            timeouts,
            in_flight: Mutex::new(HashSet::new()),
        })
    }

    /// Finds and runs operations until `shutdown` turns true.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let store = self.operations.store().clone();
        let prefix = self.operations.keys().clusters();
        while !*shutdown.borrow() {
            let listed = match self.scan().await {
                Ok(revision) => revision,
                Err(error) => {
                    tracing::warn!(%error, "executor scan failed; retrying");
                    tokio::time::sleep(RETRY_DELAY).await;
                    continue;
                }
            };
            let mut watch = match store.watch(&prefix, listed + 1).await {
                Ok(watch) => watch,
                Err(error) => {
                    tracing::warn!(%error, "executor watch failed; retrying");
                    tokio::time::sleep(RETRY_DELAY).await;
                    continue;
                }
            };
            let rescan = tokio::time::sleep(RESCAN_INTERVAL);
            tokio::pin!(rescan);
            loop {
                tokio::select! {
                    _ = shutdown.changed() => break,
                    _ = &mut rescan => break,
                    event = watch.next() => match event {
                        Some(Ok(event)) if event.kind == EventKind::Put && event.kv.key.ends_with("/state") => {
                            if let Ok(state) = from_json::<StateRecord>(&event.kv) {
                                self.start_slot(&event.kv.key, &state);
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(error)) => {
                            tracing::info!(%error, "executor watch ended; re-listing");
                            break;
                        }
                        None => break,
                    },
                }
            }
        }
        tracing::info!("executor stopped taking new operations");
    }

    /// Starts every operation found in a slot; returns the list revision.
    async fn scan(self: &Arc<Self>) -> crate::store::Result<i64> {
        let store = self.operations.store();
        let listed = store
            .range(RangeRequest::prefix(self.operations.keys().clusters()))
            .await?;
        for kv in listed.kvs.iter().filter(|kv| kv.key.ends_with("/state")) {
            if let Ok(state) = from_json::<StateRecord>(kv) {
                self.start_slot(&kv.key, &state);
            }
        }
        Ok(listed.revision)
    }

    fn start_slot(self: &Arc<Self>, state_key: &str, state: &StateRecord) {
        let Some(slot) = &state.operation else { return };
        let Some((cluster, _)) = self.operations.keys().split_cluster_key(state_key) else {
            return;
        };
        if !self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot.id.clone())
        {
            return;
        }
        let this = Arc::clone(self);
        let cluster = cluster.to_string();
        let id = slot.id.clone();
        tokio::spawn(async move {
            if let Err(error) = this.drive(&cluster, &id).await {
                tracing::warn!(cluster, operation = id, %error, "operation not finished; will retry on the next scan");
            }
            this.in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        });
    }
}
