//! The slice of the cluster state machine the model runs on.
//!
//! These rows are copied from `server/src/cluster/machine.rs` (the only
//! table Drover has), restricted to the states and events below: enough for
//! starts, stops and upgrades that succeed, fail or are orphaned, and for a
//! go-ahead.
//! The copy keeps the model's own code free of the server's dependency
//! tree; `tests/table.rs` checks it against Drover's table on every state
//! and event it covers, so the two cannot drift apart.

use ClusterState::*;
use Event::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterState {
    Created,
    Starting,
    Running,
    Stopping,
    Stopped,
    Upgrading,
    Alert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    StartRequested,
    StopRequested,
    UpgradeRequested,
    OperationSucceeded,
    OperationFailed,
}

/// Every edge between the states above: (from, event, to).
const TRANSITIONS: &[(ClusterState, Event, ClusterState)] = &[
    (Created, StartRequested, Starting),
    (Starting, OperationSucceeded, Running),
    (Starting, OperationFailed, Alert),
    (Starting, StopRequested, Stopping),
    (Running, StopRequested, Stopping),
    (Alert, StopRequested, Stopping),
    (Stopping, OperationSucceeded, Stopped),
    (Stopping, OperationFailed, Alert),
    (Stopped, StartRequested, Starting),
    (Stopped, OperationSucceeded, Stopped),
    (Running, OperationSucceeded, Running),
    (Running, UpgradeRequested, Upgrading),
    (Upgrading, OperationSucceeded, Running),
    (Upgrading, OperationFailed, Alert),
    (Alert, OperationSucceeded, Running),
    (Alert, StartRequested, Starting),
];

/// Requests accepted without an edge: they hold the slot, keep the state.
/// (Start from Error and destroy from Destroying are outside the slice.)
const GO_AHEAD: &[(ClusterState, Event)] = &[(Created, StopRequested)];

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
