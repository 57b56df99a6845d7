//! The cluster state machine: one table, the only place that says how a
//! cluster may move.
//!
//! The edges are those of the CKS state machine (see the README), plus the
//! reference PR's additions (Alert -StartRequested-> Starting, Alert ->
//! Scaling) and Drover's (Error -OperationSucceeded-> Running for a start of an
//! Error cluster that succeeds; Created -DestroyRequested-> Destroying, so
//! that a cluster never started can be deleted; Destroying
//! -OperationSucceeded-> Destroyed is already an edge).
//!
//! *Go-ahead* requests are accepted although the table has no edge for them:
//! start from Error, stop from Created or Error, destroy from Destroying. They
//! hold the operation slot but leave the state where it is, except that a
//! start of an Error cluster and a retried destroy move it when they work
//! ([`final_state`]).

use crate::ClusterState::{self, *};
use std::fmt;

/// What happens to a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    StartRequested,
    StopRequested,
    DestroyRequested,
    RecoveryRequested,
    AutoscaleRequested,
    ScaleUpRequested,
    ScaleDownRequested,
    AddNodeRequested,
    RemoveNodeRequested,
    UpgradeRequested,
    OperationSucceeded,
    OperationFailed,
    CreateFailed,
    FaultsDetected,
}

impl Event {
    pub const ALL: [Event; 14] = [
        Event::StartRequested,
        Event::StopRequested,
        Event::DestroyRequested,
        Event::RecoveryRequested,
        Event::AutoscaleRequested,
        Event::ScaleUpRequested,
        Event::ScaleDownRequested,
        Event::AddNodeRequested,
        Event::RemoveNodeRequested,
        Event::UpgradeRequested,
        Event::OperationSucceeded,
        Event::OperationFailed,
        Event::CreateFailed,
        Event::FaultsDetected,
    ];
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

use Event::*;

/// Every edge: (from, event, to).
pub const TRANSITIONS: &[(ClusterState, Event, ClusterState)] = &[
    (Created, StartRequested, Starting),
    (Starting, OperationSucceeded, Running),
    (Starting, OperationFailed, Alert),
    (Starting, CreateFailed, Error),
    (Starting, StopRequested, Stopping),
    (Running, StopRequested, Stopping),
    (Alert, StopRequested, Stopping),
    (Stopping, OperationSucceeded, Stopped),
    (Stopping, OperationFailed, Alert),
    (Stopped, StartRequested, Starting),
    (Stopped, OperationSucceeded, Stopped),
    (Running, OperationSucceeded, Running),
    (Running, FaultsDetected, Alert),
    (Running, AutoscaleRequested, Scaling),
    (Running, ScaleUpRequested, Scaling),
    (Running, ScaleDownRequested, Scaling),
    (Stopped, ScaleUpRequested, ScalingStoppedCluster),
    (Scaling, OperationSucceeded, Running),
    (Scaling, OperationFailed, Alert),
    (ScalingStoppedCluster, OperationSucceeded, Stopped),
    (ScalingStoppedCluster, OperationFailed, Alert),
    (Running, UpgradeRequested, Upgrading),
    (Upgrading, OperationSucceeded, Running),
    (Upgrading, OperationFailed, Alert),
    (Running, AddNodeRequested, Importing),
    (Alert, AddNodeRequested, Importing),
    (Importing, OperationSucceeded, Running),
    (Importing, OperationFailed, Running),
    (Alert, OperationSucceeded, Running),
    (Running, RemoveNodeRequested, RemovingNodes),
    (Alert, RemoveNodeRequested, RemovingNodes),
    (RemovingNodes, OperationSucceeded, Running),
    (RemovingNodes, OperationFailed, Running),
    (Alert, RecoveryRequested, Recovering),
    (Recovering, OperationSucceeded, Running),
    (Recovering, OperationFailed, Alert),
    (Running, DestroyRequested, Destroying),
    (Stopped, DestroyRequested, Destroying),
    (Alert, DestroyRequested, Destroying),
    (Error, DestroyRequested, Destroying),
    (Destroying, OperationSucceeded, Destroyed),
    // The reference PR's additions.
    (Alert, StartRequested, Starting),
    (Alert, ScaleUpRequested, Scaling),
    (Alert, ScaleDownRequested, Scaling),
    (Alert, AutoscaleRequested, Scaling),
    // Drover's: a start of an Error cluster that succeeds.
    (Error, OperationSucceeded, Running),
    // Drover's: a cluster never started is deleted as any other, through
    // Destroying, but with nothing to delete at the provider.
    (Created, DestroyRequested, Destroying),
];

/// Requests accepted without an edge: they hold the slot, keep the state.
pub const GO_AHEAD: &[(ClusterState, Event)] = &[
    (Error, StartRequested),
    (Created, StopRequested),
    (Error, StopRequested),
    (Destroying, DestroyRequested),
];

/// The state `event` moves `from` to, if the table has that edge.
pub fn next(from: ClusterState, event: Event) -> Option<ClusterState> {
    TRANSITIONS
        .iter()
        .find(|(f, e, _)| *f == from && *e == event)
        .map(|(_, _, to)| *to)
}

/// Whether `from -> to` is an edge for some event.
pub fn is_edge(from: ClusterState, to: ClusterState) -> bool {
    TRANSITIONS.iter().any(|(f, _, t)| *f == from && *t == to)
}

/// How a request is admitted in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The cluster moves to this state when the request is accepted.
    Moves(ClusterState),
    /// A go-ahead: accepted, the state stays.
    GoAhead,
}

/// Whether a request `event` is admitted in `state`; `None` means refused.
pub fn admit(state: ClusterState, event: Event) -> Option<Admission> {
    if GO_AHEAD.contains(&(state, event)) {
        return Some(Admission::GoAhead);
    }
    next(state, event).map(Admission::Moves)
}

/// The state an operation leaves its cluster in when it ends, from `held`,
/// the state it held the cluster in. `go_ahead`: it was admitted as a
/// go-ahead; `go_ahead_moves`: its kind is one whose go-ahead moves the
/// cluster when it works (a retried destroy completes, a start of an Error
/// cluster recovers it). `failure` is the event of an outcome other than
/// success.
pub fn final_state(
    held: ClusterState,
    go_ahead: bool,
    go_ahead_moves: bool,
    succeeded: bool,
    failure: Event,
) -> ClusterState {
    if go_ahead {
        // Go-aheads leave the state alone, except as above.
        return if succeeded && go_ahead_moves {
            next(held, OperationSucceeded).unwrap_or(held)
        } else {
            held
        };
    }
    let event = if succeeded {
        OperationSucceeded
    } else {
        failure
    };
    // No edge (a failed destroy): the cluster stays, and the GC retries.
    next(held, event).unwrap_or(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table exactly as in the reference (anchors §1), written out again
    /// independently: any edit to TRANSITIONS must be made here too.
    const EXPECTED_EDGES: usize = 47;

    #[test]
    fn every_listed_edge_is_taken() {
        for (from, event, to) in TRANSITIONS {
            assert_eq!(next(*from, *event), Some(*to), "{from} -{event}->");
            assert!(is_edge(*from, *to));
        }
        assert_eq!(TRANSITIONS.len(), EXPECTED_EDGES);
    }

    #[test]
    fn the_table_is_a_function() {
        for (i, (from, event, _)) in TRANSITIONS.iter().enumerate() {
            let duplicates = TRANSITIONS[i + 1..]
                .iter()
                .filter(|(f, e, _)| f == from && e == event)
                .count();
            assert_eq!(duplicates, 0, "{from} -{event}-> listed twice");
        }
    }

    #[test]
    fn every_non_edge_is_refused() {
        let mut refused = 0;
        for from in ClusterState::ALL {
            for event in Event::ALL {
                let listed = TRANSITIONS
                    .iter()
                    .any(|(f, e, _)| *f == from && *e == event);
                if !listed {
                    assert_eq!(next(from, event), None, "{from} -{event}-> must be refused");
                    let go_ahead = GO_AHEAD.contains(&(from, event));
                    assert_eq!(admit(from, event).is_some(), go_ahead, "{from} {event}");
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 15 * 14 - EXPECTED_EDGES);
    }

    #[test]
    fn reference_additions_and_go_aheads() {
        assert_eq!(next(Alert, StartRequested), Some(Starting));
        assert_eq!(next(Alert, ScaleUpRequested), Some(Scaling));
        assert_eq!(next(Error, OperationSucceeded), Some(Running));
        assert_eq!(admit(Error, StartRequested), Some(Admission::GoAhead));
        assert_eq!(admit(Created, StopRequested), Some(Admission::GoAhead));
        assert_eq!(admit(Error, StopRequested), Some(Admission::GoAhead));
        assert_eq!(
            admit(Destroying, DestroyRequested),
            Some(Admission::GoAhead)
        );
        assert_eq!(admit(Destroyed, DestroyRequested), None);
        assert_eq!(
            admit(Created, DestroyRequested),
            Some(Admission::Moves(Destroying))
        );
        assert_eq!(admit(Running, StartRequested), None);
        // A failed destroy stays Destroying: there is no failure edge.
        assert_eq!(next(Destroying, OperationFailed), None);
    }

    #[test]
    fn an_operation_ends_along_its_outcomes_edge() {
        assert_eq!(
            final_state(Starting, false, true, true, CreateFailed),
            Running
        );
        assert_eq!(
            final_state(Starting, false, true, false, CreateFailed),
            Error
        );
        assert_eq!(
            final_state(Stopping, false, false, false, OperationFailed),
            Alert
        );
        // No failure edge: a failed destroy stays Destroying.
        assert_eq!(
            final_state(Destroying, false, true, false, OperationFailed),
            Destroying
        );
    }

    #[test]
    fn a_go_ahead_moves_only_when_its_kind_does_and_it_worked() {
        // A start of an Error cluster that works recovers it; a failed one
        // leaves it in Error.
        assert_eq!(
            final_state(Error, true, true, true, OperationFailed),
            Running
        );
        assert_eq!(
            final_state(Error, true, true, false, OperationFailed),
            Error
        );
        // A retried destroy completes.
        assert_eq!(
            final_state(Destroying, true, true, true, OperationFailed),
            Destroyed
        );
        // A stop from Created or Error leaves the state alone either way.
        assert_eq!(
            final_state(Created, true, false, true, OperationFailed),
            Created
        );
        assert_eq!(
            final_state(Error, true, false, true, OperationFailed),
            Error
        );
        assert_eq!(
            final_state(Error, true, false, false, OperationFailed),
            Error
        );
    }
}
