//! Exhaustive checks of fleet rollouts' concurrency bound and one accept
//! per target, and of variants with one flaw seeded each, which the checker
//! must catch. Run with `--nocapture` to see the states explored and the
//! counterexamples.

use drover_model::rollout::{
    AT_MOST_N, FENCED, ONCE_PER_TARGET, PAUSE_HOLDS, PAUSE_RACED, RESUBMIT_ANSWERED,
    RESUBMIT_CREATES, TWO_OWNERS,
};
use drover_model::{Rollout, RolloutFlaw};
use stateright::{Checker, Expectation, HasDiscoveries, Model};
use std::time::Instant;

/// Explores every reachable state and asserts every property, except that
/// the scenarios in `beyond` are asserted unreachable.
fn check(model: Rollout, beyond: &[&str]) {
    let started = Instant::now();
    let checker = model.checker().spawn_bfs().join();
    println!(
        "{model:?}: {} states explored ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    // Without a pause, no pause races an owner.
    let unpaused = |name: &str| model.pauses == 0 && name == PAUSE_RACED;
    for property in model.properties() {
        let beyond = beyond.contains(&property.name) || unpaused(property.name);
        match property.expectation {
            Expectation::Sometimes if !beyond => {
                checker.assert_any_discovery(property.name);
            }
            _ => checker.assert_no_discovery(property.name),
        }
    }
}

/// Asserts that the checker finds a counterexample for `property`, and
/// shows the shortest: the checker keeps the last it met, so the depth is
/// raised until it meets one.
fn refute(model: Rollout, property: &'static str) {
    let started = Instant::now();
    let found = (1..=MAX_DEPTH).find_map(|depth| {
        let checker = model
            .checker()
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf([property].into()))
            .spawn_bfs()
            .join();
        let path = checker.discovery(property)?;
        Some((path, checker.unique_state_count()))
    });
    let Some((path, states)) = found else {
        panic!("{model:?}: no counterexample to \"{property}\"");
    };
    println!(
        "{model:?}: \"{property}\" refuted after {states} unique states, in {:.1?}:",
        started.elapsed()
    );
    for action in path.into_actions() {
        println!("  {action:?}");
    }
}

/// Deeper than any path of the checks (28).
const MAX_DEPTH: usize = 40;

/// One target at a time, three targets, two lease losses: an owner lost
/// between any two steps, twice, the zombie acting on.
#[test]
fn one_at_a_time_across_two_lost_owners() {
    check(Rollout::new(1, 2), &[]);
}

/// Two at a time, three targets, two lease losses.
#[test]
fn two_at_a_time_across_two_lost_owners() {
    check(Rollout::new(2, 2), &[]);
}

/// Three replicas, one at a time, two lease losses: two zombies beside the
/// owner.
#[test]
fn three_replicas_one_at_a_time() {
    let model = Rollout {
        replicas: 3,
        ..Rollout::new(1, 2)
    };
    check(model, &[]);
}

/// An accept's answer lost (the owner keeps the target STARTING and
/// submits it again), with a lease loss.
#[test]
fn a_lost_answer_is_submitted_again() {
    let model = Rollout {
        lost_answers: 1,
        ..Rollout::new(1, 1)
    };
    check(model, &[]);
}

/// Submitting before the STARTING record: the owner dies after the accept,
/// the new owner loads the target PENDING, does not count it, and starts
/// another beside its operation.
#[test]
fn submitting_before_the_starting_record_runs_more_than_n() {
    for concurrency in [1, 2] {
        let model = Rollout::new(concurrency, 1).with(RolloutFlaw::NoStartingRecord);
        refute(model, AT_MOST_N);
    }
}

/// A resubmission under a fresh request id: the lost owner's operation
/// ended, the new owner's resubmission of the STARTING target is not
/// answered with it and accepts a second.
#[test]
fn a_fresh_request_id_on_resubmission_accepts_a_target_twice() {
    let model = Rollout::new(1, 1).with(RolloutFlaw::FreshRequestIdOnResubmit);
    refute(model, ONCE_PER_TARGET);
}

/// Unfenced target writes: a zombie, its view stale, writes a target
/// STARTING beside the new owner's and starts it.
#[test]
fn unfenced_target_writes_let_a_zombie_run_more_than_n() {
    let model = Rollout::new(1, 1).with(RolloutFlaw::UnfencedTargetWrite);
    refute(model, FENCED);
    refute(model, AT_MOST_N);
}

/// A target written PENDING after its accept's answer was lost (what
/// Drover's reconcile does with a store error): its operation runs
/// uncounted and the owner starts another.
#[test]
fn pending_after_a_lost_answer_runs_more_than_n() {
    let model = Rollout {
        lost_answers: 1,
        ..Rollout::new(1, 0)
    }
    .with(RolloutFlaw::PendingAfterLostAnswer);
    refute(model, AT_MOST_N);
}

/// Without lease losses or lost answers nothing is ever resubmitted and
/// no zombie acts; every other property holds.
#[test]
fn without_faults() {
    check(
        Rollout::new(2, 0),
        &[RESUBMIT_CREATES, RESUBMIT_ANSWERED, TWO_OWNERS],
    );
}

/// An operator's pause and resume, with a lease loss: a pause that lands
/// after the owner read the rollout fails the write of the targets it
/// chose (it compares the record), so nothing starts while paused.
#[test]
fn a_pause_stops_every_start_decided_before_it() {
    let model = Rollout {
        pauses: 1,
        ..Rollout::new(1, 1)
    };
    check(model, &[]);
}

/// The write of the starts without the record's compare: a pause that
/// lands after the owner's read is missed, and a target starts while the
/// rollout is paused.
#[test]
fn starts_that_do_not_compare_the_record_run_through_a_pause() {
    let model = Rollout {
        pauses: 1,
        ..Rollout::new(1, 0)
    }
    .with(RolloutFlaw::UncomparedRecord);
    refute(model, PAUSE_HOLDS);
}
