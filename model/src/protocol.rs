//! The replicas' actions, each one atomic step against the store: what a
//! replica reads, what its transactions compare, and what it believes.
//!
//! A replica's beliefs (its lease, its claims, the revisions it read for the
//! operation it drives) are local and may be stale: etcd can let a lease
//! expire at any step without the replica knowing, and the replica keeps
//! acting on its beliefs until it notices (a paused replica that wakes up is
//! exactly that). A call on its way to the provider is no replica's: it
//! outlives the drive and the session that sent it.

use crate::provider::{Provider, Token};
use crate::store::{
    Claim, ClusterId, Fence, FenceView, Guard, Kind, LeaseId, Operation, OperationId, OwnerKey,
    ReplicaId, Revision, Status, Store,
};
use crate::{Drover, Flaw, OrphanPolicy};
use drover_machine::{self as machine, Admission, ClusterState, Event};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub store: Store,
    pub replicas: Vec<Replica>,
    pub provider: Provider,
    /// Provider calls sent and not answered yet, sorted. A call outlives
    /// the drive that sent it and that drive's session: the provider takes
    /// or refuses it whenever it arrives.
    pub calls: Vec<Token>,
    /// Client requests still to be made.
    pub requests_left: u8,
    /// Lease losses still to happen (an expiry of a lease its replica
    /// still uses, or a replica giving its lease up).
    pub faults_left: u8,
    /// Provider reads still to fail.
    pub read_errors_left: u8,
    /// Drives still to end early.
    pub stalls_left: u8,
    /// Calls still to be admitted and applied later.
    pub slow_calls_left: u8,
    /// Gray-failure hand-overs still to happen.
    pub handovers_left: u8,
    /// Joins through a lagging etcd member, taken for a restore, still to
    /// happen.
    pub rebases_left: u8,
    /// Restores of the snapshot still to happen.
    pub restores_left: u8,
    /// Deposes still to happen (one of a replica whose session is alive
    /// spends a lease loss too).
    pub deposes_left: u8,
    /// The snapshot restores go back to: the revision and the fence record
    /// of the deployment as it began.
    pub snapshot: (Revision, Fence),
    pub history: History,
}

/// What happened, kept for the properties. The fields only ever go from
/// unset to set, and stay unset in a correct protocol except the
/// observations that show a scenario was reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct History {
    /// The first change of a cluster's state along no edge of the table.
    pub illegal_transition: Option<(ClusterState, ClusterState)>,
    /// An owner write took effect while etcd no longer held the writer's
    /// lease.
    pub write_without_lease: bool,
    /// The provider accepted a call for an operation that had already ended.
    pub call_after_end: bool,
    /// An owner released a cluster to its preferred member.
    pub released: bool,
    /// A fencing describe failed and orphan recovery kept the slot.
    pub fence_retried: bool,
    /// A drive resumed an operation RUNNING under its own claim.
    pub resumed: bool,
    /// An owner handed over a cluster whose operation it drove.
    pub handed_over: bool,
    /// The provider aborted a running call of an older epoch.
    pub drained: bool,
    /// A new owner claimed with an epoch not above one the provider had
    /// already seen for the cluster.
    pub stale_claim: bool,
    /// A replica took up the epoch base another replica set.
    pub followed_base: bool,
    /// A cluster was claimed after a restore.
    pub claimed_after_restore: bool,
    /// An owner write took effect while etcd held the writer's lease but
    /// the cluster's owner key was not the one its claim was made with
    /// (gone, or another's).
    pub write_off_key: bool,
    /// A departed incarnation's owner key was drained.
    pub owner_drained: bool,
    /// A replica deposed while alive wrote its member key again.
    pub reregistered: bool,
    /// A replica that does not own the cluster accepted an operation with
    /// its owner's claim folded in.
    pub accepted_for_owner: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Replica {
    /// The lease the replica believes it holds (etcd may have dropped it).
    pub session: Option<LeaseId>,
    /// The create revision and the epoch of each cluster it believes it
    /// owns.
    pub owned: Vec<Option<(Revision, Revision)>>,
    /// The operation it drives, per cluster.
    pub holding: Vec<Option<Holding>>,
    /// The fence record as it last read it: its claims use the base and
    /// compare the revision.
    pub fence: FenceView,
}

impl Replica {
    /// Its claim on `cluster`: only while it believes its lease alive, as
    /// `Ownership::claim` does.
    pub fn claim(&self, cluster: ClusterId) -> Option<Claim> {
        let (create_revision, epoch) = self.owned[cluster]?;
        Some(Claim {
            lease: self.session?,
            create_revision,
            epoch,
        })
    }

    /// Stops acting as an owner at once: every claim and every drive goes
    /// with the session. A call a drive already sent goes on
    /// ([`State::calls`]).
    fn drop_session(&mut self) {
        self.session = None;
        self.owned.fill(None);
        self.holding.fill(None);
    }
}

/// An operation a replica drives: the claim it drives it under and the
/// revisions its next write compares (`executor::run::Holding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holding {
    pub claim: Claim,
    pub operation: OperationId,
    pub state_revision: Revision,
    pub operation_revision: Revision,
    /// The cluster's state as read: completion moves it from there.
    pub held: ClusterState,
    pub phase: Phase,
    /// The step of the plan it is at (1-based; an orphan's is the step
    /// its record shows).
    pub step: u8,
}

impl Holding {
    /// The compares of this holding's next write; `fencing: false` drops
    /// the owner key's.
    pub fn guard(&self, cluster: ClusterId, fencing: bool) -> Guard {
        Guard {
            cluster,
            state_revision: self.state_revision,
            operation: self.operation,
            operation_revision: self.operation_revision,
            owner: fencing.then_some(self.claim),
        }
    }

    /// Whether this drive waits for the answer to `call`.
    pub fn awaits(&self, call: Token) -> bool {
        self.phase == Phase::Calling && self.token(call.cluster) == call
    }

    fn token(&self, cluster: ClusterId) -> Token {
        Token {
            cluster,
            epoch: self.claim.epoch,
            operation: self.operation,
            step: self.step,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Read PENDING, planned from the nodes: next, the describe.
    Pending,
    /// Next, the write that records the operation RUNNING under this claim
    /// at this step (`save_operation` at a step boundary).
    Boundary,
    /// The step's call is out: next, the provider's answer.
    Calling,
    /// Every step worked, or one failed: next, completion.
    Done { ok: bool },
    /// Read RUNNING under another epoch: next, the fencing describe, and
    /// then resuming the orphan at its step (a boundary) or failing it.
    Fencing { resume: bool },
    /// Fenced: next, failing the orphan.
    Orphan,
}

impl Phase {
    /// Whether the next step is a write.
    pub fn writes_next(self) -> bool {
        matches!(self, Phase::Boundary | Phase::Done { .. } | Phase::Orphan)
    }

    /// Whether the next step is a fenced provider read.
    pub fn reads_next(self) -> bool {
        matches!(self, Phase::Pending | Phase::Fencing { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client's request, accepted by a replica that does not claim it:
    /// one transaction on the state key's revision with no fencing, so
    /// which replica serves it does not matter and the action names none.
    Accept { cluster: ClusterId, kind: Kind },
    /// The same request accepted on the owner, with the claim folded in:
    /// the record is written RUNNING at the first step under the owner's
    /// epoch, the owner key compared, and the owner drives it at once.
    /// Only for a kind planned without the provider.
    AcceptClaimed {
        replica: ReplicaId,
        cluster: ClusterId,
        kind: Kind,
    },
    /// The same request accepted on a replica that does not own the
    /// cluster, with the owner's claim folded in: the accepting replica
    /// takes the owner key (lease, create revision, epoch) from its view of
    /// the owner keys, which may be stale (here: `owner`'s belief), compares
    /// it, and writes the record RUNNING at the first step under that
    /// epoch. Nobody is told: the owner finds the operation in its slot,
    /// RUNNING under its own claim, and runs it from the step recorded.
    AcceptForOwner {
        owner: ReplicaId,
        cluster: ClusterId,
        kind: Kind,
    },
    /// The preferred live member puts the absent owner key, bound to its
    /// lease; the new key's create revision is the epoch.
    Claim {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// An owner that is no longer preferred deletes its owner key (fenced).
    Release {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// An owner that cannot reach the provider (a gray failure: its lease
    /// lives) deletes its owner key (fenced) while it drives the cluster's
    /// operation, and stops driving it; spends a hand-over.
    HandOver {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// The owner reads the slot's operation and the revisions it will
    /// compare.
    Read {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// A fenced DescribeCluster: the one an upgrade is planned from, or
    /// orphan recovery's announcement of the new epoch. `fails` spends a
    /// read error.
    Describe {
        replica: ReplicaId,
        cluster: ClusterId,
        fails: bool,
    },
    /// Records the operation RUNNING under the owner's epoch at its step,
    /// and sends the step's call.
    Record {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// A call arrives at the provider, which checks its token and applies
    /// it in one step; `succeeds` is the step's outcome if it takes it. The
    /// drive that sent it, if it still runs, gets the answer.
    Land { call: Token, succeeds: bool },
    /// A call arrives at the provider, which checks its token and admits it
    /// to apply later (a long call); spends a slow call.
    Admit { call: Token },
    /// An admitted call is applied and answered.
    Apply { call: Token, succeeds: bool },
    /// Ends the operation (succeeded, failed, or failed as an orphan):
    /// moves the cluster by the table and clears the slot.
    Finish {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// The drive ends early before a write; its replica keeps the claim.
    Stall {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// etcd drops the lease and every key bound to it; its replica does not
    /// know.
    LeaseExpires { lease: LeaseId },
    /// A live peer revokes another replica's lease: a deposed incarnation's
    /// once no owner key is bound to it, or any at any step, whatever the
    /// keep-alives did (after the deadline, or a wrong judgement): to etcd
    /// an expiry; the replica does not know.
    Revoke { by: ReplicaId, lease: LeaseId },
    /// A live peer, on evidence that the replica of `lease` crashed,
    /// deletes its member key only (compared bound to `lease`), leaving
    /// the lease and its owner keys: the survivors drain those and claim
    /// its clusters, and the lease is revoked later. Like a revoke, it may
    /// hit a replica that is alive; the replica does not know.
    Depose { by: ReplicaId, lease: LeaseId },
    /// In an ownership pass, the preferred member deletes a cluster's
    /// owner key bound to a departed incarnation's lease (one that no
    /// member key held when the drainer read the key: [`OwnerKey::departed`]),
    /// comparing the key's lease and create revision as read; it claims
    /// the cluster in a later step.
    Drain {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// A replica whose lease lives as far as it knows finds its member key
    /// gone (deposed while alive) and puts it again, bound to that lease.
    Reregister { replica: ReplicaId },
    /// A member's ownership pass finds the owner key it believes its own
    /// gone or another's (drained while it was deposed) and forgets the
    /// claim; its drive stops at its claim check, its call in flight goes
    /// on.
    Forget {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// A keep-alive answers "lease not found": the replica drops its
    /// session, its claims and its drives.
    LeaseNotFound { replica: ReplicaId },
    /// Keep-alives failed for longer than the TTL while etcd still holds the
    /// lease: the replica gives up on it (it expires later, on its own).
    KeepAliveTimeout { replica: ReplicaId },
    /// A replica without a session grants a new lease and rebinds its
    /// member key to it, having revoked its previous incarnation's lease
    /// if its member key still holds it (a deposed incarnation's is left
    /// to the deposer), and reads the fence record: when it was
    /// written in another history of etcd (a restore since), the replica
    /// writes it anew with a new base (`restore::fence_at_join`).
    Rejoin { replica: ReplicaId },
    /// A replica that joined through an etcd member lagging behind takes
    /// it for a restore: it writes the fence record anew with a new base
    /// (compared with the record it read) and claims under it; spends a
    /// rebase.
    Rebase { replica: ReplicaId },
    /// A replica whose claim failed on the fence record's compare reads
    /// the record again and claims under it from now on
    /// (`Ownership::reread_fence`).
    RereadFence { replica: ReplicaId },
    /// etcd restored from the snapshot, every replica stopped before and
    /// started after (PRODUCTION.md), with no call in flight and every
    /// operation ended; spends a restore.
    Restore,
}

impl Kind {
    fn event(self) -> Event {
        match self {
            Kind::Start => Event::StartRequested,
            Kind::Stop => Event::StopRequested,
            Kind::Upgrade => Event::UpgradeRequested,
        }
    }

    /// Whether its go-ahead moves the cluster when it works, as the
    /// executor says of its kinds: a start's does (a destroy's too, but
    /// destroys are outside the model).
    fn go_ahead_moves(self) -> bool {
        matches!(self, Kind::Start)
    }
}

const KINDS: [Kind; 3] = [Kind::Start, Kind::Stop, Kind::Upgrade];

/// Whether the provider drains older epochs, as Drover's contract says.
fn drains(model: &Drover) -> bool {
    !model.has(Flaw::NoDrain)
}

/// The member `cluster` should be owned by. Stands in for rendezvous
/// hashing: the model only needs every replica to compute the same answer
/// from the same member list, and the clusters to prefer different members.
fn preferred(store: &Store, cluster: ClusterId) -> Option<ReplicaId> {
    let replicas = store.members.len();
    store
        .live_members()
        .max_by_key(|replica| (replica + cluster) % replicas)
}

impl State {
    pub fn new(model: &Drover) -> Self {
        let store = Store::new(model.replicas, model.clusters);
        let replica = |replica: ReplicaId| Replica {
            session: store.members[replica],
            owned: vec![None; model.clusters],
            holding: vec![None; model.clusters],
            fence: store.fence.view(),
        };
        State {
            replicas: (0..model.replicas).map(replica).collect(),
            provider: Provider::new(model.clusters),
            calls: Vec::new(),
            requests_left: model.requests,
            faults_left: model.faults,
            read_errors_left: model.read_errors,
            stalls_left: model.stalls,
            slow_calls_left: model.slow_calls,
            handovers_left: model.handovers,
            rebases_left: model.rebases,
            restores_left: model.restores,
            deposes_left: model.deposes,
            snapshot: (store.revision, store.fence),
            history: History::default(),
            store,
        }
    }

    /// Every action enabled in this state. A transaction whose compares
    /// would miss is still offered: [`State::step`] turns it into no step.
    pub fn actions(&self, actions: &mut Vec<Action>) {
        self.requests(actions);
        for (replica, local) in self.replicas.iter().enumerate() {
            let Some(lease) = local.session else {
                actions.push(Action::Rejoin { replica });
                continue;
            };
            if !self.store.leases.contains(&lease) {
                actions.push(Action::LeaseNotFound { replica });
            } else {
                if self.faults_left > 0 {
                    actions.push(Action::KeepAliveTimeout { replica });
                }
                if self.store.members[replica].is_none() {
                    actions.push(Action::Reregister { replica });
                }
            }
            if self.rebases_left > 0 {
                actions.push(Action::Rebase { replica });
            }
            if local.fence != self.store.fence.view() {
                actions.push(Action::RereadFence { replica });
            }
            for cluster in 0..self.store.states.len() {
                self.reconcile(replica, cluster, actions);
            }
        }
        for (i, &call) in self.calls.iter().enumerate() {
            if self.calls[..i].contains(&call) {
                continue;
            }
            // A refused call fails whatever the step would have done: one
            // outcome only.
            let refused = self.provider.refuses(call.cluster, call.epoch);
            for succeeds in [false, true].into_iter().take(if refused { 1 } else { 2 }) {
                actions.push(Action::Land { call, succeeds });
            }
            if !refused && self.slow_calls_left > 0 {
                actions.push(Action::Admit { call });
            }
        }
        for &call in &self.provider.running {
            for succeeds in [false, true] {
                actions.push(Action::Apply { call, succeeds });
            }
        }
        self.lease_losses(actions);
        if self.restores_left > 0 && self.quiescent() {
            actions.push(Action::Restore);
        }
    }

    /// No call in flight or running at the provider, and every operation
    /// ended: when the model lets etcd be restored.
    fn quiescent(&self) -> bool {
        self.calls.is_empty()
            && self.provider.running.is_empty()
            && self.store.operations.iter().all(|o| o.status.is_terminal())
    }

    /// Leases etcd drops, and member keys peers delete: a lease its
    /// replica has given up on expires for sure; one still in use expires,
    /// or a live peer deposes its replica or revokes it, only as one of the
    /// budgeted faults. A revoke of a lease no member key holds, once no
    /// owner key is bound to it either, is free: the deposer's, once the
    /// owner keys are drained (the depose was the fault, if its replica was
    /// alive; a revoke after the deadline, keys left, is a fault of its
    /// own).
    fn lease_losses(&self, actions: &mut Vec<Action>) {
        for &lease in &self.store.leases {
            let in_use = self.replicas.iter().any(|r| r.session == Some(lease));
            let member = self.store.is_member_lease(lease);
            let budget = !in_use || self.faults_left > 0;
            if budget {
                actions.push(Action::LeaseExpires { lease });
            }
            // A peer acts on its own member key's lease being alive.
            let mut peers = self.store.members.iter().enumerate().filter(|(by, m)| {
                m.is_some_and(|m| m != lease && self.replicas[*by].session == Some(m))
            });
            let drained = !member && !self.store.binds_owner_key(lease);
            if budget || drained {
                for (by, _) in peers.clone() {
                    actions.push(Action::Revoke { by, lease });
                }
            }
            // Which peer deposes changes nothing: the first stands for all.
            let depose = budget && member && self.deposes_left > 0;
            if let Some((by, _)) = peers.next().filter(|_| depose) {
                actions.push(Action::Depose { by, lease });
            }
        }
    }

    /// The requests a client can make now, on any replica or on the owner.
    fn requests(&self, actions: &mut Vec<Action>) {
        if self.requests_left == 0 {
            return;
        }
        for (cluster, key) in self.store.states.iter().enumerate() {
            if key.slot.is_some() {
                continue;
            }
            for kind in KINDS {
                if machine::admit(key.state, kind.event()).is_none() {
                    continue;
                }
                actions.push(Action::Accept { cluster, kind });
                if kind.needs_nodes() {
                    continue;
                }
                for (replica, local) in self.replicas.iter().enumerate() {
                    if local.claim(cluster).is_some() && local.holding[cluster].is_none() {
                        actions.push(Action::AcceptClaimed {
                            replica,
                            cluster,
                            kind,
                        });
                    }
                    if local.claim(cluster).is_some() {
                        actions.push(Action::AcceptForOwner {
                            owner: replica,
                            cluster,
                            kind,
                        });
                    }
                }
            }
        }
    }

    /// What `replica`, whose session is alive as far as it knows, does next
    /// about `cluster`.
    fn reconcile(&self, replica: ReplicaId, cluster: ClusterId, actions: &mut Vec<Action>) {
        let local = &self.replicas[replica];
        // Reconciling needs the replica in the member list it reads.
        let member = self.store.members[replica].is_some();
        let mine = preferred(&self.store, cluster) == Some(replica);
        let owner = self.store.owners[cluster];
        let holding = match (local.owned[cluster], local.holding[cluster]) {
            (None, _) => {
                match owner {
                    _ if !member || !mine => {}
                    None => actions.push(Action::Claim { replica, cluster }),
                    // A departed incarnation's key: drained, then claimed.
                    Some(owner) if owner.departed => {
                        actions.push(Action::Drain { replica, cluster });
                    }
                    Some(_) => {}
                }
                return;
            }
            (Some(_), _) if member && self.lost(replica, cluster) => {
                actions.push(Action::Forget { replica, cluster });
                // Until then it goes on as before (its writes miss).
                match local.holding[cluster] {
                    None => return self.idle_owner(replica, cluster, false, actions),
                    Some(holding) => holding,
                }
            }
            (Some(_), None) => {
                return self.idle_owner(replica, cluster, member && !mine, actions);
            }
            (Some(_), Some(holding)) => holding,
        };
        if self.handovers_left > 0 {
            actions.push(Action::HandOver { replica, cluster });
        }
        match holding.phase {
            Phase::Pending | Phase::Fencing { .. } => {
                actions.push(Action::Describe {
                    replica,
                    cluster,
                    fails: false,
                });
                if self.read_errors_left > 0 {
                    actions.push(Action::Describe {
                        replica,
                        cluster,
                        fails: true,
                    });
                }
            }
            Phase::Boundary => actions.push(Action::Record { replica, cluster }),
            Phase::Calling => {}
            Phase::Done { .. } | Phase::Orphan => actions.push(Action::Finish { replica, cluster }),
        }
        // Only past a multi-step operation's first step, where resuming at
        // the recorded step differs from starting again.
        let stalls = matches!(holding.phase, Phase::Boundary | Phase::Done { .. });
        if self.stalls_left > 0 && stalls && holding.step > 1 {
            actions.push(Action::Stall { replica, cluster });
        }
    }

    /// What an owner that drives nothing on `cluster` does: releases it
    /// (`release`: a member another is preferred for) or drives the
    /// slot's operation.
    fn idle_owner(
        &self,
        replica: ReplicaId,
        cluster: ClusterId,
        release: bool,
        actions: &mut Vec<Action>,
    ) {
        if release {
            // The real reconcile reads the slot empty and then releases
            // without comparing it, so a request accepted in between is
            // released with the cluster: offered whenever nothing is in
            // flight here.
            actions.push(Action::Release { replica, cluster });
        }
        if self.store.states[cluster].slot.is_some() {
            actions.push(Action::Read { replica, cluster });
        }
    }

    /// Whether `replica` believes it owns `cluster` under an owner key that
    /// is gone or another's while etcd still holds its lease (its key was
    /// drained while it was deposed). One whose lease is gone drops its
    /// session instead.
    fn lost(&self, replica: ReplicaId, cluster: ClusterId) -> bool {
        let local = &self.replicas[replica];
        local
            .claim(cluster)
            .is_some_and(|claim| !self.store.owner_is(cluster, claim))
            && local
                .session
                .is_some_and(|lease| self.store.leases.contains(&lease))
    }

    /// The state after `action`, or `None` when it changes nothing (a
    /// transaction whose compares miss writes nothing, and its replica
    /// stops driving; see the property "a missed compare comes from a dead
    /// claim" for why that loses no behaviour).
    pub fn step(&self, model: &Drover, action: Action) -> Option<State> {
        let mut next = self.clone();
        match action {
            Action::Accept { cluster, kind } => {
                next.accept(cluster, kind, Status::Pending)?;
            }
            Action::AcceptClaimed {
                replica,
                cluster,
                kind,
            } => next.accept_claimed(model, replica, cluster, kind)?,
            Action::AcceptForOwner {
                owner,
                cluster,
                kind,
            } => next.accept_for_owner(model, owner, cluster, kind)?,
            Action::Claim { replica, cluster } => next.claim(model, replica, cluster)?,
            Action::Release { replica, cluster } => next.release(replica, cluster)?,
            Action::HandOver { replica, cluster } => next.hand_over(replica, cluster)?,
            Action::Read { replica, cluster } => next.read(model, replica, cluster)?,
            Action::Describe {
                replica,
                cluster,
                fails,
            } => next.describe(model, replica, cluster, fails)?,
            Action::Record { replica, cluster } => next.record(model, replica, cluster)?,
            Action::Land { call, succeeds } => next.land(model, call, succeeds)?,
            Action::Admit { call } => next.admit(model, call)?,
            Action::Apply { call, succeeds } => next.apply(call, succeeds)?,
            Action::Finish { replica, cluster } => next.finish(model, replica, cluster)?,
            Action::Stall { replica, cluster } => {
                next.stalls_left -= 1;
                next.replicas[replica].holding[cluster] = None;
            }
            Action::LeaseExpires { lease } => next.lose_lease(lease, false),
            Action::Revoke { lease, .. } => next.lose_lease(lease, true),
            Action::Depose { lease, .. } => next.depose(lease)?,
            Action::Drain { replica, cluster } => next.drain(model, replica, cluster)?,
            Action::Reregister { replica } => next.reregister(replica)?,
            Action::Forget { replica, cluster } => {
                next.replicas[replica].owned[cluster] = None;
                next.replicas[replica].holding[cluster] = None;
            }
            Action::LeaseNotFound { replica } => next.replicas[replica].drop_session(),
            Action::KeepAliveTimeout { replica } => {
                next.faults_left -= 1;
                next.replicas[replica].drop_session();
            }
            Action::Rejoin { replica } => next.rejoin(model, replica),
            Action::Rebase { replica } => {
                next.rebases_left -= 1;
                next.replicas[replica].fence = next.store.rebase(false);
            }
            Action::RereadFence { replica } => {
                next.history.followed_base = true;
                next.replicas[replica].fence = next.store.fence.view();
            }
            Action::Restore => {
                next.restores_left -= 1;
                next.replicas.iter_mut().for_each(Replica::drop_session);
                let (revision, fence) = next.snapshot;
                next.store.restore(revision, fence);
            }
        }
        // Checked here, for every action, against the state etcd held just
        // before: a write computed from a stale read would show up as a
        // change along no edge.
        for (before, after) in self.store.states.iter().zip(&next.store.states) {
            if before.state != after.state && !machine::is_edge(before.state, after.state) {
                next.history
                    .illegal_transition
                    .get_or_insert((before.state, after.state));
            }
        }
        Some(next)
    }

    /// `Membership::join`: revokes its own lost incarnation's lease (its
    /// member key still bound to a lease etcd holds), grants a new one,
    /// and reads the fence record, writing it anew when it was written in
    /// another history of etcd.
    fn rejoin(&mut self, model: &Drover, replica: ReplicaId) {
        if let Some(old) = self.store.members[replica] {
            self.store.expire(old);
        }
        self.replicas[replica].session = Some(self.store.join(replica));
        self.replicas[replica].fence = match self.store.fence.history == self.store.history {
            true => self.store.fence.view(),
            false => self.store.rebase(model.has(Flaw::BaseFromRestoredRecord)),
        };
    }

    /// etcd drops `lease` and every key bound to it: a fault if its
    /// replica still uses it, except a peer's revoke of a lease no key is
    /// bound to (the deposer's, once the owner keys are drained: the
    /// depose was the fault).
    fn lose_lease(&mut self, lease: LeaseId, revoke: bool) {
        let in_use = self.replicas.iter().any(|r| r.session == Some(lease));
        let drained = !self.store.is_member_lease(lease) && !self.store.binds_owner_key(lease);
        if in_use && !(revoke && drained) {
            self.faults_left -= 1;
        }
        self.store.expire(lease);
    }

    /// A peer deletes the member key bound to `lease`: spends a depose, and
    /// a lease loss if its replica still uses the lease.
    fn depose(&mut self, lease: LeaseId) -> Option<()> {
        let in_use = self.replicas.iter().any(|r| r.session == Some(lease));
        self.store.depose(lease).then_some(())?;
        self.deposes_left -= 1;
        if in_use {
            self.faults_left -= 1;
        }
        Some(())
    }

    /// Deletes the departed owner key of `cluster` if it is still the key
    /// read (one step: read and transaction collapsed, as a transaction
    /// whose compares miss writes nothing); the claim follows later.
    fn drain(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let seen = self.store.owners[cluster]?;
        if model.has(Flaw::TakeoverByOverwrite) {
            self.take(model, replica, cluster, Some(seen.create_revision))?;
        } else {
            self.store.drain(cluster, seen).then_some(())?;
        }
        self.history.owner_drained = true;
        Some(())
    }

    /// `Ownership::reregister`: puts the member key again, bound to the
    /// session's lease, which fails if etcd no longer holds it.
    fn reregister(&mut self, replica: ReplicaId) -> Option<()> {
        let lease = self.replicas[replica].session?;
        self.store.reregister(replica, lease).then_some(())?;
        self.history.reregistered = true;
        Some(())
    }

    /// Records an owner write taking effect, and whether etcd still held
    /// the writer's lease at that moment.
    fn owner_wrote(&mut self, lease: LeaseId) {
        if !self.store.leases.contains(&lease) {
            self.history.write_without_lease = true;
        }
    }

    /// Records a fenced owner write under `claim` taking effect, and
    /// whether, etcd holding the lease, the owner key was still the one
    /// `claim` was made with (a deposed owner's lease lives on: the key is
    /// its only fence). Without the lease it is a write without its lease.
    fn fenced_wrote(&mut self, cluster: ClusterId, claim: Claim) {
        self.owner_wrote(claim.lease);
        if self.store.leases.contains(&claim.lease) && !self.store.owner_is(cluster, claim) {
            self.history.write_off_key = true;
        }
    }

    /// `Operations::accept`: compare the state key's revision (the slot is
    /// empty as read), move the state, fill the slot, write the record with
    /// `status`. The new operation, the revision and the state entered.
    fn accept(
        &mut self,
        cluster: ClusterId,
        kind: Kind,
        status: Status,
    ) -> Option<(OperationId, Revision, ClusterState)> {
        let from = self.store.states[cluster].state;
        let admission = machine::admit(from, kind.event())?;
        let (entered, go_ahead) = match admission {
            Admission::Moves(to) => (to, false),
            Admission::GoAhead => (from, true),
        };
        let id = self.store.operations.len();
        let revision = self.store.commit();
        self.store.operations.push(Operation {
            cluster,
            kind,
            go_ahead,
            status,
            orphaned: 0,
            mod_revision: revision,
        });
        let key = &mut self.store.states[cluster];
        key.state = entered;
        key.slot = Some(id);
        key.mod_revision = revision;
        self.requests_left -= 1;
        Some((id, revision, entered))
    }

    /// The accept on the owner (`Executor::submit` with its claim): the same
    /// transaction also compares the owner key and writes the record
    /// RUNNING at the first step under the owner's epoch; the owner's drive
    /// starts from what it wrote.
    fn accept_claimed(
        &mut self,
        model: &Drover,
        replica: ReplicaId,
        cluster: ClusterId,
        kind: Kind,
    ) -> Option<()> {
        let local = &self.replicas[replica];
        let claim = local.claim(cluster)?;
        if kind.needs_nodes() || local.holding[cluster].is_some() {
            return None;
        }
        let fenced = !model.has(Flaw::NoOwnerCompare) && !model.has(Flaw::UnfencedClaimAtAccept);
        if fenced && !self.store.owner_is(cluster, claim) {
            return None;
        }
        self.fenced_wrote(cluster, claim);
        let status = Status::Running {
            epoch: claim.epoch,
            step: 1,
        };
        let (operation, revision, held) = self.accept(cluster, kind, status)?;
        let holding = Holding {
            claim,
            operation,
            state_revision: revision,
            operation_revision: revision,
            held,
            phase: Phase::Calling,
            step: 1,
        };
        self.send(replica, cluster, holding);
        Some(())
    }

    /// The accept on another replica (`Executor::claim_for_owner`): the
    /// same transaction compares the owner key as the accepting replica's
    /// view has it (`owner`'s claim, whether or not it still holds) and
    /// writes the record RUNNING at the first step under its epoch. The
    /// owner is not told; its next read of the slot runs it.
    fn accept_for_owner(
        &mut self,
        model: &Drover,
        owner: ReplicaId,
        cluster: ClusterId,
        kind: Kind,
    ) -> Option<()> {
        let claim = self.replicas[owner].claim(cluster)?;
        if kind.needs_nodes() {
            return None;
        }
        if !model.has(Flaw::UnfencedAcceptForOwner) && !self.store.owner_is(cluster, claim) {
            return None;
        }
        self.fenced_wrote(cluster, claim);
        let status = Status::Running {
            epoch: claim.epoch,
            step: 1,
        };
        self.accept(cluster, kind, status)?;
        self.history.accepted_for_owner = true;
        Some(())
    }

    /// `Ownership::try_claim`: compare the owner key absent and the fence
    /// record as this replica read it, put the owner key bound to the
    /// replica's lease; the epoch is the record's base plus the key's
    /// create revision. The replica is in the member list, so etcd still
    /// holds that lease (its member key is bound to it).
    fn claim(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        self.take(model, replica, cluster, None)
    }

    /// Puts the owner key of `cluster` bound to `replica`'s lease: a new
    /// key, or (`over`, a flaw) one put over the departed key, which keeps
    /// that key's create revision.
    fn take(
        &mut self,
        model: &Drover,
        replica: ReplicaId,
        cluster: ClusterId,
        over: Option<Revision>,
    ) -> Option<()> {
        let local = &self.replicas[replica];
        let lease = local.session?;
        let view = local.fence;
        if !model.has(Flaw::NoFenceCompare) && self.store.fence.mod_revision != view.revision {
            return None;
        }
        self.owner_wrote(lease);
        // A put, new key or not, is a write.
        let revision = self.store.commit();
        let create_revision = over.unwrap_or(revision);
        let epoch = view.base + create_revision;
        if self
            .provider
            .newest(cluster)
            .is_some_and(|seen| epoch <= seen)
        {
            self.history.stale_claim = true;
        }
        self.history.claimed_after_restore |= self.store.history > 0;
        self.store.owners[cluster] = Some(OwnerKey {
            replica,
            lease,
            create_revision,
            departed: false,
        });
        self.replicas[replica].owned[cluster] = Some((create_revision, epoch));
        Some(())
    }

    /// `Ownership::release`: delete the owner key if it is still ours.
    fn release(&mut self, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        self.delete_owner_key(replica, cluster)?;
        self.history.released = true;
        Some(())
    }

    /// `Ownership::hand_over_if_passed_over`: the same release of a
    /// cluster whose operation this replica drives; the drive ends, its
    /// call in flight goes on.
    fn hand_over(&mut self, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        self.delete_owner_key(replica, cluster)?;
        self.replicas[replica].holding[cluster] = None;
        self.handovers_left -= 1;
        self.history.handed_over = true;
        Some(())
    }

    /// Deletes `cluster`'s owner key if it is still `replica`'s (compared),
    /// and forgets the claim.
    fn delete_owner_key(&mut self, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let claim = self.replicas[replica].claim(cluster)?;
        if !self.store.owner_is(cluster, claim) {
            return None;
        }
        self.fenced_wrote(cluster, claim);
        self.store.commit();
        self.store.owners[cluster] = None;
        self.replicas[replica].owned[cluster] = None;
        Some(())
    }

    /// The start of `Executor::drive`: read the slot's operation and decide
    /// where to start.
    fn read(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let claim = self.replicas[replica].claim(cluster)?;
        let key = &self.store.states[cluster];
        let operation = key.slot?;
        let record = &self.store.operations[operation];
        let (phase, step) = match record.status {
            Status::Pending if record.kind.needs_nodes() => (Phase::Pending, 1),
            Status::Pending => (Phase::Boundary, 1),
            // Its own drive ended early, or an accept on another replica
            // claimed it for this owner (the record as the accept wrote
            // it): run from the step recorded.
            Status::Running { epoch, step } if epoch == claim.epoch => {
                let accepted_for_it = record.mod_revision == key.mod_revision;
                self.history.resumed |= !accepted_for_it;
                if model.has(Flaw::ResumeFromFirstStep) {
                    (Phase::Boundary, 1)
                } else {
                    (Phase::Calling, step)
                }
            }
            Status::Running { .. } if model.has(Flaw::NoOrphanRecovery) => return None,
            Status::Running { step, .. } => {
                let resume = match model.orphans {
                    OrphanPolicy::Fail => false,
                    OrphanPolicy::Resume { limit } => record.orphaned < limit,
                };
                match (model.has(Flaw::UnfencedOrphans), resume) {
                    (false, _) => (Phase::Fencing { resume }, step),
                    (true, true) => (Phase::Boundary, step),
                    (true, false) => (Phase::Orphan, step),
                }
            }
            // Completion clears the slot in the same transaction: a
            // terminal operation in the slot is ignored, as drive does
            // (and "one operation per cluster" says it cannot happen).
            _ => return None,
        };
        let holding = Holding {
            claim,
            operation,
            state_revision: key.mod_revision,
            operation_revision: record.mod_revision,
            held: key.state,
            phase,
            step,
        };
        if phase == Phase::Calling {
            self.send(replica, cluster, holding);
        } else {
            self.replicas[replica].holding[cluster] = Some(holding);
        }
        Some(())
    }

    /// `Holding::describe`, fenced: an upgrade plans from its answer, and
    /// orphan recovery fails the orphan only once it has been answered. A
    /// describe the provider refuses (a newer epoch was seen, so this claim
    /// is dead for good) is no step, like a write whose compares miss.
    fn describe(
        &mut self,
        model: &Drover,
        replica: ReplicaId,
        cluster: ClusterId,
        fails: bool,
    ) -> Option<()> {
        let mut holding = self.replicas[replica].holding[cluster]?;
        if self.provider.refuses(cluster, holding.claim.epoch) {
            return None;
        }
        if fails {
            self.read_errors_left -= 1;
        } else {
            let aborted = self
                .provider
                .fence(cluster, holding.claim.epoch, drains(model));
            self.abort(aborted);
        }
        holding.phase = match (holding.phase, fails) {
            (Phase::Pending, false) => Phase::Boundary,
            // No nodes to plan from: no steps, and "success".
            (Phase::Pending, true) if model.has(Flaw::PlanFromFailedRead) => {
                Phase::Done { ok: true }
            }
            // The operation fails with the provider's error.
            (Phase::Pending, true) => Phase::Done { ok: false },
            // Resumed at the step its record shows: the boundary's write
            // records it under this epoch.
            (Phase::Fencing { resume: true }, false) => Phase::Boundary,
            (Phase::Fencing { resume: false }, false) => Phase::Orphan,
            (Phase::Fencing { resume }, true) if model.has(Flaw::OrphanFailedWhenFenceFails) => {
                if resume {
                    Phase::Boundary
                } else {
                    Phase::Orphan
                }
            }
            // The slot is kept and the fence tried again.
            (phase @ Phase::Fencing { .. }, true) => {
                self.history.fence_retried = true;
                phase
            }
            _ => return None,
        };
        self.replicas[replica].holding[cluster] = Some(holding);
        Some(())
    }

    /// The holding `replica` drives on `cluster`, if its next write's
    /// compares hold; records the write.
    fn fenced_write(
        &mut self,
        model: &Drover,
        replica: ReplicaId,
        cluster: ClusterId,
    ) -> Option<Holding> {
        let holding = self.replicas[replica].holding[cluster]?;
        let fencing = !model.has(Flaw::NoOwnerCompare);
        if !self.store.holds(&holding.guard(cluster, fencing)) {
            return None;
        }
        self.fenced_wrote(cluster, holding.claim);
        Some(holding)
    }

    /// A step boundary's `save_operation`: RUNNING under my epoch at this
    /// step.
    fn record(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let mut holding = self.fenced_write(model, replica, cluster)?;
        let revision = self.store.commit();
        let record = &mut self.store.operations[holding.operation];
        // Taken over from a lost owner: the record shows one more epoch.
        if matches!(record.status, Status::Running { epoch, .. } if epoch != holding.claim.epoch) {
            record.orphaned += 1;
        }
        record.status = Status::Running {
            epoch: holding.claim.epoch,
            step: holding.step,
        };
        record.mod_revision = revision;
        holding.operation_revision = revision;
        self.send(replica, cluster, holding);
        Some(())
    }

    /// `Holding::call` up to the wire: the drive sends its step's call and
    /// waits for the answer. The replica believes it owns the cluster
    /// (else it would hold nothing), so its claim check passes.
    fn send(&mut self, replica: ReplicaId, cluster: ClusterId, mut holding: Holding) {
        holding.phase = Phase::Calling;
        let call = holding.token(cluster);
        let at = self.calls.partition_point(|c| *c < call);
        self.calls.insert(at, call);
        self.replicas[replica].holding[cluster] = Some(holding);
    }

    /// The provider takes or refuses `call`; the drive that sent it, if it
    /// still runs, moves on to its next step or to completion.
    fn land(&mut self, model: &Drover, call: Token, succeeds: bool) -> Option<()> {
        let at = self.calls.iter().position(|c| *c == call)?;
        self.calls.remove(at);
        let ok = if self.provider.refuses(call.cluster, call.epoch) {
            false
        } else {
            self.applies(call);
            let aborted = self.provider.accept(call, succeeds, drains(model));
            self.abort(aborted);
            succeeds
        };
        self.answer(&[call], ok);
        Some(())
    }

    /// The provider admits `call`, which it does not refuse, to apply it
    /// later; the drive that sent it waits on.
    fn admit(&mut self, model: &Drover, call: Token) -> Option<()> {
        if self.provider.refuses(call.cluster, call.epoch) {
            return None;
        }
        let at = self.calls.iter().position(|c| *c == call)?;
        self.calls.remove(at);
        self.slow_calls_left -= 1;
        let aborted = self.provider.admit(call, drains(model));
        self.abort(aborted);
        Some(())
    }

    /// The provider applies an admitted `call` and answers it. It applies
    /// whatever epoch came since: the drain is what keeps an older one
    /// from getting here.
    fn apply(&mut self, call: Token, succeeds: bool) -> Option<()> {
        self.provider.running.contains(&call).then_some(())?;
        self.applies(call);
        self.provider.apply(call, succeeds);
        self.answer(&[call], succeeds);
        Some(())
    }

    /// Notes a call about to apply after its operation ended.
    fn applies(&mut self, call: Token) {
        if self.store.operations[call.operation].status.is_terminal() {
            self.history.call_after_end = true;
        }
    }

    /// The calls a newer epoch drained answer ABORTED.
    fn abort(&mut self, aborted: Vec<Token>) {
        if !aborted.is_empty() {
            self.history.drained = true;
            self.answer(&aborted, false);
        }
    }

    /// Answers `calls` (`ok` or failed): each drive waiting for one, if it
    /// still runs, moves on to its next step or to completion.
    fn answer(&mut self, calls: &[Token], ok: bool) {
        for &call in calls {
            let steps = self.store.operations[call.operation].kind.steps();
            let drive = self
                .replicas
                .iter_mut()
                .filter_map(|r| r.holding[call.cluster].as_mut())
                .find(|h| h.awaits(call));
            let Some(drive) = drive else {
                continue;
            };
            if ok && drive.step < steps {
                drive.step += 1;
                drive.phase = Phase::Boundary;
            } else {
                drive.phase = Phase::Done { ok };
            }
        }
    }

    /// `Holding::finish`: move the cluster from the state as read by the
    /// outcome's event (`final_state`), clear the slot, end the record.
    fn finish(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let holding = self.fenced_write(model, replica, cluster)?;
        let (status, event) = match holding.phase {
            Phase::Done { ok: true } => (Status::Succeeded, Event::OperationSucceeded),
            Phase::Done { ok: false } => (Status::Failed, Event::OperationFailed),
            Phase::Orphan => (Status::Orphaned, Event::OperationFailed),
            _ => return None,
        };
        let revision = self.store.commit();
        let record = &mut self.store.operations[holding.operation];
        let to = machine::final_state(
            holding.held,
            record.go_ahead,
            record.kind.go_ahead_moves(),
            status == Status::Succeeded,
            event,
        );
        record.status = status;
        record.mod_revision = revision;
        let key = &mut self.store.states[cluster];
        key.state = to;
        key.slot = None;
        key.mod_revision = revision;
        self.replicas[replica].holding[cluster] = None;
        Some(())
    }
}
