//! Exhaustive checks of the protocol, and of variants with one flaw seeded
//! each, which the checker must catch. Run with `--nocapture` to see the
//! states explored and the counterexamples.

use drover_model::properties::{
    BASE_FOLLOWED, CALL_OUTLIVES_DRIVE, CLAIMED_AFTER_RESTORE, CLAIMS_ABOVE_SEEN, DRAINED,
    EPOCHS_GROW, EVERYTHING_ENDS, FENCE_RETRIED, HANDED_OVER, LIVE_LEASE_WRITES, NONE_BESIDE,
    NO_LATE_CALL, ORPHAN_FAILED, ORPHAN_RESUMED, OUTLIVED, OWNER_DRAINED, OWNER_KEY_WRITES,
    REREGISTERED, RESUMED, STALE_REFUSED, STEPS_FORWARD, SUCCESS_SHOWN, TWO_BELIEVERS,
};
use drover_model::{Drover, Flaw, OrphanPolicy};
use stateright::{Checker, Expectation, HasDiscoveries, Model};
use std::time::Instant;

/// Explores every reachable state and asserts every property, except that
/// the scenarios in `beyond` are asserted unreachable (their budget is not
/// given here), which keeps that list honest; so is a hand-over without
/// its budget, a rebase and a restore, and a depose (with a lease loss to
/// give up a lease or to depose a replica that is alive) and what follows
/// it.
fn check(model: Drover, beyond: &[&str]) {
    let mut beyond = beyond.to_vec();
    if model.handovers == 0 {
        beyond.push(HANDED_OVER);
    }
    if model.rebases == 0 {
        beyond.push(BASE_FOLLOWED);
    }
    if model.restores == 0 {
        beyond.push(CLAIMED_AFTER_RESTORE);
    }
    if model.deposes == 0 || model.faults == 0 {
        beyond.extend([OWNER_DRAINED, REREGISTERED, OUTLIVED]);
    }
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "{model:?}: {} states explored ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for property in model.properties() {
        match property.expectation {
            Expectation::Sometimes if !beyond.contains(&property.name) => {
                checker.assert_any_discovery(property.name);
            }
            _ => checker.assert_no_discovery(property.name),
        }
    }
}

/// Asserts that the checker finds a counterexample for `property`, and
/// shows it.
fn refute(model: Drover, property: &'static str) {
    let started = Instant::now();
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(property);
    println!(
        "{model:?}: \"{property}\" refuted after {} unique states, in {:.1?}:",
        checker.unique_state_count(),
        started.elapsed()
    );
    for action in path.into_actions() {
        println!("  {action:?}");
    }
}

/// Two lease losses and a failed provider read: a new owner whose fence
/// fails, then loses its own lease, an orphan resumed and then failed, and
/// the like. (No drive ends early and no call is slow: with those too the
/// states run into tens of millions.)
#[test]
fn two_replicas_one_cluster() {
    let model = Drover {
        stalls: 0,
        slow_calls: 0,
        ..Drover::new(2, 1, 2, 2)
    };
    check(model, &[RESUMED, DRAINED]);
}

/// One of each fault: a lease loss, a failed provider read, a drive that
/// ends early, a slow call. One lease loss resumes its orphan.
#[test]
fn two_replicas_one_cluster_every_fault() {
    check(Drover::new(2, 1, 2, 1), &[]);
}

/// With `--orphaned-operations=fail`, as the reference does.
#[test]
fn two_replicas_one_cluster_orphans_failed() {
    let model = Drover {
        orphans: OrphanPolicy::Fail,
        ..Drover::new(2, 1, 2, 1)
    };
    check(model, &[ORPHAN_RESUMED]);
}

#[test]
fn three_replicas_one_cluster() {
    check(Drover::new(3, 1, 2, 1), &[]);
}

/// One request only: with two, the interleavings of two clusters' drives
/// take minutes.
#[test]
fn two_replicas_two_clusters() {
    check(Drover::new(2, 2, 1, 1), &[]);
}

/// A depose beside a lease loss (one or the other: a depose of a replica
/// that is alive spends the lease loss): the deposed owner goes on driving
/// its operation under its live lease until its key is drained, the
/// preferred member drains it and claims, fences the provider and resumes
/// the orphan; the deposed replica writes its member key again and
/// forgets the claim it lost; a replica that gave its lease up is deposed
/// and its keys drained before the lease expires. (No drive ends early:
/// with that too the states run into the tens of millions; so an orphan is
/// resumed but never orphaned twice, which takes two lease losses.)
#[test]
fn two_replicas_one_cluster_deposed() {
    let model = Drover {
        deposes: 1,
        stalls: 0,
        ..Drover::new(2, 1, 2, 1)
    };
    check(model, &[RESUMED, ORPHAN_FAILED]);
}

/// A third replica: the deposed one comes back while another is preferred,
/// and a drain by one member races the deposed replica writing its member
/// key again.
#[test]
fn three_replicas_one_cluster_deposed() {
    let model = Drover {
        deposes: 1,
        ..Drover::new(3, 1, 1, 1)
    };
    check(model, &[]);
}

/// Two clusters: a deposed replica's keys drained one by one, a claim
/// forgotten while it still owns the other cluster. (No drive ends early
/// and no call is slow.)
#[test]
fn two_replicas_two_clusters_deposed() {
    let model = Drover {
        deposes: 1,
        stalls: 0,
        slow_calls: 0,
        ..Drover::new(2, 2, 1, 1)
    };
    check(model, &[RESUMED, DRAINED, ORPHAN_FAILED]);
}

/// Without the owner-key compare a replica whose lease expired while it
/// held an operation writes it anyway.
#[test]
fn without_fencing_a_dead_lease_writes() {
    let model = Drover::new(2, 1, 1, 1).with(Flaw::NoOwnerCompare);
    refute(model, LIVE_LEASE_WRITES);
}

/// Without the owner-key compare, an owner deposed while alive (its lease
/// lives on) writes after its key was drained.
#[test]
fn without_fencing_a_deposed_owner_writes_without_its_key() {
    let model = Drover {
        deposes: 1,
        ..Drover::new(2, 1, 1, 1)
    }
    .with(Flaw::NoOwnerCompare);
    refute(model, OWNER_KEY_WRITES);
}

/// A takeover that puts its owner key over the departed one instead of
/// draining it and claiming afresh keeps the key's create revision: the
/// new owner's epoch is the deposed owner's, which the provider saw.
#[test]
fn taking_over_by_overwriting_the_departed_key_repeats_its_epoch() {
    let model = Drover {
        deposes: 1,
        ..Drover::new(2, 1, 1, 1)
    }
    .with(Flaw::TakeoverByOverwrite);
    refute(model, CLAIMS_ABOVE_SEEN);
}

/// An accept on the owner that claims without comparing the owner key:
/// a replica whose lease expired unknown to it writes the record RUNNING
/// under its dead epoch.
#[test]
fn claiming_at_accept_without_fencing_a_dead_lease_writes() {
    let model = Drover::new(2, 1, 1, 1).with(Flaw::UnfencedClaimAtAccept);
    refute(model, LIVE_LEASE_WRITES);
}

/// The same for an accept on another replica that claims for the owner
/// from a stale view of the owner keys without comparing the key: the
/// record lands RUNNING under a lost owner's epoch.
#[test]
fn claiming_for_the_owner_without_fencing_a_dead_lease_writes() {
    let model = Drover::new(2, 1, 1, 1).with(Flaw::UnfencedAcceptForOwner);
    refute(model, LIVE_LEASE_WRITES);
}

/// Without orphan recovery an operation whose owner was lost mid-run
/// never ends: the liveness check has teeth too.
#[test]
fn without_orphan_recovery_an_operation_never_ends() {
    let model = Drover::new(2, 1, 1, 1).with(Flaw::NoOrphanRecovery);
    refute(model, EVERYTHING_ENDS);
}

/// Without announcing the new epoch before failing an orphan, a zombie's
/// call can land after its operation ended.
#[test]
fn without_fencing_orphans_a_zombie_call_lands_late() {
    let model = Drover {
        orphans: OrphanPolicy::Fail,
        ..Drover::new(2, 1, 1, 1)
    }
    .with(Flaw::UnfencedOrphans);
    refute(model, NO_LATE_CALL);
}

/// Failing the orphan when the fencing describe fails, as Drover did: the
/// old owner's call, sent before and still in flight, lands after the
/// operation is FAILED.
#[test]
fn failing_the_orphan_without_a_fence_lets_a_stale_call_land_late() {
    let model = Drover {
        orphans: OrphanPolicy::Fail,
        ..Drover::new(2, 1, 1, 1)
    }
    .with(Flaw::OrphanFailedWhenFenceFails);
    refute(model, NO_LATE_CALL);
}

/// Planning from a describe that failed, as Drover did: no steps, and an
/// upgrade reported SUCCEEDED with no node upgraded.
#[test]
fn planning_from_a_failed_read_reports_success_not_shown() {
    let model = Drover::new(2, 1, 2, 0).with(Flaw::PlanFromFailedRead);
    refute(model, SUCCESS_SHOWN);
}

/// A drive resumed under its claim that starts again at the first step
/// runs a step after a later one landed.
#[test]
fn resuming_at_the_first_step_runs_a_step_again() {
    let model = Drover::new(2, 1, 1, 0).with(Flaw::ResumeFromFirstStep);
    refute(model, STEPS_FORWARD);
}

/// Resuming an orphan with a provider that does not drain: the lost
/// owner's call, admitted before the new owner's fence, runs beside the
/// resumed step and applies after it, under the older epoch.
#[test]
fn resuming_without_the_drain_lets_an_old_call_land_after_the_resumed_step() {
    let model = Drover::new(2, 1, 1, 1).with(Flaw::NoDrain);
    refute(model, NONE_BESIDE);
    refute(model, EPOCHS_GROW);
}

/// A gray failure's hand-over beside a lease loss: the owner releases the
/// cluster whose operation it drives, its call in flight; the next owner
/// fences the provider and resumes the orphan (and fails it when a lease
/// loss orphans it again), and every property holds. (No drive ends
/// early: with that too the states run into tens of millions.)
#[test]
fn a_hand_over_is_recovered_like_a_lost_owner() {
    let model = Drover {
        handovers: 1,
        stalls: 0,
        ..Drover::new(2, 1, 2, 1)
    };
    check(model, &[RESUMED]);
}

/// A hand-over leaves an orphan as a lost lease does: failed without
/// announcing the new epoch first, the old owner's call still in flight
/// lands after the operation ended.
#[test]
fn handing_over_to_an_owner_that_does_not_fence_lets_the_old_call_land_late() {
    let model = Drover {
        handovers: 1,
        orphans: OrphanPolicy::Fail,
        ..Drover::new(2, 1, 1, 0)
    }
    .with(Flaw::UnfencedOrphans);
    refute(model, NO_LATE_CALL);
}

/// A replica joining through a lagging etcd member sets a new epoch base
/// while its peer owns a cluster; the peer's next claim fails on the fence
/// record, it reads the record again and claims under the new base, and
/// every property holds (a lease loss moves the cluster between them).
#[test]
fn a_join_through_a_lagging_member_moves_every_replica_to_one_base() {
    let model = with_a_lagging_member();
    check(model, &[RESUMED, DRAINED, FENCE_RETRIED, ORPHAN_FAILED]);
}

/// Without the fence record's compare in every claim, a replica that read
/// the old base claims after its peer set a new one: its epoch is below
/// the one the provider saw from the peer.
#[test]
fn claiming_without_the_fence_compare_claims_below_a_seen_epoch() {
    let model = with_a_lagging_member().with(Flaw::NoFenceCompare);
    refute(model, CLAIMS_ABOVE_SEEN);
}

/// The same snapshot restored twice, operations run after each: every
/// claim after a restore is above every epoch the provider saw.
#[test]
fn restoring_one_snapshot_twice_keeps_epochs_growing() {
    let model = with_two_restores();
    // An orphan is resumed without a fault: an owner that releases its
    // cluster before it picks up the operation an accept elsewhere claimed
    // for it leaves that operation to the next owner.
    let beyond = [RESUMED, DRAINED, FENCE_RETRIED, ORPHAN_FAILED];
    check(
        model,
        &[
            &beyond[..],
            &[STALE_REFUSED, TWO_BELIEVERS, CALL_OUTLIVES_DRIVE],
        ]
        .concat(),
    );
}

/// A restore whose base is the restored record's plus one (Drover's
/// generation): the second restore of one snapshot hands out the first
/// restore's epochs again, below what the provider saw.
#[test]
fn a_base_from_the_restored_record_repeats_epochs_after_a_second_restore() {
    let model = with_two_restores().with(Flaw::BaseFromRestoredRecord);
    refute(model, CLAIMS_ABOVE_SEEN);
}

/// Two replicas, one cluster, one request and one lease loss, with one
/// join through a lagging member (and no other fault, to keep it small).
fn with_a_lagging_member() -> Drover {
    Drover {
        rebases: 1,
        stalls: 0,
        slow_calls: 0,
        read_errors: 0,
        ..Drover::new(2, 1, 1, 1)
    }
}

/// Two replicas, one cluster, two requests and the snapshot restored
/// twice (no other fault).
fn with_two_restores() -> Drover {
    Drover {
        restores: 2,
        stalls: 0,
        slow_calls: 0,
        read_errors: 0,
        ..Drover::new(2, 1, 2, 0)
    }
}
