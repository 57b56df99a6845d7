//! `droverctl cluster describe`: everything about one cluster on one page,
//! like `kubectl describe`: spec, status, nodes, the operations with their
//! steps and the epochs that ran them, tasks, and the state changes the
//! operations made.

use crate::output::{age, field, label_pairs, Output, Table};
use crate::{enum_name, op, policy, send, task};
use drover_client::{v1, Client, ClientError};

/// What describe shows, read in three calls.
struct Described {
    cluster: v1::Cluster,
    /// Newest first.
    operations: Vec<v1::Operation>,
    tasks: Vec<v1::Task>,
}

pub async fn cluster(client: &mut Client, output: Output, name: String) -> Result<(), ClientError> {
    let described = read(client, name).await?;
    if matches!(output, Output::Json | Output::Yaml) {
        let whole = serde_json::json!({
            "cluster": described.cluster,
            "operations": described.operations,
            "tasks": described.tasks,
        });
        output.messages(&[whole], false);
        return Ok(());
    }
    print(&described);
    Ok(())
}

async fn read(client: &mut Client, name: String) -> Result<Described, ClientError> {
    let name = name.as_str();
    let cluster = client
        .retrying_unavailable(|mut c| async move { c.get_cluster(name).await })
        .await?;
    let operations = op::list(client, name.to_string()).await?;
    let request = v1::ListTasksRequest {
        cluster: name.to_string(),
    };
    let tasks = send(client, request, |mut c, r| async move {
        Ok(c.tasks().list_tasks(r).await?.into_inner().tasks)
    })
    .await?;
    Ok(Described {
        cluster,
        operations,
        tasks,
    })
}

fn print(d: &Described) {
    let c = &d.cluster;
    let spec = c.spec.clone().unwrap_or_default();
    let status = c.status.clone().unwrap_or_default();
    let labels = label_pairs(&spec.labels);
    field(0, "Name", &c.name);
    field(0, "UID", &c.uid);
    field(0, "Generation", &c.generation.to_string());
    field(0, "Created", &format!("{} ago", age(c.created_at.as_ref())));
    field(0, "Labels", &labels.join(", "));
    if spec.paused {
        let paused = "yes: no remediation, task run or rollout step starts until unpaused";
        field(0, "Paused", paused);
    }
    outln!("Spec:");
    field(1, "Version", &spec.version);
    field(1, "Control nodes", &spec.control_nodes.to_string());
    field(1, "Workers", &spec.worker_nodes.to_string());
    field(1, "Offering", &spec.node_offering);
    if let Some(window) = crate::cluster::window_shown(spec.maintenance.as_ref()) {
        field(1, "Maintenance", &window);
    }
    if let Some(health) = policy::health_shown(spec.health.as_ref()) {
        field(1, "Health policy", &health);
    }
    if let Some(upgrade) = policy::upgrade_policy_shown(spec.upgrade_policy.as_ref()) {
        field(1, "Upgrade policy", &upgrade);
    }
    outln!("Status:");
    let since = age(status.state_changed_at.as_ref());
    field(
        1,
        "State",
        &format!("{} (for {since})", state_name(status.state)),
    );
    field(
        1,
        "Version",
        status.current_version.as_deref().unwrap_or("-"),
    );
    if let Some(message) = status.message.as_deref().filter(|m| !m.is_empty()) {
        field(1, "Message", message);
    }
    nodes(&status.nodes);
    remediation(status.remediation.as_ref());
    operations(&d.operations);
    tasks(&d.tasks);
    state_changes(&d.operations);
}

fn nodes(nodes: &[v1::Node]) {
    outln!("Nodes:");
    if nodes.is_empty() {
        outln!("  (none)");
        return;
    }
    let mut table = Table::new(["  ID", "ROLE", "POWER", "VERSION", "READY", "HEALTH"]);
    for n in nodes {
        let health = match v1::NodeHealth::try_from(n.health) {
            Ok(v1::NodeHealth::Healthy) => "healthy".to_string(),
            Ok(v1::NodeHealth::NotReady) => format!("not ready: {}", n.health_reason),
            Ok(v1::NodeHealth::Unhealthy) => format!("UNHEALTHY: {}", n.health_reason),
            _ => "-".to_string(),
        };
        table.row([
            format!("  {}", n.id),
            n.role.clone(),
            n.power_state.clone(),
            n.version.clone(),
            n.ready.to_string(),
            health,
        ]);
    }
    table.print();
}

/// What automatic remediation did per node, and why it holds back now.
fn remediation(remediation: Option<&v1::Remediation>) {
    let Some(r) = remediation.filter(|r| !r.message.is_empty() || !r.nodes.is_empty()) else {
        return;
    };
    outln!("Remediation:");
    if !r.message.is_empty() {
        field(1, "Held back", &r.message);
    }
    if r.nodes.is_empty() {
        return;
    }
    let mut table = Table::new(["  NODE", "ATTEMPTS", "RETRIES LEFT", "LAST"]);
    for n in &r.nodes {
        table.row([
            format!("  {}", n.node_id),
            n.attempts.to_string(),
            n.retries_left.to_string(),
            format!("{} ago", age(n.last_started_at.as_ref())),
        ]);
    }
    table.print();
}

/// The operations, newest first, then the steps of the newest one and the
/// owners (replica, epoch) that ran it.
fn operations(ops: &[v1::Operation]) {
    outln!("Operations:");
    let Some(newest) = ops.first() else {
        outln!("  (none)");
        return;
    };
    let mut table = Table::new(["  ID", "KIND", "STATE", "STEP", "AGE", "DETAIL"]);
    for op in ops.iter().take(10) {
        let step = op
            .progress
            .as_ref()
            .map(|p| format!("{}/{} {}", p.step, p.total_steps, p.step_name))
            .unwrap_or_default();
        table.row([
            format!("  {}", op.id),
            op_kind(op.kind),
            op_state(op.state),
            step,
            age(op.created_at.as_ref()),
            op.error
                .as_ref()
                .map(|e| e.message.clone())
                .unwrap_or_default(),
        ]);
    }
    table.print();
    let runs: Vec<String> = newest
        .runs
        .iter()
        .map(|r| format!("{} (epoch {})", r.replica, r.epoch))
        .collect();
    field(1, "Newest run by", &runs.join(", then "));
}

fn tasks(tasks: &[v1::Task]) {
    outln!("Tasks:");
    if tasks.is_empty() {
        outln!("  (none)");
        return;
    }
    task::print_tasks(Output::Table, tasks, true);
}

/// The state changes the operations made, oldest first: each accepted
/// operation moved the cluster from one state into its transitional one.
fn state_changes(ops: &[v1::Operation]) {
    outln!("State changes:");
    if ops.is_empty() {
        outln!("  (none)");
        return;
    }
    for op in ops.iter().rev() {
        let ended = match op.finished_at.as_ref() {
            Some(at) => format!(", {} {} ago", op_state(op.state), age(Some(at))),
            None => String::new(),
        };
        outln!(
            "  {:>5} ago  {} -> {}  ({} {}{ended})",
            age(op.created_at.as_ref()),
            state_name(Some(op.from_state)),
            state_name(Some(op.entered_state)),
            op_kind(op.kind).to_ascii_lowercase(),
            op.id,
        );
    }
}

fn state_name(state: Option<i32>) -> String {
    enum_name(
        v1::ClusterState::try_from(state.unwrap_or_default()).map(|s| s.as_str_name()),
        "CLUSTER_STATE_",
    )
}

fn op_kind(kind: i32) -> String {
    enum_name(
        v1::OperationKind::try_from(kind).map(|k| k.as_str_name()),
        "OPERATION_KIND_",
    )
}

fn op_state(state: i32) -> String {
    enum_name(
        v1::OperationState::try_from(state).map(|s| s.as_str_name()),
        "OPERATION_STATE_",
    )
}
