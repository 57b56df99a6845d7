//! Fencing epochs that keep growing across an etcd restore.
//!
//! An owner's fencing epoch was the create revision of its owner key. A
//! provider remembers the newest epoch it accepted for each cluster and
//! refuses older ones. Restoring etcd from a snapshot sets its revision
//! counter back to the snapshot's, below the epochs the provider saw
//! since: every new owner would be refused for ever. So an epoch is
//! `generation << 40 | create revision` ([`fencing_epoch`]), where the
//! generation grows by one with every restore this module detects.
//!
//! Detection: etcd's raft index counts every entry the cluster ever
//! committed and only grows, while `etcdctl snapshot restore` starts a new
//! raft log (its index starts near zero) over the snapshot's keys and
//! revision. Each replica, when it joins, reads the fence record
//! (`<prefix>fence`: the generation and the raft index seen when it was
//! written) and compares: a live raft index below the recorded one means
//! the data was restored, so the generation goes up by one. The record is
//! then rewritten with the live raft index (a compare-and-swap, so replicas
//! joining together bump once).
//!
//! # Guarantees
//! - Within one etcd history the generation never changes after the first
//!   join, so epochs grow with create revisions as before.
//! - After a restore the first replica to join bumps the generation before
//!   it claims anything: every epoch it and later replicas use is above
//!   every epoch of the lost history (whose generation was at most the
//!   restored one, its revisions below 2^40).
//!
//! # Assumptions
//! - Every replica is stopped before the restore and started after it
//!   (PRODUCTION.md): a replica that ran on across it would keep its old
//!   generation.
//! - Fewer than 2^40 revisions in one etcd history.
//!
//! # Caveats
//! - Data copied into a new etcd some other way than a snapshot restore
//!   (`etcdctl make-mirror`, say) is detected only when the copy's raft
//!   index is below its revision with no fence record (an etcd written
//!   before this record existed); PRODUCTION.md says to restore snapshots.
//! - A member lagging behind the record's raft index may be taken for a
//!   restore: one extra bump, harmless (epochs only grow).

use crate::keys::KeyLayout;
use crate::store::{Compare, Op, Store, StoreError, Txn};
use serde::{Deserialize, Serialize};

/// Bits of an epoch that hold the create revision.
const REVISION_BITS: u32 = 40;

/// Attempts at the record's compare-and-swap before giving up (each lost
/// only to another replica joining at the same moment).
const ATTEMPTS: usize = 5;

/// The fencing epoch of an owner key created at `create_revision` under
/// `generation`.
pub fn fencing_epoch(generation: i64, create_revision: i64) -> i64 {
    (generation << REVISION_BITS) | create_revision
}

/// The create revision an epoch was made from (for the store's fence).
pub fn create_revision(epoch: i64) -> i64 {
    epoch & ((1 << REVISION_BITS) - 1)
}

/// `<prefix>fence`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct FenceRecord {
    generation: i64,
    /// etcd's raft index when the record was written.
    raft_index: u64,
}

/// The generation this replica's claims use: the recorded one, bumped when
/// etcd's data was restored since it was recorded. A store without a raft
/// log (the embedded one) cannot be restored: generation 0.
pub async fn fence_generation(store: &dyn Store, keys: &KeyLayout) -> crate::store::Result<i64> {
    let key = keys.fence();
    for _ in 0..ATTEMPTS {
        let read = store.get(&key).await?.into_single();
        let Some(progress) = store.raft_progress().await? else {
            return Ok(0);
        };
        let recorded = match &read {
            Some(kv) => Some(
                serde_json::from_slice::<FenceRecord>(&kv.value)
                    .map_err(|e| StoreError::Other(format!("{key}: {e}")))?,
            ),
            None => None,
        };
        let restored = match recorded {
            Some(record) => progress.raft_index < record.raft_index,
            // No record yet: a history that began before records existed,
            // restored, has a revision above its new raft index; a fresh
            // etcd never does.
            None => (progress.raft_index as i64) < progress.revision,
        };
        let old = recorded.unwrap_or_default().generation;
        let generation = if restored { old + 1 } else { old };
        if restored {
            tracing::warn!(
                generation,
                raft_index = progress.raft_index,
                recorded = ?recorded,
                "etcd was restored from a snapshot: fencing epochs move to a new generation"
            );
        }
        let record = FenceRecord {
            generation,
            raft_index: progress.raft_index,
        };
        let unchanged = match &read {
            Some(kv) => Compare::mod_revision(&key, crate::store::CmpOp::Equal, kv.mod_revision),
            None => Compare::absent(&key),
        };
        let value = serde_json::to_vec(&record).expect("a fence record serializes");
        let txn = Txn::new()
            .when([unchanged])
            .and_then([Op::put(&key, value)]);
        if store.txn(txn).await?.succeeded {
            return Ok(generation);
        }
    }
    Err(StoreError::Conflict { revision: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_of_a_later_generation_is_above_every_epoch_of_an_earlier_one() {
        let before = fencing_epoch(0, (1 << REVISION_BITS) - 1);
        let after = fencing_epoch(1, 1);
        assert!(after > before);
        assert_eq!(create_revision(after), 1);
        assert_eq!(create_revision(fencing_epoch(0, 42)), 42);
        assert_eq!(
            fencing_epoch(0, 42),
            42,
            "generation 0 keeps the old epochs"
        );
    }
}
