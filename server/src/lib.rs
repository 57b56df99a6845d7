//! The Drover replica.
//!
//! # Reading order
//!
//! Follow one request top to bottom; every call points down the layers.
//!
//! 1. [`replica`] starts a replica's parts and names them; [`server`] puts
//!    the gRPC services in front of them; [`shutdown`] drains them.
//! 2. [`api`]: a StopCluster arrives at `ClustersService`, is validated, and
//!    goes to the one entry, `Executor::submit` (errors become statuses in
//!    `api::error`, once).
//! 3. [`executor`] (`submit`, then `start`, then `run`): [`operation`] plans
//!    the accept (compares and writes, no side effects); the executor adds
//!    its claim when this replica owns the cluster, commits, and runs the
//!    steps through the [`provider`], every write through one fenced commit.
//! 4. [`owner_work`]: what every kind of owner work shares (claim check,
//!    in-flight marks, stop flag, the fenced commit).
//! 5. [`replication`]: who owns which cluster (membership, owner keys,
//!    rendezvous hashing) and the fence every owner write carries.
//! 6. [`cluster`]: records, the state table (from the `drover-machine`
//!    crate), the registry, and the watch cache: one etcd watch per replica
//!    that every consumer reads.
//! 7. [`store`]: the etcd semantics Drover relies on, over etcd or in
//!    memory, and [`keys`], the key layout operators read with etcdctl.
//!
//! # Modules
//!
//! - [`config`]: flags, environment and file, one row per setting,
//!   validated before anything binds.
//! - [`store`]: the etcd semantics Drover relies on, over etcd or in memory.
//! - [`keys`]: the etcd key layout (a user-facing contract).
//! - [`kind`], [`names`], [`net`]: leaves shared across layers: the
//!   operation kinds, the DNS-1123 rule for names in keys, accepting
//!   connections.
//! - [`cluster`]: cluster records, states, validation, the registry and the
//!   watch cache.
//! - [`api`]: the drover.v1 gRPC services; errors become statuses there.
//! - [`auth`]: bearer tokens and roles, checked on every RPC.
//! - [`operation`]: planning and committing accepts; reading, waiting for and
//!   cancelling operations.
//! - [`replication`]: membership, cluster ownership (owner keys claimed by
//!   rendezvous hashing, passes over a watched view of them) and fencing.
//! - [`executor`]: the one path from a lifecycle request to its execution:
//!   accepts (claimed at once on the owner) and runs operations step by step
//!   through the provider.
//! - [`owner_work`]: what the executor, task scheduler and scanner share: the
//!   claim check, in-flight marks, the stop flag and the fenced commit.
//! - [`scanner`]: moves idle clusters by what the provider reports.
//! - [`provider`]: the providers by name (every call for a cluster goes to
//!   its own) and the simulated provider.
//! - [`replica`]: starts a replica's parts and returns them by name.
//! - [`server`]: assembles services, TLS, auth, health and reflection, and
//!   serves a started replica.
//! - [`shutdown`]: the drain: health, readiness, the hand-off, the lease.
//! - [`metrics`]: the metrics registry; [`admin_http`]: /metrics, /healthz, /readyz.
//! - [`compactor`]: keeps etcd's history bounded.
//! - [`task`]: scheduled maintenance tasks: validation, reconcile, scheduler.
//! - [`telemetry`]: structured logs.

pub mod admin_http;
pub mod api;
pub mod auth;
pub mod cluster;
pub mod compactor;
pub mod config;
pub mod console;
pub mod executor;
pub mod keys;
pub mod kind;
pub mod metrics;
pub mod names;
pub mod net;
pub mod operation;
pub mod owner_work;
pub mod provider;
pub mod replica;
pub mod replication;
pub mod scanner;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod supervisor;
pub mod task;
pub mod telemetry;
