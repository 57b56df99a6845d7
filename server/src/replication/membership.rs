//! Membership: one lease per replica incarnation, `members/<id>` bound to
//! it, renewed every TTL/3. Keep-alives that fail for longer than the belief
//! in the lease lasts (TTL minus the margin) make the session lapse: claims
//! are not used until etcd answers again. A lease etcd still has then goes
//! on with its claims; one it lost drops every claim at once, and the
//! replica rejoins with a new lease.

use super::*;
use crate::cluster::{to_json, SCHEMA_VERSION};
use crate::store::{Op, StoreError, Txn};
use tokio::sync::watch;

const REJOIN_DELAY: Duration = Duration::from_millis(500);

impl Replication {
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
        match self.store.keep_alive(lease).await {
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
        let lease = self.store.grant_lease(ttl).await?;
        let member = MemberRecord {
            schema: SCHEMA_VERSION,
            id: self.config.replica_id.clone(),
            address: self.config.address.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            lease,
            draining: false,
        };
        let key = self.keys.member(&self.config.replica_id);
        self.store
            .txn(Txn::new().and_then([Op::put_with_lease(key, to_json(&member), lease)]))
            .await?;
        *lock(&self.session) = Some(Session {
            lease,
            valid_until: self.config.valid_until(sent, self.config.lease_ttl),
            lapsed: false,
        });
        tracing::info!(lease, ttl, "joined as a member");
        Ok(lease)
    }

    /// Leaves at once: drops every claim and revokes the lease, which
    /// deletes this replica's member and owner keys so peers take over now
    /// instead of after the TTL.
    pub async fn resign(&self) {
        let session = lock(&self.session).take();
        lock(&self.owned).clear();
        self.metrics.clusters_owned.set(0);
        if let Some(session) = session {
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
}
