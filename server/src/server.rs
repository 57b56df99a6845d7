//! Assembles a replica: services, health, reflection; serves until the
//! shutdown signal, then drains in-flight RPCs.

use crate::admin_http;
use crate::api::{AdminService, ClustersService, OperationsService, TasksService};
use crate::auth::{AuthLayer, Authenticator};
use crate::cluster::ClusterCache;
use crate::config::Config;
use crate::executor::Executor;
use crate::keys::KeyLayout;
use crate::metrics::Metrics;
use crate::net::incoming;
use crate::operation::{LocalRunner, Operations};
use crate::provider::Provider;
use crate::replication::{Replication, ReplicationConfig};
use crate::scanner::Scanner;
use crate::store::MeteredStore;
use crate::store::SharedStore;
use crate::task::{TaskScheduler, TaskStore};
use drover_proto::v1::{
    admin_server::AdminServer, clusters_server::ClustersServer,
    operations_server::OperationsServer, tasks_server::TasksServer,
};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic_health::ServingStatus;

/// Reports `status` for the replica as a whole (`""`) and for each of its
/// services, so that probes naming a service see what the others see.
async fn report_health(health: &tonic_health::server::HealthReporter, status: ServingStatus) {
    use tonic::server::NamedService;
    for service in [
        "",
        ClustersServer::<ClustersService>::NAME,
        OperationsServer::<OperationsService>::NAME,
        TasksServer::<TasksService>::NAME,
        AdminServer::<AdminService>::NAME,
    ] {
        health.set_service_status(service, status).await;
    }
}

/// How long in-flight RPCs may take to finish after SIGTERM.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// How often a draining replica looks again for clusters it can hand over
/// (an operation that ended, one accepted for a cluster it still owns).
const HANDOFF_RECHECK: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// Serves the replica's gRPC API until `shutdown` completes. With a
/// provider the replica joins as a member, owns its share of the clusters
/// and runs their operations; without one it only serves reads and accepts
/// nothing that needs execution.
pub async fn serve(
    config: &Config,
    store: SharedStore,
    provider: Option<Provider>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics = Metrics::new();
    let store = MeteredStore::wrap(store, Arc::clone(&metrics));
    let keys = KeyLayout::new(config.key_prefix.clone());
    let cache = ClusterCache::new(store.clone(), keys.clone(), Arc::clone(&metrics));
    // In the background: an etcd that is slow to answer must not hold up
    // the start.
    let checked = (store.clone(), Arc::clone(&metrics));
    tokio::spawn(async move { crate::store::known_issues::report(&checked.0, &checked.1).await });
    let operations = Operations::new(
        store.clone(),
        keys.clone(),
        config.operation_history,
        Arc::clone(&metrics),
    )
    .with_cache(Arc::clone(&cache));

    let (health, health_service) = tonic_health::server::health_reporter();
    report_health(&health, ServingStatus::Serving).await;

    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(drover_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            address: config.listen,
            source,
        })?;
    let address = listener.local_addr().map_err(|source| ServeError::Bind {
        address: config.listen,
        source,
    })?;

    let (stop_work, work_stopped) = tokio::sync::watch::channel(false);
    let admin_listener = TcpListener::bind(config.admin_listen)
        .await
        .map_err(|source| ServeError::Bind {
            address: config.admin_listen,
            source,
        })?;
    let ready = Arc::new(AtomicBool::new(true));
    // The admin port outlives the drain (orchestrators probe /healthz and
    // /readyz through it): it closes when this function returns and the
    // sender goes.
    let (_admin_open, admin_closed) = tokio::sync::watch::channel(false);
    tracing::info!(address = %admin_listener.local_addr().map_err(|source| ServeError::Bind { address: config.admin_listen, source })?, "serving admin HTTP (/metrics, /healthz, /readyz)");
    tokio::spawn(admin_http::serve(
        admin_listener,
        Arc::clone(&metrics),
        Arc::clone(&ready),
        admin_closed,
    ));
    if let Some(interval) = config.compact_interval {
        tokio::spawn(crate::compactor::run(
            store.clone(),
            config.key_prefix.clone(),
            interval,
            work_stopped.clone(),
        ));
    }
    // The cache follows etcd until the lease is revoked: the hand-off
    // decides from it which clusters run nothing here.
    let (stop_cache, cache_stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(Arc::clone(&cache).run(cache_stopped));
    let executes = provider.is_some();
    let workers = match provider {
        Some(provider) => {
            let (replication, adoptions) = Replication::new(
                store.clone(),
                keys.clone(),
                ReplicationConfig {
                    replica_id: config.replica_id.clone(),
                    address: address.to_string(),
                    lease_ttl: Duration::from_secs(config.lease_ttl_seconds as u64),
                    lease_margin: config.lease_margin,
                },
                Arc::clone(&metrics),
            );
            tokio::spawn(Arc::clone(&replication).run_membership(work_stopped.clone()));
            tokio::spawn(
                Arc::clone(&replication).run_ownership(Arc::clone(&cache), work_stopped.clone()),
            );
            let executor = Executor::new(
                operations.clone(),
                provider.clone(),
                Arc::clone(&replication),
                Arc::clone(&cache),
                config.operation_timeouts.clone(),
            );
            operations.set_local_runner(Arc::clone(&executor) as Arc<dyn LocalRunner>);
            tokio::spawn(Arc::clone(&executor).run(work_stopped.clone(), adoptions));
            let tasks = TaskScheduler::new(
                TaskStore::new(store.clone(), keys.clone()),
                provider.clone(),
                Arc::clone(&replication),
                Arc::clone(&cache),
                Arc::clone(&metrics),
                config.task_run_timeout,
            );
            tokio::spawn(Arc::clone(&tasks).run(work_stopped.clone()));
            let scanner = Scanner::new(
                operations.clone(),
                provider,
                Arc::clone(&replication),
                Arc::clone(&cache),
                config.scan_interval,
            );
            tokio::spawn(scanner.run(work_stopped));
            Some((replication, executor, tasks))
        }
        None => {
            tracing::warn!("no provider configured: lifecycle operations are refused");
            None
        }
    };
    let admin = AdminService::new(
        store.clone(),
        keys.clone(),
        workers.as_ref().map(|(r, _, _)| Arc::clone(r)),
    );
    tracing::info!(%address, replica = %config.replica_id, "serving gRPC");

    let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_cache = Arc::clone(&cache);
    let handoff_grace = config.handoff_grace;
    let drain = async move {
        shutdown.await;
        // Tell load balancers first, then take no new work, let running
        // operations finish for a while, and hand the clusters off at once
        // by revoking the lease.
        report_health(&health, ServingStatus::NotServing).await;
        ready.store(false, Ordering::SeqCst);
        if let Some((_, executor, tasks)) = &workers {
            executor.stop_taking_work();
            tasks.stop_taking_work();
        }
        let _ = stop_work.send(true);
        if let Some((replication, executor, _)) = workers {
            hand_off(&replication, &executor, &drain_cache, handoff_grace).await;
            if executor.in_flight() == 0 {
                replication.resign().await;
            } else {
                tracing::warn!(
                    running = executor.in_flight(),
                    "operations still running: leaving without revoking the lease, peers take over after the TTL"
                );
                replication.leave();
            }
        }
        let _ = stop_cache.send(true);
        tracing::info!(grace = ?DRAIN_GRACE, "shutting down: draining in-flight requests");
        let _ = draining_tx.send(());
    };
    // Clients that keep idle connections open must not hold the exit hostage.
    let grace_over = async move {
        if draining_rx.await.is_ok() {
            tokio::time::sleep(DRAIN_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let mut builder = Server::builder();
    if let Some(tls) = &config.security.server_tls {
        builder = builder.tls_config(tls.config())?;
        tracing::info!(
            client_certificates = tls.client_ca_pem.is_some(),
            "serving gRPC over TLS"
        );
    }
    let authenticator = match &config.security.tokens {
        Some(tokens) => {
            tracing::info!(
                tokens = tokens.tokens().len(),
                "bearer tokens required on every RPC"
            );
            Authenticator::from_tokens(tokens)
        }
        None => {
            tracing::warn!("no --auth-tokens: every caller may do everything");
            Authenticator::open()
        }
    };
    let serving = builder
        .layer(AuthLayer::new(Arc::new(authenticator)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(ClustersServer::new(ClustersService::new(
            operations.clone(),
            cache,
            executes,
        )))
        .add_service(OperationsServer::new(OperationsService::new(
            operations.clone(),
        )))
        .add_service(TasksServer::new(TasksService::new(operations)))
        .add_service(AdminServer::new(admin))
        .serve_with_incoming_shutdown(incoming(listener), drain);
    tokio::select! {
        served = serving => served?,
        _ = grace_over => tracing::warn!("grace period over: closing remaining connections"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Lets the operations running here finish, for at most `grace`, while
/// every other cluster goes to the peers at once (see
/// [`Replication::release_unbusy`]); with nothing running the lease revoke
/// that follows hands everything over in one go.
async fn hand_off(
    replication: &Replication,
    executor: &Executor,
    cache: &ClusterCache,
    grace: Duration,
) {
    if executor.in_flight() == 0 {
        return;
    }
    let deadline = tokio::time::Instant::now() + grace;
    // etcd may not answer at all: the grace bounds every step, and what is
    // not handed over by then goes with the lease.
    match tokio::time::timeout_at(deadline, replication.begin_draining()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot mark this replica draining; its clusters go with the lease");
        }
        Err(_) => tracing::warn!("marking this replica draining took the whole hand-off grace"),
    }
    let mut running = executor.in_flight();
    let mut next_release = tokio::time::Instant::now();
    while running > 0 && tokio::time::Instant::now() < deadline {
        if tokio::time::Instant::now() >= next_release {
            let released = replication.release_unbusy(cache, |id| executor.runs(id));
            match tokio::time::timeout_at(deadline, released).await {
                Ok(Ok(left)) => tracing::info!(running, owned = left, "draining"),
                Ok(Err(error)) => tracing::warn!(%error, "hand-off release failed; retrying"),
                Err(_) => break,
            }
            next_release = tokio::time::Instant::now() + HANDOFF_RECHECK;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now_running = executor.in_flight();
        if now_running < running {
            // An operation ended: its cluster can go as soon as the cache
            // shows it idle.
            next_release = tokio::time::Instant::now();
        }
        running = now_running;
    }
    if running > 0 {
        tracing::warn!(
            running,
            "hand-off grace over: peers will recover the running operations"
        );
    }
}
