//! Checks of maintenance task runs: RunTask's outcomes and idempotency
//! per run id, StopTask's fencing, and a newer epoch stopping older runs.

use super::{ok, pass, refused, skip, Cluster, Failure, Outcome, Scope, EPOCH};
use crate::Plan;
use drover_proto::provider::v1 as pb;
use std::time::Duration;
use tonic::Code;

/// The outcomes RunTask may report.
const STATUSES: [&str; 3] = ["DONE", "ERROR", "STOPPED"];
/// How long a run is given to start before the newer epoch is sent.
const HEAD_START: Duration = Duration::from_millis(200);
/// How long the simulator's runs take in the stop check, when the kit may
/// use it: long enough that only a stop ends them first.
const SIM_TASK_MS: u64 = 60_000;
/// The task name the kit's runs carry.
const TASK_NAME: &str = "drover-provider-check";

fn run_request(cluster: &Cluster, epoch: i64, run_id: &str) -> pb::RunTaskRequest {
    pb::RunTaskRequest {
        token: cluster.token(epoch),
        task_type: "repair".into(),
        task_name: TASK_NAME.into(),
        run_id: run_id.into(),
        spec: Some(Plan::repair_spec(TASK_NAME)),
    }
}

const NO_REPAIR: &str =
    "the provider offers no repair task (a backup needs a location the kit cannot know)";

pub(super) async fn task_run(s: &mut Scope<'_>) -> Outcome {
    if !s.plan().repair {
        return skip(NO_REPAIR);
    }
    let cluster = s.cluster();
    s.create(&cluster).await?;
    let run_id = uuid::Uuid::new_v4().to_string();
    let request = run_request(&cluster, EPOCH, &run_id);
    let first = s.provider().run_task(s.link().due(request.clone())).await;
    let first = ok("RunTask", first)?;
    if !STATUSES.contains(&first.status.as_str()) {
        return Err(Failure::Broken(format!(
            "RunTask answered status {:?}, not one of {STATUSES:?}",
            first.status
        )));
    }
    let again = s.provider().run_task(s.link().due(request)).await;
    let again = ok("RunTask (repeated run_id)", again)?;
    if (&again.status, &again.error) != (&first.status, &first.error) {
        return Err(Failure::Broken(format!(
            "RunTask of the same run_id answered {first:?}, then {again:?}"
        )));
    }
    pass(format!("{} twice for one run_id", first.status))
}

pub(super) async fn task_stop_unknown(s: &mut Scope<'_>) -> Outcome {
    let cluster = s.cluster();
    let stop = |epoch| pb::StopTaskRequest {
        token: cluster.token(epoch),
        run_id: uuid::Uuid::new_v4().to_string(),
    };
    let answer = s.provider().stop_task(s.link().due(stop(EPOCH + 1))).await;
    refused("StopTask (unknown run, epoch e+1)", answer, Code::NotFound)?;
    let answer = s.provider().stop_task(s.link().due(stop(EPOCH))).await;
    refused(
        "StopTask (epoch e after e+1)",
        answer,
        Code::FailedPrecondition,
    )?;
    pass("NOT_FOUND, and it fenced: epoch e refused after it")
}

/// Tries of the fenced-stop check whose run ended on its own meanwhile.
const RACE_ATTEMPTS: u32 = 3;

pub(super) async fn task_fenced_stop(s: &mut Scope<'_>) -> Outcome {
    if !s.plan().repair {
        return skip(NO_REPAIR);
    }
    let cluster = s.cluster();
    s.create(&cluster).await?;
    s.simulator(pb::SimulatorConfig {
        task_latency_ms: Some(SIM_TASK_MS),
        ..Default::default()
    })
    .await?;
    let mut outcome = stopped_by_newer_epoch(s, &cluster, EPOCH).await;
    // A run that ended on its own just as the newer epoch came (a real
    // provider's quick task) proves nothing either way: tried again under
    // the next epochs; a provider that never stops older runs fails each.
    for attempt in 1..RACE_ATTEMPTS {
        if !matches!(outcome, Err(Failure::Raced(_))) {
            break;
        }
        outcome = stopped_by_newer_epoch(s, &cluster, EPOCH + 2 * attempt as i64).await;
    }
    let outcome = outcome.map_err(|failure| match failure {
        Failure::Raced(message) => Failure::Broken(message),
        other => other,
    });
    let restored = s.simulator(pb::SimulatorConfig {
        task_latency_ms: Some(0),
        ..Default::default()
    });
    restored.await?;
    outcome
}

/// Starts a run under epoch e, fences with e+1 while it goes on, and
/// checks that the run reports STOPPED.
async fn stopped_by_newer_epoch(s: &Scope<'_>, cluster: &Cluster, epoch: i64) -> Outcome {
    let request = run_request(cluster, epoch, &uuid::Uuid::new_v4().to_string());
    let run = {
        let mut provider = s.provider();
        let request = s.link().due(request.clone());
        tokio::spawn(async move { provider.run_task(request).await })
    };
    tokio::time::sleep(HEAD_START).await;
    if run.is_finished() {
        return skip(format!(
            "the run ended within {} ms, before a newer epoch could stop it",
            HEAD_START.as_millis()
        ));
    }
    let fence = s.link().due(pb::DescribeClusterRequest {
        cluster_uid: cluster.uid.clone(),
        token: cluster.token(epoch + 1),
    });
    ok(
        "DescribeCluster (token, epoch e+1)",
        s.provider().describe_cluster(fence).await,
    )?;
    let ended = tokio::time::timeout(s.link().call_timeout, run)
        .await
        .map_err(|_| Failure::Broken("the older run went on after epoch e+1".into()))?
        .map_err(|e| Failure::Broken(format!("the RunTask call task: {e}")))?;
    let outcome = ok("RunTask (epoch e)", ended)?;
    if outcome.status != "STOPPED" {
        return Err(Failure::Raced(format!(
            "the run under epoch e reported {outcome:?} after epoch e+1, not STOPPED ({RACE_ATTEMPTS} tries)"
        )));
    }
    pass("the older epoch's run reported STOPPED once epoch e+1 came")
}
