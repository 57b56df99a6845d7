//! An exhaustive model check of Drover's coordination protocol, with
//! [stateright]: accepting requests into a cluster's operation slot (on the
//! owner, or on another replica, with the owner's claim folded in), the
//! owner driving the operation step by step through the provider, leases,
//! ownership, fencing and orphan recovery (README, "How it works").
//!
//! The model is a state machine over the whole deployment: etcd
//! ([`store`]), the provider ([`provider`]), the calls on their way to it,
//! and every replica's local beliefs ([`protocol`]). Each action is one
//! atomic step: a transaction (its compares and writes together), a
//! provider call arriving or a fenced read, a purely local step, or a
//! fault. The checker walks every interleaving within the bounds of a
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
//! - per cluster, the epochs of the calls the provider applied never
//!   decrease (no call lands under an epoch older than one it already
//!   took, so an orphan resumed under a new epoch never sees a call of
//!   the lost owner land after the resumed step's), and no call runs at
//!   the provider beside a newer epoch's (the drain);
//! - no call lands after its operation ended, even when the new owner's
//!   fencing describe fails: orphan recovery keeps the slot and retries;
//! - an operation's steps land in order: a drive resumed under its claim
//!   repeats at most the step it recorded;
//! - an operation SUCCEEDED only if the provider took and carried out each
//!   step of its plan (an upgrade is never planned from a describe that
//!   failed);
//! - no owner write (claim, accept that claims, for the owner or on it,
//!   step record, completion, release) takes effect after etcd dropped the writer's lease, nor,
//!   while etcd holds it, once the owner key is no longer the one its claim
//!   was made with: an owner deposed while alive keeps its lease, and its
//!   owner key's compare (lease and create revision) is what stops it once
//!   the key is drained, so two owners' fenced writes never both take
//!   effect, the older one's after the newer one's key exists;
//! - every new owner's epoch is above every epoch the provider has seen
//!   for its cluster, through joins that take a lagging etcd member for a
//!   restore (every replica claims under the one fence record, compared
//!   in every claim) and through restores of one snapshot, repeated (the
//!   base comes from the clock, which a restore does not set back);
//! - once the faults allowed are spent, every request is made and every
//!   operation ends (see Caveats for exactly what this covers).
//!
//! The checks are not vacuous: the `sometimes` properties show that a
//! zombie and a new owner both believe they own a cluster, that orphans are
//! resumed and (past the limit, or under the fail policy) failed, that a
//! newer epoch drains an older call, that a failed fence keeps the slot, that a call is still in
//! flight after its drive ended with its session, that a stale call is on
//! its way to a refusal, that an accept on the owner claims its operation,
//! that an accept on another replica claims its operation for the owner,
//! that a drive that ended early is resumed, that idle clusters move to
//! their preferred member and that an owner hands over a cluster whose
//! operation it drives (a gray failure), that a departed incarnation's
//! owner key is drained, that a replica deposed while alive becomes a
//! member again and that such an owner, its lease alive, believes it owns a
//! cluster claimed anew. Each negative test seeds one [`Flaw`] and the
//! checker finds its counterexample: without the owner-key compare (in the
//! executor's writes, in the accept's claim, or in the claim an accept on
//! another replica folds in for the owner from its view of the owner keys)
//! a dead lease's write lands,
//! and so does the write of an owner deposed while alive after its key was
//! drained; a takeover that puts its owner key over the departed one
//! instead of draining it and claiming afresh repeats the deposed owner's
//! epoch;
//! without orphan recovery an operation never ends; failing an orphan
//! without a fence, or when the fence fails (as Drover did), lets the old
//! owner's call land after the operation ended; planning from a failed
//! describe (as Drover did) reports an upgrade that never ran; resuming at
//! the first step runs a step again after a later one; resuming an orphan
//! with a provider that does not drain lets the lost owner's call, admitted
//! before the fence, run beside the resumed step and land after it; an
//! orphan a hand-over left (no lease lost) failed without a fence lets the
//! old owner's call land after the operation ended; a claim that does not
//! compare the fence record, or a restore's base taken from the restored
//! record, lets a new owner claim below an epoch the provider has seen.
//!
//! # Assumptions
//!
//! - etcd is linearizable; a transaction's compares and writes are one step;
//!   a write bumps the global revision by one. (The etcd store's group
//!   commit sends several of a replica's transactions in one request, which
//!   share a revision; it only puts together transactions none of which
//!   writes a key another writes, compares or reads, so the request ends as
//!   those transactions taken one after another, as the model takes them,
//!   and a key's revisions still grow with each write.) An expiring lease deletes
//!   every key bound to it in one revision; a put bound to a lease etcd no
//!   longer holds fails.
//! - A lease can expire at any step, whatever the keep-alives did: so a
//!   successful keep-alive is not a step of the model (it only postpones an
//!   expiry the model may take or not), and a paused replica is one that
//!   acts on its beliefs while its lease is already gone.
//! - A live peer may depose any other replica at any step (fast crash
//!   detection, `server/src/replication/liveness.rs`, and a lease about to
//!   expire unrenewed, `server/src/replication/expiring.rs`): it deletes the
//!   replica's member key, comparing it bound to the replica's lease, and
//!   leaves the lease and its owner keys (revoking the lease at once
//!   deleted every owner key in one etcd apply). A depose is drawn from its
//!   own budget and, when the replica's session is alive, from the budget
//!   of lease losses too. The model lets a peer depose a replica that is
//!   alive and well, which Drover never does on purpose: safety must not
//!   rest on the evidence being right. The deposer revokes the lease once
//!   no owner key is bound to it (to etcd an expiry; no fault of its own,
//!   the depose was); a revoke at any other time, as after the deadline
//!   with keys left, is a lease loss from the budget, as it was. A replica
//!   that rejoins revokes its previous incarnation's lease first if its
//!   member key still holds it; a deposed incarnation's is left to the
//!   deposer's revoke or to its expiry.
//! - A takeover: in an ownership pass, the preferred member deletes a
//!   cluster's owner key bound to a lease no member key holds (a deposed
//!   incarnation's), comparing the key's lease and create revision as it
//!   read them, and claims the cluster in a later step, as any claim: a new
//!   key, so a new create revision and a new epoch. The read and the delete
//!   are one step (a transaction that misses writes nothing), so to keep
//!   the race of a drain read before the deposed replica wrote its member
//!   key back, a key stays drainable once its lease lost its member key,
//!   for as long as it is the same key. Who drains is judged at that step
//!   (member, preferred, its session alive as far as it knows): the delete
//!   is the same whoever makes it.
//! - A replica deposed while alive finds its member key gone at its next
//!   pass and writes it again, bound to the same lease (a put that fails
//!   if etcd dropped the lease); while not a member it claims and releases
//!   nothing. Its drives go on, fenced by the owner key's compare: a drained
//!   key makes its next write miss. A member whose pass finds the owner key
//!   it believes its own gone or another's, its lease alive, forgets the
//!   claim, and its drive stops at its claim check (the real pass derives
//!   what it owns from the owner keys each time).
//! - A gray failure's hand-over: an owner whose lease lives releases a
//!   cluster whose operation it drives (fenced, as any release) and stops
//!   driving it; the call it sent goes on. The next owner finds the
//!   operation RUNNING under another epoch: an orphan, as after a lost
//!   lease. Why the owner hands over (its probes) is not modelled, only
//!   that it may at any step, within the budget.
//! - Orphans: a new owner that reads an operation RUNNING under another
//!   epoch fences the provider and then resumes it at the step its record
//!   shows, recording it under its own epoch (the record counts the
//!   epochs that took it over); past the limit, or under the fail policy,
//!   it fails it instead ([`OrphanPolicy`]). Steps are idempotent, so a
//!   step run again by the new owner is the same step.
//! - Every replica computes the same preferred member from the same member
//!   list (a stand-in for rendezvous hashing), and claims as the member
//!   list is at its claim's transaction. The real reconcile reads the list
//!   first; who claims matters for progress only, never for safety, which
//!   rests on the compares.
//! - The provider checks a token when the call arrives and either applies
//!   it in the same step or admits it and applies it later (a slow call);
//!   a fenced DescribeCluster that it answers refuses older epochs from
//!   then on. Whatever raises a cluster's newest epoch (a call or a fenced
//!   describe) first drains that cluster's older-epoch calls still
//!   running: they answer ABORTED and apply nothing (`provider.proto`,
//!   "Draining"; `server/src/provider/sim.rs`).
//! - Accepting a request is one step: the replica's read and its
//!   transaction on the read revision are collapsed, since a transaction
//!   that misses writes nothing.
//! - A drive sends a step's call in the same step as the write that records
//!   the step (or the accept that claims, or the read that resumes). A call
//!   in flight changes nothing until it lands, so one sent at once and
//!   landing late covers one sent late, and one never sent (its claim
//!   check failed) is one that lands after everything the checker looks at.
//!
//! # Caveats
//!
//! - Bounds: 2–3 replicas, 1–2 clusters, 1–2 requests, 1–2 lease losses,
//!   at most one depose (in the checks that have one, and with one lease
//!   loss: a depose multiplies the states by about six),
//!   one failed provider read, at most one drive ending early and one slow
//!   call, orphans resumed once (Drover's default is three; see the
//!   tests: not every combination, or the states run into tens of
//!   millions). A slice of the state table is reached (Created, Starting,
//!   Running, Stopping, Stopped, Upgrading, Alert; start, stop and upgrade
//!   requests; success and failure); the table, the admission, the final
//!   state and the provider's fencing rule are Drover's own, from the
//!   `drover-machine` crate the replica uses. Steps are abstract
//!   mutating calls, each recorded before it is sent: a start has two (in
//!   Drover, provisioning or power-on and then a read-only health check,
//!   which is not recorded), a stop and an upgrade one (an upgrade has one
//!   per node not yet at the target). Only the upgrade is planned from a
//!   describe; the go-ahead stop from Created is planned without one here.
//! - A failed provider read changes nothing at the provider. One that the
//!   provider answered but whose answer was lost is, to the replica, a
//!   failure it retries, and to everyone else a fence that succeeded.
//! - When a replica drops its session its drives end with it, but the calls
//!   they sent go on and land whenever they arrive. A drive that goes on
//!   writing after its session is not modelled: each such write compares
//!   the owner key and lands only while etcd still holds the lease, where
//!   it is the same as a write taken just before the session ended. So the
//!   lapsed session that fails a drive's operation because its claim check
//!   failed while etcd still held the lease is not modelled either (it is
//!   no safety matter: the write is fenced).
//! - A drive ends early (a write that met an error other than a conflict)
//!   only after the first step of a two-step operation, where resuming at
//!   the recorded step differs from starting again.
//! - A step's call sent again after an answer saying the provider is
//!   unavailable, or after a refused connection, is a call that lands
//!   later: covered. One sent again after a connection broke mid-call,
//!   while the provider may still be working on the first copy, is not
//!   modelled: its order against the drive's next step rests on the
//!   provider serialising a cluster's calls (`PROVIDERS.md`).
//! - A restore is modelled as the revision counter and the fence record
//!   going back to the deployment's first revision and record, every
//!   lease and every key bound to one gone, with every other key as it
//!   is but written at or before that revision, and only while nothing is
//!   in flight and every operation has ended: what a restore does to
//!   epochs (the revisions repeat), not what it does to the data (an
//!   operation accepted after the snapshot coming back), which
//!   PRODUCTION.md covers. A lagging member is modelled by its effect, a
//!   join that sets a new base, at any step.
//! - Not modelled: cancel requests, request ids, spec and status writes,
//!   the scanner, schema versions, graceful shutdown (a revoke is an expiry
//!   its replica knows of), etcd being unreachable and the retried write
//!   with an unknown outcome, watches and compaction, garbage collection,
//!   clusters being deleted or re-created, call deadlines.
//! - A transaction whose compares miss, and a fenced read the provider
//!   refuses, are not steps: the replica keeps the operation it held until
//!   it drops its session, where the real one would stop and read again
//!   later. That loses no behaviour only because a miss always comes from a
//!   claim that is dead for good, which is itself checked (the property "a
//!   missed compare comes from a dead claim").
//! - Liveness: stateright judges `eventually` only where a path ends. Here
//!   every path ends: each step spends a budget, bumps the revision, lands
//!   a call, or moves a replica's session or operation forward, and nothing
//!   undoes them, so the state graph is acyclic (a fence that fails spends
//!   a read error; once they are spent, fences succeed). At its ends nothing
//!   is enabled: the faults are spent, every replica has rejoined, every
//!   given-up lease has expired, every call has landed and no request is
//!   left (a forgotten claim comes back only through a claim, which bumps
//!   the revision). The property is stable once true, so stateright not following a
//!   second path into a state it has already seen misses nothing. What it
//!   shows is therefore: after at most the budgeted faults, in every run
//!   where each replica keeps taking the steps open to it, every request is
//!   made and every operation ends. It says nothing about runs with
//!   unbounded failures (a replica that loses its lease again and again can
//!   starve a cluster, and a fence that always fails keeps its orphan's
//!   slot for ever, by design), nor about how long anything takes.
//!
//! # Fleet rollouts
//!
//! [`rollout`] is a model of its own, with its own [`Model`] ([`Rollout`]):
//! a rollout's owner starting its targets' operations through the accept
//! within the stage's concurrency, across owner crashes, zombies and lost
//! answers. It checks that at most N of the rollout's operations run at
//! once and that each target's operation is accepted at most once, and
//! seeded flaws ([`RolloutFlaw`]) show each can fail: submitting before
//! the STARTING record, a fresh request id on resubmission, unfenced
//! target writes, and a target written PENDING after a lost answer (what
//! Drover's reconcile does today; see that module's Caveats). Its checks
//! are in `tests/rollout.rs`.
//!
//! # Automatic remediation
//!
//! [`remediation`] is another, with its own [`Model`]
//! ([`remediation::Remediation`]): the owner's remediation controller
//! recording a node's attempts and then asking for a Recover naming it,
//! interleaved with a user's operation, nodes going down and owner crashes.
//! It checks one operation at a time, the quorum guard, the in-flight limit
//! and `max_retry` across crashes, and seeded flaws
//! ([`remediation::RemediationFlaw`]) show each can fail. Its checks are in
//! `tests/remediation.rs`.

pub mod properties;
pub mod protocol;
pub mod provider;
pub mod remediation;
pub mod rollout;
pub mod store;

use protocol::{Action, State};
pub use rollout::{Rollout, RolloutFlaw};
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
    /// Lease losses: expiries of a lease its replica still uses, replicas
    /// giving theirs up after failed keep-alives, and peers deposing, or
    /// revoking the lease of, a replica whose session is alive.
    pub faults: u8,
    /// Provider reads that fail: the fencing describe of orphan recovery and
    /// the describe an upgrade is planned from.
    pub read_errors: u8,
    /// Drives that end early and leave their operation in the slot while
    /// their replica keeps its claim (a write that met an error other than
    /// a conflict); the next scan resumes the operation.
    pub stalls: u8,
    /// Calls the provider admits and applies later (a long call), instead
    /// of in the step it admits them.
    pub slow_calls: u8,
    /// Hand-overs of a gray failure: an owner that cannot reach the
    /// provider, its lease alive, releases a cluster whose operation it
    /// drives, its call possibly still in flight
    /// (`server/src/replication/gray_failure.rs`).
    pub handovers: u8,
    /// Joins through an etcd member lagging behind, which the replica takes
    /// for a restore: it sets a new epoch base in the fence record.
    pub rebases: u8,
    /// Restores of etcd from a snapshot of the deployment as it began
    /// (two: the same snapshot restored twice).
    pub restores: u8,
    /// Deposes: a peer, on evidence that a replica crashed, removes its
    /// member key and leaves its lease and owner keys to be drained. One
    /// of a replica whose session is alive (the evidence was wrong) also
    /// spends a lease loss.
    pub deposes: u8,
    pub orphans: OrphanPolicy,
    pub flaw: Option<Flaw>,
}

/// What a new owner does with an operation RUNNING under a lost epoch,
/// once it has fenced the provider (`--orphaned-operations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanPolicy {
    /// Fail it, as the reference does.
    Fail,
    /// Resume it at its persisted step while it was orphaned at most
    /// `limit` times, this loss counted; fail it after that.
    Resume { limit: u8 },
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
    /// An accept on a replica that does not own the cluster folds in the
    /// owner's claim as its view of the owner keys has it, without
    /// comparing the owner key.
    UnfencedAcceptForOwner,
    /// A new owner leaves an operation RUNNING under another epoch alone.
    NoOrphanRecovery,
    /// Orphan recovery fails (or resumes) the orphan without announcing
    /// its epoch to the provider first.
    UnfencedOrphans,
    /// Orphan recovery fails (or resumes) the orphan anyway when its
    /// fencing describe fails (Drover did, before it kept the slot and
    /// retried).
    OrphanFailedWhenFenceFails,
    /// A describe that fails plans no steps (Drover did, before a failed
    /// read failed the operation).
    PlanFromFailedRead,
    /// A drive resumed under the same claim starts again at the first step
    /// instead of the persisted one.
    ResumeFromFirstStep,
    /// The provider does not drain: a call of an older epoch that it
    /// admitted before a newer epoch arrived still applies afterwards.
    NoDrain,
    /// A claim does not compare the fence record: a replica goes on
    /// claiming under the base it read at its join after another replica
    /// set a new one (Drover did, before the fence record was compared).
    NoFenceCompare,
    /// A restore's new base is the restored record's plus one (the
    /// generation Drover had): restoring one snapshot twice repeats the
    /// first restore's epochs.
    BaseFromRestoredRecord,
    /// A takeover puts its owner key over a departed incarnation's (its
    /// lease and create revision compared) in one transaction instead of
    /// draining it and claiming afresh: etcd keeps a key's create
    /// revision across puts, so the new owner's epoch is the old one's.
    TakeoverByOverwrite,
}

impl Drover {
    /// The protocol as Drover runs it, within these bounds, with one failed
    /// provider read, one drive ending early and one slow call. Orphans
    /// are resumed once and failed the second time (Drover's default limit
    /// is 3; 1 here so that two lease losses reach both).
    pub fn new(replicas: usize, clusters: usize, requests: u8, faults: u8) -> Self {
        Drover {
            replicas,
            clusters,
            requests,
            faults,
            read_errors: 1,
            stalls: 1,
            slow_calls: 1,
            handovers: 0,
            rebases: 0,
            restores: 0,
            deposes: 0,
            orphans: OrphanPolicy::Resume { limit: 1 },
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
