//! The vocabulary of the store: keys, revisions, compares, ops and events.

use super::{Result, StoreError};
use tokio::sync::mpsc;

/// An etcd lease id. 0 means "no lease".
pub type LeaseId = i64;

/// One stored key with the revisions etcd keeps for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the write that created the key (since its last deletion).
    pub create_revision: i64,
    /// Revision of the last write to the key.
    pub mod_revision: i64,
    /// Number of writes since creation (1 after creation).
    pub version: i64,
    /// Lease the key is bound to, 0 for none.
    pub lease: LeaseId,
}

/// The keys a read found, and the store revision it was served at.
#[derive(Debug, Clone, Default)]
pub struct GetResult {
    pub kvs: Vec<KeyValue>,
    /// Store revision the read observed.
    pub revision: i64,
    /// Whether a limit cut the result short.
    pub more: bool,
    /// How many keys the range holds from its start, the limit aside.
    pub count: usize,
}

impl GetResult {
    /// The single key of a point read, if it exists.
    pub fn into_single(self) -> Option<KeyValue> {
        self.kvs.into_iter().next()
    }
}

/// A prefix read.
#[derive(Debug, Clone, Default)]
pub struct RangeRequest {
    /// Every key starting with this prefix.
    pub prefix: String,
    /// Start at this key (inclusive) instead of at the prefix.
    pub start: Option<String>,
    /// At most this many keys; 0 = no limit.
    pub limit: i64,
}

impl RangeRequest {
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            ..Self::default()
        }
    }

    pub fn starting_at(mut self, key: impl Into<String>) -> Self {
        self.start = Some(key.into());
        self
    }

    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
}

/// How a compare relates the stored field to its operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

impl CmpOp {
    /// Applies the operator to `stored <op> operand`.
    pub fn holds<T: Ord + ?Sized>(self, stored: &T, operand: &T) -> bool {
        match self {
            CmpOp::Equal => stored == operand,
            CmpOp::NotEqual => stored != operand,
            CmpOp::Greater => stored > operand,
            CmpOp::Less => stored < operand,
        }
    }
}

/// The field of a key a compare looks at, with its operand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Vec<u8>),
    Lease(LeaseId),
}

/// One condition of a transaction. On a missing key, revisions, version and
/// lease read as 0 and a value compare fails (as in etcd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub op: CmpOp,
    pub target: Target,
}

impl Compare {
    pub fn version(key: impl Into<String>, op: CmpOp, version: i64) -> Self {
        Self::new(key, op, Target::Version(version))
    }
    pub fn create_revision(key: impl Into<String>, op: CmpOp, revision: i64) -> Self {
        Self::new(key, op, Target::CreateRevision(revision))
    }
    pub fn mod_revision(key: impl Into<String>, op: CmpOp, revision: i64) -> Self {
        Self::new(key, op, Target::ModRevision(revision))
    }
    pub fn value(key: impl Into<String>, op: CmpOp, value: impl Into<Vec<u8>>) -> Self {
        Self::new(key, op, Target::Value(value.into()))
    }
    pub fn lease(key: impl Into<String>, op: CmpOp, lease: LeaseId) -> Self {
        Self::new(key, op, Target::Lease(lease))
    }
    /// Holds when the key does not exist.
    pub fn absent(key: impl Into<String>) -> Self {
        Self::create_revision(key, CmpOp::Equal, 0)
    }

    fn new(key: impl Into<String>, op: CmpOp, target: Target) -> Self {
        Self {
            key: key.into(),
            op,
            target,
        }
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Writes a key, bound to `lease` unless it is 0.
    Put {
        key: String,
        value: Vec<u8>,
        lease: LeaseId,
    },
    /// Reads one key.
    Get { key: String },
    /// Deletes one key.
    Delete { key: String },
    /// Deletes every key under a prefix.
    DeletePrefix { prefix: String },
}

impl Op {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: 0,
        }
    }
    pub fn put_with_lease(
        key: impl Into<String>,
        value: impl Into<Vec<u8>>,
        lease: LeaseId,
    ) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }
    pub fn get(key: impl Into<String>) -> Self {
        Op::Get { key: key.into() }
    }
    pub fn delete(key: impl Into<String>) -> Self {
        Op::Delete { key: key.into() }
    }
    pub fn delete_prefix(prefix: impl Into<String>) -> Self {
        Op::DeletePrefix {
            prefix: prefix.into(),
        }
    }
}

/// What one op of a transaction returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Put,
    Get(Option<KeyValue>),
    Delete { deleted: i64 },
}

/// A transaction: `if compares { success } else { failure }`.
#[derive(Debug, Clone, Default)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.compares.extend(compares);
        self
    }
    pub fn and_then(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.success.extend(ops);
        self
    }
    pub fn or_else(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.failure.extend(ops);
        self
    }
}

/// The outcome of a transaction.
#[derive(Debug, Clone)]
pub struct TxnResult {
    /// Whether the compares held (and the success branch ran).
    pub succeeded: bool,
    /// Store revision after the transaction.
    pub revision: i64,
    /// One result per op of the branch that ran.
    pub results: Vec<OpResult>,
}

/// Whether a watched key was written or deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change seen by a watch. For a delete, `kv` carries the key and the
/// deletion's revision as `mod_revision`; its other fields are zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    pub kv: KeyValue,
}

/// The changes under a prefix, in revision order. Dropping it cancels the
/// watch.
pub struct WatchStream {
    events: mpsc::UnboundedReceiver<Result<WatchEvent>>,
}

impl WatchStream {
    pub(crate) fn new(events: mpsc::UnboundedReceiver<Result<WatchEvent>>) -> Self {
        Self { events }
    }

    /// The next change; `None` when the watch ended, `Err` once if it failed
    /// (for example [`StoreError::Compacted`]).
    pub async fn next(&mut self) -> Option<Result<WatchEvent>> {
        self.events.recv().await
    }

    /// The next change if one has arrived, without waiting; `None` when
    /// none has yet. A watch that ended reads as an error.
    pub fn try_next(&mut self) -> Option<Result<WatchEvent>> {
        match self.events.try_recv() {
            Ok(event) => Some(event),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => {
                Some(Err(StoreError::Unavailable("the watch ended".to_string())))
            }
        }
    }

    /// The same stream without its deletes.
    pub(super) fn puts_only(mut self) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = sender.closed() => return,
                    event = self.next() => event,
                };
                let Some(event) = event else { return };
                let deleted = matches!(
                    &event,
                    Ok(WatchEvent {
                        kind: EventKind::Delete,
                        ..
                    })
                );
                if !deleted && sender.send(event).is_err() {
                    return;
                }
            }
        });
        Self::new(receiver)
    }
}

/// The key just after every key with this prefix (etcd's range end).
pub(super) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // An empty (or all-0xff) prefix ranges over every key: etcd's "\0".
    vec![0]
}

/// Refuses transactions etcd would refuse, so both stores agree.
pub(super) fn check_ops(ops: &[Op]) -> Result<()> {
    let mut written = std::collections::HashSet::new();
    for op in ops {
        if let Op::Put { key, .. } | Op::Delete { key } = op {
            if !written.insert(key.as_str()) {
                return Err(StoreError::Other(format!(
                    "duplicate key given in txn request: {key}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }
}
