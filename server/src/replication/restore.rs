//! Fencing epochs that keep growing across etcd restores, however many,
//! and that every replica takes from one record.
//!
//! An owner's fencing epoch was the create revision of its owner key. A
//! provider remembers the newest epoch it accepted for each cluster and
//! refuses older ones. Restoring etcd from a snapshot sets its revision
//! counter back to the snapshot's, below the epochs the provider saw
//! since: every new owner would be refused for ever. So an epoch is
//! `base + create revision` ([`fencing_epoch`]), where the epoch base is
//! 0 until the first restore and is set anew at every restore this module
//! detects.
//!
//! The base a restore sets comes from something the restore cannot roll
//! back: the wall clock. It is the time of the detection in microseconds
//! minus etcd's revision then, so the first epoch after it is about the
//! current time in microseconds, and epochs after it grow with revisions,
//! far slower than the clock (etcd commits well under a million writes a
//! second). Every epoch ever handed out is therefore below the clock at
//! the time it was handed out, and a later restore — of the same snapshot
//! too, as often as a recovery drill repeats it — starts above all of
//! them. (Before this scheme a restore added one to a generation kept in
//! the restored data, so restoring one snapshot twice repeated the first
//! restore's epochs; records written by it are still read, a generation
//! `g` being the base `g << 40`.)
//!
//! Detection: etcd's raft index counts every entry the cluster ever
//! committed and only grows, while `etcdctl snapshot restore` starts a new
//! raft log (its index starts near zero) over the snapshot's keys and
//! revision. Each replica, when it joins, reads the fence record
//! (`<prefix>fence`: the base, and the raft index and revision seen when it
//! was written) and compares: a live raft index below the recorded one, or
//! a revision further ahead of the raft index than recorded (each revision
//! is a raft entry, so in one history the revision never gains on the
//! index; a young etcd's new log may already have passed the recorded
//! index), means the data was restored, and the base is set anew. The
//! record is written then (a compare-and-swap, so replicas joining
//! together set it once), and when there is none or it predates the
//! recorded revision; otherwise a join leaves it as it is.
//!
//! One base for every replica: a replica claims only under the fence
//! record it read ([`FenceView::compare`] is part of every claim), so a
//! record rewritten since (a restore detected by another replica, or one
//! taken for a restore: below) makes its claims fail until it reads the
//! record again ([`current_fence`]) and claims under the new base.
//!
//! # Guarantees
//! - Within one etcd history, epochs grow with create revisions.
//! - After a restore the first replica to join sets the base before it
//!   claims anything, and no replica claims under the old base afterwards:
//!   every epoch used after the restore is above every epoch used before
//!   it, given the clock below.
//! - A member lagging behind the record's raft index (restarted, slow)
//!   may be taken for a restore: the base moves up once more, and every
//!   replica follows it at its next claim. Epochs only grow.
//!
//! # Assumptions
//! - Every replica is stopped before the restore and started after it
//!   (PRODUCTION.md): a replica that ran on across it keeps claims of the
//!   lost history (its next claim reads the new record).
//! - The clock of the replica that detects a restore is not behind the
//!   clock of the one that detected the previous restore by more than the
//!   time between the two (NTP keeps it so; PRODUCTION.md says what to
//!   keep). A clock further behind may repeat epochs the provider has
//!   seen: the provider refuses them, and the operations fail rather than
//!   run twice.
//! - etcd commits fewer than a million revisions a second on average.
//!
//! # Caveats
//! - Data copied into a new etcd some other way than a snapshot restore
//!   (`etcdctl make-mirror`, say) is detected only when the copy's raft
//!   index is below its revision with no fence record (an etcd written
//!   before this record existed); PRODUCTION.md says to restore snapshots.

use crate::keys::KeyLayout;
use crate::store::{CmpOp, Compare, KeyValue, Op, RaftProgress, Store, StoreError, Txn};
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// Bits of an epoch that held the create revision under the old
/// generation scheme (a generation `g` is the base `g << 40`).
const GENERATION_SHIFT: u32 = 40;

/// Attempts at the record's compare-and-swap before giving up (each lost
/// only to another replica joining at the same moment).
const ATTEMPTS: usize = 5;

/// The fencing epoch of an owner key created at `create_revision` under
/// epoch base `base`.
pub fn fencing_epoch(base: i64, create_revision: i64) -> i64 {
    base + create_revision
}

/// The epoch base of a record that names a base, or an old generation.
pub fn epoch_base(base: i64, generation: i64) -> i64 {
    if base != 0 {
        base
    } else {
        generation << GENERATION_SHIFT
    }
}

/// `<prefix>fence`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct FenceRecord {
    /// The epoch base ([`fencing_epoch`]); 0 until the first restore.
    #[serde(default, skip_serializing_if = "is_zero")]
    base: i64,
    /// The old scheme's generation, read from records written before the
    /// base existed. Always written (0): builds before the base require it
    /// to read the record, and must go on joining through a rolling
    /// upgrade or a rollback.
    #[serde(default)]
    generation: i64,
    /// etcd's raft index when the record was written.
    raft_index: u64,
    /// etcd's revision then (0 in records written before it was kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    revision: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl FenceRecord {
    fn base(&self) -> i64 {
        epoch_base(self.base, self.generation)
    }
}

/// The fence record as this replica read it: the base its claims use, and
/// the record's revision, which every claim compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceView {
    pub base: i64,
    /// The record's mod revision; 0: there is no record (a store without
    /// a raft log, which cannot be restored).
    pub revision: i64,
}

impl FenceView {
    /// The compare that makes a claim apply only under this record.
    pub fn compare(&self, keys: &KeyLayout) -> Compare {
        match self.revision {
            0 => Compare::absent(keys.fence()),
            revision => Compare::mod_revision(keys.fence(), CmpOp::Equal, revision),
        }
    }
}

/// The wall clock in microseconds since the Unix epoch.
fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Whether `progress` shows a restore since `recorded` was written, and the
/// base to claim under from now on.
fn decide(recorded: Option<FenceRecord>, progress: RaftProgress, now_micros: i64) -> (bool, i64) {
    // Every revision is one raft entry, and some entries make no revision
    // (lease grants, compactions): within one history the revision never
    // gains on the raft index. A restore puts the revision back to the
    // snapshot's but starts the raft log again near zero: the revision is
    // then further ahead of the raft index than the record saw, even when
    // the new log has already passed the recorded index.
    let ahead = |revision: i64, raft_index: u64| revision - raft_index as i64;
    let restored = match recorded {
        Some(record) => {
            progress.raft_index < record.raft_index
                || (record.revision != 0
                    && ahead(progress.revision, progress.raft_index)
                        > ahead(record.revision, record.raft_index))
        }
        // No record yet: a history that began before records existed,
        // restored, has a revision above its new raft index; a fresh etcd
        // never does.
        None => (progress.raft_index as i64) < progress.revision,
    };
    let old = recorded.unwrap_or_default().base();
    if !restored {
        return (false, old);
    }
    // The next epoch is then about the clock in microseconds; never below
    // the recorded base (a clock far behind).
    (true, (now_micros - progress.revision).max(old + 1))
}

fn parse(kv: &KeyValue) -> crate::store::Result<FenceRecord> {
    serde_json::from_slice(&kv.value).map_err(|e| StoreError::Other(format!("{}: {e}", kv.key)))
}

/// The fence this replica's claims use: the recorded base, set anew when
/// etcd's data was restored since it was recorded. A store without a raft
/// log (the embedded one) cannot be restored: base 0, no record.
pub async fn fence_at_join(store: &dyn Store, keys: &KeyLayout) -> crate::store::Result<FenceView> {
    let key = keys.fence();
    for _ in 0..ATTEMPTS {
        let read = store.get(&key).await?.into_single();
        let Some(progress) = store.raft_progress().await? else {
            return Ok(FenceView::default());
        };
        let recorded = read.as_ref().map(parse).transpose()?;
        let (restored, base) = decide(recorded, progress, now_micros());
        if restored {
            tracing::warn!(
                base,
                raft_index = progress.raft_index,
                recorded = ?recorded,
                "etcd was restored from a snapshot (or a member lags): fencing epochs move to a new base"
            );
        }
        // Rewritten only when it changes: every claim compares the
        // record's revision, so a rewrite costs each replica a failed claim
        // and a read.
        if let (Some(kv), Some(record), false) = (&read, recorded, restored) {
            if record.revision != 0 {
                return Ok(FenceView {
                    base,
                    revision: kv.mod_revision,
                });
            }
        }
        let record = FenceRecord {
            base,
            generation: 0,
            raft_index: progress.raft_index,
            revision: progress.revision,
        };
        let unchanged = match &read {
            Some(kv) => Compare::mod_revision(&key, CmpOp::Equal, kv.mod_revision),
            None => Compare::absent(&key),
        };
        let value = serde_json::to_vec(&record).expect("a fence record serializes");
        let txn = Txn::new()
            .when([unchanged])
            .and_then([Op::put(&key, value)]);
        let written = store.txn(txn).await?;
        if written.succeeded {
            return Ok(FenceView {
                base,
                revision: written.revision,
            });
        }
    }
    Err(StoreError::Conflict { revision: 0 })
}

/// The fence record as it stands, for a replica whose claim failed on it:
/// another replica rewrote it (at its join, or after a restore).
pub async fn current_fence(store: &dyn Store, keys: &KeyLayout) -> crate::store::Result<FenceView> {
    Ok(match store.get(&keys.fence()).await?.into_single() {
        Some(kv) => FenceView {
            base: parse(&kv)?.base(),
            revision: kv.mod_revision,
        },
        None => FenceView::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(raft_index: u64, revision: i64) -> RaftProgress {
        RaftProgress {
            raft_index,
            revision,
        }
    }

    fn record(base: i64, raft_index: u64) -> Option<FenceRecord> {
        Some(FenceRecord {
            base,
            generation: 0,
            raft_index,
            revision: 0,
        })
    }

    #[test]
    fn one_history_keeps_its_base() {
        assert_eq!(decide(None, progress(10, 5), 1_000), (false, 0));
        assert_eq!(decide(record(0, 10), progress(500, 300), 1_000), (false, 0));
        assert_eq!(
            decide(record(77, 10), progress(11, 300), 1_000),
            (false, 77)
        );
    }

    /// The old scheme repeated the first restore's epochs when the same
    /// snapshot was restored again; the clock does not.
    #[test]
    fn restoring_one_snapshot_twice_moves_epochs_up_both_times() {
        let snapshot = record(0, 900);
        let (at_snapshot, after) = (progress(5, 400), progress(6, 400));
        let lost_first = fencing_epoch(0, 1_200);
        let (restored, first) = decide(snapshot, at_snapshot, 10_000_000);
        assert!(restored);
        assert!(fencing_epoch(first, 401) > lost_first);
        // The first restored history goes on for a second, 50,000 writes.
        let lost_second = fencing_epoch(first, 400 + 50_000);
        let (restored, second) = decide(snapshot, after, 11_000_000);
        assert!(restored);
        assert!(fencing_epoch(second, 401) > lost_second);
    }

    /// A young etcd restored: its new raft log has already passed the
    /// index the record saw, but the revision is further ahead of it.
    #[test]
    fn a_restore_whose_new_log_passed_the_recorded_index_is_seen_by_the_revision() {
        let written = Some(FenceRecord {
            base: 0,
            generation: 0,
            raft_index: 8,
            revision: 6,
        });
        // The same history later: 40 writes and some lease grants.
        assert!(!decide(written, progress(60, 46), 1_000).0);
        // Restored from a snapshot at revision 40: a new log at index 12.
        assert!(decide(written, progress(12, 41), 1_000).0);
    }

    #[test]
    fn an_old_generation_reads_as_its_base_and_a_restore_goes_above_it() {
        assert_eq!(epoch_base(0, 2), 2 << 40);
        let old = Some(FenceRecord {
            base: 0,
            generation: 2,
            raft_index: 900,
            revision: 0,
        });
        let (_, base) = decide(old, progress(5, 400), 0);
        assert!(base > 2 << 40);
    }

    /// Builds before the base read `{"generation":..,"raft_index":..}` and
    /// require both: a record written now still has them.
    #[test]
    fn a_record_keeps_what_older_builds_require() {
        let record = FenceRecord {
            base: 0,
            generation: 0,
            raft_index: 7,
            revision: 12,
        };
        assert_eq!(
            serde_json::to_string(&record).unwrap(),
            r#"{"generation":0,"raft_index":7,"revision":12}"#
        );
    }
}
