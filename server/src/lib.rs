//! The Drover replica.
//!
//! - [`config`]: flags, environment and file, validated before anything binds.
//! - [`store`]: the etcd semantics Drover relies on, over etcd or in memory.
//! - [`keys`]: the etcd key layout (a user-facing contract).
//! - [`cluster`]: cluster records, states, validation and the registry.
//! - [`api`]: the drover.v1 gRPC services; errors become statuses there.
//! - [`server`]: assembles services, health and reflection, and serves.
//! - [`telemetry`]: structured logs.

pub mod api;
pub mod cluster;
pub mod config;
pub mod executor;
pub mod keys;
pub mod operation;
pub mod provider;
pub mod server;
pub mod store;
pub mod telemetry;
