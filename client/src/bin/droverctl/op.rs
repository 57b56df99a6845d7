//! `droverctl op ...`: operations shown, listed, waited for and cancelled;
//! how a lifecycle command follows the operation it started (`--wait`);
//! how operations are printed.

use crate::{enum_name, send, Output};
use clap::Subcommand;
use drover_client::{v1, Client, ClientError};
use serde_json::{json, Value};
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
async fn list(client: &mut Client, cluster: String) -> Result<Vec<v1::Operation>, ClientError> {
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
            state: operation_json(&op)["state"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            waited,
        });
    }
    operation_outcome(&op)
}

/// Prints an accepted operation, or follows it to its end with `wait`.
pub async fn follow(
    client: &mut Client,
    output: Output,
    op: v1::Operation,
    wait: bool,
) -> Result<(), ClientError> {
    if !wait {
        print_operation(output, &op);
        return Ok(());
    }
    let mut progress = Progress::new();
    let mut current = op;
    loop {
        progress.show(&current);
        if current.state >= v1::OperationState::Succeeded as i32 {
            break;
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
    progress.finish();
    print_operation(output, &current);
    operation_outcome(&current)
}

/// The progress of a followed operation on standard error: a bar redrawn in
/// place on a terminal, one line per step otherwise (logs, CI).
struct Progress {
    terminal: bool,
    last: String,
}

impl Progress {
    const WIDTH: u32 = 24;

    fn new() -> Self {
        use std::io::IsTerminal;
        Self {
            terminal: std::io::stderr().is_terminal(),
            last: String::new(),
        }
    }

    fn show(&mut self, op: &v1::Operation) {
        let Some(p) = &op.progress else { return };
        let total = p.total_steps.max(1);
        let line = if self.terminal {
            let done = (p.step.saturating_sub(1)).min(total) * Self::WIDTH / total;
            format!(
                "[{}{}] {}/{} {}",
                "#".repeat(done as usize),
                ".".repeat((Self::WIDTH - done) as usize),
                p.step,
                p.total_steps,
                p.step_name
            )
        } else {
            format!("[{}/{}] {}", p.step, p.total_steps, p.step_name)
        };
        if line == self.last {
            return;
        }
        // Progress is a courtesy: a standard error that was closed
        // (`2>&-`) does not stop the command.
        let mut err = std::io::stderr();
        let _ = if self.terminal {
            // Clear the line, then redraw.
            write!(err, "\r\x1b[2K{line}")
        } else {
            writeln!(err, "{line}")
        };
        self.last = line;
    }

    fn finish(&self) {
        if self.terminal && !self.last.is_empty() {
            let _ = writeln!(std::io::stderr());
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
        state: operation_json(op)["state"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        message: op
            .error
            .as_ref()
            .map_or_else(String::new, |e| e.message.clone()),
    })
}

fn operation_json(op: &v1::Operation) -> Value {
    json!({
        "id": op.id,
        "cluster": op.cluster,
        "kind": enum_name(v1::OperationKind::try_from(op.kind).map(|k| k.as_str_name()), "OPERATION_KIND_"),
        "state": enum_name(v1::OperationState::try_from(op.state).map(|s| s.as_str_name()), "OPERATION_STATE_"),
        "progress": op.progress.as_ref().map(|p| json!({"step": p.step, "total_steps": p.total_steps, "step_name": p.step_name})),
        "error": op.error.as_ref().map(|e| json!({"code": e.code, "message": e.message})),
        "replica": op.replica,
        "owner_epoch": op.owner_epoch,
    })
}

/// One operation: a JSON object with `-o json`.
fn print_operation(output: Output, op: &v1::Operation) {
    print_operations(output, std::slice::from_ref(op), false);
}

/// A list of operations: a JSON array with `-o json`, whatever its length.
fn print_operation_list(output: Output, ops: &[v1::Operation]) {
    print_operations(output, ops, true);
}

fn print_operations(output: Output, ops: &[v1::Operation], list: bool) {
    match output {
        Output::Json => {
            let value = match ops {
                [one] if !list => operation_json(one),
                many => Value::Array(many.iter().map(operation_json).collect()),
            };
            outln!("{}", serde_json::to_string_pretty(&value).expect("json"));
        }
        Output::Table => {
            outln!(
                "{:<38} {:<14} {:<10} {:<8}  DETAIL",
                "ID",
                "KIND",
                "STATE",
                "STEP"
            );
            for op in ops {
                let json = operation_json(op);
                let step = op
                    .progress
                    .as_ref()
                    .map(|p| format!("{}/{}", p.step, p.total_steps))
                    .unwrap_or_default();
                let detail = op
                    .error
                    .as_ref()
                    .map(|e| e.message.clone())
                    .unwrap_or_default();
                outln!(
                    "{:<38} {:<14} {:<10} {:<8}  {}",
                    op.id,
                    json["kind"].as_str().unwrap_or_default(),
                    json["state"].as_str().unwrap_or_default(),
                    step,
                    detail
                );
            }
        }
    }
}
