//! Hand-off on shutdown while operations still run here: the replica marks
//! its member record draining, so that peers prefer it for no cluster, and
//! releases every cluster it owns that runs nothing here. The clusters whose
//! operations it runs stay until those end (or the hand-off grace does);
//! then the lease goes, and what is left with it.
//!
//! Without this, every cluster of a draining replica would wait for the
//! slowest operation it runs: an hour-long upgrade would hold up a stop of
//! any of its other clusters for that hour.

use super::*;
use crate::cluster::{from_json, to_json, ClusterCache, StateRecord, SCHEMA_VERSION};
use crate::operation::{OperationRecord, OperationState};
use crate::store::{KeyValue, Op, Txn};

/// Clusters released per transaction: each brings 3-4 compares, under
/// etcd's default limit of 128 per transaction.
const RELEASE_BATCH: usize = 30;

impl Replication {
    /// Rewrites this replica's member record as draining (bound to the same
    /// lease): peers then claim the clusters it releases.
    pub async fn begin_draining(&self) -> crate::store::Result<()> {
        let Some(lease) = self.live_lease() else {
            return Ok(());
        };
        let member = MemberRecord {
            schema: SCHEMA_VERSION,
            id: self.config.replica_id.clone(),
            address: self.config.address.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            lease,
            draining: true,
        };
        let key = self.keys.member(&self.config.replica_id);
        self.store
            .txn(Txn::new().and_then([Op::put_with_lease(key, to_json(&member), lease)]))
            .await?;
        tracing::info!("draining: handing over the clusters that run nothing here");
        Ok(())
    }

    /// Releases every owned cluster that is idle, or whose operation is
    /// still PENDING (this replica takes no more work), and that no task run
    /// holds. Each release compares what it was decided on (the state key,
    /// the PENDING record), so an operation that started meanwhile keeps
    /// its cluster here. Returns how many clusters this replica still owns.
    pub async fn release_unbusy(&self, cache: &ClusterCache) -> crate::store::Result<usize> {
        let owned: HashMap<String, Claim> = lock(&self.owned).clone();
        let states = self.owned_states(cache, &owned).await?;
        let mut releasable = Vec::new();
        for (cluster, kv) in states {
            if self.is_held(&cluster) {
                continue;
            }
            let Ok(state) = from_json::<StateRecord>(&kv) else {
                continue;
            };
            if state.schema > SCHEMA_VERSION {
                continue;
            }
            let mut unchanged = vec![Compare::mod_revision(
                &kv.key,
                CmpOp::Equal,
                kv.mod_revision,
            )];
            if let Some(slot) = &state.operation {
                let key = self.keys.operation(&cluster, &slot.id);
                let Some(record) = self.store.get(&key).await?.into_single() else {
                    continue;
                };
                let pending = from_json::<OperationRecord>(&record)
                    .is_ok_and(|op| op.state == OperationState::Pending);
                if !pending {
                    continue;
                }
                unchanged.push(Compare::mod_revision(
                    key,
                    CmpOp::Equal,
                    record.mod_revision,
                ));
            }
            let claim = owned[&cluster];
            releasable.push((cluster, claim, unchanged));
        }
        for batch in releasable.chunks(RELEASE_BATCH) {
            for cluster in self.release_batch(batch).await? {
                lock(&self.owned).remove(&cluster);
            }
        }
        let left = lock(&self.owned).len();
        self.metrics.clusters_owned.set(left as i64);
        Ok(left)
    }

    /// The state keys of `owned`, from the cache (or from etcd when the
    /// cache is not ready).
    async fn owned_states(
        &self,
        cache: &ClusterCache,
        owned: &HashMap<String, Claim>,
    ) -> crate::store::Result<Vec<(String, KeyValue)>> {
        let mut states = Vec::new();
        let cached = cache.visit_states(|cluster, kv| {
            if owned.contains_key(cluster) {
                states.push((cluster.to_string(), kv.clone()));
            }
        });
        if cached {
            return Ok(states);
        }
        states.clear();
        for cluster in owned.keys() {
            let key = self.keys.cluster_state(cluster);
            if let Some(kv) = self.store.get(&key).await?.into_single() {
                states.push((cluster.clone(), kv));
            }
        }
        Ok(states)
    }

    /// Releases `batch` in one transaction, or one by one if any of them
    /// changed; returns the clusters released.
    async fn release_batch(
        &self,
        batch: &[(String, Claim, Vec<Compare>)],
    ) -> crate::store::Result<Vec<String>> {
        let txn = Txn::new()
            .when(batch.iter().flat_map(|(cluster, claim, unchanged)| {
                claim
                    .fence(&self.keys, cluster)
                    .into_iter()
                    .chain(unchanged.iter().cloned())
            }))
            .and_then(
                batch
                    .iter()
                    .map(|(cluster, _, _)| Op::delete(self.keys.owner(cluster))),
            );
        let result = self.store.txn(txn).await?;
        if result.succeeded {
            self.wrote_owners(result.revision);
            tracing::info!(clusters = batch.len(), "released clusters while draining");
            return Ok(batch
                .iter()
                .map(|(cluster, _, _)| cluster.clone())
                .collect());
        }
        let mut released = Vec::new();
        for (cluster, claim, unchanged) in batch {
            if self.release(cluster, *claim, unchanged.clone()).await? {
                released.push(cluster.clone());
            }
        }
        Ok(released)
    }
}
