//! The status scanner: compares what the provider reports with each idle
//! cluster's state and moves it by the table.
//!
//! - Running with faulty nodes → Alert (FaultsDetected), a CAS on the state
//!   as read.
//! - Alert with every node healthy → a Recover operation (Recovering →
//!   Running); Alert with every node stopped → a Stop operation (Stopping →
//!   Stopped). Both go through the normal accept path, so each move is an
//!   edge and holds the slot.
//! - Destroying with no operation (a destroy that failed) → the destroy is
//!   retried.
//!
//! Only clusters this replica owns are scanned, as its watch cache shows
//! them (a cluster that changed meanwhile only loses the compare-and-swap);
//! clusters holding an operation are left to the executor.

use crate::cluster::machine::Event;
use crate::cluster::{ClusterCache, ClusterFilter, ClusterRecord, ClusterState};
use crate::executor::Executor;
use crate::operation::{
    LifecycleError, LifecycleRequest, OperationKind, OperationParams, Operations,
};
use crate::owner_work::OwnerWork;
use crate::provider::{node_ready, Providers, DESCRIBE_TIMEOUT};
use crate::replication::Ownership;
use drover_proto::provider::v1 as pb;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const PAGE: usize = 500;

pub struct Scanner {
    operations: Operations,
    /// Where the operations the scanner asks for go, like any request.
    executor: Arc<Executor>,
    /// Each cluster is described by its own provider.
    providers: Arc<Providers>,
    /// The claim check.
    work: OwnerWork,
    cache: Arc<ClusterCache>,
    interval: Duration,
}

impl Scanner {
    pub fn new(
        operations: Operations,
        executor: Arc<Executor>,
        providers: Arc<Providers>,
        replication: Arc<Ownership>,
        cache: Arc<ClusterCache>,
        interval: Duration,
    ) -> Self {
        Self {
            operations,
            executor,
            providers,
            work: OwnerWork::new(replication),
            cache,
            interval,
        }
    }

    /// Scans every `interval` until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
            }
            if let Err(error) = self.scan().await {
                tracing::warn!(%error, "status scan failed");
            }
        }
    }

    /// Checks each owned cluster as the watch cache shows it. Reading every
    /// cluster from etcd instead, on every replica each interval, cost etcd
    /// more than a core at rest with ten thousand clusters.
    async fn scan(&self) -> Result<(), LifecycleError> {
        for name in self.work.replication().owned_clusters() {
            match self.cache.get(&name) {
                Some(Ok(cluster)) => self.check_logged(&cluster).await,
                // Deleted since, or unreadable (which reads report).
                Some(Err(_)) => {}
                None => return self.scan_store().await,
            }
        }
        Ok(())
    }

    /// Scans every cluster as etcd has it, page by page: while the cache is
    /// not ready.
    async fn scan_store(&self) -> Result<(), LifecycleError> {
        let mut after: Option<String> = None;
        loop {
            let page = self
                .operations
                .registry()
                .list(&ClusterFilter::default(), after.as_deref(), PAGE)
                .await?;
            for cluster in &page.clusters {
                self.check_logged(cluster).await;
            }
            match page.next_after {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
        }
    }

    async fn check_logged(&self, cluster: &ClusterRecord) {
        if let Err(error) = self.check(cluster).await {
            tracing::debug!(cluster = %cluster.spec.name, %error, "scanner left the cluster alone");
        }
    }

    async fn check(&self, cluster: &ClusterRecord) -> Result<(), LifecycleError> {
        let name = &cluster.spec.name;
        let Some(claim) = self.work.claim(name) else {
            // Another replica's cluster.
            return Ok(());
        };
        if cluster.state.operation.is_some() || cluster.newer_schema().is_some() {
            return Ok(());
        }
        let request = |kind| LifecycleRequest {
            kind,
            params: OperationParams::default(),
            request_id: String::new(),
        };
        match cluster.state.state {
            ClusterState::Running => {
                let nodes = self.describe(cluster).await?;
                let faulty: Vec<&str> = nodes
                    .iter()
                    .filter(|n| !node_ready(n))
                    .map(|n| n.id.as_str())
                    .collect();
                if !faulty.is_empty() {
                    let message = format!("faults detected on nodes {}", faulty.join(", "));
                    let fence = claim.fence(self.operations.keys(), name);
                    self.operations
                        .transition(cluster, Event::FaultsDetected, message, &fence)
                        .await?;
                }
            }
            ClusterState::Alert => {
                let nodes = self.describe(cluster).await?;
                if nodes.is_empty() {
                    return Ok(());
                }
                if nodes.iter().all(node_ready) {
                    self.executor
                        .submit(name, request(OperationKind::Recover))
                        .await?;
                } else if nodes.iter().all(|n| n.power_state == "off") {
                    self.executor
                        .submit(name, request(OperationKind::Stop))
                        .await?;
                }
            }
            ClusterState::Destroying => {
                tracing::info!(cluster = %name, "retrying a destroy that did not finish");
                self.executor
                    .submit(name, request(OperationKind::Destroy))
                    .await?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn describe(
        &self,
        cluster: &ClusterRecord,
    ) -> Result<Vec<pb::ProviderNode>, LifecycleError> {
        let request = pb::DescribeClusterRequest {
            cluster_uid: cluster.spec.uid.clone(),
            token: None,
        };
        let mut provider = self
            .providers
            .for_cluster(&cluster.spec.spec)
            .map_err(|e| LifecycleError::ProviderUnavailable(e.to_string()))?;
        let described = tokio::time::timeout(DESCRIBE_TIMEOUT, provider.describe_cluster(request))
            .await
            .map_err(|_| {
                LifecycleError::ProviderUnavailable(format!(
                    "no answer to DescribeCluster within {DESCRIBE_TIMEOUT:?}"
                ))
            })?;
        described
            .map(|r| r.into_inner().nodes)
            .map_err(|status| LifecycleError::ProviderUnavailable(status.message().to_string()))
    }
}
