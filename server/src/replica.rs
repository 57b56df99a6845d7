//! Starts a replica's parts: the metered store, the cluster cache, the
//! operations, the admin port and its console, the compactor and, with a provider, the
//! workers that own clusters, run their operations and watch the peers for
//! crashes.
//!
//! Kept apart from [`crate::server`] (which assembles the gRPC services)
//! and [`crate::shutdown`] (which stops these parts in order) so that each
//! of the three reads top to bottom: [`Replica::start`] returns every part
//! it started under a name, and the other two take what they need from it.
//!
//! # Guarantees
//! - Both ports are bound before any worker starts: a replica that cannot
//!   listen fails its start without joining as a member.
//! - Every background part started here stops on one of the two switches
//!   in [`Switches`] (work first, the cache last) or, for the admin port,
//!   when [`Replica::admin_open`] is dropped.
//!
//! # Caveats
//! - The start-up check of etcd's version runs in the background and is
//!   not awaited: an etcd slow to answer must not hold up the start.

use crate::admin_http;
use crate::audit::{AuditError, AuditLog};
use crate::cluster::ClusterCache;
use crate::config::Config;
use crate::console::{Console, ConsoleFeed};
use crate::executor::Executor;
use crate::keys::KeyLayout;
use crate::metrics::Metrics;
use crate::operation::Operations;
use crate::owner_work::{OwnerWork, Runtime};
use crate::provider::Providers;
use crate::replication::{Ownership, OwnershipConfig};
use crate::rollout::starts::Starts;
use crate::rollout::{RolloutController, RolloutOwners, RolloutStore};
use crate::scanner::Scanner;
use crate::store::{MeteredStore, SharedStore};
use crate::supervisor::Supervisor;
use crate::task::{TaskScheduler, TaskStore};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("replica id {replica_id} is held by a live replica whose admin port answers at {other}: two processes must not share a replica id (set --replica-id; its default, the host name, is shared by cloned machines)")]
    ReplicaIdInUse { replica_id: String, other: String },
}

/// A started replica: every part [`Replica::start`] built, by name.
pub struct Replica {
    /// The store every part uses, counted in the metrics.
    pub store: SharedStore,
    pub keys: KeyLayout,
    pub metrics: Arc<Metrics>,
    /// Where requests that change something, and what Drover starts by
    /// itself, are written down.
    pub audit: Arc<AuditLog>,
    pub cache: Arc<ClusterCache>,
    pub operations: Operations,
    /// Present when the replica has a provider and so runs operations.
    pub workers: Option<Workers>,
    /// The providers every call for a cluster goes through; `None`
    /// without one.
    pub providers: Option<Arc<Providers>>,
    /// The gRPC port, bound and not yet served.
    pub listener: TcpListener,
    /// Where `listener` listens (the port is known even when 0 was asked).
    pub address: SocketAddr,
    pub switches: Switches,
    /// The admin port closes when this is dropped: orchestrators probe it
    /// through the drain, so it is held until the replica exits.
    pub admin_open: watch::Sender<bool>,
    /// The background tasks, each under its name: a panic in one ends the
    /// replica, and they are joined when it stops.
    pub tasks: Supervisor,
}

/// The parts of a replica with a provider: cluster ownership, the
/// executor (which requests go to) and the owner work it shares with the
/// task scheduler and the scanner (one runtime runs the three).
pub struct Workers {
    pub replication: Arc<Ownership>,
    pub executor: Arc<Executor>,
    pub work: Arc<OwnerWork>,
}

/// What stops the background parts of a replica.
pub struct Switches {
    /// What /readyz answers.
    pub ready: Arc<AtomicBool>,
    /// Sending `true` stops membership, ownership, the peers' liveness
    /// connections, the executor, the task scheduler, the scanner and the
    /// compactor.
    pub stop_work: watch::Sender<bool>,
    /// Sending `true` stops the cluster cache following etcd.
    pub stop_cache: watch::Sender<bool>,
}

impl Replica {
    /// Builds the replica's parts, binds its ports and spawns its
    /// background tasks. With a provider the replica joins as a member,
    /// owns its share of the clusters and runs their operations; without
    /// one it only serves reads.
    pub async fn start(
        config: &Config,
        store: SharedStore,
        providers: Option<Arc<Providers>>,
    ) -> Result<Self, StartError> {
        let metrics = Metrics::new();
        let failures = metrics.audit_write_failures.clone();
        let audit = AuditLog::open(config.audit_log.as_deref(), failures, &config.replica_id)?;
        let store = MeteredStore::wrap(store, Arc::clone(&metrics));
        let keys = KeyLayout::new(config.key_prefix.clone());
        let cache = ClusterCache::new(store.clone(), keys.clone(), Arc::clone(&metrics));
        let mut tasks = Supervisor::new();
        let operations = Operations::new(
            store.clone(),
            keys.clone(),
            config.operation_history,
            Arc::clone(&metrics),
        )
        .with_cache(Arc::clone(&cache));
        operations.start_feed();

        let (listener, address) = bind(config.listen).await?;
        let (stop_work, work_stopped) = watch::channel(false);
        let incarnation = admin_http::Incarnation::default();
        let console = Arc::new(start_console(
            config,
            (&cache, &keys),
            (&operations, &audit),
            &work_stopped,
            &mut tasks,
        ));
        let admin_listener = bind_admin(config.admin_listen, config.admin_listen_fallback).await?;
        let admin_tls = config.security.admin_tls.clone();
        let admin = start_admin(
            admin_listener,
            &metrics,
            &incarnation,
            Arc::clone(&console),
            admin_tls,
            &mut tasks,
        );
        let watched = (&store, &metrics, &cache);
        let stop_cache = start_followers(config, watched, &audit, &work_stopped, &mut tasks)?;
        let mut replica = Self {
            store,
            keys,
            metrics,
            audit,
            cache,
            operations,
            workers: None,
            providers: providers.clone(),
            listener,
            address,
            switches: Switches {
                ready: admin.ready,
                stop_work,
                stop_cache,
            },
            admin_open: admin.open,
            tasks,
        };
        let Some(providers) = providers else {
            tracing::warn!("no provider configured: lifecycle operations are refused");
            return Ok(replica);
        };
        refuse_live_twin(&replica, config, admin.address).await?;
        let workers =
            replica.start_workers(config, Arc::clone(&providers), admin.address, work_stopped);
        // The console's Recover runs through this replica's executor.
        console.run_operations_with(Arc::clone(&workers.executor), providers);
        let _ = incarnation.set(Arc::clone(&workers.replication));
        replica.workers = Some(workers);
        Ok(replica)
    }

    /// Joins as a member and starts ownership, the provider probes (unless
    /// `--provider-handover-after 0`), the peers' liveness
    /// connections (unless `--peer-liveness=off`), and the owner-work runtime
    /// (the executor, the task scheduler and the scanner), all
    /// until `work_stopped`. `admin_address` (where the admin port listens)
    /// goes into the member record for the peers' liveness connections.
    fn start_workers(
        &mut self,
        config: &Config,
        providers: Arc<Providers>,
        admin_address: SocketAddr,
        work_stopped: watch::Receiver<bool>,
    ) -> Workers {
        let (replication, adoptions) = Ownership::new(
            self.store.clone(),
            self.keys.clone(),
            OwnershipConfig {
                replica_id: config.replica_id.clone(),
                address: self.address.to_string(),
                admin_address: admin_address.to_string(),
                admin_tls: config
                    .security
                    .admin_tls
                    .as_ref()
                    .map(|t| Arc::clone(&t.peers)),
                lease_ttl: Duration::from_secs(config.lease_ttl_seconds as u64),
                lease_margin: config.lease_margin,
                peer_liveness: config.peer_liveness,
            },
            Arc::clone(&self.metrics),
        );
        self.start_replication(config, &replication, &providers, &work_stopped);
        let work = OwnerWork::new(Arc::clone(&replication));
        let executor = self.start_owner_work(config, providers, &work, adoptions, work_stopped);
        Workers {
            replication,
            executor,
            work,
        }
    }

    /// Membership, ownership, the provider probes and the peers' liveness
    /// connections, as `config` asks.
    fn start_replication(
        &mut self,
        config: &Config,
        replication: &Arc<Ownership>,
        providers: &Arc<Providers>,
        work_stopped: &watch::Receiver<bool>,
    ) {
        let tasks = &mut self.tasks;
        tasks.spawn(
            "membership",
            Arc::clone(replication).run_membership(work_stopped.clone()),
        );
        tasks.spawn(
            "ownership",
            Arc::clone(replication).run_ownership(Arc::clone(&self.cache), work_stopped.clone()),
        );
        if let Some(after) = config.provider_handover_after {
            let probes = Arc::clone(replication).run_provider_probes(
                Arc::clone(providers),
                Arc::clone(&self.cache),
                after,
                work_stopped.clone(),
            );
            tasks.spawn("provider-probes", probes);
        }
        // On whatever liveness says: it covers what liveness leaves to the
        // TTL (a pause, a partition, a host that went silently).
        tasks.spawn(
            "expiring-leases",
            Arc::clone(replication).run_expiring_leases(work_stopped.clone()),
        );
        // Off, a crashed peer is left to its lease TTL (the /liveness
        // endpoint still answers, for peers that do watch).
        if config.peer_liveness {
            let liveness = Arc::clone(replication);
            tasks.spawn(
                "liveness",
                liveness.run_liveness(Arc::clone(&self.cache), work_stopped.clone()),
            );
        }
    }

    /// The executor, the task scheduler, the scanner and the rollouts, on
    /// one owner-work runtime; the executor, which requests go to.
    fn start_owner_work(
        &mut self,
        config: &Config,
        providers: Arc<Providers>,
        work: &Arc<OwnerWork>,
        adoptions: tokio::sync::mpsc::UnboundedReceiver<String>,
        work_stopped: watch::Receiver<bool>,
    ) -> Arc<Executor> {
        let executor = Executor::new(
            self.operations.clone(),
            Arc::clone(&providers),
            Arc::clone(work),
            Arc::clone(&self.cache),
            config.operation_timeouts.clone(),
            config.orphaned_operations,
        );
        let scheduler = TaskScheduler::new(
            TaskStore::new(self.store.clone(), self.keys.clone()),
            Arc::clone(&providers),
            Arc::clone(work),
            Arc::clone(&self.cache),
            Arc::clone(&self.metrics),
            config.task_run_timeout,
        );
        let scanner = Scanner::new(
            self.operations.clone(),
            Arc::clone(&executor),
            providers,
            Arc::clone(work),
            Arc::clone(&self.cache),
            config.scan_interval,
            Arc::clone(&self.audit),
        );
        let remediator = crate::health::Remediator::new(
            self.operations.clone(),
            Arc::clone(&executor),
            Arc::clone(work),
            Arc::clone(&self.cache),
            config.scan_interval,
            Arc::clone(&self.audit),
            Arc::clone(&self.metrics),
        );
        let rollouts = self.start_rollout_owners(work, &work_stopped);
        let store = RolloutStore::new(self.store.clone(), self.keys.clone());
        let starts = Starts::new(
            Arc::clone(&executor),
            Arc::clone(work),
            Arc::clone(&self.audit),
        );
        let rollouts = RolloutController::new(
            store,
            rollouts,
            starts,
            self.operations.clone(),
            Arc::clone(&self.cache),
            Arc::clone(&self.metrics),
            Arc::clone(work),
        );
        let follow =
            Arc::clone(&rollouts).follow_clusters(Arc::clone(&self.cache), work_stopped.clone());
        self.tasks.spawn("rollout-clusters", follow);
        let runtime = Runtime::new(
            Arc::clone(work),
            Arc::clone(&self.cache),
            Arc::clone(&self.metrics),
        )
        .with(executor.clone())
        .with(scheduler)
        .with(scanner)
        .with(remediator)
        .with(rollouts);
        self.tasks
            .spawn("owner-work", runtime.run(adoptions, work_stopped));
        executor
    }
}

impl Replica {
    /// Which rollouts this replica runs, kept in step with their owner
    /// keys until `work_stopped`.
    fn start_rollout_owners(
        &mut self,
        work: &Arc<OwnerWork>,
        work_stopped: &watch::Receiver<bool>,
    ) -> Arc<RolloutOwners> {
        let store = RolloutStore::new(self.store.clone(), self.keys.clone());
        let owners = RolloutOwners::new(store, Arc::clone(work));
        let run = Arc::clone(&owners).run(Arc::clone(&self.cache), work_stopped.clone());
        self.tasks.spawn("rollout-owners", run);
        owners
    }
}

/// What follows etcd beside the owner work: the etcd version check, the
/// compactor (unless `--compact-interval 0`) until `work_stopped`, the
/// cluster cache and the audit log's reopening on SIGHUP; returns what
/// stops the cache.
fn start_followers(
    config: &Config,
    (store, metrics, cache): (&SharedStore, &Arc<Metrics>, &Arc<ClusterCache>),
    audit: &Arc<AuditLog>,
    work_stopped: &watch::Receiver<bool>,
    tasks: &mut Supervisor,
) -> Result<watch::Sender<bool>, StartError> {
    // In the background: an etcd that is slow to answer must not hold up
    // the start.
    let checked = (store.clone(), Arc::clone(metrics));
    tasks.spawn("etcd-version-check", async move {
        crate::store::known_issues::report(&checked.0, &checked.1).await
    });
    if let Some(interval) = config.compact_interval {
        let prefix = config.key_prefix.clone();
        let compactor =
            crate::compactor::run(store.clone(), prefix, interval, work_stopped.clone());
        tasks.spawn("compactor", compactor);
    }
    // The cache follows etcd until the lease is revoked: the hand-off
    // decides from it which clusters run nothing here.
    let (stop_cache, cache_stopped) = watch::channel(false);
    // Reopening lasts as long as requests may come: to the end.
    if let Some(reopen) = audit.reopen_on_sighup(cache_stopped.clone())? {
        tasks.spawn("audit-reopen", reopen);
    }
    tasks.spawn("cluster-cache", Arc::clone(cache).run(cache_stopped));
    Ok(stop_cache)
}

/// The web console, and the feed that keeps it live until `work_stopped`.
fn start_console(
    config: &Config,
    (cache, keys): (&Arc<ClusterCache>, &KeyLayout),
    (operations, audit): (&Operations, &Arc<AuditLog>),
    work_stopped: &watch::Receiver<bool>,
    tasks: &mut Supervisor,
) -> Console {
    let feed = ConsoleFeed::new();
    tasks.spawn(
        "console-feed",
        Arc::clone(&feed).run(Arc::clone(cache), keys.clone(), work_stopped.clone()),
    );
    Console::new(
        config.security.tokens.as_ref(),
        Arc::clone(cache),
        operations.clone(),
        feed,
        Arc::clone(audit),
    )
}

/// Binds `address` and tells where it listens (the port is chosen when
/// `address` asks for 0).
async fn bind(address: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind { address, source };
    let listener = TcpListener::bind(address).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// The admin port, served.
struct Admin {
    /// What /readyz answers.
    ready: Arc<AtomicBool>,
    /// Its drop closes the port.
    open: watch::Sender<bool>,
    /// Where it listens.
    address: SocketAddr,
}

/// Binds the admin port at `address`; with `fallback`, a taken `address`
/// gives way to a free port on the same interface, said in a warning
/// (another `drover dev` holds the default).
async fn bind_admin(
    address: SocketAddr,
    fallback: bool,
) -> Result<(TcpListener, SocketAddr), StartError> {
    match bind(address).await {
        Err(StartError::Bind { source, .. })
            if fallback && source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            let bound = bind(SocketAddr::new(address.ip(), 0)).await?;
            tracing::warn!(
                taken = %address,
                address = %bound.1,
                "the admin port is taken (another instance?): serving admin HTTP on a free port instead; --admin-listen chooses one"
            );
            Ok(bound)
        }
        bound => bound,
    }
}

/// Serves /metrics, /healthz, /readyz, /liveness (answered by
/// `incarnation` once set) and the console on the bound admin port.
fn start_admin(
    (listener, bound): (TcpListener, SocketAddr),
    metrics: &Arc<Metrics>,
    incarnation: &admin_http::Incarnation,
    console: Arc<Console>,
    tls: Option<crate::config::AdminTls>,
    tasks: &mut Supervisor,
) -> Admin {
    let ready = Arc::new(AtomicBool::new(true));
    let (open, closed) = watch::channel(false);
    let tls_on = tls.is_some();
    tracing::info!(address = %bound, tls = tls_on, "serving admin HTTP (/metrics, /healthz, /readyz, /liveness, /ui)");
    let serve = admin_http::serve(
        listener,
        Arc::clone(metrics),
        Arc::clone(&ready),
        Arc::clone(incarnation),
        Some(console),
        tls,
        closed,
    );
    tasks.spawn("admin-http", serve);
    Admin {
        ready,
        open,
        address: bound,
    }
}

/// Refuses to start as `config.replica_id` while a live process holds
/// that id (see [`crate::replication::live_twin`]): joining would revoke
/// its lease, and it ours, for ever. A previous incarnation that is gone
/// is left to `join`, which revokes its lease at once.
async fn refuse_live_twin(
    replica: &Replica,
    config: &Config,
    admin: SocketAddr,
) -> Result<(), StartError> {
    let replica_id = &config.replica_id;
    let own = admin.to_string();
    let tls = config.security.admin_tls.as_ref().map(|tls| &tls.peers);
    let twin =
        crate::replication::live_twin(replica.store.as_ref(), &replica.keys, replica_id, &own, tls);
    match twin.await {
        Ok(None) => Ok(()),
        Ok(Some(other)) => Err(StartError::ReplicaIdInUse {
            replica_id: replica_id.clone(),
            other,
        }),
        // Joining retries until etcd answers; the check is not worth a
        // failed start.
        Err(error) => {
            tracing::warn!(%error, "cannot check whether another process holds this replica id");
            Ok(())
        }
    }
}
