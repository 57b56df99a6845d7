//! Hand-off on shutdown while operations still run here: the replica marks
//! its member record draining, so that peers prefer it for no cluster, and
//! releases every cluster it owns whose operation does not run here. The
//! clusters whose operations it runs stay until those end (or the hand-off
//! grace does); then the lease goes, and what is left with it.
//!
//! A task run in flight does not keep its cluster: the next owner aborts and
//! retries it, as after a crash. Kept, the cluster would be stuck for the
//! whole grace: this replica takes no more work, so an operation accepted
//! for it meanwhile would wait for the lease to go.
//!
//! While draining, ownership passes claim nothing and no longer publish
//! their view of what this replica owns: a pass that read the owner keys
//! before a release would otherwise bring the released cluster back.
//!
//! Without this, every cluster of a draining replica would wait for the
//! slowest operation it runs: an hour-long upgrade would hold up a stop of
//! any of its other clusters for that hour.

use super::*;
use crate::cluster::{from_json, ClusterCache, StateRecord};
use crate::store::{KeyValue, Op, Txn};
use std::sync::atomic::Ordering;

/// Clusters released per transaction: each brings 3-4 compares, under
/// etcd's default limit of 128 per transaction.
const RELEASE_BATCH: usize = 30;

impl Ownership {
    /// Rewrites this replica's member record as draining (bound to the same
    /// lease, and only while the record is still bound to it): peers then
    /// claim the clusters it releases.
    pub async fn begin_draining(&self) -> crate::store::Result<()> {
        self.draining.store(true, Ordering::SeqCst);
        if self.live_lease().is_none() {
            return Ok(());
        }
        if self.rewrite_member_record().await? {
            tracing::info!("draining: handing over the clusters that run nothing here");
        } else {
            tracing::warn!("member record not bound to this replica's lease: not marked draining");
        }
        Ok(())
    }

    /// Releases every owned cluster that is idle or whose operation does not
    /// run here (a task run in flight does not count, see the module docs) (`runs_here` tells, by
    /// operation id): one still PENDING (this replica takes no more work),
    /// or a RUNNING one left by an earlier owner that was not taken up yet,
    /// which the next owner recovers. Each release compares what it was
    /// decided on (the state key, the operation record), so an operation
    /// that changed meanwhile keeps its cluster here. Returns how many
    /// clusters this replica still owns.
    pub async fn release_unbusy(
        &self,
        cache: &ClusterCache,
        runs_here: impl Fn(&str) -> bool,
    ) -> crate::store::Result<usize> {
        let owned: HashMap<String, Claim> = lock(&self.owned).clone();
        let states = self.owned_states(cache, &owned).await?;
        let mut releasable = Vec::new();
        for (cluster, kv) in states {
            let Ok(state) = from_json::<StateRecord>(&kv) else {
                continue;
            };
            if state.schema > self.schema {
                continue;
            }
            let mut unchanged = vec![Compare::mod_revision(
                &kv.key,
                CmpOp::Equal,
                kv.mod_revision,
            )];
            if let Some(slot) = &state.operation {
                if runs_here(&slot.id) {
                    continue;
                }
                let key = self.keys.operation(&cluster, &slot.id);
                let Some(record) = self.store.get(&key).await?.into_single() else {
                    continue;
                };
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

    /// The state keys of `owned`.
    async fn owned_states(
        &self,
        cache: &ClusterCache,
        owned: &HashMap<String, Claim>,
    ) -> crate::store::Result<Vec<(String, KeyValue)>> {
        let mut states = Vec::new();
        cache
            .for_each_state(|cluster, kv| {
                if owned.contains_key(cluster) {
                    let dir = self.keys.cluster(cluster);
                    states.push((cluster.to_string(), kv.to_key_value(&dir)));
                }
            })
            .await?;
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cluster::{to_json, ClusterState, OperationSlot};
    use crate::store::MemoryStore;

    /// A replica that joined `store` and owns `clusters`, each with a state
    /// key (its slot holding `op-<cluster>` unless the name says idle) and
    /// that operation's record.
    pub(crate) async fn owner_of(
        store: SharedStore,
        keys: &KeyLayout,
        clusters: &[&str],
    ) -> Arc<Ownership> {
        let config = OwnershipConfig {
            replica_id: "r1".into(),
            address: "127.0.0.1:1".into(),
            admin_address: String::new(),
            admin_tls: None,
            lease_ttl: Duration::from_secs(30),
            lease_margin: Duration::from_secs(6),
            peer_liveness: false,
        };
        let (replication, _) = Ownership::new(store.clone(), keys.clone(), config, Metrics::new());
        let lease = replication.join().await.unwrap();
        for cluster in clusters {
            let slot = (!cluster.starts_with("idle")).then(|| OperationSlot {
                id: format!("op-{cluster}"),
                kind: "stop".into(),
            });
            let state = StateRecord {
                schema: SCHEMA_VERSION,
                uid: format!("uid-{cluster}"),
                state: ClusterState::Running,
                operation: slot.clone(),
                changed_at: "2026-12-04T00:00:00Z".into(),
            };
            let owner = OwnerRecord {
                schema: SCHEMA_VERSION,
                replica: "r1".into(),
                lease,
                epoch_base: 0,
                generation: 0,
            };
            let mut ops = vec![
                Op::put(keys.cluster_state(cluster), to_json(&state)),
                Op::put_with_lease(keys.owner(cluster), to_json(&owner), lease),
            ];
            if let Some(slot) = slot {
                ops.push(Op::put(keys.operation(cluster, &slot.id), "{}"));
            }
            let written = store.txn(Txn::new().and_then(ops)).await.unwrap();
            let claim = Claim::new(lease, 0, written.revision);
            lock(&replication.owned).insert(cluster.to_string(), claim);
        }
        replication
    }

    async fn owner_key(store: &SharedStore, keys: &KeyLayout, cluster: &str) -> bool {
        store
            .get(&keys.owner(cluster))
            .await
            .unwrap()
            .into_single()
            .is_some()
    }

    #[tokio::test]
    async fn releases_what_runs_nothing_here_and_keeps_what_does() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let clusters = ["idle", "running-here", "orphan", "idle-task-run"];
        let replication = owner_of(store.clone(), &keys, &clusters).await;
        let cache = ClusterCache::new(store.clone(), keys.clone(), Metrics::new());
        // A task run in flight: the next owner aborts and retries it.
        let _task_run = replication.hold("idle-task-run");

        let left = replication
            .release_unbusy(&cache, |id| id == "op-running-here")
            .await
            .unwrap();

        assert_eq!(left, 1);
        assert_eq!(replication.owned_clusters(), ["running-here"]);
        for (cluster, kept) in [
            ("idle", false),
            ("orphan", false),
            ("running-here", true),
            ("idle-task-run", false),
        ] {
            assert_eq!(owner_key(&store, &keys, cluster).await, kept, "{cluster}");
        }
    }

    async fn member_record(store: &SharedStore, keys: &KeyLayout) -> MemberRecord {
        let kv = store.get(&keys.member("r1")).await.unwrap().into_single();
        from_json(&kv.expect("a member record")).unwrap()
    }

    #[tokio::test]
    async fn draining_is_written_only_over_this_replicas_own_member_record() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let replication = owner_of(store.clone(), &keys, &[]).await;
        replication.begin_draining().await.unwrap();
        let member = member_record(&store, &keys).await;
        assert!(member.draining);

        // Another incarnation's record (a replica started with the same id).
        let other = MemberRecord {
            lease: 0,
            draining: false,
            ..member
        };
        store
            .txn(Txn::new().and_then([Op::put(keys.member("r1"), to_json(&other))]))
            .await
            .unwrap();
        replication.begin_draining().await.unwrap();
        assert!(!member_record(&store, &keys).await.draining);
    }
}
