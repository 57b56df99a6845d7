//! Group commit: the transactions a replica asks for while one of its
//! requests is in flight go to etcd together, as one request of nested
//! transactions.
//!
//! Why: etcd pays a fixed price per request, whatever it holds: its read
//! view of uncommitted writes, a raft entry, the gRPC request and its
//! response (BENCHMARKS.md, "Where etcd's CPU goes, per write"). Under
//! load a replica has many clusters' writes waiting at once; sent as one
//! request they pay that price once.
//!
//! # Guarantees
//! - Each transaction keeps its own compares and its own outcome: a nested
//!   transaction's compares hold or fail for it alone, and it gets its own
//!   branch's results.
//! - A batch holds only transactions that cannot see each other: none
//!   writes a key that another writes, compares or reads. etcd evaluates
//!   every nested compare before applying anything, so such a batch ends as
//!   the same transactions sent one after another would, in any order.
//! - A request etcd refuses before applying it (a transaction naming an
//!   expired lease refuses the whole request) costs the others nothing: the
//!   batch is sent again one transaction per request, and only the one at
//!   fault fails.
//! - An outcome etcd leaves unknown (a timeout, a broken connection) is
//!   reported to every transaction of the batch, as it would be to each
//!   alone.
//!
//! # Assumptions
//! - etcd 3.3 or later (nested transactions), and its default limits: 128
//!   operations per transaction level and 1.5 MiB per request. A batch
//!   stays well under both.
//!
//! # Caveats
//! - One batch is in flight at a time; a transaction asked for meanwhile
//!   waits for it to return (about one etcd round trip). At rest nothing
//!   waits: a lone transaction goes at once, as a plain transaction.
//! - A transaction whose caller stopped waiting may still be sent, as one
//!   whose request had left before a timeout.
//! - Large transactions (many operations or values) and prefix deletes are
//!   never batched.

use super::{call, header_revision, into_store_error, send_txn, Retry};
use super::{to_etcd_txn, txn_result, KvClient, TxnOp, TxnOpResponse};
use crate::store::{Op, Result, StoreError, Txn, TxnResult};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Transactions per batch: one top-level operation each, under etcd's 128.
const MAX_TXNS: usize = 64;
/// Key and value bytes per batch, well under etcd's request limit.
const MAX_BYTES: usize = 512 * 1024;
/// Compares and operations of a transaction that may join a batch.
const MAX_TXN_PARTS: usize = 32;
/// Key and value bytes of a transaction that may join a batch.
const MAX_TXN_BYTES: usize = 64 * 1024;

/// The sender of one etcd connection's batches.
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Queued>,
    counts: Arc<Counts>,
}

/// What the sender did (`EtcdStore::txns_batched`, `batches_sent_again`).
#[derive(Default)]
struct Counts {
    /// Transactions sent in a request shared with others.
    batched: AtomicU64,
    /// Batches etcd refused whole, sent again one transaction per request.
    sent_again: AtomicU64,
}

/// A transaction waiting for its batch, and where its outcome goes.
struct Queued {
    txn: Txn,
    keys: Keys,
    done: oneshot::Sender<Result<TxnResult>>,
}

impl Batcher {
    /// Starts the sender; it ends when the last clone is dropped.
    pub(super) fn start(kv: KvClient) -> Self {
        let (queue, waiting) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        tokio::spawn(send_batches(kv, waiting, Arc::clone(&counts)));
        Self { queue, counts }
    }

    /// Whether `txn` may share a request; the others go alone.
    pub(super) fn takes(txn: &Txn) -> bool {
        let parts = txn.compares.len() + txn.success.len() + txn.failure.len();
        let prefix_delete = txn
            .success
            .iter()
            .chain(&txn.failure)
            .any(|op| matches!(op, Op::DeletePrefix { .. }));
        parts <= MAX_TXN_PARTS && !prefix_delete && bytes_of(txn) <= MAX_TXN_BYTES
    }

    /// Sends `txn` with whatever else is waiting; its own outcome.
    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let stopped = || StoreError::Unavailable("the etcd batch sender stopped".to_string());
        let (done, outcome) = oneshot::channel();
        let keys = Keys::of(&txn);
        self.queue
            .send(Queued { txn, keys, done })
            .map_err(|_| stopped())?;
        outcome.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Transactions sent in a request shared with others, so far.
    pub(super) fn batched(&self) -> u64 {
        self.counts.batched.load(Ordering::Relaxed)
    }

    /// Batches etcd refused whole and that were sent again one by one.
    pub(super) fn sent_again(&self) -> u64 {
        self.counts.sent_again.load(Ordering::Relaxed)
    }
}

/// Takes what waits, as much as one batch holds, and sends it; one batch
/// at a time, so that what arrives meanwhile makes the next one.
async fn send_batches(
    kv: KvClient,
    mut waiting: mpsc::UnboundedReceiver<Queued>,
    counts: Arc<Counts>,
) {
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match waiting.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut batch = Batch::new(first);
        while let Ok(next) = waiting.try_recv() {
            if !batch.admits(&next) {
                carried = Some(next);
                break;
            }
            batch.join(next);
        }
        if batch.members.len() > 1 {
            let members = batch.members.len() as u64;
            counts.batched.fetch_add(members, Ordering::Relaxed);
        }
        batch.send(&kv, &counts).await;
    }
}

/// The key and value bytes a transaction carries.
fn bytes_of(txn: &Txn) -> usize {
    let compares = txn.compares.iter().map(|compare| compare.key.len());
    let ops = txn.success.iter().chain(&txn.failure).map(|op| match op {
        Op::Put { key, value, .. } => key.len() + value.len(),
        Op::Delete { key } | Op::DeletePrefix { prefix: key } | Op::Get { key } => key.len(),
    });
    compares.chain(ops).sum()
}

/// The keys a transaction writes and those it looks at, by their hashes:
/// two keys of one hash only make two transactions wait for separate
/// batches, never share one.
#[derive(Default)]
struct Keys {
    writes: HashSet<u64>,
    reads: HashSet<u64>,
    bytes: usize,
}

impl Keys {
    fn of(txn: &Txn) -> Self {
        let hash = |key: &str| {
            let mut hasher = std::hash::DefaultHasher::new();
            key.hash(&mut hasher);
            hasher.finish()
        };
        let mut keys = Keys {
            bytes: bytes_of(txn),
            ..Keys::default()
        };
        for compare in &txn.compares {
            keys.reads.insert(hash(&compare.key));
        }
        for op in txn.success.iter().chain(&txn.failure) {
            match op {
                Op::Put { key, .. } | Op::Delete { key } | Op::DeletePrefix { prefix: key } => {
                    keys.writes.insert(hash(key));
                }
                Op::Get { key } => {
                    keys.reads.insert(hash(key));
                }
            }
        }
        keys
    }
}

/// Transactions that cannot see each other's writes.
struct Batch {
    members: Vec<Queued>,
    keys: Keys,
}

impl Batch {
    fn new(first: Queued) -> Self {
        let mut batch = Batch {
            members: Vec::new(),
            keys: Keys::default(),
        };
        batch.join(first);
        batch
    }

    /// Whether `next` may join: the batch has room, and shares no key with
    /// it in a way one of them could see (a write beside a write, a compare
    /// or a read). If not, `next` starts the next batch.
    fn admits(&self, next: &Queued) -> bool {
        let full = self.members.len() >= MAX_TXNS || self.keys.bytes + next.keys.bytes > MAX_BYTES;
        let seen = |key: &u64| self.keys.writes.contains(key) || self.keys.reads.contains(key);
        let overlaps = next.keys.writes.iter().any(seen)
            || next
                .keys
                .reads
                .iter()
                .any(|key| self.keys.writes.contains(key));
        !full && !overlaps
    }

    fn join(&mut self, mut member: Queued) {
        // The member's keys are needed no more once in the batch's.
        let keys = std::mem::take(&mut member.keys);
        self.keys.bytes += keys.bytes;
        self.keys.writes.extend(keys.writes);
        self.keys.reads.extend(keys.reads);
        self.members.push(member);
    }

    /// Sends the batch and hands each member its outcome.
    async fn send(self, kv: &KvClient, counts: &Counts) {
        if self.members.len() == 1 {
            return send_alone(kv, self.members).await;
        }
        let to_request = || {
            let nested = self.members.iter().map(|m| TxnOp::txn(to_etcd_txn(&m.txn)));
            etcd_client::Txn::new().and_then(nested.collect::<Vec<_>>())
        };
        let mut first = Some(to_request());
        let response = call(kv, Retry::IfNotSent, |mut client| {
            let request = first.take().unwrap_or_else(to_request);
            async move { client.txn(request).await }
        })
        .await;
        let response = match response.map_err(into_store_error) {
            Ok(response) => response,
            // Nothing was applied, or nothing is known: each would have
            // been told the same alone.
            Err(StoreError::Unavailable(message)) => {
                return self.fail_all(|| StoreError::Unavailable(message.clone()));
            }
            Err(StoreError::NoSpace(message)) => {
                return self.fail_all(|| StoreError::NoSpace(message.clone()));
            }
            // Refused before applying, for one member's sake (an expired
            // lease, say): each alone finds out whose.
            Err(_) => {
                counts.sent_again.fetch_add(1, Ordering::Relaxed);
                return send_alone(kv, self.members).await;
            }
        };
        let revision = header_revision(response.header());
        for (member, nested) in self.members.into_iter().zip(response.op_responses()) {
            let outcome = match nested {
                TxnOpResponse::Txn(nested) => Ok(txn_result(&nested, revision)),
                _ => Err(StoreError::Other(
                    "etcd answered a nested transaction with another kind of response".to_string(),
                )),
            };
            let _ = member.done.send(outcome);
        }
    }

    fn fail_all(self, error: impl Fn() -> StoreError) {
        for member in self.members {
            let _ = member.done.send(Err(error()));
        }
    }
}

/// Sends each member as a request of its own, all at once.
async fn send_alone(kv: &KvClient, members: Vec<Queued>) {
    let sends = members.into_iter().map(|member| async move {
        let outcome = send_txn(kv, &member.txn).await;
        let _ = member.done.send(outcome);
    });
    futures_util::future::join_all(sends).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CmpOp, Compare};

    fn queued(txn: Txn) -> Queued {
        let (done, _) = oneshot::channel();
        Queued {
            keys: Keys::of(&txn),
            txn,
            done,
        }
    }

    fn writes(key: &str, compared: &str) -> Queued {
        queued(
            Txn::new()
                .when([Compare::version(compared, CmpOp::Equal, 1)])
                .and_then([Op::put(key, "v")]),
        )
    }

    #[test]
    fn transactions_on_other_keys_share_a_batch() {
        let mut batch = Batch::new(writes("/a", "/a"));
        // The last two compare a key neither writes: reads beside reads.
        for next in [
            writes("/b", "/b"),
            writes("/c", "/shared"),
            writes("/d", "/shared"),
        ] {
            assert!(batch.admits(&next));
            batch.join(next);
        }
        assert_eq!(batch.members.len(), 4);
    }

    #[test]
    fn a_transaction_that_could_see_another_waits_for_the_next_batch() {
        let batch = Batch::new(writes("/a", "/b"));
        // Writes a key the batch writes.
        assert!(!batch.admits(&writes("/a", "/x")));
        // Writes a key the batch compares: the first would not see it.
        assert!(!batch.admits(&writes("/b", "/y")));
        // Compares a key the batch writes (write skew, were both to hold).
        assert!(!batch.admits(&writes("/z", "/a")));
        // Reads a key the batch writes.
        assert!(!batch.admits(&queued(Txn::new().and_then([Op::get("/a")]))));
    }

    #[test]
    fn a_full_batch_takes_no_more() {
        let mut batch = Batch::new(writes("/k0", "/k0"));
        for i in 1..MAX_TXNS {
            let next = writes(&format!("/k{i}"), &format!("/k{i}"));
            assert!(batch.admits(&next));
            batch.join(next);
        }
        assert!(!batch.admits(&writes("/last", "/last")));
    }

    #[test]
    fn large_transactions_and_prefix_deletes_go_alone() {
        assert!(Batcher::takes(&Txn::new().and_then([Op::put("/a", "v")])));
        assert!(!Batcher::takes(
            &Txn::new().and_then([Op::delete_prefix("/clusters/a/")])
        ));
        let big = vec![b'x'; MAX_TXN_BYTES + 1];
        assert!(!Batcher::takes(&Txn::new().and_then([Op::put("/a", big)])));
        let many = (0..=MAX_TXN_PARTS).map(|i| Op::put(format!("/k{i}"), "v"));
        assert!(!Batcher::takes(&Txn::new().and_then(many)));
    }
}
