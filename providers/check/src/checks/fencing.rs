//! Checks of fencing, draining, deadlines and the error codes of bad
//! calls: a refused call must change nothing, so each refusal is followed
//! by a describe that must show the nodes as they were.

use super::{idents, ok, pass, refused, skip, Cluster, Failure, Outcome, Scope, EPOCH};
use drover_proto::provider::v1 as pb;
use std::time::{Duration, Instant};
use tonic::{Code, Response, Status};

/// How long the older call of the drain check is given to reach the
/// provider before the newer epoch is sent.
const HEAD_START: Duration = Duration::from_millis(100);
/// How late the simulator lands the older call of the drain check, when
/// the kit may use it: long enough that only a drain ends it first.
const SIM_LATE_MS: u64 = 10_000;

/// Checks that `call` was refused INVALID_ARGUMENT naming the token.
fn invalid_token<T>(call: &str, answer: Result<Response<T>, Status>) -> Result<(), Failure> {
    let status = refused(call, answer, Code::InvalidArgument)?;
    if !status.message().contains("token") {
        return Err(Failure::Broken(format!(
            "{call}: INVALID_ARGUMENT {:?} does not name the field (token)",
            status.message()
        )));
    }
    Ok(())
}

pub(super) async fn missing_token(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let (mut p, l) = (s.provider(), s.link());
    let create = pb::CreateNodesRequest {
        token: None,
        ..s.create_request(&cluster, EPOCH)
    };
    invalid_token("CreateNodes", p.create_nodes(l.due(create)).await)?;
    let power = pb::PowerRequest {
        node_ids: Vec::new(),
        token: None,
    };
    invalid_token("StartNodes", p.start_nodes(l.due(power.clone())).await)?;
    invalid_token("StopNodes", p.stop_nodes(l.due(power.clone())).await)?;
    let delete = pb::DeleteNodesRequest::default();
    invalid_token("DeleteNodes", p.delete_nodes(l.due(delete)).await)?;
    let resize = pb::ResizeNodesRequest::default();
    invalid_token("ResizeNodes", p.resize_nodes(l.due(resize)).await)?;
    let upgrade = pb::UpgradeNodeRequest::default();
    invalid_token("UpgradeNode", p.upgrade_node(l.due(upgrade)).await)?;
    match p.repair_nodes(l.due(power)).await {
        Err(status) if status.code() == Code::Unimplemented => {}
        answer => invalid_token("RepairNodes", answer)?,
    }
    let run = pb::RunTaskRequest {
        run_id: uuid::Uuid::new_v4().to_string(),
        task_type: "repair".into(),
        ..Default::default()
    };
    invalid_token("RunTask", p.run_task(l.due(run)).await)?;
    let stop = pb::StopTaskRequest::default();
    invalid_token("StopTask", p.stop_task(l.due(stop)).await)?;
    let no_uid = pb::CreateNodesRequest {
        token: Some(pb::FencingToken {
            cluster_uid: String::new(),
            ..cluster.token(EPOCH).unwrap_or_default()
        }),
        ..s.create_request(&cluster, EPOCH)
    };
    invalid_token(
        "CreateNodes (empty cluster_uid)",
        p.create_nodes(l.due(no_uid)).await,
    )?;
    let nodes = s.describe(&cluster).await?;
    if !nodes.is_empty() {
        return Err(Failure::Broken(format!(
            "refused CreateNodes made nodes: {:?}",
            idents(&nodes)
        )));
    }
    pass("every call without a token (or cluster uid) refused INVALID_ARGUMENT")
}

pub(super) async fn unknown_cluster(s: &mut Scope<'_>) -> Outcome {
    let unknown = s.cluster();
    let (mut p, l) = (s.provider(), s.link());
    let power = pb::PowerRequest {
        node_ids: Vec::new(),
        token: unknown.token(EPOCH),
    };
    refused(
        "StartNodes",
        p.start_nodes(l.due(power.clone())).await,
        Code::NotFound,
    )?;
    refused(
        "StopNodes",
        p.stop_nodes(l.due(power)).await,
        Code::NotFound,
    )?;
    let resize = pb::ResizeNodesRequest {
        token: unknown.token(EPOCH),
        worker_nodes: Some(s.plan().worker_nodes),
        offering: None,
    };
    refused(
        "ResizeNodes",
        p.resize_nodes(l.due(resize)).await,
        Code::NotFound,
    )?;
    let cluster = s.cluster();
    let (mut p, l) = (s.provider(), s.link());
    let created = s.create(&cluster).await?;
    let upgrade = pb::UpgradeNodeRequest {
        token: cluster.token(EPOCH),
        node_id: "no-such-node".into(),
        version: s.plan().upgrade_to.clone(),
    };
    let call = "UpgradeNode (unknown node)";
    refused(call, p.upgrade_node(l.due(upgrade)).await, Code::NotFound)?;
    s.agrees(call, &cluster, &created).await?;
    pass("Start/Stop/ResizeNodes of an unknown cluster and UpgradeNode of an unknown node: NOT_FOUND")
}

/// Checks that `call` was refused as stale and that the nodes are still
/// `before`.
async fn stale<T>(
    s: &Scope<'_>,
    cluster: &Cluster,
    call: &str,
    answer: Result<Response<T>, Status>,
    before: &[pb::ProviderNode],
) -> Result<(), Failure> {
    refused(call, answer, Code::FailedPrecondition)?;
    s.agrees(call, cluster, before).await
}

pub(super) async fn stale_token_refused(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    s.create(&cluster).await?;
    let newer = s.link().due(pb::PowerRequest {
        node_ids: Vec::new(),
        token: cluster.token(EPOCH + 1),
    });
    let nodes = ok(
        "StartNodes (epoch e+1)",
        s.provider().start_nodes(newer).await,
    )?
    .nodes;
    let older = s.link().due(pb::PowerRequest {
        node_ids: Vec::new(),
        token: cluster.token(EPOCH),
    });
    let answer = s.provider().stop_nodes(older).await;
    stale(s, &cluster, "StopNodes (epoch e after e+1)", answer, &nodes).await?;
    pass("StopNodes under epoch e after e+1: FAILED_PRECONDITION, nothing changed")
}

pub(super) async fn fenced_describe(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let created = s.create(&cluster).await?;
    let fence = s.link().due(pb::DescribeClusterRequest {
        cluster_uid: cluster.uid.clone(),
        token: cluster.token(EPOCH + 1),
    });
    let call = "DescribeCluster (token, epoch e+1)";
    let nodes = ok(call, s.provider().describe_cluster(fence).await)?.nodes;
    if idents(&nodes) != idents(&created) {
        return Err(Failure::Broken(format!(
            "{call} answered {:?}, CreateNodes {:?}",
            idents(&nodes),
            idents(&created)
        )));
    }
    // A call that would change something visible if it were let through.
    let workers = s.plan().resize_workers.unwrap_or(s.plan().worker_nodes);
    let older = s.link().due(pb::ResizeNodesRequest {
        token: cluster.token(EPOCH),
        worker_nodes: Some(workers),
        offering: None,
    });
    let answer = s.provider().resize_nodes(older).await;
    stale(
        s,
        &cluster,
        "ResizeNodes (epoch e after a fenced describe)",
        answer,
        &created,
    )
    .await?;
    pass("after a fenced describe under e+1, ResizeNodes under e: FAILED_PRECONDITION")
}

/// What the older call of the drain check answered, and when it ended.
type Ended = (Result<Response<pb::NodesResponse>, Status>, Instant);

pub(super) async fn drain(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    s.create(&cluster).await?;
    s.simulator(pb::SimulatorConfig {
        faults: Some("StopNodes:late=1".into()),
        fault_delay_ms: Some(SIM_LATE_MS),
        ..Default::default()
    })
    .await?;
    let started = Instant::now();
    let old = {
        let mut provider = s.provider();
        let request = s.link().due(pb::PowerRequest {
            node_ids: Vec::new(),
            token: cluster.token(EPOCH),
        });
        tokio::spawn(async move { (provider.stop_nodes(request).await, Instant::now()) })
    };
    tokio::time::sleep(HEAD_START).await;
    let fence = s.link().due(pb::DescribeClusterRequest {
        cluster_uid: cluster.uid.clone(),
        token: cluster.token(EPOCH + 1),
    });
    let fenced = s.provider().describe_cluster(fence).await;
    let fenced_at = Instant::now();
    let restored = s.simulator(pb::SimulatorConfig {
        faults: Some(String::new()),
        ..Default::default()
    });
    restored.await?;
    let fenced = ok("DescribeCluster (token, epoch e+1)", fenced)?.nodes;
    let ended = tokio::time::timeout(s.link().call_timeout, old).await;
    let ended: Ended = ended
        .map_err(|_| Failure::Broken("the older StopNodes never answered".into()))?
        .map_err(|e| Failure::Broken(format!("the older StopNodes call task: {e}")))?;
    judge_drain(s, &cluster, &fenced, ended, started, fenced_at).await
}

/// The drain rule on what was seen: an older call that answered OK must
/// have landed before the newer epoch's answer (which then shows its
/// effect); one that answered ABORTED (or was refused as stale on
/// arrival) must have applied nothing.
async fn judge_drain(
    s: &Scope<'_>,
    cluster: &Cluster,
    fenced: &[pb::ProviderNode],
    (answer, old_end): Ended,
    started: Instant,
    fenced_at: Instant,
) -> Outcome {
    let ms = |at: Instant| at.duration_since(started).as_millis();
    let times = format!(
        "older StopNodes ended at {} ms, the fenced describe under e+1 answered at {} ms",
        ms(old_end),
        ms(fenced_at)
    );
    let off = |nodes: &[pb::ProviderNode]| nodes.iter().all(|n| n.power_state == "off");
    let on = |nodes: &[pb::ProviderNode]| nodes.iter().all(|n| n.power_state == "on");
    match answer {
        Ok(_) if off(fenced) => pass(format!(
            "the older call ended first, its effect shown by the newer answer ({times})"
        )),
        Ok(_) => Err(Failure::Broken(format!(
            "the older StopNodes answered OK but the newer epoch's answer did not show \
             its effect: it ran beside the newer epoch ({times})"
        ))),
        Err(status) if matches!(status.code(), Code::Aborted | Code::FailedPrecondition) => {
            let after = s.describe(cluster).await?;
            if !on(fenced) || !on(&after) {
                return Err(Failure::Broken(format!(
                    "the older StopNodes answered {:?} but nodes went off: {:?} ({times})",
                    status.code(),
                    idents(&after)
                )));
            }
            pass(format!(
                "the older call answered {:?} and applied nothing ({times})",
                status.code()
            ))
        }
        Err(status) => Err(Failure::Code {
            call: "StopNodes (epoch e, in flight when e+1 came)".into(),
            code: status.code(),
            message: status.message().to_string(),
            want: Code::Aborted,
        }),
    }
}

pub(super) async fn deadline(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let created = s.create(&cluster).await?;
    let request = s.link().past_due(pb::PowerRequest {
        node_ids: Vec::new(),
        token: cluster.token(EPOCH),
    });
    let call = "StopNodes (drover-apply-by a second ago)";
    refused(
        call,
        s.provider().stop_nodes(request).await,
        Code::DeadlineExceeded,
    )?;
    s.agrees(call, &cluster, &created).await?;
    pass("a call past its drover-apply-by: DEADLINE_EXCEEDED, nothing changed")
}

/// How long the long-work check gives each call: Drover's claim window at
/// its shortest lease TTL is about this order.
const CUT_WINDOW: Duration = Duration::from_millis(500);

/// Calls the long-work check sends at most (each cut at [`CUT_WINDOW`]).
const CUT_CALLS: u32 = 12;

/// Work longer than a call's deadline: a CreateNodes cut at its deadline
/// and sent again (same request, same token) goes on with the work instead
/// of starting over, finishes, and makes the nodes once. With the
/// simulator's control service every step is made to take three windows.
pub(super) async fn long_work(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    s.simulator(pb::SimulatorConfig {
        step_latency_ms: Some(3 * CUT_WINDOW.as_millis() as u64),
        ..Default::default()
    })
    .await?;
    let sent = cut_until_done(s, &cluster).await;
    s.simulator(pb::SimulatorConfig {
        step_latency_ms: Some(0),
        ..Default::default()
    })
    .await?;
    let (cuts, nodes) = sent?;
    if cuts == 0 {
        return skip(format!(
            "CreateNodes finished within one {CUT_WINDOW:?} deadline: nothing carried across calls"
        ));
    }
    s.has_shape("CreateNodes (after cuts)", &nodes)?;
    s.agrees("CreateNodes (after cuts)", &cluster, &nodes)
        .await?;
    pass(format!(
        "CreateNodes cut {cuts} times at {CUT_WINDOW:?}, then finished, its nodes made once"
    ))
}

/// Sends the plan's CreateNodes due in [`CUT_WINDOW`] until it answers:
/// how many times it was cut, and its nodes.
async fn cut_until_done(
    s: &Scope<'_>,
    cluster: &Cluster,
) -> Result<(u32, Vec<pb::ProviderNode>), Failure> {
    for cuts in 0..CUT_CALLS {
        let request = s.create_request(cluster, EPOCH);
        let answer = s
            .provider()
            .create_nodes(s.link().due_in(request, CUT_WINDOW))
            .await;
        match answer {
            Ok(response) => return Ok((cuts, response.into_inner().nodes)),
            Err(status) if matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled) => {}
            Err(status) => {
                return Err(Failure::Rpc {
                    call: format!("CreateNodes (sent again after {cuts} cuts)"),
                    code: status.code(),
                    message: status.message().to_string(),
                })
            }
        }
    }
    Err(Failure::Broken(format!(
        "CreateNodes was cut at its {CUT_WINDOW:?} deadline {CUT_CALLS} times in a row: work longer than one deadline must go on across the repeated calls"
    )))
}
