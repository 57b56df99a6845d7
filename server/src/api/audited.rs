//! The audit line of each request that changes something, written by its
//! handler: what the request names (its cluster or rollout, its request
//! id) and what came of it (the operation it started or acted on, or the
//! status it was refused with).
//!
//! A handler takes a [`Pending`] line from the request before consuming
//! it and finishes it with its result; the caller and the method come
//! from the [`RequestAudit`] the auth layer left in the request. A request
//! without one (called in-process, not through the gRPC server) writes no
//! line.

use crate::audit::{Entry, Outcome, RequestAudit};
use drover_proto::v1;
use tonic::{Request, Response, Status};

/// What a request's line names.
pub(super) enum Target {
    Cluster(String),
    Rollout(String),
}

/// A request message that changes something.
pub(super) trait Audited {
    fn target(&self) -> Target;

    /// Its request id, for the messages that carry one.
    fn request_id(&self) -> &str {
        ""
    }
}

/// `Audited` for messages naming their cluster or rollout in `field`, and
/// carrying their request id in `request_id` when said.
macro_rules! audited {
    ($($request:ty: $target:ident = $field:ident $(, $id:ident)?;)*) => {$(
        impl Audited for $request {
            fn target(&self) -> Target {
                Target::$target(self.$field.clone())
            }
            $(
                fn request_id(&self) -> &str {
                    &self.$id
                }
            )?
        }
    )*};
}

audited! {
    v1::CreateClusterRequest: Cluster = name, request_id;
    v1::UpdateClusterRequest: Cluster = name;
    v1::StartClusterRequest: Cluster = name, request_id;
    v1::StopClusterRequest: Cluster = name, request_id;
    v1::ScaleClusterRequest: Cluster = name, request_id;
    v1::UpgradeClusterRequest: Cluster = name, request_id;
    v1::AddNodesRequest: Cluster = name, request_id;
    v1::RemoveNodesRequest: Cluster = name, request_id;
    v1::RecoverClusterRequest: Cluster = name, request_id;
    v1::DeleteClusterRequest: Cluster = name, request_id;
    v1::CancelOperationRequest: Cluster = cluster;
    v1::AbandonOperationRequest: Cluster = cluster;
    v1::PutTaskRequest: Cluster = cluster;
    v1::DeleteTaskRequest: Cluster = cluster;
    v1::CreateRolloutRequest: Rollout = name;
    v1::PauseRolloutRequest: Rollout = name;
    v1::ResumeRolloutRequest: Rollout = name;
    v1::ApproveRolloutRequest: Rollout = name;
    v1::CancelRolloutRequest: Rollout = name;
}

/// A response message: the operation it started or acted on, if any.
pub(super) trait Answered {
    fn operation_id(&self) -> Option<&str> {
        None
    }
}

impl Answered for v1::Operation {
    fn operation_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

impl Answered for v1::CreateClusterResponse {
    fn operation_id(&self) -> Option<&str> {
        self.operation
            .as_ref()
            .map(|operation| operation.id.as_str())
    }
}

impl Answered for v1::Cluster {}
impl Answered for v1::Task {}
impl Answered for v1::DeleteTaskResponse {}
impl Answered for v1::Rollout {}

/// A request's line, waiting for its outcome.
pub(super) struct Pending {
    audit: Option<RequestAudit>,
    target: Target,
    request_id: String,
}

/// The line of `request`, to be finished with its result.
pub(super) fn pending<M: Audited>(request: &Request<M>) -> Pending {
    let message = request.get_ref();
    let audit = request.extensions().get::<RequestAudit>().cloned();
    if let Some(audit) = &audit {
        // On the request's span (when traced): who asked for what follows.
        let span = tracing::Span::current();
        span.record("enduser.id", audit.caller.name.as_deref().unwrap_or(""));
        span.record("enduser.role", audit.caller.role.as_str());
    }
    Pending {
        audit,
        target: message.target(),
        request_id: message.request_id().to_string(),
    }
}

impl Pending {
    /// Writes the line with `result`'s outcome, and returns the answer.
    pub(super) fn finish<T: Answered, E: Into<Status>>(
        self,
        result: Result<T, E>,
    ) -> Result<Response<T>, Status> {
        let result = result.map_err(Into::into);
        let Some(audit) = self.audit else {
            return result.map(Response::new);
        };
        let outcome = match &result {
            Ok(answer) => Outcome::Accepted {
                operation_id: answer.operation_id().map(str::to_string),
            },
            Err(status) => Outcome::refused(status),
        };
        let (cluster, rollout) = match &self.target {
            Target::Cluster(name) => (Some(name.as_str()), None),
            Target::Rollout(name) => (None, Some(name.as_str())),
        };
        audit.log.write(&Entry {
            caller: &audit.caller,
            method: &audit.method,
            cluster: cluster.filter(|name| !name.is_empty()),
            rollout: rollout.filter(|name| !name.is_empty()),
            request_id: &self.request_id,
            outcome,
        });
        result.map(Response::new)
    }
}
