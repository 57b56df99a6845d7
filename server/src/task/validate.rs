//! Validation of task specs, as the reference does it: names unique within
//! a type (not across types) and never UUID-shaped; cron parses and carries
//! no TZ; a time zone loads and only comes with cron; an interval is zero
//! with cron; repair intensity is a float; a backup needs well-formed
//! locations (`[dc:]provider:bucket`, or `[dc:]file:/absolute/directory`
//! for a bucket that is a directory). Every error names the field.

use super::{schedule, BackupProperties, RepairProperties, TaskSchedule, TaskSpec, TaskType};
use crate::cluster::validate::{FieldError, Validation};
use std::collections::HashSet;

/// Tasks per cluster: each is a record and a run history in etcd, and a
/// reconcile of them all must fit in one transaction.
pub const MAX_TASKS: usize = 32;
const MAX_LIST: usize = 64;
const PROVIDERS: [&str; 3] = ["s3", "gcs", "azure"];

/// A whole task list under `field` (`spec.tasks`).
pub fn tasks(field: &str, tasks: &[TaskSpec]) -> Validation {
    if tasks.len() > MAX_TASKS {
        return Err(too_many(field));
    }
    let mut seen = HashSet::new();
    for (i, spec) in tasks.iter().enumerate() {
        let field = format!("{field}[{i}]");
        task(&field, spec)?;
        if !seen.insert((spec.task_type, spec.name.as_str())) {
            return Err(declared_twice(&field, spec));
        }
    }
    Ok(())
}

/// An edit of the stored list `before` into `after` (PutTask, DeleteTask),
/// under `field`: only the tasks it adds or changes are checked, and the
/// count only when it grows. A task stored under looser rules (by an older
/// Drover, or with etcdctl) then blocks no edit of the others, and can
/// always be deleted.
pub fn edit(field: &str, before: &[TaskSpec], after: &[TaskSpec]) -> Validation {
    if after.len() > MAX_TASKS && after.len() > before.len() {
        return Err(too_many(field));
    }
    for spec in after.iter().filter(|spec| !before.contains(spec)) {
        task(field, spec)?;
        let same = after
            .iter()
            .filter(|t| t.task_type == spec.task_type && t.name == spec.name)
            .count();
        if same > 1 {
            return Err(declared_twice(field, spec));
        }
    }
    Ok(())
}

fn too_many(field: &str) -> FieldError {
    FieldError::new(
        field,
        format!("at most {MAX_TASKS} tasks are allowed per cluster"),
    )
}

fn declared_twice(field: &str, spec: &TaskSpec) -> FieldError {
    FieldError::new(
        format!("{field}.name"),
        format!(
            "a {} task named {:?} is already declared (names are unique within a type)",
            spec.task_type, spec.name
        ),
    )
}

/// One task under `field` (`spec.tasks[2]`, or `task`).
pub fn task(field: &str, spec: &TaskSpec) -> Validation {
    name(&format!("{field}.name"), &spec.name)?;
    schedule(&format!("{field}.schedule"), &spec.schedule)?;
    match spec.task_type {
        TaskType::Repair => {
            if spec.backup.is_some() {
                return Err(FieldError::new(
                    format!("{field}.backup"),
                    "backup properties are not allowed on a repair task",
                ));
            }
            if let Some(repair) = &spec.repair {
                repair_properties(&format!("{field}.repair"), repair)?;
            }
        }
        TaskType::Backup => {
            if spec.repair.is_some() {
                return Err(FieldError::new(
                    format!("{field}.repair"),
                    "repair properties are not allowed on a backup task",
                ));
            }
            let Some(backup) = &spec.backup else {
                return Err(FieldError::new(
                    format!("{field}.backup.location"),
                    "is required for a backup task",
                ));
            };
            backup_properties(&format!("{field}.backup"), backup)?;
        }
    }
    Ok(())
}

/// A task name: 1-63 characters of letters, digits, `-`, `_` and `.`, not
/// UUID-shaped (a task is found by name or by id).
pub fn name(field: &str, name: &str) -> Validation {
    if name.is_empty() {
        return Err(FieldError::new(field, "is required"));
    }
    if uuid::Uuid::parse_str(name).is_ok() {
        return Err(FieldError::new(
            field,
            format!("{name:?} looks like a UUID; task names must not (ids are UUIDs)"),
        ));
    }
    let token = name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !token {
        return Err(FieldError::new(
            field,
            format!("{name:?} must be 1-63 characters of letters, digits, '-', '_' and '.'"),
        ));
    }
    Ok(())
}

fn schedule(field: &str, s: &TaskSchedule) -> Validation {
    schedule::evaluate_start(&s.start_date, chrono::Utc::now())
        .map_err(|reason| FieldError::new(format!("{field}.start_date"), reason))?;
    if !s.cron.is_empty() {
        let upper = s.cron.trim_start().to_ascii_uppercase();
        if upper.starts_with("TZ=") || upper.starts_with("CRON_TZ=") {
            return Err(FieldError::new(
                format!("{field}.cron"),
                "must not contain TZ; set timezone instead",
            ));
        }
        schedule::parse_cron(&s.cron).map_err(|r| FieldError::new(format!("{field}.cron"), r))?;
    }
    if !s.timezone.is_empty() {
        if s.cron.is_empty() {
            return Err(FieldError::new(
                format!("{field}.timezone"),
                "is only allowed with cron",
            ));
        }
        schedule::parse_timezone(&s.timezone)
            .map_err(|r| FieldError::new(format!("{field}.timezone"), r))?;
    }
    let interval = schedule::parse_duration(&s.interval)
        .map_err(|r| FieldError::new(format!("{field}.interval"), r))?;
    if !s.cron.is_empty() && !interval.is_zero() {
        return Err(FieldError::new(
            format!("{field}.interval"),
            "must be zero when cron is set",
        ));
    }
    if !interval.is_zero() && interval.as_secs() < 1 {
        return Err(FieldError::new(
            format!("{field}.interval"),
            "must be at least 1s",
        ));
    }
    if s.num_retries.is_some_and(|n| n > 100) {
        return Err(FieldError::new(
            format!("{field}.num_retries"),
            "must be at most 100",
        ));
    }
    let wait = schedule::parse_duration(&s.retry_wait)
        .map_err(|r| FieldError::new(format!("{field}.retry_wait"), r))?;
    if !s.retry_wait.is_empty() && wait.as_secs() < 1 {
        return Err(FieldError::new(
            format!("{field}.retry_wait"),
            "must be at least 1s",
        ));
    }
    Ok(())
}

fn repair_properties(field: &str, r: &RepairProperties) -> Validation {
    names(&format!("{field}.dc"), &r.dc)?;
    names(&format!("{field}.keyspace"), &r.keyspace)?;
    if !r.intensity.is_empty() {
        let valid = r
            .intensity
            .parse::<f64>()
            .is_ok_and(|v| v.is_finite() && v >= 0.0);
        if !valid {
            return Err(FieldError::new(
                format!("{field}.intensity"),
                format!("{:?} is not a non-negative number", r.intensity),
            ));
        }
    }
    if !r.small_table_threshold.is_empty() && !is_size(&r.small_table_threshold) {
        return Err(FieldError::new(
            format!("{field}.small_table_threshold"),
            format!(
                "{:?} is not a size (e.g. 1GiB, 512MiB)",
                r.small_table_threshold
            ),
        ));
    }
    if r.host.len() > 253 {
        return Err(FieldError::new(
            format!("{field}.host"),
            "must be at most 253 characters",
        ));
    }
    Ok(())
}

fn backup_properties(field: &str, b: &BackupProperties) -> Validation {
    names(&format!("{field}.dc"), &b.dc)?;
    names(&format!("{field}.keyspace"), &b.keyspace)?;
    if b.location.is_empty() {
        return Err(FieldError::new(
            format!("{field}.location"),
            "is required for a backup task",
        ));
    }
    list_bound(&format!("{field}.location"), &b.location)?;
    for (i, location) in b.location.iter().enumerate() {
        backup_location(&format!("{field}.location[{i}]"), location)?;
    }
    for (name, values) in [
        ("rate_limit", &b.rate_limit),
        ("snapshot_parallel", &b.snapshot_parallel),
        ("upload_parallel", &b.upload_parallel),
    ] {
        list_bound(&format!("{field}.{name}"), values)?;
        for (i, value) in values.iter().enumerate() {
            dc_limit(&format!("{field}.{name}[{i}]"), value)?;
        }
    }
    Ok(())
}

/// The longest directory of a `file:` location.
const MAX_FILE_LOCATION: usize = 1024;

/// `[dc:]provider:bucket`, provider one of s3, gcs, azure; or
/// `[dc:]file:/directory`.
fn backup_location(field: &str, location: &str) -> Validation {
    if let Some(checked) = file_location(field, location) {
        return checked;
    }
    let parts: Vec<&str> = location.split(':').collect();
    let (dc, provider, bucket) = match parts.as_slice() {
        [provider, bucket] => (None, *provider, *bucket),
        [dc, provider, bucket] => (Some(*dc), *provider, *bucket),
        _ => {
            return Err(FieldError::new(
                field,
                format!("{location:?} is not of the form [dc:]provider:bucket"),
            ))
        }
    };
    if dc.is_some_and(|dc| !is_dc(dc)) {
        return Err(FieldError::new(
            field,
            format!("{location:?}: the data centre before the first ':' must be 1-253 characters without spaces"),
        ));
    }
    if !PROVIDERS.contains(&provider) {
        return Err(FieldError::new(
            field,
            format!(
                "{location:?}: provider {provider:?} is not one of {}",
                PROVIDERS.join(", ")
            ),
        ));
    }
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !bucket_ok {
        return Err(FieldError::new(
            field,
            format!("{location:?}: bucket {bucket:?} must be 3-63 lower-case letters, digits, '-' and '.'"),
        ));
    }
    Ok(())
}

/// A `[dc:]file:/directory` location checked, or `None` for another kind.
/// The directory is absolute (a relative one would depend on where the
/// provider runs) and has no `..` (it names the directory it means).
fn file_location(field: &str, location: &str) -> Option<Validation> {
    let (dc, path) = match location.strip_prefix("file:") {
        Some(path) => (None, path),
        None => {
            let (dc, rest) = location.split_once(':')?;
            (Some(dc), rest.strip_prefix("file:")?)
        }
    };
    if dc.is_some_and(|dc| !is_dc(dc)) {
        return Some(Err(FieldError::new(
            field,
            format!("{location:?}: the data centre before the first ':' must be 1-253 characters without spaces"),
        )));
    }
    let well_formed = path.starts_with('/')
        && path.len() <= MAX_FILE_LOCATION
        && !path.chars().any(char::is_control)
        && !path.split('/').any(|part| part == "..");
    Some(if well_formed {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!(
                "{location:?}: a file location names an absolute directory (file:/path, at most {MAX_FILE_LOCATION} characters, no '..')"
            ),
        ))
    })
}

/// `[dc:]<non-negative integer>`.
fn dc_limit(field: &str, value: &str) -> Validation {
    let limit = value.rsplit(':').next().unwrap_or_default();
    let dc_ok = value
        .split_once(':')
        .is_none_or(|(dc, rest)| is_dc(dc) && !rest.contains(':'));
    if !dc_ok || limit.parse::<u32>().is_err() {
        return Err(FieldError::new(
            field,
            format!("{value:?} is not of the form [dc:]<number>"),
        ));
    }
    Ok(())
}

/// A data centre name: bounded, like every value that ends up in etcd (an
/// unbounded one made the spec's write fail in etcd, as INTERNAL).
fn is_dc(dc: &str) -> bool {
    (1..=253).contains(&dc.len()) && !dc.chars().any(char::is_whitespace)
}

fn names(field: &str, values: &[String]) -> Validation {
    list_bound(field, values)?;
    for (i, value) in values.iter().enumerate() {
        if value.is_empty() || value.len() > 253 || value.chars().any(char::is_whitespace) {
            return Err(FieldError::new(
                format!("{field}[{i}]"),
                "must be 1-253 characters without spaces",
            ));
        }
    }
    Ok(())
}

fn list_bound(field: &str, values: &[String]) -> Validation {
    if values.len() > MAX_LIST {
        return Err(FieldError::new(
            field,
            format!("at most {MAX_LIST} entries are allowed"),
        ));
    }
    Ok(())
}

/// A size such as `1GiB`, `512MiB`, `100MB` or `4096`.
fn is_size(text: &str) -> bool {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let unit = &text[digits..];
    (1..=20).contains(&digits)
        && matches!(
            unit,
            "" | "B"
                | "K"
                | "KB"
                | "KiB"
                | "M"
                | "MB"
                | "MiB"
                | "G"
                | "GB"
                | "GiB"
                | "T"
                | "TB"
                | "TiB"
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::task_spec::bare;

    fn repair(name: &str) -> TaskSpec {
        bare(TaskType::Repair, name)
    }

    fn backup(name: &str) -> TaskSpec {
        TaskSpec {
            backup: Some(BackupProperties {
                location: vec!["s3:backups".into()],
                ..Default::default()
            }),
            ..bare(TaskType::Backup, name)
        }
    }

    fn field_of(list: &[TaskSpec]) -> String {
        tasks("spec.tasks", list).unwrap_err().field
    }

    #[test]
    fn an_edit_checks_what_it_changes_and_a_stored_task_under_looser_rules_blocks_nothing() {
        let loose = TaskSpec {
            schedule: TaskSchedule {
                cron: "not a cron".into(),
                ..Default::default()
            },
            ..repair("old")
        };
        let stored = vec![loose.clone(), repair("a")];
        // Another task added, one deleted, the loose one itself deleted.
        let added = [stored.clone(), vec![repair("b")]].concat();
        assert_eq!(edit("task", &stored, &added), Ok(()));
        assert_eq!(edit("task", &stored, std::slice::from_ref(&loose)), Ok(()));
        assert_eq!(edit("task", &stored, &[repair("a")]), Ok(()));
        // What an edit brings in is checked in full.
        let renamed = TaskSpec {
            name: "new".into(),
            ..loose
        };
        let error = edit("task", &stored, &[repair("a"), renamed]).unwrap_err();
        assert_eq!(error.field, "task.schedule.cron", "{error:?}");
        let second_a = TaskSpec {
            schedule: TaskSchedule {
                interval: "24h".into(),
                ..Default::default()
            },
            ..repair("a")
        };
        let error = edit("task", &stored, &[repair("a"), second_a]).unwrap_err();
        assert_eq!(error.field, "task.name", "{error:?}");
        // The count: never grown past the limit, but a list stored over it
        // may shrink.
        let full: Vec<TaskSpec> = (0..MAX_TASKS).map(|i| repair(&format!("t{i}"))).collect();
        let over = [full.clone(), vec![repair("one-more")]].concat();
        assert_eq!(edit("task", &full, &over).unwrap_err().field, "task");
        assert_eq!(edit("task", &over, &full), Ok(()));
    }

    #[test]
    fn names_are_unique_within_a_type_only() {
        assert_eq!(
            tasks("spec.tasks", &[repair("daily"), backup("daily")]),
            Ok(())
        );
        assert_eq!(
            field_of(&[repair("daily"), backup("x"), repair("daily")]),
            "spec.tasks[2].name"
        );
    }

    #[test]
    fn values_that_reach_etcd_are_bounded() {
        let long = "a".repeat(100_000);
        let mut rate = backup("b");
        rate.backup.as_mut().unwrap().rate_limit = vec![format!("{long}:1")];
        assert_eq!(field_of(&[rate]), "spec.tasks[0].backup.rate_limit[0]");
        let mut location = backup("b");
        location.backup.as_mut().unwrap().location = vec![format!("{long}:s3:backups")];
        assert_eq!(field_of(&[location]), "spec.tasks[0].backup.location[0]");
        let mut threshold = repair("r");
        threshold.repair = Some(RepairProperties {
            small_table_threshold: format!("{}GiB", "1".repeat(100_000)),
            ..Default::default()
        });
        assert_eq!(
            field_of(&[threshold]),
            "spec.tasks[0].repair.small_table_threshold"
        );
    }

    #[test]
    fn names_must_not_look_like_uuids() {
        let uuid = "6d3f4a1e-8f7b-4c1a-9a57-5f0e3a1b2c3d";
        assert_eq!(field_of(&[repair(uuid)]), "spec.tasks[0].name");
        assert_eq!(field_of(&[repair("")]), "spec.tasks[0].name");
    }

    #[test]
    fn schedule_rules_follow_the_reference() {
        type Edit = fn(&mut TaskSchedule);
        let cases: [(Edit, &str); 8] = [
            (|s| s.cron = "not a cron".into(), "cron"),
            (|s| s.cron = "TZ=UTC 0 3 * * *".into(), "cron"),
            (
                |s| s.cron = "CRON_TZ=Europe/Warsaw 0 3 * * *".into(),
                "cron",
            ),
            (|s| s.timezone = "Europe/Warsaw".into(), "timezone"),
            (
                |s| {
                    s.cron = "0 3 * * *".into();
                    s.timezone = "Mars/Olympus".into();
                },
                "timezone",
            ),
            (
                |s| {
                    s.cron = "0 3 * * *".into();
                    s.interval = "24h".into();
                },
                "interval",
            ),
            (|s| s.start_date = "yesterday".into(), "start_date"),
            (|s| s.retry_wait = "soon".into(), "retry_wait"),
        ];
        for (edit, leaf) in cases {
            let mut task = repair("r");
            edit(&mut task.schedule);
            assert_eq!(
                field_of(&[repair("ok"), task]),
                format!("spec.tasks[1].schedule.{leaf}")
            );
        }
        let mut good = repair("r");
        good.schedule = TaskSchedule {
            cron: "0 3 * * *".into(),
            timezone: "Europe/Warsaw".into(),
            interval: "0s".into(),
            start_date: "now+3d2h".into(),
            ..Default::default()
        };
        assert_eq!(tasks("spec.tasks", &[good]), Ok(()));
    }

    #[test]
    fn repair_intensity_must_be_a_float() {
        let mut task = repair("r");
        task.repair = Some(RepairProperties {
            intensity: "0.5".into(),
            ..Default::default()
        });
        assert_eq!(tasks("spec.tasks", &[task.clone()]), Ok(()));
        task.repair.as_mut().unwrap().intensity = "fast".into();
        assert_eq!(field_of(&[task]), "spec.tasks[0].repair.intensity");
    }

    #[test]
    fn backup_locations_are_required_and_well_formed() {
        let mut task = backup("b");
        for good in ["s3:backups", "dc1:gcs:my-bucket", "azure:a.b.c"] {
            task.backup.as_mut().unwrap().location = vec![good.into()];
            assert_eq!(tasks("spec.tasks", &[task.clone()]), Ok(()), "{good}");
        }
        for bad in ["backups", "ftp:backups", "s3:B", ":s3:backups", "a:b:c:d"] {
            task.backup.as_mut().unwrap().location = vec!["s3:ok-bucket".into(), bad.into()];
            assert_eq!(
                field_of(&[task.clone()]),
                "spec.tasks[0].backup.location[1]",
                "{bad}"
            );
        }
        task.backup.as_mut().unwrap().location.clear();
        assert_eq!(field_of(&[task.clone()]), "spec.tasks[0].backup.location");
        task.backup = None;
        assert_eq!(field_of(&[task]), "spec.tasks[0].backup.location");
    }

    #[test]
    fn a_file_location_is_an_absolute_directory() {
        let mut task = backup("b");
        for good in ["file:/var/backups/drover", "dc1:file:/srv/b", "file:/"] {
            task.backup.as_mut().unwrap().location = vec![good.into()];
            assert_eq!(tasks("spec.tasks", &[task.clone()]), Ok(()), "{good}");
        }
        for bad in [
            "file:backups",
            "file:",
            "dc1:file:relative/dir",
            "file:/var/../etc",
            "bad dc:file:/srv",
        ] {
            task.backup.as_mut().unwrap().location = vec!["file:/ok".into(), bad.into()];
            assert_eq!(
                field_of(&[task.clone()]),
                "spec.tasks[0].backup.location[1]",
                "{bad}"
            );
        }
    }
}
