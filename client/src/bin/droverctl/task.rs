//! `droverctl task ...`: scheduled repair and backup tasks.

use crate::output::{Output, Table};
use crate::{enum_name, send};
use clap::{Subcommand, ValueEnum};
use drover_client::{v1, Client, ClientError};

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
    /// Suspend a cluster's scheduled task runs: none starts (a run already
    /// going goes on) until `task resume`, or for --for only.
    Suspend {
        cluster: String,
        /// How long: seconds, or 90s, 10m, 2h [default: until resumed].
        #[arg(long = "for", value_parser = crate::rollout::parse_seconds)]
        duration: Option<u32>,
    },
    /// Lift a suspension of a cluster's task runs.
    Resume { cluster: String },
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
        TaskCommand::Suspend { cluster, duration } => suspend(client, cluster, duration).await?,
        TaskCommand::Resume { cluster } => resume(client, cluster).await?,
    }
    Ok(())
}

/// `task suspend`: no run of `cluster`'s tasks starts until resumed, or
/// for `duration` seconds.
async fn suspend(
    client: &mut Client,
    cluster: String,
    duration: Option<u32>,
) -> Result<(), ClientError> {
    let until = duration.map(|seconds| {
        let until = std::time::SystemTime::now() + std::time::Duration::from_secs(seconds.into());
        let since_epoch = until
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        drover_proto::Timestamp {
            seconds: since_epoch.as_secs() as i64,
            nanos: since_epoch.subsec_nanos() as i32,
        }
    });
    let request = v1::UpdateClusterRequest {
        name: cluster.clone(),
        suspend_tasks: Some(v1::TaskSuspension { until }),
        ..Default::default()
    };
    client.clusters().update_cluster(request).await?;
    match duration {
        Some(seconds) => outln!("tasks of {cluster} suspended for {seconds} s"),
        None => outln!("tasks of {cluster} suspended until `droverctl task resume {cluster}`"),
    }
    Ok(())
}

/// `task resume`: lifts a suspension of `cluster`'s task runs.
async fn resume(client: &mut Client, cluster: String) -> Result<(), ClientError> {
    let request = v1::UpdateClusterRequest {
        name: cluster.clone(),
        resume_tasks: true,
        ..Default::default()
    };
    client.clusters().update_cluster(request).await?;
    outln!("tasks of {cluster} resumed");
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

fn time(timestamp: &Option<drover_proto::Timestamp>) -> Option<String> {
    timestamp.as_ref().map(|t| {
        let (seconds, nanos) = (t.seconds, t.nanos);
        prost_types::Timestamp { seconds, nanos }.to_string()
    })
}

/// Tasks: whole messages with `-o json|yaml` (a `list` as an array
/// whatever its length, a single task as an object), `TYPE/NAME` with
/// `-o name`, otherwise a table (the schedule too with `-o wide`).
pub fn print_tasks(output: Output, tasks: &[v1::Task], list: bool) {
    if output.messages(tasks, list) {
        return;
    }
    let type_and_name = |task: &v1::Task| {
        let spec = task.spec.clone().unwrap_or_default();
        format!(
            "{}/{}",
            type_name(spec.r#type).to_ascii_lowercase(),
            spec.name
        )
    };
    if output == Output::Name {
        tasks.iter().for_each(|t| outln!("{}", type_and_name(t)));
        return;
    }
    let mut header = vec!["TASK", "LAST RUN", "PROGRESS", "NEXT", "OK", "ERR"];
    if output.is_wide() {
        header.extend(["SCHEDULE", "ID"]);
    }
    header.push("MESSAGE");
    let mut table = Table::new(header);
    for task in tasks {
        let spec = task.spec.clone().unwrap_or_default();
        let status = task.status.clone().unwrap_or_default();
        let count = |c: Option<u64>| c.map(|c| c.to_string()).unwrap_or_default();
        let mut row = vec![
            type_and_name(task),
            status
                .last_run
                .as_ref()
                .map(|r| run_status(r.status))
                .unwrap_or_default(),
            progress(status.last_run.as_ref()),
            time(&status.next_activation).unwrap_or_default(),
            count(status.success_count),
            count(status.error_count),
        ];
        if output.is_wide() {
            let schedule = spec.schedule.unwrap_or_default();
            let when = match (schedule.cron.as_str(), schedule.interval.as_str()) {
                ("", "") => schedule.start_date,
                ("", interval) => format!("every {interval}"),
                (cron, _) => format!("{cron} {}", schedule.timezone)
                    .trim_end()
                    .to_string(),
            };
            row.extend([when, status.id.unwrap_or_default()]);
        }
        row.push(status.error.unwrap_or_default());
        table.row(row);
    }
    table.print();
}

/// A running run's progress as its provider last reported it ("40%
/// repairing: 40%"); "-" otherwise.
fn progress(run: Option<&v1::TaskRun>) -> String {
    let running = v1::TaskRunStatus::Running as i32;
    let Some(progress) = run
        .filter(|run| run.status == running)
        .and_then(|run| run.progress.as_ref())
    else {
        return "-".into();
    };
    let percent = progress.percent.map(|p| format!("{p}%"));
    let words = [percent.as_deref(), Some(progress.message.as_str())];
    let shown: Vec<&str> = words
        .into_iter()
        .flatten()
        .filter(|w| !w.is_empty())
        .collect();
    if shown.is_empty() {
        "-".into()
    } else {
        shown.join(" ")
    }
}

fn print_runs(output: Output, runs: &[v1::TaskRun]) {
    if output.messages(runs, true) {
        return;
    }
    if output == Output::Name {
        runs.iter().for_each(|r| outln!("{}", r.id));
        return;
    }
    let mut table = Table::new(["ID", "STATUS", "STARTED", "ATTEMPT", "ERROR", "REPORT"]);
    for run in runs {
        table.row([
            run.id.clone(),
            run_status(run.status),
            time(&run.started_at).unwrap_or_default(),
            run.attempt.to_string(),
            run.error.clone().unwrap_or_default(),
            run.report.clone().unwrap_or_default(),
        ]);
    }
    table.print();
}
