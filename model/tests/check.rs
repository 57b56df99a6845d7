//! Exhaustive checks of the protocol, and of two broken variants that the
//! checker must catch. Run with `--nocapture` to see the states explored.

use drover_model::properties::{EVERYTHING_ENDS, LIVE_LEASE_WRITES, NO_LATE_CALL};
use drover_model::Drover;
use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;

/// Explores every reachable state and asserts every property.
fn check(model: Drover) {
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "{model:?}: {} states explored ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
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

#[test]
fn two_replicas_one_cluster() {
    check(Drover::new(2, 1, 2, 2));
}

#[test]
fn three_replicas_one_cluster() {
    check(Drover::new(3, 1, 2, 2));
}

/// One fault only: with two, the interleavings of two clusters take
/// minutes.
#[test]
fn two_replicas_two_clusters() {
    check(Drover::new(2, 2, 2, 1));
}

/// Without the owner-key compare a replica whose lease expired while it
/// held an operation writes it anyway.
#[test]
fn without_fencing_a_dead_lease_writes() {
    let model = Drover {
        fencing: false,
        ..Drover::new(2, 1, 1, 1)
    };
    refute(model, LIVE_LEASE_WRITES);
}

/// Without orphan recovery an operation whose owner was lost mid-run
/// never ends: the liveness check has teeth too.
#[test]
fn without_orphan_recovery_an_operation_never_ends() {
    let model = Drover {
        orphan_recovery: false,
        ..Drover::new(2, 1, 1, 1)
    };
    refute(model, EVERYTHING_ENDS);
}

/// Without announcing the new epoch before failing an orphan, a zombie's
/// call can land after its operation ended.
#[test]
fn without_fencing_orphans_a_zombie_call_lands_late() {
    let model = Drover {
        fence_orphans: false,
        ..Drover::new(2, 1, 1, 1)
    };
    refute(model, NO_LATE_CALL);
}
