//! Exhaustive checks of automatic node remediation (one operation at a
//! time, the quorum guard, the in-flight limit, `max_retry` across owner
//! crashes), and of variants with one flaw seeded each, which the checker
//! must catch. Run with `--nocapture` to see the states explored and the
//! counterexamples.

use drover_model::remediation::{
    Remediation, RemediationFlaw, DIES_BETWEEN, IN_FLIGHT, MAX_RETRY, ONE_OPERATION, QUORUM,
    TWO_OWNERS,
};
use stateright::{Checker, Expectation, HasDiscoveries, Model};
use std::time::Instant;

/// Explores every reachable state and asserts every property, except that
/// the scenarios in `beyond` are asserted unreachable.
fn check(model: Remediation, beyond: &[&str]) {
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
/// shows the shortest: the checker keeps the last it met, so the depth is
/// raised until it meets one.
fn refute(model: Remediation, property: &'static str) {
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

/// Deeper than any path of the checks.
const MAX_DEPTH: usize = 60;

/// Two nodes going down, a lease loss, a user's Stop or Upgrade: the
/// remediator's owner lost between any two of its steps, the zombie acting
/// on.
#[test]
fn remediation_across_a_lost_owner() {
    check(Remediation::new(2, 1), &[]);
}

/// Two workers: a control node and a worker, or two workers, down at once.
#[test]
fn two_workers_across_a_lost_owner() {
    let model = Remediation {
        workers: 2,
        ..Remediation::new(2, 1)
    };
    check(model, &[]);
}

/// Two lease losses: both replicas lost in turn, each a zombie once.
#[test]
fn remediation_across_two_lost_owners() {
    check(Remediation::new(2, 2), &[]);
}

/// Three nodes going down: more than `max_unhealthy` down at once (the
/// short-circuit), and a node repaired going down again.
#[test]
fn three_nodes_down() {
    check(Remediation::new(3, 1), &[]);
}

/// Without lease losses no owner dies and no zombie acts; every other
/// property holds.
#[test]
fn without_lost_owners() {
    check(Remediation::new(2, 0), &[DIES_BETWEEN, TWO_OWNERS]);
}

/// Without the quorum guard: two control nodes down, the decision names
/// one of them while the third alone is ready.
#[test]
fn without_the_quorum_guard_a_control_node_is_remediated_below_quorum() {
    let model = Remediation::new(2, 0).with(RemediationFlaw::NoQuorumGuard);
    refute(model, QUORUM);
}

/// Submitting before recording: the lost owner, a zombie, submits a
/// Recover of a control node under the request id of the count asked plus
/// one, and its attempt's write after, fenced, misses; the new owner, which
/// had decided on the worker, submits under the same request id and is
/// answered that Recover, and counts the worker. The control node's
/// remediation is never counted, and it is remediated `max_retry` times
/// more.
#[test]
fn submitting_before_recording_remediates_a_node_past_max_retry() {
    let model = Remediation::new(2, 1).with(RemediationFlaw::SubmitBeforeRecord);
    refute(model, MAX_RETRY);
}

/// An accept that does not refuse a taken slot: the remediator records its
/// attempts, a user's Stop is accepted, and the Recover submitted on the
/// Alert the remediator read is accepted beside it.
#[test]
fn an_accept_without_the_slot_check_runs_two_operations() {
    let model = Remediation::new(1, 0).with(RemediationFlaw::NoSlotCheck);
    refute(model, ONE_OPERATION);
}

/// Without the in-flight limit: a control node and the worker down, one
/// remediation names both.
#[test]
fn without_the_in_flight_limit_a_remediation_names_every_unhealthy_node() {
    let model = Remediation::new(2, 0).with(RemediationFlaw::NoInFlightLimit);
    refute(model, IN_FLIGHT);
}

/// Submitting before recording, without a lost owner: the submit judges
/// the decision's status, which no compare checks any more; a control
/// node's peer goes down after the decision and the control node is
/// remediated below quorum.
#[test]
fn submitting_before_recording_remediates_on_a_stale_status() {
    let model = Remediation::new(2, 0).with(RemediationFlaw::SubmitBeforeRecord);
    refute(model, QUORUM);
}
