//! The pure part of task reconciliation: from the spec's task list and the
//! task records that exist, what to create, update and delete; and how a
//! task record moves when a run starts or ends.
//!
//! # Guarantees
//! - Identity is (type, name). A task's id comes only from its own record,
//!   is assigned once, and no reconcile changes it; a task is never deleted
//!   and created again to apply a change.
//! - A spec generation older than the last one reconciled plans nothing
//!   ([`Plan::Stale`]): that is how an old generation (a lagging reader, a
//!   restored spec) can never delete or recreate tasks.
//! - Changes are detected by the spec hash; an unchanged task is not
//!   rewritten.
//! - A `now`-relative start date is evaluated once and kept until the start
//!   date itself changes.

use super::record::{RunStatus, TaskRecord, TaskRun};
use super::schedule::{self, format_time, parse_time};
use super::TaskSpec;
use crate::cluster::SCHEMA_VERSION;
use chrono::{DateTime, Utc};

/// A task record as read, with its mod revision.
#[derive(Debug, Clone)]
pub struct Existing {
    pub record: TaskRecord,
    pub revision: i64,
}

/// One change to the task records.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Write `record`; `revision` is the one read (`None`: create).
    Put {
        record: TaskRecord,
        revision: Option<i64>,
    },
    /// The task left the spec: stop its run (if any) and delete it.
    Delete { record: TaskRecord, revision: i64 },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// The spec is older than what was already reconciled: do nothing.
    Stale {
        generation: i64,
        reconciled: i64,
    },
    Changes(Vec<Change>),
}

/// Plans the reconcile of `specs` (spec generation `generation`) against
/// the `existing` records; `reconciled` is the newest generation already
/// reconciled.
pub fn plan(
    generation: i64,
    reconciled: Option<i64>,
    specs: &[TaskSpec],
    existing: &[Existing],
    now: DateTime<Utc>,
) -> Plan {
    if let Some(reconciled) = reconciled.filter(|r| *r > generation) {
        return Plan::Stale {
            generation,
            reconciled,
        };
    }
    let mut changes = Vec::new();
    for spec in specs {
        let found = existing
            .iter()
            .find(|e| e.record.task_type == spec.task_type && e.record.name == spec.name);
        match found {
            Some(e) if e.record.spec_hash == spec.hash() => {}
            Some(e) => changes.push(Change::Put {
                record: apply_spec(e.record.clone(), spec, generation, now),
                revision: Some(e.revision),
            }),
            None => changes.push(Change::Put {
                record: apply_spec(new_record(spec, generation), spec, generation, now),
                revision: None,
            }),
        }
    }
    for e in existing {
        let declared = specs
            .iter()
            .any(|s| s.task_type == e.record.task_type && s.name == e.record.name);
        if !declared {
            changes.push(Change::Delete {
                record: e.record.clone(),
                revision: e.revision,
            });
        }
    }
    Plan::Changes(changes)
}

fn new_record(spec: &TaskSpec, generation: i64) -> TaskRecord {
    TaskRecord {
        schema: SCHEMA_VERSION,
        task_type: spec.task_type,
        name: spec.name.clone(),
        id: None,
        spec_hash: String::new(),
        generation,
        spec: spec.clone(),
        start: None,
        next_activation: None,
        attempt: 0,
        last_run: None,
        success_count: 0,
        error_count: 0,
        schedule_error: None,
        waiting: None,
    }
}

/// `record` with `spec` applied: the id, counters and last run are kept.
/// Only a new schedule moves the next activation (an edit of the task's
/// properties keeps a retry that is due and the retries used so far); then
/// the start date is evaluated only if it is new, and the next activation is
/// the new schedule's first after the last run's slot or now, whichever is
/// later (as after a run: an edit never brings back a slot already passed).
fn apply_spec(
    mut record: TaskRecord,
    spec: &TaskSpec,
    generation: i64,
    now: DateTime<Utc>,
) -> TaskRecord {
    let schedule_changed = record.spec.schedule != spec.schedule;
    let start_changed = record.spec.schedule.start_date != spec.schedule.start_date;
    let start = match record.start.as_deref().and_then(parse_time) {
        Some(start) if !start_changed => Ok(start),
        _ => schedule::evaluate_start(&spec.schedule.start_date, now),
    };
    record.spec = spec.clone();
    record.spec_hash = spec.hash();
    record.generation = generation;
    record.waiting = None;
    if record.id.is_some() && !schedule_changed {
        return record;
    }
    // A run in progress ends under the retries it started with.
    if record.running().is_none() {
        record.attempt = 0;
    }
    let after = record
        .last_run
        .as_ref()
        .and_then(|run| parse_time(&run.slot))
        .map(|slot| slot.max(now));
    let next = start.and_then(|start| {
        record.start = Some(format_time(start));
        schedule::next_activation(&spec.schedule, start, after)
    });
    match next {
        Ok(next) => {
            record.next_activation = next.map(format_time);
            record.schedule_error = None;
            if record.id.is_none() {
                record.id = Some(uuid::Uuid::new_v4().to_string());
            }
        }
        Err(error) => {
            record.next_activation = None;
            record.schedule_error = Some(error);
        }
    }
    record
}

/// The record after a run reached `status`, and the run as it ended.
/// Successes schedule the next activation; failures and aborts retry with
/// back-off while retries remain, then move on to the next activation.
pub fn finished(
    record: &TaskRecord,
    run: &TaskRun,
    status: RunStatus,
    error: Option<String>,
    now: DateTime<Utc>,
) -> (TaskRecord, TaskRun) {
    let mut run = run.clone();
    run.status = status;
    run.finished_at = Some(format_time(now));
    run.error = error;
    let mut record = record.clone();
    record.last_run = Some(run.clone());
    record.waiting = None;
    let retry = matches!(status, RunStatus::Error | RunStatus::Aborted)
        && record.attempt < record.spec.effective_retries();
    match status {
        RunStatus::Done => record.success_count += 1,
        RunStatus::Error | RunStatus::Aborted => record.error_count += 1,
        _ => {}
    }
    if retry {
        record.attempt += 1;
        let delay = schedule::retry_delay(&record.spec.schedule.retry_wait, record.attempt);
        let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
        record.next_activation = Some(format_time(now + delay));
        return (record, run);
    }
    record.attempt = 0;
    let start = record.start.as_deref().and_then(parse_time);
    let after = parse_time(&run.slot).map_or(now, |slot| slot.max(now));
    let next = start
        .map(|start| schedule::next_activation(&record.spec.schedule, start, Some(after)))
        .unwrap_or(Ok(None));
    match next {
        Ok(next) => record.next_activation = next.map(format_time),
        Err(error) => {
            record.next_activation = None;
            record.schedule_error = Some(error);
        }
    }
    (record, run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{TaskSchedule, TaskType};

    fn spec(task_type: TaskType, name: &str, cron: &str) -> TaskSpec {
        TaskSpec {
            schedule: TaskSchedule {
                cron: cron.into(),
                start_date: "now+1h".into(),
                ..Default::default()
            },
            ..crate::cluster::task_spec::bare(task_type, name)
        }
    }

    fn now() -> DateTime<Utc> {
        parse_time("2026-03-01T00:00:00Z").unwrap()
    }

    fn created(changes: Plan) -> Vec<Existing> {
        let Plan::Changes(changes) = changes else {
            panic!("stale")
        };
        changes
            .into_iter()
            .enumerate()
            .map(|(i, change)| match change {
                Change::Put {
                    record,
                    revision: None,
                } => Existing {
                    record,
                    revision: i as i64 + 10,
                },
                other => panic!("expected a create, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn tasks_are_created_once_with_ids_and_left_alone_when_unchanged() {
        let specs = [
            spec(TaskType::Repair, "daily", "0 3 * * *"),
            spec(TaskType::Backup, "daily", "0 4 * * *"),
        ];
        let existing = created(plan(1, None, &specs, &[], now()));
        assert!(existing.iter().all(|e| e.record.id.is_some()));
        assert_eq!(
            existing[0].record.start.as_deref(),
            Some("2026-03-01T01:00:00.000Z")
        );
        assert_eq!(
            plan(2, Some(1), &specs, &existing, now()),
            Plan::Changes(vec![])
        );
    }

    #[test]
    fn a_change_keeps_the_id_and_the_evaluated_start() {
        let specs = [spec(TaskType::Repair, "daily", "0 3 * * *")];
        let existing = created(plan(1, None, &specs, &[], now()));
        let later = now() + chrono::Duration::days(2);
        let changed = [spec(TaskType::Repair, "daily", "0 5 * * *")];
        let Plan::Changes(changes) = plan(2, Some(1), &changed, &existing, later) else {
            panic!("stale")
        };
        let [Change::Put { record, revision }] = changes.as_slice() else {
            panic!("{changes:?}")
        };
        assert_eq!(*revision, Some(existing[0].revision));
        assert_eq!(record.id, existing[0].record.id);
        assert_eq!(record.start, existing[0].record.start, "start re-evaluated");
        assert_eq!(record.generation, 2);
    }

    /// The reference's bug: an older generation (here: one that does not
    /// list the task at all, and whose view has no ids) must not delete or
    /// recreate anything.
    #[test]
    fn an_older_generation_plans_nothing() {
        let specs = [spec(TaskType::Repair, "daily", "0 3 * * *")];
        let existing = created(plan(3, Some(2), &specs, &[], now()));
        assert_eq!(
            plan(2, Some(3), &[], &existing, now()),
            Plan::Stale {
                generation: 2,
                reconciled: 3
            }
        );
    }

    #[test]
    fn a_task_removed_from_the_spec_is_deleted() {
        let specs = [spec(TaskType::Repair, "daily", "0 3 * * *")];
        let existing = created(plan(1, None, &specs, &[], now()));
        let Plan::Changes(changes) = plan(2, Some(1), &[], &existing, now()) else {
            panic!("stale")
        };
        assert!(matches!(
            changes.as_slice(),
            [Change::Delete { revision: 10, .. }]
        ));
    }

    #[test]
    fn an_unschedulable_task_keeps_only_its_error_until_fixed() {
        let never = [spec(TaskType::Backup, "b", "0 0 30 2 *")];
        let existing = created(plan(1, None, &never, &[], now()));
        let record = &existing[0].record;
        assert!(record.schedule_error.is_some());
        assert_eq!(record.id, None);
        let fixed = [spec(TaskType::Backup, "b", "0 0 28 2 *")];
        let Plan::Changes(changes) = plan(2, Some(1), &fixed, &existing, now()) else {
            panic!("stale")
        };
        let [Change::Put { record, .. }] = changes.as_slice() else {
            panic!("{changes:?}")
        };
        assert_eq!(record.schedule_error, None);
        assert!(record.id.is_some());
        assert!(record.next_activation.is_some());
    }

    fn run(record: &TaskRecord) -> TaskRun {
        TaskRun {
            schema: SCHEMA_VERSION,
            id: "r".into(),
            task_id: record.id.clone().unwrap(),
            status: RunStatus::Running,
            slot: record.next_activation.clone().unwrap(),
            attempt: record.attempt,
            replica: "r1".into(),
            epoch: 7,
            started_at: Some(format_time(now())),
            finished_at: None,
            error: None,
            report: None,
            progress: None,
        }
    }

    #[test]
    fn failures_retry_with_doubling_back_off_then_move_on() {
        let mut task = spec(TaskType::Repair, "daily", "0 3 * * *");
        task.schedule.num_retries = Some(2);
        task.schedule.retry_wait = "1m".into();
        let mut record = created(plan(1, None, &[task], &[], now())).remove(0).record;
        let at = parse_time(record.next_activation.as_deref().unwrap()).unwrap();
        let mut expected = vec![at + chrono::Duration::minutes(1)];
        expected.push(expected[0] + chrono::Duration::minutes(2));
        for (i, retry_at) in expected.iter().enumerate() {
            let now = parse_time(&run(&record).slot).unwrap();
            let (next, ended) = finished(&record, &run(&record), RunStatus::Error, None, now);
            assert_eq!(ended.status, RunStatus::Error);
            assert_eq!(next.attempt, i as u32 + 1);
            assert_eq!(next.next_activation, Some(format_time(*retry_at)));
            record = next;
        }
        let now = parse_time(&run(&record).slot).unwrap();
        let (next, _) = finished(&record, &run(&record), RunStatus::Aborted, None, now);
        assert_eq!(next.attempt, 0);
        assert_eq!(next.error_count, 3);
        assert_eq!(
            next.next_activation.as_deref(),
            Some("2026-03-02T03:00:00.000Z")
        );
        let (done, _) = finished(&next, &run(&next), RunStatus::Done, None, now);
        assert_eq!(done.success_count, 1);
    }

    /// An edit of the properties while a retry is due keeps the retry and
    /// the retries used: it used to reset both, so a failing task could run
    /// its retries again after every edit, or lose the retry due.
    #[test]
    fn an_edit_of_the_properties_keeps_a_due_retry_and_the_retries_used() {
        let mut task = spec(TaskType::Repair, "daily", "0 3 * * *");
        task.schedule.num_retries = Some(3);
        task.schedule.retry_wait = "15m".into();
        let record = created(plan(1, None, &[task.clone()], &[], now())).remove(0);
        let slot = parse_time(&run(&record.record).slot).unwrap();
        let (failed, _) = finished(
            &record.record,
            &run(&record.record),
            RunStatus::Error,
            None,
            slot,
        );
        assert_eq!(failed.attempt, 1);
        let retry_at = failed.next_activation.clone();
        let existing = [Existing {
            record: failed,
            revision: 20,
        }];
        let mut edited = task;
        edited.repair = Some(crate::task::RepairProperties {
            intensity: "0.25".into(),
            ..Default::default()
        });
        let later = slot + chrono::Duration::minutes(5);
        let Plan::Changes(changes) = plan(2, Some(1), &[edited], &existing, later) else {
            panic!("stale")
        };
        let [Change::Put { record, .. }] = changes.as_slice() else {
            panic!("{changes:?}")
        };
        assert_eq!(record.attempt, 1, "retries used are kept");
        assert_eq!(record.next_activation, retry_at, "the due retry is kept");
    }

    /// A new schedule takes effect from now: the slots the task skipped
    /// (it ran late, or the replicas were down) do not come back. It used to
    /// count from the last run's slot, so an edit started a run at once.
    #[test]
    fn a_new_schedule_never_brings_back_a_slot_already_passed() {
        let mut task = spec(TaskType::Repair, "hourly", "");
        task.schedule.interval = "1h".into();
        task.schedule.start_date = "2026-03-01T00:00:00Z".into();
        let record = created(plan(1, None, &[task.clone()], &[], now()))
            .remove(0)
            .record;
        // The 10:00 run ended at 11:30: next is 12:00.
        let mut ran = record.clone();
        ran.next_activation = Some("2026-03-01T10:00:00.000Z".into());
        let ended_at = parse_time("2026-03-01T11:30:00Z").unwrap();
        let (after_run, _) = finished(&ran, &run(&ran), RunStatus::Done, None, ended_at);
        assert_eq!(
            after_run.next_activation.as_deref(),
            Some("2026-03-01T12:00:00.000Z")
        );
        let existing = [Existing {
            record: after_run,
            revision: 20,
        }];
        // At 11:40 the interval becomes 30 minutes.
        let mut edited = task;
        edited.schedule.interval = "30m".into();
        let at = parse_time("2026-03-01T11:40:00Z").unwrap();
        let Plan::Changes(changes) = plan(2, Some(1), &[edited], &existing, at) else {
            panic!("stale")
        };
        let [Change::Put { record, .. }] = changes.as_slice() else {
            panic!("{changes:?}")
        };
        assert_eq!(
            record.next_activation.as_deref(),
            Some("2026-03-01T12:00:00.000Z")
        );
    }
}
