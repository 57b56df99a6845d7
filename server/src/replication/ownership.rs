//! Ownership: a free cluster is claimed by its preferred live member; an
//! idle cluster whose preferred member changed is released so that member
//! can claim it; a busy one (an operation, or a task run held with
//! [`Replication::hold`]) is released after that ends.

use super::owners_view::OwnersView;
use super::state_memo::StateMemo;
use super::*;
use crate::cluster::{from_json, to_json, CacheChange, ClusterCache, SCHEMA_VERSION};
use crate::store::{CmpOp, Compare, KeyValue, Op, RangeRequest, Txn};
use std::collections::HashSet;
use tokio::sync::{broadcast, watch};

/// The least time between the starts of two passes. Passes go over every
/// cluster; while thousands of clusters change hands, each claim would
/// otherwise start the peers' next pass at once.
/// A membership change (a replica joined or left; rare, and what a hand-off
/// waits on) starts its pass at once.
const PASS_SPACING: Duration = Duration::from_millis(100);
/// How soon a pass that failed (etcd unreachable, say) is tried again.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(500);

/// Owner keys claimed per transaction, under etcd's default limit of 128
/// operations per transaction.
const CLAIM_BATCH: usize = 100;

impl Replication {
    /// Reconciles ownership on every membership or ownership change, soon
    /// after a cluster is created, and at least every TTL/3, until
    /// `shutdown` turns true. The clusters come from the watch cache (a full
    /// read of every cluster each pass would cost etcd megabytes per second
    /// at ten thousand clusters).
    pub async fn run_ownership(
        self: Arc<Self>,
        cache: Arc<ClusterCache>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let period = self.config.lease_ttl / 3;
        let mut changes = cache.subscribe();
        let mut owners = OwnersView::default();
        let mut memo = StateMemo::default();
        loop {
            let started = tokio::time::Instant::now();
            // The pass reads the cache as it is now, which already shows
            // every change queued so far: drop them, so that a burst of new
            // clusters costs one pass and not one pass each (10,000 of them
            // kept every replica busy for minutes).
            while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = changes.try_recv() {}
            let revision = match self.reconcile(&cache, &mut owners, &mut memo).await {
                Ok(revision) => revision,
                Err(error) => {
                    // Not at once: the members watch from revision 0 would
                    // end the wait straight away, a pass after a pass for as
                    // long as the error lasts.
                    tracing::warn!(%error, retry_in = ?RETRY_AFTER_ERROR, "ownership reconcile failed");
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(RETRY_AFTER_ERROR) => continue,
                    }
                }
            };
            // Either prefix changing is a reason to look again (the owners
            // view follows its own watch); a member change is also a reason
            // not to wait (see PASS_SPACING).
            let members = async { self.store.watch(&self.keys.members(), revision + 1).await };
            let mut members = tokio::select! {
                _ = shutdown.changed() => return,
                members = members => members.ok(),
            };
            let created = async {
                loop {
                    match changes.recv().await {
                        // The first write of a state key: a new cluster.
                        Ok(CacheChange::State(kv)) if kv.version == 1 => break,
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await
                        }
                    }
                }
            };
            let members_changed = tokio::select! {
                _ = shutdown.changed() => return,
                _ = next_change(&mut members) => true,
                _ = owners.next_change(&self.keys) => false,
                _ = created => false,
                _ = tokio::time::sleep(period) => false,
            };
            if !members_changed {
                // Changes that arrive in a burst are taken in one pass; a
                // member joining or leaving meanwhile ends the wait (a
                // leaving member's owner keys may be seen a moment first).
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep_until(started + PASS_SPACING) => {},
                    _ = next_change(&mut members) => {},
                }
            }
        }
    }

    /// One pass: returns the store revision it read the members at.
    async fn reconcile(
        &self,
        cache: &ClusterCache,
        owners: &mut OwnersView,
        memo: &mut StateMemo,
    ) -> crate::store::Result<i64> {
        self.metrics.ownership_passes.inc();
        let members = self
            .store
            .range(RangeRequest::prefix(self.keys.members()))
            .await?;
        let Some(lease) = self.live_lease() else {
            return Ok(members.revision);
        };
        let members_read: Vec<MemberRecord> = members
            .kvs
            .iter()
            .filter_map(|kv| from_json::<MemberRecord>(kv).ok())
            .collect();
        let live_leases: HashSet<LeaseId> = members_read.iter().map(|m| m.lease).collect();
        // A draining member still owns what it runs, but is preferred for
        // nothing: its idle clusters go to the others.
        let live: Vec<String> = members_read
            .into_iter()
            .filter(|m| !m.draining)
            .map(|m| m.id)
            .collect();
        if self.is_draining() || !live.iter().any(|id| id == &self.config.replica_id) {
            // Not (yet) visible as a member, or draining: claim nothing.
            return Ok(members.revision);
        }
        let own_writes = self.owner_writes.load(std::sync::atomic::Ordering::SeqCst);
        let store = self.store.as_ref();
        owners.catch_up(store, &self.keys, own_writes).await?;
        // A member that left took its owner keys with its lease, in the
        // same revision as its member key, which this pass has seen; the
        // view's watch may not have delivered those deletes yet (a hand-off
        // would then wait for the next pass).
        owners
            .await_departed(store, &self.keys, &live_leases)
            .await?;
        let owner_of = owners.owners();
        let mut owned: HashMap<String, Claim> = owner_of
            .iter()
            .filter(|(_, (owner, _))| owner.lease == lease)
            .map(|(cluster, (_, epoch))| {
                (
                    cluster.clone(),
                    Claim {
                        lease,
                        epoch: *epoch,
                    },
                )
            })
            .collect();
        let (mut to_claim, mut to_release) = (Vec::new(), Vec::new());
        memo.begin_pass(&live);
        let replica_id = self.config.replica_id.as_str();
        let mut decide = |cluster: &str, kv: &KeyValue| {
            let (state, mine) = memo.note(cluster, kv, |cluster, live| {
                preferred(cluster, live.iter().map(String::as_str)) == Some(replica_id)
            });
            if !state.understood {
                return;
            }
            match owned.get(cluster).copied() {
                None if mine && !owner_of.contains_key(cluster) => {
                    to_claim.push(cluster.to_string());
                }
                Some(claim) if !mine && state.idle && !self.is_held(cluster) => {
                    to_release.push((cluster.to_string(), claim, state.revision));
                }
                _ => {}
            }
        };
        if !cache.visit_states(&mut decide) {
            let listed = self
                .store
                .range(RangeRequest::prefix(self.keys.clusters()))
                .await?;
            for kv in listed.kvs.iter().filter(|kv| kv.key.ends_with("/state")) {
                if let Some((cluster, _)) = self.keys.split_cluster_key(&kv.key) {
                    decide(cluster, kv);
                }
            }
        }
        memo.end_pass();
        for (cluster, claim, idle_at) in to_release {
            let idle =
                Compare::mod_revision(self.keys.cluster_state(&cluster), CmpOp::Equal, idle_at);
            if self.release(&cluster, claim, [idle]).await? {
                owned.remove(&cluster);
            }
        }
        for batch in to_claim.chunks(CLAIM_BATCH) {
            if self.is_draining() {
                break;
            }
            let claimed = self.claim_batch(batch, lease).await?;
            // Published (and announced) batch by batch: the rest of this
            // pass (more batches, releases) may take a while.
            self.publish_claimed(lease, &claimed);
            owned.extend(claimed);
        }
        // Owner keys of clusters that no longer exist (or that only newer
        // replicas understand).
        let gone: Vec<(String, Claim)> = owned
            .iter()
            .filter(|(cluster, _)| !memo.understood(cluster))
            .map(|(cluster, claim)| (cluster.clone(), *claim))
            .collect();
        for (cluster, claim) in gone {
            if self.release(&cluster, claim, []).await? {
                owned.remove(&cluster);
            }
        }
        // Any owned cluster not yet published is announced too: one whose
        // claim committed in an earlier pass that failed before publishing
        // it (its reply lost, say) shows up in the owner view with this
        // replica's lease.
        self.publish_owned(lease, owned);
        Ok(members.revision)
    }

    fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Adds `claimed` to this replica's published claims (while `lease` is
    /// its live lease) and announces them.
    fn publish_claimed(&self, lease: LeaseId, claimed: &[(String, Claim)]) {
        if self.live_lease() != Some(lease) {
            return;
        }
        let adopted = {
            let mut published = lock(&self.owned);
            claimed
                .iter()
                .filter(|(cluster, claim)| {
                    published.insert(cluster.clone(), *claim) != Some(*claim)
                })
                .map(|(cluster, _)| cluster.clone())
                .collect()
        };
        self.announce(adopted);
    }

    /// Publishes `owned` as this replica's claims (while `lease` is its live
    /// lease) and announces those it did not show before.
    fn publish_owned(&self, lease: LeaseId, owned: HashMap<String, Claim>) {
        // A draining replica's releases are its own to publish: this pass
        // may have read an owner key it released since.
        if self.live_lease() != Some(lease) || self.is_draining() {
            return;
        }
        self.metrics.clusters_owned.set(owned.len() as i64);
        let adopted = {
            let mut published = lock(&self.owned);
            let adopted = owned
                .iter()
                .filter(|(cluster, claim)| published.get(*cluster) != Some(*claim))
                .map(|(cluster, _)| cluster.clone())
                .collect();
            *published = owned;
            adopted
        };
        self.announce(adopted);
    }

    /// Tells the executor about clusters `claim` now shows owned under a new
    /// claim: their operations may be orphans to recover.
    fn announce(&self, adopted: Vec<String>) {
        for cluster in adopted {
            let _ = self.adopted.send(cluster);
        }
    }

    /// Claims free clusters in one transaction (each owner key must still
    /// be absent); if any was taken meanwhile, claims them one by one.
    async fn claim_batch(
        &self,
        clusters: &[String],
        lease: LeaseId,
    ) -> crate::store::Result<Vec<(String, Claim)>> {
        let owner = to_json(&OwnerRecord {
            schema: SCHEMA_VERSION,
            replica: self.config.replica_id.clone(),
            lease,
        });
        let txn = Txn::new()
            .when(clusters.iter().map(|c| Compare::absent(self.keys.owner(c))))
            .and_then(
                clusters
                    .iter()
                    .map(|c| Op::put_with_lease(self.keys.owner(c), owner.clone(), lease)),
            );
        let result = self.store.txn(txn).await?;
        if result.succeeded {
            self.wrote_owners(result.revision);
            tracing::info!(
                clusters = clusters.len(),
                epoch = result.revision,
                "claimed clusters"
            );
            let claim = Claim {
                lease,
                epoch: result.revision,
            };
            return Ok(clusters.iter().map(|c| (c.clone(), claim)).collect());
        }
        let mut claimed = Vec::new();
        for cluster in clusters {
            if let Some(claim) = self.try_claim(cluster, lease).await? {
                claimed.push((cluster.clone(), claim));
            }
        }
        Ok(claimed)
    }

    async fn try_claim(
        &self,
        cluster: &str,
        lease: LeaseId,
    ) -> crate::store::Result<Option<Claim>> {
        let key = self.keys.owner(cluster);
        let owner = OwnerRecord {
            schema: SCHEMA_VERSION,
            replica: self.config.replica_id.clone(),
            lease,
        };
        let txn = Txn::new()
            .when([Compare::absent(&key)])
            .and_then([Op::put_with_lease(&key, to_json(&owner), lease)]);
        let result = self.store.txn(txn).await?;
        if !result.succeeded {
            return Ok(None);
        }
        self.wrote_owners(result.revision);
        tracing::info!(cluster, epoch = result.revision, "claimed cluster");
        Ok(Some(Claim {
            lease,
            epoch: result.revision,
        }))
    }

    /// Gives up `cluster` while `unchanged` holds (a state key still at the
    /// revision seen idle, say: an operation accepted since keeps the
    /// cluster here until it ends).
    pub(super) async fn release(
        &self,
        cluster: &str,
        claim: Claim,
        unchanged: impl IntoIterator<Item = Compare>,
    ) -> crate::store::Result<bool> {
        let txn = Txn::new()
            .when(claim.fence(&self.keys, cluster))
            .when(unchanged)
            .and_then([Op::delete(self.keys.owner(cluster))]);
        let result = self.store.txn(txn).await?;
        if result.succeeded {
            self.wrote_owners(result.revision);
            tracing::info!(cluster, "released cluster");
        }
        Ok(result.succeeded)
    }

    /// Notes an owner write of this replica, which the next pass's view of
    /// the owner keys must include.
    pub(super) fn wrote_owners(&self, revision: i64) {
        self.owner_writes
            .fetch_max(revision, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The next event of `watch` (any: a failure is a reason to look again
/// too), or never when there is no watch.
async fn next_change(watch: &mut Option<crate::store::WatchStream>) {
    match watch {
        Some(watch) => {
            watch.next().await;
        }
        None => std::future::pending().await,
    }
}
