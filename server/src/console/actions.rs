//! The console's actions on clusters and operations: pause and unpause a
//! cluster, suspend and resume its task runs, cancel an operation, and
//! cancel the running operations of every cluster a label selector picks
//! (asked for the count first). Each goes through the RPC handler it
//! mirrors (UpdateCluster, CancelOperation), so the console and
//! `droverctl` cannot disagree on what an action does; the route was
//! already authorized as that RPC.

use super::body::read_json;
use super::http::{answer_of, from_status, json, Answer, Refused};
use super::Console;
use crate::audit::RequestAudit;
use crate::cluster::ClusterFilter;
use drover_proto::v1::{self, clusters_server::Clusters, operations_server::Operations};
use hyper::body::{Body, Bytes};
use hyper::{HeaderMap, StatusCode};
use serde::Deserialize;

/// An action on one cluster, as `POST /ui/api/clusters/<name>/<action>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClusterAction {
    Pause,
    Unpause,
    SuspendTasks,
    ResumeTasks,
    Recover,
}

impl ClusterAction {
    pub(super) const ALL: [ClusterAction; 5] = [
        ClusterAction::Pause,
        ClusterAction::Unpause,
        ClusterAction::SuspendTasks,
        ClusterAction::ResumeTasks,
        ClusterAction::Recover,
    ];

    pub(super) fn parse(segment: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == segment)
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            ClusterAction::Pause => "pause",
            ClusterAction::Unpause => "unpause",
            ClusterAction::SuspendTasks => "suspend-tasks",
            ClusterAction::ResumeTasks => "resume-tasks",
            ClusterAction::Recover => "recover",
        }
    }

    /// The gRPC method it mirrors, whose role it needs: a Recover is an
    /// operation; the others edit the spec.
    pub(super) fn rpc(self) -> &'static str {
        match self {
            ClusterAction::Recover => "RecoverCluster",
            _ => "UpdateCluster",
        }
    }

    /// The spec edit it is; `None` for Recover, an operation.
    fn update(self, name: String) -> Option<v1::UpdateClusterRequest> {
        let request = v1::UpdateClusterRequest {
            name,
            ..Default::default()
        };
        Some(match self {
            ClusterAction::Pause => v1::UpdateClusterRequest {
                paused: Some(true),
                ..request
            },
            ClusterAction::Unpause => v1::UpdateClusterRequest {
                paused: Some(false),
                ..request
            },
            ClusterAction::SuspendTasks => v1::UpdateClusterRequest {
                suspend_tasks: Some(v1::TaskSuspension::default()),
                ..request
            },
            ClusterAction::ResumeTasks => v1::UpdateClusterRequest {
                resume_tasks: true,
                ..request
            },
            ClusterAction::Recover => return None,
        })
    }
}

/// `POST /ui/api/clusters/<name>/<action>` (body `{}`): the cluster as the
/// update left it, or for `recover` the operation it started.
pub(super) async fn on_cluster<B>(
    console: &Console,
    name: &str,
    action: ClusterAction,
    (headers, audit): (&HeaderMap, RequestAudit),
    body: B,
) -> Answer
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Err(refused) = read_json::<NoFields, B>(headers, body).await {
        return refused.answer();
    }
    let Some(update) = action.update(name.to_string()) else {
        return recover(console, name, audit).await;
    };
    let updated = console.clusters.update_cluster(audited(update, audit));
    answer_of(updated.await)
}

/// A Recover of `name`, accepted as any RecoverCluster call is; 503 on a
/// replica that runs no operations.
async fn recover(console: &Console, name: &str, audit: RequestAudit) -> Answer {
    let Some(clusters) = console.lifecycle.get() else {
        let status = tonic::Status::unavailable("this replica runs no operations (no provider)");
        return from_status(status);
    };
    let request = v1::RecoverClusterRequest {
        name: name.to_string(),
        request_id: String::new(),
        ..Default::default()
    };
    answer_of(clusters.recover_cluster(audited(request, audit)).await)
}

/// `POST /ui/api/operations/<cluster>/<id>/cancel` (body `{}`): the
/// operation as the cancel left it.
pub(super) async fn cancel<B>(
    console: &Console,
    (cluster, id): &(String, String),
    (headers, audit): (&HeaderMap, RequestAudit),
    body: B,
) -> Answer
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Err(refused) = read_json::<NoFields, B>(headers, body).await {
        return refused.answer();
    }
    let request = v1::CancelOperationRequest {
        cluster: cluster.clone(),
        id: id.clone(),
    };
    let cancelled = console
        .operations_api
        .cancel_operation(audited(request, audit));
    answer_of(cancelled.await)
}

/// `message` as a request whose handler writes its audit line with
/// `audit` (one line per cancelled operation in a bulk cancel).
pub(super) fn audited<M>(message: M, audit: RequestAudit) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(audit);
    request
}

/// The body of an action that takes no option.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// The body of a bulk cancel: the count the person confirmed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Confirmed {
    #[serde(default)]
    count: Option<usize>,
}

/// The running operations of the clusters carrying every label of
/// `selector`, as the cache shows them: (cluster, operation id).
fn running_operations(console: &Console, selector: &[(String, String)]) -> Vec<(String, String)> {
    let filter = ClusterFilter {
        state: None,
        labels: selector.to_vec(),
    };
    let mut names = Vec::new();
    console.cache.visit_briefs(|name, brief| {
        if brief.state.busy && brief.matches(&filter) {
            names.push(name.to_string());
        }
    });
    let mut running: Vec<(String, String)> = names
        .into_iter()
        .filter_map(|name| console.cache.get(&name).and_then(Result::ok))
        .filter_map(|c| Some((c.spec.name, c.state.operation?.id)))
        .collect();
    running.sort();
    running
}

/// The label selector of a bulk action (`label=k=v,k2=v2`): required, so
/// a bulk action never takes the whole fleet by a missing parameter.
pub(super) fn selector(query: &str) -> Result<Vec<(String, String)>, Refused> {
    let invalid = |message: String| Refused {
        status: StatusCode::BAD_REQUEST,
        code: "InvalidArgument",
        message,
    };
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("label="))
        .map(super::http::decode)
        .unwrap_or_default();
    if value.is_empty() {
        return Err(invalid("label: a selector (k=v,...) is required".into()));
    }
    crate::api::parse_label_selector(&value).map_err(|e| invalid(format!("label: {e}")))
}

/// `GET /ui/api/bulk/cancel?label=...`: how many running operations a
/// bulk cancel would cancel, and which.
pub(super) fn bulk_preview(console: &Console, selector: &[(String, String)]) -> Answer {
    let running = running_operations(console, selector);
    json(StatusCode::OK, &preview(&running))
}

fn preview(running: &[(String, String)]) -> serde_json::Value {
    let operations: Vec<_> = running
        .iter()
        .map(|(cluster, id)| serde_json::json!({ "cluster": cluster, "id": id }))
        .collect();
    serde_json::json!({ "count": running.len(), "operations": operations })
}

/// `POST /ui/api/bulk/cancel?label=...` with `{"count": N}`: cancels the
/// running operations of the selected clusters when there are still N of
/// them (else 409 with the new count and nothing cancelled), and answers
/// each one's outcome.
pub(super) async fn bulk_cancel<B>(
    console: &Console,
    selector: &[(String, String)],
    (headers, audit): (&HeaderMap, RequestAudit),
    body: B,
) -> Answer
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let confirmed = match read_json::<Confirmed, B>(headers, body).await {
        Ok(body) => body.count,
        Err(refused) => return refused.answer(),
    };
    let running = running_operations(console, selector);
    if confirmed != Some(running.len()) {
        let mut body = preview(&running);
        body["code"] = "FailedPrecondition".into();
        body["message"] = format!(
            "{} running operations match now: confirm that count (\"count\") to cancel them",
            running.len()
        )
        .into();
        return json(StatusCode::CONFLICT, &body);
    }
    let mut outcomes = Vec::with_capacity(running.len());
    for (cluster, id) in running {
        let request = v1::CancelOperationRequest {
            cluster: cluster.clone(),
            id: id.clone(),
        };
        let request = audited(request, audit.clone());
        let cancelled = console.operations_api.cancel_operation(request);
        let error = cancelled
            .await
            .err()
            .map(|status| status.message().to_string());
        outcomes.push(serde_json::json!({ "cluster": cluster, "id": id, "error": error }));
    }
    json(
        StatusCode::OK,
        &serde_json::json!({ "cancelled": outcomes }),
    )
}
