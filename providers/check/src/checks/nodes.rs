//! Checks of what the calls do to nodes: capabilities and validation,
//! create and describe agreeing, and every mutating call converging when
//! it is sent again with the same token (as after a deadline cut it).

use super::{idents, ok, pass, skip, Cluster, Failure, Outcome, Scope, EPOCH};
use drover_proto::provider::v1 as pb;
use std::future::Future;
use tonic::{Code, Response, Status};

/// Task types the contract knows.
const TASK_TYPES: [&str; 2] = ["repair", "backup"];

pub(super) async fn capabilities(s: &mut Scope<'_>) -> Outcome {
    let answer = s
        .provider()
        .get_capabilities(s.link().due(pb::GetCapabilitiesRequest {}))
        .await;
    let caps = match answer {
        Err(status) if status.code() == Code::Unimplemented => {
            return skip("UNIMPLEMENTED: Drover assumes the default capabilities")
        }
        answer => ok("GetCapabilities", answer)?,
    };
    let mut wrong = Vec::new();
    if caps.kind.is_empty() {
        wrong.push("kind is empty".to_string());
    }
    let limits = [
        ("control", caps.min_control_nodes, caps.max_control_nodes),
        ("worker", caps.min_worker_nodes, caps.max_worker_nodes),
    ];
    for (role, min, max) in limits {
        if max > 0 && min > max {
            wrong.push(format!(
                "min_{role}_nodes {min} is above max_{role}_nodes {max}"
            ));
        }
    }
    for task_type in caps
        .task_types
        .iter()
        .filter(|t| !TASK_TYPES.contains(&t.as_str()))
    {
        wrong.push(format!(
            "task type {task_type:?} is not one of {TASK_TYPES:?}"
        ));
    }
    for (field, names) in [("versions", &caps.versions), ("offerings", &caps.offerings)] {
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != names.len() || names.iter().any(String::is_empty) {
            wrong.push(format!("{field} {names:?} has an empty or repeated name"));
        }
    }
    if s.capabilities() != Some(&caps) {
        wrong.push("two calls answered differently (callers cache it)".to_string());
    }
    if !wrong.is_empty() {
        return Err(Failure::Broken(wrong.join("; ")));
    }
    let limit = |max: u32| match max {
        0 => "any".to_string(),
        max => max.to_string(),
    };
    pass(format!(
        "kind {}, control {}..{}, workers {}..{}, versions {:?}, offerings {:?}, tasks {:?}",
        caps.kind,
        caps.min_control_nodes,
        limit(caps.max_control_nodes),
        caps.min_worker_nodes,
        limit(caps.max_worker_nodes),
        caps.versions,
        caps.offerings,
        caps.task_types
    ))
}

/// Shapes outside the capabilities, one bound crossed each, with the
/// field a refusal must name.
fn outside(
    caps: &pb::Capabilities,
    valid: &pb::ClusterShape,
) -> Vec<(&'static str, pb::ClusterShape)> {
    let mut shapes = Vec::new();
    if caps.max_control_nodes > 0 {
        let control_nodes = caps.max_control_nodes + 1;
        shapes.push((
            "control_nodes",
            pb::ClusterShape {
                control_nodes,
                ..valid.clone()
            },
        ));
    }
    if caps.max_worker_nodes > 0 {
        let worker_nodes = caps.max_worker_nodes + 1;
        shapes.push((
            "worker_nodes",
            pb::ClusterShape {
                worker_nodes,
                ..valid.clone()
            },
        ));
    }
    if !caps.versions.is_empty() {
        let version = "no-such-version".to_string();
        shapes.push((
            "version",
            pb::ClusterShape {
                version,
                ..valid.clone()
            },
        ));
    }
    if !caps.offerings.is_empty() {
        let offering = "no-such-offering".to_string();
        shapes.push((
            "node_offering",
            pb::ClusterShape {
                offering,
                ..valid.clone()
            },
        ));
    }
    shapes
}

pub(super) async fn validate_spec(s: &mut Scope<'_>) -> Outcome {
    let valid = s.plan().shape();
    let validate = |shape: pb::ClusterShape| {
        let mut provider = s.provider();
        let request = s.link().due(pb::ValidateSpecRequest {
            cluster_uid: String::new(),
            shape: Some(shape),
        });
        async move { provider.validate_spec(request).await }
    };
    let violations = match validate(valid.clone()).await {
        Err(status) if status.code() == Code::Unimplemented => {
            return skip("UNIMPLEMENTED: Drover accepts any shape its own validation does")
        }
        answer => ok("ValidateSpec", answer)?.violations,
    };
    if !violations.is_empty() {
        return Err(Failure::Broken(format!(
            "ValidateSpec refused {valid:?}, a shape within its capabilities: {violations:?}"
        )));
    }
    let Some(caps) = s.capabilities() else {
        return pass("accepts the default shape; no capabilities, so no bound to cross");
    };
    let mut refused = Vec::new();
    for (field, shape) in outside(caps, &valid) {
        let violations = ok("ValidateSpec", validate(shape.clone()).await)?.violations;
        if !violations
            .iter()
            .any(|v| v.field == field && !v.reason.is_empty())
        {
            return Err(Failure::Broken(format!(
                "ValidateSpec of {shape:?} (outside the capabilities) answered {violations:?}, \
                 no violation of {field} with a reason"
            )));
        }
        refused.push(field);
    }
    pass(format!(
        "accepts the planned shape, refuses a bad {refused:?}"
    ))
}

pub(super) async fn create_describe(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let nodes = s.create(&cluster).await?;
    pass(format!("{} nodes, described as answered", nodes.len()))
}

/// Sends `call` twice, the second as a retry of the first (same request,
/// same token), and checks that both answer the same nodes and that
/// describe agrees. Returns the nodes.
async fn twice<F, Fut>(
    s: &Scope<'_>,
    cluster: &Cluster,
    call: &str,
    send: F,
) -> Result<Vec<pb::ProviderNode>, Failure>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Response<pb::NodesResponse>, Status>>,
{
    let first = ok(call, send().await)?.nodes;
    let again = format!("{call} (repeated)");
    let second = ok(&again, send().await)?.nodes;
    if idents(&first) != idents(&second) {
        return Err(Failure::Broken(format!(
            "{call} did not converge: answered {:?}, then {:?}",
            idents(&first),
            idents(&second)
        )));
    }
    s.agrees(&again, cluster, &second).await?;
    Ok(second)
}

/// Checks that every node is in power state `power`.
fn all_powered(call: &str, nodes: &[pb::ProviderNode], power: &str) -> Result<(), Failure> {
    if nodes.is_empty() || nodes.iter().any(|n| n.power_state != power) {
        return Err(Failure::Broken(format!(
            "{call} left {:?}, not every node {power}",
            idents(nodes)
        )));
    }
    Ok(())
}

pub(super) async fn create_idempotent(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let request = s.create_request(&cluster, EPOCH);
    let nodes = twice(s, &cluster, "CreateNodes", || {
        let mut provider = s.provider();
        let request = s.link().due(request.clone());
        async move { provider.create_nodes(request).await }
    })
    .await?;
    s.has_shape("CreateNodes (repeated)", &nodes)?;
    pass(format!("the repeat found the same {} nodes", nodes.len()))
}

/// Sends StopNodes or StartNodes (`on`) twice under [`EPOCH`].
async fn power_twice(
    s: &Scope<'_>,
    cluster: &Cluster,
    on: bool,
) -> Result<Vec<pb::ProviderNode>, Failure> {
    let request = pb::PowerRequest {
        node_ids: Vec::new(),
        token: cluster.token(EPOCH),
    };
    let call = if on { "StartNodes" } else { "StopNodes" };
    let nodes = twice(s, cluster, call, || {
        let mut provider = s.provider();
        let request = s.link().due(request.clone());
        async move {
            match on {
                true => provider.start_nodes(request).await,
                false => provider.stop_nodes(request).await,
            }
        }
    })
    .await?;
    all_powered(call, &nodes, if on { "on" } else { "off" })?;
    Ok(nodes)
}

pub(super) async fn stop_idempotent(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    s.create(&cluster).await?;
    let nodes = power_twice(s, &cluster, false).await?;
    pass(format!("{} nodes off, twice", nodes.len()))
}

pub(super) async fn start_idempotent(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    s.create(&cluster).await?;
    power_twice(s, &cluster, false).await?;
    let nodes = power_twice(s, &cluster, true).await?;
    pass(format!("{} nodes on again, twice", nodes.len()))
}

pub(super) async fn resize_idempotent(s: &mut Scope<'_>) -> Outcome {
    let plan = s.plan().clone();
    if plan.resize_workers.is_none() && plan.resize_offering.is_none() {
        return skip("the capabilities allow no other worker count and name no other offering");
    }
    let cluster = s.cluster();
    s.create(&cluster).await?;
    let request = pb::ResizeNodesRequest {
        token: cluster.token(EPOCH),
        worker_nodes: plan.resize_workers,
        offering: plan.resize_offering.clone(),
    };
    let nodes = twice(s, &cluster, "ResizeNodes", || {
        let mut provider = s.provider();
        let request = s.link().due(request.clone());
        async move { provider.resize_nodes(request).await }
    })
    .await?;
    let workers = nodes.iter().filter(|n| n.role == "worker").count() as u32;
    let offering = plan.resize_offering.as_deref();
    let wrong_offering = nodes
        .iter()
        .any(|n| offering.is_some_and(|o| n.offering != o));
    if plan.resize_workers.is_some_and(|want| want != workers) || wrong_offering {
        return Err(Failure::Broken(format!(
            "ResizeNodes to {:?} workers, offering {offering:?} answered {:?}",
            plan.resize_workers,
            idents(&nodes)
        )));
    }
    pass(format!("{workers} workers, offering {offering:?}, twice"))
}

pub(super) async fn upgrade_idempotent(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let created = s.create(&cluster).await?;
    // A worker when there is one: one node's upgrade, no switchover.
    let node = created
        .iter()
        .find(|n| n.role == "worker")
        .or(created.first())
        .ok_or_else(|| Failure::Broken("CreateNodes answered no nodes".into()))?
        .id
        .clone();
    let version = s.plan().upgrade_to.clone();
    let request = pb::UpgradeNodeRequest {
        token: cluster.token(EPOCH),
        node_id: node.clone(),
        version: version.clone(),
    };
    let nodes = twice(s, &cluster, "UpgradeNode", || {
        let mut provider = s.provider();
        let request = s.link().due(request.clone());
        async move { provider.upgrade_node(request).await }
    })
    .await?;
    let upgraded = nodes.iter().find(|n| n.id == node);
    if upgraded.is_none_or(|n| n.version != version) || nodes.len() != created.len() {
        return Err(Failure::Broken(format!(
            "UpgradeNode of {node} to {version} answered {:?}",
            idents(&nodes)
        )));
    }
    pass(format!("{node} at {version}, twice"))
}

pub(super) async fn delete_idempotent(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let s = &*s;
    let created = s.create(&cluster).await?;
    let node = created
        .iter()
        .rfind(|n| n.role == "worker")
        .or(created.last())
        .ok_or_else(|| Failure::Broken("CreateNodes answered no nodes".into()))?
        .id
        .clone();
    let delete = |ids: Vec<String>| {
        let request = pb::DeleteNodesRequest {
            token: cluster.token(EPOCH),
            node_ids: ids,
        };
        move || {
            let mut provider = s.provider();
            let request = s.link().due(request.clone());
            async move { provider.delete_nodes(request).await }
        }
    };
    let left = twice(
        s,
        &cluster,
        "DeleteNodes (one node)",
        delete(vec![node.clone()]),
    )
    .await?;
    let kept: Vec<_> = created.iter().filter(|n| n.id != node).cloned().collect();
    if idents(&left) != idents(&kept) {
        return Err(Failure::Broken(format!(
            "DeleteNodes of {node} answered {:?}, expected {:?}",
            idents(&left),
            idents(&kept)
        )));
    }
    let none = twice(s, &cluster, "DeleteNodes (all)", delete(Vec::new())).await?;
    if !none.is_empty() {
        return Err(Failure::Broken(format!(
            "DeleteNodes of all nodes answered {:?}",
            idents(&none)
        )));
    }
    pass(format!(
        "{node}, then all: each repeat (nodes already gone) succeeded"
    ))
}

pub(super) async fn repair_healthy(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let created = s.create(&cluster).await?;
    let request = s.link().due(pb::PowerRequest {
        node_ids: Vec::new(),
        token: cluster.token(EPOCH),
    });
    let nodes = match s.provider().repair_nodes(request).await {
        Err(status) if status.code() == Code::Unimplemented => {
            return skip("UNIMPLEMENTED: Drover's Recover only checks health")
        }
        answer => ok("RepairNodes", answer)?.nodes,
    };
    if idents(&nodes) != idents(&created) {
        return Err(Failure::Broken(format!(
            "RepairNodes of a healthy cluster changed {:?} into {:?}",
            idents(&created),
            idents(&nodes)
        )));
    }
    s.agrees("RepairNodes", &cluster, &nodes).await?;
    pass("a healthy cluster left as it was")
}
