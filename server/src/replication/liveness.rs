//! Liveness: peers see a crash. Each member holds one HTTP connection to
//! every peer's `/liveness` (on the admin port its member record names;
//! over TLS, with this replica's certificate, when the record says that
//! port speaks TLS). When one breaks, the peer is probed at once: evidence
//! that the incarnation holding the lease is gone removes its member key,
//! so the survivors drain its owner keys and take its clusters over now
//! instead of after the TTL; its lease is revoked once they have.
//!
//! # Guarantees
//! - A member key is removed only on evidence that its incarnation is
//!   gone: the admin address where that incarnation was seen answering
//!   refuses connections, or the same replica id answers there with
//!   another lease. The removal compares the lease of the member record the
//!   task watched, so a newer incarnation's key is never touched; nor is
//!   this replica's. A lease is revoked only once no member key holds it.
//! - A refusal is evidence only when it is not this replica's own network:
//!   when every liveness connection of a replica that saw two peers or
//!   more answer breaks at once ([`CORROBORATION`]), the fault is taken to be its
//!   own (a local proxy restarting, an egress REJECT rule, a REDIRECT to an
//!   unbound port: all of them refuse every connection it makes) and
//!   nothing is revoked; the TTL decides. A peer killed alone breaks one
//!   connection while the others hold: its lease is revoked within about a
//!   second, as before.
//! - A probe that times out or fails otherwise (a paused process, a
//!   partition, an overloaded host) proves nothing: the TTL decides, as
//!   without this module. A paused peer also keeps its connections open.
//!
//! # Assumptions
//! - A replica binds its admin port before it joins and keeps it until the
//!   process exits: no listener there means no process.
//! - Replica ids are unique among live replicas (as membership assumes).
//!   A replica that finds its id held by a live incarnation ([`live_twin`])
//!   refuses to start instead of revoking it; a twin whose admin address
//!   the newcomer cannot reach (a loopback `--admin-listen` on another
//!   host) cannot be told from a dead incarnation and is revoked.
//! - Every owner write and provider call is fenced, and the provider
//!   drains calls of older epochs: revoking a lease early is safe, so this
//!   module only decides how soon.
//!
//! # Caveats
//! - A replica with a single peer cannot tell its own network from the
//!   peer's death: a refusal there is taken as the peer's death (its lease
//!   revoked, its clusters moved, safely) as before. So is a firewall that
//!   rejects connections to one peer's admin port only.
//! - Over TLS a handshake that fails (a certificate the other side's
//!   `--tls-client-ca` did not sign, or one not issued for client
//!   authentication) proves nothing, like any other failed probe: that
//!   peer's crash is left to the TTL, and a new member waits a TTL before
//!   it claims. `drover_liveness_peers_connected` falls short then.
//! - Peers killed together (a whole host with two replicas) look like this
//!   replica's own network failing: left to the TTL.
//! - Left to the TTL: a peer that crashes before this replica saw it
//!   answer, and one whose member record has no admin address (an older
//!   build) or a wildcard one (an admin port listening on all interfaces).
//!   The first cannot own anything: a replica's member record says
//!   `unwatched` (it claims nothing, peers keep its share) until every
//!   peer that watches holds a liveness connection to it
//!   ([`Ownership::watched_by_every_peer`]), or a TTL into its session
//!   (a peer that cannot reach its admin port). "Every peer" is every
//!   member record it has seen: replicas started in the same instant may
//!   not see each other's records yet, and one that sees no peer claims
//!   at once (a lone replica must), so its crash in that first instant is
//!   left to the TTL.

use super::*;
use crate::cluster::{from_json, ClusterCache};
use crate::store::{RangeRequest, StoreError};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a probe waits for a peer's first line.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Probes of one peer start at most this often (a connection that keeps
/// breaking at once must not spin).
const PROBE_SPACING: Duration = Duration::from_millis(250);
/// How long after a refusal the other liveness connections are looked at:
/// a fault of this replica's own network (a proxy's exit, `ss -K`) breaks
/// them all at once, their tasks seeing it within milliseconds. It is
/// added to every crash detection.
const CORROBORATION: Duration = Duration::from_millis(50);
/// How soon the member records are read again while the cache's watch is
/// not live (it cannot say when they change yet): a new member must be
/// watched at once, for it claims nothing until its peers watch it.
const UNWATCHED_MEMBERS_RETRY: Duration = Duration::from_millis(100);
/// After a probe that proved nothing: the next one. Soon, because a
/// killed process's sockets do not all close at once (a probe may meet its
/// listener half torn down, a reset that proves nothing, a moment before
/// connections are refused); a paused peer costs one connect per
/// `PROBE_TIMEOUT` plus this.
const RETRY_AFTER: Duration = Duration::from_millis(250);
/// The first line is a replica id and a lease id: anything longer is not
/// a liveness answer.
const LINE_LIMIT: usize = 4096;

/// The first line `/liveness` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessLine {
    pub replica: String,
    /// The lease of the answering incarnation's membership session.
    pub lease: LeaseId,
}

/// A peer incarnation, as its member record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Peer {
    replica: String,
    lease: LeaseId,
    admin_address: String,
    /// Its admin port speaks TLS.
    admin_tls: bool,
}

#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("connection refused")]
    Refused,
    #[error("no answer within {PROBE_TIMEOUT:?}")]
    TimedOut,
    #[error("{0}")]
    Failed(String),
}

fn failed(error: impl std::fmt::Display) -> ProbeError {
    ProbeError::Failed(error.to_string())
}

/// What a probe shows about the incarnation a task watches.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Alive,
    /// Gone, with the evidence.
    Gone(String),
    /// Nothing proven (why): the TTL decides.
    Unknown(String),
}

/// Judges a probe of `peer`; `seen` tells whether this incarnation was
/// seen answering at its address (only then does a refusal there say it
/// is gone: the address might not reach it at all).
fn judge(peer: &Peer, seen: bool, probe: Result<&LivenessLine, &ProbeError>) -> Verdict {
    match probe {
        Ok(line) if line.replica != peer.replica => {
            Verdict::Unknown(format!("answered by replica {}", line.replica))
        }
        Ok(line) if line.lease == peer.lease => Verdict::Alive,
        Ok(line) => Verdict::Gone(format!("answered with lease {}", line.lease)),
        Err(ProbeError::Refused) if seen => Verdict::Gone("connection refused".into()),
        Err(error) => Verdict::Unknown(error.to_string()),
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An open `/liveness` response.
struct Open {
    body: Incoming,
    _sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    _connection: AbortOnDrop,
}

impl Open {
    /// Returns when the connection ends (EOF, reset, or the peer's port
    /// closing); nothing else is sent on it.
    async fn closed(mut self) {
        while let Some(Ok(_)) = self.body.frame().await {}
    }
}

/// Counts a held liveness connection in the metrics while it lives.
struct Connected(Arc<Metrics>);

impl Connected {
    fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.liveness_peers_connected.inc();
        Self(Arc::clone(metrics))
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.liveness_peers_connected.dec();
    }
}

/// The request header naming the replica that holds a liveness
/// connection, so that the peer knows who watches it.
pub const WATCHER_HEADER: &str = "drover-watcher";

/// How to reach a peer's admin port: over TLS when its member record says
/// it speaks TLS, with `own` (this replica's certificate as the client's)
/// or, for a replica without TLS of its own, anonymously.
fn tls_towards(
    peer_speaks_tls: bool,
    own: Option<&Arc<rustls::ClientConfig>>,
) -> Option<Arc<rustls::ClientConfig>> {
    peer_speaks_tls.then(|| own.map_or_else(crate::config::anonymous_peers, Arc::clone))
}

/// `GET /liveness` at `address` (over `tls` when given), within
/// [`PROBE_TIMEOUT`], as `watcher` (a replica that will hold the
/// connection) or as nobody (a look).
async fn probe(
    address: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    watcher: Option<&str>,
) -> Result<(LivenessLine, Open), ProbeError> {
    tokio::time::timeout(PROBE_TIMEOUT, connect(address, tls, watcher))
        .await
        .unwrap_or(Err(ProbeError::TimedOut))
}

async fn connect(
    address: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    watcher: Option<&str>,
) -> Result<(LivenessLine, Open), ProbeError> {
    let stream = TcpStream::connect(address).await.map_err(|error| {
        if error.kind() == std::io::ErrorKind::ConnectionRefused {
            ProbeError::Refused
        } else {
            failed(error)
        }
    })?;
    let Some(tls) = tls else {
        return exchange(stream, address, watcher).await;
    };
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(failed)?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, stream)
        .await
        .map_err(failed)?;
    exchange(stream, address, watcher).await
}

/// The `/liveness` request and its first line, on a connection made.
async fn exchange<S>(
    stream: S,
    address: &str,
    watcher: Option<&str>,
) -> Result<(LivenessLine, Open), ProbeError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(failed)?;
    let connection = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let mut request = hyper::Request::get("/liveness").header(hyper::header::HOST, address);
    if let Some(watcher) = watcher {
        request = request.header(WATCHER_HEADER, watcher);
    }
    let request = request.body(Empty::new()).map_err(failed)?;
    let response = sender.send_request(request).await.map_err(failed)?;
    if response.status() != hyper::StatusCode::OK {
        return Err(failed(format!("answered {}", response.status())));
    }
    let mut body = response.into_body();
    let line = first_line(&mut body).await?;
    let open = Open {
        body,
        _sender: sender,
        _connection: connection,
    };
    Ok((line, open))
}

async fn first_line(body: &mut Incoming) -> Result<LivenessLine, ProbeError> {
    let mut read = Vec::new();
    while !read.contains(&b'\n') {
        if read.len() > LINE_LIMIT {
            return Err(failed("no liveness line"));
        }
        match body.frame().await {
            Some(Ok(frame)) => read.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d)),
            Some(Err(error)) => return Err(failed(error)),
            None => return Err(failed("the answer ended before its first line")),
        }
    }
    let end = read.iter().position(|b| *b == b'\n').unwrap_or(read.len());
    serde_json::from_slice(&read[..end]).map_err(failed)
}

/// Whether peers can reach `address` as written: a wildcard listen
/// address names no host.
pub(super) fn reachable(address: &str) -> bool {
    !address.is_empty()
        && address
            .parse::<SocketAddr>()
            .map_or(true, |a| !a.ip().is_unspecified())
}

/// The admin address of a live incarnation that holds `replica_id`'s
/// member record now, if one does: its `/liveness` answers with that id
/// and the record's lease, and etcd still has the lease. `own_admin` is
/// this process's admin address (a record naming it was this host's
/// previous incarnation: nothing else can listen there). A record whose
/// address does not answer, or answers otherwise, is a previous
/// incarnation that is gone or cannot be told apart from one: `join`
/// revokes its lease, as before.
pub async fn live_twin(
    store: &dyn crate::store::Store,
    keys: &KeyLayout,
    replica_id: &str,
    own_admin: &str,
    own_tls: Option<&Arc<rustls::ClientConfig>>,
) -> crate::store::Result<Option<String>> {
    let Some(kv) = store.get(&keys.member(replica_id)).await?.into_single() else {
        return Ok(None);
    };
    let Ok(record) = from_json::<MemberRecord>(&kv) else {
        return Ok(None);
    };
    let address = record.admin_address;
    if kv.lease == 0 || address == own_admin || !reachable(&address) {
        return Ok(None);
    }
    let tls = tls_towards(record.admin_tls, own_tls);
    let answered = match probe(&address, tls, None).await {
        Ok((line, _open)) => line.replica == replica_id && line.lease == kv.lease,
        Err(_) => false,
    };
    if !answered || store.lease_time_to_live(kv.lease).await?.is_none() {
        return Ok(None);
    }
    Ok(Some(address))
}

/// A peer this replica saw answering, counted (in `liveness_seen`) while
/// its watch task lives.
struct SeenPeer {
    ownership: Arc<Ownership>,
    counted: bool,
}

impl SeenPeer {
    fn new(ownership: &Arc<Ownership>) -> Self {
        Self {
            ownership: Arc::clone(ownership),
            counted: false,
        }
    }

    fn seen(&mut self) {
        if !self.counted {
            self.counted = true;
            self.ownership
                .liveness_seen
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Drop for SeenPeer {
    fn drop(&mut self) {
        if self.counted {
            self.ownership
                .liveness_seen
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A peer's open liveness connection to this replica, counted while it
/// lives (see [`Ownership::watched_by_every_peer`]).
pub struct Watcher {
    ownership: Arc<Ownership>,
    peer: String,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let mut by = lock(&self.ownership.watched_by);
        if let Some(count) = by.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                by.remove(&self.peer);
            }
        }
        self.ownership.pass_wanted.notify_one();
    }
}

impl Ownership {
    /// Counts `peer`'s liveness connection to this replica while the
    /// returned guard lives.
    pub fn watcher(self: &Arc<Self>, peer: &str) -> Watcher {
        *lock(&self.watched_by).entry(peer.to_string()).or_default() += 1;
        self.pass_wanted.notify_one();
        Watcher {
            ownership: Arc::clone(self),
            peer: peer.to_string(),
        }
    }

    /// Whether this replica may claim clusters as far as its peers' watch
    /// goes: every live peer that holds liveness connections holds one to
    /// it, so that its crash from its first claim on is seen at once (a
    /// peer that never saw it answer leaves its crash to the TTL). Not
    /// waited for when peers cannot reach its admin address, nor past a
    /// TTL into the session (a peer that cannot reach it).
    pub(super) fn watched_by_every_peer(&self, members: &[MemberRecord]) -> bool {
        let session_age = lock(&self.session).as_ref().map(|s| s.joined.elapsed());
        if !reachable(&self.config.admin_address)
            || session_age.is_none_or(|age| age >= self.config.lease_ttl)
        {
            return true;
        }
        let by = lock(&self.watched_by);
        members
            .iter()
            .filter(|m| m.id != self.config.replica_id && m.watches_peers && !m.draining)
            .all(|m| by.contains_key(&m.id))
    }

    /// Follows the member records and holds a liveness connection to every
    /// peer that has an admin address, until `shutdown` turns true.
    pub async fn run_liveness(
        self: Arc<Self>,
        cache: Arc<ClusterCache>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let period = self.config.lease_ttl / 3;
        let mut watched: HashMap<String, (Peer, AbortOnDrop)> = HashMap::new();
        // Leases of departed peers, each revoked once its owner keys are
        // drained; dropped (so aborted) with the loop: the TTL ends them.
        let mut revoking = tokio::task::JoinSet::new();
        while !*shutdown.borrow() {
            // Before the read: a change after it is then in the watch.
            let mut members = cache.watch_keys(&self.keys.members()).map(|(w, _)| w);
            match self.peers().await {
                Ok(peers) => {
                    for departed in self.follow(&mut watched, peers) {
                        revoking.spawn(Arc::clone(&self).revoke_when_drained(departed));
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot read the members to watch"),
            }
            while revoking.try_join_next().is_some() {}
            let wait = match members {
                Some(_) => period,
                None => UNWATCHED_MEMBERS_RETRY,
            };
            let member_changed = async {
                match &mut members {
                    Some(watch) => drop(watch.next().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = member_changed => {},
                _ = tokio::time::sleep(wait) => {},
            }
        }
    }

    /// The peers worth a liveness connection: every member record but this
    /// replica's, with a reachable admin address.
    async fn peers(&self) -> crate::store::Result<Vec<Peer>> {
        let members = self
            .store
            .range(RangeRequest::prefix(self.keys.members()))
            .await?;
        let own = self.session_lease();
        Ok(members
            .kvs
            .iter()
            .filter(|kv| kv.lease != 0 && Some(kv.lease) != own)
            .filter_map(|kv| Some((kv.lease, from_json::<MemberRecord>(kv).ok()?)))
            .filter(|(_, m)| m.id != self.config.replica_id && reachable(&m.admin_address))
            .map(|(lease, m)| Peer {
                replica: m.id,
                lease,
                admin_address: m.admin_address,
                admin_tls: m.admin_tls,
            })
            .collect())
    }

    /// Keeps one task per peer incarnation: a new lease or address replaces
    /// the task (dropping the old one aborts it), a peer gone ends it.
    /// Returns the incarnations no member key holds any more (deposed, or
    /// gone), whose leases may still hold owner keys.
    fn follow(
        self: &Arc<Self>,
        watched: &mut HashMap<String, (Peer, AbortOnDrop)>,
        peers: Vec<Peer>,
    ) -> Vec<Peer> {
        let mut departed = Vec::new();
        watched.retain(|id, (peer, _)| {
            let listed = peers.iter().any(|p| &p.replica == id && p == peer);
            if !peers.iter().any(|p| p.lease == peer.lease) {
                departed.push(peer.clone());
            }
            listed
        });
        for peer in peers {
            if !watched.contains_key(&peer.replica) {
                let task = tokio::spawn(Arc::clone(self).watch_peer(peer.clone()));
                watched.insert(peer.replica.clone(), (peer, AbortOnDrop(task)));
            }
        }
        departed
    }

    /// Holds a liveness connection to `peer` and probes it whenever the
    /// connection breaks or cannot be made; ends once it revoked `peer`'s
    /// lease (or found it gone), or when aborted.
    async fn watch_peer(self: Arc<Self>, peer: Peer) {
        let mut seen = false;
        let mut counted = SeenPeer::new(&self);
        // Said once per run of suspect refusals, not at every probe.
        let mut suspected = false;
        let mut next_probe = tokio::time::Instant::now();
        loop {
            tokio::time::sleep_until(next_probe).await;
            next_probe = tokio::time::Instant::now() + PROBE_SPACING;
            let tls = tls_towards(peer.admin_tls, self.config.admin_tls.as_ref());
            let probed = probe(&peer.admin_address, tls, Some(&self.config.replica_id)).await;
            match judge(&peer, seen, probed.as_ref().map(|(line, _)| line)) {
                Verdict::Alive => {
                    let Ok((_, open)) = probed else { continue };
                    if !seen {
                        tracing::debug!(peer = %peer.replica, lease = peer.lease, "liveness connection to the peer open");
                    }
                    seen = true;
                    counted.seen();
                    suspected = false;
                    let _connected = Connected::new(&self.metrics);
                    open.closed().await;
                    tracing::info!(peer = %peer.replica, lease = peer.lease, "liveness connection to the peer broke: probing it");
                }
                Verdict::Gone(evidence) => {
                    let refused = probed.is_err();
                    if refused && self.own_network_suspect().await {
                        if !suspected {
                            tracing::warn!(peer = %peer.replica, lease = peer.lease, "every liveness connection of this replica broke at once: its own network is suspect, not its peers; nothing revoked, the TTL decides");
                        }
                        suspected = true;
                        self.metrics.liveness_self_suspected.inc();
                        next_probe = tokio::time::Instant::now() + RETRY_AFTER;
                        continue;
                    }
                    return self.depose_crashed(&peer, &evidence).await;
                }
                Verdict::Unknown(why) => {
                    tracing::debug!(peer = %peer.replica, why, "liveness probe proved nothing; the TTL decides");
                    next_probe = tokio::time::Instant::now() + RETRY_AFTER;
                }
            }
        }
    }

    /// Whether a refusal just seen may be this replica's own network: a
    /// moment later, of two peers or more watched, none has a liveness
    /// connection open.
    async fn own_network_suspect(&self) -> bool {
        tokio::time::sleep(CORROBORATION).await;
        // Peers never reached (one whose address does not reach it) tell
        // nothing about this replica's network: only those seen count.
        let seen = self.liveness_seen.load(std::sync::atomic::Ordering::SeqCst);
        seen >= 2 && self.metrics.liveness_peers_connected.get() == 0
    }

    /// Removes the member key of `peer`'s incarnation, found gone on
    /// `evidence`: the survivors then drain its owner keys and claim its
    /// clusters at once, batch by batch, and its lease is revoked once they
    /// have ([`Self::revoke_when_drained`]). Revoking first deleted every
    /// owner key of the lease in one etcd apply, which held etcd for 120 ms
    /// at 33,000 keys.
    async fn depose_crashed(&self, peer: &Peer, evidence: &str) {
        // Never this replica's own (a member record cannot name it for
        // another replica id; checked again all the same).
        if self.session_lease() == Some(peer.lease) {
            return;
        }
        self.metrics.peer_crashes_detected.inc();
        match self.remove_member(&peer.replica, peer.lease).await {
            Ok(true) => {
                self.metrics.peer_members_deposed.inc();
                tracing::warn!(peer = %peer.replica, lease = peer.lease, evidence, "peer crashed: removed its member key, its clusters are taken over now, not after its TTL");
            }
            // Another peer deposed it first, or it rejoined.
            Ok(false) => {
                tracing::info!(peer = %peer.replica, lease = peer.lease, evidence, "peer crashed; its member key is already gone");
            }
            Err(error) => {
                tracing::warn!(%error, peer = %peer.replica, lease = peer.lease, evidence, "peer crashed but its member key cannot be removed; its clusters wait for its TTL");
            }
        }
    }

    /// Revokes the lease of `peer`, an incarnation no member key holds any
    /// more, once this replica's view shows no owner key bound to it (the
    /// survivors drained them), or after a TTL; not if a member key holds
    /// it again (a deposed replica that was alive after all).
    async fn revoke_when_drained(self: Arc<Self>, peer: Peer) {
        let mut counts = self.owner_keys.subscribe();
        let drained = counts.wait_for(|counts| !counts.contains_key(&peer.lease));
        let _ = tokio::time::timeout(self.config.lease_ttl, drained).await;
        match self.read_members().await {
            Ok(members) if !members.leases.contains(&peer.lease) => {}
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%error, peer = %peer.replica, lease = peer.lease, "cannot read the members; the departed peer's lease is left to its TTL");
                return;
            }
        }
        match self.store.revoke_lease(peer.lease).await {
            Ok(()) => {
                self.metrics.peer_leases_revoked.inc();
                tracing::info!(peer = %peer.replica, lease = peer.lease, "revoked the lease of a departed peer");
            }
            // Revoked by another peer, or by the replica itself (a resign),
            // or expired.
            Err(StoreError::LeaseNotFound(_)) => {}
            Err(error) => {
                tracing::warn!(%error, peer = %peer.replica, lease = peer.lease, "cannot revoke a departed peer's lease; it ends at its TTL");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_http::{self, Incarnation};
    use crate::store::{MemoryStore, Op, SharedStore, Txn};
    use std::sync::atomic::AtomicBool;

    /// A member `id` of `store` whose admin port serves `/liveness`; the
    /// port closes when the returned sender is dropped.
    async fn member(store: &SharedStore, id: &str) -> (Arc<Ownership>, Peer, watch::Sender<bool>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_address = listener.local_addr().unwrap().to_string();
        let config = OwnershipConfig {
            replica_id: id.into(),
            address: "127.0.0.1:1".into(),
            admin_address: admin_address.clone(),
            admin_tls: None,
            lease_ttl: Duration::from_secs(30),
            lease_margin: Duration::from_secs(6),
            peer_liveness: false,
        };
        let keys = KeyLayout::new("/t/");
        let (ownership, _) = Ownership::new(store.clone(), keys, config, Metrics::new());
        let lease = ownership.join().await.unwrap();
        let incarnation = Incarnation::default();
        let _ = incarnation.set(Arc::clone(&ownership));
        let (open, closed) = watch::channel(false);
        let ready = Arc::new(AtomicBool::new(true));
        let metrics = Metrics::new();
        tokio::spawn(admin_http::serve(
            listener,
            metrics,
            ready,
            incarnation,
            None,
            None,
            closed,
        ));
        let peer = Peer {
            replica: id.into(),
            lease,
            admin_address,
            admin_tls: false,
        };
        (ownership, peer, open)
    }

    async fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The whole path on loopback: a peer's `/liveness` answers its lease
    /// and stays open; its port closing (the process exiting) breaks the
    /// connection, the probe is refused, and the watcher removes exactly
    /// that member key; its lease is revoked once no owner key is bound to
    /// it (none here).
    #[tokio::test]
    async fn a_peer_whose_port_closes_loses_its_lease_at_once() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let (watcher, _, _watcher_port) = member(&store, "r1").await;
        let (_, peer, peer_port) = member(&store, "r2").await;
        let (line, open) = probe(&peer.admin_address, None, None).await.unwrap();
        assert_eq!(
            line,
            LivenessLine {
                replica: "r2".into(),
                lease: peer.lease
            }
        );
        let task = tokio::spawn(Arc::clone(&watcher).watch_peer(peer.clone()));
        let connected = || watcher.metrics.liveness_peers_connected.get() == 1;
        wait_for(connected, "liveness connection").await;

        drop(peer_port);
        tokio::time::timeout(Duration::from_secs(5), open.closed())
            .await
            .expect("the open answer ends with the port");
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the watcher ends after the depose")
            .unwrap();
        let r2 = watcher.keys.member("r2");
        assert!(store.get(&r2).await.unwrap().kvs.is_empty());
        assert!(store
            .lease_time_to_live(peer.lease)
            .await
            .unwrap()
            .is_some());
        assert_eq!(watcher.metrics.peer_crashes_detected.get(), 1);
        assert_eq!(watcher.metrics.peer_members_deposed.get(), 1);
        assert_eq!(watcher.metrics.liveness_peers_connected.get(), 0);
        let revoked = Arc::clone(&watcher).revoke_when_drained(peer.clone());
        tokio::time::timeout(Duration::from_secs(5), revoked)
            .await
            .expect("nothing to drain: revoked at once");
        assert_eq!(store.lease_time_to_live(peer.lease).await.unwrap(), None);
        assert_eq!(watcher.metrics.peer_leases_revoked.get(), 1);
        let own = watcher.session_lease().unwrap();
        assert!(store.lease_time_to_live(own).await.unwrap().is_some());
    }

    /// A watcher of an older incarnation of `r2` that finds a newer one
    /// answering leaves the newer one's member key alone; the old lease is
    /// revoked, the new one is not.
    #[tokio::test]
    async fn a_newer_incarnation_answering_revokes_only_the_old_lease() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let (watcher, _, _watcher_port) = member(&store, "r1").await;
        let (_, newer, _newer_port) = member(&store, "r2").await;
        let old_lease = store.grant_lease(30).await.unwrap();
        let older = Peer {
            lease: old_lease,
            ..newer.clone()
        };
        tokio::time::timeout(
            Duration::from_secs(5),
            Arc::clone(&watcher).watch_peer(older.clone()),
        )
        .await
        .expect("the watcher ends after the depose");
        let r2 = store.get(&watcher.keys.member("r2")).await.unwrap();
        assert_eq!(r2.kvs[0].lease, newer.lease);
        assert_eq!(watcher.metrics.peer_members_deposed.get(), 0);
        Arc::clone(&watcher).revoke_when_drained(older).await;
        assert_eq!(store.lease_time_to_live(old_lease).await.unwrap(), None);
        assert!(store
            .lease_time_to_live(newer.lease)
            .await
            .unwrap()
            .is_some());
        assert_eq!(watcher.metrics.peer_leases_revoked.get(), 1);
    }

    /// A departed lease is revoked only once this replica's view shows no
    /// owner key bound to it, and not at all when a member key holds it
    /// again (a deposed replica that was alive wrote its key back).
    #[tokio::test]
    async fn a_departed_lease_is_revoked_once_drained_unless_it_is_back() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let (watcher, _, _watcher_port) = member(&store, "r1").await;
        let (_, peer, _peer_port) = member(&store, "r2").await;
        let r2 = store.get(&watcher.keys.member("r2")).await.unwrap().kvs[0].clone();
        store
            .txn(Txn::new().and_then([Op::delete(&r2.key)]))
            .await
            .unwrap();
        watcher
            .owner_keys
            .send_replace([(peer.lease, 2)].into_iter().collect());
        let revoke = tokio::spawn(Arc::clone(&watcher).revoke_when_drained(peer.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !revoke.is_finished(),
            "revoked before the keys were drained"
        );
        watcher.owner_keys.send_replace(HashMap::new());
        tokio::time::timeout(Duration::from_secs(5), revoke)
            .await
            .expect("revoked once drained")
            .unwrap();
        assert_eq!(store.lease_time_to_live(peer.lease).await.unwrap(), None);

        let (_, back, _back_port) = member(&store, "r3").await;
        Arc::clone(&watcher).revoke_when_drained(back.clone()).await;
        assert!(store
            .lease_time_to_live(back.lease)
            .await
            .unwrap()
            .is_some());
    }

    fn peer() -> Peer {
        Peer {
            replica: "r2".into(),
            lease: 7,
            admin_address: "127.0.0.1:1".into(),
            admin_tls: false,
        }
    }

    fn line(replica: &str, lease: LeaseId) -> LivenessLine {
        LivenessLine {
            replica: replica.into(),
            lease,
        }
    }

    #[test]
    fn only_a_refusal_where_it_answered_or_another_lease_is_evidence() {
        let p = peer();
        assert_eq!(judge(&p, false, Ok(&line("r2", 7))), Verdict::Alive);
        assert_eq!(
            judge(&p, false, Ok(&line("r2", 9))),
            Verdict::Gone("answered with lease 9".into())
        );
        assert!(matches!(
            judge(&p, true, Ok(&line("r3", 9))),
            Verdict::Unknown(_)
        ));
        assert_eq!(
            judge(&p, true, Err(&ProbeError::Refused)),
            Verdict::Gone("connection refused".into())
        );
        // Never seen there: the address may not reach it at all.
        assert!(matches!(
            judge(&p, false, Err(&ProbeError::Refused)),
            Verdict::Unknown(_)
        ));
        // A paused process or a partition.
        assert!(matches!(
            judge(&p, true, Err(&ProbeError::TimedOut)),
            Verdict::Unknown(_)
        ));
        assert!(matches!(
            judge(&p, true, Err(&failed("answered 503 Service Unavailable"))),
            Verdict::Unknown(_)
        ));
    }

    #[test]
    fn wildcard_and_empty_admin_addresses_are_not_followed() {
        assert!(!reachable(""));
        assert!(!reachable("0.0.0.0:9070"));
        assert!(!reachable("[::]:9070"));
        assert!(reachable("10.0.0.5:9070"));
        assert!(reachable("drover-1.drover:9070"));
    }
}
