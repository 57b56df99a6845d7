//! The Drover replica.
//!
//! # Reading order
//!
//! From the bottom layer up, so each module comes after most of what it
//! uses. A request walks the list back down: [`server`] serves it, [`api`]
//! validates it and hands it to [`executor`], which plans it with
//! [`operation`] and writes it through [`store`].
//!
//! - [`names`], [`net`]: leaves: the DNS-1123 rule for names in keys,
//!   accepting connections.
//! - `sync`: locking a mutex that a panic poisoned.
//! - [`audit`]: the audit log, one JSON line per request that changes
//!   something and per operation Drover starts by itself.
//! - [`auth`]: bearer tokens and roles, checked on every RPC.
//! - [`config`]: flags, environment and file, one row per setting,
//!   validated before anything binds.
//! - [`telemetry`]: structured logs.
//! - [`metrics`]: the metrics registry.
//! - [`keys`]: the etcd key layout operators read with etcdctl (a
//!   user-facing contract).
//! - [`store`]: the etcd semantics Drover relies on, over etcd or in memory.
//! - [`compactor`]: keeps etcd's history bounded.
//! - [`cluster`]: records, the state table (from the `drover-machine`
//!   crate), the registry, and the watch cache: one etcd watch per replica
//!   that every consumer reads.
//! - [`provider`]: the providers by name (every call for a cluster goes to
//!   its own) and the simulated provider.
//! - [`replication`]: who owns which cluster (membership, owner keys claimed
//!   by rendezvous hashing) and the fence every owner write carries.
//! - [`kind`]: one module per operation kind with everything the server
//!   knows of it (its RPC and role, request fields, event, spec edit,
//!   refusals, steps): the accept and the executor ask it, never match on
//!   a kind.
//! - [`owner_work`]: what the executor, task scheduler and scanner share: the
//!   claim check, in-flight marks, the stop flag and the fenced commit, and
//!   the one runtime that runs the three as reconcilers (its queue merges
//!   the triggers, removes repeats, keeps one reconcile per cluster and
//!   controller in flight, requeues with a backoff).
//! - [`operation`]: plans an accept (compares and writes, no side effects);
//!   reads, waits for and cancels operations.
//! - [`executor`]: the one path from a lifecycle request to its execution:
//!   accepts (claimed at once on the owner), then runs the steps, fenced.
//! - [`task`]: scheduled maintenance tasks: validation, reconcile, scheduler.
//! - [`scanner`]: moves idle clusters by what the provider reports.
//! - [`rollout`]: fleet rollouts: a change carried across many clusters in
//!   stages, owned by one replica and run as a reconciler on the runtime.
//! - [`api`]: the drover.v1 gRPC services; every lifecycle request goes to
//!   `Executor::submit`, and errors become statuses in `api::error`, once.
//! - [`console`]: the read-only web console (`/ui`), kept live by
//!   server-sent events and answered by the API's read handlers.
//! - [`admin_http`]: the admin port: /metrics, /healthz, /readyz, /liveness
//!   and the console.
//! - [`supervisor`]: the replica's long-lived tasks, by name: a panic in
//!   one ends the replica, and they are joined when it stops.
//! - [`replica`]: starts a replica's parts and returns them by name.
//! - [`shutdown`]: the drain: health, readiness, the hand-off, the lease.
//! - [`server`]: assembles services, TLS, auth, health and reflection, and
//!   serves a started replica.

pub mod admin_http;
pub mod api;
pub mod audit;
pub mod auth;
pub mod cluster;
pub mod compactor;
pub mod config;
pub mod console;
pub mod executor;
pub mod health;
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
pub mod retry;
pub mod rollout;
pub mod scanner;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod supervisor;
mod sync;
pub mod task;
pub mod telemetry;
