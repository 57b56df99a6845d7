//! Operations: planning and committing the accept of a lifecycle request
//! (one etcd transaction each), reading, waiting for and cancelling
//! operations, and bounding their history.
//!
//! Accepting is split so that it needs nothing from above: this module
//! plans the transaction ([`Operations::plan_accept`], no side effects) and
//! commits it ([`Operations::commit_accept`]); the executor, which owns the
//! request path (`Executor::submit`), adds its claim to the plan in between
//! when this replica owns the cluster.
//!
//! # Guarantees
//! - Accepting compares the state key's revision, so at most one request
//!   fills a cluster's operation slot; a loser changes nothing and gets
//!   [`LifecycleError::Busy`] or [`LifecycleError::Raced`] (ABORTED).
//! - A request whose event has no transition from the cluster's state (and
//!   is no go-ahead) is refused with [`LifecycleError::NoTransition`].
//! - A repeated `request_id` returns the operation it first created, while
//!   that operation is in the history and for at least
//!   [`REQUEST_RETENTION`] after history collection deleted it (its request
//!   entry then carries it); it never starts another.
//! - History collection is an owner write: fenced by the owner's claim.

mod accept;
mod feed;
mod record;

pub use accept::{request_field, AcceptPlan, Accepted, LifecycleRequest};
pub use record::{
    OperationError, OperationKind, OperationParams, OperationRecord, OperationRun, OperationState,
    Progress, RequestRecord,
};

use crate::cluster::machine::{self, Event};
use crate::cluster::{
    from_json, to_json, ClusterCache, ClusterRecord, ClusterState, Registry, RegistryError,
};
use crate::keys::KeyLayout;
use crate::metrics::Metrics;
use crate::replication::Claim;
use crate::store::StoreFailure;
use crate::store::{
    CmpOp, Compare, KeyValue, LeaseId, Op, OpResult, RangeRequest, SharedStore, StoreError, Txn,
};
use crate::sync::lock;
use feed::OperationFeed;
pub(crate) use feed::{Follower, Seen};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("operation {id:?} of cluster {cluster:?} not found")]
    NotFound { cluster: String, id: String },
    #[error(
        "cluster {cluster:?} is busy with operation {operation} ({kind}); retry when it completes"
    )]
    Busy {
        cluster: String,
        operation: String,
        kind: String,
    },
    #[error("cluster {0:?} changed while the request was being accepted; retry")]
    Raced(String),
    #[error("operation {id} already ended {state:?}: there is nothing to cancel")]
    Ended { id: String, state: OperationState },
    #[error("cluster {cluster:?} is {state}: {kind} is not possible from this state")]
    NoTransition {
        cluster: String,
        state: ClusterState,
        kind: &'static str,
    },
    #[error("cluster {0:?} is Stopped: a stopped cluster can only change its node offering")]
    StoppedClusterScale(String),
    #[error("version: {target} is lower than cluster {cluster:?}'s current version {current}; a downgrade needs allow_downgrade (droverctl cluster upgrade --allow-downgrade)")]
    Downgrade {
        cluster: String,
        current: String,
        target: String,
    },
    #[error("this replica has no provider configured (--provider): it cannot run operations")]
    NoProvider,
    #[error("cluster {cluster:?} was written by a newer Drover (record schema {schema}, this replica knows {known}); use a newer replica")]
    NewerSchema {
        cluster: String,
        schema: u32,
        known: u32,
    },
    #[error("cluster {0:?} has no live owner")]
    NoOwner(String),
    #[error("the provider did not answer: {0}")]
    ProviderUnavailable(String),
    #[error(transparent)]
    Invalid(#[from] crate::cluster::validate::FieldError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl From<StoreError> for LifecycleError {
    fn from(error: StoreError) -> Self {
        LifecycleError::Registry(RegistryError::Store(error))
    }
}

impl StoreFailure for LifecycleError {
    fn store_error(&self) -> Option<&StoreError> {
        match self {
            LifecycleError::Registry(error) => error.store_error(),
            _ => None,
        }
    }
}

pub type Result<T, E = LifecycleError> = std::result::Result<T, E>;

/// An operation record and the mod revision it was read at.
#[derive(Debug, Clone)]
pub struct Versioned {
    pub record: OperationRecord,
    pub revision: i64,
}

/// One page of a cluster's operations, newest first.
pub struct OperationPage {
    pub operations: Vec<OperationRecord>,
    pub next_before: Option<String>,
}

/// The operations in the store.
#[derive(Clone)]
pub struct Operations {
    store: SharedStore,
    keys: KeyLayout,
    registry: Registry,
    /// Finished operations kept per cluster.
    history_limit: usize,
    metrics: Arc<Metrics>,
    feed: Arc<OperationFeed>,
    /// This replica's watch cache, which a wait lets catch up with the
    /// operation it reports.
    cache: Option<Arc<ClusterCache>>,
    /// The lease request entries of collected operations are bound to
    /// now, and when it was granted.
    retention: Arc<Mutex<Option<(LeaseId, Instant)>>>,
}

impl Operations {
    pub fn new(
        store: SharedStore,
        keys: KeyLayout,
        history_limit: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        let registry = Registry::new(store.clone(), keys.clone());
        Self {
            store,
            keys,
            registry,
            history_limit,
            metrics,
            feed: OperationFeed::new(),
            cache: None,
            retention: Arc::new(Mutex::new(None)),
        }
    }

    /// A wait answers once this cache shows the operation's last write.
    pub fn with_cache(mut self, cache: Arc<ClusterCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Refuses to rewrite a cluster whose records have a newer schema than
    /// this build understands, and says so in the log and the metrics.
    pub fn check_schema(&self, cluster: &ClusterRecord) -> Result<()> {
        let Some(schema) = cluster.newer_schema() else {
            return Ok(());
        };
        let known = crate::cluster::SCHEMA_VERSION;
        tracing::warn!(cluster = %cluster.spec.name, schema, known, "record schema is newer than this replica understands: leaving the cluster alone");
        self.metrics.newer_schema_skipped.inc();
        Err(LifecycleError::NewerSchema {
            cluster: cluster.spec.name.clone(),
            schema,
            known,
        })
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// Reads one operation.
    pub async fn get(&self, cluster: &str, id: &str) -> Result<Versioned> {
        let kv = self
            .store
            .get(&self.keys.operation(cluster, id))
            .await?
            .into_single()
            .ok_or_else(|| LifecycleError::NotFound {
                cluster: cluster.to_string(),
                id: id.to_string(),
            })?;
        Ok(Versioned {
            record: from_json(&kv)?,
            revision: kv.mod_revision,
        })
    }

    /// A cluster's spec, state and status and one of its operations, read
    /// in one request (a read-only transaction) at one revision.
    pub async fn get_with_cluster(
        &self,
        cluster: &str,
        id: &str,
    ) -> Result<(ClusterRecord, Option<Versioned>)> {
        let operation_key = self.keys.operation(cluster, id);
        let read = Txn::new().and_then([
            Op::get(self.keys.cluster_spec(cluster)),
            Op::get(self.keys.cluster_state(cluster)),
            Op::get(self.keys.cluster_status(cluster)),
            Op::get(&operation_key),
        ]);
        let mut kvs: Vec<KeyValue> = self
            .store
            .txn(read)
            .await?
            .results
            .into_iter()
            .filter_map(|result| match result {
                OpResult::Get(kv) => kv,
                _ => None,
            })
            .collect();
        let operation = match kvs.iter().position(|kv| kv.key == operation_key) {
            Some(at) => {
                let kv = kvs.remove(at);
                Some(Versioned {
                    record: from_json(&kv)?,
                    revision: kv.mod_revision,
                })
            }
            None => None,
        };
        let cluster = self
            .registry
            .assemble(kvs)?
            .ok_or_else(|| RegistryError::NotFound(cluster.to_string()))?;
        Ok((cluster, operation))
    }

    /// The operation a request id created, if any: its record, or the copy
    /// the request entry carries once history collection deleted it.
    pub async fn by_request_id(
        &self,
        cluster: &str,
        request_id: &str,
    ) -> Result<Option<Versioned>> {
        if request_id.is_empty() {
            return Ok(None);
        }
        let key = self.keys.request(cluster, request_id);
        let Some((entry, revision)) = self.request_entry(&key).await? else {
            return Ok(None);
        };
        if let Some(record) = entry.operation {
            return Ok(Some(Versioned {
                record: *record,
                revision,
            }));
        }
        match self.get(cluster, &entry.operation_id).await {
            // Collected between the two reads: the transaction that deleted
            // the record made the entry carry it.
            Err(LifecycleError::NotFound { .. }) => match self.request_entry(&key).await? {
                Some((
                    RequestRecord {
                        operation: Some(record),
                        ..
                    },
                    revision,
                )) => Ok(Some(Versioned {
                    record: *record,
                    revision,
                })),
                _ => Err(LifecycleError::NotFound {
                    cluster: cluster.to_string(),
                    id: entry.operation_id,
                }),
            },
            read => read.map(Some),
        }
    }

    /// A request entry, in either form, and its mod revision.
    async fn request_entry(&self, key: &str) -> Result<Option<(RequestRecord, i64)>> {
        let Some(kv) = self.store.get(key).await?.into_single() else {
            return Ok(None);
        };
        let entry = RequestRecord::parse(&kv.value).map_err(|error| RegistryError::Corrupt {
            key: kv.key.clone(),
            reason: error.to_string(),
        })?;
        Ok(Some((entry, kv.mod_revision)))
    }

    /// Lists a cluster's operations, newest first, before `before` (an id).
    pub async fn list(
        &self,
        cluster: &str,
        before: Option<&str>,
        page_size: usize,
    ) -> Result<OperationPage> {
        let all = self
            .store
            .range(RangeRequest::prefix(self.keys.operations(cluster)))
            .await?;
        let mut records: Vec<OperationRecord> = all
            .kvs
            .iter()
            .rev()
            .filter(|kv| before.is_none_or(|b| kv.key < self.keys.operation(cluster, b)))
            .take(page_size + 1)
            .map(|kv| from_json(kv).map_err(LifecycleError::from))
            .collect::<Result<_>>()?;
        let next_before = (records.len() > page_size).then(|| {
            records.truncate(page_size);
            records.last().map(|r| r.id.clone()).unwrap_or_default()
        });
        Ok(OperationPage {
            operations: records,
            next_before,
        })
    }

    /// Waits until the operation is terminal or `timeout` passes; returns it
    /// as last seen. Driven by the operation feed, not by polling; no read
    /// when the feed already knows the record.
    pub async fn wait(
        &self,
        cluster: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<OperationRecord> {
        let key = self.keys.operation(cluster, id);
        // Follow before reading, so no change after the read is missed.
        let mut follower = self.follow(&key);
        let Versioned {
            record: mut latest,
            mut revision,
        } = match follower.known.take() {
            Some(kv) => Versioned {
                record: from_json(&kv)?,
                revision: kv.mod_revision,
            },
            None => self.get(cluster, id).await?,
        };
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        while !latest.state.is_terminal() {
            tokio::select! {
                _ = &mut deadline => break,
                seen = follower.next() => match seen {
                    Some(Seen::Record(kv)) if kv.mod_revision > revision => {
                        latest = from_json(&kv)?;
                        revision = kv.mod_revision;
                    }
                    Some(Seen::Record(_) | Seen::Nothing) => {}
                    // The feed restarted and may have missed writes.
                    Some(Seen::Resync) => {
                        Versioned { record: latest, revision } = self.get(cluster, id).await?;
                    }
                    None => break,
                },
            }
        }
        if let (true, Some(cache)) = (latest.state.is_terminal(), &self.cache) {
            // The feed can be ahead of the cluster cache (a record this
            // replica wrote reaches it before any watch does): a client
            // that asks this replica for the cluster, or for its next
            // operation, next must find the cluster as the operation left
            // it, not still busy.
            cache
                .wait_until_applied(revision, ClusterCache::CATCH_UP)
                .await;
        }
        Ok(latest)
    }

    /// Starts the operation feed from the watch cache's watch (once; without
    /// a cache it never goes live). A replica starts it as it starts: the
    /// feed remembers only records written after it went live, and the
    /// first operation another replica accepts for this one must be among
    /// them, or the owner reads it from etcd and writes a step to claim it.
    pub fn start_feed(&self) {
        if let Some(cache) = &self.cache {
            self.feed.start(cache, &self.keys.all_operations());
        }
    }

    /// Follows one operation key through the feed (started here if it was
    /// not yet).
    pub(crate) fn follow(&self, key: &str) -> Follower {
        self.start_feed();
        self.feed.follow(key)
    }

    /// The newest revision the operation feed has seen (0 before it is live).
    pub(crate) fn feed_revision(&self) -> i64 {
        self.feed.revision()
    }

    /// An operation record this replica wrote at `revision`: followers here
    /// learn of it at once.
    pub(crate) fn record_own_write(&self, key: String, value: Vec<u8>, revision: i64) {
        self.feed.record_own_write(KeyValue {
            key,
            value,
            create_revision: revision,
            mod_revision: revision,
            version: 0,
            lease: 0,
        });
    }

    /// Moves an idle cluster by a non-request event (FaultsDetected), a CAS
    /// on the state as read and on `fence` (the owner's claim); `message`
    /// goes to the status.
    pub async fn transition(
        &self,
        cluster: &ClusterRecord,
        event: Event,
        message: String,
        fence: &[Compare],
    ) -> Result<ClusterState> {
        let name = &cluster.spec.name;
        let from = cluster.state.state;
        let to = machine::next(from, event).ok_or_else(|| LifecycleError::NoTransition {
            cluster: name.clone(),
            state: from,
            kind: "this transition",
        })?;
        let mut state = cluster.state.clone();
        state.state = to;
        state.changed_at = crate::cluster::now_rfc3339();
        let mut status = cluster.status.clone().unwrap_or_default();
        status.schema = crate::cluster::SCHEMA_VERSION;
        status.message = Some(message.clone());
        let state_key = self.keys.cluster_state(name);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                &state_key,
                CmpOp::Equal,
                cluster.state_revision,
            )])
            .when(fence.iter().cloned())
            .and_then([
                Op::put(&state_key, to_json(&state)),
                Op::put(self.keys.cluster_status(name), to_json(&status)),
            ]);
        self.store.cas(txn).await?;
        self.metrics.transition(from, to);
        tracing::info!(cluster = %name, %from, %to, %event, message, "cluster moved");
        Ok(to)
    }

    /// Asks an operation to stop at its next step boundary.
    pub async fn cancel(&self, cluster: &str, id: &str) -> Result<OperationRecord> {
        self.request_end(cluster, id, None).await
    }

    /// Abandons operation `id` for `reason` (see AbandonOperation): a
    /// cancel that ends it even when its provider cannot be fenced.
    pub async fn abandon(&self, cluster: &str, id: &str, reason: &str) -> Result<OperationRecord> {
        let record = self.request_end(cluster, id, Some(reason)).await?;
        tracing::warn!(
            cluster,
            operation = id,
            reason,
            "operation abandoned by an admin: Drover cannot prove its provider stopped"
        );
        Ok(record)
    }

    /// Records a cancel request, with an abandon reason when given.
    async fn request_end(
        &self,
        cluster: &str,
        id: &str,
        abandon: Option<&str>,
    ) -> Result<OperationRecord> {
        loop {
            let Versioned {
                mut record,
                revision,
                ..
            } = self.get(cluster, id).await?;
            if record.state.is_terminal() {
                return Err(LifecycleError::Ended {
                    id: id.to_string(),
                    state: record.state,
                });
            }
            let abandon = abandon.map(str::to_string);
            if record.cancel_requested && (abandon.is_none() || record.abandon_reason == abandon) {
                return Ok(record);
            }
            record.cancel_requested = true;
            if abandon.is_some() {
                record.abandon_reason = abandon;
            }
            let key = self.keys.operation(cluster, id);
            let txn = Txn::new()
                .when([Compare::mod_revision(&key, CmpOp::Equal, revision)])
                .and_then([Op::put(&key, to_json(&record))]);
            match self.store.cas(txn).await {
                Ok(_) => {
                    tracing::info!(cluster, operation = id, "cancel requested");
                    return Ok(record);
                }
                // The executor moved it on meanwhile: look again.
                Err(StoreError::Conflict { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// The history size at which a cluster's history is collected: the
    /// limit plus the GC slack.
    pub fn gc_threshold(&self) -> usize {
        self.history_limit + gc_slack(self.history_limit)
    }

    /// Deletes the oldest finished operations beyond the history limit and
    /// returns the history size left. `expected` is the history size the
    /// caller counted on (0: unknown): the oldest records over the limit are
    /// read in the request that counts the history. The deletes are an
    /// owner write, fenced by `claim`: under a claim that no longer holds,
    /// nothing is collected.
    ///
    /// A deleted operation's request entry is rewritten to carry the record
    /// and bound to a lease of [`REQUEST_RETENTION`]: its request id keeps
    /// answering with the operation (and starting nothing) that long,
    /// however short the history.
    pub async fn collect_garbage(
        &self,
        cluster: &str,
        expected: usize,
        claim: &Claim,
    ) -> Result<usize> {
        let prefix = self.keys.operations(cluster);
        // Operation ids are time-ordered, so key order is age order; etcd
        // counts the whole range along with the few records returned.
        let guess = expected
            .saturating_sub(self.history_limit)
            .clamp(1, GC_BATCH);
        let oldest = self
            .store
            .range(RangeRequest::prefix(prefix).limit(guess as i64))
            .await?;
        let count = oldest.count;
        // Collect only once the history is a batch over the limit, so the
        // deletes cost one write per batch rather than one per operation.
        if count < self.gc_threshold() {
            return Ok(count);
        }
        let excess = count - self.history_limit;
        let mut collected = Vec::new();
        for kv in oldest.kvs.iter().take(excess) {
            let record: OperationRecord = from_json(kv)?;
            if record.state.is_terminal() {
                collected.push((kv.key.clone(), record));
            }
        }
        if collected.is_empty() {
            return Ok(count);
        }
        let deleted = collected.len();
        let lease = if collected.iter().any(|(_, r)| !r.request_id.is_empty()) {
            self.retention_lease().await?
        } else {
            0
        };
        let mut ops = Vec::new();
        for (key, record) in collected {
            ops.push(Op::delete(key));
            if !record.request_id.is_empty() {
                let entry = self.keys.request(cluster, &record.request_id);
                let carrying = to_json(&RequestRecord::carrying(record));
                ops.push(Op::put_with_lease(entry, carrying, lease));
            }
        }
        // A finished record does not change; only the owner's claim is
        // compared.
        let txn = Txn::new()
            .when(claim.fence(&self.keys, cluster))
            .and_then(ops);
        match self.store.txn(txn).await {
            Ok(result) if result.succeeded => Ok(count - deleted),
            Ok(_) => {
                tracing::debug!(cluster, "history not collected: the claim no longer holds");
                Ok(count)
            }
            Err(error) => {
                if matches!(error, StoreError::LeaseNotFound(_)) {
                    *lock(&self.retention) = None;
                }
                Err(error.into())
            }
        }
    }

    /// A lease of at least [`REQUEST_RETENTION`] for request entries: one
    /// is shared by all the collections of [`RETENTION_SHARING`] (one lease
    /// per collection would be thousands of leases an hour at ten thousand
    /// clusters).
    async fn retention_lease(&self) -> Result<LeaseId> {
        if let Some((lease, granted)) = *lock(&self.retention) {
            if granted.elapsed() < RETENTION_SHARING {
                return Ok(lease);
            }
        }
        let ttl = (REQUEST_RETENTION + RETENTION_SHARING).as_secs() as i64;
        let lease = self.store.grant_lease(ttl).await?;
        *lock(&self.retention) = Some((lease, Instant::now()));
        Ok(lease)
    }
}

/// How long a request id keeps answering with its operation after history
/// collection deleted the operation's record: far longer than any client
/// retries a request (the Rust client gives up within about 20 s).
pub const REQUEST_RETENTION: Duration = Duration::from_secs(3600);

/// How long one retention lease is used for new request entries; its TTL
/// is this much longer than [`REQUEST_RETENTION`].
const RETENTION_SHARING: Duration = Duration::from_secs(60);

/// How far over the limit the history may grow before it is collected.
fn gc_slack(limit: usize) -> usize {
    (limit / 4).clamp(1, GC_BATCH)
}

/// Records deleted per garbage-collection transaction (two ops each, well
/// under etcd's 128 operations per transaction).
const GC_BATCH: usize = 50;
