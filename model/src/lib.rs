//! An exhaustive model check of Drover's coordination protocol, with
//! [stateright]: accepting requests into a cluster's operation slot, the
//! owner driving the operation through the provider, leases, ownership,
//! fencing and orphan recovery (README, "How it works").
//!
//! The model is a state machine over the whole deployment: etcd
//! ([`store`]), the provider ([`provider`]) and every replica's local
//! beliefs ([`protocol`]). Each action is one atomic step: a transaction
//! (its compares and writes together), a provider call, a purely local step,
//! or a fault. The checker walks every interleaving within the bounds of a
//! [`Drover`] configuration.
//!
//! # Guarantees
//!
//! Within the bounds checked (see `tests/check.rs`), in every reachable
//! state ([`properties`]):
//! - a cluster's slot holds its only PENDING or RUNNING operation, and no
//!   other operation of the cluster is live;
//! - every change of a cluster's state is an edge of the table, judged
//!   against the state etcd held just before the write;
//! - per cluster, the epochs of the calls the provider accepted never
//!   decrease, and every operation's accepted calls carry a single epoch;
//! - no owner write (claim, start, completion, release) takes effect after
//!   etcd dropped the writer's lease;
//! - once the faults allowed are spent, every request is made and every
//!   operation ends (see Caveats for exactly what this covers).
//!
//! The checks are not vacuous: the `sometimes` properties show that a
//! zombie and a new owner both believe they own a cluster, that orphans are
//! failed, that stale epochs are refused and that idle clusters move to
//! their preferred member, and the negative tests show that dropping the
//! owner-key compare lets a dead lease's write land and that dropping orphan
//! recovery leaves an operation unfinished.
//!
//! # Assumptions
//!
//! - etcd is linearizable; a transaction's compares and writes are one step;
//!   a write bumps the global revision by one; an expiring lease deletes
//!   every key bound to it in one revision; a put bound to a lease etcd no
//!   longer holds fails.
//! - A lease can expire at any step, whatever the keep-alives did: so a
//!   successful keep-alive is not a step of the model (it only postpones an
//!   expiry the model may take or not), and a paused replica is one that
//!   acts on its beliefs while its lease is already gone.
//! - Every replica computes the same preferred member from the same member
//!   list (a stand-in for rendezvous hashing), and claims as the member
//!   list is at its claim's transaction. The real reconcile reads the list
//!   first; who claims matters for progress only, never for safety, which
//!   rests on the compares.
//! - The provider checks a token and applies the call atomically, as
//!   `server/src/provider/sim.rs` does under one lock.
//! - Accepting a request is one step: the replica's read and its
//!   transaction on the read revision are collapsed, since a transaction
//!   that misses writes nothing.
//!
//! # Caveats
//!
//! - Bounds: 2–3 replicas, 1–2 clusters, 2 requests, 1–2 lease losses (see
//!   the tests). A slice of the state table (Created, Starting, Running,
//!   Stopping, Stopped, Alert; start and stop requests; success and
//!   failure), copied in [`machine`]. One provider call per operation: more
//!   steps would repeat the start write and the call with the same compares
//!   and token.
//! - Not modelled: cancel requests, request ids, spec and status writes,
//!   the scanner, schema versions, graceful shutdown (a revoke is an expiry
//!   its replica knows of), etcd being unreachable and the retried write
//!   with an unknown outcome, watches and compaction, garbage collection,
//!   clusters being deleted or re-created.
//! - A transaction whose compares miss is not a step: its replica keeps
//!   the operation it held until it drops its session, where the real one
//!   would stop and read again later. That loses no behaviour only because
//!   a miss always comes from a claim that is dead for good, which is itself
//!   checked (the property "a missed compare comes from a dead claim").
//! - Liveness: stateright judges `eventually` only where a path ends. Here
//!   every path ends: each step spends a budget, bumps the revision, or
//!   moves a replica's session or operation forward, and nothing undoes
//!   them, so the state graph is acyclic; at its ends nothing is enabled:
//!   the faults are spent, every replica has rejoined, every given-up lease
//!   has expired and no request is left. The property is stable once true,
//!   so stateright not following a second path into a state it has already
//!   seen misses nothing. What it shows is therefore: after at most the
//!   budgeted lease losses, in every run where each replica keeps taking the
//!   steps open to it, every request is made and every operation ends. It
//!   says nothing about runs with unbounded failures (a replica that loses
//!   its lease again and again can starve a cluster), nor about how long
//!   anything takes.
//! - Orphan recovery announces the new owner's epoch to the provider
//!   (a fenced DescribeCluster) before it fails the orphan, so a zombie's
//!   call that arrives after its operation ended is refused: the property
//!   "no call lands after its operation ended". The model takes the read
//!   and the announcement as one step; in Drover the announcement follows
//!   the read, which only matters for calls before the operation ended.

pub mod machine;
pub mod properties;
pub mod protocol;
pub mod provider;
pub mod store;

use protocol::{Action, State};
use stateright::{Model, Property};

/// The bounds of one check, and the flaw seeded into the protocol, if any
/// (none in Drover; the negative tests seed one each to show the checker
/// notices).
#[derive(Debug, Clone, Copy)]
pub struct Drover {
    pub replicas: usize,
    pub clusters: usize,
    /// Client requests made in all, over every cluster.
    pub requests: u8,
    /// Lease losses: expiries of a lease its replica still uses, and
    /// replicas giving theirs up after failed keep-alives.
    pub faults: u8,
    /// Provider reads that fail: the fencing describe of orphan recovery and
    /// the describe an upgrade is planned from.
    pub read_errors: u8,
    /// Drives that end early and leave their operation in the slot while
    /// their replica keeps its claim (a write that met an error other than
    /// a conflict); the next scan resumes the operation.
    pub stalls: u8,
    pub flaw: Option<Flaw>,
}

/// A way to break the protocol, each a safeguard removed or a fix undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// Executor writes, and an accept that claims, do not compare the owner
    /// key's lease and create revision.
    NoOwnerCompare,
    /// An accept on the owner claims its operation without comparing the
    /// owner key (its other writes still do).
    UnfencedClaimAtAccept,
    /// A new owner leaves an operation RUNNING under another epoch alone.
    NoOrphanRecovery,
    /// Orphan recovery fails the orphan without announcing its epoch to
    /// the provider first.
    UnfencedOrphans,
    /// Orphan recovery fails the orphan anyway when its fencing describe
    /// fails (Drover did, before it kept the slot and retried).
    OrphanFailedWhenFenceFails,
    /// A describe that fails plans no steps (Drover did, before a failed
    /// read failed the operation).
    PlanFromFailedRead,
    /// A drive resumed under the same claim starts again at the first step
    /// instead of the persisted one.
    ResumeFromFirstStep,
}

impl Drover {
    /// The protocol as Drover runs it, within these bounds, with one failed
    /// provider read and one drive ending early.
    pub fn new(replicas: usize, clusters: usize, requests: u8, faults: u8) -> Self {
        Drover {
            replicas,
            clusters,
            requests,
            faults,
            read_errors: 1,
            stalls: 1,
            flaw: None,
        }
    }

    /// This model with `flaw` seeded.
    pub fn with(self, flaw: Flaw) -> Self {
        Drover {
            flaw: Some(flaw),
            ..self
        }
    }

    pub fn has(&self, flaw: Flaw) -> bool {
        self.flaw == Some(flaw)
    }
}

impl Model for Drover {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::new(self)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        state.actions(actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        last.step(self, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
