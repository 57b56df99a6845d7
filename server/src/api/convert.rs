//! Conversions between stored records and drover.v1 messages.

use crate::cluster::{self, validate, ClusterRecord, ClusterState};
use crate::health;
use crate::operation::{OperationKind, OperationRecord, OperationState};
use crate::task::{
    self,
    record::{RunStatus, TaskRecord, TaskRun},
};
use drover_proto::v1;
use std::time::SystemTime;

pub fn state_to_proto(state: ClusterState) -> v1::ClusterState {
    use v1::ClusterState as P;
    match state {
        ClusterState::Created => P::Created,
        ClusterState::Starting => P::Starting,
        ClusterState::Running => P::Running,
        ClusterState::Stopping => P::Stopping,
        ClusterState::Stopped => P::Stopped,
        ClusterState::Scaling => P::Scaling,
        ClusterState::ScalingStoppedCluster => P::ScalingStoppedCluster,
        ClusterState::Upgrading => P::Upgrading,
        ClusterState::Importing => P::Importing,
        ClusterState::RemovingNodes => P::RemovingNodes,
        ClusterState::Alert => P::Alert,
        ClusterState::Recovering => P::Recovering,
        ClusterState::Destroying => P::Destroying,
        ClusterState::Destroyed => P::Destroyed,
        ClusterState::Error => P::Error,
    }
}

/// The domain state of a proto state; `None` for UNSPECIFIED.
pub fn state_from_proto(state: v1::ClusterState) -> Option<ClusterState> {
    ClusterState::ALL
        .into_iter()
        .find(|s| state_to_proto(*s) == state)
}

/// A stored RFC 3339 time as a protobuf timestamp.
pub fn timestamp(rfc3339: &str) -> Option<drover_proto::Timestamp> {
    let time: SystemTime = humantime::parse_rfc3339(rfc3339).ok()?;
    let prost_types::Timestamp { seconds, nanos } = time.into();
    Some(drover_proto::Timestamp { seconds, nanos })
}

/// A task suspension from the API, checked under `field`: its `until`, when
/// given, must be after `now`.
pub fn suspension_from_proto(
    field: &str,
    suspension: v1::TaskSuspension,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<cluster::TaskSuspension, validate::FieldError> {
    let Some(until) = suspension.until else {
        return Ok(cluster::TaskSuspension { until: None });
    };
    let until = u32::try_from(until.nanos)
        .ok()
        .and_then(|nanos| chrono::DateTime::from_timestamp(until.seconds, nanos))
        .ok_or_else(|| validate::FieldError::new(format!("{field}.until"), "is not a time"))?;
    if until <= now {
        let message = "must be in the future (leave it out to suspend until resumed)";
        return Err(validate::FieldError::new(format!("{field}.until"), message));
    }
    let until = until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    Ok(cluster::TaskSuspension { until: Some(until) })
}

/// A spec from the API, checked field by field under `field`.
pub fn spec_from_proto(
    field: &str,
    spec: Option<v1::ClusterSpec>,
) -> Result<cluster::Spec, validate::FieldError> {
    let spec = spec.ok_or_else(|| validate::FieldError::new(field, "is required"))?;
    let tasks = tasks_from_proto(&format!("{field}.tasks"), spec.tasks)?;
    let autoscaling = spec.autoscaling.unwrap_or_default();
    let spec = cluster::Spec {
        version: spec.version,
        control_nodes: spec.control_nodes,
        worker_nodes: spec.worker_nodes,
        node_offering: spec.node_offering,
        autoscaling: cluster::Autoscaling {
            enabled: autoscaling.enabled,
            min: autoscaling.min,
            max: autoscaling.max,
        },
        labels: spec.labels.into_iter().collect(),
        tasks,
        provider: spec.provider,
        paused: spec.paused,
        tasks_suspended: spec
            .tasks_suspended
            .map(|s| {
                suspension_from_proto(&format!("{field}.tasks_suspended"), s, chrono::Utc::now())
            })
            .transpose()?,
        health: spec.health.map(health_from_proto).unwrap_or_default(),
        upgrade_policy: spec
            .upgrade_policy
            .map(upgrade_policy_from_proto)
            .unwrap_or_default(),
        maintenance: spec
            .maintenance
            .map(maintenance_from_proto)
            .unwrap_or_default(),
    };
    validate::spec(field, &spec)?;
    Ok(spec)
}

/// A health policy from the API (checked with the spec).
pub fn health_from_proto(policy: v1::HealthPolicy) -> cluster::HealthPolicy {
    cluster::HealthPolicy {
        unhealthy_timeout_seconds: policy.unhealthy_timeout_seconds,
        startup_timeout_seconds: policy.startup_timeout_seconds,
        max_unhealthy: policy.max_unhealthy,
        max_in_flight: policy.max_in_flight,
        max_retry: policy.max_retry,
        retry_period_seconds: policy.retry_period_seconds,
        min_healthy_period_seconds: policy.min_healthy_period_seconds,
        remediation: policy.remediation,
    }
}

fn health_to_proto(policy: cluster::HealthPolicy) -> v1::HealthPolicy {
    v1::HealthPolicy {
        unhealthy_timeout_seconds: policy.unhealthy_timeout_seconds,
        startup_timeout_seconds: policy.startup_timeout_seconds,
        max_unhealthy: policy.max_unhealthy,
        max_in_flight: policy.max_in_flight,
        max_retry: policy.max_retry,
        retry_period_seconds: policy.retry_period_seconds,
        min_healthy_period_seconds: policy.min_healthy_period_seconds,
        remediation: policy.remediation,
    }
}

/// Maintenance windows from the API (checked with the spec).
/// An upgrade policy from the API (checked with the spec).
pub fn upgrade_policy_from_proto(policy: v1::UpgradePolicy) -> cluster::UpgradePolicy {
    cluster::UpgradePolicy {
        max_unavailable: policy.max_unavailable,
        max_surge: policy.max_surge,
        step_retries: policy.step_retries,
        step_timeout_seconds: policy.step_timeout_seconds,
    }
}

pub fn maintenance_from_proto(window: v1::MaintenanceWindow) -> cluster::MaintenanceWindow {
    cluster::MaintenanceWindow {
        window: window.window,
        timezone: window.timezone,
    }
}

/// Each node of `status` judged under `spec`'s health policy at `now`.
fn nodes_to_proto(
    spec: &cluster::Spec,
    nodes: Vec<cluster::NodeStatus>,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<v1::Node> {
    let policy = health::Policy::of(&spec.health);
    nodes
        .into_iter()
        .map(|node| {
            let judged = health::judge(&node, &policy, now);
            let health = match judged.health {
                health::NodeHealth::Healthy => v1::NodeHealth::Healthy,
                health::NodeHealth::NotReady => v1::NodeHealth::NotReady,
                health::NodeHealth::Unhealthy => v1::NodeHealth::Unhealthy,
            };
            v1::Node {
                id: node.id,
                role: node.role,
                power_state: node.power_state,
                version: node.version,
                ready: node.ready,
                facts: node.facts.into_iter().collect(),
                health: health as i32,
                health_reason: judged.reason,
                not_ready_since: node.not_ready_since.as_deref().and_then(timestamp),
            }
        })
        .collect()
}

fn remediation_to_proto(
    spec: &cluster::Spec,
    remediation: cluster::RemediationStatus,
) -> v1::Remediation {
    let policy = health::Policy::of(&spec.health);
    v1::Remediation {
        message: remediation.message,
        short_circuited: remediation.short_circuited,
        nodes: remediation
            .nodes
            .into_iter()
            .map(|node| v1::NodeRemediation {
                retries_left: policy.max_retry.saturating_sub(node.attempts),
                node_id: node.node_id,
                attempts: node.attempts,
                last_started_at: timestamp(&node.last_started_at),
            })
            .collect(),
    }
}

pub fn cluster_to_proto(record: ClusterRecord) -> v1::Cluster {
    let ClusterRecord {
        spec,
        state,
        state_revision,
        spec_revision: _,
        status_revision: _,
        status,
    } = record;
    let status = status.unwrap_or_default();
    let nodes = nodes_to_proto(&spec.spec, status.nodes, chrono::Utc::now());
    let remediation = remediation_to_proto(&spec.spec, status.remediation);
    v1::Cluster {
        name: spec.name,
        uid: spec.uid,
        generation: spec.generation,
        spec: Some(v1::ClusterSpec {
            version: spec.spec.version,
            control_nodes: spec.spec.control_nodes,
            worker_nodes: spec.spec.worker_nodes,
            node_offering: spec.spec.node_offering,
            autoscaling: Some(v1::Autoscaling {
                enabled: spec.spec.autoscaling.enabled,
                min: spec.spec.autoscaling.min,
                max: spec.spec.autoscaling.max,
            }),
            labels: spec.spec.labels.into_iter().collect(),
            tasks: spec
                .spec
                .tasks
                .into_iter()
                .map(task_spec_to_proto)
                .collect(),
            provider: spec.spec.provider,
            paused: spec.spec.paused,
            tasks_suspended: spec.spec.tasks_suspended.map(|s| v1::TaskSuspension {
                until: s.until.as_deref().and_then(timestamp),
            }),
            health: Some(health_to_proto(spec.spec.health)),
            upgrade_policy: Some(v1::UpgradePolicy {
                max_unavailable: spec.spec.upgrade_policy.max_unavailable,
                max_surge: spec.spec.upgrade_policy.max_surge,
                step_retries: spec.spec.upgrade_policy.step_retries,
                step_timeout_seconds: spec.spec.upgrade_policy.step_timeout_seconds,
            }),
            maintenance: Some(v1::MaintenanceWindow {
                window: spec.spec.maintenance.window,
                timezone: spec.spec.maintenance.timezone,
            }),
        }),
        status: Some(v1::ClusterStatus {
            state: Some(state_to_proto(state.state) as i32),
            nodes,
            remediation: Some(remediation),
            current_version: status.current_version,
            observed_generation: status.observed_generation,
            current_operation: state.operation.map(|slot| slot.id),
            last_operation: status.last_operation.map(|last| v1::LastOperationResult {
                operation_id: last.id,
                kind: OperationKind::from_name(&last.kind).map_or(0, |k| kind_to_proto(k) as i32),
                state: match last.state.as_str() {
                    "Succeeded" => v1::OperationState::Succeeded,
                    "Failed" => v1::OperationState::Failed,
                    "Cancelled" => v1::OperationState::Cancelled,
                    _ => v1::OperationState::Unspecified,
                } as i32,
                message: last.message,
            }),
            message: status.message,
            state_changed_at: timestamp(&state.changed_at),
        }),
        created_at: timestamp(&spec.created_at),
        revision: state_revision,
    }
}

pub fn kind_to_proto(kind: OperationKind) -> v1::OperationKind {
    kind.rules().proto()
}

fn operation_state_to_proto(state: OperationState) -> v1::OperationState {
    match state {
        OperationState::Pending => v1::OperationState::Pending,
        OperationState::Running => v1::OperationState::Running,
        OperationState::Succeeded => v1::OperationState::Succeeded,
        OperationState::Failed => v1::OperationState::Failed,
        OperationState::Cancelled => v1::OperationState::Cancelled,
    }
}

pub fn operation_to_proto(op: OperationRecord) -> v1::Operation {
    let autoscaling = op.params.autoscaling.clone();
    v1::Operation {
        id: op.id,
        cluster: op.cluster,
        cluster_uid: op.cluster_uid,
        kind: kind_to_proto(op.kind) as i32,
        params: Some(v1::OperationParams {
            worker_nodes: op.params.worker_nodes,
            node_offering: op.params.node_offering,
            autoscaling_enabled: autoscaling.as_ref().map(|a| a.enabled),
            autoscaling_min: autoscaling.as_ref().map(|a| a.min),
            autoscaling_max: autoscaling.as_ref().map(|a| a.max),
            version: op.params.version,
            add_count: op.params.add_count,
            node_ids: op.params.node_ids,
            allow_downgrade: op.params.allow_downgrade,
        }),
        state: operation_state_to_proto(op.state) as i32,
        from_state: state_to_proto(op.from_state) as i32,
        entered_state: state_to_proto(op.entered_state) as i32,
        progress: op.progress.map(|p| v1::Progress {
            step: p.step,
            total_steps: p.total_steps,
            step_name: p.step_name,
        }),
        error: op.error.map(|e| v1::OperationError {
            code: e.code,
            message: e.message,
        }),
        replica: op.replica,
        owner_epoch: op.owner_epoch,
        request_id: op.request_id,
        created_at: timestamp(&op.created_at),
        started_at: op.started_at.as_deref().and_then(timestamp),
        finished_at: op.finished_at.as_deref().and_then(timestamp),
        cancel_requested: op.cancel_requested,
        abandon_reason: op.abandon_reason.unwrap_or_default(),
        runs: op
            .runs
            .into_iter()
            .map(|run| v1::OperationRun {
                replica: run.replica,
                epoch: run.epoch,
            })
            .collect(),
    }
}

/// A task list from the API, checked as a whole under `field`.
pub fn tasks_from_proto(
    field: &str,
    tasks: Vec<v1::TaskSpec>,
) -> Result<Vec<task::TaskSpec>, validate::FieldError> {
    let tasks = tasks
        .into_iter()
        .enumerate()
        .map(|(i, t)| task_spec_from_proto(&format!("{field}[{i}]"), t))
        .collect::<Result<Vec<_>, _>>()?;
    task::validate::tasks(field, &tasks)?;
    Ok(tasks)
}

/// A task type from the API; UNSPECIFIED is refused.
pub fn task_type_from_proto(
    field: &str,
    value: i32,
) -> Result<task::TaskType, validate::FieldError> {
    match v1::TaskType::try_from(value) {
        Ok(v1::TaskType::Repair) => Ok(task::TaskType::Repair),
        Ok(v1::TaskType::Backup) => Ok(task::TaskType::Backup),
        _ => Err(validate::FieldError::new(
            field,
            "is required: TASK_TYPE_REPAIR or TASK_TYPE_BACKUP",
        )),
    }
}

fn task_type_to_proto(task_type: task::TaskType) -> v1::TaskType {
    match task_type {
        task::TaskType::Repair => v1::TaskType::Repair,
        task::TaskType::Backup => v1::TaskType::Backup,
    }
}

/// One task from the API, checked under `field`.
pub fn task_spec_from_proto(
    field: &str,
    spec: v1::TaskSpec,
) -> Result<task::TaskSpec, validate::FieldError> {
    let task_type = task_type_from_proto(&format!("{field}.type"), spec.r#type)?;
    let schedule = spec.schedule.unwrap_or_default();
    let (repair, backup) = match spec.properties {
        Some(v1::task_spec::Properties::Repair(r)) => (
            Some(task::RepairProperties {
                dc: r.dc,
                keyspace: r.keyspace,
                fail_fast: r.fail_fast,
                intensity: r.intensity,
                parallel: r.parallel,
                small_table_threshold: r.small_table_threshold,
                host: r.host,
            }),
            None,
        ),
        Some(v1::task_spec::Properties::Backup(b)) => (
            None,
            Some(task::BackupProperties {
                dc: b.dc,
                keyspace: b.keyspace,
                location: b.location,
                rate_limit: b.rate_limit,
                retention: b.retention,
                snapshot_parallel: b.snapshot_parallel,
                upload_parallel: b.upload_parallel,
            }),
        ),
        None => (None, None),
    };
    let spec = task::TaskSpec {
        task_type,
        name: spec.name,
        schedule: task::TaskSchedule {
            start_date: schedule.start_date,
            cron: schedule.cron,
            timezone: schedule.timezone,
            interval: schedule.interval,
            num_retries: schedule.num_retries,
            retry_wait: schedule.retry_wait,
        },
        repair,
        backup,
    };
    task::validate::task(field, &spec)?;
    Ok(spec)
}

fn schedule_to_proto(schedule: task::TaskSchedule) -> v1::TaskSchedule {
    v1::TaskSchedule {
        start_date: schedule.start_date,
        cron: schedule.cron,
        timezone: schedule.timezone,
        interval: schedule.interval,
        num_retries: schedule.num_retries,
        retry_wait: schedule.retry_wait,
    }
}

pub fn task_spec_to_proto(spec: task::TaskSpec) -> v1::TaskSpec {
    let properties = match (spec.repair, spec.backup) {
        (Some(r), _) => Some(v1::task_spec::Properties::Repair(v1::RepairProperties {
            dc: r.dc,
            keyspace: r.keyspace,
            fail_fast: r.fail_fast,
            intensity: r.intensity,
            parallel: r.parallel,
            small_table_threshold: r.small_table_threshold,
            host: r.host,
        })),
        (None, Some(b)) => Some(v1::task_spec::Properties::Backup(v1::BackupProperties {
            dc: b.dc,
            keyspace: b.keyspace,
            location: b.location,
            rate_limit: b.rate_limit,
            retention: b.retention,
            snapshot_parallel: b.snapshot_parallel,
            upload_parallel: b.upload_parallel,
        })),
        (None, None) => None,
    };
    v1::TaskSpec {
        r#type: task_type_to_proto(spec.task_type) as i32,
        name: spec.name,
        schedule: Some(schedule_to_proto(spec.schedule)),
        properties,
    }
}

pub fn task_run_to_proto(run: TaskRun) -> v1::TaskRun {
    use v1::TaskRunStatus as P;
    v1::TaskRun {
        id: run.id,
        status: match run.status {
            RunStatus::New => P::New,
            RunStatus::Running => P::Running,
            RunStatus::Done => P::Done,
            RunStatus::Error => P::Error,
            RunStatus::Stopped => P::Stopped,
            RunStatus::Aborted => P::Aborted,
        } as i32,
        slot: timestamp(&run.slot),
        started_at: run.started_at.as_deref().and_then(timestamp),
        finished_at: run.finished_at.as_deref().and_then(timestamp),
        error: run.error,
        attempt: run.attempt,
        report: run.report,
        progress: run.progress.map(|progress| v1::TaskRunProgress {
            percent: progress.percent,
            message: progress.message,
            updated_at: timestamp(&progress.at),
        }),
    }
}

/// A task's status from its record: only what exists. A task that could
/// not be scheduled shows its name and error and nothing else.
pub fn task_status_to_proto(record: TaskRecord) -> v1::TaskStatus {
    if let Some(error) = record.schedule_error {
        return v1::TaskStatus {
            name: Some(record.name),
            error: Some(error),
            ..Default::default()
        };
    }
    let evaluated = task::TaskSchedule {
        start_date: record.start.clone().unwrap_or_default(),
        num_retries: Some(record.spec.effective_retries()),
        ..record.spec.schedule.clone()
    };
    v1::TaskStatus {
        name: Some(record.name),
        schedule: record.id.is_some().then(|| schedule_to_proto(evaluated)),
        success_count: record.id.is_some().then_some(record.success_count),
        error_count: record.id.is_some().then_some(record.error_count),
        id: record.id,
        last_run: record.last_run.map(task_run_to_proto),
        next_activation: record.next_activation.as_deref().and_then(timestamp),
        error: record.waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_proto() {
        for state in ClusterState::ALL {
            assert_eq!(state_from_proto(state_to_proto(state)), Some(state));
        }
        assert_eq!(state_from_proto(v1::ClusterState::Unspecified), None);
    }
}
