//! Fleet rollouts: one change (an upgrade, or a new node offering) carried
//! across many clusters in stages, within a concurrency limit per stage
//! and a failure budget, with soak times, approval gates, pause, resume
//! and cancel.
//!
//! Reading order: [`spec`] (what is asked, and its checks), [`record`]
//! (the etcd records), [`store`] (reads and writes), [`owners`] (which
//! replica runs which rollout), [`controller`] (the reconciler that runs
//! one), [`starts`] (the accepts of the targets it chose, in the
//! background).
//!
//! # Guarantees
//! - The targets are fixed when the rollout is created: a cluster created
//!   later is not swept in.
//! - Each target's operation goes through the same accept as a user's
//!   (the CAS, the busy check, the provider's ValidateSpec), at most once
//!   (see [`controller`]).
//! - A rollout is owned by one replica at a time, and carried on from its
//!   records by a peer when that replica dies or drains (see [`owners`]).
//!
//! # Assumptions
//! - A target's operation stays in its cluster's history at least until
//!   the owner has seen it end (a history of a few operations per cluster
//!   is plenty: the owner looks every [`controller::POLL`]).
//!
//! # Caveats
//! - A rollout cancelled without `cancel_running` is CANCELLED at once;
//!   its owner keeps it until the running operations end, to record how
//!   they did.

pub mod controller;
pub mod owners;
pub mod record;
pub mod spec;
pub mod starts;
pub mod store;

pub use controller::RolloutController;
pub use owners::RolloutOwners;
pub use record::RolloutError;
pub use store::RolloutStore;
