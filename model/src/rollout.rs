//! A model of fleet rollouts (`server/src/rollout/`): one rollout's owner
//! starting its targets' operations within the stage's concurrency, across
//! owner crashes and zombies. Self-contained: its own state, actions and
//! properties, and its own [`Model`], apart from the cluster protocol's.
//!
//! What is modelled: one rollout of a few targets in one stage with a
//! concurrency N. Its records in etcd are a status (only whether it is
//! settled) and one record per target, PENDING → STARTING → RUNNING (with
//! its operation) → SUCCEEDED or FAILED, all written by the owner, each
//! write comparing the owner key's lease and create revision. The owner key
//! is bound to a replica's lease and created only while absent; the replica
//! that creates it loads the records, and from then on its view of the
//! rollout is what it loaded plus its own writes. Its reconcile, in steps:
//! choose a PENDING target while fewer than N are in flight (STARTING or
//! RUNNING) in its view and write it STARTING; submit the target's
//! operation to the cluster's accept under the request id of the rollout
//! and the cluster; write the target RUNNING with the operation the accept
//! answered; once the operation has ended, write the target SUCCEEDED or
//! FAILED; once every target has ended, write the status settled and delete
//! the owner key. The status record also holds a pause: an operator may
//! write it PAUSED, and later RUNNING again, at any step; each write of the
//! record (the owner's too) bumps its revision. The owner writes the
//! targets it chooses STARTING with the status, in one transaction that
//! compares the record's revision with the one it last read or wrote; a
//! pause written since fails it, and the owner reads the record again
//! (and, paused, chooses nothing). The accept is one transaction: it answers the operation
//! that the request id's index names if there is one; else it refuses when
//! an operation of the cluster still runs (busy: the owner writes the
//! target PENDING again); else it creates the operation and the index
//! entry. An operation runs from its accept until the provider ends it
//! (success or failure), at any step.
//!
//! Each action is one atomic step: a fenced write, the accept, the provider
//! ending an operation, the owner key's creation with the load, or a fault.
//!
//! # Guarantees
//!
//! Within the bounds checked (see `tests/rollout.rs`), in every reachable
//! state:
//! - at most N of the rollout's operations run at once (accepted and not
//!   ended), whichever owners crashed between which steps: a target is
//!   counted from its STARTING record, before its operation exists, so a
//!   new owner that loads the records counts it too;
//! - each target's operation is accepted at most once: a new owner (or a
//!   zombie) submits a STARTING target again under the same request id,
//!   and the accept answers the operation the first submit created;
//! - no owner write lands once etcd has dropped the owner's lease;
//! - no target is written STARTING while the record says PAUSED: once a
//!   pause is written, only targets already STARTING start;
//! - a target is SUCCEEDED only if its operation succeeded;
//! - once the faults allowed are spent, every target ends and the rollout
//!   settles.
//!
//! The checks are not vacuous: N operations run at once; an owner dies with
//! a target STARTING and the new owner's resubmission either creates the
//! operation the lost owner never accepted or is answered the one it did; a
//! zombie and a new owner both believe they own the rollout; every target
//! succeeds; a pause lands while an owner, its view not showing it, could
//! start a target. Each negative test seeds one [`RolloutFlaw`] and the checker
//! finds its counterexample: submitting before the STARTING record lets a
//! new owner undercount and run more than N; a resubmission under a fresh
//! request id accepts a target's operation twice; a zombie's unfenced
//! writes land and start more than N; writing a target PENDING when its
//! accept's answer was lost (what Drover's reconcile once did, see
//! Caveats) runs more than N; a start that does not compare the record
//! ([`RolloutFlaw::UncomparedRecord`]) runs through a pause.
//!
//! # Assumptions
//!
//! - etcd is linearizable; a transaction's compares and writes are one
//!   step; an expiring (or revoked) lease deletes the keys bound to it in
//!   the same step; a put bound to a lease etcd no longer holds fails.
//! - A lease can expire at any step (a crash, a pause, a peer's fast crash
//!   detection): the replica does not know until a keep-alive says so, and
//!   meanwhile acts on its view, a zombie. A crashed replica is a zombie
//!   that takes no further step. It then rejoins under a new lease.
//! - The owner key's create revision is stood in for by a count of the
//!   claims: unique and increasing, which is all the compare needs.
//! - Any replica whose lease etcd holds may claim an unowned rollout that
//!   has not settled (the preferred member, or any after the grace): who
//!   claims matters for progress only.
//! - Claiming and loading are one step: between them only owner writes
//!   could change the target records, and the owner key compared in every
//!   one of them is the new owner's.
//! - The accept is not fenced by the rollout's owner key (it is the
//!   cluster's accept): a zombie's submit lands. Its request id is what
//!   makes that harmless.
//! - Seeing that an operation ended and writing its target are one step:
//!   an operation that ended stays ended.
//! - A reconcile's steps are free to interleave: one write of all the
//!   chosen targets is one write per target here, and the owner may choose
//!   between the submits of earlier choices. That is more interleavings
//!   than Drover's, not fewer; each step checks what Drover checks there
//!   (the count of the targets in flight in the view). Choosing any
//!   PENDING target covers a target passed over as not ready.
//!
//! # Caveats
//!
//! - Bounds: 2–3 replicas, 3 targets, a concurrency of 1 or 2, up to two
//!   lease losses, one lost answer, one pause and its resume (see the
//!   tests).
//! - A lost answer: the accept committed (or answered) and its answer did
//!   not reach the owner (etcd unreachable, the reply lost after the
//!   commit). The model's owner keeps the target STARTING and submits it
//!   again under its request id, as Drover's reconcile (`started`) does
//!   since the model found the flaw
//!   [`RolloutFlaw::PendingAfterLostAnswer`]: writing it PENDING on every
//!   store error, as it once did, stops counting a target whose operation
//!   may run, and runs more than N (unit test
//!   `an_accept_of_unknown_outcome_keeps_its_target_starting`).
//! - Not modelled: stages, soak, approvals, cancel and the failure budget
//!   (the status holds only whether the rollout settled and whether it is
//!   paused; a pause by the failure budget is a pause written by the owner,
//!   whose view then shows it);
//!   targets skipped (busy under the skip policy, already at the target,
//!   gone); accept refusals other than busy; other users' operations on the
//!   targets' clusters; an accept answering an operation that already ended
//!   (Drover writes the target ended at once, the model RUNNING first and
//!   ended at its next step); the operation's own steps at the provider
//!   (the cluster protocol's model covers them: here it runs from its
//!   accept to its end); history collection; the rollout's creation (its
//!   targets are there from the start); graceful hand-overs.
//! - A fenced write whose compare misses is not a step: the zombie keeps
//!   its view until a keep-alive tells it its lease is gone.
//! - Liveness, as in the cluster protocol's model: every step spends a
//!   budget or moves a record, an operation or a view forward, so every
//!   path ends, and the `eventually` property is judged at the ends.

use stateright::{Model, Property};

pub type ReplicaId = usize;
pub type TargetId = usize;
/// An operation's index in [`Etcd::operations`], in order of acceptance.
pub type OperationId = usize;
/// A lease id; every lease ever granted has a fresh one.
pub type LeaseId = u8;

/// The bounds of one check, and the flaw seeded, if any.
#[derive(Debug, Clone, Copy)]
pub struct Rollout {
    pub replicas: usize,
    pub targets: usize,
    /// The stage's concurrency, N.
    pub concurrency: usize,
    /// Lease losses (crashes, pauses, revokes).
    pub faults: u8,
    /// Accepts whose answer is lost.
    pub lost_answers: u8,
    /// Pauses an operator writes (each followed, some time, by a resume).
    pub pauses: u8,
    pub flaw: Option<RolloutFlaw>,
}

/// A way to break the rollout protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutFlaw {
    /// The owner submits a chosen target before writing it STARTING (it
    /// writes it RUNNING after; the reconcile's status write, fenced, still
    /// comes before the submit): a new owner loads it PENDING.
    NoStartingRecord,
    /// A STARTING target found on load is submitted under a request id of
    /// the new owner's, not the rollout's and the cluster's.
    FreshRequestIdOnResubmit,
    /// Target writes do not compare the owner key: a zombie's land.
    UnfencedTargetWrite,
    /// A target whose accept's answer was lost is written PENDING, as
    /// Drover's reconcile once did with a store error.
    PendingAfterLostAnswer,
    /// The write of the targets a reconcile starts does not compare the
    /// rollout's record: a pause written after the owner's read is missed
    /// (and the status written with the starts overwrites it).
    UncomparedRecord,
}

impl Rollout {
    /// Two replicas, three targets, no lost answer.
    pub fn new(concurrency: usize, faults: u8) -> Self {
        Rollout {
            replicas: 2,
            targets: 3,
            concurrency,
            faults,
            lost_answers: 0,
            pauses: 0,
            flaw: None,
        }
    }

    /// This model with `flaw` seeded.
    pub fn with(self, flaw: RolloutFlaw) -> Self {
        Rollout {
            flaw: Some(flaw),
            ..self
        }
    }

    pub fn has(&self, flaw: RolloutFlaw) -> bool {
        self.flaw == Some(flaw)
    }
}

/// A target record in etcd (`rollout-clusters/<name>/<cluster>`; absent
/// is PENDING).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    Pending,
    Starting,
    Running(OperationId),
    Succeeded,
    Failed,
}

impl Record {
    pub fn is_terminal(self) -> bool {
        matches!(self, Record::Succeeded | Record::Failed)
    }
}

/// The owner key (`rollout-owners/<name>`): the lease it is bound to and
/// its create revision (here, which claim created it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    pub lease: LeaseId,
    pub created: u8,
}

/// The accept's idempotency key: the rollout and the cluster (`salt` 0),
/// or, under [`RolloutFlaw::FreshRequestIdOnResubmit`], a new owner's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId {
    pub target: TargetId,
    pub salt: u8,
}

/// An operation the accept created on a target's cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Operation {
    pub target: TargetId,
    /// `Some(succeeded)` once the provider ended it.
    pub ended: Option<bool>,
}

/// What etcd holds, the clusters' operations with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Etcd {
    /// The leases etcd holds, sorted.
    pub leases: Vec<LeaseId>,
    pub owner: Option<OwnerKey>,
    /// Claims made so far: the next owner key's create revision.
    pub claims: u8,
    /// The status record: every target ended and the owner is done.
    pub settled: bool,
    /// The status record says PAUSED (an operator's pause).
    pub paused: bool,
    /// The status record's revision: bumped by each write of it (an owner's
    /// status write, a pause, a resume).
    pub record: u8,
    pub targets: Vec<Record>,
    /// The request ids' index: which operation each created.
    pub requests: Vec<(RequestId, OperationId)>,
    pub operations: Vec<Operation>,
}

/// A target as its owner sees it: the record it loaded or wrote, and
/// where its own reconcile is with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Seen {
    Pending,
    /// Chosen and not written STARTING (only under
    /// [`RolloutFlaw::NoStartingRecord`]): next, the accept.
    Chosen,
    /// STARTING: next, the accept. `again`: a resubmission, of a target
    /// found STARTING on load or whose accept's answer was lost.
    Starting {
        again: bool,
    },
    /// The accept answered: next, the write of how it went.
    Answered(Answer),
    Running(OperationId),
    Ended,
}

impl Seen {
    /// Counted against the concurrency: STARTING or RUNNING, in the view.
    fn in_flight(self) -> bool {
        !matches!(self, Seen::Pending | Seen::Ended)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    Operation(OperationId),
    /// The cluster runs another operation: the target goes back to PENDING.
    Busy,
    /// Lost on its way (only under [`RolloutFlaw::PendingAfterLostAnswer`],
    /// which writes the target PENDING).
    Lost,
}

/// The rollout as its owner holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    pub key: OwnerKey,
    pub targets: Vec<Seen>,
    /// The status record's revision and pause as it last read or wrote
    /// them.
    pub record: u8,
    pub paused: bool,
    /// It wrote the status settled: next, the owner key's deletion.
    pub settled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Replica {
    /// The lease it believes it holds (etcd may have dropped it).
    pub lease: Option<LeaseId>,
    /// The rollout, while it believes it owns it.
    pub owner: Option<Owner>,
}

/// Observations for the properties; unset until they happen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct History {
    /// An owner write landed while etcd no longer held its lease.
    pub unleased_write: bool,
    /// A resubmission of a STARTING target created its operation (the
    /// lost owner never got to the accept).
    pub resubmit_created: bool,
    /// A resubmission was answered the operation an earlier accept
    /// created.
    pub resubmit_answered: bool,
    /// A target was written STARTING while the status record said PAUSED.
    pub started_while_paused: bool,
    /// A pause landed while an owner could still choose a target on a view
    /// that did not show it.
    pub pause_raced: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub etcd: Etcd,
    pub replicas: Vec<Replica>,
    pub next_lease: LeaseId,
    pub faults_left: u8,
    pub lost_answers_left: u8,
    pub pauses_left: u8,
    pub history: History,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A replica whose lease etcd holds creates the absent owner key, bound
    /// to its lease, and loads the records.
    Claim { replica: ReplicaId },
    /// The owner chooses a PENDING target while fewer than N are in flight
    /// in its view, and writes it STARTING (fenced).
    Choose {
        replica: ReplicaId,
        target: TargetId,
    },
    /// The owner submits a STARTING target's operation: the cluster's
    /// accept, one transaction. `lost`: its answer does not come back.
    Submit {
        replica: ReplicaId,
        target: TargetId,
        lost: bool,
    },
    /// The owner writes how the accept went: RUNNING with the operation,
    /// or PENDING again (fenced).
    Started {
        replica: ReplicaId,
        target: TargetId,
    },
    /// The owner sees a RUNNING target's operation ended and writes the
    /// target SUCCEEDED or FAILED (fenced).
    Observe {
        replica: ReplicaId,
        target: TargetId,
    },
    /// Every target ended in its view: the owner writes the status settled
    /// (fenced).
    Settle { replica: ReplicaId },
    /// The owner of a settled rollout deletes its owner key (fenced).
    Release { replica: ReplicaId },
    /// The provider ends an operation.
    End {
        operation: OperationId,
        succeeds: bool,
    },
    /// etcd drops a lease and the owner key bound to it; the replica does
    /// not know.
    LeaseExpires { lease: LeaseId },
    /// A keep-alive answers "lease not found": the replica forgets the
    /// rollout.
    LeaseNotFound { replica: ReplicaId },
    /// A replica without a lease grants a new one.
    Rejoin { replica: ReplicaId },
    /// An operator's PauseRollout: the status record written PAUSED.
    Pause,
    /// An operator's ResumeRollout: the status record written RUNNING.
    Resume,
    /// The owner, its status record older than etcd's (its write's compare
    /// missed), reads the record again.
    Reload { replica: ReplicaId },
}

pub const AT_MOST_N: &str = "at most N of the rollout's operations run at once";
pub const ONCE_PER_TARGET: &str = "each target's operation is accepted at most once";
pub const FENCED: &str = "no owner write lands without its lease";
pub const SUCCESS_SHOWN: &str = "a target succeeds only if its operation did";
pub const EVERYTHING_ENDS: &str = "every target ends and the rollout settles";
pub const AT_LIMIT: &str = "N operations run at once";
pub const RESUBMIT_CREATES: &str =
    "a new owner's resubmission creates the operation a lost owner never accepted";
pub const RESUBMIT_ANSWERED: &str =
    "a new owner's resubmission is answered the operation an earlier accept created";
pub const TWO_OWNERS: &str = "a zombie and a new owner both believe they own the rollout";
pub const ALL_SUCCEED: &str = "every target succeeds";
pub const PAUSE_HOLDS: &str = "no target is written STARTING while the rollout is paused";
pub const PAUSE_RACED: &str =
    "a pause lands while an owner's view, not showing it, could start a target";

impl Model for Rollout {
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
            Property::always(AT_MOST_N, |model: &Rollout, s: &State| {
                s.running() <= model.concurrency
            }),
            Property::always(ONCE_PER_TARGET, |model: &Rollout, s: &State| {
                (0..model.targets)
                    .all(|t| s.etcd.operations.iter().filter(|o| o.target == t).count() <= 1)
            }),
            Property::always(FENCED, |_, s: &State| !s.history.unleased_write),
            Property::always(PAUSE_HOLDS, |_, s: &State| !s.history.started_while_paused),
            Property::always(SUCCESS_SHOWN, success_shown),
            Property::eventually(EVERYTHING_ENDS, |_, s: &State| {
                s.etcd.settled && s.etcd.targets.iter().all(|r| r.is_terminal())
            }),
            Property::sometimes(AT_LIMIT, |model: &Rollout, s: &State| {
                s.running() == model.concurrency
            }),
            Property::sometimes(RESUBMIT_CREATES, |_, s: &State| s.history.resubmit_created),
            Property::sometimes(RESUBMIT_ANSWERED, |_, s: &State| {
                s.history.resubmit_answered
            }),
            Property::sometimes(TWO_OWNERS, |_, s: &State| {
                s.replicas.iter().filter(|r| r.owner.is_some()).count() > 1
            }),
            Property::sometimes(ALL_SUCCEED, |_, s: &State| {
                s.etcd.targets.iter().all(|r| *r == Record::Succeeded)
            }),
            Property::sometimes(PAUSE_RACED, |_, s: &State| s.history.pause_raced),
        ]
    }
}

/// Every SUCCEEDED target's operation succeeded at the provider.
fn success_shown(_: &Rollout, state: &State) -> bool {
    state
        .etcd
        .targets
        .iter()
        .enumerate()
        .filter(|(_, r)| **r == Record::Succeeded)
        .all(|(t, _)| {
            state
                .etcd
                .operations
                .iter()
                .any(|o| o.target == t && o.ended == Some(true))
        })
}

impl State {
    pub fn new(model: &Rollout) -> Self {
        let leases: Vec<LeaseId> = (0..model.replicas as LeaseId).collect();
        State {
            replicas: leases
                .iter()
                .map(|&lease| Replica {
                    lease: Some(lease),
                    owner: None,
                })
                .collect(),
            next_lease: model.replicas as LeaseId,
            etcd: Etcd {
                leases,
                owner: None,
                claims: 0,
                settled: false,
                paused: false,
                record: 0,
                targets: vec![Record::Pending; model.targets],
                requests: Vec::new(),
                operations: Vec::new(),
            },
            faults_left: model.faults,
            lost_answers_left: model.lost_answers,
            pauses_left: model.pauses,
            history: History::default(),
        }
    }

    /// The rollout's operations accepted and not ended: running at the
    /// provider.
    pub fn running(&self) -> usize {
        self.etcd
            .operations
            .iter()
            .filter(|o| o.ended.is_none())
            .count()
    }

    /// Every action enabled here. A fenced write whose compare would miss
    /// is still offered: [`State::step`] makes it no step.
    fn actions(&self, model: &Rollout, actions: &mut Vec<Action>) {
        for (operation, o) in self.etcd.operations.iter().enumerate() {
            if o.ended.is_none() {
                for succeeds in [true, false] {
                    actions.push(Action::End {
                        operation,
                        succeeds,
                    });
                }
            }
        }
        if self.faults_left > 0 {
            for &lease in &self.etcd.leases {
                actions.push(Action::LeaseExpires { lease });
            }
        }
        if self.etcd.paused {
            actions.push(Action::Resume);
        } else if self.pauses_left > 0 && !self.etcd.settled {
            actions.push(Action::Pause);
        }
        for (replica, local) in self.replicas.iter().enumerate() {
            let Some(lease) = local.lease else {
                actions.push(Action::Rejoin { replica });
                continue;
            };
            if !self.etcd.leases.contains(&lease) {
                actions.push(Action::LeaseNotFound { replica });
            }
            match &local.owner {
                None if self.etcd.owner.is_none() && !self.etcd.settled => {
                    actions.push(Action::Claim { replica });
                }
                None => {}
                Some(owner) => self.owner_actions(model, replica, owner, actions),
            }
        }
    }

    /// The steps open to `replica`'s reconcile, from its view.
    fn owner_actions(
        &self,
        model: &Rollout,
        replica: ReplicaId,
        owner: &Owner,
        actions: &mut Vec<Action>,
    ) {
        if owner.settled {
            actions.push(Action::Release { replica });
            return;
        }
        if owner.record != self.etcd.record {
            actions.push(Action::Reload { replica });
        }
        let in_flight = owner.targets.iter().filter(|s| s.in_flight()).count();
        let mut ended = true;
        for (target, seen) in owner.targets.iter().enumerate() {
            ended &= *seen == Seen::Ended;
            match seen {
                Seen::Pending if in_flight < model.concurrency && !owner.paused => {
                    actions.push(Action::Choose { replica, target });
                }
                Seen::Chosen | Seen::Starting { .. } => {
                    actions.push(Action::Submit {
                        replica,
                        target,
                        lost: false,
                    });
                    if self.lost_answers_left > 0 {
                        actions.push(Action::Submit {
                            replica,
                            target,
                            lost: true,
                        });
                    }
                }
                Seen::Answered(_) => actions.push(Action::Started { replica, target }),
                Seen::Running(op) if self.etcd.operations[*op].ended.is_some() => {
                    actions.push(Action::Observe { replica, target });
                }
                _ => {}
            }
        }
        if ended && !owner.paused {
            actions.push(Action::Settle { replica });
        }
    }

    /// Takes `action`; `None` when it is no step (a compare missed).
    fn step(&mut self, model: &Rollout, action: Action) -> Option<()> {
        match action {
            Action::Claim { replica } => self.claim(replica),
            Action::Choose { replica, target } => self.choose(model, replica, target),
            Action::Submit {
                replica,
                target,
                lost,
            } => self.submit(model, replica, target, lost),
            Action::Started { replica, target } => self.started(model, replica, target),
            Action::Observe { replica, target } => self.observe(model, replica, target),
            Action::Settle { replica } => self.settle(replica),
            Action::Release { replica } => self.release(replica),
            Action::End {
                operation,
                succeeds,
            } => {
                self.etcd.operations[operation].ended = Some(succeeds);
                Some(())
            }
            Action::LeaseExpires { lease } => self.expire(lease),
            Action::LeaseNotFound { replica } => {
                self.replicas[replica] = Replica {
                    lease: None,
                    owner: None,
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
            Action::Pause => self.pause(model),
            Action::Resume => {
                self.etcd.paused = false;
                self.etcd.record += 1;
                Some(())
            }
            Action::Reload { replica } => {
                let (record, paused) = (self.etcd.record, self.etcd.paused);
                let owner = self.replicas[replica].owner.as_mut()?;
                (owner.record, owner.paused) = (record, paused);
                Some(())
            }
        }
    }

    /// `PauseRollout`: the status record written PAUSED. Notes whether an
    /// owner's view could still start a target as if it had not landed.
    fn pause(&mut self, model: &Rollout) -> Option<()> {
        self.etcd.paused = true;
        self.etcd.record += 1;
        self.pauses_left -= 1;
        self.history.pause_raced |=
            self.replicas
                .iter()
                .filter_map(|r| r.owner.as_ref())
                .any(|o| {
                    let in_flight = o.targets.iter().filter(|s| s.in_flight()).count();
                    !o.paused && in_flight < model.concurrency && o.targets.contains(&Seen::Pending)
                });
        Some(())
    }

    /// `RolloutOwners::try_claim` and the first reconcile's load: the owner
    /// key put while absent, bound to the lease, then the records read.
    fn claim(&mut self, replica: ReplicaId) -> Option<()> {
        let lease = self.replicas[replica].lease?;
        if self.etcd.owner.is_some() || self.etcd.settled || !self.etcd.leases.contains(&lease) {
            return None;
        }
        self.etcd.claims += 1;
        let key = OwnerKey {
            lease,
            created: self.etcd.claims,
        };
        self.etcd.owner = Some(key);
        let targets = self
            .etcd
            .targets
            .iter()
            .map(|record| match record {
                Record::Pending => Seen::Pending,
                Record::Starting => Seen::Starting { again: true },
                Record::Running(op) => Seen::Running(*op),
                Record::Succeeded | Record::Failed => Seen::Ended,
            })
            .collect();
        self.replicas[replica].owner = Some(Owner {
            key,
            targets,
            record: self.etcd.record,
            paused: self.etcd.paused,
            settled: false,
        });
        Some(())
    }

    /// Whether `replica`'s write lands: etcd still holds the owner key it
    /// created (lease and create revision compared), or `fenced` is off.
    /// Notes a write that lands without its lease.
    fn lands(&mut self, replica: ReplicaId, fenced: bool) -> Option<()> {
        let key = self.replicas[replica].owner.as_ref()?.key;
        if fenced && self.etcd.owner != Some(key) {
            return None;
        }
        if !self.etcd.leases.contains(&key.lease) {
            self.history.unleased_write = true;
        }
        Some(())
    }

    /// A target write: fenced unless [`RolloutFlaw::UnfencedTargetWrite`].
    fn write_target(
        &mut self,
        model: &Rollout,
        replica: ReplicaId,
        target: TargetId,
        record: Record,
    ) -> Option<()> {
        self.lands(replica, !model.has(RolloutFlaw::UnfencedTargetWrite))?;
        self.etcd.targets[target] = record;
        Some(())
    }

    /// `start_some`: the target chosen and written STARTING, with the
    /// status, comparing the status record's revision (a pause written
    /// since the owner's read fails it) unless [`RolloutFlaw::UncomparedRecord`].
    fn choose(&mut self, model: &Rollout, replica: ReplicaId, target: TargetId) -> Option<()> {
        let owner = self.replicas[replica].owner.as_ref()?;
        let (read, paused) = (owner.record, owner.paused);
        if !model.has(RolloutFlaw::UncomparedRecord) && read != self.etcd.record {
            return None;
        }
        let was_paused = self.etcd.paused;
        let seen = if model.has(RolloutFlaw::NoStartingRecord) {
            // The reconcile's status write, fenced, still comes first.
            self.lands(replica, true)?;
            Seen::Chosen
        } else {
            self.write_target(model, replica, target, Record::Starting)?;
            Seen::Starting { again: false }
        };
        self.history.started_while_paused |= was_paused;
        // The status is written with the starts, as the owner sees it.
        self.etcd.paused = paused;
        self.etcd.record += 1;
        let record = self.etcd.record;
        self.replicas[replica].owner.as_mut()?.record = record;
        self.set_seen(replica, target, seen)
    }

    fn set_seen(&mut self, replica: ReplicaId, target: TargetId, seen: Seen) -> Option<()> {
        self.replicas[replica].owner.as_mut()?.targets[target] = seen;
        Some(())
    }

    /// `Executor::submit` under the target's request id: the operation the
    /// id names, or busy, or a new operation. A lost answer leaves the
    /// target STARTING in the view (submitted again later), or, under
    /// [`RolloutFlaw::PendingAfterLostAnswer`], answered "lost".
    fn submit(
        &mut self,
        model: &Rollout,
        replica: ReplicaId,
        target: TargetId,
        lost: bool,
    ) -> Option<()> {
        let owner = self.replicas[replica].owner.as_ref()?;
        let again = owner.targets[target] == Seen::Starting { again: true };
        let salt = if again && model.has(RolloutFlaw::FreshRequestIdOnResubmit) {
            owner.key.created
        } else {
            0
        };
        let answer = self.accept(RequestId { target, salt }, again);
        let seen = match (lost, model.has(RolloutFlaw::PendingAfterLostAnswer)) {
            (false, _) => Seen::Answered(answer),
            (true, false) => Seen::Starting { again: true },
            (true, true) => Seen::Answered(Answer::Lost),
        };
        if lost {
            self.lost_answers_left -= 1;
        }
        self.set_seen(replica, target, seen)
    }

    /// The accept's transaction on the target's cluster; `resubmitted`
    /// notes what a new owner's resubmission did.
    fn accept(&mut self, request: RequestId, resubmitted: bool) -> Answer {
        let known = self.etcd.requests.iter().find(|(id, _)| *id == request);
        if let Some(&(_, operation)) = known {
            self.history.resubmit_answered |= resubmitted;
            return Answer::Operation(operation);
        }
        let target = request.target;
        let etcd = &mut self.etcd;
        if etcd
            .operations
            .iter()
            .any(|o| o.target == target && o.ended.is_none())
        {
            return Answer::Busy;
        }
        self.history.resubmit_created |= resubmitted;
        etcd.operations.push(Operation {
            target,
            ended: None,
        });
        let operation = etcd.operations.len() - 1;
        etcd.requests.push((request, operation));
        Answer::Operation(operation)
    }

    /// The write after the submits: RUNNING with the operation, or PENDING
    /// when the accept was busy (or its answer lost, under the flaw).
    fn started(&mut self, model: &Rollout, replica: ReplicaId, target: TargetId) -> Option<()> {
        let owner = self.replicas[replica].owner.as_ref()?;
        let Seen::Answered(answer) = owner.targets[target] else {
            return None;
        };
        let (record, seen) = match answer {
            Answer::Operation(op) => (Record::Running(op), Seen::Running(op)),
            Answer::Busy | Answer::Lost => (Record::Pending, Seen::Pending),
        };
        self.write_target(model, replica, target, record)?;
        self.set_seen(replica, target, seen)
    }

    /// `observe`: the operation ended; the target written as it ended.
    fn observe(&mut self, model: &Rollout, replica: ReplicaId, target: TargetId) -> Option<()> {
        let owner = self.replicas[replica].owner.as_ref()?;
        let Seen::Running(op) = owner.targets[target] else {
            return None;
        };
        let record = match self.etcd.operations[op].ended? {
            true => Record::Succeeded,
            false => Record::Failed,
        };
        self.write_target(model, replica, target, record)?;
        self.set_seen(replica, target, Seen::Ended)
    }

    /// Every target ended: the status written settled (fenced).
    fn settle(&mut self, replica: ReplicaId) -> Option<()> {
        let owner = self.replicas[replica].owner.as_ref()?;
        if owner.record != self.etcd.record {
            return None;
        }
        self.lands(replica, true)?;
        self.etcd.settled = true;
        self.replicas[replica].owner.as_mut()?.settled = true;
        Some(())
    }

    /// `RolloutOwners::release`: the owner key deleted if still ours.
    fn release(&mut self, replica: ReplicaId) -> Option<()> {
        self.lands(replica, true)?;
        self.etcd.owner = None;
        self.replicas[replica].owner = None;
        Some(())
    }

    /// etcd drops `lease` and the owner key bound to it.
    fn expire(&mut self, lease: LeaseId) -> Option<()> {
        let at = self.etcd.leases.iter().position(|l| *l == lease)?;
        self.etcd.leases.remove(at);
        if self.etcd.owner.is_some_and(|key| key.lease == lease) {
            self.etcd.owner = None;
        }
        self.faults_left -= 1;
        Some(())
    }
}
