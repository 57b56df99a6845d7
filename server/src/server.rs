//! Assembles a replica: services, health, reflection; serves until the
//! shutdown signal, then drains in-flight RPCs.

use crate::api::{AdminService, ClustersService, OperationsService, TasksService};
use crate::config::Config;
use crate::executor::Executor;
use crate::keys::KeyLayout;
use crate::operation::Operations;
use crate::provider::Provider;
use crate::scanner::Scanner;
use crate::store::SharedStore;
use drover_proto::v1::{
    admin_server::AdminServer, clusters_server::ClustersServer,
    operations_server::OperationsServer, tasks_server::TasksServer,
};
use std::future::Future;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic_health::ServingStatus;

/// How long in-flight RPCs may take to finish after SIGTERM.
pub const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

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

/// Serves the replica's gRPC API until `shutdown` completes. Without a
/// provider the replica accepts no lifecycle operations.
pub async fn serve(
    config: &Config,
    store: SharedStore,
    provider: Option<Provider>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let keys = KeyLayout::new(config.key_prefix.clone());
    let operations = Operations::new(store.clone(), keys.clone(), config.operation_history);
    let (stop_work, work_stopped) = tokio::sync::watch::channel(false);
    let executes = provider.is_some();
    if let Some(provider) = provider {
        // This incarnation's fencing epoch: newer than any before it.
        let epoch = store.get(&keys.clusters()).await?.revision;
        let executor = Executor::new(
            operations.clone(),
            provider.clone(),
            config.replica_id.clone(),
            epoch,
            config.operation_timeouts.clone(),
        );
        tokio::spawn(executor.run(work_stopped.clone()));
        let scanner = Scanner::new(operations.clone(), provider, config.scan_interval);
        tokio::spawn(scanner.run(work_stopped));
    } else {
        tracing::warn!("no provider configured: lifecycle operations are refused");
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ClustersServer<ClustersService>>()
        .await;
    health
        .set_serving::<OperationsServer<OperationsService>>()
        .await;
    health.set_serving::<TasksServer<TasksService>>().await;
    health.set_serving::<AdminServer<AdminService>>().await;
    health.set_service_status("", ServingStatus::Serving).await;

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
    tracing::info!(%address, replica = %config.replica_id, "serving gRPC");

    let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = async move {
        shutdown.await;
        // Tell load balancers first, then stop accepting and drain.
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        let _ = stop_work.send(true);
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
    let serving = Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(ClustersServer::new(ClustersService::new(
            operations.clone(),
            executes,
        )))
        .add_service(OperationsServer::new(OperationsService::new(operations)))
        .add_service(TasksServer::new(TasksService))
        .add_service(AdminServer::new(AdminService))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), drain);
    tokio::select! {
        served = serving => served?,
        _ = grace_over => tracing::warn!("grace period over: closing remaining connections"),
    }
    tracing::info!("stopped");
    Ok(())
}
