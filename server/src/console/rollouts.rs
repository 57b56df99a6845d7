//! The console's rollouts: the list, one rollout, and the user's controls
//! (pause, resume, approve, cancel). Every answer comes from the
//! Rollouts service's own gRPC handlers, so the console and `droverctl`
//! cannot disagree on what a rollout is or what a control does.

use super::actions::audited;
use super::body::read_json;
use super::http::{answer_of, from_status, json, rpc_path, Answer};
use super::Console;
use crate::audit::RequestAudit;
use drover_proto::v1::{self, rollouts_server::Rollouts};
use hyper::body::{Body, Bytes};
use hyper::{HeaderMap, StatusCode};
use serde::Deserialize;

/// A control of a rollout, as `POST /ui/api/rollouts/<name>/<action>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Pause,
    Resume,
    Approve,
    Cancel,
}

impl Action {
    const ALL: [Action; 4] = [
        Action::Pause,
        Action::Resume,
        Action::Approve,
        Action::Cancel,
    ];

    /// The action a path segment names.
    pub(super) fn parse(segment: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == segment)
    }

    fn name(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Approve => "approve",
            Action::Cancel => "cancel",
        }
    }

    /// The gRPC method it mirrors, whose role it needs.
    pub(super) fn rpc(self) -> &'static str {
        match self {
            Action::Pause => "PauseRollout",
            Action::Resume => "ResumeRollout",
            Action::Approve => "ApproveRollout",
            Action::Cancel => "CancelRollout",
        }
    }
}

/// What an action's body may say: `stage` for approve, `cancel_running`
/// for cancel; pause and resume take `{}` (or nothing).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    cancel_running: bool,
}

/// `GET /ui/api/rollouts`: ListRollouts' answer.
pub(super) async fn list_answer(console: &Console) -> Answer {
    let request = tonic::Request::new(v1::ListRolloutsRequest {});
    answer_of(console.rollouts.list_rollouts(request).await)
}

/// `GET /ui/api/rollouts/<name>`: GetRollout's answer and the actions
/// the caller's token may take.
pub(super) async fn rollout_answer(console: &Console, name: &str, headers: &HeaderMap) -> Answer {
    let request = tonic::Request::new(v1::GetRolloutRequest { name: name.into() });
    let got = console.rollouts.get_rollout(request).await;
    with_actions(console, got, headers)
}

/// `POST /ui/api/rollouts/<name>/<action>` with a JSON body, already
/// authorized as the action's RPC: the RPC's handler changes the rollout,
/// answered as [`rollout_answer`].
pub(super) async fn act<B>(
    console: &Console,
    name: &str,
    action: Action,
    (headers, audit): (&HeaderMap, RequestAudit),
    body: B,
) -> Answer
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = match read_json::<ActionBody, B>(headers, body).await {
        Ok(body) => body,
        Err(refused) => return refused.answer(),
    };
    let name = name.to_string();
    let rollouts = &console.rollouts;
    let done = match action {
        Action::Pause => {
            let request = v1::PauseRolloutRequest { name };
            rollouts.pause_rollout(audited(request, audit)).await
        }
        Action::Resume => {
            let request = v1::ResumeRolloutRequest { name };
            rollouts.resume_rollout(audited(request, audit)).await
        }
        Action::Approve => {
            let stage = body.stage;
            let request = v1::ApproveRolloutRequest { name, stage };
            rollouts.approve_rollout(audited(request, audit)).await
        }
        Action::Cancel => {
            let cancel_running = body.cancel_running;
            let request = v1::CancelRolloutRequest {
                name,
                cancel_running,
            };
            rollouts.cancel_rollout(audited(request, audit)).await
        }
    };
    with_actions(console, done, headers)
}

fn with_actions(
    console: &Console,
    rollout: Result<tonic::Response<v1::Rollout>, tonic::Status>,
    headers: &HeaderMap,
) -> Answer {
    match rollout {
        Ok(rollout) => {
            let actions = permitted(console, headers);
            let body = serde_json::json!({ "rollout": rollout.into_inner(), "actions": actions });
            json(StatusCode::OK, &body)
        }
        Err(status) => from_status(status),
    }
}

/// The actions the caller's token may take, checked as their RPCs: the
/// page shows only these buttons (and the API refuses the others anyway).
fn permitted(console: &Console, headers: &HeaderMap) -> Vec<&'static str> {
    Action::ALL
        .into_iter()
        .filter(|a| console.auth.check(&rpc_path(a.rpc()), headers).is_ok())
        .map(Action::name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_parsed_by_name() {
        assert_eq!(Action::parse("approve"), Some(Action::Approve));
        assert_eq!(Action::parse("destroy"), None);
    }
}
