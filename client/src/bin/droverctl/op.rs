//! `droverctl op ...`: operations shown, listed, waited for and cancelled;
//! how a lifecycle command follows the operation it started (`--wait`);
//! how operations are printed.

use crate::output::{age, Output, Table};
use crate::{enum_name, send};
use clap::Subcommand;
use drover_client::{v1, Client, ClientError};
use std::io::Write;
use std::time::Duration;

#[derive(Subcommand)]
pub enum OpCommand {
    /// Show one operation.
    Get { cluster: String, id: String },
    /// List a cluster's operations, newest first.
    List { cluster: String },
    /// Wait until an operation ends.
    Wait {
        cluster: String,
        id: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Cancel an operation at its next step boundary.
    Cancel { cluster: String, id: String },
    /// Abandon an operation whose provider cannot be fenced (its lost
    /// owner's provider gone for good): it ends FAILED, saying that Drover
    /// cannot prove the provider stopped. Admin only; the reason is kept.
    Abandon {
        cluster: String,
        id: String,
        /// Why, for whoever reads the operation later.
        #[arg(long)]
        reason: String,
    },
}

pub async fn run(
    client: &mut Client,
    output: Output,
    command: OpCommand,
) -> Result<(), ClientError> {
    match command {
        OpCommand::Get { cluster, id } => {
            let op = get(client, v1::GetOperationRequest { cluster, id }).await?;
            print_operation(output, &op);
        }
        OpCommand::List { cluster } => {
            let operations = list(client, cluster).await?;
            print_operation_list(output, &operations);
        }
        OpCommand::Wait {
            cluster,
            id,
            timeout,
        } => wait(client, output, cluster, id, Duration::from_secs(timeout)).await?,
        OpCommand::Cancel { cluster, id } => {
            let request = v1::CancelOperationRequest { cluster, id };
            let op = client
                .operations()
                .cancel_operation(request)
                .await?
                .into_inner();
            print_operation(output, &op);
            // Standard error, so that -o json stays one document.
            let _ = writeln!(
                std::io::stderr(),
                "cancel recorded: operation {} ends CANCELLED at its next step boundary (follow it: droverctl op wait {} {})",
                op.id, op.cluster, op.id
            );
        }
        OpCommand::Abandon {
            cluster,
            id,
            reason,
        } => {
            let request = v1::AbandonOperationRequest {
                cluster,
                id,
                reason,
            };
            let op = client
                .operations()
                .abandon_operation(request)
                .await?
                .into_inner();
            print_operation(output, &op);
            let _ = writeln!(
                std::io::stderr(),
                "abandon recorded: operation {} ends now if its provider cannot be fenced, otherwise as a cancel would; Drover cannot prove the provider stopped (follow it: droverctl op wait {} {})",
                op.id, op.cluster, op.id
            );
        }
    }
    Ok(())
}

async fn get(
    client: &Client,
    request: v1::GetOperationRequest,
) -> Result<v1::Operation, ClientError> {
    send(client, request, |mut c, r| async move {
        Ok(c.operations().get_operation(r).await?.into_inner())
    })
    .await
}

/// Every operation of a cluster, newest first, page after page.
pub async fn list(client: &mut Client, cluster: String) -> Result<Vec<v1::Operation>, ClientError> {
    let mut operations = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = v1::ListOperationsRequest {
            cluster: cluster.clone(),
            page_size: 100,
            page_token,
        };
        let page = send(client, request, |mut c, r| async move {
            Ok(c.operations().list_operations(r).await?.into_inner())
        })
        .await?;
        operations.extend(page.operations);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(operations)
}

/// `op wait`: prints the operation as last seen; one still running at the
/// timeout is an error of its own, apart from one that failed.
async fn wait(
    client: &mut Client,
    output: Output,
    cluster: String,
    id: String,
    waited: Duration,
) -> Result<(), ClientError> {
    let op = get(client, v1::GetOperationRequest { cluster, id }).await?;
    let op = client.wait_operation(&op, waited).await?;
    print_operation(output, &op);
    if op.state < v1::OperationState::Succeeded as i32 {
        return Err(ClientError::StillRunning {
            id: op.id.clone(),
            state: state_name(op.state),
            waited,
        });
    }
    operation_outcome(&op)
}

/// Prints an accepted operation, or follows it to its end with `wait`.
/// Ctrl-C stops the following, not the operation: droverctl says so and
/// how to follow it again.
pub async fn follow(
    client: &mut Client,
    output: Output,
    op: v1::Operation,
    wait: bool,
) -> Result<(), ClientError> {
    note_never_started(&op);
    if !wait {
        print_operation(output, &op);
        return Ok(());
    }
    let (cluster, id) = (op.cluster.clone(), op.id.clone());
    let mut progress = Progress::new();
    let followed = follow_to_end(client, op, &mut progress);
    let last = tokio::select! {
        last = followed => last?,
        _ = tokio::signal::ctrl_c() => {
            progress.abandon();
            let _ = writeln!(
                std::io::stderr(),
                "droverctl: stopped waiting; operation {id} goes on. Follow it with: droverctl op wait {cluster} {id}"
            );
            std::process::exit(130);
        }
    };
    progress.finish(&last);
    print_operation(output, &last);
    note_no_steps(&last);
    operation_outcome(&last)
}

/// Says on standard error (so that `-o json` stays one document) what a
/// stop or delete of a cluster never started does: nothing at the
/// provider, since nothing was ever built there.
fn note_never_started(op: &v1::Operation) {
    if op.from_state != v1::ClusterState::Created as i32 {
        return;
    }
    let cluster = &op.cluster;
    let note = match v1::OperationKind::try_from(op.kind) {
        Ok(v1::OperationKind::Stop) => format!(
            "cluster {cluster} was never started (CREATED): there is nothing to stop, the stop is a no-op"
        ),
        Ok(v1::OperationKind::Destroy) => format!(
            "cluster {cluster} was never started (CREATED): it is deleted without any call to its provider"
        ),
        _ => return,
    };
    let _ = writeln!(std::io::stderr(), "droverctl: {note}");
}

/// Says when an operation that succeeded had no step: nothing was done at
/// the provider (an upgrade to the version every node already runs, a stop
/// of a cluster never provisioned).
fn note_no_steps(op: &v1::Operation) {
    let stepless = op.progress.as_ref().is_none_or(|p| p.total_steps == 0);
    if op.state == v1::OperationState::Succeeded as i32 && stepless {
        let _ = writeln!(
            std::io::stderr(),
            "droverctl: operation {} had no steps: nothing was done at the provider",
            op.id
        );
    }
}

/// Polls `op` until it ends, showing each step as it starts.
async fn follow_to_end(
    client: &mut Client,
    op: v1::Operation,
    progress: &mut Progress,
) -> Result<v1::Operation, ClientError> {
    let mut current = op;
    loop {
        progress.show(&current);
        if current.state >= v1::OperationState::Succeeded as i32 {
            return Ok(current);
        }
        // Short waits, so each new step is shown as it starts; a replica
        // that goes away meanwhile is retried (waiting is idempotent).
        let waited = &current;
        current = client
            .retrying(|mut client| async move {
                client
                    .wait_operation(waited, Duration::from_millis(500))
                    .await
            })
            .await?;
    }
}

/// The progress of a followed operation on standard error: an indicatif
/// bar with the elapsed time and the step name, redrawn in place on a
/// terminal (it fits narrow ones); one line per step otherwise (logs, CI).
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    last: String,
}

impl Progress {
    fn new() -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let style = indicatif::ProgressStyle::with_template(
                "{elapsed:>4} [{bar:24}] {pos}/{len} {wide_msg}",
            )
            .expect("a valid template")
            .progress_chars("#>.");
            indicatif::ProgressBar::new(1).with_style(style)
        });
        Self {
            bar,
            last: String::new(),
        }
    }

    fn show(&mut self, op: &v1::Operation) {
        let Some(p) = &op.progress else { return };
        match &self.bar {
            Some(bar) => {
                bar.set_length(u64::from(p.total_steps.max(1)));
                // A step is done once the next one starts.
                bar.set_position(u64::from(p.step.saturating_sub(1)));
                bar.set_message(p.step_name.clone());
            }
            None => {
                let line = format!("[{}/{}] {}", p.step, p.total_steps, p.step_name);
                if line != self.last {
                    // Progress is a courtesy: a standard error that was
                    // closed (`2>&-`) does not stop the command.
                    let _ = writeln!(std::io::stderr(), "{line}");
                    self.last = line;
                }
            }
        }
    }

    /// The last frame shows how the operation really ended: every step
    /// done when it succeeded, where it stopped otherwise.
    fn finish(&self, op: &v1::Operation) {
        let Some(bar) = &self.bar else { return };
        let state = state_name(op.state).to_ascii_lowercase();
        if op.state == v1::OperationState::Succeeded as i32 {
            bar.set_position(bar.length().unwrap_or(0));
            bar.finish_with_message(state);
        } else {
            bar.abandon_with_message(state);
        }
    }

    fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon_with_message("interrupted");
        }
    }
}

/// A failed or cancelled operation is a failure of the command.
fn operation_outcome(op: &v1::Operation) -> Result<(), ClientError> {
    if op.state == v1::OperationState::Succeeded as i32 {
        return Ok(());
    }
    Err(ClientError::OperationFailed {
        id: op.id.clone(),
        state: state_name(op.state),
        message: op
            .error
            .as_ref()
            .map_or_else(String::new, |e| e.message.clone()),
    })
}

fn state_name(state: i32) -> String {
    enum_name(
        v1::OperationState::try_from(state).map(|s| s.as_str_name()),
        "OPERATION_STATE_",
    )
}

fn kind_name(kind: i32) -> String {
    enum_name(
        v1::OperationKind::try_from(kind).map(|k| k.as_str_name()),
        "OPERATION_KIND_",
    )
}

/// One operation: an object with `-o json|yaml`.
pub fn print_operation(output: Output, op: &v1::Operation) {
    print_operations(output, std::slice::from_ref(op), false);
}

/// A list of operations: an array with `-o json|yaml`, whatever its length.
pub fn print_operation_list(output: Output, ops: &[v1::Operation]) {
    print_operations(output, ops, true);
}

fn print_operations(output: Output, ops: &[v1::Operation], list: bool) {
    if output.messages(ops, list) {
        return;
    }
    if output == Output::Name {
        ops.iter().for_each(|op| outln!("{}", op.id));
        return;
    }
    let mut header = vec!["ID", "KIND", "STATE", "STEP", "AGE"];
    if output.is_wide() {
        header.extend(["STEP NAME", "REPLICA", "EPOCH"]);
    }
    header.push("DETAIL");
    let mut table = Table::new(header);
    for op in ops {
        let step = op
            .progress
            .as_ref()
            .map(|p| format!("{}/{}", p.step, p.total_steps))
            .unwrap_or_default();
        let mut row = vec![
            op.id.clone(),
            kind_name(op.kind),
            state_name(op.state),
            step,
            age(op.created_at.as_ref()),
        ];
        if output.is_wide() {
            row.extend([
                op.progress
                    .as_ref()
                    .map(|p| p.step_name.clone())
                    .unwrap_or_default(),
                op.replica.clone().unwrap_or_default(),
                op.owner_epoch.map(|e| e.to_string()).unwrap_or_default(),
            ]);
        }
        row.push(
            op.error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_default(),
        );
        table.row(row);
    }
    table.print();
}
