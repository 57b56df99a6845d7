//! The model's slice of the state machine must agree with Drover's table
//! (`server/src/cluster/machine.rs`) on every state and event it covers.

use drover_model::machine as slice;
use drover_server::cluster::machine as drover;
use drover_server::cluster::ClusterState;

const STATES: [slice::ClusterState; 7] = [
    slice::ClusterState::Created,
    slice::ClusterState::Starting,
    slice::ClusterState::Running,
    slice::ClusterState::Stopping,
    slice::ClusterState::Stopped,
    slice::ClusterState::Upgrading,
    slice::ClusterState::Alert,
];

const EVENTS: [slice::Event; 5] = [
    slice::Event::StartRequested,
    slice::Event::StopRequested,
    slice::Event::UpgradeRequested,
    slice::Event::OperationSucceeded,
    slice::Event::OperationFailed,
];

fn state(s: slice::ClusterState) -> ClusterState {
    let name = format!("{s:?}");
    ClusterState::ALL
        .into_iter()
        .find(|d| format!("{d:?}") == name)
        .expect("a Drover state")
}

fn event(e: slice::Event) -> drover::Event {
    let name = format!("{e:?}");
    drover::Event::ALL
        .into_iter()
        .find(|d| format!("{d:?}") == name)
        .expect("a Drover event")
}

#[test]
fn the_slice_agrees_with_drovers_table() {
    for from in STATES {
        for on in EVENTS {
            let model = slice::next(from, on).map(|to| format!("{to:?}"));
            let real = drover::next(state(from), event(on)).map(|to| format!("{to:?}"));
            assert_eq!(model, real, "{from:?} -{on:?}->");
            let model_admits =
                slice::admit(from, on).map(|a| matches!(a, slice::Admission::GoAhead));
            let real_admits = drover::admit(state(from), event(on))
                .map(|a| matches!(a, drover::Admission::GoAhead));
            assert_eq!(model_admits, real_admits, "admission of {on:?} in {from:?}");
        }
    }
}
