//! Metrics, in one registry passed explicitly to whatever records them, and
//! rendered in the Prometheus text format by the admin HTTP port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub kind: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub from: String,
    pub to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskRunLabels {
    pub task_type: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssueLabels {
    pub issue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub request: String,
}

fn seconds_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric Drover records.
pub struct Metrics {
    registry: Registry,
    pub operations: Family<OperationLabels, Counter>,
    pub operation_seconds: Family<KindLabels, Histogram, fn() -> Histogram>,
    pub transitions: Family<TransitionLabels, Counter>,
    pub etcd_request_seconds: Family<RequestLabels, Histogram, fn() -> Histogram>,
    pub provider_request_seconds: Family<RequestLabels, Histogram, fn() -> Histogram>,
    pub keepalive_failures: Counter,
    pub clusters_owned: Gauge,
    pub ownership_passes: Counter,
    pub clusters: Gauge,
    pub orphan_recoveries: Counter,
    /// Operations resumed by a new owner after their owner was lost.
    pub orphan_resumes: Counter,
    /// Leases of this replica's own earlier incarnations revoked at join.
    pub previous_incarnations_revoked: Counter,
    /// Peers found crashed through their liveness connection.
    pub peer_crashes_detected: Counter,
    /// Leases of crashed peers this replica revoked.
    pub peer_leases_revoked: Counter,
    /// Peers this replica holds a liveness connection to now.
    pub liveness_peers_connected: Gauge,
    pub newer_schema_skipped: Counter,
    pub task_runs: Family<TaskRunLabels, Counter>,
    /// 1 for each known etcd issue the etcd in use has (by its version).
    pub etcd_known_issues: Family<IssueLabels, Gauge>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("drover");
        let operations = Family::<OperationLabels, Counter>::default();
        registry.register(
            "operations",
            "Finished operations by kind and result",
            operations.clone(),
        );
        let operation_seconds =
            Family::<KindLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                seconds_histogram,
            );
        registry.register(
            "operation_duration_seconds",
            "Operation duration from acceptance to end",
            operation_seconds.clone(),
        );
        let transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "state_transitions",
            "Cluster state changes by from and to state",
            transitions.clone(),
        );
        let etcd_request_seconds =
            Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                seconds_histogram,
            );
        registry.register(
            "etcd_request_duration_seconds",
            "Store request latency by request kind",
            etcd_request_seconds.clone(),
        );
        let provider_request_seconds =
            Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                seconds_histogram,
            );
        registry.register(
            "provider_request_duration_seconds",
            "Provider call latency by call, answered or not",
            provider_request_seconds.clone(),
        );
        let keepalive_failures = Counter::default();
        registry.register(
            "lease_keepalive_failures",
            "Failed lease keep-alives",
            keepalive_failures.clone(),
        );
        let clusters_owned = Gauge::default();
        registry.register(
            "clusters_owned",
            "Clusters this replica owns",
            clusters_owned.clone(),
        );
        let ownership_passes = Counter::default();
        registry.register(
            "ownership_passes",
            "Ownership passes run (each goes over every cluster in the cache)",
            ownership_passes.clone(),
        );
        let clusters = Gauge::default();
        registry.register(
            "clusters",
            "Clusters in this replica's watch cache (all clusters)",
            clusters.clone(),
        );
        let orphan_recoveries = Counter::default();
        registry.register(
            "orphan_recoveries",
            "Operations failed and task runs aborted because their owner was lost",
            orphan_recoveries.clone(),
        );
        let orphan_resumes = Counter::default();
        registry.register(
            "orphan_resumes",
            "Operations a new owner resumed from their last persisted step after their owner was lost",
            orphan_resumes.clone(),
        );
        let previous_incarnations_revoked = Counter::default();
        registry.register(
            "previous_incarnations_revoked",
            "Leases of this replica's previous incarnations (a crash, then a restart) revoked when it joined, handing their clusters over at once",
            previous_incarnations_revoked.clone(),
        );
        let peer_crashes_detected = Counter::default();
        registry.register(
            "peer_crashes_detected",
            "Peers found crashed: their liveness connection broke and a probe was refused or answered by another incarnation",
            peer_crashes_detected.clone(),
        );
        let peer_leases_revoked = Counter::default();
        registry.register(
            "peer_leases_revoked",
            "Leases of crashed peers revoked by this replica, handing their clusters over before the TTL",
            peer_leases_revoked.clone(),
        );
        let liveness_peers_connected = Gauge::default();
        registry.register(
            "liveness_peers_connected",
            "Peers this replica holds a liveness connection to",
            liveness_peers_connected.clone(),
        );
        let newer_schema_skipped = Counter::default();
        registry.register(
            "newer_schema_records",
            "Times a cluster was left alone because its records have a newer schema",
            newer_schema_skipped.clone(),
        );
        let task_runs = Family::<TaskRunLabels, Counter>::default();
        registry.register(
            "task_runs",
            "Finished task runs by task type and status",
            task_runs.clone(),
        );
        let etcd_known_issues = Family::<IssueLabels, Gauge>::default();
        registry.register(
            "etcd_known_issue",
            "Known etcd issues of the etcd version in use (see PRODUCTION.md)",
            etcd_known_issues.clone(),
        );
        Arc::new(Self {
            registry,
            operations,
            operation_seconds,
            transitions,
            etcd_request_seconds,
            provider_request_seconds,
            keepalive_failures,
            clusters_owned,
            ownership_passes,
            clusters,
            orphan_recoveries,
            orphan_resumes,
            previous_incarnations_revoked,
            peer_crashes_detected,
            peer_leases_revoked,
            liveness_peers_connected,
            newer_schema_skipped,
            task_runs,
            etcd_known_issues,
        })
    }

    /// Counts a state change (nothing when the state stays).
    pub fn transition(&self, from: impl ToString, to: impl ToString) {
        let (from, to) = (from.to_string(), to.to_string());
        if from != to {
            self.transitions
                .get_or_create(&TransitionLabels { from, to })
                .inc();
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}
