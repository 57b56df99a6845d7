//! The gRPC side of a replica: its services behind TLS and the auth layer,
//! health and reflection, and [`serve`], which glues a started
//! [`Replica`] to them and to the [`shutdown`](crate::shutdown) drain.
//!
//! What runs behind the services is started in [`crate::replica`] and
//! stopped in [`crate::shutdown`]; this module only decides what the
//! network sees.

use crate::api::{AdminService, ClustersService, OperationsService, RolloutsService, TasksService};
use crate::auth::{AuthLayer, Authenticator};
use crate::config::Config;
use crate::net::incoming;
use crate::provider::Providers;
use crate::replica::{Replica, StartError};
use crate::rollout::RolloutStore;
use crate::shutdown::Drain;
use crate::store::SharedStore;
use drover_proto::v1::{
    admin_server::AdminServer, clusters_server::ClustersServer,
    operations_server::OperationsServer, rollouts_server::RolloutsServer,
    tasks_server::TasksServer,
};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::server::Router;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_reflection::server::v1::ServerReflectionServer;

/// Reports `status` for the replica as a whole (`""`) and for each of its
/// services, so that probes naming a service see what the others see.
async fn report_health(health: &tonic_health::server::HealthReporter, status: ServingStatus) {
    use tonic::server::NamedService;
    for service in [
        "",
        ClustersServer::<ClustersService>::NAME,
        OperationsServer::<OperationsService>::NAME,
        TasksServer::<TasksService>::NAME,
        RolloutsServer::<RolloutsService>::NAME,
        AdminServer::<AdminService>::NAME,
    ] {
        health.set_service_status(service, status).await;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Panicked(crate::supervisor::Panicked),
}

/// How long the replica's tasks get to end after the drain before they
/// are aborted: the process is exiting, and the cluster cache follows its
/// watch for as long as a reader holds it, which may be to the end.
const TASKS_JOIN_LIMIT: Duration = Duration::from_millis(250);

/// Serves the replica's gRPC API until `shutdown` completes. With a
/// provider the replica joins as a member, owns its share of the clusters
/// and runs their operations; without one it only serves reads and accepts
/// nothing that needs execution.
pub async fn serve(
    config: &Config,
    store: SharedStore,
    providers: Option<Arc<Providers>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    report_health(&health, ServingStatus::Serving).await;
    let reflection = reflection()?;
    let replica = Replica::start(config, store, providers).await?;
    tracing::info!(address = %replica.address, replica = %config.replica_id, "serving gRPC");
    let router = transport(config)?
        .layer(AuthLayer::new(
            Arc::new(authenticator(config)),
            Arc::clone(&replica.audit),
        ))
        .add_service(health_service)
        .add_service(reflection);
    let router = add_api(router, &replica);
    // The admin port outlives the drain (orchestrators probe /healthz and
    // /readyz through it): it closes when this function returns.
    let Replica {
        listener,
        workers,
        cache,
        switches,
        admin_open,
        mut tasks,
        ..
    } = replica;
    let drain = Drain {
        switches,
        workers,
        cache,
        handoff_grace: config.handoff_grace,
    };
    let withdraw = async move { report_health(&health, ServingStatus::NotServing).await };
    let (drain, grace_over) = drain.after(shutdown, withdraw);
    tokio::select! {
        served = router.serve_with_incoming_shutdown(incoming(listener), drain) => served?,
        _ = grace_over => tracing::warn!("grace period over: closing remaining connections"),
        panicked = tasks.panicked() => return Err(ServeError::Panicked(panicked)),
    }
    drop(admin_open);
    let aborted = tasks.join(TASKS_JOIN_LIMIT).await;
    if !aborted.is_empty() {
        tracing::info!(?aborted, "tasks still running after the drain were aborted");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Lets clients list the services and their messages (grpcurl,
/// grpcui) without the proto files.
fn reflection(
) -> Result<ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>, ServeError>
{
    Ok(tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(drover_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?)
}

/// The drover.v1 services over the parts of `replica`; lifecycle calls
/// are accepted only when it has workers to run them.
fn add_api<L>(router: Router<L>, replica: &Replica) -> Router<L> {
    let operations = &replica.operations;
    let replication = replica.workers.as_ref().map(|w| Arc::clone(&w.replication));
    router
        .add_service(ClustersServer::new(ClustersService::new(
            operations.clone(),
            Arc::clone(&replica.cache),
            replica.workers.as_ref().map(|w| Arc::clone(&w.executor)),
            replica.providers.clone(),
        )))
        .add_service(OperationsServer::new(OperationsService::new(
            operations.clone(),
        )))
        .add_service(TasksServer::new(TasksService::new(operations.clone())))
        .add_service(RolloutsServer::new(RolloutsService::new(
            RolloutStore::new(replica.store.clone(), replica.keys.clone()),
            Arc::clone(&replica.cache),
        )))
        .add_service(AdminServer::new(AdminService::new(
            replica.store.clone(),
            replica.keys.clone(),
            replication,
            replica.providers.clone(),
        )))
}

/// The gRPC transport, over TLS when the config has a certificate.
fn transport(config: &Config) -> Result<Server, ServeError> {
    // Each request a span, a child of the caller's trace (when tracing).
    let mut builder = Server::builder().trace_fn(drover_telemetry::server_span);
    if let Some(tls) = &config.security.server_tls {
        builder = builder.tls_config(tls.config())?;
        tracing::info!(
            client_certificates = tls.client_ca_pem.is_some(),
            "serving gRPC over TLS"
        );
    }
    Ok(builder)
}

/// Who may call what: the configured bearer tokens, or everyone for
/// everything when there are none.
fn authenticator(config: &Config) -> Authenticator {
    match &config.security.tokens {
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
    }
}
