//! Drover's cluster state machine: the lifecycle states, the table of
//! edges, and the pure predicates built on them (which requests are
//! admitted, where an operation leaves its cluster, which fencing tokens a
//! provider admits). The replica and the model check both use this crate,
//! so the model checks the code's own predicates and a change to the table
//! cannot pass the model unnoticed.
//!
//! # Guarantees
//!
//! - [`TRANSITIONS`] is the only table: [`next`], [`is_edge`], [`admit`] and
//!   [`final_state`] read nothing else, and every one is a pure function.
//! - Nothing here does I/O or depends on another crate (serde only behind
//!   the `serde` feature, for the replica's stored records).
//!
//! # Assumptions
//!
//! - A caller that stores a [`ClusterState`] stores it by its variant name
//!   (the `serde` feature's form); renaming a variant changes the stored
//!   form.
//!
//! # Caveats
//!
//! - Which operation kinds a go-ahead moves when it works is the caller's
//!   to say ([`final_state`]'s `go_ahead_moves`): the kinds live with the
//!   operations, not here.

mod fence;
mod state;
mod table;

pub use fence::fence_admits;
pub use state::ClusterState;
pub use table::{admit, final_state, is_edge, next, Admission, Event, GO_AHEAD, TRANSITIONS};
