//! What the checker asserts. `always` properties hold in every reachable
//! state; the `eventually` one holds on every path by the time it ends;
//! `sometimes` ones are scenarios that must be reachable (where the check's
//! budgets allow them), so that the others are not true for want of trying.

use crate::protocol::State;
use crate::store::Status;
use crate::{Drover, Flaw};
use stateright::Property;

pub const ONE_OPERATION: &str = "at most one operation holds a cluster";
pub const EDGES_ONLY: &str = "every state change is an edge of the table";
pub const EPOCHS_GROW: &str = "the provider never takes an older epoch";
pub const NONE_BESIDE: &str = "no call runs beside a newer epoch's";
pub const LIVE_LEASE_WRITES: &str = "no owner write takes effect without its lease";
pub const OWNER_KEY_WRITES: &str =
    "no owner write of a live lease takes effect without its owner key";
pub const MISSES_ARE_DEAD: &str = "a missed compare comes from a dead claim";
pub const EVERYTHING_ENDS: &str = "every request is made and every operation ends";
pub const ORPHAN_FAILED: &str = "a new owner fails an orphaned operation";
pub const ORPHAN_RESUMED: &str = "a new owner resumes an orphaned operation";
pub const DRAINED: &str = "a newer epoch drains an older call";
pub const STALE_REFUSED: &str = "the provider refuses a stale epoch";
pub const TWO_BELIEVERS: &str = "a zombie and a new owner both believe they own a cluster";
pub const HANDED_BACK: &str = "an idle cluster is released to its preferred member";
pub const SUCCEEDS: &str = "an operation succeeds";
pub const NO_LATE_CALL: &str = "no call lands after its operation ended";
pub const STEPS_FORWARD: &str = "an operation's steps land in order";
pub const SUCCESS_SHOWN: &str = "an operation succeeds only after each of its steps worked";
pub const FENCE_RETRIED: &str = "a failed fence keeps the orphan's slot";
pub const RESUMED: &str = "a drive that ended early is resumed under its claim";
pub const CLAIMED_AT_ACCEPT: &str = "an accept on the owner claims its operation";
pub const CALL_OUTLIVES_DRIVE: &str = "a call is in flight after its drive ended";
pub const HANDED_OVER: &str = "an owner hands over a cluster whose operation it drives";
pub const CLAIMS_ABOVE_SEEN: &str =
    "a new owner's epoch is above every epoch the provider saw for the cluster";
pub const BASE_FOLLOWED: &str = "a replica takes up the epoch base another replica set";
pub const CLAIMED_AFTER_RESTORE: &str = "a cluster is claimed after a restore";
pub const OWNER_DRAINED: &str = "a departed incarnation's owner key is drained";
pub const REREGISTERED: &str = "a replica deposed while alive is a member again";
pub const ACCEPTED_FOR_OWNER: &str =
    "an accept on another replica claims its operation for the owner";
pub const OUTLIVED: &str = "an owner whose lease lives believes it owns a cluster claimed anew";

pub fn all() -> Vec<Property<Drover>> {
    vec![
        Property::always(ONE_OPERATION, one_operation),
        Property::always(EDGES_ONLY, edges_only),
        Property::always(EPOCHS_GROW, epochs_grow),
        Property::always(NONE_BESIDE, none_beside),
        Property::always(LIVE_LEASE_WRITES, live_lease_writes),
        Property::always(OWNER_KEY_WRITES, |_, s: &State| !s.history.write_off_key),
        Property::always(MISSES_ARE_DEAD, misses_are_dead),
        Property::eventually(EVERYTHING_ENDS, everything_ends),
        Property::sometimes(ORPHAN_FAILED, |_, s: &State| {
            s.store
                .operations
                .iter()
                .any(|o| o.status == Status::Orphaned)
        }),
        Property::sometimes(ORPHAN_RESUMED, |_, s: &State| {
            s.store.operations.iter().any(|o| o.orphaned > 0)
        }),
        Property::sometimes(DRAINED, |_, s: &State| s.history.drained),
        Property::sometimes(STALE_REFUSED, stale_call_in_flight),
        Property::sometimes(TWO_BELIEVERS, two_believers),
        Property::sometimes(HANDED_BACK, |_, s: &State| s.history.released),
        Property::sometimes(SUCCEEDS, |_, s: &State| {
            s.store
                .operations
                .iter()
                .any(|o| o.status == Status::Succeeded)
        }),
        Property::always(NO_LATE_CALL, |_, s: &State| !s.history.call_after_end),
        Property::always(STEPS_FORWARD, steps_forward),
        Property::always(SUCCESS_SHOWN, success_shown),
        Property::sometimes(FENCE_RETRIED, |_, s: &State| s.history.fence_retried),
        Property::sometimes(RESUMED, |_, s: &State| s.history.resumed),
        Property::sometimes(CLAIMED_AT_ACCEPT, claimed_at_accept),
        Property::sometimes(CALL_OUTLIVES_DRIVE, call_outlives_drive),
        Property::sometimes(HANDED_OVER, |_, s: &State| s.history.handed_over),
        Property::always(CLAIMS_ABOVE_SEEN, |_, s: &State| !s.history.stale_claim),
        Property::sometimes(BASE_FOLLOWED, |_, s: &State| s.history.followed_base),
        Property::sometimes(CLAIMED_AFTER_RESTORE, |_, s: &State| {
            s.history.claimed_after_restore
        }),
        Property::sometimes(OWNER_DRAINED, |_, s: &State| s.history.owner_drained),
        Property::sometimes(REREGISTERED, |_, s: &State| s.history.reregistered),
        Property::sometimes(OUTLIVED, outlived),
        Property::sometimes(ACCEPTED_FOR_OWNER, |_, s: &State| {
            s.history.accepted_for_owner
        }),
    ]
}

/// The slot holds a live operation, and no other operation of the cluster
/// is PENDING or RUNNING.
fn one_operation(_: &Drover, state: &State) -> bool {
    state.store.states.iter().enumerate().all(|(cluster, key)| {
        let mut live = state
            .store
            .operations
            .iter()
            .enumerate()
            .filter(|(_, o)| o.cluster == cluster && !o.status.is_terminal())
            .map(|(id, _)| id);
        live.next() == key.slot && live.next().is_none()
    })
}

/// Compared, for every step, with the state etcd held just before it.
fn edges_only(_: &Drover, state: &State) -> bool {
    state.history.illegal_transition.is_none()
}

/// Per cluster, the applied calls' epochs never decrease; so in
/// particular an operation's calls never go back to an older epoch: once
/// a new owner's call for a resumed orphan applied, none of the lost
/// owner's does. (This said too that every operation's calls carry one
/// epoch, while an orphan was always failed; now an orphan resumed by a
/// new owner has the calls of each epoch that ran it, in order.)
fn epochs_grow(_: &Drover, state: &State) -> bool {
    state.provider.accepted.iter().all(|calls| {
        calls
            .iter()
            .zip(calls.iter().skip(1))
            .all(|(earlier, later)| later.token.epoch >= earlier.token.epoch)
    })
}

/// No call runs at the provider under an epoch older than one the
/// provider has admitted for its cluster: a resumed step never runs beside
/// a late call of the owner that lost the operation.
fn none_beside(_: &Drover, state: &State) -> bool {
    state
        .provider
        .running
        .iter()
        .all(|c| !state.provider.refuses(c.cluster, c.epoch))
}

/// Per operation, no step's call lands after a call of a later step did:
/// a drive resumed under its claim repeats at most the step it recorded
/// (steps are idempotent), never one before it.
fn steps_forward(_: &Drover, state: &State) -> bool {
    state.provider.accepted.iter().all(|calls| {
        calls.iter().enumerate().all(|(i, earlier)| {
            calls[i + 1..].iter().all(|later| {
                later.token.operation != earlier.token.operation
                    || later.token.step >= earlier.token.step
            })
        })
    })
}

/// Drover never reports a success the provider did not show: an operation
/// that SUCCEEDED had every step of its plan taken and worked.
fn success_shown(_: &Drover, state: &State) -> bool {
    state
        .store
        .operations
        .iter()
        .enumerate()
        .filter(|(_, o)| o.status == Status::Succeeded)
        .all(|(id, o)| (1..=o.kind.steps()).all(|step| state.provider.did(o.cluster, id, step)))
}

/// Every owner write (claim, start, completion, release) that took effect
/// did so while etcd still held the writer's lease. Since a depose leaves
/// a live replica its lease, that no longer keeps out the owner it
/// deposed: [`OWNER_KEY_WRITES`] does (its key drained, its writes miss).
fn live_lease_writes(_: &Drover, state: &State) -> bool {
    !state.history.write_without_lease
}

/// Stable once true (requests are only ever used up, operations never
/// leave a terminal state), so checking it where a path ends is exact.
fn everything_ends(_: &Drover, state: &State) -> bool {
    state.requests_left == 0
        && state
            .store
            .operations
            .iter()
            .all(|o| o.status.is_terminal())
}

/// The model turns a transaction whose compares miss, and a fenced read
/// the provider refuses, into no step, and its replica then holds the
/// operation until it drops its session, or until its pass finds its owner
/// key drained (its lease alive: it was deposed) and forgets the claim.
/// That loses no behaviour only if a miss means the claim is dead for
/// good: the owner key it compares is gone and, its create revision being
/// in the past, can never come back.
fn misses_are_dead(model: &Drover, state: &State) -> bool {
    let fencing = !model.has(Flaw::NoOwnerCompare);
    state.replicas.iter().all(|replica| {
        replica
            .holding
            .iter()
            .enumerate()
            .all(|(cluster, holding)| {
                holding.is_none_or(|h| {
                    let misses = (h.phase.writes_next()
                        && !state.store.holds(&h.guard(cluster, fencing)))
                        || (h.phase.reads_next() && state.provider.refuses(cluster, h.claim.epoch));
                    !misses || !state.store.owner_is(cluster, h.claim)
                })
            })
    })
}

/// Two replicas believe they own the same cluster (one is a zombie, or
/// deposed and its key drained).
fn two_believers(_: &Drover, state: &State) -> bool {
    (0..state.store.states.len()).any(|cluster| {
        state
            .replicas
            .iter()
            .filter(|r| r.claim(cluster).is_some())
            .count()
            > 1
    })
}

/// A slot's operation is RUNNING as of the revision that filled the slot:
/// the accept wrote it so (these are observations of the present state, not
/// history kept in it, so that they do not multiply the states).
fn claimed_at_accept(_: &Drover, state: &State) -> bool {
    state.store.states.iter().any(|key| {
        key.slot.is_some_and(|id| {
            let record = &state.store.operations[id];
            matches!(record.status, Status::Running { .. })
                && record.mod_revision == key.mod_revision
        })
    })
}

/// A call is in flight that no drive waits for: its drive ended with its
/// replica's session, and the call lands whenever it arrives.
fn call_outlives_drive(_: &Drover, state: &State) -> bool {
    state.calls.iter().any(|&call| {
        !state
            .replicas
            .iter()
            .filter_map(|r| r.holding[call.cluster])
            .any(|h| h.awaits(call))
    })
}

/// A replica whose lease etcd still holds believes it owns a cluster whose
/// owner key is another replica's: it was deposed while alive, its key
/// drained and the cluster claimed anew. Its lease does not fence it; its
/// owner key's compare does (every fenced write compares lease and create
/// revision, [`OWNER_KEY_WRITES`]).
fn outlived(_: &Drover, state: &State) -> bool {
    state.replicas.iter().enumerate().any(|(replica, local)| {
        local
            .session
            .is_some_and(|l| state.store.leases.contains(&l))
            && (0..state.store.owners.len()).any(|cluster| {
                local.claim(cluster).is_some()
                    && state.store.owners[cluster].is_some_and(|o| o.replica != replica)
            })
    })
}

/// A call in flight carries an epoch older than one the provider has seen:
/// it will be refused when it lands.
fn stale_call_in_flight(_: &Drover, state: &State) -> bool {
    state
        .calls
        .iter()
        .any(|c| state.provider.refuses(c.cluster, c.epoch))
}
