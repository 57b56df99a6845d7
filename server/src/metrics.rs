//! Metrics, in one registry passed explicitly to whatever records them, and
//! rendered in the Prometheus text format by the admin HTTP port.
//!
//! # Guarantees
//! - The counters the alert rules divide or compare (`drover_operations_total`
//!   by kind and result, `drover_task_runs_total` by task type and final
//!   status) exist at 0 from the start for every kind, result, type and
//!   status: `increase()` sees a first failure, and a rule's "no success"
//!   side has a series to compare even for a type that never succeeded.
//! - `drover_oldest_running_operation_age_seconds{kind}` is computed at each
//!   scrape from the operations this replica runs now (accepted time to
//!   now); 0 for a kind with none running here. Every kind has a series.
//!
//! # Assumptions
//! - Label values come from fixed sets (kinds, results, task types, store
//!   and provider calls): no label carries a cluster or task name, so the
//!   series count does not grow with the clusters.
//!
//! # Caveats
//! - Each replica reports only what it runs or ran: sum or max over the
//!   replicas (the alert rules do).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::kind::OperationKind;
use crate::sync::lock;
use crate::task::TaskType;

/// Results of a finished operation, as `drover_operations_total` labels them.
const OPERATION_RESULTS: [&str; 3] = ["succeeded", "failed", "cancelled"];
/// Final statuses of a task run, as `drover_task_runs_total` labels them.
const RUN_STATUSES: [&str; 4] = ["done", "error", "stopped", "aborted"];
/// What automatic remediation did, as `drover_remediations_total` labels
/// it: started a remediation, short-circuited a cluster, gave up on a
/// node (its retries used up).
const REMEDIATION_OUTCOMES: [&str; 3] = ["started", "short_circuited", "gave_up"];
/// The provider calls an operation sends again when the provider is
/// unavailable, as `drover_provider_request_retries_total` labels them.
pub const RETRIED_PROVIDER_CALLS: [&str; 8] = [
    "CreateNodes",
    "StartNodes",
    "StopNodes",
    "ResizeNodes",
    "UpgradeNode",
    "DeleteNodes",
    "RepairNodes",
    "DescribeCluster",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub kind: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
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
pub struct TaskTypeLabels {
    pub task_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssueLabels {
    pub issue: String,
}

/// A controller of owner work: executor, tasks or scanner.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

/// A rollout, by name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    pub rollout: String,
}

/// A rollout and a state (its own, or its targets').
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutStateLabels {
    pub rollout: String,
    pub state: &'static str,
}

/// A requeue of owner work and why: after (the reconcile asked), error
/// (a backoff), pending (a trigger came while it ran).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequeueLabels {
    pub controller: &'static str,
    pub reason: &'static str,
}

/// A reconcile takes from a millisecond (a scan of an idle cluster) to
/// hours (an executor reconcile drives a whole operation): 1 ms .. ~70 min.
fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 12))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub request: String,
}

fn seconds_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Operations take seconds (a stop) to hours (a rolling upgrade of a large
/// cluster): 1 s .. 8 h, so a p99 over an hour is still a bucket.
pub const OPERATION_BUCKETS: [f64; 14] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
    28800.0,
];

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// The operations running on this replica now: kind and accepted time, by a
/// number each [`Running`] mark holds.
#[derive(Default)]
struct RunningOperations {
    next: AtomicU64,
    running: Mutex<HashMap<u64, (OperationKind, SystemTime)>>,
}

/// Marks one operation as running here until dropped.
pub struct Running {
    id: u64,
    metrics: Arc<Metrics>,
}

impl Drop for Running {
    fn drop(&mut self) {
        lock(&self.metrics.running.running).remove(&self.id);
    }
}

/// Every metric Drover records.
pub struct Metrics {
    registry: Registry,
    pub operations: Family<OperationLabels, Counter>,
    pub operation_seconds: Family<KindLabels, Histogram, fn() -> Histogram>,
    /// Refreshed from `running` at each render.
    oldest_running: Family<KindLabels, Gauge<f64, AtomicU64>>,
    running: RunningOperations,
    pub transitions: Family<TransitionLabels, Counter>,
    pub etcd_request_seconds: Family<RequestLabels, Histogram, fn() -> Histogram>,
    /// Store requests that returned an error (etcd unreachable, timed out).
    pub etcd_request_errors: Family<RequestLabels, Counter>,
    pub provider_request_seconds: Family<RequestLabels, Histogram, fn() -> Histogram>,
    /// Provider calls sent again because the provider was unavailable.
    pub provider_request_retries: Family<RequestLabels, Counter>,
    pub keepalive_failures: Counter,
    /// Leases this replica lost (found expired): every claim dropped at once.
    pub leases_lost: Counter,
    pub clusters_owned: Gauge,
    /// Providers this replica has not reached for longer than its
    /// `--provider-handover-after`.
    pub providers_unreachable: Gauge,
    pub ownership_passes: Counter,
    /// Clusters this replica claimed: every claim is an owner change.
    pub clusters_claimed: Counter,
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
    /// Crashed peers whose member key this replica removed.
    pub peer_members_deposed: Counter,
    /// Peers whose lease was about to expire unrenewed whose member key
    /// this replica removed.
    pub peer_expiring_deposed: Counter,
    /// Owner keys of departed members this replica deleted to claim them.
    pub owner_keys_drained: Counter,
    /// Peers this replica holds a liveness connection to now.
    pub liveness_peers_connected: Gauge,
    /// Refusals not taken as a peer's death: every liveness connection of
    /// this replica broke at once.
    pub liveness_self_suspected: Counter,
    pub newer_schema_skipped: Counter,
    pub task_runs: Family<TaskRunLabels, Counter>,
    /// When a run of the type last ended done on this replica (Unix
    /// seconds); absent until one did.
    pub task_last_success: Family<TaskTypeLabels, Gauge<f64, AtomicU64>>,
    /// 1 for each known etcd issue the etcd in use has (by its version).
    pub etcd_known_issues: Family<IssueLabels, Gauge>,
    pub owner_work_queue_depth: Family<ControllerLabels, Gauge>,
    pub owner_work_reconcile_seconds: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    pub owner_work_requeues: Family<RequeueLabels, Counter>,
    pub owner_work_errors: Family<ControllerLabels, Counter>,
    rollout_state: Family<RolloutStateLabels, Gauge>,
    rollout_clusters: Family<RolloutStateLabels, Gauge>,
    rollout_budget_paused: Family<RolloutLabels, Gauge>,
    remediations: Family<OutcomeLabels, Counter>,
    unhealthy_nodes: Gauge,
    clusters_short_circuited: Gauge,
    pub audit_write_failures: Counter,
}

/// Builds [`Metrics`] from one row per metric family: the field, the metric
/// (its type, labels and buckets), then its name (after `drover_`; counters
/// get `_total`) and help. Families are registered, and so rendered, in row
/// order.
macro_rules! metric_families {
    ($($field:ident: $metric:expr => $name:literal, $help:literal;)*) => {
        impl Metrics {
            /// Every family, registered in row order.
            fn registered() -> Self {
                let mut registry = Registry::with_prefix("drover");
                $(
                    let $field = $metric;
                    registry.register($name, $help, $field.clone());
                )*
                Metrics {
                    registry,
                    running: RunningOperations::default(),
                    $($field,)*
                }
            }
        }
    };
}

metric_families! {
    operations: Family::<OperationLabels, Counter>::default()
        => "operations", "Finished operations by kind and result";
    operation_seconds:
        Family::<KindLabels, Histogram, fn() -> Histogram>::new_with_constructor(operation_histogram)
        => "operation_duration_seconds", "Operation duration from acceptance to end";
    oldest_running: Family::<KindLabels, Gauge<f64, AtomicU64>>::default()
        => "oldest_running_operation_age_seconds", "Age (since acceptance) of the oldest operation of the kind running on this replica; 0 when none runs";
    transitions: Family::<TransitionLabels, Counter>::default()
        => "state_transitions", "Cluster state changes by from and to state";
    etcd_request_seconds:
        Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(seconds_histogram)
        => "etcd_request_duration_seconds", "Store request latency by request kind";
    etcd_request_errors: Family::<RequestLabels, Counter>::default()
        => "etcd_request_errors", "Store requests that failed (etcd unreachable, timed out, refused) by request kind";
    provider_request_seconds:
        Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(seconds_histogram)
        => "provider_request_duration_seconds", "Provider call latency by call, answered or not";
    provider_request_retries: Family::<RequestLabels, Counter>::default()
        => "provider_request_retries", "Provider calls sent again because the provider was unavailable (restarting, unreachable) or busy, by call";
    keepalive_failures: Counter::default()
        => "lease_keepalive_failures", "Failed lease keep-alives";
    providers_unreachable: Gauge::default()
        => "providers_unreachable", "Providers this replica has not reached for longer than --provider-handover-after (it hands its clusters to peers that do)";
    leases_lost: Counter::default()
        => "leases_lost", "Replica leases found expired (keep-alives failed for longer than the TTL): every cluster dropped at once and a new lease joined";
    clusters_owned: Gauge::default()
        => "clusters_owned", "Clusters this replica owns";
    ownership_passes: Counter::default()
        => "ownership_passes", "Ownership passes run (each goes over every cluster in the cache)";
    clusters_claimed: Counter::default()
        => "clusters_claimed", "Clusters this replica claimed: each claim is an owner change, under a new fencing epoch (summed over the replicas: how often clusters moved)";
    clusters: Gauge::default()
        => "clusters", "Clusters in this replica's watch cache (all clusters)";
    orphan_recoveries: Counter::default()
        => "orphan_recoveries", "Operations failed and task runs aborted because their owner was lost";
    orphan_resumes: Counter::default()
        => "orphan_resumes", "Operations a new owner resumed from their last persisted step after their owner was lost";
    previous_incarnations_revoked: Counter::default()
        => "previous_incarnations_revoked", "Leases of this replica's previous incarnations (a crash, then a restart) revoked when it joined, handing their clusters over at once";
    peer_crashes_detected: Counter::default()
        => "peer_crashes_detected", "Peers found crashed: their liveness connection broke and a probe was refused or answered by another incarnation";
    peer_leases_revoked: Counter::default()
        => "peer_leases_revoked", "Leases of crashed peers revoked by this replica once the survivors drained their owner keys (or a TTL passed)";
    peer_members_deposed: Counter::default()
        => "peer_members_deposed", "Crashed peers whose member key this replica removed, so that the survivors take their clusters over before the TTL";
    peer_expiring_deposed: Counter::default()
        => "peer_expiring_deposed", "Peers whose lease was about to expire unrenewed (within this replica's lease margin, as etcd counts it) whose member key this replica removed, so that their owner keys are drained in batches rather than deleted by the lease's revocation in one etcd apply";
    owner_keys_drained: Counter::default()
        => "owner_keys_drained", "Owner keys of departed members (member key gone, lease not yet) this replica deleted in batches before claiming their clusters";
    liveness_self_suspected: Counter::default()
        => "liveness_self_suspected", "Refusals of a peer's liveness probe not taken as its death: every liveness connection of this replica broke at once, so its own network is suspect (the TTL decides)";
    liveness_peers_connected: Gauge::default()
        => "liveness_peers_connected", "Peers this replica holds a liveness connection to";
    newer_schema_skipped: Counter::default()
        => "newer_schema_records", "Times a cluster was left alone because its records have a newer schema";
    task_runs: Family::<TaskRunLabels, Counter>::default()
        => "task_runs", "Finished task runs by task type and status";
    task_last_success: Family::<TaskTypeLabels, Gauge<f64, AtomicU64>>::default()
        => "task_last_success_timestamp_seconds", "When a run of the task type last ended done on this replica (Unix seconds)";
    etcd_known_issues: Family::<IssueLabels, Gauge>::default()
        => "etcd_known_issue", "Known etcd issues of the etcd version in use (see PRODUCTION.md)";
    owner_work_queue_depth: Family::<ControllerLabels, Gauge>::default()
        => "owner_work_queue_depth", "Owned clusters waiting for a reconcile, by controller (executor, tasks, scanner)";
    owner_work_reconcile_seconds:
        Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(reconcile_histogram)
        => "owner_work_reconcile_duration_seconds", "Reconcile duration by controller (an executor reconcile drives a whole operation)";
    owner_work_requeues: Family::<RequeueLabels, Counter>::default()
        => "owner_work_requeues", "Reconciles queued again by controller and reason: after (asked for), error (after a backoff), pending (triggered while running)";
    owner_work_errors: Family::<ControllerLabels, Counter>::default()
        => "owner_work_errors", "Reconciles that failed or panicked, by controller";
    rollout_state: Family::<RolloutStateLabels, Gauge>::default()
        => "rollout_state", "Each rollout this replica runs: 1 on its state, 0 on the others (count by state: rollouts by state)";
    rollout_clusters: Family::<RolloutStateLabels, Gauge>::default()
        => "rollout_clusters", "Targets of each rollout this replica runs, by their state";
    rollout_budget_paused: Family::<RolloutLabels, Gauge>::default()
        => "rollout_budget_paused", "1 while a rollout this replica runs is paused by its failure budget";
    remediations: Family::<OutcomeLabels, Counter>::default()
        => "remediations", "Automatic remediation by outcome: started (a Recover naming unhealthy nodes), short_circuited (a cluster with more unhealthy nodes than max_unhealthy), gave_up (a node's retries used up)";
    unhealthy_nodes: Gauge::default()
        => "unhealthy_nodes", "Nodes past their health timeout in the clusters this replica owns, as last judged";
    clusters_short_circuited: Gauge::default()
        => "clusters_short_circuited", "Clusters this replica owns whose remediation is short-circuited";
    audit_write_failures: Counter::default()
        => "audit_write_failures", "Audit log lines that could not be written (the requests went on)";
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let metrics = Arc::new(Self::registered());
        metrics.create_alerted_series();
        metrics
    }

    /// Creates at 0 the series the alert rules compare (see the module's
    /// Guarantees).
    fn create_alerted_series(&self) {
        for outcome in REMEDIATION_OUTCOMES {
            let _ = self.remediations.get_or_create(&OutcomeLabels { outcome });
        }
        for kind in OperationKind::ALL {
            let kind = kind.name().to_string();
            for result in OPERATION_RESULTS {
                let result = result.to_string();
                let kind = kind.clone();
                let _ = self
                    .operations
                    .get_or_create(&OperationLabels { kind, result });
            }
            let _ = self.oldest_running.get_or_create(&KindLabels { kind });
        }
        for call in RETRIED_PROVIDER_CALLS {
            let request = call.to_string();
            let _ = self
                .provider_request_retries
                .get_or_create(&RequestLabels { request });
        }
        for task_type in TaskType::ALL {
            for status in RUN_STATUSES {
                let task_type = task_type.name().to_string();
                let status = status.to_string();
                let _ = self
                    .task_runs
                    .get_or_create(&TaskRunLabels { task_type, status });
            }
        }
    }

    /// Marks an operation of `kind` accepted at `accepted` as running here
    /// until the mark is dropped: it counts in
    /// `drover_oldest_running_operation_age_seconds`.
    pub fn running(self: &Arc<Self>, kind: OperationKind, accepted: SystemTime) -> Running {
        let id = self.running.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.running.running).insert(id, (kind, accepted));
        Running {
            id,
            metrics: Arc::clone(self),
        }
    }

    /// Counts a finished task run; a done one also sets its type's last
    /// success time.
    pub fn task_run_finished(&self, task_type: TaskType, status: &str, at: SystemTime) {
        let task_type = task_type.name().to_string();
        if status == "done" {
            let seconds = at
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            self.task_last_success
                .get_or_create(&TaskTypeLabels {
                    task_type: task_type.clone(),
                })
                .set(seconds);
        }
        let status = status.to_string();
        self.task_runs
            .get_or_create(&TaskRunLabels { task_type, status })
            .inc();
    }

    /// Sets each kind's oldest-running age from the running marks.
    fn refresh_oldest_running(&self) {
        let now = SystemTime::now();
        let mut oldest: HashMap<OperationKind, f64> = HashMap::new();
        for (kind, accepted) in lock(&self.running.running).values() {
            let age = now.duration_since(*accepted).unwrap_or_default();
            let entry = oldest.entry(*kind).or_default();
            *entry = entry.max(age.as_secs_f64());
        }
        for kind in OperationKind::ALL {
            let age = oldest.get(&kind).copied().unwrap_or(0.0);
            self.oldest_running
                .get_or_create(&KindLabels {
                    kind: kind.name().to_string(),
                })
                .set(age);
        }
    }

    /// Counts a remediation outcome (one of [`REMEDIATION_OUTCOMES`]).
    pub fn remediation(&self, outcome: &'static str) {
        self.remediations
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Sets the health gauges of the clusters this replica owns.
    pub fn set_health(&self, unhealthy_nodes: usize, short_circuited: usize) {
        self.unhealthy_nodes.set(unhealthy_nodes as i64);
        self.clusters_short_circuited.set(short_circuited as i64);
    }

    /// Sets a rollout's series: 1 on `state` among `states`, its targets'
    /// counts, whether its failure budget paused it.
    pub fn rollout(
        &self,
        rollout: &str,
        state: &'static str,
        states: &[&'static str],
        targets: &[(&'static str, i64)],
        budget_paused: bool,
    ) {
        let labels = |state| RolloutStateLabels {
            rollout: rollout.to_string(),
            state,
        };
        for each in states {
            let on = i64::from(*each == state);
            self.rollout_state.get_or_create(&labels(each)).set(on);
        }
        for (state, count) in targets {
            self.rollout_clusters
                .get_or_create(&labels(state))
                .set(*count);
        }
        let paused = self.rollout_budget_paused.get_or_create(&RolloutLabels {
            rollout: rollout.to_string(),
        });
        paused.set(i64::from(budget_paused));
    }

    /// Drops a rollout's series: this replica no longer runs it.
    pub fn forget_rollout(&self, rollout: &str, states: &[&'static str], targets: &[&'static str]) {
        let labels = |state| RolloutStateLabels {
            rollout: rollout.to_string(),
            state,
        };
        for state in states {
            self.rollout_state.remove(&labels(state));
        }
        for state in targets {
            self.rollout_clusters.remove(&labels(state));
        }
        self.rollout_budget_paused.remove(&RolloutLabels {
            rollout: rollout.to_string(),
        });
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
        self.refresh_oldest_running();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The value of the one sample line starting with `series` (name and
    /// labels as rendered).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map(|value| value.parse().expect("a number"))
    }

    #[test]
    fn oldest_running_age_is_zero_for_every_kind_when_none_runs() {
        let metrics = Metrics::new();
        let text = metrics.render();
        for kind in OperationKind::ALL {
            let series = format!(
                "drover_oldest_running_operation_age_seconds{{kind=\"{}\"}}",
                kind.name()
            );
            assert_eq!(sample(&text, &series), Some(0.0), "{series} in\n{text}");
        }
    }

    #[test]
    fn oldest_running_age_follows_the_oldest_mark_of_its_kind() {
        let metrics = Metrics::new();
        let now = SystemTime::now();
        let old = metrics.running(OperationKind::Upgrade, now - Duration::from_secs(7200));
        let _young = metrics.running(OperationKind::Upgrade, now - Duration::from_secs(10));
        let series = "drover_oldest_running_operation_age_seconds{kind=\"upgrade\"}";
        let age = sample(&metrics.render(), series).expect("an upgrade series");
        assert!((7200.0..7300.0).contains(&age), "age {age}");
        let stop = "drover_oldest_running_operation_age_seconds{kind=\"stop\"}";
        assert_eq!(sample(&metrics.render(), stop), Some(0.0));
        drop(old);
        let age = sample(&metrics.render(), series).expect("an upgrade series");
        assert!(
            (10.0..100.0).contains(&age),
            "age {age} once the old one ended"
        );
        drop(_young);
        assert_eq!(sample(&metrics.render(), series), Some(0.0));
    }

    #[test]
    fn operation_durations_have_buckets_of_hours() {
        let metrics = Metrics::new();
        let labels = KindLabels {
            kind: "upgrade".into(),
        };
        metrics
            .operation_seconds
            .get_or_create(&labels)
            .observe(5000.0);
        let text = metrics.render();
        let bucket = |le: &str| {
            let series =
                format!("drover_operation_duration_seconds_bucket{{le=\"{le}\",kind=\"upgrade\"}}");
            sample(&text, &series).unwrap_or_else(|| panic!("{series} in\n{text}"))
        };
        assert_eq!(bucket("3600.0"), 0.0);
        assert_eq!(bucket("7200.0"), 1.0);
        assert_eq!(bucket("28800.0"), 1.0);
    }

    #[test]
    fn a_done_run_sets_its_types_last_success_and_a_failed_one_does_not() {
        let metrics = Metrics::new();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        metrics.task_run_finished(TaskType::Backup, "error", at);
        let text = metrics.render();
        assert!(!text.contains("drover_task_last_success_timestamp_seconds{"));
        let errors = "drover_task_runs_total{task_type=\"backup\",status=\"error\"}";
        assert_eq!(sample(&text, errors), Some(1.0));
        metrics.task_run_finished(TaskType::Backup, "done", at);
        let series = "drover_task_last_success_timestamp_seconds{task_type=\"backup\"}";
        assert_eq!(sample(&metrics.render(), series), Some(1_700_000_000.0));
    }

    #[test]
    fn the_series_alerts_compare_exist_at_zero_from_the_start() {
        let text = Metrics::new().render();
        let done = "drover_task_runs_total{task_type=\"repair\",status=\"done\"}";
        assert_eq!(sample(&text, done), Some(0.0));
        let failed = "drover_operations_total{kind=\"recover\",result=\"failed\"}";
        assert_eq!(sample(&text, failed), Some(0.0));
    }
}
