//! Ownership: a free cluster is claimed by its preferred live member; an
//! idle cluster whose preferred member changed is released so that member
//! can claim it; a busy one (an operation, or a task run held with
//! [`Ownership::hold`]) is released after that ends.
//!
//! # Guarantees
//! - A cluster's preferred member is chosen among the live members whose
//!   member record shows they understand its state record's schema: in a
//!   rolling upgrade, a cluster a newer build wrote is claimed by a newer
//!   replica, never left to an older preferred member that cannot read it.
//! - Every release compares what it was decided on: an idle state key at
//!   the revision seen idle, or, for a cluster this replica can no longer
//!   read (or no longer finds), its state key at the revision seen (or
//!   still absent).
//!
//! # Assumptions
//! - Every build chooses among the members that understand a record in the
//!   same way; for a record every member understands, that is all of them,
//!   as before member records said what they understand.

use super::gray_failure;
use super::owners_view::{OwnerMap, OwnersView};
use super::state_memo::{Member, StateMemo};
use super::*;
use crate::cluster::{from_json, to_json, CacheChange, CachedKey, ClusterCache};
use crate::store::{CmpOp, Compare, KeyValue, Op, RangeRequest, Txn};
use futures_util::stream::{FuturesUnordered, StreamExt};
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
/// Departed owner keys drained per transaction: two compares each, under
/// etcd's limit of 128 compares per transaction.
const DRAIN_BATCH: usize = 64;
/// Claim batches in flight at once.
const CLAIMS_IN_FLIGHT: usize = 4;
/// The longest a replica goes without a pass over every cluster: what the
/// passes in between do not see (a cluster deleted, say) waits for it.
const FULL_PASS_EVERY: Duration = Duration::from_secs(30);

/// The clusters a pass looks at.
enum Scope {
    Every,
    /// Those whose state key was written since the last pass, and those
    /// it left pending.
    Some(HashSet<String>),
}

impl Scope {
    /// Every cluster for a full pass (the changes noted are then moot);
    /// otherwise those changed since the last pass, taken.
    fn of_pass(full: bool, changed: &mut HashSet<String>) -> Self {
        if full {
            changed.clear();
            Scope::Every
        } else {
            Scope::Some(std::mem::take(changed))
        }
    }
}

/// What a pass reads and updates, kept from pass to pass.
struct Pass<'a> {
    owners: &'a mut OwnersView,
    memo: &'a mut StateMemo,
    /// Owned clusters another member is preferred for that a pass could
    /// not release (busy, held, or changed under the release).
    pending: &'a mut HashSet<String>,
    /// The lease and owner-view revision of the last pass that published
    /// every claim it found and left nothing to look at again: a pass that
    /// finds both unchanged, and no cluster changed, has nothing to do.
    published: &'a mut Option<(LeaseId, i64)>,
}

/// The member keys as one read shows them.
pub(super) struct MembersRead {
    /// The records this build can read.
    pub records: Vec<MemberRecord>,
    /// The lease of every member key, unreadable records' too: an owner
    /// key bound to any other lease belongs to a member that is gone.
    pub leases: HashSet<LeaseId>,
    pub revision: i64,
}

/// What a pass decided: clusters to claim, owner keys of departed members
/// to drain and then claim, and owned clusters to release (with the claim
/// and the state revision seen idle).
#[derive(Default)]
struct Decided {
    to_claim: Vec<String>,
    to_drain: Vec<Departed>,
    to_release: Vec<(String, Claim, i64)>,
}

impl Decided {
    fn is_empty(&self) -> bool {
        self.to_claim.is_empty() && self.to_drain.is_empty() && self.to_release.is_empty()
    }
}

/// Clusters claimed in one transaction.
enum Batch<'a> {
    Free(&'a [String]),
    /// Drained first, in a transaction of their own.
    Departed(&'a [Departed]),
}

/// What a pass knows of the owner keys when it decides.
struct Known<'a> {
    owner_of: &'a OwnerMap,
    /// This replica's claims among them.
    owned: &'a HashMap<String, Claim>,
    /// The leases of the members' keys.
    live_leases: &'a HashSet<LeaseId>,
}

/// An owner key of a member that is gone (deposed, its lease not yet
/// revoked): the cluster, and the key's lease and create revision as seen.
struct Departed {
    cluster: String,
    lease: LeaseId,
    created: i64,
}

/// What ended the wait between two passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// The members changed.
    Members,
    /// The owners, the watchers, or the cache as a whole changed.
    Owners,
    /// A cluster was created.
    Created,
    /// The TTL/3 tick.
    Tick,
}

impl Ownership {
    /// Reconciles ownership on every membership or ownership change, soon
    /// after a cluster is created, and at least every TTL/3, until
    /// `shutdown` turns true. The clusters come from the watch cache (a full
    /// read of every cluster each pass would cost etcd megabytes per second
    /// at ten thousand clusters).
    ///
    /// A pass after a membership or ownership change, a re-list, an error,
    /// or [`FULL_PASS_EVERY`] goes over every cluster. Any other (the TTL/3
    /// tick, a cluster created) goes over the clusters whose state key was
    /// written since the last pass and those the last pass left undecided
    /// (a busy or held cluster to release once idle): the decision of any
    /// other cluster depends only on what did not change. At rest, with
    /// 100,000 clusters, walking them all each tick was most of a replica's
    /// CPU.
    pub async fn run_ownership(
        self: Arc<Self>,
        cache: Arc<ClusterCache>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let period = self.config.lease_ttl / 3;
        let mut changes = cache.subscribe();
        let mut owners = OwnersView::new(Arc::clone(&cache), Arc::clone(&self.owner_map));
        let mut memo = StateMemo::new(self.schema);
        let (mut pending, mut published) = (HashSet::new(), None);
        let (mut changed, mut full) = (HashSet::new(), true);
        let mut last_full = tokio::time::Instant::now();
        loop {
            let started = tokio::time::Instant::now();
            // The pass reads the cache as it is now, which already shows
            // every change queued so far: take them (their clusters are
            // looked at), so that a burst of new clusters costs one pass
            // and not one pass each (10,000 of them kept every replica
            // busy for minutes).
            full |= self.take_changes(&mut changes, &mut changed);
            // Without the cache's watch, or the owners view's, a change
            // may have gone unseen: every cluster is looked at.
            full |= started >= last_full + FULL_PASS_EVERY
                || !cache.is_ready()
                || !owners.is_following();
            if full {
                last_full = started;
            }
            let scope = Scope::of_pass(full, &mut changed);
            // Before the pass reads the members: a change after that read
            // is then in the subscription.
            let mut members = cache
                .watch_keys(&self.keys.members())
                .map(|(members, _)| members);
            let pass = Pass {
                owners: &mut owners,
                memo: &mut memo,
                pending: &mut pending,
                published: &mut published,
            };
            let revision = match self.reconcile(&cache, pass, &scope).await {
                Ok(revision) => {
                    self.publish_owner_keys(&owners);
                    revision
                }
                Err(error) => {
                    // Not at once: a pass would follow a pass for as long
                    // as the error lasts.
                    tracing::warn!(%error, retry_in = ?RETRY_AFTER_ERROR, "ownership reconcile failed");
                    full = true;
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(RETRY_AFTER_ERROR) => continue,
                    }
                }
            };
            // Either prefix changing is a reason to look again (the owners
            // view follows the same watch); a member change is also a
            // reason not to wait (see PASS_SPACING).
            let created = wait_for_created(&self.keys, &mut changes, &mut changed);
            let woke = tokio::select! {
                _ = shutdown.changed() => return,
                _ = member_change(&mut members, revision) => Woke::Members,
                _ = owners.next_change(&self.keys) => Woke::Owners,
                relisted = created => if relisted { Woke::Owners } else { Woke::Created },
                _ = self.pass_wanted.notified() => Woke::Owners,
                _ = tokio::time::sleep(period) => Woke::Tick,
            };
            full = matches!(woke, Woke::Members | Woke::Owners);
            if woke != Woke::Members {
                // Changes that arrive in a burst are taken in one pass; a
                // member joining or leaving meanwhile ends the wait (a
                // leaving member's owner keys may be seen a moment first).
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep_until(started + PASS_SPACING) => {},
                    _ = member_change(&mut members, revision) => full = true,
                }
            }
        }
    }

    /// Tells the owner-key counts' subscribers, when the pass changed them.
    fn publish_owner_keys(&self, owners: &OwnersView) {
        self.owner_keys.send_if_modified(|counts| {
            let changed = counts != owners.leases();
            if changed {
                counts.clone_from(owners.leases());
            }
            changed
        });
    }

    /// Takes the cache changes queued, noting the clusters whose state key
    /// was written in `changed`; whether the cache re-listed or changes
    /// were missed (every cluster must then be looked at).
    fn take_changes(
        &self,
        changes: &mut broadcast::Receiver<CacheChange>,
        changed: &mut HashSet<String>,
    ) -> bool {
        let mut missed = false;
        loop {
            match changes.try_recv() {
                Ok(CacheChange::State(kv)) => note_cluster(&self.keys, &kv, changed),
                Ok(CacheChange::Tasks(_)) => {}
                Ok(CacheChange::Relisted) | Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    missed = true;
                }
                Err(_) => return missed,
            }
        }
    }

    /// One pass over the clusters of `scope`: returns the store revision it
    /// read the members at.
    async fn reconcile(
        &self,
        cache: &ClusterCache,
        pass: Pass<'_>,
        scope: &Scope,
    ) -> crate::store::Result<i64> {
        self.metrics.ownership_passes.inc();
        let members = self.read_members().await?;
        let (members_read, read_at) = (&members.records, members.revision);
        let Some(lease) = self.live_lease() else {
            return Ok(read_at);
        };
        if !members.leases.contains(&lease) && !self.is_draining() {
            // A peer judged this replica crashed and removed its member
            // key; its lease lives, so it was wrong: be a member again.
            self.reregister(lease).await?;
            return Ok(read_at);
        }
        self.say_if_watched(members_read).await?;
        // A draining member still owns what it runs, but is preferred for
        // nothing: its idle clusters go to the others. So is a member cut
        // off from a provider while another reaches it (see gray_failure).
        let live: Vec<Member> = gray_failure::preferable(members_read)
            .into_iter()
            .map(|m| (m.id.clone(), m.schema))
            .collect();
        self.owner_map
            .set_working(live.iter().map(|(id, _)| id.clone()));
        if self.is_draining() || !live.iter().any(|(id, _)| id == &self.config.replica_id) {
            // Not (yet) visible as a member, or draining: claim nothing.
            return Ok(read_at);
        }
        let own_writes = self.owner_writes.load(std::sync::atomic::Ordering::SeqCst);
        let store = self.store.as_ref();
        pass.owners.catch_up(store, &self.keys, own_writes).await?;
        // A member that left took its owner keys with its lease, in the
        // same revision as its member key, which this pass has seen; the
        // view's watch may not have delivered those deletes yet (a hand-off
        // would then wait for the next pass).
        pass.owners
            .await_departed(store, &self.keys, &members.leases)
            .await?;
        // Members that changed unseen (between the loop's look and this
        // read) make every decision new.
        let scope = match scope {
            Scope::Some(_) if pass.memo.members() != live.as_slice() => &Scope::Every,
            scope => scope,
        };
        let seen = (lease, pass.owners.revision());
        let unchanged = matches!(scope, Scope::Some(changed) if changed.is_empty());
        if unchanged && pass.pending.is_empty() && *pass.published == Some(seen) {
            // The owner keys, the members and every cluster's state are
            // as the last pass that published found them: it would decide
            // nothing, and rebuilding and comparing a third of the fleet's
            // claims was most of a replica's CPU at rest.
            return Ok(read_at);
        }
        *pass.published = None;
        let owner_of = pass.owners.owners();
        let mut owned = owner_of.claims_of(lease);
        pass.memo.begin_pass(&live);
        let known = Known {
            owner_of,
            owned: &owned,
            live_leases: &members.leases,
        };
        let decided = self
            .decide(cache, known, pass.memo, pass.pending, scope)
            .await?;
        let decided_nothing = decided.is_empty();
        self.release_and_claim(lease, decided, &mut owned, pass.pending)
            .await?;
        let held_unread = self
            .release_unreadable(&mut owned, pass.memo, pass.pending)
            .await?;
        // Any owned cluster not yet published is announced too: one whose
        // claim committed in an earlier pass that failed before publishing
        // it (its reply lost, say) shows up in the owner view with this
        // replica's lease.
        let settled = decided_nothing && !held_unread && pass.pending.is_empty();
        if self.publish_owned(lease, owned) && settled {
            *pass.published = Some(seen);
        }
        Ok(read_at)
    }

    /// What to claim and what to release among the clusters of `scope`;
    /// the owned ones another member is preferred for that are busy (or
    /// held) go to `pending`, to be looked at again by the next pass.
    async fn decide(
        &self,
        cache: &ClusterCache,
        known: Known<'_>,
        memo: &mut StateMemo,
        pending: &mut HashSet<String>,
        scope: &Scope,
    ) -> crate::store::Result<Decided> {
        let Known {
            owner_of,
            owned,
            live_leases,
        } = known;
        // Decided anew: the pending clusters are looked at again.
        let mut looked_at = std::mem::take(pending);
        let mut decided = Decided::default();
        let replica_id = self.config.replica_id.as_str();
        let mut decide = |cluster: &str, kv: &CachedKey| {
            let (state, mine) = memo.note(cluster, kv, |cluster, schema, live| {
                // Preferred among the members that can read the cluster's
                // records: a member of an older build never claims a
                // cluster a newer one wrote, which would otherwise be
                // stranded whenever that member came first.
                let able = live.iter().filter(|(_, known)| *known >= schema);
                preferred(cluster, able.map(|(id, _)| id.as_str())) == Some(replica_id)
            });
            if !state.understood {
                return;
            }
            match owned.get(cluster).copied() {
                None if mine => match owner_of.key_of(cluster) {
                    None => decided.to_claim.push(cluster.to_string()),
                    // Its member is gone but its lease not yet: drained
                    // here, batch by batch, rather than all at once by
                    // the revocation (one etcd apply of every key).
                    Some((lease, created)) if !live_leases.contains(&lease) => {
                        decided.to_drain.push(Departed {
                            cluster: cluster.to_string(),
                            lease,
                            created,
                        });
                    }
                    Some(_) => {}
                },
                Some(claim) if !mine && state.idle && !self.is_held(cluster) => {
                    let release = (cluster.to_string(), claim, state.revision);
                    decided.to_release.push(release);
                }
                Some(_) if !mine => {
                    pending.insert(cluster.to_string());
                }
                _ => {}
            }
        };
        match scope {
            Scope::Every => {
                cache.for_each_state(&mut decide).await?;
                memo.end_pass();
            }
            Scope::Some(changed) => {
                looked_at.extend(changed.iter().cloned());
                for cluster in &looked_at {
                    if let Some(kv) = cache.cached_state(cluster) {
                        decide(cluster, &kv);
                    }
                }
            }
        }
        Ok(decided)
    }

    /// Releases the idle clusters another member is preferred for (each
    /// only while still idle at the revision it was seen idle at; one that
    /// is not stays pending), then claims the unowned ones this replica is
    /// preferred for, in batches.
    async fn release_and_claim(
        &self,
        lease: LeaseId,
        decided: Decided,
        owned: &mut HashMap<String, Claim>,
        pending: &mut HashSet<String>,
    ) -> crate::store::Result<()> {
        for (cluster, claim, idle_at) in decided.to_release {
            let idle =
                Compare::mod_revision(self.keys.cluster_state(&cluster), CmpOp::Equal, idle_at);
            if self.release(&cluster, claim, [idle]).await? {
                owned.remove(&cluster);
            } else {
                pending.insert(cluster);
            }
        }
        // Several batches in flight: etcd commits them together, where one
        // at a time waited a round trip and a commit each (a takeover of
        // 30,000 clusters is 300 batches). A draining replica starts no
        // more; those in flight end.
        let free = decided.to_claim.chunks(CLAIM_BATCH).map(Batch::Free);
        let departed = decided.to_drain.chunks(DRAIN_BATCH).map(Batch::Departed);
        let mut batches = free.chain(departed);
        let mut claims = FuturesUnordered::new();
        loop {
            while claims.len() < CLAIMS_IN_FLIGHT && !self.is_draining() {
                let Some(batch) = batches.next() else { break };
                claims.push(self.take_batch(batch, lease));
            }
            let Some(claimed) = claims.next().await else {
                break;
            };
            let claimed = claimed?;
            // Published (and announced) batch by batch: the rest of this
            // pass (more batches, releases) may take a while.
            self.publish_claimed(lease, &claimed);
            owned.extend(claimed);
        }
        Ok(())
    }

    /// Claims one batch: free clusters at once, a departed member's after
    /// draining their owner keys.
    async fn take_batch(
        &self,
        batch: Batch<'_>,
        lease: LeaseId,
    ) -> crate::store::Result<Vec<(String, Claim)>> {
        match batch {
            Batch::Free(clusters) => self.claim_batch(clusters, lease).await,
            Batch::Departed(keys) => {
                if !self.drain(keys).await? {
                    // Some key changed since the view showed it (revoked
                    // meanwhile, say): the next pass sees how they stand.
                    return Ok(Vec::new());
                }
                let clusters: Vec<String> = keys.iter().map(|k| k.cluster.clone()).collect();
                self.claim_batch(&clusters, lease).await
            }
        }
    }

    /// Deletes the owner keys of `keys`, each only while still bound to the
    /// lease and created at the revision seen (a key claimed anew since is
    /// another owner's): all of them, or none.
    async fn drain(&self, keys: &[Departed]) -> crate::store::Result<bool> {
        let owner = |k: &Departed| self.keys.owner(&k.cluster);
        let txn = Txn::new()
            .when(keys.iter().flat_map(|k| {
                [
                    Compare::lease(owner(k), CmpOp::Equal, k.lease),
                    Compare::create_revision(owner(k), CmpOp::Equal, k.created),
                ]
            }))
            .and_then(keys.iter().map(|k| Op::delete(owner(k))));
        let drained = self.store.txn(txn).await?.succeeded;
        if drained {
            self.metrics.owner_keys_drained.inc_by(keys.len() as u64);
            tracing::info!(
                clusters = keys.len(),
                "drained a departed member's owner keys"
            );
        }
        Ok(drained)
    }

    /// Releases the owned clusters that no longer exist, or whose records
    /// only newer replicas understand (one of those claims it), each only
    /// as this pass saw it: its state key still absent, or still at the
    /// revision found unreadable. A view that lags etcd (a cluster created
    /// since, or an operation accepted on it since) loses the compare and
    /// releases nothing. A cluster a task run holds stays until it ends.
    async fn release_unreadable(
        &self,
        owned: &mut HashMap<String, Claim>,
        memo: &StateMemo,
        pending: &mut HashSet<String>,
    ) -> crate::store::Result<bool> {
        let mut held = false;
        let unreadable: Vec<(String, Claim, Compare)> = owned
            .iter()
            .filter(|(cluster, _)| !memo.understood(cluster))
            .filter(|(cluster, _)| {
                let is_held = self.is_held(cluster);
                held |= is_held;
                !is_held
            })
            .map(|(cluster, claim)| {
                let key = self.keys.cluster_state(cluster);
                let seen = match memo.revision(cluster) {
                    Some(revision) => Compare::mod_revision(key, CmpOp::Equal, revision),
                    None => Compare::absent(key),
                };
                (cluster.clone(), *claim, seen)
            })
            .collect();
        for (cluster, claim, seen) in unreadable {
            if self.release(&cluster, claim, [seen]).await? {
                owned.remove(&cluster);
            } else {
                pending.insert(cluster);
            }
        }
        Ok(held)
    }

    /// Every member record (those this build cannot read left out), the
    /// leases of every member key, and the revision they were read at.
    pub(super) async fn read_members(&self) -> crate::store::Result<MembersRead> {
        let members = self
            .store
            .range(RangeRequest::prefix(self.keys.members()))
            .await?;
        let records = members
            .kvs
            .iter()
            .filter_map(|kv| from_json::<MemberRecord>(kv).ok())
            .collect();
        Ok(MembersRead {
            records,
            leases: members.kvs.iter().map(|kv| kv.lease).collect(),
            revision: members.revision,
        })
    }

    /// Whether this replica is shutting down (it claims nothing more).
    pub fn is_draining(&self) -> bool {
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
    /// Returns whether it published them.
    fn publish_owned(&self, lease: LeaseId, owned: HashMap<String, Claim>) -> bool {
        // A draining replica's releases are its own to publish: this pass
        // may have read an owner key it released since.
        if self.live_lease() != Some(lease) || self.is_draining() {
            return false;
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
        true
    }

    /// Tells the executor about clusters `claim` now shows owned under a new
    /// claim: their operations may be orphans to recover.
    fn announce(&self, adopted: Vec<String>) {
        for cluster in adopted {
            let _ = self.adopted.send(cluster);
        }
    }

    /// Once every peer that watches holds a liveness connection to this
    /// replica (or a TTL passed), says so in its member record: from then on
    /// it is preferred for its share and claims it. The record's change
    /// starts the next pass; a peer's connection starts this one.
    async fn say_if_watched(&self, members: &[MemberRecord]) -> crate::store::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if !self.unwatched.load(SeqCst) || !self.watched_by_every_peer(members) {
            return Ok(());
        }
        self.unwatched.store(false, SeqCst);
        match self.rewrite_member_record().await {
            Ok(true) => {
                tracing::info!(
                    "every peer watches this replica: it takes its share of the clusters"
                );
                Ok(())
            }
            // No session now (the next join starts over), or the write
            // failed: said again at the next pass.
            Ok(false) => {
                self.unwatched.store(true, SeqCst);
                Ok(())
            }
            Err(error) => {
                self.unwatched.store(true, SeqCst);
                Err(error)
            }
        }
    }

    /// Claims free clusters in one transaction (each owner key must still
    /// be absent, the fence record as this replica read it); if any was
    /// taken meanwhile, claims them one by one.
    async fn claim_batch(
        &self,
        clusters: &[String],
        lease: LeaseId,
    ) -> crate::store::Result<Vec<(String, Claim)>> {
        let fence = *lock(&self.fence);
        let owner = to_json(&self.owner_record(lease, fence.base));
        let txn = Txn::new()
            .when(clusters.iter().map(|c| Compare::absent(self.keys.owner(c))))
            .when([fence.compare(&self.keys)])
            .and_then(
                clusters
                    .iter()
                    .map(|c| Op::put_with_lease(self.keys.owner(c), owner.clone(), lease)),
            );
        let result = self.store.txn(txn).await?;
        if result.succeeded {
            self.wrote_owners(result.revision);
            let claim = Claim::new(lease, fence.base, result.revision);
            self.metrics.clusters_claimed.inc_by(clusters.len() as u64);
            tracing::info!(
                clusters = clusters.len(),
                epoch = claim.epoch,
                "claimed clusters"
            );
            return Ok(clusters.iter().map(|c| (c.clone(), claim)).collect());
        }
        // Another replica rewrote the fence record (a restore it saw):
        // the batch again under it, rather than one by one.
        if self.reread_fence(fence).await? {
            return Box::pin(self.claim_batch(clusters, lease)).await;
        }
        let mut claimed = Vec::new();
        for cluster in clusters {
            if let Some(claim) = self.try_claim(cluster, lease).await? {
                claimed.push((cluster.clone(), claim));
            }
        }
        Ok(claimed)
    }

    /// Claims `cluster` if it is free, under the fence record as this
    /// replica read it, reading the record again once if that is what
    /// failed.
    async fn try_claim(
        &self,
        cluster: &str,
        lease: LeaseId,
    ) -> crate::store::Result<Option<Claim>> {
        let key = self.keys.owner(cluster);
        for _ in 0..2 {
            let fence = *lock(&self.fence);
            let txn = Txn::new()
                .when([Compare::absent(&key), fence.compare(&self.keys)])
                .and_then([Op::put_with_lease(
                    &key,
                    to_json(&self.owner_record(lease, fence.base)),
                    lease,
                )]);
            let result = self.store.txn(txn).await?;
            if result.succeeded {
                self.wrote_owners(result.revision);
                let claim = Claim::new(lease, fence.base, result.revision);
                self.metrics.clusters_claimed.inc();
                tracing::info!(cluster, epoch = claim.epoch, "claimed cluster");
                return Ok(Some(claim));
            }
            if !self.reread_fence(fence).await? {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// The owner record of a claim under `lease` and epoch base `base`.
    fn owner_record(&self, lease: LeaseId, base: i64) -> OwnerRecord {
        OwnerRecord {
            schema: self.schema,
            replica: self.config.replica_id.clone(),
            lease,
            epoch_base: base,
            generation: 0,
        }
    }

    /// After a claim under `used` failed: reads the fence record again and
    /// takes it up if another replica rewrote it (a restore it detected,
    /// or its join). True when it had changed, so the claim is worth
    /// another try.
    async fn reread_fence(&self, used: restore::FenceView) -> crate::store::Result<bool> {
        let now = restore::current_fence(self.store.as_ref(), &self.keys).await?;
        if now == used {
            return Ok(false);
        }
        if now.base != used.base {
            tracing::info!(
                base = now.base,
                was = used.base,
                "claiming under the fence record's new epoch base"
            );
        }
        let mut fence = lock(&self.fence);
        if *fence == used {
            *fence = now;
        }
        Ok(true)
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
/// Waits for a cluster to be created (the first write of a state key),
/// noting every cluster whose state key is written meanwhile in `changed`;
/// `true` when the cache re-listed or changes were missed instead.
async fn wait_for_created(
    keys: &KeyLayout,
    changes: &mut broadcast::Receiver<CacheChange>,
    changed: &mut HashSet<String>,
) -> bool {
    loop {
        match changes.recv().await {
            Ok(CacheChange::State(kv)) => {
                note_cluster(keys, &kv, changed);
                if kv.version == 1 {
                    return false;
                }
            }
            Ok(CacheChange::Tasks(_)) => {}
            Ok(CacheChange::Relisted) | Err(broadcast::error::RecvError::Lagged(_)) => return true,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Notes the cluster of state key `kv` in `changed`.
fn note_cluster(keys: &KeyLayout, kv: &KeyValue, changed: &mut HashSet<String>) {
    if let Some((cluster, _)) = keys.split_cluster_key(&kv.key) {
        changed.insert(cluster.to_string());
    }
}

/// Waits for a change of the members after `revision` (the pass's read of
/// them), or for the end of the subscription, which may have missed one;
/// never returns without a subscription (the replica's watch was not live).
async fn member_change(members: &mut Option<crate::store::WatchStream>, revision: i64) {
    let Some(watch) = members else {
        return std::future::pending().await;
    };
    loop {
        match watch.next().await {
            // Subscribed before the pass's read: it has seen this one.
            Some(Ok(event)) if event.kv.mod_revision <= revision => {}
            Some(Ok(_)) => return,
            Some(Err(_)) | None => {
                *members = None;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ClusterState, OperationSlot, StateRecord};
    use crate::store::{MemoryStore, SharedStore};

    /// A replica that joined `store`, of a build that understands records
    /// up to `schema`: above [`SCHEMA_VERSION`], a newer build. Its member
    /// record says so, as that build's own would.
    async fn replica(
        store: &SharedStore,
        keys: &KeyLayout,
        id: &str,
        schema: u32,
    ) -> Arc<Ownership> {
        let config = OwnershipConfig {
            replica_id: id.into(),
            address: "127.0.0.1:1".into(),
            admin_address: String::new(),
            admin_tls: None,
            lease_ttl: Duration::from_secs(30),
            lease_margin: Duration::from_secs(6),
            peer_liveness: false,
        };
        let metrics = Metrics::new();
        let (replication, _) =
            Ownership::understanding(store.clone(), keys.clone(), config, metrics, schema);
        let lease = replication.join().await.unwrap();
        let member = MemberRecord {
            schema,
            id: id.into(),
            address: "127.0.0.1:1".into(),
            version: "test".into(),
            lease,
            admin_address: String::new(),
            admin_tls: false,
            draining: false,
            failing_providers: Vec::new(),
            unreachable_providers: Vec::new(),
            watches_peers: false,
            unwatched: false,
        };
        let put = Op::put_with_lease(keys.member(id), to_json(&member), lease);
        store.txn(Txn::new().and_then([put])).await.unwrap();
        replication
    }

    /// Writes `cluster`'s state key in `schema`, its slot holding an
    /// operation when `busy`; returns the revision.
    async fn write_state(
        store: &SharedStore,
        keys: &KeyLayout,
        cluster: &str,
        schema: u32,
        busy: bool,
    ) -> i64 {
        let state = StateRecord {
            schema,
            uid: format!("uid-{cluster}"),
            state: ClusterState::Running,
            operation: busy.then(|| OperationSlot {
                id: format!("op-{cluster}"),
                kind: "stop".into(),
            }),
            changed_at: "2026-12-04T00:00:00Z".into(),
        };
        let put = Op::put(keys.cluster_state(cluster), to_json(&state));
        store
            .txn(Txn::new().and_then([put]))
            .await
            .unwrap()
            .revision
    }

    async fn owner_lease(store: &SharedStore, keys: &KeyLayout, cluster: &str) -> Option<LeaseId> {
        let kv = store.get(&keys.owner(cluster)).await.unwrap().into_single();
        kv.map(|kv| kv.lease)
    }

    /// One ownership pass of `replication`, over the clusters listed from
    /// etcd (the cache is not started).
    async fn pass(replication: &Ownership, store: &SharedStore, keys: &KeyLayout) {
        let cache = ClusterCache::new(store.clone(), keys.clone(), Metrics::new());
        let mut memo = StateMemo::new(replication.schema);
        let mut owners = OwnersView::new(Arc::clone(&cache), Arc::default());
        let (mut pending, mut published) = (HashSet::new(), None);
        let pass = Pass {
            owners: &mut owners,
            memo: &mut memo,
            pending: &mut pending,
            published: &mut published,
        };
        replication
            .reconcile(&cache, pass, &Scope::Every)
            .await
            .unwrap();
    }

    /// The first of a few names whose preferred member is `first` of
    /// `members`.
    fn preferring(first: &str, members: [&str; 2], tag: &str) -> String {
        (0..64)
            .map(|i| format!("{tag}-{i}"))
            .find(|name| preferred(name, members) == Some(first))
            .expect("one of 64 names prefers each of two members")
    }

    /// What a replica's passes keep from one to the next.
    struct Passes {
        owners: OwnersView,
        memo: StateMemo,
        pending: HashSet<String>,
        published: Option<(LeaseId, i64)>,
    }

    impl Passes {
        /// A watch cache of `store`, ready, and the passes of a replica of
        /// `schema` over it. The cache follows `store` while the sender
        /// returned lives.
        async fn over_a_cache(
            store: &SharedStore,
            keys: &KeyLayout,
            schema: u32,
        ) -> (Self, Arc<ClusterCache>, watch::Sender<bool>) {
            let cache = ClusterCache::new(store.clone(), keys.clone(), Metrics::new());
            let (stop, stopped) = watch::channel(false);
            tokio::spawn(Arc::clone(&cache).run(stopped));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while !cache.is_ready() {
                assert!(tokio::time::Instant::now() < deadline, "the cache is ready");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let passes = Passes {
                owners: OwnersView::new(Arc::clone(&cache), Arc::default()),
                memo: StateMemo::new(schema),
                pending: HashSet::new(),
                published: None,
            };
            (passes, cache, stop)
        }

        async fn run(&mut self, replication: &Ownership, cache: &ClusterCache, scope: Scope) {
            let pass = Pass {
                owners: &mut self.owners,
                memo: &mut self.memo,
                pending: &mut self.pending,
                published: &mut self.published,
            };
            replication.reconcile(cache, pass, &scope).await.unwrap();
        }
    }

    /// A pass that looks only at what changed still releases a cluster the
    /// last pass left pending (busy then, idle now): the TTL/3 tick at
    /// rest walks no more than that.
    #[tokio::test]
    async fn a_pass_over_what_changed_releases_what_was_left_pending() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let a = replica(&store, &keys, "a", SCHEMA_VERSION).await;
        let busy = preferring("b", ["a", "b"], "busy");
        let idle = preferring("b", ["a", "b"], "idle");
        write_state(&store, &keys, &busy, SCHEMA_VERSION, true).await;
        write_state(&store, &keys, &idle, SCHEMA_VERSION, false).await;
        let (mut pass_of, cache, _stop) = Passes::over_a_cache(&store, &keys, a.schema).await;
        // Alone, "a" claims both.
        pass_of.run(&a, &cache, Scope::Every).await;
        let a_lease = a.live_lease();
        assert_eq!(owner_lease(&store, &keys, &busy).await, a_lease);
        // "b" joins: the idle one goes at once, the busy one waits.
        let _b = replica(&store, &keys, "b", SCHEMA_VERSION).await;
        pass_of.run(&a, &cache, Scope::Every).await;
        assert_eq!(owner_lease(&store, &keys, &idle).await, None);
        assert_eq!(owner_lease(&store, &keys, &busy).await, a_lease);
        // Its operation ends; a pass over nothing that changed releases it.
        write_state(&store, &keys, &busy, SCHEMA_VERSION, false).await;
        let written = store.get(&keys.cluster_state(&busy)).await.unwrap();
        let revision = written.into_single().unwrap().mod_revision;
        cache
            .wait_until_applied(revision, Duration::from_secs(5))
            .await;
        pass_of.run(&a, &cache, Scope::Some(HashSet::new())).await;
        assert_eq!(owner_lease(&store, &keys, &busy).await, None);
    }

    /// A pass that finds the owner keys, the members and every cluster's
    /// state as the last pass that published left them does nothing (each
    /// such pass rebuilt and compared every claim: most of a replica's CPU
    /// at rest at 100,000 clusters); once an owner key moves, a pass
    /// publishes again.
    #[tokio::test]
    async fn a_pass_that_finds_nothing_changed_publishes_nothing() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let a = replica(&store, &keys, "a", SCHEMA_VERSION).await;
        write_state(&store, &keys, "one", SCHEMA_VERSION, false).await;
        let (mut pass_of, cache, _stop) = Passes::over_a_cache(&store, &keys, a.schema).await;
        let unchanged = || Scope::Some(HashSet::new());
        pass_of.run(&a, &cache, Scope::Every).await;
        assert!(owner_lease(&store, &keys, "one").await.is_some(), "claimed");
        // The claim moved the owner keys: this pass publishes, and settles.
        pass_of.run(&a, &cache, unchanged()).await;
        assert_eq!(a.metrics.clusters_owned.get(), 1);
        a.metrics.clusters_owned.set(-1);
        pass_of.run(&a, &cache, unchanged()).await;
        assert_eq!(a.metrics.clusters_owned.get(), -1, "nothing published");
        // Its owner key goes (as if by hand): the view moves, and a pass
        // over no changed cluster still publishes what it now owns.
        let gone = Txn::new().and_then([Op::delete(keys.owner("one"))]);
        store.txn(gone).await.unwrap();
        // The cache hands out changes in revision order: once it shows a
        // later cluster write, the view has been handed the delete.
        let later = write_state(&store, &keys, "later", SCHEMA_VERSION, false).await;
        cache
            .wait_until_applied(later, Duration::from_secs(5))
            .await;
        pass_of.run(&a, &cache, unchanged()).await;
        assert_eq!(a.metrics.clusters_owned.get(), 0);
    }

    /// A member deposed as crashed keeps its lease: the survivor deletes
    /// its owner keys in transactions of at most [`DRAIN_BATCH`] (not all in
    /// one apply, as revoking the lease would) and claims the clusters; the
    /// deposed replica, alive after all, writes its member key back.
    #[tokio::test]
    async fn a_deposed_members_keys_are_drained_in_batches_and_claimed() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let a = replica(&store, &keys, "a", SCHEMA_VERSION).await;
        let clusters: Vec<String> = (0..150).map(|i| format!("c{i}")).collect();
        for cluster in &clusters {
            write_state(&store, &keys, cluster, SCHEMA_VERSION, false).await;
        }
        pass(&a, &store, &keys).await;
        let a_lease = a.live_lease().unwrap();
        assert_eq!(owner_lease(&store, &keys, "c0").await, Some(a_lease));
        let b = replica(&store, &keys, "b", SCHEMA_VERSION).await;
        let deposed = Txn::new().and_then([Op::delete(keys.member("a"))]);
        let before = store.txn(deposed).await.unwrap().revision;

        pass(&b, &store, &keys).await;

        for cluster in &clusters {
            assert_eq!(owner_lease(&store, &keys, cluster).await, b.live_lease());
        }
        assert!(store.lease_time_to_live(a_lease).await.unwrap().is_some());
        let mut owners = store.watch(&keys.owners(), before + 1).await.unwrap();
        let mut deletes_per_revision: HashMap<i64, usize> = HashMap::new();
        while deletes_per_revision.values().sum::<usize>() < clusters.len() {
            let event = tokio::time::timeout(Duration::from_secs(5), owners.next())
                .await
                .expect("every drain is in the history")
                .unwrap()
                .unwrap();
            if event.kind == crate::store::EventKind::Delete {
                *deletes_per_revision
                    .entry(event.kv.mod_revision)
                    .or_default() += 1;
            }
        }
        assert!(deletes_per_revision.values().all(|n| *n <= DRAIN_BATCH));
        assert_eq!(
            deletes_per_revision.len(),
            clusters.len().div_ceil(DRAIN_BATCH)
        );

        pass(&a, &store, &keys).await;
        let member = store.get(&keys.member("a")).await.unwrap().into_single();
        assert_eq!(member.map(|kv| kv.lease), Some(a_lease));
    }

    #[tokio::test]
    async fn a_newer_replica_claims_what_the_preferred_older_one_cannot_read() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let old = replica(&store, &keys, "old", SCHEMA_VERSION).await;
        let new = replica(&store, &keys, "new", SCHEMA_VERSION + 1).await;
        let members = ["old", "new"];
        // Written by the newer build, with an operation it accepted.
        let newer = preferring("old", members, "newer");
        write_state(&store, &keys, &newer, SCHEMA_VERSION + 1, true).await;
        // Readable by both: stays with its preferred member.
        let shared = preferring("old", members, "shared");
        write_state(&store, &keys, &shared, SCHEMA_VERSION, true).await;

        pass(&old, &store, &keys).await;
        pass(&new, &store, &keys).await;

        let (old_lease, new_lease) = (old.live_lease(), new.live_lease());
        assert_eq!(owner_lease(&store, &keys, &newer).await, new_lease);
        assert_eq!(owner_lease(&store, &keys, &shared).await, old_lease);
        // Passes again change nothing: the two builds agree.
        pass(&new, &store, &keys).await;
        pass(&old, &store, &keys).await;
        assert_eq!(owner_lease(&store, &keys, &newer).await, new_lease);
        assert_eq!(owner_lease(&store, &keys, &shared).await, old_lease);
    }

    #[tokio::test]
    async fn an_unreadable_cluster_is_released_only_as_the_pass_saw_it() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let old = replica(&store, &keys, "old", SCHEMA_VERSION).await;
        let lease = old.live_lease().unwrap();
        let mut owned = HashMap::new();
        for cluster in ["created-since", "rewritten-since", "newer", "gone"] {
            let claim = old.try_claim(cluster, lease).await.unwrap().unwrap();
            owned.insert(cluster.to_string(), claim);
        }
        // The pass saw neither "created-since" (its view lags etcd, which
        // holds it busy) nor "gone"; it saw the other two in a newer schema,
        // and "rewritten-since" has changed since.
        write_state(&store, &keys, "created-since", SCHEMA_VERSION, true).await;
        let mut memo = StateMemo::new(SCHEMA_VERSION);
        memo.begin_pass(&[]);
        for cluster in ["rewritten-since", "newer"] {
            write_state(&store, &keys, cluster, SCHEMA_VERSION + 1, true).await;
            let kv = store.get(&keys.cluster_state(cluster)).await.unwrap();
            let state = CachedKey::new("state".into(), kv.into_single().unwrap());
            memo.note(cluster, &state, |_, _, _| false);
        }
        write_state(&store, &keys, "rewritten-since", SCHEMA_VERSION + 1, false).await;

        let mut pending = HashSet::new();
        old.release_unreadable(&mut owned, &memo, &mut pending)
            .await
            .unwrap();
        assert!(pending.contains("rewritten-since"), "looked at again");

        let mut kept: Vec<&str> = owned.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["created-since", "rewritten-since"]);
        for (cluster, owner) in [
            ("created-since", Some(lease)),
            ("rewritten-since", Some(lease)),
            ("newer", None),
            ("gone", None),
        ] {
            assert_eq!(
                owner_lease(&store, &keys, cluster).await,
                owner,
                "{cluster}"
            );
        }
    }
}
