//! The console's routes: the embedded assets (open: they hold no data) and
//! the JSON and event stream under `/ui/api/` (checked as the RPC each
//! mirrors, see the module above).

use super::actions::{self, ClusterAction};
use super::assets;
use super::feed::frame;
use super::fleet::{self, FleetError, FleetQuery, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
use super::history::timeline;
use super::rollouts::{self, Action};
use super::Console;
use crate::admin_http::AdminBody;
use drover_proto::v1::{
    self, admin_server::Admin, clusters_server::Clusters, operations_server::Operations,
    tasks_server::Tasks,
};
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::{Body, Bytes, Frame};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde::Serialize;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tonic::{Code, Status};

/// Sent on a quiet stream so that proxies keep it open and a page notices
/// a dead one.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Operations the cluster page lists (newest first); the timeline is
/// rebuilt from them.
const OPERATIONS_SHOWN: u32 = 100;

pub(super) type Answer = Response<AdminBody>;

/// Answers a request for `/ui` or anything under it. `closed` turns true
/// when the admin port closes, which ends the event streams.
pub async fn handle<B>(
    console: Arc<Console>,
    request: Request<B>,
    closed: watch::Receiver<bool>,
) -> Answer
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let (path, headers) = (parts.uri.path(), &parts.headers);
    let query = parts.uri.query().unwrap_or("");
    if let Some(asset) = assets::get(path) {
        return bytes(StatusCode::OK, asset.content_type, Bytes::from(asset.body));
    }
    let Some(api) = path.strip_prefix("/ui/api/") else {
        return error(StatusCode::NOT_FOUND, "NOT_FOUND", "no such page");
    };
    let segments: Vec<&str> = api.split('/').collect();
    let rpc = match rpc_of(&parts.method, &segments) {
        Ok(rpc) => rpc,
        Err(refused) => return refused.answer(),
    };
    if let Err(status) = console.auth.check(&rpc_path(rpc), headers) {
        if parts.method == Method::POST {
            console.audit_refusal(rpc, action_target(&segments), headers, &status);
        }
        return from_status(status);
    }
    // What an action's handler writes its audit line with.
    let audit = console.request_audit(rpc, headers);
    match segments.as_slice() {
        ["fleet"] => {
            let may = |rpc| console.auth.check(&rpc_path(rpc), headers).is_ok();
            fleet_answer(&console, query, may("GetOwner"), may("CancelOperation")).await
        }
        ["clusters", name] => cluster_answer(&console, &decode(name), headers).await,
        ["clusters", name, action] => {
            let action = ClusterAction::parse(action).expect("routed by rpc_of");
            actions::on_cluster(&console, &decode(name), action, (headers, audit), body).await
        }
        ["operations", cluster, id, "cancel"] => {
            let operation = (decode(cluster), decode(id));
            actions::cancel(&console, &operation, (headers, audit), body).await
        }
        ["bulk", "cancel"] => match actions::selector(query) {
            Err(refused) => refused.answer(),
            Ok(selector) if parts.method == Method::GET => {
                actions::bulk_preview(&console, &selector)
            }
            Ok(selector) => actions::bulk_cancel(&console, &selector, (headers, audit), body).await,
        },
        ["operations", cluster, id] => operation_answer(&console, &decode(cluster), id).await,
        ["members"] => members_answer(&console).await,
        ["rollouts"] => rollouts::list_answer(&console).await,
        ["rollouts", name] => rollouts::rollout_answer(&console, &decode(name), headers).await,
        ["rollouts", name, action] => {
            let action = Action::parse(action).expect("routed by rpc_of");
            rollouts::act(&console, &decode(name), action, (headers, audit), body).await
        }
        _ => events(&console, closed),
    }
}

/// The cluster or rollout an action names (for its audit line).
fn action_target<'a>(segments: &[&'a str]) -> (Option<&'a str>, Option<&'a str>) {
    match segments {
        ["clusters", name, _] | ["operations", name, _, _] => (Some(name), None),
        ["rollouts", name, _] => (None, Some(name)),
        _ => (None, None),
    }
}

/// The RPC a request under `/ui/api/` mirrors, whose role it needs: reads
/// are GETs, a rollout's actions POSTs.
fn rpc_of(method: &Method, segments: &[&str]) -> Result<&'static str, Refused> {
    let (rpc, wanted) = match segments {
        ["fleet"] => ("ListClusters", Method::GET),
        ["clusters", _] => ("GetCluster", Method::GET),
        ["clusters", _, action] => match ClusterAction::parse(action) {
            Some(action) => (action.rpc(), Method::POST),
            None => return Err(Refused::not_found("no such action")),
        },
        ["operations", _, _] => ("GetOperation", Method::GET),
        ["operations", _, _, "cancel"] => ("CancelOperation", Method::POST),
        // The count first (a read), then the cancel, confirmed by it.
        ["bulk", "cancel"] if *method == Method::GET => ("ListClusters", Method::GET),
        ["bulk", "cancel"] => ("CancelOperation", Method::POST),
        ["members"] => ("ListMembers", Method::GET),
        ["events"] => ("WatchClusters", Method::GET),
        ["rollouts"] => ("ListRollouts", Method::GET),
        ["rollouts", _] => ("GetRollout", Method::GET),
        ["rollouts", _, action] => match Action::parse(action) {
            Some(action) => (action.rpc(), Method::POST),
            None => return Err(Refused::not_found("no such action")),
        },
        _ => return Err(Refused::not_found("no such API path")),
    };
    if *method != wanted {
        return Err(Refused {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: "Unimplemented",
            message: format!("this path takes {wanted}"),
        });
    }
    Ok(rpc)
}

/// A request refused before any handler ran (an [`Answer`] is too large
/// to pass around in a `Result`).
pub(super) struct Refused {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
}

impl Refused {
    fn not_found(message: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "NOT_FOUND",
            message: message.to_string(),
        }
    }

    pub(super) fn answer(self) -> Answer {
        error(self.status, self.code, &self.message)
    }
}

pub(super) fn rpc_path(method: &str) -> String {
    let service = match method {
        "GetOperation" | "CancelOperation" => "Operations",
        "ListMembers" | "GetOwner" => "Admin",
        _ if method.ends_with("Rollout") || method.ends_with("Rollouts") => "Rollouts",
        _ => "Clusters",
    };
    format!("/drover.v1.{service}/{method}")
}

/// The fleet page; `may_cancel` says whether the page offers the bulk
/// cancel (the caller may cancel operations).
async fn fleet_answer(
    console: &Console,
    query: &str,
    show_owners: bool,
    may_cancel: bool,
) -> Answer {
    let query = match parse_fleet_query(query) {
        Ok(query) => query,
        Err(e) => return from_fleet_error(e),
    };
    let operations = &console.operations;
    let page = fleet::fleet_page(
        &console.cache,
        operations.store(),
        operations.keys(),
        &query,
        show_owners,
    )
    .await;
    match page.map(serde_json::to_value) {
        Ok(Ok(mut page)) => {
            page["may_cancel"] = may_cancel.into();
            json(StatusCode::OK, &page)
        }
        Ok(Err(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal",
            &e.to_string(),
        ),
        Err(e) => from_fleet_error(e),
    }
}

/// `state=CLUSTER_STATE_RUNNING&label=k=v,k2=v2&page=0&page_size=100`.
pub(super) fn parse_fleet_query(query: &str) -> Result<FleetQuery, FleetError> {
    let invalid = |field, message: String| FleetError::InvalidArgument { field, message };
    let mut parsed = FleetQuery {
        page_size: DEFAULT_PAGE_SIZE,
        ..FleetQuery::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value);
        match key {
            "state" if value.is_empty() => {}
            "state" => {
                let state = v1::ClusterState::from_str_name(&value)
                    .and_then(crate::api::convert::state_from_proto)
                    .ok_or_else(|| invalid("state", format!("{value:?} is not a cluster state")))?;
                parsed.state = Some(state);
            }
            "label" => {
                parsed.labels = crate::api::parse_label_selector(&value)
                    .map_err(|e| invalid("label", e.to_string()))?;
            }
            "page" => {
                parsed.page = value
                    .parse()
                    .map_err(|_| invalid("page", format!("{value:?} is not a page number")))?;
            }
            "page_size" => {
                parsed.page_size = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE_SIZE).contains(n))
                    .ok_or_else(|| invalid("page_size", format!("must be 1..={MAX_PAGE_SIZE}")))?;
            }
            _ => {}
        }
    }
    Ok(parsed)
}

async fn cluster_answer(console: &Console, name: &str, headers: &HeaderMap) -> Answer {
    let get = v1::GetClusterRequest {
        name: name.to_string(),
        linearizable: false,
    };
    let list = v1::ListOperationsRequest {
        cluster: name.to_string(),
        page_size: OPERATIONS_SHOWN,
        page_token: String::new(),
    };
    let tasks = v1::ListTasksRequest {
        cluster: name.to_string(),
    };
    let (cluster, operations, tasks) = tokio::join!(
        console.clusters.get_cluster(tonic::Request::new(get)),
        console
            .operations_api
            .list_operations(tonic::Request::new(list)),
        console.tasks.list_tasks(tonic::Request::new(tasks)),
    );
    let answer = (|| {
        let cluster = cluster?.into_inner();
        let operations = operations?.into_inner().operations;
        let tasks = tasks?.into_inner().tasks;
        let history = timeline(&cluster, &operations);
        Ok::<_, Status>(serde_json::json!({
            "cluster": cluster,
            "operations": operations,
            "tasks": tasks,
            "history": history,
            "actions": permitted(console, headers),
        }))
    })();
    match answer {
        Ok(body) => json(StatusCode::OK, &body),
        Err(status) => from_status(status),
    }
}

/// The cluster and operation actions the caller's token may take,
/// checked as their RPCs: the page shows only these buttons (and the API
/// refuses the others anyway).
fn permitted(console: &Console, headers: &HeaderMap) -> Vec<&'static str> {
    let may = |rpc: &str| console.auth.check(&rpc_path(rpc), headers).is_ok();
    let mut allowed: Vec<&'static str> = ClusterAction::ALL
        .into_iter()
        .filter(|a| may(a.rpc()))
        .map(ClusterAction::name)
        .collect();
    if may("CancelOperation") {
        allowed.push("cancel");
    }
    allowed
}

async fn operation_answer(console: &Console, cluster: &str, id: &str) -> Answer {
    let get = v1::GetOperationRequest {
        cluster: cluster.to_string(),
        id: id.to_string(),
    };
    match console
        .operations_api
        .get_operation(tonic::Request::new(get))
        .await
    {
        Ok(operation) => {
            let steps = console.feed.steps(cluster, id);
            let body = serde_json::json!({ "operation": operation.into_inner(), "steps": steps });
            json(StatusCode::OK, &body)
        }
        Err(status) => from_status(status),
    }
}

async fn members_answer(console: &Console) -> Answer {
    let listed = console
        .admin
        .list_members(tonic::Request::new(v1::ListMembersRequest {}))
        .await;
    match listed {
        Ok(members) => {
            let mut clusters = 0;
            console.cache.visit_briefs(|_, _| clusters += 1);
            let members = members.into_inner().members;
            let body = serde_json::json!({ "members": members, "clusters": clusters });
            json(StatusCode::OK, &body)
        }
        Err(status) => from_status(status),
    }
}

/// The event stream: the feed's frames, a `reset` when this page fell
/// behind, a comment every [`KEEP_ALIVE`]; it ends when the port closes.
fn events(console: &Console, mut closed: watch::Receiver<bool>) -> Answer {
    let mut feed = console.feed.subscribe();
    let (sender, receiver) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let hello = frame("hello", &serde_json::json!({}));
        if sender.send(hello).await.is_err() {
            return;
        }
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        loop {
            let next = tokio::select! {
                _ = closed.wait_for(|closed| *closed) => return,
                _ = sender.closed() => return,
                _ = keep_alive.tick() => Bytes::from_static(b": keep-alive\n\n"),
                event = feed.recv() => match event {
                    Ok(frame) => frame,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        frame("reset", &serde_json::json!({}))
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if sender.send(next).await.is_err() {
                return;
            }
        }
    });
    let stream = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(receiver),
        |bytes| Ok::<_, Infallible>(Frame::data(bytes)),
    );
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-store")
        .body(Either::Right(StreamBody::new(stream).boxed_unsync()))
        .expect("static response parts are valid")
}

/// Percent-decoding of a query value or path segment (`+` is a space in
/// a query, as browsers' forms send it).
pub(super) fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (byte, _) => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bytes(status: StatusCode, content_type: &str, body: Bytes) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        .body(Either::Left(Full::new(body)))
        .expect("static response parts are valid")
}

pub(super) fn json(status: StatusCode, body: &impl Serialize) -> Answer {
    let body = serde_json::to_vec(body).expect("console answers serialize");
    bytes(status, "application/json", Bytes::from(body))
}

pub(super) fn error(status: StatusCode, code: &str, message: &str) -> Answer {
    let body = serde_json::json!({ "code": code, "message": message });
    let mut answer = json(status, &body);
    if status == StatusCode::UNAUTHORIZED {
        // Not `Bearer`: a browser would otherwise show its own login box.
        let value = hyper::header::HeaderValue::from_static("Console-Bearer");
        answer.headers_mut().insert("www-authenticate", value);
    }
    answer
}

/// A handler's answer as JSON, or its status as an HTTP error.
pub(super) fn answer_of<T: Serialize>(result: Result<tonic::Response<T>, Status>) -> Answer {
    match result {
        Ok(answer) => json(StatusCode::OK, &answer.into_inner()),
        Err(status) => from_status(status),
    }
}

pub(super) fn from_status(status: Status) -> Answer {
    let http = match status.code() {
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        // A rollout that ended, or a control that lost a race: say so.
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(http, &format!("{:?}", status.code()), status.message())
}

fn from_fleet_error(e: FleetError) -> Answer {
    let (status, code) = match &e {
        FleetError::InvalidArgument { .. } => (StatusCode::BAD_REQUEST, "InvalidArgument"),
        FleetError::NotReady | FleetError::Store(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, "Unavailable")
        }
    };
    error(status, code, &e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterState;

    #[test]
    fn fleet_queries_parse_or_name_the_field() {
        let query = parse_fleet_query(
            "state=CLUSTER_STATE_RUNNING&label=team%3Dblue%2Ctier%3Dgold&page=2&page_size=50",
        )
        .expect("a valid query");
        assert_eq!(query.state, Some(ClusterState::Running));
        assert_eq!(
            query.labels,
            [
                ("team".into(), "blue".into()),
                ("tier".into(), "gold".into())
            ]
        );
        assert_eq!((query.page, query.page_size), (2, 50));
        assert_eq!(parse_fleet_query("").unwrap().page_size, DEFAULT_PAGE_SIZE);
        for (bad, field) in [
            ("state=RUNNING", "state"),
            ("label=nolabel", "label"),
            ("page=-1", "page"),
            ("page_size=0", "page_size"),
            ("page_size=501", "page_size"),
        ] {
            match parse_fleet_query(bad) {
                Err(FleetError::InvalidArgument { field: named, .. }) => {
                    assert_eq!(named, field, "{bad}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert_eq!(decode("a%2Fb+c%zz"), "a/b c%zz");
    }
}
