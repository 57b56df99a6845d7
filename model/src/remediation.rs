//! A model of automatic node remediation (`server/src/health/`): the
//! owner's remediation controller asking for a Recover that names a
//! cluster's unhealthy nodes, interleaved with a user's operation, nodes
//! going down and owner crashes. Self-contained: its own state, actions and
//! properties, and its own [`Model`], apart from the cluster protocol's.
//!
//! What is modelled: one cluster of three control nodes and one or two
//! workers, each ready or not. Its records in etcd are the state (Running,
//! Alert, Recovering, Stopping, Stopped, Upgrading) with the operation slot,
//! the status (which nodes are ready, each node's remediation attempts and
//! the count of remediations asked), the request ids' index and the owner
//! key, bound to a replica's lease and created only while absent. The
//! status scanner moves a Running cluster with a node not ready to Alert.
//! The remediation controller runs on whichever replica believes it owns
//! the cluster, in three steps: decide from the records as read
//! (`decide::decide`: only in Alert with the slot empty; none when more
//! nodes are unhealthy than `max_unhealthy`; a node at most `max_retry`
//! times; at most `max_in_flight` nodes and one control node; the quorum
//! guard); write the named nodes' attempts and the count asked into the
//! status, fenced by the owner key and comparing the state and status as
//! read; submit the Recover naming them to the cluster's accept under the
//! request id `remediation-<uid>-<asked>`. The accept is one transaction:
//! it answers the operation a repeated request id created; else it refuses
//! while the slot holds an operation, or when the table does not admit the
//! request from the cluster's state; else it fills the slot and moves the
//! state. A user may submit a Stop or an Upgrade through the same accept.
//! An operation runs from its accept until it ends, at any step: a Recover
//! repairs the nodes it names (or fails and leaves them not ready) and
//! succeeds only when every node is then ready; the cluster moves by the
//! table (`drover-machine`, Drover's own).
//!
//! Each action is one atomic step: a decision (a read and a local step), a
//! fenced write, the accept, an operation ending, the scanner's move, the
//! owner key's creation, or a fault.
//!
//! # Guarantees
//!
//! Within the bounds checked (see `tests/remediation.rs`), in every
//! reachable state:
//! - at most one operation of the cluster is live (accepted and not
//!   ended): the slot holds it, and a remediation that lost the race to a
//!   user's operation (or the other way round) is refused;
//! - no remediation names a control node when, in the status as etcd held
//!   it when the remediation took effect (its attempts written), the ready
//!   control nodes besides it are fewer than a quorum (n/2+1) of all the
//!   control nodes: the attempts' write compares the status the decision
//!   read, so the decision's view was current;
//! - no remediation names more than `max_in_flight` nodes, nor more than
//!   one control node;
//! - the accepted remediations naming a node never outnumber `max_retry`,
//!   across owner crashes and zombies: each is counted in the status
//!   before it is asked for, under a request id of its own;
//! - no owner write lands once etcd has dropped the owner's lease.
//!
//! The checks are not vacuous: a remediation succeeds; a user's operation
//! and a remediation race and one is refused; an owner dies between
//! recording the attempts and submitting; the quorum guard holds back a
//! control node; a zombie and a new owner both believe they own the
//! cluster. Each negative test seeds one [`RemediationFlaw`] and the
//! checker finds its counterexample: without the quorum guard a second
//! control node is remediated while another is down; submitting before
//! recording lets a zombie's Recover go uncounted (its write after it,
//! fenced, misses) and be the answer to the new owner's submit of another
//! node under the same request id (the count asked was never raised), so
//! the zombie's node is remediated once more than `max_retry`, and it
//! judges the quorum on a status no compare checks (a control node's peer
//! going down after the decision); an accept that does not refuse a taken
//! slot runs two operations at once; without the in-flight limit a
//! remediation names every unhealthy node.
//!
//! # Assumptions
//!
//! - etcd is linearizable; a transaction's compares and writes are one
//!   step; an expiring (or revoked) lease deletes the owner key bound to it
//!   in the same step; a put bound to a lease etcd no longer holds fails.
//! - A key's mod revision is stood in for by a count of its writes, and
//!   the owner key's create revision by a count of the claims: each
//!   compare needs only that they change with every write.
//! - A lease can expire at any step (a crash, a pause, a peer's fast crash
//!   detection): the replica does not know until a keep-alive says so, and
//!   meanwhile acts on its view, a zombie. A crashed replica is a zombie
//!   that takes no further step. It then rejoins under a new lease.
//! - Any replica whose lease etcd holds may claim the unowned cluster: who
//!   claims matters for progress only.
//! - The status scanner keeps the status' nodes as the provider shows them
//!   (the remediator's own assumption): a node going down is a write of
//!   the status at once, so a decision made before it is stale and its
//!   attempts' write misses. The scanner's move to Alert is fenced and
//!   lands only for the owner; it is taken as the owner's step.
//! - The accept is not fenced by the owner key (a zombie's submit lands),
//!   and judges the request on the cluster as etcd holds it (the executor
//!   reads again when its cached view is refused).
//! - Time is not modelled: a node not ready is past its unhealthy timeout
//!   when the remediator looks, every retry period has passed, and no node
//!   is healthy for `min_healthy_period` (no attempts are reset, so
//!   `max_retry` bounds a node's remediations over the whole run).
//!
//! # Caveats
//!
//! - Bounds: 2 replicas, 3 control nodes and 1–2 workers, `max_in_flight`
//!   1, `max_retry` 2, `max_unhealthy` 2 (Drover's 40% of 4 or 5 nodes,
//!   rounded up), 2–3 nodes going down, 1–2 lease losses, one user request
//!   (see the tests).
//! - The guard is judged on the status, the only thing the remediator can
//!   know: a node that goes down after the attempts are written (before
//!   the accept, or while the Recover runs) is not held back by anything,
//!   in Drover or here.
//! - Not modelled: the maintenance window, pause, the unhealthy and
//!   startup timeouts, the retry period and `min_healthy_period` (see
//!   above); the message and short-circuit flag the remediator writes when
//!   it waits; the scanner's own Recover of an Alert cluster whose nodes
//!   are all ready and its Stop of one whose nodes are all off; an
//!   operation's steps at the provider, orphans and fencing (the cluster
//!   protocol's model covers them: here an operation runs from its accept
//!   to its end); a submit whose answer is lost; cancel; nodes added or
//!   removed.
//! - In Drover's order the request ids' index never answers a
//!   remediation's submit: each count asked is written once (the status
//!   compare), so each request id is submitted by the one replica that
//!   wrote it. It answers only under [`RemediationFlaw::SubmitBeforeRecord`].
//! - A fenced write whose compare misses is not a step: the replica keeps
//!   its decision until the records change, and then decides again (as
//!   the reconcile does after a miss).

use drover_machine::{self as machine, Admission, ClusterState, Event};
use stateright::{Model, Property};

pub type ReplicaId = usize;
pub type NodeId = usize;
/// A lease id; every lease ever granted has a fresh one.
pub type LeaseId = u8;
/// A set of nodes, one bit per node (node `i` is bit `i`).
pub type Nodes = u8;

/// The bounds of one check, and the flaw seeded, if any.
#[derive(Debug, Clone, Copy)]
pub struct Remediation {
    pub replicas: usize,
    /// Control nodes: nodes `0..control`.
    pub control: usize,
    /// Workers: the nodes after the control nodes.
    pub workers: usize,
    pub max_in_flight: usize,
    pub max_retry: u8,
    /// More unhealthy nodes than this and none is remediated.
    pub max_unhealthy: usize,
    /// Nodes going down.
    pub downs: u8,
    /// Lease losses (crashes, pauses, revokes).
    pub faults: u8,
    /// User requests (each a Stop or an Upgrade).
    pub requests: u8,
    pub flaw: Option<RemediationFlaw>,
}

/// A way to break remediation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemediationFlaw {
    /// The decision does not refuse a control node whose ready peers would
    /// not make a quorum (nor a second control node).
    NoQuorumGuard,
    /// The remediator submits the Recover first (under the request id of
    /// the count asked plus one, as read) and writes the attempts after,
    /// fenced and onto the status as etcd holds it.
    SubmitBeforeRecord,
    /// The accept neither refuses a taken slot nor compares the state as
    /// read: a request is admitted on the state its submitter read.
    NoSlotCheck,
    /// The decision names every unhealthy node it does not hold back.
    NoInFlightLimit,
}

impl Remediation {
    /// Two replicas, three control nodes and one worker, Drover's defaults
    /// but `max_retry` 2; one user request.
    pub fn new(downs: u8, faults: u8) -> Self {
        Remediation {
            replicas: 2,
            control: 3,
            workers: 1,
            max_in_flight: 1,
            max_retry: 2,
            max_unhealthy: 2,
            downs,
            faults,
            requests: 1,
            flaw: None,
        }
    }

    /// This model with `flaw` seeded.
    pub fn with(self, flaw: RemediationFlaw) -> Self {
        Remediation {
            flaw: Some(flaw),
            ..self
        }
    }

    pub fn has(&self, flaw: RemediationFlaw) -> bool {
        self.flaw == Some(flaw)
    }

    pub fn nodes(&self) -> usize {
        self.control + self.workers
    }

    /// Every node.
    pub fn all(&self) -> Nodes {
        ((1u16 << self.nodes()) - 1) as Nodes
    }

    pub fn is_control(&self, node: NodeId) -> bool {
        node < self.control
    }

    /// The control nodes in `nodes`.
    pub fn controls(&self, nodes: Nodes) -> usize {
        (0..self.control).filter(|&n| has(nodes, n)).count()
    }
}

fn has(nodes: Nodes, node: NodeId) -> bool {
    nodes & (1 << node) != 0
}

/// The owner key: the lease it is bound to and its create revision (here,
/// which claim created it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    pub lease: LeaseId,
    pub created: u8,
}

/// What an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The remediator's Recover, naming these nodes.
    Recover(Nodes),
    /// A user's.
    Stop,
    /// A user's.
    Upgrade,
}

impl Kind {
    fn event(self) -> Event {
        match self {
            Kind::Recover(_) => Event::RecoveryRequested,
            Kind::Stop => Event::StopRequested,
            Kind::Upgrade => Event::UpgradeRequested,
        }
    }
}

/// An operation accepted and not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Operation {
    pub kind: Kind,
    /// The state its accept moved the cluster to.
    pub held: ClusterState,
}

/// What etcd holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Etcd {
    /// The leases etcd holds, sorted.
    pub leases: Vec<LeaseId>,
    pub owner: Option<OwnerKey>,
    /// Claims made so far: the next owner key's create revision.
    pub claims: u8,
    pub state: ClusterState,
    /// The state key's writes: its mod revision.
    pub state_rev: u8,
    /// The operations accepted and not ended; the slot holds the last
    /// (more than one only under [`RemediationFlaw::NoSlotCheck`]).
    pub live: Vec<Operation>,
    /// The status: the nodes ready.
    pub ready: Nodes,
    /// The status: each node's remediation attempts.
    pub attempts: Vec<u8>,
    /// The status: the remediations asked (the request ids' count).
    pub asked: u8,
    /// The status key's writes: its mod revision.
    pub status_rev: u8,
    /// The request ids' index: the counts asked that an accept created an
    /// operation under.
    pub requests: Vec<u8>,
}

/// The records a decision was made on, and what it named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct View {
    pub nodes: Nodes,
    pub state_rev: u8,
    pub status_rev: u8,
    pub asked: u8,
}

/// Where a replica's remediation controller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    /// Decided: next, the attempts' write (or, under
    /// [`RemediationFlaw::SubmitBeforeRecord`], the submit).
    Decided(View),
    /// The attempts written under `asked`: next, the submit.
    Recorded {
        nodes: Nodes,
        asked: u8,
    },
    /// Submitted first (only under the flaw): next, the attempts' write.
    Submitted {
        nodes: Nodes,
        asked: u8,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Replica {
    /// The lease it believes it holds (etcd may have dropped it).
    pub lease: Option<LeaseId>,
    /// The owner key it created, while it believes it owns the cluster.
    pub owner: Option<OwnerKey>,
    pub phase: Phase,
}

/// Observations for the properties; unset until they happen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct History {
    /// An owner write landed while etcd no longer held its lease.
    pub unleased_write: bool,
    /// A remediation took effect naming a control node whose ready peers
    /// did not make a quorum.
    pub quorum_lost: bool,
    /// A remediation named more than `max_in_flight` nodes, or more than
    /// one control node.
    pub too_many: bool,
    /// Per node, the accepted remediations naming it.
    pub remediated: Vec<u8>,
    /// A remediation succeeded.
    pub succeeded: bool,
    /// A user's request was refused while a remediation held the slot, or
    /// a remediation while a user's operation did.
    pub raced: bool,
    /// A lease expired while its replica had written attempts it had not
    /// submitted yet.
    pub died_recorded: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub etcd: Etcd,
    pub replicas: Vec<Replica>,
    pub next_lease: LeaseId,
    pub downs_left: u8,
    pub faults_left: u8,
    pub requests_left: u8,
    pub history: History,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A replica whose lease etcd holds creates the absent owner key.
    Claim { replica: ReplicaId },
    /// A replica that believes it owns the cluster decides on the records
    /// as etcd holds them, idle or when its decision is stale.
    Decide { replica: ReplicaId },
    /// The attempts' write (fenced, comparing the state and status read).
    Record { replica: ReplicaId },
    /// The remediator's submit of its Recover to the accept.
    Submit { replica: ReplicaId },
    /// A user's request through the accept.
    Request { kind: Kind },
    /// The owner's scanner: a Running cluster with a node not ready moves
    /// to Alert (fenced, a CAS on the state).
    Scan,
    /// An operation ends; `works`: its steps worked at the provider (a
    /// Recover repaired the nodes it names).
    End { operation: usize, works: bool },
    /// A node goes down; the status shows it.
    NodeDown { node: NodeId },
    /// etcd drops a lease and the owner key bound to it; the replica does
    /// not know.
    LeaseExpires { lease: LeaseId },
    /// A keep-alive answers "lease not found": the replica forgets the
    /// cluster.
    LeaseNotFound { replica: ReplicaId },
    /// A replica without a lease grants a new one.
    Rejoin { replica: ReplicaId },
}

pub const ONE_OPERATION: &str = "at most one operation of the cluster is live";
pub const QUORUM: &str =
    "no remediation names a control node whose ready peers are fewer than a quorum";
pub const IN_FLIGHT: &str =
    "no remediation names more than max_in_flight nodes nor more than one control node";
pub const MAX_RETRY: &str = "the remediations naming a node never outnumber max_retry";
pub const FENCED: &str = "no owner write lands without its lease";
pub const SUCCEEDS: &str = "a remediation succeeds";
pub const RACE_REFUSED: &str = "a user's operation and a remediation race and one is refused";
pub const DIES_BETWEEN: &str = "an owner dies between recording the attempts and submitting";
pub const QUORUM_HOLDS_BACK: &str = "the quorum guard holds back a control node";
pub const TWO_OWNERS: &str = "a zombie and a new owner both believe they own the cluster";

impl Model for Remediation {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::new(self)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        state.actions(self, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut next = last.clone();
        next.step(self, action)?;
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_OPERATION, |_, s: &State| s.etcd.live.len() <= 1),
            Property::always(QUORUM, |_, s: &State| !s.history.quorum_lost),
            Property::always(IN_FLIGHT, |_, s: &State| !s.history.too_many),
            Property::always(MAX_RETRY, |model: &Remediation, s: &State| {
                s.history.remediated.iter().all(|&n| n <= model.max_retry)
            }),
            Property::always(FENCED, |_, s: &State| !s.history.unleased_write),
            Property::sometimes(SUCCEEDS, |_, s: &State| s.history.succeeded),
            Property::sometimes(RACE_REFUSED, |_, s: &State| s.history.raced),
            Property::sometimes(DIES_BETWEEN, |_, s: &State| s.history.died_recorded),
            Property::sometimes(QUORUM_HOLDS_BACK, |model: &Remediation, s: &State| {
                decide(model, &s.etcd).quorum_held
            }),
            Property::sometimes(TWO_OWNERS, |_, s: &State| {
                s.replicas.iter().filter(|r| r.owner.is_some()).count() > 1
            }),
        ]
    }
}

/// What the remediation controller decides on the records `etcd` holds
/// (`decide::decide` and its `pick`, without time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The nodes to remediate now; none: wait.
    pub nodes: Nodes,
    /// The quorum guard held back a control node it would otherwise have
    /// considered (not short-circuited, retries left).
    pub quorum_held: bool,
}

/// Decides on `etcd`'s records: only in Alert with the slot empty, none
/// past `max_unhealthy`, then each unhealthy node in order within its
/// retries, the quorum guard and the in-flight limit.
pub fn decide(model: &Remediation, etcd: &Etcd) -> Decision {
    let mut decision = Decision {
        nodes: 0,
        quorum_held: false,
    };
    let unhealthy: Vec<NodeId> = (0..model.nodes())
        .filter(|&n| !has(etcd.ready, n))
        .collect();
    if !etcd.live.is_empty() || etcd.state != ClusterState::Alert {
        return decision;
    }
    if unhealthy.is_empty() || unhealthy.len() > model.max_unhealthy {
        return decision;
    }
    let mut picked = 0usize;
    for node in unhealthy {
        if etcd.attempts[node] >= model.max_retry {
            continue;
        }
        if model.is_control(node)
            && !model.has(RemediationFlaw::NoQuorumGuard)
            && quorum_refuses(model, etcd.ready, node, decision.nodes)
        {
            decision.quorum_held = true;
            continue;
        }
        if model.has(RemediationFlaw::NoInFlightLimit) || picked < model.max_in_flight {
            decision.nodes |= 1 << node;
            picked += 1;
        }
    }
    decision
}

/// `decide::quorum_refusal`: another control node is already picked, or
/// the ready control nodes besides `node` are fewer than a quorum of all
/// (a single control node has none to lose).
fn quorum_refuses(model: &Remediation, ready: Nodes, node: NodeId, picked: Nodes) -> bool {
    if model.controls(picked) > 0 {
        return true;
    }
    !quorum_kept(model, ready, node)
}

/// Whether the ready control nodes besides control node `node` make a
/// quorum of all the control nodes.
fn quorum_kept(model: &Remediation, ready: Nodes, node: NodeId) -> bool {
    if model.control <= 1 {
        return true;
    }
    let others = (0..model.control)
        .filter(|&n| n != node && has(ready, n))
        .count();
    others > model.control / 2
}

/// The accept's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Created,
    /// The request id's operation, created earlier.
    Answered,
    Refused,
}

impl State {
    pub fn new(model: &Remediation) -> Self {
        let leases: Vec<LeaseId> = (0..model.replicas as LeaseId).collect();
        let replica = |lease| Replica {
            lease: Some(lease),
            owner: None,
            phase: Phase::Idle,
        };
        State {
            replicas: leases.iter().map(|&l| replica(l)).collect(),
            next_lease: model.replicas as LeaseId,
            etcd: Etcd {
                leases,
                owner: None,
                claims: 0,
                state: ClusterState::Running,
                state_rev: 0,
                live: Vec::new(),
                ready: model.all(),
                attempts: vec![0; model.nodes()],
                asked: 0,
                status_rev: 0,
                requests: Vec::new(),
            },
            downs_left: model.downs,
            faults_left: model.faults,
            requests_left: model.requests,
            history: History {
                remediated: vec![0; model.nodes()],
                ..History::default()
            },
        }
    }

    /// Every action enabled here. A fenced write whose compare would miss
    /// is still offered: [`State::step`] makes it no step.
    fn actions(&self, model: &Remediation, actions: &mut Vec<Action>) {
        self.world_actions(model, actions);
        for (replica, local) in self.replicas.iter().enumerate() {
            let Some(lease) = local.lease else {
                actions.push(Action::Rejoin { replica });
                continue;
            };
            if !self.etcd.leases.contains(&lease) {
                actions.push(Action::LeaseNotFound { replica });
            }
            if local.owner.is_none() {
                if self.etcd.owner.is_none() {
                    actions.push(Action::Claim { replica });
                }
                continue;
            }
            self.controller_actions(model, replica, local.phase, actions);
        }
    }

    /// The next step of `replica`'s remediation controller: a decision
    /// (when idle, or when the records changed since it decided), the
    /// attempts' write, the submit.
    fn controller_actions(
        &self,
        model: &Remediation,
        replica: ReplicaId,
        phase: Phase,
        actions: &mut Vec<Action>,
    ) {
        let submit_first = model.has(RemediationFlaw::SubmitBeforeRecord);
        match phase {
            Phase::Idle => actions.push(Action::Decide { replica }),
            Phase::Decided(view) => {
                if self.stale(view) {
                    actions.push(Action::Decide { replica });
                }
                // A stale decision's write would miss; the flawed submit
                // compares nothing the decision read.
                if submit_first {
                    actions.push(Action::Submit { replica });
                } else if !self.stale(view) {
                    actions.push(Action::Record { replica });
                }
            }
            Phase::Submitted { .. } => actions.push(Action::Record { replica }),
            Phase::Recorded { .. } => actions.push(Action::Submit { replica }),
        }
    }

    /// The steps of everything but the replicas' controllers: operations
    /// ending, the user, the scanner, faults.
    fn world_actions(&self, model: &Remediation, actions: &mut Vec<Action>) {
        for operation in 0..self.etcd.live.len() {
            for works in [true, false] {
                actions.push(Action::End { operation, works });
            }
        }
        if self.requests_left > 0 {
            actions.push(Action::Request { kind: Kind::Stop });
            actions.push(Action::Request {
                kind: Kind::Upgrade,
            });
        }
        let etcd = &self.etcd;
        if etcd.state == ClusterState::Running && etcd.ready != model.all() && etcd.owner.is_some()
        {
            actions.push(Action::Scan);
        }
        if self.downs_left > 0 && etcd.state != ClusterState::Stopped {
            for node in (0..model.nodes()).filter(|&n| has(etcd.ready, n)) {
                actions.push(Action::NodeDown { node });
            }
        }
        if self.faults_left > 0 {
            for &lease in &etcd.leases {
                actions.push(Action::LeaseExpires { lease });
            }
        }
    }

    /// Whether the records changed since `view` was read.
    fn stale(&self, view: View) -> bool {
        view.state_rev != self.etcd.state_rev || view.status_rev != self.etcd.status_rev
    }

    /// Takes `action`; `None` when it is no step (a compare missed, or
    /// nothing changed).
    fn step(&mut self, model: &Remediation, action: Action) -> Option<()> {
        match action {
            Action::Claim { replica } => self.claim(replica),
            Action::Decide { replica } => self.reconcile(model, replica),
            Action::Record { replica } => self.record(model, replica),
            Action::Submit { replica } => self.submit(model, replica),
            Action::Request { kind } => {
                self.requests_left -= 1;
                let state = self.etcd.state;
                self.accept(model, kind, None, state);
                Some(())
            }
            Action::Scan => {
                self.etcd.state = machine::next(self.etcd.state, Event::FaultsDetected)?;
                self.etcd.state_rev += 1;
                Some(())
            }
            Action::End { operation, works } => self.end(model, operation, works),
            Action::NodeDown { node } => {
                self.etcd.ready &= !(1 << node);
                self.etcd.status_rev += 1;
                self.downs_left -= 1;
                Some(())
            }
            Action::LeaseExpires { lease } => self.expire(lease),
            Action::LeaseNotFound { replica } => {
                self.replicas[replica] = Replica {
                    lease: None,
                    owner: None,
                    phase: Phase::Idle,
                };
                Some(())
            }
            Action::Rejoin { replica } => {
                let lease = self.next_lease;
                self.next_lease += 1;
                self.etcd.leases.push(lease);
                self.replicas[replica].lease = Some(lease);
                Some(())
            }
        }
    }

    /// The owner key put while absent, bound to the replica's lease.
    fn claim(&mut self, replica: ReplicaId) -> Option<()> {
        let lease = self.replicas[replica].lease?;
        if self.etcd.owner.is_some() || !self.etcd.leases.contains(&lease) {
            return None;
        }
        self.etcd.claims += 1;
        let key = OwnerKey {
            lease,
            created: self.etcd.claims,
        };
        self.etcd.owner = Some(key);
        self.replicas[replica].owner = Some(key);
        self.replicas[replica].phase = Phase::Idle;
        Some(())
    }

    /// The reconcile's read and decision: a remediation to record, or
    /// none (a stale decision dropped).
    fn reconcile(&mut self, model: &Remediation, replica: ReplicaId) -> Option<()> {
        let decision = decide(model, &self.etcd);
        let phase = if decision.nodes == 0 {
            Phase::Idle
        } else {
            Phase::Decided(View {
                nodes: decision.nodes,
                state_rev: self.etcd.state_rev,
                status_rev: self.etcd.status_rev,
                asked: self.etcd.asked,
            })
        };
        let local = &mut self.replicas[replica];
        if local.phase == phase {
            return None;
        }
        local.phase = phase;
        Some(())
    }

    /// Whether `replica`'s write lands: etcd still holds the owner key it
    /// created. Notes a write that lands without its lease.
    fn lands(&mut self, replica: ReplicaId) -> Option<()> {
        let key = self.replicas[replica].owner?;
        if self.etcd.owner != Some(key) {
            return None;
        }
        if !self.etcd.leases.contains(&key.lease) {
            self.history.unleased_write = true;
        }
        Some(())
    }

    /// The attempts' write: after the decision, comparing the state and
    /// status it read (`Remediator::write`); under
    /// [`RemediationFlaw::SubmitBeforeRecord`], after the submit, onto the
    /// status as etcd holds it (its own accept moved the state).
    fn record(&mut self, model: &Remediation, replica: ReplicaId) -> Option<()> {
        self.lands(replica)?;
        let (nodes, asked, next) = match self.replicas[replica].phase {
            Phase::Decided(view) => {
                if self.stale(view) {
                    return None;
                }
                self.judge(model, view.nodes);
                let asked = view.asked + 1;
                (
                    view.nodes,
                    asked,
                    Phase::Recorded {
                        nodes: view.nodes,
                        asked,
                    },
                )
            }
            Phase::Submitted { nodes, asked } => (nodes, asked.max(self.etcd.asked), Phase::Idle),
            _ => return None,
        };
        for node in (0..model.nodes()).filter(|&n| has(nodes, n)) {
            self.etcd.attempts[node] += 1;
        }
        self.etcd.asked = asked;
        self.etcd.status_rev += 1;
        self.replicas[replica].phase = next;
        Some(())
    }

    /// Notes a remediation of `nodes` taking effect while the status shows
    /// a control node among them whose ready peers make no quorum.
    fn judge(&mut self, model: &Remediation, nodes: Nodes) {
        let ready = self.etcd.ready;
        let lost = (0..model.control).any(|n| has(nodes, n) && !quorum_kept(model, ready, n));
        self.history.quorum_lost |= lost;
    }

    /// The remediator's submit of the Recover it recorded (or, under
    /// [`RemediationFlaw::SubmitBeforeRecord`], decided) under the request
    /// id of its count asked.
    fn submit(&mut self, model: &Remediation, replica: ReplicaId) -> Option<()> {
        let alert = ClusterState::Alert;
        match self.replicas[replica].phase {
            Phase::Recorded { nodes, asked } => {
                self.accept(model, Kind::Recover(nodes), Some(asked), alert);
                self.replicas[replica].phase = Phase::Idle;
            }
            Phase::Decided(view) => {
                // The flawed order: this is the remediation's first write.
                self.judge(model, view.nodes);
                let asked = view.asked + 1;
                let answer = self.accept(model, Kind::Recover(view.nodes), Some(asked), alert);
                self.replicas[replica].phase = match answer {
                    Answer::Refused => Phase::Idle,
                    Answer::Created | Answer::Answered => Phase::Submitted {
                        nodes: view.nodes,
                        asked,
                    },
                };
            }
            _ => return None,
        }
        Some(())
    }

    /// The accept's transaction: the operation a repeated request id
    /// created; else refused while the slot is taken or when the table
    /// does not admit `kind` from the cluster's state; else the operation
    /// created in the slot. `read`: the state its submitter read, on which
    /// it is admitted under [`RemediationFlaw::NoSlotCheck`].
    fn accept(
        &mut self,
        model: &Remediation,
        kind: Kind,
        request: Option<u8>,
        read: ClusterState,
    ) -> Answer {
        if request.is_some_and(|id| self.etcd.requests.contains(&id)) {
            return Answer::Answered;
        }
        let blind = model.has(RemediationFlaw::NoSlotCheck);
        let from = if blind { read } else { self.etcd.state };
        let held = self.etcd.live.last().map(|o| o.kind);
        if let Some(holder) = held.filter(|_| !blind) {
            let remediation = matches!(holder, Kind::Recover(_));
            self.history.raced |= remediation != matches!(kind, Kind::Recover(_));
            return Answer::Refused;
        }
        let Some(Admission::Moves(to)) = machine::admit(from, kind.event()) else {
            return Answer::Refused;
        };
        self.etcd.live.push(Operation { kind, held: to });
        self.etcd.state = to;
        self.etcd.state_rev += 1;
        if let Some(id) = request {
            self.etcd.requests.push(id);
        }
        if let Kind::Recover(nodes) = kind {
            let named = nodes.count_ones() as usize;
            self.history.too_many |= named > model.max_in_flight || model.controls(nodes) > 1;
            for node in (0..model.nodes()).filter(|&n| has(nodes, n)) {
                self.history.remediated[node] += 1;
            }
        }
        Answer::Created
    }

    /// An operation ends: a Recover that worked made the nodes it names
    /// ready; a Recover or an Upgrade succeeds only when every node is
    /// ready then (the health check). The one in the slot moves the state
    /// by the table and the status is written with it; one displaced from
    /// the slot (only under the flaw) finds it no longer its own.
    fn end(&mut self, model: &Remediation, operation: usize, works: bool) -> Option<()> {
        let op = self.etcd.live.get(operation).copied()?;
        let in_slot = operation + 1 == self.etcd.live.len();
        self.etcd.live.remove(operation);
        if !in_slot {
            return Some(());
        }
        let succeeded = match op.kind {
            Kind::Recover(nodes) => {
                if works {
                    self.etcd.ready |= nodes;
                }
                let up = works && self.etcd.ready == model.all();
                self.history.succeeded |= up && nodes != 0;
                up
            }
            Kind::Stop => works,
            Kind::Upgrade => works && self.etcd.ready == model.all(),
        };
        self.etcd.state =
            machine::final_state(op.held, false, false, succeeded, Event::OperationFailed);
        self.etcd.state_rev += 1;
        self.etcd.status_rev += 1;
        Some(())
    }

    /// etcd drops `lease` and the owner key bound to it.
    fn expire(&mut self, lease: LeaseId) -> Option<()> {
        let at = self.etcd.leases.iter().position(|l| *l == lease)?;
        self.etcd.leases.remove(at);
        if self.etcd.owner.is_some_and(|key| key.lease == lease) {
            self.etcd.owner = None;
        }
        let recorded = self
            .replicas
            .iter()
            .any(|r| r.lease == Some(lease) && matches!(r.phase, Phase::Recorded { .. }));
        self.history.died_recorded |= recorded;
        self.faults_left -= 1;
        Some(())
    }
}
