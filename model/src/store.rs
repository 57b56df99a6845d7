//! etcd as the protocol sees it: one linearizable store with a global
//! revision, keys that remember their create and mod revisions and the lease
//! they are bound to, and transactions whose compares and writes apply as one
//! atomic step of the model.

use drover_machine::ClusterState;
use std::collections::BTreeSet;

/// etcd's revision: every transaction that writes bumps it by one.
pub type Revision = u32;
/// A lease id; every lease ever granted has a fresh one.
pub type LeaseId = u8;
pub type ReplicaId = usize;
pub type ClusterId = usize;
/// An operation's index in [`Store::operations`], in order of acceptance.
pub type OperationId = usize;

/// A lifecycle request the clients of the model make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Start,
    Stop,
    Upgrade,
}

impl Kind {
    /// How many steps its plan has, each a mutating provider call whose
    /// index is recorded before the call. A start is two (provision or
    /// power on, then bring up), so that a drive can stop between steps and
    /// resume; the others are one.
    pub fn steps(self) -> u8 {
        match self {
            Kind::Start => 2,
            Kind::Stop | Kind::Upgrade => 1,
        }
    }

    /// Whether its plan is made from the nodes as the provider describes
    /// them (`executor::needs_nodes`): an upgrade plans one step per node
    /// not yet at the target. The others are planned without asking, so an
    /// accept on the owner can claim them.
    pub fn needs_nodes(self) -> bool {
        matches!(self, Kind::Upgrade)
    }
}

/// An operation record's state (`operations/<cluster>/<id>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    /// Run by the owner whose claim had this epoch, at this step (the
    /// progress recorded before the step's call).
    Running {
        epoch: Revision,
        step: u8,
    },
    Succeeded,
    Failed,
    /// Failed by a new owner that found it RUNNING under another epoch:
    /// under the fail policy, or once it was orphaned too often.
    Orphaned,
}

impl Status {
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Orphaned)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Operation {
    pub cluster: ClusterId,
    pub kind: Kind,
    /// Accepted without an edge: it leaves the state alone when it ends.
    pub go_ahead: bool,
    pub status: Status,
    /// How many owners lost it while it ran and a later one resumed it
    /// (the epochs the record shows, less one).
    pub orphaned: u8,
    pub mod_revision: Revision,
}

/// `clusters/<cluster>/state`: the state and the operation slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateKey {
    pub state: ClusterState,
    pub slot: Option<OperationId>,
    pub mod_revision: Revision,
}

/// `owners/<cluster>`, bound to the owner's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    pub replica: ReplicaId,
    pub lease: LeaseId,
    /// The epoch: a new owner key always has a newer create revision.
    pub create_revision: Revision,
    /// Not etcd's: whether the key was ever bound to a lease no member
    /// key held (its replica deposed), so that a drainer may have read it
    /// as a departed incarnation's. It stays set when the replica writes
    /// its member key again: a drain read before that still deletes it,
    /// as its compares (lease, create revision) still hold.
    pub departed: bool,
}

/// A replica's ownership of one cluster, as the replica believes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    pub lease: LeaseId,
    /// The owner key's create revision.
    pub create_revision: Revision,
    /// The fencing epoch: the epoch base it claimed under plus the create
    /// revision (`replication::fencing_epoch`).
    pub epoch: Revision,
}

impl OwnerKey {
    /// Whether this key is the one `claim` was made with: the fence every
    /// owner write compares (lease and create revision).
    pub fn is(&self, claim: Claim) -> bool {
        self.lease == claim.lease && self.create_revision == claim.create_revision
    }
}

/// `fence`: the epoch base every claim is made under, which history of
/// etcd it was written in (a restore starts a new one: the raft index the
/// real record keeps), and the record's mod revision, which every claim
/// compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Fence {
    pub base: Revision,
    pub history: u8,
    pub mod_revision: Revision,
}

/// The fence record as a replica read it: what its claims use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FenceView {
    pub base: Revision,
    pub revision: Revision,
}

impl Fence {
    pub fn view(&self) -> FenceView {
        FenceView {
            base: self.base,
            revision: self.mod_revision,
        }
    }
}

/// How far the wall clock moves per revision: faster (microseconds
/// against a few thousand writes a second), so a base taken from it
/// lands above every epoch handed out before.
const CLOCK_PER_REVISION: Revision = 3;

/// The compares of an executor write: the state key and the operation as
/// last read and, when fencing, the owner key as claimed.
#[derive(Debug, Clone, Copy)]
pub struct Guard {
    pub cluster: ClusterId,
    pub state_revision: Revision,
    pub operation: OperationId,
    pub operation_revision: Revision,
    pub owner: Option<Claim>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Store {
    pub revision: Revision,
    /// Which history of etcd this is: a restore starts a new one (a new
    /// raft log) and does not set it back.
    pub history: u8,
    /// The wall clock, which a restore does not set back either.
    pub clock: Revision,
    pub fence: Fence,
    /// Leases etcd still holds.
    pub leases: BTreeSet<LeaseId>,
    next_lease: LeaseId,
    /// `members/<replica>`: the lease it is bound to.
    pub members: Vec<Option<LeaseId>>,
    pub owners: Vec<Option<OwnerKey>>,
    pub states: Vec<StateKey>,
    pub operations: Vec<Operation>,
}

impl Store {
    /// `clusters` clusters in Created and no owners; each replica has joined
    /// (its lease is the replica's index).
    pub fn new(replicas: usize, clusters: usize) -> Self {
        let mut store = Store {
            revision: 0,
            history: 0,
            clock: 0,
            fence: Fence::default(),
            leases: BTreeSet::new(),
            next_lease: 0,
            members: vec![None; replicas],
            owners: vec![None; clusters],
            states: Vec::with_capacity(clusters),
            operations: Vec::new(),
        };
        for _ in 0..clusters {
            let mod_revision = store.commit();
            store.states.push(StateKey {
                state: ClusterState::Created,
                slot: None,
                mod_revision,
            });
        }
        for replica in 0..replicas {
            store.join(replica);
        }
        store
    }

    /// The revision of a transaction that writes.
    pub fn commit(&mut self) -> Revision {
        self.revision += 1;
        self.clock += CLOCK_PER_REVISION;
        self.revision
    }

    /// Writes the fence record with a new base, as a replica that takes
    /// etcd for restored does: the clock less the revision, so that the
    /// next epoch is about the clock; never below the recorded base + 1.
    /// `from_record` takes the restored record's base + 1 instead (the
    /// scheme Drover had: a restored record rolls back with the data).
    pub fn rebase(&mut self, from_record: bool) -> FenceView {
        let base = match from_record {
            true => self.fence.base + 1,
            false => (self.clock - self.revision).max(self.fence.base + 1),
        };
        let mod_revision = self.commit();
        self.fence = Fence {
            base,
            history: self.history,
            mod_revision,
        };
        self.fence.view()
    }

    /// `etcdctl snapshot restore` of a snapshot taken at `revision` with
    /// the fence record `fence`, every replica stopped first: a new
    /// history, the revision and the fence record back to the snapshot's,
    /// every lease and every key bound to one gone, and every other key
    /// as written at or before the snapshot's revision (see the crate's
    /// caveats for what this leaves out).
    pub fn restore(&mut self, revision: Revision, fence: Fence) {
        for lease in self.leases.clone() {
            self.expire(lease);
        }
        self.history += 1;
        self.revision = revision;
        self.fence = fence;
        for key in &mut self.states {
            key.mod_revision = key.mod_revision.min(revision);
        }
        for operation in &mut self.operations {
            operation.mod_revision = operation.mod_revision.min(revision);
        }
    }

    /// Grants a lease and puts `members/<replica>` bound to it (rebinding
    /// the key if an older lease of the replica still lives).
    pub fn join(&mut self, replica: ReplicaId) -> LeaseId {
        let lease = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(lease);
        self.members[replica] = Some(lease);
        self.commit();
        lease
    }

    /// The lease runs out: etcd deletes every key bound to it, in one
    /// revision.
    pub fn expire(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
        let mut deleted = false;
        for member in self.members.iter_mut().filter(|m| **m == Some(lease)) {
            *member = None;
            deleted = true;
        }
        for owner in self
            .owners
            .iter_mut()
            .filter(|o| o.is_some_and(|o| o.lease == lease))
        {
            *owner = None;
            deleted = true;
        }
        if deleted {
            self.commit();
        }
    }

    /// A peer removes the member key bound to `lease` (compared), leaving
    /// the lease and its owner keys: whether it was there.
    pub fn depose(&mut self, lease: LeaseId) -> bool {
        let Some(member) = self.members.iter_mut().find(|m| **m == Some(lease)) else {
            return false;
        };
        *member = None;
        for owner in self.owners.iter_mut().flatten() {
            owner.departed |= owner.lease == lease;
        }
        self.commit();
        true
    }

    /// Deletes `owners/<cluster>` if it is still `seen` (its lease and
    /// create revision compared): whether it was.
    pub fn drain(&mut self, cluster: ClusterId, seen: OwnerKey) -> bool {
        let same = self.owners[cluster].is_some_and(|owner| {
            owner.lease == seen.lease && owner.create_revision == seen.create_revision
        });
        if same {
            self.owners[cluster] = None;
            self.commit();
        }
        same
    }

    /// Puts `members/<replica>` again, bound to `lease`, which fails if
    /// etcd no longer holds the lease: whether it took.
    pub fn reregister(&mut self, replica: ReplicaId, lease: LeaseId) -> bool {
        if !self.leases.contains(&lease) || self.members[replica].is_some() {
            return false;
        }
        self.members[replica] = Some(lease);
        self.commit();
        true
    }

    /// Whether a member key is bound to `lease`.
    pub fn is_member_lease(&self, lease: LeaseId) -> bool {
        self.members.contains(&Some(lease))
    }

    /// Whether an owner key is bound to `lease`.
    pub fn binds_owner_key(&self, lease: LeaseId) -> bool {
        self.owners
            .iter()
            .flatten()
            .any(|owner| owner.lease == lease)
    }

    /// Replicas with a member key, in id order.
    pub fn live_members(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, lease)| lease.is_some())
            .map(|(replica, _)| replica)
    }

    /// Whether every compare of `guard` holds now.
    pub fn holds(&self, guard: &Guard) -> bool {
        self.states[guard.cluster].mod_revision == guard.state_revision
            && self.operations[guard.operation].mod_revision == guard.operation_revision
            && guard
                .owner
                .is_none_or(|claim| self.owner_is(guard.cluster, claim))
    }

    /// Whether `owners/<cluster>` is the key `claim` was made with.
    pub fn owner_is(&self, cluster: ClusterId, claim: Claim) -> bool {
        self.owners[cluster].is_some_and(|owner| owner.is(claim))
    }
}
