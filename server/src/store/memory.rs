//! An in-memory [`Store`] with etcd's semantics: one global revision, MVCC
//! fields per key, transactions, leases that expire and delete their keys,
//! and watches that replay history from a revision.
//!
//! # Assumptions
//! - Runs inside a tokio runtime: [`MemoryStore::new`] spawns the task that
//!   expires leases (every 100 ms; etcd checks every 500 ms).
//!
//! # Caveats
//! - History for watches is kept for the last `history_limit` events; older
//!   revisions behave as compacted.

use super::types::check_ops;
use super::*;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const EXPIRY_TICK: Duration = Duration::from_millis(100);
const DEFAULT_HISTORY_LIMIT: usize = 100_000;

/// The in-memory store. Cheap to clone: clones share one state.
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

struct LeaseState {
    ttl: i64,
    deadline: Instant,
    keys: BTreeSet<String>,
}

struct Watcher {
    prefix: String,
    events: mpsc::UnboundedSender<Result<WatchEvent>>,
}

struct State {
    revision: i64,
    compacted: i64,
    kvs: BTreeMap<String, KeyValue>,
    leases: HashMap<LeaseId, LeaseState>,
    next_lease: LeaseId,
    history: VecDeque<WatchEvent>,
    history_limit: usize,
    watchers: Vec<Watcher>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A new empty store at revision 1 (as a fresh etcd).
    pub fn new() -> Self {
        Self::with_history_limit(DEFAULT_HISTORY_LIMIT)
    }

    /// A new store keeping at most `history_limit` past events for watches.
    pub fn with_history_limit(history_limit: usize) -> Self {
        let state = Arc::new(Mutex::new(State {
            revision: 1,
            compacted: 0,
            kvs: BTreeMap::new(),
            leases: HashMap::new(),
            next_lease: 0x5eed_0000,
            history: VecDeque::new(),
            history_limit,
            watchers: Vec::new(),
        }));
        tokio::spawn(expire_leases(Arc::downgrade(&state)));
        Self { state }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way later calls would misread, so poisoning is ignored.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Revokes expired leases until the store is dropped.
async fn expire_leases(state: Weak<Mutex<State>>) {
    let mut tick = tokio::time::interval(EXPIRY_TICK);
    loop {
        tick.tick().await;
        let Some(state) = state.upgrade() else { return };
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let expired: Vec<LeaseId> = state
            .leases
            .iter()
            .filter(|(_, lease)| lease.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for lease in expired {
            state.revoke(lease);
        }
    }
}

impl State {
    fn in_range(&self, request: &RangeRequest) -> impl Iterator<Item = &KeyValue> {
        let start = request
            .start
            .clone()
            .filter(|start| start.as_str() > request.prefix.as_str())
            .unwrap_or_else(|| request.prefix.clone());
        let prefix = request.prefix.clone();
        self.kvs
            .range(start..)
            .take_while(move |(key, _)| key.starts_with(&prefix))
            .map(|(_, kv)| kv)
    }

    fn compare(&self, compare: &Compare) -> bool {
        let Some(kv) = self.kvs.get(&compare.key) else {
            return match &compare.target {
                Target::Value(_) => false,
                Target::Version(v)
                | Target::CreateRevision(v)
                | Target::ModRevision(v)
                | Target::Lease(v) => compare.op.holds(&0, v),
            };
        };
        match &compare.target {
            Target::Version(v) => compare.op.holds(&kv.version, v),
            Target::CreateRevision(v) => compare.op.holds(&kv.create_revision, v),
            Target::ModRevision(v) => compare.op.holds(&kv.mod_revision, v),
            Target::Lease(v) => compare.op.holds(&kv.lease, v),
            Target::Value(v) => compare.op.holds(kv.value.as_slice(), v.as_slice()),
        }
    }

    fn put(&mut self, key: &str, value: &[u8], lease: LeaseId, revision: i64) {
        let previous = self.kvs.get(key).cloned();
        if let Some(previous) = &previous {
            if previous.lease != 0 && previous.lease != lease {
                if let Some(old) = self.leases.get_mut(&previous.lease) {
                    old.keys.remove(key);
                }
            }
        }
        if lease != 0 {
            if let Some(new) = self.leases.get_mut(&lease) {
                new.keys.insert(key.to_string());
            }
        }
        let kv = KeyValue {
            key: key.to_string(),
            value: value.to_vec(),
            create_revision: previous.as_ref().map_or(revision, |p| p.create_revision),
            mod_revision: revision,
            version: previous.as_ref().map_or(1, |p| p.version + 1),
            lease,
        };
        self.kvs.insert(key.to_string(), kv.clone());
        self.record(WatchEvent {
            kind: EventKind::Put,
            kv,
        });
    }

    fn delete(&mut self, key: &str, revision: i64) -> bool {
        let Some(previous) = self.kvs.remove(key) else {
            return false;
        };
        if let Some(lease) = self.leases.get_mut(&previous.lease) {
            lease.keys.remove(key);
        }
        self.record(WatchEvent {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: key.to_string(),
                value: Vec::new(),
                create_revision: 0,
                mod_revision: revision,
                version: 0,
                lease: 0,
            },
        });
        true
    }

    fn record(&mut self, event: WatchEvent) {
        self.watchers.retain(|watcher| {
            !event.kv.key.starts_with(&watcher.prefix)
                || watcher.events.send(Ok(event.clone())).is_ok()
        });
        self.history.push_back(event);
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = self.compacted.max(dropped.kv.mod_revision + 1);
            }
        }
    }

    /// Deletes a lease and its keys at one new revision.
    fn revoke(&mut self, lease: LeaseId) -> bool {
        let Some(state) = self.leases.remove(&lease) else {
            return false;
        };
        if !state.keys.is_empty() {
            let revision = self.revision + 1;
            for key in &state.keys {
                self.delete(key, revision);
            }
            self.revision = revision;
        }
        true
    }

    fn check_leases(&self, ops: &[Op]) -> Result<()> {
        for op in ops {
            if let Op::Put { lease, .. } = op {
                if *lease != 0 && !self.leases.contains_key(lease) {
                    return Err(StoreError::LeaseNotFound(*lease));
                }
            }
        }
        Ok(())
    }

    fn apply(&mut self, ops: &[Op]) -> Vec<OpResult> {
        let revision = self.revision + 1;
        let mut wrote = false;
        let results = ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value, lease } => {
                    self.put(key, value, *lease, revision);
                    wrote = true;
                    OpResult::Put
                }
                Op::Get { key } => OpResult::Get(self.kvs.get(key).cloned()),
                Op::Delete { key } => {
                    let deleted = self.delete(key, revision);
                    wrote |= deleted;
                    OpResult::Delete {
                        deleted: i64::from(deleted),
                    }
                }
                Op::DeletePrefix { prefix } => {
                    let keys: Vec<String> = self
                        .in_range(&RangeRequest::prefix(prefix.clone()))
                        .map(|kv| kv.key.clone())
                        .collect();
                    for key in &keys {
                        self.delete(key, revision);
                    }
                    wrote |= !keys.is_empty();
                    OpResult::Delete {
                        deleted: keys.len() as i64,
                    }
                }
            })
            .collect();
        if wrote {
            self.revision = revision;
        }
        results
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &str) -> Result<GetResult> {
        let state = self.lock();
        let kvs: Vec<KeyValue> = state.kvs.get(key).cloned().into_iter().collect();
        Ok(GetResult {
            count: kvs.len(),
            kvs,
            revision: state.revision,
            more: false,
        })
    }

    async fn range(&self, request: RangeRequest) -> Result<GetResult> {
        let state = self.lock();
        let mut kvs: Vec<KeyValue> = state.in_range(&request).cloned().collect();
        let count = kvs.len();
        let limit = usize::try_from(request.limit).unwrap_or(0);
        let more = limit > 0 && kvs.len() > limit;
        if more {
            kvs.truncate(limit);
        }
        Ok(GetResult {
            kvs,
            revision: state.revision,
            more,
            count,
        })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let mut state = self.lock();
        let succeeded = txn.compares.iter().all(|c| state.compare(c));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        check_ops(ops)?;
        state.check_leases(ops)?;
        let results = state.apply(ops);
        Ok(TxnResult {
            succeeded,
            revision: state.revision,
            results,
        })
    }

    async fn grant_lease(&self, ttl_seconds: i64) -> Result<LeaseId> {
        if ttl_seconds <= 0 {
            return Err(StoreError::Other(format!(
                "invalid lease TTL {ttl_seconds}"
            )));
        }
        let mut state = self.lock();
        state.next_lease += 1;
        let id = state.next_lease;
        state.leases.insert(
            id,
            LeaseState {
                ttl: ttl_seconds,
                deadline: Instant::now() + Duration::from_secs(ttl_seconds as u64),
                keys: BTreeSet::new(),
            },
        );
        Ok(id)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<i64> {
        let mut state = self.lock();
        let now = Instant::now();
        match state.leases.get_mut(&lease) {
            Some(l) if l.deadline > now => {
                l.deadline = now + Duration::from_secs(l.ttl as u64);
                Ok(l.ttl)
            }
            _ => Err(StoreError::LeaseNotFound(lease)),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        if self.lock().revoke(lease) {
            Ok(())
        } else {
            Err(StoreError::LeaseNotFound(lease))
        }
    }

    async fn lease_time_to_live(&self, lease: LeaseId) -> Result<Option<i64>> {
        let state = self.lock();
        let now = Instant::now();
        Ok(state
            .leases
            .get(&lease)
            .filter(|l| l.deadline > now)
            .map(|l| l.deadline.duration_since(now).as_secs() as i64))
    }

    async fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        let mut state = self.lock();
        let (sender, receiver) = mpsc::unbounded_channel();
        if from_revision > 0 && from_revision < state.compacted {
            // Reported on the stream, as etcd does.
            let _ = sender.send(Err(StoreError::Compacted {
                requested: from_revision,
                compacted: state.compacted,
            }));
            return Ok(WatchStream::new(receiver));
        }
        if from_revision > 0 {
            for event in state
                .history
                .iter()
                .filter(|e| e.kv.mod_revision >= from_revision && e.kv.key.starts_with(prefix))
            {
                // The receiver is still held here, so this cannot fail.
                let _ = sender.send(Ok(event.clone()));
            }
        }
        state.watchers.push(Watcher {
            prefix: prefix.to_string(),
            events: sender,
        });
        Ok(WatchStream::new(receiver))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        let mut state = self.lock();
        if revision <= state.compacted {
            return Err(StoreError::Compacted {
                requested: revision,
                compacted: state.compacted,
            });
        }
        if revision > state.revision {
            return Err(StoreError::Other(format!(
                "cannot compact to future revision {revision} (current {})",
                state.revision
            )));
        }
        while state
            .history
            .front()
            .is_some_and(|e| e.kv.mod_revision < revision)
        {
            state.history.pop_front();
        }
        state.compacted = revision;
        Ok(())
    }
}
