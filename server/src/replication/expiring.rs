//! Expiring leases: a peer whose lease is about to run out (etcd has had
//! no renewal of it for the TTL less this replica's margin) is deposed
//! before etcd revokes it. etcd revokes an expired lease in one apply that
//! deletes every key bound to it: at 100,000 clusters a third of them, a
//! pause of about 190 ms for every etcd request. Deposed first, the
//! survivors drain its owner keys in batches and claim its clusters, as
//! after a crash that liveness saw ([`super::liveness`]); what is left for
//! the expiry, if anything, is what they did not reach in the margin.
//!
//! This covers what liveness leaves to the TTL: a peer partitioned from
//! etcd, paused (SIGSTOP), or whose host went without closing a connection
//! (a power loss), and every crash with `--peer-liveness off`.
//!
//! # Guarantees
//! - A peer is deposed only when etcd counts its lease as running out
//!   within the margin: its own belief in that lease (renewal sent + TTL -
//!   margin, see [`super::OwnershipConfig`]) has ended by then, since etcd
//!   received that renewal after it was sent. So the depose takes nothing
//!   from a replica that still acts as an owner by its own account.
//! - Nothing is deposed while this replica's own lease looks as close to
//!   its end, or while its own session is lapsed: a slow etcd leader
//!   delays every renewal alike, and then nobody is singled out.
//! - The depose is the one crash detection makes (the member key removed,
//!   comparing its lease); the model's depose may happen at any step, so
//!   this trigger changes no step of the protocol.
//!
//! # Assumptions
//! - etcd's LeaseTimeToLive answers whole seconds, rounded down: a peer is
//!   deposed at an answer of at most the margin's whole seconds less one.
//!
//! # Caveats
//! - With a margin under a second (a TTL under 5 s at the default 20 %),
//!   no answer is small enough: such leases are left to their expiry.
//! - Drained at the rate of a takeover (about 33,000 keys in 1-2 s here),
//!   the keys of a peer that held many more than the margin allows are
//!   partly deleted by the expiry all the same.

use super::*;
use crate::cluster::from_json;
use crate::store::RangeRequest;
use tokio::sync::watch;

/// How soon a lease near the threshold is asked about again, and the
/// pause after a failed look.
const POLL_FLOOR: Duration = Duration::from_millis(250);

/// The largest LeaseTimeToLive answer (whole seconds, rounded down) that
/// proves less than `margin` left; `None` when no answer does.
fn expiry_threshold(margin: Duration) -> Option<i64> {
    (margin.as_secs() as i64).checked_sub(1).filter(|t| *t >= 0)
}

/// How long until a lease `left` seconds (rounded down) from its end can
/// first be within `threshold`.
fn until_within(left: i64, threshold: i64) -> Duration {
    let seconds = (left - threshold - 1).max(0) as u64;
    Duration::from_secs(seconds).max(POLL_FLOOR)
}

impl Ownership {
    /// Deposes every peer whose lease is about to run out, until
    /// `shutdown` turns true.
    pub async fn run_expiring_leases(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let Some(threshold) = expiry_threshold(self.config.lease_margin) else {
            tracing::debug!(margin = ?self.config.lease_margin, "lease margin under a second: expiring peers are left to etcd");
            return;
        };
        while !*shutdown.borrow() {
            let wait = match self.depose_expiring(threshold).await {
                Ok(wait) => wait,
                Err(error) => {
                    tracing::debug!(%error, "cannot look at the peers' leases");
                    POLL_FLOOR
                }
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(wait) => {},
            }
        }
    }

    /// Looks at every peer's lease once and deposes those within
    /// `threshold` of their end; how long until the next look is due.
    async fn depose_expiring(&self, threshold: i64) -> crate::store::Result<Duration> {
        let Some(own) = self.live_lease() else {
            return Ok(POLL_FLOOR);
        };
        match self.store.lease_time_to_live(own).await? {
            Some(left) if left > threshold + 1 => {}
            // This replica's own renewals are as late: etcd is slow for all.
            _ => return Ok(POLL_FLOOR),
        }
        let mut next = self.config.lease_ttl;
        for (replica, lease) in self.peer_leases(own).await? {
            match self.store.lease_time_to_live(lease).await? {
                // Gone: whatever it held went with it.
                None => {}
                Some(left) if left <= threshold => self.depose_expiring_peer(&replica, lease).await,
                Some(left) => next = next.min(until_within(left, threshold)),
            }
        }
        Ok(next)
    }

    /// Every member key but this replica's: its replica id and lease.
    async fn peer_leases(&self, own: LeaseId) -> crate::store::Result<Vec<(String, LeaseId)>> {
        let members = self
            .store
            .range(RangeRequest::prefix(self.keys.members()))
            .await?;
        Ok(members
            .kvs
            .iter()
            .filter(|kv| kv.lease != 0 && kv.lease != own)
            .filter_map(|kv| Some((from_json::<MemberRecord>(kv).ok()?.id, kv.lease)))
            .filter(|(id, _)| *id != self.config.replica_id)
            .collect())
    }

    async fn depose_expiring_peer(&self, replica: &str, lease: LeaseId) {
        match self.remove_member(replica, lease).await {
            Ok(true) => {
                self.metrics.peer_expiring_deposed.inc();
                tracing::warn!(peer = replica, lease, "peer's lease about to expire unrenewed: removed its member key, its owner keys are drained in batches before etcd revokes the lease");
            }
            // Another peer deposed it first, or it rejoined.
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(%error, peer = replica, lease, "cannot remove the member key of a peer whose lease is about to expire; etcd revokes it");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, SharedStore};

    /// A member `id` of `store` whose lease was granted for `ttl_seconds`
    /// (and is not renewed), with a margin of 2 s.
    async fn member(store: &SharedStore, id: &str, ttl_seconds: u64) -> Arc<Ownership> {
        let config = OwnershipConfig {
            replica_id: id.into(),
            address: "127.0.0.1:1".into(),
            admin_address: String::new(),
            admin_tls: None,
            lease_ttl: Duration::from_secs(ttl_seconds),
            lease_margin: Duration::from_secs(2),
            peer_liveness: false,
        };
        let keys = KeyLayout::new("/t/");
        let (ownership, _) = Ownership::new(store.clone(), keys, config, Metrics::new());
        ownership.join().await.unwrap();
        ownership
    }

    async fn is_member(store: &SharedStore, id: &str) -> bool {
        let key = format!("/t/members/{id}");
        !store.get(&key).await.unwrap().kvs.is_empty()
    }

    /// A peer whose lease has under 2 s left (etcd's answer: 1) is deposed
    /// by a replica whose own lease has 10; not by one whose own lease
    /// looks as near its end (2 s left of 3, still believed).
    #[tokio::test]
    async fn a_peer_near_its_leases_end_is_deposed_unless_this_replicas_is_as_near() {
        let threshold = expiry_threshold(Duration::from_secs(2)).unwrap();
        let store: SharedStore = Arc::new(MemoryStore::new());
        let watcher = member(&store, "r1", 10).await;
        member(&store, "r2", 2).await;
        let wait = watcher.depose_expiring(threshold).await.unwrap();
        assert_eq!(watcher.metrics.peer_expiring_deposed.get(), 1);
        assert!(!is_member(&store, "r2").await, "r2 deposed");
        assert!(is_member(&store, "r1").await);
        assert_eq!(wait, watcher.config.lease_ttl, "no peer left to look at");

        let store: SharedStore = Arc::new(MemoryStore::new());
        let watcher = member(&store, "r1", 3).await;
        assert!(watcher.live_lease().is_some(), "its session still believed");
        member(&store, "r2", 2).await;
        let wait = watcher.depose_expiring(threshold).await.unwrap();
        assert_eq!(wait, POLL_FLOOR);
        assert_eq!(watcher.metrics.peer_expiring_deposed.get(), 0);
        assert!(is_member(&store, "r2").await, "nobody singled out");
    }

    #[test]
    fn only_an_answer_that_proves_less_than_the_margin_left_deposes() {
        assert_eq!(expiry_threshold(Duration::from_millis(400)), None);
        assert_eq!(expiry_threshold(Duration::from_millis(1999)), Some(0));
        assert_eq!(expiry_threshold(Duration::from_secs(2)), Some(1));
        assert_eq!(expiry_threshold(Duration::from_secs(6)), Some(5));
    }

    #[test]
    fn a_lease_is_asked_about_again_when_it_could_first_be_within_the_threshold() {
        // 9 s left (at least), threshold 1 (under 2 s): not before 7 s.
        assert_eq!(until_within(9, 1), Duration::from_secs(7));
        assert_eq!(until_within(2, 1), POLL_FLOOR);
        assert_eq!(until_within(1, 1), POLL_FLOOR);
    }
}
