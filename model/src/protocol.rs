//! The replicas' actions, each one atomic step against the store: what a
//! replica reads, what its transactions compare, and what it believes.
//!
//! A replica's beliefs (its lease, its claims, the revisions it read for the
//! operation it drives) are local and may be stale: etcd can let a lease
//! expire at any step without the replica knowing, and the replica keeps
//! acting on its beliefs until it notices (a paused replica that wakes up is
//! exactly that).

use crate::machine::{self, Admission, ClusterState, Event};
use crate::provider::{Provider, Token};
use crate::store::{
    Claim, ClusterId, Guard, Kind, LeaseId, Operation, OperationId, OwnerKey, ReplicaId, Revision,
    Status, Store,
};
use crate::Drover;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub store: Store,
    pub replicas: Vec<Replica>,
    pub provider: Provider,
    /// Client requests still to be made.
    pub requests_left: u8,
    /// Lease losses still to happen (an expiry of a lease its replica
    /// still uses, or a replica giving its lease up).
    pub faults_left: u8,
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
    /// The provider refused a call with a stale epoch.
    pub refused_stale: bool,
    /// The provider accepted a call for an operation that had already ended.
    pub call_after_end: bool,
    /// An owner released a cluster to its preferred member.
    pub released: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Replica {
    /// The lease the replica believes it holds (etcd may have dropped it).
    pub session: Option<LeaseId>,
    /// The epoch of each cluster it believes it owns.
    pub owned: Vec<Option<Revision>>,
    /// The operation it drives, per cluster.
    pub holding: Vec<Option<Holding>>,
}

impl Replica {
    /// Its claim on `cluster`: only while it believes its lease alive, as
    /// `Replication::claim` does.
    pub fn claim(&self, cluster: ClusterId) -> Option<Claim> {
        Some(Claim {
            lease: self.session?,
            epoch: self.owned[cluster]?,
        })
    }

    /// Stops acting as an owner at once: every claim and every operation in
    /// flight goes with the session.
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Read PENDING: next, the write that starts it.
    Pending,
    /// RUNNING under this claim: next, the provider call.
    Running,
    /// The provider answered: next, completion.
    Called { ok: bool },
    /// Read RUNNING under another epoch: next, failing it as an orphan.
    Orphan,
}

impl Phase {
    /// Whether the next step is a write (the others are a provider call).
    pub fn writes_next(self) -> bool {
        !matches!(self, Phase::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client's request, accepted by any replica: one transaction on the
    /// state key's revision with no fencing, so which replica serves it does
    /// not matter and the action names none.
    Accept { cluster: ClusterId, kind: Kind },
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
    /// The owner reads the slot's operation and the revisions it will
    /// compare.
    Read {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// Writes the operation RUNNING under the owner's epoch.
    Start {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// The provider call with the owner's token; `succeeds` is the step's
    /// outcome if the provider takes the token.
    Call {
        replica: ReplicaId,
        cluster: ClusterId,
        succeeds: bool,
    },
    /// Ends the operation (succeeded, failed, or failed as an orphan):
    /// moves the cluster by the table and clears the slot.
    Finish {
        replica: ReplicaId,
        cluster: ClusterId,
    },
    /// etcd drops the lease and every key bound to it; its replica does not
    /// know.
    LeaseExpires { lease: LeaseId },
    /// A keep-alive answers "lease not found": the replica drops its
    /// session and claims.
    LeaseNotFound { replica: ReplicaId },
    /// Keep-alives failed for longer than the TTL while etcd still holds the
    /// lease: the replica gives up on it (it expires later, on its own).
    KeepAliveTimeout { replica: ReplicaId },
    /// A replica without a session grants a new lease and rebinds its
    /// member key to it.
    Rejoin { replica: ReplicaId },
}

impl Kind {
    fn event(self) -> Event {
        match self {
            Kind::Start => Event::StartRequested,
            Kind::Stop => Event::StopRequested,
        }
    }
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
        };
        State {
            replicas: (0..model.replicas).map(replica).collect(),
            provider: Provider::new(model.clusters),
            requests_left: model.requests,
            faults_left: model.faults,
            history: History::default(),
            store,
        }
    }

    /// Every action enabled in this state. A transaction whose compares
    /// would miss is still offered: [`step`] turns it into no step.
    pub fn actions(&self, actions: &mut Vec<Action>) {
        let clusters = self.store.states.len();
        for cluster in 0..clusters {
            let key = &self.store.states[cluster];
            for kind in [Kind::Start, Kind::Stop] {
                if self.requests_left > 0
                    && key.slot.is_none()
                    && machine::admit(key.state, kind.event()).is_some()
                {
                    actions.push(Action::Accept { cluster, kind });
                }
            }
        }
        for (replica, local) in self.replicas.iter().enumerate() {
            let Some(lease) = local.session else {
                actions.push(Action::Rejoin { replica });
                continue;
            };
            if !self.store.leases.contains(&lease) {
                actions.push(Action::LeaseNotFound { replica });
            } else if self.faults_left > 0 {
                actions.push(Action::KeepAliveTimeout { replica });
            }
            // Reconciling needs the replica in the member list it reads.
            let member = self.store.members[replica].is_some();
            for cluster in 0..clusters {
                let mine = preferred(&self.store, cluster) == Some(replica);
                match (local.owned[cluster], local.holding[cluster]) {
                    (None, _) if member && mine && self.store.owners[cluster].is_none() => {
                        actions.push(Action::Claim { replica, cluster })
                    }
                    (None, _) => {}
                    (Some(_), None) => {
                        if member && !mine {
                            // The real reconcile reads the slot empty and
                            // then releases without comparing it, so a
                            // request accepted in between is released with
                            // the cluster: offered whenever nothing is in
                            // flight here.
                            actions.push(Action::Release { replica, cluster });
                        }
                        if self.store.states[cluster].slot.is_some() {
                            actions.push(Action::Read { replica, cluster });
                        }
                    }
                    (Some(_), Some(holding)) => match holding.phase {
                        Phase::Pending => actions.push(Action::Start { replica, cluster }),
                        Phase::Running => {
                            let token = Token {
                                cluster,
                                epoch: holding.claim.epoch,
                                operation: holding.operation,
                            };
                            // A refused call fails whatever the step would
                            // have done: one outcome only.
                            let outcomes: &[bool] = if self.provider.refuses(token) {
                                &[false]
                            } else {
                                &[true, false]
                            };
                            for &succeeds in outcomes {
                                actions.push(Action::Call {
                                    replica,
                                    cluster,
                                    succeeds,
                                });
                            }
                        }
                        Phase::Called { .. } | Phase::Orphan => {
                            actions.push(Action::Finish { replica, cluster })
                        }
                    },
                }
            }
        }
        for &lease in &self.store.leases {
            // A lease its replica has given up on expires for sure; one
            // still in use expires only as one of the budgeted faults.
            let in_use = self.replicas.iter().any(|r| r.session == Some(lease));
            if !in_use || self.faults_left > 0 {
                actions.push(Action::LeaseExpires { lease });
            }
        }
    }

    /// The state after `action`, or `None` when it changes nothing (a
    /// transaction whose compares miss writes nothing, and its replica
    /// stops driving; see the property "a missed compare comes from a dead
    /// claim" for why that loses no behaviour).
    pub fn step(&self, model: &Drover, action: Action) -> Option<State> {
        let mut next = self.clone();
        match action {
            Action::Accept { cluster, kind } => next.accept(cluster, kind)?,
            Action::Claim { replica, cluster } => next.claim(replica, cluster)?,
            Action::Release { replica, cluster } => next.release(replica, cluster)?,
            Action::Read { replica, cluster } => next.read(model, replica, cluster)?,
            Action::Start { replica, cluster } => next.start(model, replica, cluster)?,
            Action::Call {
                replica,
                cluster,
                succeeds,
            } => next.call(replica, cluster, succeeds)?,
            Action::Finish { replica, cluster } => next.finish(model, replica, cluster)?,
            Action::LeaseExpires { lease } => {
                if self.replicas.iter().any(|r| r.session == Some(lease)) {
                    next.faults_left -= 1;
                }
                next.store.expire(lease);
            }
            Action::LeaseNotFound { replica } => next.replicas[replica].drop_session(),
            Action::KeepAliveTimeout { replica } => {
                next.faults_left -= 1;
                next.replicas[replica].drop_session();
            }
            Action::Rejoin { replica } => {
                next.replicas[replica].session = Some(next.store.join(replica));
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

    /// Records an owner write taking effect, and whether etcd still held
    /// the writer's lease at that moment.
    fn owner_wrote(&mut self, lease: LeaseId) {
        if !self.store.leases.contains(&lease) {
            self.history.write_without_lease = true;
        }
    }

    /// `Operations::accept`: compare the state key's revision (the slot is
    /// empty as read), move the state, fill the slot, write the record.
    fn accept(&mut self, cluster: ClusterId, kind: Kind) -> Option<()> {
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
            status: Status::Pending,
            mod_revision: revision,
        });
        let key = &mut self.store.states[cluster];
        key.state = entered;
        key.slot = Some(id);
        key.mod_revision = revision;
        self.requests_left -= 1;
        Some(())
    }

    /// `Replication::try_claim`: compare the owner key absent, put it bound
    /// to the replica's lease. The replica is in the member list, so etcd
    /// still holds that lease (its member key is bound to it).
    fn claim(&mut self, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let lease = self.replicas[replica].session?;
        self.owner_wrote(lease);
        let epoch = self.store.commit();
        self.store.owners[cluster] = Some(OwnerKey {
            replica,
            lease,
            create_revision: epoch,
        });
        self.replicas[replica].owned[cluster] = Some(epoch);
        Some(())
    }

    /// `Replication::release`: delete the owner key if it is still ours.
    fn release(&mut self, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let claim = self.replicas[replica].claim(cluster)?;
        if !self.store.owner_is(cluster, claim) {
            return None;
        }
        self.owner_wrote(claim.lease);
        self.store.commit();
        self.store.owners[cluster] = None;
        self.replicas[replica].owned[cluster] = None;
        self.history.released = true;
        Some(())
    }

    /// The start of `Executor::drive`: read the slot's operation and decide.
    fn read(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let claim = self.replicas[replica].claim(cluster)?;
        let key = &self.store.states[cluster];
        let operation = key.slot?;
        let record = &self.store.operations[operation];
        let phase = match record.status {
            Status::Pending => Phase::Pending,
            Status::Running { epoch } if epoch == claim.epoch => Phase::Running,
            Status::Running { .. } if model.orphan_recovery => {
                if model.fence_orphans {
                    self.provider.fence(cluster, claim.epoch);
                }
                Phase::Orphan
            }
            Status::Running { .. } => return None,
            // Completion clears the slot in the same transaction: a
            // terminal operation in the slot is ignored, as drive does
            // (and "one operation per cluster" says it cannot happen).
            _ => return None,
        };
        self.replicas[replica].holding[cluster] = Some(Holding {
            claim,
            operation,
            state_revision: key.mod_revision,
            operation_revision: record.mod_revision,
            held: key.state,
            phase,
        });
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
        if !self.store.holds(&holding.guard(cluster, model.fencing)) {
            return None;
        }
        self.owner_wrote(holding.claim.lease);
        Some(holding)
    }

    /// The first step boundary's `save_operation`: RUNNING under my epoch.
    fn start(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let mut holding = self.fenced_write(model, replica, cluster)?;
        let revision = self.store.commit();
        let record = &mut self.store.operations[holding.operation];
        record.status = Status::Running {
            epoch: holding.claim.epoch,
        };
        record.mod_revision = revision;
        holding.operation_revision = revision;
        holding.phase = Phase::Running;
        self.replicas[replica].holding[cluster] = Some(holding);
        Some(())
    }

    /// `Holding::call`: the replica still believes it owns the cluster
    /// (else it holds nothing), so the call goes out with its token.
    fn call(&mut self, replica: ReplicaId, cluster: ClusterId, succeeds: bool) -> Option<()> {
        let mut holding = self.replicas[replica].holding[cluster]?;
        let token = Token {
            cluster,
            epoch: holding.claim.epoch,
            operation: holding.operation,
        };
        let ok = if self.provider.refuses(token) {
            self.history.refused_stale = true;
            false
        } else {
            if self.store.operations[holding.operation]
                .status
                .is_terminal()
            {
                self.history.call_after_end = true;
            }
            self.provider.accept(token);
            succeeds
        };
        holding.phase = Phase::Called { ok };
        self.replicas[replica].holding[cluster] = Some(holding);
        Some(())
    }

    /// `Holding::finish`: move the cluster from the state as read by the
    /// outcome's event (`final_state`), clear the slot, end the record.
    fn finish(&mut self, model: &Drover, replica: ReplicaId, cluster: ClusterId) -> Option<()> {
        let holding = self.fenced_write(model, replica, cluster)?;
        let (status, event) = match holding.phase {
            Phase::Called { ok: true } => (Status::Succeeded, Event::OperationSucceeded),
            Phase::Called { ok: false } => (Status::Failed, Event::OperationFailed),
            Phase::Orphan => (Status::Orphaned, Event::OperationFailed),
            Phase::Pending | Phase::Running => return None,
        };
        let revision = self.store.commit();
        let record = &mut self.store.operations[holding.operation];
        // The slice's only go-ahead (stop from Created) leaves the state
        // alone however it ends, as `final_state` does; an outcome with no
        // edge leaves it too.
        let to = if record.go_ahead {
            holding.held
        } else {
            machine::next(holding.held, event).unwrap_or(holding.held)
        };
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
