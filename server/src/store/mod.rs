//! The key-value store Drover keeps all of its state in.
//!
//! [`Store`] holds exactly the etcd semantics Drover relies on, and nothing
//! more: point and prefix reads that report revisions, transactions with
//! compares, leases whose expiry deletes the keys bound to them, and watches
//! that resume from a revision and report compaction.
//!
//! Two implementations: [`EtcdStore`] for replicated deployments and
//! [`MemoryStore`] for the embedded mode and fast tests. One conformance
//! suite (in the `drover-tests` crate) runs against both.
//!
//! # Guarantees
//! - Every write bumps the store revision by one, whatever it touches; a
//!   transaction's writes share one revision. So may the writes of several
//!   transactions: the etcd store sends small transactions asked for at
//!   once in one request (group commit, `store::etcd::batch`), each with
//!   its own compares and outcome.
//! - Watch events arrive in revision order with no gaps from the requested
//!   start revision; if that revision was compacted the watch fails with
//!   [`StoreError::Compacted`] and the caller must re-list.
//!
//! # Caveats
//! - A lease TTL is a minimum, not a deadline: etcd renews every lease to its
//!   full TTL on a leader change.

mod etcd;
pub mod known_issues;
mod memory;
mod metered;
mod types;

pub use etcd::{EtcdOptions, EtcdStore};
pub use memory::MemoryStore;
pub use metered::MeteredStore;
pub use types::{
    CmpOp, Compare, EventKind, GetResult, KeyValue, LeaseId, Op, OpResult, RangeRequest, Target,
    Txn, TxnResult, WatchEvent, WatchStream,
};

use async_trait::async_trait;
use std::sync::Arc;

/// Errors of a store call, told apart by what the caller should do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or timed out: retry with backoff.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The requested revision is older than the compaction point: re-list.
    #[error("revision {requested} is compacted (oldest kept: {compacted})")]
    Compacted { requested: i64, compacted: i64 },
    /// A compare-and-swap transaction's compares did not hold.
    #[error("conflict: the store changed at revision {revision}")]
    Conflict { revision: i64 },
    /// The lease does not exist or has expired.
    #[error("lease {0:x} not found or expired")]
    LeaseNotFound(LeaseId),
    /// etcd's space quota is exhausted (its NOSPACE alarm is raised): it
    /// refuses every write before applying it, and serves reads. Retrying
    /// helps only once an operator has freed space and disarmed the alarm.
    #[error(
        "etcd is out of space ({0}): it refuses writes until an operator compacts and \
         defragments it and runs `etcdctl alarm disarm` (or raises --quota-backend-bytes); \
         see PRODUCTION.md, \"etcd out of space\""
    )]
    NoSpace(String),
    /// A request the store refused as malformed, or an unexpected failure.
    #[error("store error: {0}")]
    Other(String),
}

/// An error that may be a store's: one definition of "a compare-and-swap
/// lost" for every error type that wraps a store error.
pub trait StoreFailure {
    /// The store error inside, if this is one.
    fn store_error(&self) -> Option<&StoreError>;

    /// A compare-and-swap that lost: what was compared changed meanwhile.
    fn is_conflict(&self) -> bool {
        matches!(self.store_error(), Some(StoreError::Conflict { .. }))
    }
}

impl StoreFailure for StoreError {
    fn store_error(&self) -> Option<&StoreError> {
        Some(self)
    }
}

impl StoreError {
    /// Whether the same call may succeed if retried later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// etcd's raft index and revision, as one member reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftProgress {
    /// Entries committed to the raft log since it began: only grows in one
    /// etcd history.
    pub raft_index: u64,
    pub revision: i64,
}

/// Result of a store call.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A shared handle to a store.
pub type SharedStore = Arc<dyn Store>;

/// The etcd semantics Drover relies on.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads one key at the current revision.
    async fn get(&self, key: &str) -> Result<GetResult>;

    /// Reads keys under a prefix in key order.
    async fn range(&self, request: RangeRequest) -> Result<GetResult>;

    /// Runs a transaction: if every compare holds, the success ops run,
    /// otherwise the failure ops; atomically, at one revision.
    async fn txn(&self, txn: Txn) -> Result<TxnResult>;

    /// Grants a lease of `ttl_seconds`.
    async fn grant_lease(&self, ttl_seconds: i64) -> Result<LeaseId>;

    /// Renews a lease to its full TTL and returns that TTL.
    /// [`StoreError::LeaseNotFound`] once it has expired.
    async fn keep_alive(&self, lease: LeaseId) -> Result<i64>;

    /// Revokes a lease, deleting every key bound to it.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;

    /// Seconds left on a lease, or `None` when it has expired.
    async fn lease_time_to_live(&self, lease: LeaseId) -> Result<Option<i64>>;

    /// Watches every key under `prefix`, starting at `from_revision`
    /// (0 = changes after now). A compacted start revision is reported as
    /// the stream's first item, [`StoreError::Compacted`].
    async fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchStream>;

    /// [`Self::watch`], delivering puts only. etcd drops the deletes before
    /// sending them (a watcher that ignores deletes need not pay for them);
    /// errors are reported as by `watch`.
    async fn watch_puts(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        Ok(self.watch(prefix, from_revision).await?.puts_only())
    }

    /// Discards history older than `revision`.
    async fn compact(&self, revision: i64) -> Result<()>;

    /// The version of the etcd server answering (`None`: not etcd).
    async fn server_version(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// Where etcd's raft log stands (`None`: no raft log, not etcd); a
    /// restore from a snapshot shows as a raft index that went back.
    async fn raft_progress(&self) -> Result<Option<RaftProgress>> {
        Ok(None)
    }

    /// Runs a compare-and-swap transaction that must succeed:
    /// [`StoreError::Conflict`] when its compares do not hold.
    async fn cas(&self, txn: Txn) -> Result<TxnResult> {
        let result = self.txn(txn).await?;
        if result.succeeded {
            Ok(result)
        } else {
            Err(StoreError::Conflict {
                revision: result.revision,
            })
        }
    }
}
