//! The cluster state machine: one table, the only place that says how a
//! cluster may move. It lives in the `drover-machine` crate, which the
//! model check uses too; this module names it where the replica's code
//! looks for it.

pub use drover_machine::{admit, final_state, is_edge, next, Admission, Event};
