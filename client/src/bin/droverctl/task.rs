//! `droverctl task ...`: scheduled repair and backup tasks.

use crate::{enum_name, send, Output};
use clap::{Subcommand, ValueEnum};
use drover_client::{v1, Client, ClientError};
use serde_json::{json, Value};

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    Repair,
    Backup,
}

impl Kind {
    fn proto(self) -> i32 {
        match self {
            Kind::Repair => v1::TaskType::Repair as i32,
            Kind::Backup => v1::TaskType::Backup as i32,
        }
    }
}

#[derive(Subcommand)]
pub enum TaskCommand {
    /// Create or replace a task (bumps the cluster's generation).
    Put(Box<PutArgs>),
    /// Remove a task; its running run is stopped.
    Delete {
        cluster: String,
        #[arg(value_enum)]
        kind: Kind,
        name: String,
    },
    /// Show one task: spec and status.
    Get {
        cluster: String,
        #[arg(value_enum)]
        kind: Kind,
        name: String,
    },
    /// List a cluster's tasks.
    List { cluster: String },
    /// List a task's runs, newest first.
    Runs {
        cluster: String,
        #[arg(value_enum)]
        kind: Kind,
        name: String,
    },
}

#[derive(clap::Args)]
pub struct PutArgs {
    cluster: String,
    #[arg(value_enum)]
    kind: Kind,
    name: String,
    /// First activation: RFC 3339, "now" or "now+<duration>" (e.g. now+3d2h).
    #[arg(long, default_value = "now")]
    start_date: String,
    /// Five-field cron expression.
    #[arg(long, default_value = "")]
    cron: String,
    /// IANA time zone of the cron expression.
    #[arg(long, default_value = "")]
    timezone: String,
    /// Fixed interval (deprecated; not with cron), e.g. 24h.
    #[arg(long, default_value = "")]
    interval: String,
    /// Retries after a failed run (default 3).
    #[arg(long)]
    num_retries: Option<u32>,
    /// First retry delay, doubling, capped at 3h (default 10m).
    #[arg(long, default_value = "")]
    retry_wait: String,
    /// Data centres; repeatable.
    #[arg(long)]
    dc: Vec<String>,
    /// Keyspaces; repeatable.
    #[arg(long)]
    keyspace: Vec<String>,
    /// Repair: intensity (a float).
    #[arg(long, default_value = "")]
    intensity: String,
    /// Repair: stop at the first error, never retry.
    #[arg(long)]
    fail_fast: bool,
    /// Backup: `[dc:]provider:bucket`; repeatable, at least one.
    #[arg(long)]
    location: Vec<String>,
    /// Backup: snapshots kept.
    #[arg(long)]
    retention: Option<u32>,
}

pub async fn run(
    client: &mut Client,
    output: Output,
    command: TaskCommand,
) -> Result<(), ClientError> {
    match command {
        TaskCommand::Put(args) => put(client, output, *args).await?,
        TaskCommand::Delete {
            cluster,
            kind,
            name,
        } => {
            let request = v1::DeleteTaskRequest {
                cluster,
                r#type: kind.proto(),
                name,
            };
            client.tasks().delete_task(request).await?;
        }
        TaskCommand::Get {
            cluster,
            kind,
            name,
        } => {
            let request = v1::GetTaskRequest {
                cluster,
                r#type: kind.proto(),
                name,
            };
            let task = send(client, request, |mut c, r| async move {
                Ok(c.tasks().get_task(r).await?.into_inner())
            })
            .await?;
            print_tasks(output, &[task], false);
        }
        TaskCommand::List { cluster } => {
            let request = v1::ListTasksRequest { cluster };
            let tasks = send(client, request, |mut c, r| async move {
                Ok(c.tasks().list_tasks(r).await?.into_inner().tasks)
            })
            .await?;
            print_tasks(output, &tasks, true);
        }
        TaskCommand::Runs {
            cluster,
            kind,
            name,
        } => {
            let request = v1::ListTaskRunsRequest {
                cluster,
                r#type: kind.proto(),
                name,
                page_size: 0,
            };
            let runs = send(client, request, |mut c, r| async move {
                Ok(c.tasks().list_task_runs(r).await?.into_inner().runs)
            })
            .await?;
            print_runs(output, &runs);
        }
    }
    Ok(())
}

/// `task put`: the flags as a task spec; a repair and a backup share the
/// schedule and take their own properties.
async fn put(client: &mut Client, output: Output, args: PutArgs) -> Result<(), ClientError> {
    let PutArgs {
        cluster,
        kind,
        name,
        start_date,
        cron,
        timezone,
        interval,
        num_retries,
        retry_wait,
        dc,
        keyspace,
        intensity,
        fail_fast,
        location,
        retention,
    } = args;
    let properties = match kind {
        Kind::Repair => v1::task_spec::Properties::Repair(v1::RepairProperties {
            dc,
            keyspace,
            fail_fast,
            intensity,
            ..Default::default()
        }),
        Kind::Backup => v1::task_spec::Properties::Backup(v1::BackupProperties {
            dc,
            keyspace,
            location,
            retention,
            ..Default::default()
        }),
    };
    let task = v1::TaskSpec {
        r#type: kind.proto(),
        name,
        schedule: Some(v1::TaskSchedule {
            start_date,
            cron,
            timezone,
            interval,
            num_retries,
            retry_wait,
        }),
        properties: Some(properties),
    };
    let request = v1::PutTaskRequest {
        cluster,
        task: Some(task),
    };
    let task = client.tasks().put_task(request).await?.into_inner();
    print_tasks(output, &[task], false);
    Ok(())
}

fn type_name(value: i32) -> String {
    enum_name(
        v1::TaskType::try_from(value).map(|t| t.as_str_name()),
        "TASK_TYPE_",
    )
}

fn run_status(value: i32) -> String {
    enum_name(
        v1::TaskRunStatus::try_from(value).map(|s| s.as_str_name()),
        "TASK_RUN_STATUS_",
    )
}

fn time(timestamp: &Option<prost_types::Timestamp>) -> Option<String> {
    timestamp.as_ref().map(|t| t.to_string())
}

fn run_json(run: &v1::TaskRun) -> Value {
    json!({
        "id": run.id,
        "status": run_status(run.status),
        "slot": time(&run.slot),
        "started_at": time(&run.started_at),
        "finished_at": time(&run.finished_at),
        "attempt": run.attempt,
        "error": run.error,
        "report": run.report,
    })
}

fn task_json(task: &v1::Task) -> Value {
    let spec = task.spec.clone().unwrap_or_default();
    let schedule = spec.schedule.clone().unwrap_or_default();
    // Status fields appear only when they exist.
    let status = task.status.as_ref().map(|s| {
        let mut status = serde_json::Map::new();
        let mut set = |key: &str, value: Option<Value>| {
            if let Some(value) = value {
                status.insert(key.to_string(), value);
            }
        };
        set("name", s.name.clone().map(Value::from));
        set("id", s.id.clone().map(Value::from));
        set(
            "start",
            s.schedule
                .as_ref()
                .map(|s| Value::from(s.start_date.clone())),
        );
        set("last_run", s.last_run.as_ref().map(run_json));
        set("next_activation", time(&s.next_activation).map(Value::from));
        set("success_count", s.success_count.map(Value::from));
        set("error_count", s.error_count.map(Value::from));
        set("error", s.error.clone().map(Value::from));
        Value::Object(status)
    });
    json!({
        "cluster": task.cluster,
        "type": type_name(spec.r#type),
        "name": spec.name,
        "schedule": {
            "start_date": schedule.start_date,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "interval": schedule.interval,
            "num_retries": schedule.num_retries,
            "retry_wait": schedule.retry_wait,
        },
        "status": status,
    })
}

/// Tasks; with `-o json` a `list` is an array whatever its length, and a
/// single task otherwise an object.
fn print_tasks(output: Output, tasks: &[v1::Task], list: bool) {
    match output {
        Output::Json => {
            let value = match tasks {
                [one] if !list => task_json(one),
                many => Value::Array(many.iter().map(task_json).collect()),
            };
            outln!("{}", serde_json::to_string_pretty(&value).expect("json"));
        }
        Output::Table => {
            outln!(
                "{:<8} {:<20} {:<38} {:<9} {:<26} {:>4} {:>4}  MESSAGE",
                "TYPE",
                "NAME",
                "ID",
                "LAST RUN",
                "NEXT",
                "OK",
                "ERR"
            );
            for task in tasks {
                let spec = task.spec.clone().unwrap_or_default();
                let status = task.status.clone().unwrap_or_default();
                let count = |c: Option<u64>| c.map(|c| c.to_string()).unwrap_or_default();
                outln!(
                    "{:<8} {:<20} {:<38} {:<9} {:<26} {:>4} {:>4}  {}",
                    type_name(spec.r#type),
                    spec.name,
                    status.id.unwrap_or_default(),
                    status
                        .last_run
                        .map(|r| run_status(r.status))
                        .unwrap_or_default(),
                    time(&status.next_activation).unwrap_or_default(),
                    count(status.success_count),
                    count(status.error_count),
                    status.error.unwrap_or_default(),
                );
            }
        }
    }
}

fn print_runs(output: Output, runs: &[v1::TaskRun]) {
    match output {
        Output::Json => {
            let list: Vec<Value> = runs.iter().map(run_json).collect();
            outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
        }
        Output::Table => {
            outln!(
                "{:<52} {:<8} {:<26} {:>7}  ERROR OR REPORT",
                "ID",
                "STATUS",
                "STARTED",
                "ATTEMPT"
            );
            for run in runs {
                outln!(
                    "{:<52} {:<8} {:<26} {:>7}  {}",
                    run.id,
                    run_status(run.status),
                    time(&run.started_at).unwrap_or_default(),
                    run.attempt,
                    run.error.clone().or(run.report.clone()).unwrap_or_default(),
                );
            }
        }
    }
}
