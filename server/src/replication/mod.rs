//! Replication: membership (one lease per replica), per-cluster ownership
//! (owner keys bound to that lease, spread by rendezvous hashing) and the
//! fencing every owner write and provider call carries.
//!
//! # Guarantees
//! - [`Ownership::claim`] returns a cluster's claim only while this
//!   replica's lease is believed alive: up to the TTL minus a safety margin
//!   after the last renewal that succeeded was sent. Past that the session
//!   has lapsed: no claim is returned until etcd answers again. If the lease
//!   still lives then (LeaseTimeToLive), the session and its claims go on;
//!   if it is gone, every claim is dropped before a new lease is granted.
//! - A provider call made under a claim carries a gRPC deadline no later
//!   than the end of that belief ([`Ownership::claim_deadline`]), so a
//!   call cannot land after the lease could have expired and a peer taken
//!   over.
//! - Every owner write compares the owner key's lease and create revision
//!   ([`Claim::fence`]), so a replica that lost ownership while paused can
//!   change nothing; its provider calls carry an older epoch than the new
//!   owner's and the provider refuses them.
//!
//! # Assumptions
//! - Every replica runs the same rendezvous hash over the same member list.
//!
//! # Caveats
//! - A lease TTL is a minimum: after an etcd leader change, failover can
//!   take up to twice the TTL.
//! - A provider call that needs longer than the TTL minus the margin (less
//!   the time since the last renewal) cannot succeed: the provider must
//!   answer within it.
//! - etcd releases with the early lease revoke under a slow leader (see
//!   PRODUCTION.md) may end a lease before its TTL; the margin does not
//!   cover an arbitrarily slow leader.

mod expiring;
mod gray_failure;
mod handoff;
/// For tests across the crate: a replica that owns the named clusters.
#[cfg(test)]
pub(crate) use handoff::tests::owner_of;
mod liveness;
mod membership;
mod owners_view;
mod ownership;
pub mod rendezvous;
mod restore;
mod state_memo;

pub use liveness::{live_twin, LivenessLine, Watcher, WATCHER_HEADER};
pub use rendezvous::preferred;
pub use restore::fencing_epoch;

use crate::cluster::SCHEMA_VERSION;
use crate::keys::KeyLayout;
use crate::metrics::Metrics;
use crate::store::{CmpOp, Compare, LeaseId, SharedStore};
use crate::sync::lock;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// `members/<id>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberRecord {
    pub schema: u32,
    pub id: String,
    /// gRPC address the replica serves.
    pub address: String,
    /// Drover version it runs.
    pub version: String,
    pub lease: LeaseId,
    /// The admin HTTP address (HTTPS with `admin_tls`) where peers hold a
    /// liveness connection (`/liveness`); empty from members of older
    /// builds, which peers then leave to the TTL.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub admin_address: String,
    /// Its admin port speaks TLS (`--tls-cert`): peers reach `/liveness`
    /// there over TLS, presenting their own certificate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_tls: bool,
    /// Shutting down: it finishes the operations it runs and hands every
    /// other cluster over; peers prefer it for none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// Providers its last probe did not reach (see `gray_failure`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing_providers: Vec<String>,
    /// Providers it has not reached for longer than its
    /// `--provider-handover-after`: while another member reaches every
    /// provider, peers prefer it for no cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable_providers: Vec<String>,
    /// It holds a liveness connection to every peer (`--peer-liveness`):
    /// a new member claims nothing until every such peer holds one to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watches_peers: bool,
    /// Joined, and not every peer that watches holds a liveness connection
    /// to it yet (for at most a TTL): it claims nothing and peers prefer it
    /// for nothing, keeping its share meanwhile, so that a crash in its
    /// first moments costs no TTL and no cluster is left without an owner.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unwatched: bool,
}

/// The providers a replica's last probe did not reach, and those it has
/// not reached for longer than its `--provider-handover-after`, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderReach {
    pub failing: Vec<String>,
    pub unreachable: Vec<String>,
}

/// `owners/<cluster>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnerRecord {
    pub schema: u32,
    pub replica: String,
    pub lease: LeaseId,
    /// The epoch base the owner claimed under (see [`fencing_epoch`]): 0
    /// until etcd was first restored from a snapshot.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch_base: i64,
    /// The old scheme's generation (a base of `generation << 40`), read
    /// from records written before the base existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl OwnerRecord {
    /// The epoch base the owner claimed under.
    pub fn base(&self) -> i64 {
        restore::epoch_base(self.epoch_base, self.generation)
    }

    /// The fencing epoch of this record's owner key, created at
    /// `create_revision`.
    pub fn epoch(&self, create_revision: i64) -> i64 {
        fencing_epoch(self.base(), create_revision)
    }
}

/// This replica's ownership of one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub lease: LeaseId,
    /// The owner key's create revision plus the epoch base it was claimed
    /// under ([`fencing_epoch`]): grows with every new owner, across etcd
    /// restores too.
    pub epoch: i64,
    /// The owner key's create revision, which the fence compares.
    pub revision: i64,
}

impl Claim {
    /// The claim of an owner key created at `revision` under epoch base
    /// `base`.
    pub fn new(lease: LeaseId, base: i64, revision: i64) -> Self {
        Self {
            lease,
            epoch: fencing_epoch(base, revision),
            revision,
        }
    }

    /// The compares that make a write apply only while this claim holds.
    pub fn fence(&self, keys: &KeyLayout, cluster: &str) -> [Compare; 2] {
        self.fence_key(keys.owner(cluster))
    }

    /// The compares that make a write apply only while `owner` (an owner
    /// key of any kind: a cluster's, a rollout's) is this claim's.
    pub fn fence_key(&self, owner: String) -> [Compare; 2] {
        [
            Compare::lease(&owner, CmpOp::Equal, self.lease),
            Compare::create_revision(owner, CmpOp::Equal, self.revision),
        ]
    }
}

#[derive(Debug, Clone, Copy)]
struct Session {
    lease: LeaseId,
    /// Past this instant the lease may have expired: stop acting as owner
    /// until a renewal succeeds again.
    valid_until: Instant,
    /// The belief ran out and was not renewed yet (logged once).
    lapsed: bool,
    /// When it was joined.
    joined: Instant,
}

/// How often a provider call waiting out a lapsed session looks again.
const SETTLE_POLL: Duration = Duration::from_millis(50);

/// Settings of the replication layer.
#[derive(Debug, Clone)]
pub struct OwnershipConfig {
    pub replica_id: String,
    pub address: String,
    /// Where the admin port listens, written to the member record for the
    /// peers' liveness connections (empty: none).
    pub admin_address: String,
    /// `Some`: the admin port speaks TLS (said in the member record), and
    /// this is how this replica reaches its peers' over TLS (its
    /// certificate as the client's).
    pub admin_tls: Option<Arc<rustls::ClientConfig>>,
    pub lease_ttl: Duration,
    /// How long before the TTL runs out this replica stops believing in its
    /// lease (less than a third of the TTL leaves time for renewals).
    pub lease_margin: Duration,
    /// This replica holds liveness connections to its peers (said in its
    /// member record, so that new members wait for them).
    pub peer_liveness: bool,
}

impl OwnershipConfig {
    /// How long a renewal sent at `sent` makes this replica an owner.
    fn valid_until(&self, sent: Instant, ttl: Duration) -> Instant {
        sent + ttl.saturating_sub(self.lease_margin)
    }
}

/// This replica's side of replication: its membership session and the
/// clusters it owns (mostly the latter, hence the name), with the claims
/// and fences every owner write and provider call carries; shared by the
/// executor, the task scheduler, the scanner and the API.
pub struct Ownership {
    store: SharedStore,
    keys: KeyLayout,
    config: OwnershipConfig,
    session: Mutex<Option<Session>>,
    owned: Mutex<HashMap<String, Claim>>,
    /// Work in flight per cluster outside the operation slot (task runs):
    /// such a cluster is not handed over while it lasts.
    held: Mutex<HashMap<String, usize>>,
    adopted: mpsc::UnboundedSender<String>,
    metrics: Arc<Metrics>,
    /// The revision of this replica's newest owner-key write (a claim or a
    /// release).
    owner_writes: AtomicI64,
    /// The fence record this replica claims under, read (and set anew
    /// after an etcd restore) when it joins, read again when a claim fails
    /// on it (see `restore`).
    fence: Mutex<restore::FenceView>,
    /// Shutting down: see [`Ownership::begin_draining`].
    draining: AtomicBool,
    /// Peers this replica holds a liveness connection to, or held one to
    /// in their watch's lifetime (it saw them answer).
    liveness_seen: std::sync::atomic::AtomicUsize,
    /// Open liveness connections peers hold to this replica, by peer id.
    watched_by: Mutex<HashMap<String, usize>>,
    /// Wakes the ownership loop: a peer opened or closed a liveness
    /// connection to this replica, or a session began (a pass that ran
    /// before it claimed nothing).
    pass_wanted: tokio::sync::Notify,
    /// This session is not watched by every peer yet (see
    /// [`MemberRecord::unwatched`]).
    unwatched: AtomicBool,
    /// What this replica's member record says of the providers it cannot
    /// reach (see `gray_failure`).
    provider_reach: Mutex<ProviderReach>,
    /// The newest record schema this replica understands: clusters with
    /// newer records are left to replicas that do.
    schema: u32,
    /// How many owner keys each lease holds, as the ownership loop's view
    /// showed them at its last pass: a peer that deposed a crashed member
    /// revokes its lease once the survivors drained its keys.
    owner_keys: tokio::sync::watch::Sender<HashMap<LeaseId, usize>>,
    /// Every cluster's owner, as the ownership loop's view last saw it.
    owner_map: Arc<owners_view::OwnerMap>,
}

impl Ownership {
    /// The replication layer and the stream of clusters it adopts (for the
    /// executor to look at).
    pub fn new(
        store: SharedStore,
        keys: KeyLayout,
        config: OwnershipConfig,
        metrics: Arc<Metrics>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<String>) {
        Self::understanding(store, keys, config, metrics, SCHEMA_VERSION)
    }

    /// [`Self::new`] for a replica that understands records up to `schema`:
    /// tests stand in a newer build with it.
    fn understanding(
        store: SharedStore,
        keys: KeyLayout,
        config: OwnershipConfig,
        metrics: Arc<Metrics>,
        schema: u32,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<String>) {
        let (adopted, adoptions) = mpsc::unbounded_channel();
        let replication = Arc::new(Self {
            store,
            keys,
            config,
            session: Mutex::new(None),
            owned: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            adopted,
            metrics,
            owner_writes: AtomicI64::new(0),
            fence: Mutex::new(restore::FenceView::default()),
            draining: AtomicBool::new(false),
            liveness_seen: std::sync::atomic::AtomicUsize::new(0),
            watched_by: Mutex::new(HashMap::new()),
            pass_wanted: tokio::sync::Notify::new(),
            unwatched: AtomicBool::new(false),
            provider_reach: Mutex::new(ProviderReach::default()),
            schema,
            owner_keys: tokio::sync::watch::channel(HashMap::new()).0,
            owner_map: Arc::default(),
        });
        (replication, adoptions)
    }

    pub fn replica_id(&self) -> &str {
        &self.config.replica_id
    }

    /// The lease of this replica's membership session, lapsed or not; none
    /// between sessions.
    pub fn session_lease(&self) -> Option<LeaseId> {
        lock(&self.session).as_ref().map(|s| s.lease)
    }

    /// This replica's claim on `cluster`, if it owns it and its lease is
    /// believed alive.
    pub fn claim(&self, cluster: &str) -> Option<Claim> {
        self.live_lease()?;
        lock(&self.owned).get(cluster).copied()
    }

    /// Another replica's claim on `cluster` and that replica's id, as this
    /// replica's view of the owner keys last showed them (possibly stale:
    /// a write fenced on it compares the owner key). `None` when this
    /// replica has no session, or the view shows no owner or this replica.
    pub fn claim_of_owner(&self, cluster: &str) -> Option<(String, Claim)> {
        self.live_lease()?;
        let (replica, claim) = self.owner_map.claim_of(cluster)?;
        (replica != self.config.replica_id).then_some((replica, claim))
    }

    /// The deadline for a provider call under `claim` (when this replica's
    /// belief in its lease ends), or `None` once `claim` no longer holds. A
    /// lapsed session is waited out for up to a TTL first: if etcd confirms
    /// the lease, the call goes ahead rather than failing work nobody took.
    pub async fn claim_deadline(&self, cluster: &str, claim: Claim) -> Option<Instant> {
        let give_up = Instant::now() + self.config.lease_ttl;
        loop {
            let session = (*lock(&self.session))?;
            if self.claim(cluster) == Some(claim) {
                return Some(session.valid_until);
            }
            let lapsed = Instant::now() >= session.valid_until;
            if !lapsed
                || Instant::now() >= give_up
                || lock(&self.owned).get(cluster) != Some(&claim)
            {
                return None;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// Keeps `cluster` from being handed over to its preferred member until
    /// the returned hold is dropped (a task run in progress). A lost lease
    /// still loses it, and a drain releases it (see `handoff`).
    pub fn hold(self: &Arc<Self>, cluster: &str) -> Hold {
        *lock(&self.held).entry(cluster.to_string()).or_insert(0) += 1;
        Hold {
            replication: Arc::clone(self),
            cluster: cluster.to_string(),
        }
    }

    fn is_held(&self, cluster: &str) -> bool {
        lock(&self.held).contains_key(cluster)
    }

    /// The names of the clusters this replica owns now, in name order.
    pub fn owned_clusters(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.owned).keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Clusters this replica owns now.
    pub fn owned_count(&self) -> usize {
        lock(&self.owned).len()
    }

    /// The lease, while this replica believes it alive. Past the belief the
    /// session lapses (its claims are kept, unused) until a renewal succeeds
    /// or the lease turns out gone.
    /// This replica's lease while it believes it alive.
    pub fn live_lease(&self) -> Option<LeaseId> {
        let mut session = lock(&self.session);
        let s = session.as_mut()?;
        if Instant::now() < s.valid_until {
            return Some(s.lease);
        }
        if !s.lapsed {
            s.lapsed = true;
            tracing::warn!(
                lease = s.lease,
                "lease may have expired: not acting as an owner until etcd confirms it"
            );
        }
        None
    }

    /// Believes in `lease` until `valid_until` (a renewal succeeded), if it
    /// is still this replica's session.
    fn renewed(&self, lease: LeaseId, valid_until: Instant) {
        if let Some(session) = lock(&self.session).as_mut().filter(|s| s.lease == lease) {
            let was_lapsed = session.lapsed;
            session.valid_until = valid_until;
            session.lapsed = false;
            if was_lapsed {
                tracing::info!(
                    lease,
                    "the lease lived through the lapse: acting as an owner again"
                );
                // During the lapse no operation started and drives stopped
                // without writing; the epochs did not change, so nothing
                // else would send the executor back to these clusters
                // before its rescan.
                for cluster in lock(&self.owned).keys() {
                    let _ = self.adopted.send(cluster.clone());
                }
            }
        }
    }

    fn drop_session(&self, why: &str) {
        if lock(&self.session).take().is_some() {
            tracing::warn!(why, "lost the replica lease: no longer acting as an owner");
            self.metrics.leases_lost.inc();
        }
        lock(&self.owned).clear();
        self.metrics.clusters_owned.set(0);
    }
}

/// See [`Ownership::hold`].
pub struct Hold {
    replication: Arc<Ownership>,
    cluster: String,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut held = lock(&self.replication.held);
        if let Some(count) = held.get_mut(&self.cluster) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.cluster);
            }
        }
    }
}
