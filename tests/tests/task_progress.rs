//! A task run's progress while it goes (GetTaskProgress): the simulator
//! reports the time gone by over its task latency, the owner asks every
//! 2 s and records what changed; GetTask, ListTasks and `droverctl task
//! list` show it while the run is RUNNING, and so does the console's task
//! table (in headless Chromium); the run ends DONE keeping the last
//! progress seen.

use drover_client::v1::{self, TaskRunStatus as R, TaskType as T};
use drover_client::Client;
use drover_tests::browser::{self, until, Browser};
use drover_tests::fixture::Fixture;
use drover_tests::{create_running, repair_now, wait_until};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
/// Long enough for several asks (one every 2 s) before the run ends.
const LATENCY: Duration = Duration::from_secs(15);

async fn last_run(client: &Client) -> Option<v1::TaskRun> {
    let request = v1::GetTaskRequest {
        cluster: "db".into(),
        r#type: T::Repair as i32,
        name: "slow".into(),
    };
    let task = client.clone().tasks().get_task(request).await;
    task.expect("the task").into_inner().status?.last_run
}

/// A run in progress with a percent part way.
fn part_way(run: &v1::TaskRun) -> bool {
    let percent = run.progress.as_ref().and_then(|p| p.percent);
    run.status == R::Running as i32 && percent.is_some_and(|p| 0 < p && p < 100)
}

fn task_list(f: &Fixture) -> String {
    let out = std::process::Command::new(drover_tests::workspace_binary("droverctl"))
        .args(["--endpoint", &f.replicas[0].endpoint()])
        .args(["task", "list", "db"])
        .output()
        .expect("droverctl runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The PROGRESS cell of the row of task `slow`: what the header's column
/// holds there.
fn progress_cell(table: &str) -> String {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    let (start, end) = (header.find("PROGRESS"), header.find("NEXT"));
    let row = lines
        .find(|l| l.contains("repair/slow"))
        .unwrap_or_default();
    match (start, end) {
        (Some(start), Some(end)) => row.get(start..end).unwrap_or_default().trim().into(),
        _ => panic!("no PROGRESS column: {table}"),
    }
}

/// The console's cluster page shows the run RUNNING with its progress in
/// the task table's "Last run" cell.
async fn console_shows_progress(f: &Fixture) {
    if !browser::available() {
        panic!("chromium is missing: run scripts/install-deps.sh");
    }
    let mut browser = Browser::start();
    let admin = f.replicas[0].admin_endpoint();
    browser.navigate(&format!("{admin}/ui/#/clusters/db"));
    let rows = "[...document.querySelectorAll('main tr')].map(r => r.innerText).join('\\n')";
    let shown = |v: &serde_json::Value| {
        let text = v.as_str().unwrap_or_default();
        text.lines()
            .any(|l| l.contains("slow") && l.contains("RUNNING") && l.contains("% repairing: "))
    };
    until(&mut browser, rows, WAIT, &mut Vec::new(), shown).await;
}

#[tokio::test]
async fn a_running_task_shows_its_providers_progress_then_ends_done() {
    let mut f = Fixture::builder().start().await;
    create_running(&mut f.client, "db", 1).await;
    f.sim.set_task_latency(LATENCY).await;
    let put = v1::PutTaskRequest {
        cluster: "db".into(),
        task: Some(repair_now("slow")),
    };
    f.client.tasks().put_task(put).await.expect("task put");

    let client = f.client.clone();
    wait_until(WAIT, "the run to show progress part way", || {
        let client = client.clone();
        async move { last_run(&client).await.is_some_and(|r| part_way(&r)) }
    })
    .await;
    let running = last_run(&f.client).await.unwrap();
    let progress = running.progress.clone().unwrap();
    assert!(progress.message.starts_with("repairing: "), "{progress:?}");
    assert!(progress.updated_at.is_some(), "{progress:?}");

    // ListTasks shows it, and so does droverctl's PROGRESS column (the
    // run goes on for seconds more).
    let listed = f.client.tasks().list_tasks(v1::ListTasksRequest {
        cluster: "db".into(),
    });
    let listed = listed.await.unwrap().into_inner().tasks;
    let status = listed[0].status.clone().unwrap_or_default();
    assert!(status.last_run.as_ref().is_some_and(part_way), "{status:?}");
    console_shows_progress(&f).await;
    let table = task_list(&f);
    let cell = progress_cell(&table);
    assert!(cell.contains("% repairing: "), "{cell:?} in\n{table}");

    // It ends DONE, keeping the last progress seen; the table shows none
    // for a run no longer going.
    let client = f.client.clone();
    wait_until(WAIT, "the run to end DONE", || {
        let client = client.clone();
        async move {
            let run = last_run(&client).await;
            run.is_some_and(|r| r.status == R::Done as i32)
        }
    })
    .await;
    let done = last_run(&f.client).await.unwrap();
    assert!(done.progress.is_some(), "{done:?}");
    let runs = f.client.tasks().list_task_runs(v1::ListTaskRunsRequest {
        cluster: "db".into(),
        r#type: T::Repair as i32,
        name: "slow".into(),
        page_size: 0,
    });
    let runs = runs.await.unwrap().into_inner().runs;
    assert_eq!(runs[0].progress, done.progress, "{runs:?}");
    assert_eq!(progress_cell(&task_list(&f)), "-");
    f.check_history().await;
}
