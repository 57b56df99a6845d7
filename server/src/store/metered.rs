//! A [`Store`] decorator that records the latency of every request.

use super::*;
use crate::metrics::{Metrics, RequestLabels};
use std::time::Instant;

/// Times every call of the wrapped store into
/// `drover_etcd_request_duration_seconds`.
pub struct MeteredStore {
    inner: SharedStore,
    metrics: Arc<Metrics>,
}

/// The request kinds this store labels its metrics with.
const REQUESTS: [&str; 9] = [
    "get",
    "range",
    "txn",
    "lease_grant",
    "lease_keepalive",
    "lease_revoke",
    "lease_ttl",
    "watch",
    "compact",
];

impl MeteredStore {
    /// Wraps `inner`; the error counters start at 0 for every request
    /// kind, so a first failure is an increase the alert rules see.
    pub fn wrap(inner: SharedStore, metrics: Arc<Metrics>) -> SharedStore {
        for request in REQUESTS {
            let request = request.to_string();
            let _ = metrics
                .etcd_request_errors
                .get_or_create(&RequestLabels { request });
        }
        Arc::new(Self { inner, metrics })
    }

    /// Records the latency, and counts the request in
    /// `drover_etcd_request_errors_total` when etcd failed it: a conflict,
    /// a compacted revision or an expired lease are answers, not failures.
    fn observe<T>(&self, request: &str, started: Instant, result: &Result<T>) {
        let labels = RequestLabels {
            request: request.to_string(),
        };
        self.metrics
            .etcd_request_seconds
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        if let Err(StoreError::Unavailable(_) | StoreError::NoSpace(_) | StoreError::Other(_)) =
            result
        {
            self.metrics
                .etcd_request_errors
                .get_or_create(&labels)
                .inc();
        }
    }
}

#[async_trait]
impl Store for MeteredStore {
    async fn get(&self, key: &str) -> Result<GetResult> {
        let started = Instant::now();
        let result = self.inner.get(key).await;
        self.observe("get", started, &result);
        result
    }

    async fn range(&self, request: RangeRequest) -> Result<GetResult> {
        let started = Instant::now();
        let result = self.inner.range(request).await;
        self.observe("range", started, &result);
        result
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let started = Instant::now();
        let result = self.inner.txn(txn).await;
        self.observe("txn", started, &result);
        result
    }

    async fn grant_lease(&self, ttl_seconds: i64) -> Result<LeaseId> {
        let started = Instant::now();
        let result = self.inner.grant_lease(ttl_seconds).await;
        self.observe("lease_grant", started, &result);
        result
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<i64> {
        let started = Instant::now();
        let result = self.inner.keep_alive(lease).await;
        self.observe("lease_keepalive", started, &result);
        result
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let started = Instant::now();
        let result = self.inner.revoke_lease(lease).await;
        self.observe("lease_revoke", started, &result);
        result
    }

    async fn lease_time_to_live(&self, lease: LeaseId) -> Result<Option<i64>> {
        let started = Instant::now();
        let result = self.inner.lease_time_to_live(lease).await;
        self.observe("lease_ttl", started, &result);
        result
    }

    async fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        let started = Instant::now();
        let result = self.inner.watch(prefix, from_revision).await;
        self.observe("watch", started, &result);
        result
    }

    async fn watch_puts(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        let started = Instant::now();
        let result = self.inner.watch_puts(prefix, from_revision).await;
        self.observe("watch", started, &result);
        result
    }

    async fn server_version(&self) -> Result<Option<String>> {
        self.inner.server_version().await
    }

    async fn raft_progress(&self) -> Result<Option<super::RaftProgress>> {
        self.inner.raft_progress().await
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        let started = Instant::now();
        let result = self.inner.compact(revision).await;
        self.observe("compact", started, &result);
        result
    }
}
