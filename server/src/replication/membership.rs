//! Membership: one lease per replica incarnation, `members/<id>` bound to
//! it, renewed every TTL/3. Keep-alives that fail for longer than the belief
//! in the lease lasts (TTL minus the margin) make the session lapse: claims
//! are not used until etcd answers again. A lease etcd still has then goes
//! on with its claims; one it lost drops every claim at once, and the
//! replica rejoins with a new lease.

use super::*;
use crate::cluster::to_json;
use crate::store::{Op, StoreError, Txn};
use tokio::sync::watch;

const REJOIN_DELAY: Duration = Duration::from_millis(500);

/// Attempts at one keep-alive when attempts hang (see `keep_alive`).
const KEEPALIVE_ATTEMPTS: u32 = 3;

impl Ownership {
    /// Keeps this replica a member: joins (again) until `shutdown` turns
    /// true, and renews the lease it holds until it resigns, so that the
    /// running operations a shutdown waits for still own their clusters.
    pub async fn run_membership(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let renew_every = self.config.lease_ttl / 3;
        while !*shutdown.borrow() {
            let lease = match self.join().await {
                Ok(lease) => lease,
                Err(error) => {
                    tracing::warn!(%error, "cannot join as a member; retrying");
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(REJOIN_DELAY) => continue,
                    }
                }
            };
            if *shutdown.borrow() {
                // Joined as the shutdown resigned: leave again.
                self.resign().await;
                return;
            }
            loop {
                tokio::time::sleep(renew_every).await;
                // The replica went away without a shutdown (its server
                // failed to start): nothing is left to keep alive.
                if shutdown.has_changed().is_err() {
                    return;
                }
                if !self.renew(lease).await {
                    break;
                }
            }
        }
    }

    /// One renewal of `lease`; false once it is no longer this replica's
    /// session (resigned, or found expired), so that a new one is joined.
    async fn renew(&self, lease: LeaseId) -> bool {
        let current = |this: &Self| lock(&this.session).as_ref().map(|s| s.lease) == Some(lease);
        if !current(self) {
            return false;
        }
        if self.live_lease().is_none() && !self.lease_lives(lease).await {
            return false;
        }
        let sent = Instant::now();
        match self.keep_alive(lease).await {
            Ok(ttl) => {
                let ttl = Duration::from_secs(ttl as u64);
                self.renewed(lease, self.config.valid_until(sent, ttl));
            }
            Err(StoreError::LeaseNotFound(_)) => {
                self.metrics.keepalive_failures.inc();
                self.drop_session("the lease expired");
                return false;
            }
            Err(error) => {
                tracing::warn!(%error, "lease keep-alive failed");
                self.metrics.keepalive_failures.inc();
            }
        }
        current(self)
    }

    /// One keep-alive of `lease`, hedged: when an attempt has no answer
    /// after a third of the TTL, another is sent beside it (up to
    /// [`KEEPALIVE_ATTEMPTS`]), and the first answer wins. A member cut off
    /// from its peers holds a request until it learns it has no leader (an
    /// election timeout or more), longer than a short lease lasts; the next
    /// attempt most likely reaches another member. A slow etcd still
    /// answers the first. Keep-alives are idempotent: the attempts left
    /// over are dropped.
    async fn keep_alive(&self, lease: LeaseId) -> crate::store::Result<i64> {
        let hedge_after = self.config.lease_ttl / 3;
        let give_up = tokio::time::Instant::now() + self.config.lease_ttl;
        let mut attempts = tokio::task::JoinSet::new();
        let (mut sent, mut last_error) = (0, None);
        loop {
            if attempts.is_empty() {
                if sent == KEEPALIVE_ATTEMPTS {
                    let error = "every keep-alive failed".to_string();
                    return Err(last_error.unwrap_or(StoreError::Unavailable(error)));
                }
                self.send_keep_alive(&mut attempts, lease);
                sent += 1;
            }
            let hedge_at = match sent < KEEPALIVE_ATTEMPTS {
                true => (tokio::time::Instant::now() + hedge_after).min(give_up),
                false => give_up,
            };
            match tokio::time::timeout_at(hedge_at, attempts.join_next()).await {
                Ok(Some(Ok(Ok(ttl)))) => return Ok(ttl),
                Ok(Some(Ok(Err(error @ StoreError::LeaseNotFound(_))))) => return Err(error),
                Ok(Some(Ok(Err(error)))) => last_error = Some(error),
                Ok(Some(Err(join))) => last_error = Some(StoreError::Other(join.to_string())),
                Ok(None) => {}
                Err(_) if hedge_at >= give_up => {
                    let waited = self.config.lease_ttl;
                    let error = format!("no answer to {sent} keep-alives within {waited:?}");
                    return Err(StoreError::Unavailable(error));
                }
                Err(_) => {
                    tracing::warn!(after = ?hedge_after, "a lease keep-alive got no answer yet; sending another beside it");
                    self.send_keep_alive(&mut attempts, lease);
                    sent += 1;
                }
            }
        }
    }

    fn send_keep_alive(
        &self,
        attempts: &mut tokio::task::JoinSet<crate::store::Result<i64>>,
        lease: LeaseId,
    ) {
        let store = Arc::clone(&self.store);
        attempts.spawn(async move { store.keep_alive(lease).await });
    }

    /// After keep-alives failed for longer than the belief lasts: whether
    /// etcd still has the lease. Only a lease etcd reports gone ends the
    /// session (and the work running under it); while etcd does not answer
    /// the session stays lapsed, claiming nothing.
    async fn lease_lives(&self, lease: LeaseId) -> bool {
        match self.store.lease_time_to_live(lease).await {
            Ok(Some(_)) => true,
            Ok(None) => {
                self.drop_session("the lease expired while keep-alives failed");
                false
            }
            Err(error) => {
                tracing::warn!(%error, "cannot ask etcd whether the lease lives; retrying");
                true
            }
        }
    }

    /// Grants a lease and writes `members/<id>` bound to it.
    pub(super) async fn join(&self) -> crate::store::Result<LeaseId> {
        let sent = Instant::now();
        let ttl = self.config.lease_ttl.as_secs() as i64;
        // Before any claim of this session: claims made after an etcd
        // restore must use the new epoch base.
        let fence = super::restore::fence_at_join(self.store.as_ref(), &self.keys).await?;
        *lock(&self.fence) = fence;
        let lease = self.store.grant_lease(ttl).await?;
        // Claims nothing until its peers watch it (the ownership pass says
        // when); peers that cannot reach its admin port are not waited for.
        self.unwatched.store(
            super::liveness::reachable(&self.config.admin_address),
            std::sync::atomic::Ordering::SeqCst,
        );
        let member = self.member_record(lease);
        let key = self.keys.member(&self.config.replica_id);
        // Before the new member key exists: the first ownership pass that
        // sees this incarnation then finds the old owner keys gone.
        let previous = self.store.get(&key).await?.into_single();
        if let Some(previous) = previous.filter(|kv| kv.lease != 0 && kv.lease != lease) {
            self.revoke_previous_incarnation(previous.lease).await;
        }
        self.store
            .txn(Txn::new().and_then([Op::put_with_lease(&key, to_json(&member), lease)]))
            .await?;
        *lock(&self.session) = Some(Session {
            lease,
            valid_until: self.config.valid_until(sent, self.config.lease_ttl),
            joined: sent,
            lapsed: false,
        });
        // A pass that saw the member key before the session existed
        // claimed nothing, and no change of the members follows to wake
        // the loop again before its tick (TTL/3).
        self.pass_wanted.notify_one();
        tracing::info!(lease, ttl, "joined as a member");
        Ok(lease)
    }

    /// This replica's member record under `lease`, as it stands now
    /// (draining, providers it cannot reach).
    pub(super) fn member_record(&self, lease: LeaseId) -> MemberRecord {
        let reach = lock(&self.provider_reach).clone();
        MemberRecord {
            schema: self.schema,
            id: self.config.replica_id.clone(),
            address: self.config.address.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            lease,
            admin_address: self.config.admin_address.clone(),
            admin_tls: self.config.admin_tls.is_some(),
            draining: self.is_draining(),
            failing_providers: reach.failing,
            unreachable_providers: reach.unreachable,
            watches_peers: self.config.peer_liveness,
            unwatched: self.unwatched.load(std::sync::atomic::Ordering::SeqCst),
        }
    }

    /// Rewrites this replica's member record as [`Self::member_record`]
    /// says, only while it is still bound to the session's lease. False
    /// when it is not (no session, or the record is another lease's).
    pub(super) async fn rewrite_member_record(&self) -> crate::store::Result<bool> {
        let Some(lease) = self.live_lease() else {
            return Ok(false);
        };
        let key = self.keys.member(&self.config.replica_id);
        let member = self.member_record(lease);
        let txn = Txn::new()
            .when([Compare::lease(&key, CmpOp::Equal, lease)])
            .and_then([Op::put_with_lease(key, to_json(&member), lease)]);
        Ok(self.store.txn(txn).await?.succeeded)
    }

    /// Writes this replica's member key again under `lease`, while it is
    /// absent: a peer removed it, judging this replica crashed, while its
    /// lease lived (a lost lease rejoins instead).
    pub(super) async fn reregister(&self, lease: LeaseId) -> crate::store::Result<()> {
        let key = self.keys.member(&self.config.replica_id);
        let member = self.member_record(lease);
        let txn = Txn::new()
            .when([Compare::absent(&key)])
            .and_then([Op::put_with_lease(&key, to_json(&member), lease)]);
        if self.store.txn(txn).await?.succeeded {
            tracing::warn!(
                lease,
                "a peer removed this replica's member key, judging it crashed: written again"
            );
        }
        Ok(())
    }

    /// Revokes the lease `members/<this id>` was bound to before this join:
    /// a previous incarnation of this replica (it crashed and was
    /// restarted), whose owner keys would otherwise hold its clusters for a
    /// whole TTL. Revoking early is safe because every owner write and
    /// provider call is fenced: whoever claims a cluster next fences the
    /// provider with a newer epoch before it acts.
    ///
    /// Two live replicas must never share an id: the second would revoke
    /// the first's lease here (which rejoins, and revokes in turn).
    async fn revoke_previous_incarnation(&self, previous: LeaseId) {
        match self.store.revoke_lease(previous).await {
            Ok(()) => {
                self.metrics.previous_incarnations_revoked.inc();
                tracing::warn!(
                    previous_lease = previous,
                    "revoked the lease of this replica's previous incarnation: its clusters are taken over now, not after its TTL (two live replicas must never share a replica id)"
                );
            }
            // Expired meanwhile: nothing held any more.
            Err(StoreError::LeaseNotFound(_)) => {}
            Err(error) => {
                tracing::warn!(%error, previous_lease = previous, "cannot revoke the previous incarnation's lease; its clusters wait for its TTL");
            }
        }
    }

    /// Stops acting as a member: drops the session and every claim, and
    /// keeps the lease, which runs out after the TTL. For a shutdown with
    /// provider calls still in flight: they were sent with deadlines up to
    /// the end of this lease period, and a revoke would let a peer fence and
    /// fail their operations while the calls can still land.
    pub fn leave(&self) {
        self.take_session();
    }

    fn take_session(&self) -> Option<Session> {
        let session = lock(&self.session).take();
        lock(&self.owned).clear();
        self.metrics.clusters_owned.set(0);
        session
    }

    /// Leaves at once: drops every claim and revokes the lease, which
    /// deletes this replica's member and owner keys so peers take over now
    /// instead of after the TTL.
    pub async fn resign(&self) {
        if let Some(session) = self.take_session() {
            // An unreachable etcd must not hold the shutdown for longer than
            // the lease would live anyway.
            let revoke = self.store.revoke_lease(session.lease);
            match tokio::time::timeout(self.config.lease_ttl, revoke).await {
                Ok(Ok(())) => {
                    tracing::info!(lease = session.lease, "lease revoked: clusters handed off")
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, "lease revoke failed; peers take over after the TTL")
                }
                Err(_) => tracing::warn!(
                    "no answer to the lease revoke within the TTL; peers take over after it"
                ),
            }
        }
    }

    /// Removes `replica`'s member key while it is still bound to `lease`
    /// (a newer incarnation's is never touched); whether it did.
    pub(super) async fn remove_member(
        &self,
        replica: &str,
        lease: LeaseId,
    ) -> crate::store::Result<bool> {
        let key = self.keys.member(replica);
        let depose = Txn::new()
            .when([Compare::lease(&key, CmpOp::Equal, lease)])
            .and_then([Op::delete(&key)]);
        Ok(self.store.txn(depose).await?.succeeded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{GetResult, MemoryStore, RangeRequest, Store, TxnResult, WatchStream};
    use std::sync::atomic::Ordering;

    /// A memory store whose keep-alive replies are lost while `lose` is set:
    /// the renewal reaches the store (`renew` set) or not, and the replica
    /// hears "unavailable" either way.
    struct LossyStore {
        inner: MemoryStore,
        lose: AtomicBool,
        renew: AtomicBool,
        /// Each keep-alive takes this long (milliseconds) to arrive.
        slow_ms: std::sync::atomic::AtomicU64,
        /// The next keep-alive never arrives nor answers.
        hang_next: AtomicBool,
        /// Each transaction's reply comes this long (milliseconds) after
        /// it was applied.
        slow_txn_ms: std::sync::atomic::AtomicU64,
    }

    #[async_trait::async_trait]
    impl Store for LossyStore {
        async fn get(&self, key: &str) -> crate::store::Result<GetResult> {
            self.inner.get(key).await
        }
        async fn range(&self, request: RangeRequest) -> crate::store::Result<GetResult> {
            self.inner.range(request).await
        }
        async fn txn(&self, txn: Txn) -> crate::store::Result<TxnResult> {
            let applied = self.inner.txn(txn).await;
            let slow = self.slow_txn_ms.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(slow)).await;
            applied
        }
        async fn grant_lease(&self, ttl_seconds: i64) -> crate::store::Result<LeaseId> {
            self.inner.grant_lease(ttl_seconds).await
        }
        async fn keep_alive(&self, lease: LeaseId) -> crate::store::Result<i64> {
            if self.hang_next.swap(false, Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let slow = self.slow_ms.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(slow)).await;
            if !self.lose.load(Ordering::SeqCst) {
                return self.inner.keep_alive(lease).await;
            }
            if self.renew.load(Ordering::SeqCst) {
                let _ = self.inner.keep_alive(lease).await;
            }
            Err(StoreError::Unavailable("reply lost by the test".into()))
        }
        async fn revoke_lease(&self, lease: LeaseId) -> crate::store::Result<()> {
            self.inner.revoke_lease(lease).await
        }
        async fn lease_time_to_live(&self, lease: LeaseId) -> crate::store::Result<Option<i64>> {
            self.inner.lease_time_to_live(lease).await
        }
        async fn watch(&self, prefix: &str, from: i64) -> crate::store::Result<WatchStream> {
            self.inner.watch(prefix, from).await
        }
        async fn compact(&self, revision: i64) -> crate::store::Result<()> {
            self.inner.compact(revision).await
        }
    }

    const TTL: Duration = Duration::from_secs(2);

    /// A member of `store` (renewing its lease) that owns cluster `c`.
    async fn member(store: Arc<LossyStore>) -> (Arc<Ownership>, Claim, watch::Sender<bool>) {
        let keys = KeyLayout::new("/t/");
        let config = OwnershipConfig {
            replica_id: "r1".into(),
            address: "127.0.0.1:1".into(),
            admin_address: String::new(),
            admin_tls: None,
            lease_ttl: TTL,
            lease_margin: Duration::from_millis(400),
            peer_liveness: false,
        };
        let (replication, _) = Ownership::new(store, keys, config, Metrics::new());
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(Arc::clone(&replication).run_membership(stopped));
        let lease = wait_for(|| replication.session_lease(), "a lease").await;
        // What an ownership pass would have published.
        let claim = Claim::new(lease, 0, 7);
        lock(&replication.owned).insert("c".into(), claim);
        (replication, claim, stop)
    }

    async fn wait_for<T>(mut found: impl FnMut() -> Option<T>, what: &str) -> T {
        let deadline = Instant::now() + 4 * TTL;
        loop {
            if let Some(value) = found() {
                return value;
            }
            assert!(Instant::now() < deadline, "no {what} within {:?}", 4 * TTL);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn lossy(renew: bool) -> Arc<LossyStore> {
        Arc::new(LossyStore {
            inner: MemoryStore::new(),
            lose: AtomicBool::new(false),
            renew: AtomicBool::new(renew),
            slow_ms: std::sync::atomic::AtomicU64::new(0),
            hang_next: AtomicBool::new(false),
            slow_txn_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Keep-alive replies lost for longer than the TTL while the renewals
    /// themselves arrive: once etcd answers again the lease still lives, and
    /// the session goes on with its claims (it used to be given up, and its
    /// running operations failed, for a new lease).
    #[tokio::test]
    async fn a_lapsed_session_whose_lease_lives_goes_on() {
        let store = lossy(true);
        let (replication, claim, _stop) = member(Arc::clone(&store)).await;
        store.lose.store(true, Ordering::SeqCst);
        let lapsed = Instant::now();
        wait_for(|| replication.claim("c").is_none().then_some(()), "lapse").await;
        // Keep-alives have failed for longer than the TTL.
        tokio::time::sleep(TTL.saturating_sub(lapsed.elapsed()) + TTL / 4).await;
        assert_eq!(replication.claim("c"), None, "no claim while lapsed");
        store.lose.store(false, Ordering::SeqCst);
        let back = wait_for(|| replication.claim("c"), "claim after the lapse").await;
        assert_eq!(back, claim);
        assert_eq!(replication.session_lease(), Some(claim.lease));
        assert_eq!(replication.metrics.leases_lost.get(), 0);
    }

    /// Keep-alives slower than a third of the TTL (etcd far away, or slow)
    /// still renew the lease: an attempt is never abandoned for a slow
    /// answer, only joined by another.
    #[tokio::test]
    async fn slow_keep_alives_keep_the_lease() {
        let store = lossy(true);
        let (replication, claim, _stop) = member(Arc::clone(&store)).await;
        let slow = TTL / 3 + Duration::from_millis(200);
        store
            .slow_ms
            .store(slow.as_millis() as u64, Ordering::SeqCst);
        tokio::time::sleep(3 * TTL).await;
        assert_eq!(replication.session_lease(), Some(claim.lease));
        let lives = store.inner.lease_time_to_live(claim.lease).await.unwrap();
        assert!(lives.is_some(), "the lease expired");
    }

    /// A keep-alive that hangs (sent to a member cut off from its peers) is
    /// joined by another, which renews the lease in time: the claim is
    /// never given up.
    #[tokio::test]
    async fn a_hanging_keep_alive_is_hedged_within_the_ttl() {
        let store = lossy(true);
        let (replication, claim, _stop) = member(Arc::clone(&store)).await;
        store.hang_next.store(true, Ordering::SeqCst);
        let until = Instant::now() + 2 * TTL;
        while Instant::now() < until {
            assert_eq!(replication.claim("c"), Some(claim), "the claim lapsed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !store.hang_next.load(Ordering::SeqCst),
            "no keep-alive hung"
        );
    }

    /// A lapse in which the lease did expire ends the session: its claims
    /// are gone and a new lease is joined.
    #[tokio::test]
    async fn a_lapsed_session_whose_lease_expired_rejoins() {
        let store = lossy(false);
        let (replication, claim, _stop) = member(Arc::clone(&store)).await;
        store.lose.store(true, Ordering::SeqCst);
        let expired = || async {
            let lives = store.inner.lease_time_to_live(claim.lease).await.unwrap();
            lives.is_none()
        };
        let deadline = Instant::now() + 4 * TTL;
        while !expired().await {
            assert!(Instant::now() < deadline, "the lease never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        store.lose.store(false, Ordering::SeqCst);
        let lease = wait_for(
            || replication.session_lease().filter(|l| *l != claim.lease),
            "a new lease",
        )
        .await;
        assert_ne!(lease, claim.lease);
        assert_eq!(replication.claim("c"), None);
        assert!(replication.owned_clusters().is_empty());
        assert_eq!(replication.metrics.leases_lost.get(), 1);
    }

    /// A provider call made while the session has lapsed waits for the
    /// verdict, and goes ahead when the lease lives.
    #[tokio::test]
    async fn a_claim_deadline_waits_out_a_lapse() {
        let store = lossy(true);
        let (replication, claim, _stop) = member(Arc::clone(&store)).await;
        let deadline = replication.claim_deadline("c", claim).await.unwrap();
        assert!(deadline <= Instant::now() + TTL - Duration::from_millis(400));
        store.lose.store(true, Ordering::SeqCst);
        wait_for(|| replication.claim("c").is_none().then_some(()), "lapse").await;
        let waiting = {
            let replication = Arc::clone(&replication);
            tokio::spawn(async move { replication.claim_deadline("c", claim).await })
        };
        tokio::time::sleep(TTL / 4).await;
        store.lose.store(false, Ordering::SeqCst);
        let after = waiting
            .await
            .unwrap()
            .expect("the claim held through the lapse");
        assert!(after > Instant::now(), "a deadline ahead");
        let other = Claim::new(claim.lease, 0, 8);
        assert_eq!(replication.claim_deadline("c", other).await, None);
    }

    /// An ownership pass that runs while the join's member write is still
    /// unanswered (the key is there, the session not yet) claims nothing;
    /// the session's start must bring another pass, or the replica claims
    /// nothing until the next TTL/3 tick: a restarted replica with a 60 s
    /// TTL sat 20 s without its clusters.
    #[tokio::test]
    async fn a_pass_that_ran_before_the_join_ended_is_followed_by_one_after() {
        let store = lossy(true);
        store.slow_txn_ms.store(300, Ordering::SeqCst);
        let keys = KeyLayout::new("/t/");
        let state = crate::cluster::StateRecord {
            schema: crate::cluster::SCHEMA_VERSION,
            uid: "uid-c".into(),
            state: crate::cluster::ClusterState::Running,
            operation: None,
            changed_at: "2026-12-07T00:00:00Z".into(),
        };
        let put = Op::put(keys.cluster_state("c"), to_json(&state));
        store.txn(Txn::new().and_then([put])).await.unwrap();
        let config = OwnershipConfig {
            replica_id: "r1".into(),
            address: "127.0.0.1:1".into(),
            admin_address: String::new(),
            admin_tls: None,
            lease_ttl: Duration::from_secs(60),
            lease_margin: Duration::from_secs(6),
            peer_liveness: false,
        };
        let shared: crate::store::SharedStore = store.clone();
        let metrics = Metrics::new();
        let (replication, _) = Ownership::new(shared.clone(), keys.clone(), config, metrics);
        let cache = crate::cluster::ClusterCache::new(shared, keys, Metrics::new());
        let (_stop, stopped) = watch::channel(false);
        tokio::spawn(Arc::clone(&cache).run(stopped.clone()));
        tokio::spawn(Arc::clone(&replication).run_ownership(cache, stopped.clone()));
        tokio::spawn(Arc::clone(&replication).run_membership(stopped));
        wait_for(|| replication.claim("c"), "claim of c").await;
    }
}
