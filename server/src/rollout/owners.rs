//! Which replica runs which rollout: an owner key per rollout, bound to
//! the owner's lease, as a cluster's is.
//!
//! A rollout not yet settled and without an owner is claimed by its
//! preferred live member (rendezvous hashing over the member keys, as for
//! clusters), or by any member once it has gone unowned for
//! [`UNOWNED_GRACE`] (its preferred member may be wedged). When the owner
//! dies its lease goes (revoked by the peers' fast crash detection, or
//! expired), its owner keys with it, and the next pass (at once: the
//! passes follow the owner keys' changes) claims the rollout again.
//!
//! # Guarantees
//! - At most one replica holds a rollout's owner key at a time (it is
//!   created only while absent), and every write the owner makes compares
//!   the key's lease and create revision ([`Claim::fence`]): a replica
//!   that lost the key writes nothing more.
//! - A draining replica claims nothing.
//!
//! # Caveats
//! - Rollouts are few: each pass reads every owner key and status record.

use super::record::{OwnerRecord, StatusRecord};
use super::store::RolloutStore;
use crate::cluster::{from_json, to_json, ClusterCache, SCHEMA_VERSION};
use crate::owner_work::{Controller, OwnerWork};
use crate::replication::{rendezvous, Claim, Ownership};
use crate::store::{Compare, KeyValue, Op, RangeRequest, StoreError, Txn};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often a pass runs without a change to prompt it.
const PASS_PERIOD: Duration = Duration::from_secs(1);
/// How long a rollout may go unowned before any member claims it.
const UNOWNED_GRACE: Duration = Duration::from_secs(3);

pub struct RolloutOwners {
    rollouts: RolloutStore,
    work: Arc<OwnerWork>,
    claims: Mutex<HashMap<String, Claim>>,
    /// Since when each unsettled rollout was seen without an owner.
    unowned: Mutex<HashMap<String, Instant>>,
}

impl RolloutOwners {
    pub fn new(rollouts: RolloutStore, work: Arc<OwnerWork>) -> Arc<Self> {
        Arc::new(Self {
            rollouts,
            work,
            claims: Mutex::default(),
            unowned: Mutex::default(),
        })
    }

    pub fn replica_id(&self) -> &str {
        self.replication().replica_id()
    }

    fn replication(&self) -> &Arc<Ownership> {
        self.work.replication()
    }

    /// This replica's claim on rollout `name`, while its lease is believed
    /// alive.
    pub fn claim(&self, name: &str) -> Option<Claim> {
        let lease = self.replication().live_lease()?;
        lock(&self.claims)
            .get(name)
            .copied()
            .filter(|claim| claim.lease == lease)
    }

    /// The rollouts this replica owns.
    pub fn owned(&self) -> Vec<String> {
        lock(&self.claims).keys().cloned().collect()
    }

    /// Gives up rollout `name` (settled): deletes its owner key, if it is
    /// still this claim's.
    pub async fn release(&self, name: &str, claim: Claim) -> Result<(), StoreError> {
        let keys = self.rollouts.keys();
        let txn = Txn::new()
            .when(claim.fence_key(keys.rollout_owner(name)))
            .and_then([Op::delete(keys.rollout_owner(name))]);
        self.rollouts.store().txn(txn).await?;
        lock(&self.claims).remove(name);
        Ok(())
    }

    /// Follows the rollouts and their owner keys until `shutdown`, claiming
    /// what this replica should run.
    pub async fn run(
        self: Arc<Self>,
        cache: Arc<ClusterCache>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let keys = self.rollouts.keys();
            let specs = cache.watch_keys(&keys.rollouts());
            let owners = cache.watch_keys(&keys.rollout_owners());
            if let Err(error) = self.pass().await {
                tracing::warn!(%error, "rollout ownership pass failed");
            }
            let changed = async {
                match (specs, owners) {
                    (Some((mut specs, _)), Some((mut owners, _))) => {
                        tokio::select! {
                            _ = specs.next() => {},
                            _ = owners.next() => {},
                        }
                    }
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = changed => {},
                _ = tokio::time::sleep(PASS_PERIOD) => {},
            }
        }
    }

    /// Reads the owner keys and the statuses, keeps this replica's claims
    /// in step with them, and claims what it should.
    async fn pass(&self) -> Result<(), StoreError> {
        let Some(lease) = self.replication().live_lease() else {
            return Ok(());
        };
        let keys = self.rollouts.keys().clone();
        let members = self.range(&keys.members()).await?;
        let owner_keys = self.range(&keys.rollout_owners()).await?;
        let statuses = self.range(&keys.rollout_statuses()).await?;
        let member_ids: Vec<String> = members.iter().map(|kv| suffix(&kv.key)).collect();
        let owners: HashMap<String, &KeyValue> =
            owner_keys.iter().map(|kv| (suffix(&kv.key), kv)).collect();
        self.keep_claims(lease, &owners);
        if self.replication().is_draining() || self.work.is_stopping() {
            return Ok(());
        }
        let me = self.replication().replica_id().to_string();
        for kv in &statuses {
            let name = suffix(&kv.key);
            let settled = from_json::<StatusRecord>(kv).map_or(true, |s| s.settled);
            if settled || owners.contains_key(&name) {
                lock(&self.unowned).remove(&name);
                continue;
            }
            let since = *lock(&self.unowned)
                .entry(name.clone())
                .or_insert_with(Instant::now);
            let preferred = rendezvous::preferred(&name, member_ids.iter().map(String::as_str));
            if preferred == Some(me.as_str()) || since.elapsed() >= UNOWNED_GRACE {
                self.try_claim(&name, lease).await?;
            }
        }
        Ok(())
    }

    /// This replica's claims, as the owner keys show them now.
    fn keep_claims(&self, lease: i64, owners: &HashMap<String, &KeyValue>) {
        let mine: HashMap<String, Claim> = owners
            .iter()
            .filter(|(_, kv)| kv.lease == lease)
            .map(|(name, kv)| (name.clone(), Claim::new(lease, 0, kv.create_revision)))
            .collect();
        *lock(&self.claims) = mine;
    }

    async fn try_claim(&self, name: &str, lease: i64) -> Result<(), StoreError> {
        let key = self.rollouts.keys().rollout_owner(name);
        let me = to_json(&OwnerRecord {
            schema: SCHEMA_VERSION,
            replica: self.replication().replica_id().to_string(),
            lease,
        });
        let txn = Txn::new()
            .when([Compare::absent(&key)])
            .and_then([Op::put_with_lease(&key, me, lease)]);
        let result = self.rollouts.store().txn(txn).await?;
        if !result.succeeded {
            return Ok(());
        }
        let claim = Claim::new(lease, 0, result.revision);
        lock(&self.claims).insert(name.to_string(), claim);
        lock(&self.unowned).remove(name);
        tracing::info!(rollout = name, "rollout claimed");
        self.work.trigger(Controller::Rollouts, name);
        Ok(())
    }

    async fn range(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        let store = self.rollouts.store();
        Ok(store.range(RangeRequest::prefix(prefix)).await?.kvs)
    }
}

/// The last segment of a key: a member's id, a rollout's name.
fn suffix(key: &str) -> String {
    key.rsplit('/').next().unwrap_or(key).to_string()
}
