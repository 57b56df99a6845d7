//! A Drover provider that runs real PostgreSQL clusters on loopback.
//!
//! A cluster is one primary (Drover's control node) and streaming hot
//! standbys (its workers), each a `postgres` process with its own data
//! directory under the provider's root and its own 127.0.0.1 port. Node
//! ids ("pg-0", "pg-1", ...) are stable and never reused; roles move on a
//! switchover or a promotion. Version labels map to binary directories by
//! configuration, offerings to `shared_buffers` and `max_connections`.
//!
//! # Guarantees
//! - Fencing: the newest epoch per cluster uid is kept in a redb file
//!   under the root, written before the call goes on, so a stale token is
//!   refused (FAILED_PRECONDITION, "stale fencing token") after a restart
//!   of the provider too. Calls in flight are recorded there as well.
//! - Draining: every fenced call of a cluster runs under that cluster's
//!   lock, from before its first effect to its answer. A call bringing a
//!   newer epoch records it, stops the older epochs' task runs, then waits
//!   for the lock: an older call already holding it runs to its end and
//!   answers its real outcome before the newer call goes on (so the newer
//!   call's answer shows its effect). An older call that had not taken the
//!   lock yet answers ABORTED ("superseded by epoch N") and has applied
//!   nothing, then or later: the epoch is checked under the lock before
//!   the first effect. A call answers ABORTED in no other case.
//! - Deadlines: the earlier of grpc-timeout and `drover-apply-by` is
//!   checked before each physical step (initdb, start, stop, basebackup,
//!   promote, re-point, delete); no step starts after it. A call still
//!   waiting for the lock at its deadline answers DEADLINE_EXCEEDED having
//!   applied nothing.
//! - The token is checked before anything else in every call: a call
//!   without one is refused INVALID_ARGUMENT naming `token`. A call on a
//!   cluster the provider does not have (or UpgradeNode of a node the
//!   cluster does not have) answers NOT_FOUND, except DeleteNodes (already
//!   gone: OK) and DescribeCluster (no nodes).
//! - An offering change never leaves a standby below its primary's
//!   max_connections (a hot standby would refuse to start): the primary
//!   restarts first when it shrinks, the standbys first when it grows, and
//!   standbys added by the same call start on the new offering after.
//! - Idempotency: the topology (nodes, ports, roles, versions, offering)
//!   is in the store, each step is skipped when already done, so every
//!   call sent again converges, and work longer than one deadline goes on
//!   across the repeated calls. Task runs are idempotent per run id.
//! - Describe reports what the processes show, not what was asked.
//! - Never two writable primaries, wherever the provider dies: a
//!   promotion is recorded before it runs and resolved from what the
//!   nodes show by the next call, each running node's role is checked
//!   before anything starts or is rebuilt, and a node that may hold writes
//!   the primary lacks is kept aside, never deleted (the `roles` module).
//!
//! # Assumptions
//! - Nodes of one major version only per data directory: an upgrade is a
//!   restart on another label's binaries, which must read the same data
//!   format (minor versions; a major upgrade would need pg_upgrade).
//! - The loopback is trusted: nodes accept any local TCP connection.
//! - When the provider runs as root, PostgreSQL runs as `--run-as`, which
//!   must be able to reach the root directory (it is chowned to it).
//!
//! # Caveats
//! - A newer epoch's call waits as long as the older call in progress
//!   runs: at most until that call's deadline (Drover always sends one)
//!   plus the step running then, since a step in progress is not cut
//!   (pg_ctl waits up to 60 s; a call without a deadline is unbounded).
//! - A step that started before the deadline finishes (e.g. a
//!   pg_basebackup in progress); the call then answers DEADLINE_EXCEEDED
//!   and the work done stays, for the repeated call to build on.
//! - Replication is asynchronous: commits a primary killed before they
//!   reached a standby are not on the standby repair promotes; the old
//!   primary's data directory is kept aside, not deleted (the `roles`
//!   module).
//! - PostgreSQL processes outlive the provider (by design: a restart of
//!   the provider must not take the databases down).

pub mod config;
mod describe;
mod lifecycle;
mod ops;
pub mod pg;
mod roles;
mod service;
mod store;
mod tasks;

pub use service::PostgresProvider;

use config::{Config, Offering};
use std::path::PathBuf;
use store::Store;
use tonic::Status;

/// What every call shares: configuration, the program runner, the store.
pub struct Inner {
    cfg: Config,
    pg: pg::Pg,
    store: Store,
}

impl Inner {
    fn cluster_dir(&self, uid: &str) -> PathBuf {
        self.cfg.root.join("clusters").join(uid)
    }

    fn node_dir(&self, uid: &str, id: &str) -> PathBuf {
        self.cluster_dir(uid).join(id)
    }

    fn log_path(&self, uid: &str, id: &str) -> PathBuf {
        self.cfg.root.join("logs").join(format!("{uid}-{id}.log"))
    }

    fn offering(&self, name: &str) -> Result<&Offering, Status> {
        self.cfg.offerings.get(name).ok_or_else(|| {
            Status::failed_precondition(format!("offering {name} is no longer configured"))
        })
    }

    /// A port of the range no cluster holds and nothing listens on.
    fn free_port(&self) -> Result<u16, Status> {
        let taken: Vec<u16> = self
            .store
            .clusters()?
            .iter()
            .flat_map(|c| c.nodes.iter().map(|n| n.port))
            .collect();
        let (from, to) = self.cfg.ports;
        (from..=to)
            .filter(|p| !taken.contains(p))
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .ok_or_else(|| Status::unavailable(format!("no free port in {from}-{to}")))
    }
}

/// Serves the provider (Provider + health) on `listener` until `shutdown`.
pub async fn serve(
    provider: PostgresProvider,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    use drover_proto::provider::v1::provider_server::ProviderServer;
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .trace_fn(drover_telemetry::server_span)
        .add_service(health_service)
        .add_service(ProviderServer::new(provider))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
