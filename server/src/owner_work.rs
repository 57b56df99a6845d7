//! What every kind of owner work shares: the executor's operations, the
//! task scheduler's runs and the status scanner's checks.
//!
//! Each of them runs work for the clusters this replica owns, and each
//! needs the same few things, written once here: the claim check, a stop
//! flag for shutdown, an in-flight mark so one piece of work runs at most
//! once per replica at a time, and the fenced commit that survives a
//! reply etcd lost. The work itself (what to plan, what to call, what to
//! write) stays with its owner, small, as kube-runtime keeps reconcilers
//! small by owning the queue, dedup and requeue itself.
//!
//! # Guarantees
//! - [`OwnerWork::mark`] hands out at most one [`InFlight`] per id at a
//!   time; the mark goes when the guard is dropped, however the work ends
//!   (a panic included).
//! - [`OwnerWork::commit`] applies a transaction only while it carries the
//!   caller's compares; a write whose reply was lost is retried only while
//!   the claim it is fenced by still holds, and recognised afterwards by a
//!   key it wrote, so an unknown outcome is never reported as a loss when
//!   it committed (nor as a success when it did not).
//!
//! # Caveats
//! - A claim checked here may end a moment later: every write still
//!   compares the claim's fence in etcd, so the check only saves work.

use crate::replication::{Claim, Ownership};
use crate::store::{Op, SharedStore, StoreError, Txn};
use crate::sync::lock;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The shared part of one kind of owner work on this replica.
pub struct OwnerWork {
    replication: Arc<Ownership>,
    in_flight: Arc<Mutex<HashSet<String>>>,
    /// Set once the replica shuts down: no new work starts from then on.
    stopping: AtomicBool,
    /// Wakes what waits out a backoff once `stopping` is set.
    stopped: tokio::sync::Notify,
}

/// The mark of one piece of work in flight here; dropping it ends the mark.
#[must_use = "the work is in flight only while the guard lives"]
pub struct InFlight {
    id: String,
    set: Arc<Mutex<HashSet<String>>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.set).remove(&self.id);
    }
}

impl OwnerWork {
    pub fn new(replication: Arc<Ownership>) -> Self {
        Self {
            replication,
            in_flight: Arc::default(),
            stopping: AtomicBool::new(false),
            stopped: tokio::sync::Notify::new(),
        }
    }

    pub fn replication(&self) -> &Arc<Ownership> {
        &self.replication
    }

    /// This replica's claim on `cluster`, while it believes in it.
    pub fn claim(&self, cluster: &str) -> Option<Claim> {
        self.replication.claim(cluster)
    }

    /// Whether this replica still holds `cluster` under `claim` (not a
    /// newer claim of its own: work begun under an older one must stop).
    pub fn holds(&self, cluster: &str, claim: Claim) -> bool {
        self.replication.claim(cluster) == Some(claim)
    }

    /// Marks `id` in flight here; `None` when it already is.
    pub fn mark(&self, id: &str) -> Option<InFlight> {
        lock(&self.in_flight)
            .insert(id.to_string())
            .then(|| InFlight {
                id: id.to_string(),
                set: Arc::clone(&self.in_flight),
            })
    }

    /// How many pieces of work are in flight here now.
    pub fn in_flight(&self) -> usize {
        lock(&self.in_flight).len()
    }

    /// Whether `id` is in flight here now.
    pub fn runs(&self, id: &str) -> bool {
        lock(&self.in_flight).contains(id)
    }

    /// Starts no new work from now on (the replica is shutting down).
    pub fn stop_taking_work(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stopped.notify_waiters();
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Sleeps `delay`, or less when the replica starts shutting down
    /// meanwhile; `false` then (or when it already was).
    pub async fn pause_unless_stopping(&self, delay: Duration) -> bool {
        let stopped = self.stopped.notified();
        tokio::pin!(stopped);
        stopped.as_mut().enable();
        if self.is_stopping() {
            return false;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = stopped => false,
        }
    }

    /// Commits `txn`, an owner write on `cluster` fenced by `claim` (its
    /// compares include the claim's fence), and returns the revision it
    /// committed at.
    ///
    /// etcd being unreachable or out of space is retried while the claim
    /// holds. A write whose outcome was unknown (the connection broke after
    /// sending) and whose retry then lost its compare is recognised by
    /// `marker`, a put of the transaction whose value only this write
    /// produces: found in etcd, the write committed.
    pub async fn commit(
        &self,
        store: &SharedStore,
        txn: Txn,
        cluster: &str,
        claim: Claim,
        marker: Option<&Op>,
    ) -> Result<i64, StoreError> {
        let mut delay = Duration::from_millis(100);
        let mut ambiguous = false;
        loop {
            let error = match store.cas(txn.clone()).await {
                Ok(result) => return Ok(result.revision),
                Err(error) => error,
            };
            match error {
                StoreError::Unavailable(error) if self.holds(cluster, claim) => {
                    tracing::warn!(cluster, %error, retry_in = ?delay, "etcd unavailable; retrying the write");
                    ambiguous = true;
                }
                // Refused before applying: the work waits (holding its
                // cluster) for an operator to free space, instead of
                // failing an operation it could not even record as failed.
                StoreError::NoSpace(error) if self.holds(cluster, claim) => {
                    tracing::error!(cluster, %error, retry_in = ?delay, "etcd is out of space; retrying the write");
                }
                StoreError::Conflict { revision } if ambiguous => {
                    match written_by(store, marker).await {
                        Ok(Some(at)) => return Ok(at),
                        Ok(None) => return Err(StoreError::Conflict { revision }),
                        // Still unreachable: try the whole write again (its
                        // compare fails again if it had committed).
                        Err(StoreError::Unavailable(error)) if self.holds(cluster, claim) => {
                            tracing::warn!(cluster, %error, retry_in = ?delay, "etcd unavailable; retrying the write");
                        }
                        Err(error) => return Err(error),
                    }
                }
                error => return Err(error),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
}

impl OwnerWork {
    /// Reads `key` for owner work on `cluster` under `claim`, retrying while
    /// etcd is unavailable and the claim holds (as [`Self::commit`] does),
    /// so a blip of etcd does not end the work that needs the read.
    pub async fn get_while_held(
        &self,
        store: &SharedStore,
        key: &str,
        cluster: &str,
        claim: Claim,
    ) -> Result<Option<crate::store::KeyValue>, StoreError> {
        let mut delay = Duration::from_millis(100);
        loop {
            match store.get(key).await {
                Ok(read) => return Ok(read.into_single()),
                Err(StoreError::Unavailable(error)) if self.holds(cluster, claim) => {
                    tracing::warn!(cluster, %error, retry_in = ?delay, "etcd unavailable; retrying the read");
                }
                Err(error) => return Err(error),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
}

/// The revision at which `marker` (a put) is in etcd as it would write it,
/// if it is.
async fn written_by(store: &SharedStore, marker: Option<&Op>) -> Result<Option<i64>, StoreError> {
    let Some(Op::Put { key, value, .. }) = marker else {
        return Ok(None);
    };
    let current = store.get(key).await?.into_single();
    Ok(current
        .filter(|kv| &kv.value == value)
        .map(|kv| kv.mod_revision))
}
