//! What a kind's module answers: [`KindRules`] for the accept and the
//! executor, [`LifecycleCall`] for the RPC that asks for it.
//!
//! The defaults are what most kinds do (an operator's request that leaves
//! the spec alone, plans without looking at the nodes, and stays put on a
//! go-ahead), so a kind's module states only where it differs.

use super::{OperationKind, Step};
use crate::auth::Role;
use crate::cluster::machine::Event;
use crate::cluster::validate::FieldError;
use crate::cluster::{ClusterRecord, ClusterState, Spec};
use crate::operation::{LifecycleError, OperationParams, OperationRecord};
use drover_proto::provider::v1::{Capabilities, ProviderNode};
use drover_proto::v1;

/// Everything the server knows of one operation kind.
pub trait KindRules: Sync {
    /// The RPC that asks for it (`/drover.v1.Clusters/StartCluster`).
    fn rpc(&self) -> &'static str;

    /// The least role that may ask for it.
    fn role(&self) -> Role {
        Role::Operator
    }

    /// How long an operation of this kind may take unless
    /// `--operation-timeout` says otherwise.
    fn default_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(3600)
    }

    /// The kind as the API names it.
    fn proto(&self) -> v1::OperationKind;

    /// The state table's event for the request on a cluster with `spec`.
    fn event(&self, spec: &Spec, params: &OperationParams) -> Event;

    /// Edits `spec` into what the request asks for; `false` for a kind that
    /// leaves the spec alone. The result is validated by the accept.
    fn edit_spec(&self, _spec: &mut Spec, _params: &OperationParams) -> Result<bool, FieldError> {
        Ok(false)
    }

    /// The request's own name for a spec field it sets (the caller of an
    /// add sent `count`, not `worker_nodes`), when it differs.
    fn request_field(&self, _spec_field: &str) -> Option<&'static str> {
        None
    }

    /// Refuses the request on the cluster as read, before the state table
    /// is asked; `desired` is the spec the request leaves (None: unchanged).
    fn refuse(
        &self,
        _cluster: &ClusterRecord,
        _params: &OperationParams,
        _desired: Option<&Spec>,
    ) -> Result<(), LifecycleError> {
        Ok(())
    }

    /// Whether the request, in `state`, only edits the spec: nothing runs.
    fn spec_only(&self, _state: ClusterState) -> bool {
        false
    }

    /// Refuses a request the state table admits, from what the cluster's
    /// status shows (its nodes).
    fn refuse_admitted(
        &self,
        _cluster: &ClusterRecord,
        _params: &OperationParams,
    ) -> Result<(), LifecycleError> {
        Ok(())
    }

    /// Whether planning `operation` depends on the nodes as they are now;
    /// when it does not, the executor skips describing them first.
    fn needs_nodes(&self, _operation: &OperationRecord) -> bool {
        false
    }

    /// Why `operation` cannot be planned from `nodes` (the provider's
    /// answer), when it cannot.
    fn check_plan_input(
        &self,
        _operation: &OperationRecord,
        _nodes: &[ProviderNode],
    ) -> Result<(), String> {
        Ok(())
    }

    /// The steps of `operation` on a cluster with `spec` (already the
    /// desired spec) and `nodes` as the provider reports them now; an
    /// upgrade goes through the roles in the order the provider's `caps`
    /// say (the defaults unless [`KindRules::needs_capabilities`]).
    fn plan(
        &self,
        operation: &OperationRecord,
        spec: &Spec,
        nodes: &[ProviderNode],
        caps: &Capabilities,
    ) -> Vec<Step>;

    /// Whether the plan depends on the provider's capabilities (asked
    /// before planning, then cached): a kind that changes versions (the
    /// upgrade order), by default.
    fn needs_capabilities(&self, operation: &OperationRecord, spec: &Spec) -> bool {
        self.target_version(operation, spec).is_some()
    }

    /// The version every node must show for the operation to succeed, for a
    /// kind that changes versions (its plan also needs the provider's
    /// upgrade order).
    fn target_version(&self, _operation: &OperationRecord, _spec: &Spec) -> Option<String> {
        None
    }

    /// Whether a go-ahead of this kind that works moves the cluster (a
    /// destroy completes, a start recovers an Error cluster); other
    /// go-aheads leave it where it is.
    fn go_ahead_moves(&self) -> bool {
        false
    }

    /// Whether a success leaves the cluster without nodes.
    fn clears_nodes(&self) -> bool {
        false
    }
}

/// A lifecycle request as its kind reads it: the cluster, the request id
/// and the parameters, its own fields already checked.
#[derive(Debug)]
pub struct Call {
    pub name: String,
    pub request_id: String,
    pub params: OperationParams,
    /// The request's `wait_ms`, as given (checked with the call's other
    /// fields, before anything is written).
    pub wait_ms: u64,
}

/// A drover.v1 request message that asks for an operation of one kind.
pub trait LifecycleCall {
    const KIND: OperationKind;

    /// The call, or the first field that is wrong (INVALID_ARGUMENT).
    fn into_call(self) -> Result<Call, FieldError>;
}

/// Implements [`LifecycleCall`] for requests that carry nothing but the
/// cluster's name and a request id.
macro_rules! name_only_call {
    ($request:ty, $kind:expr) => {
        impl $crate::kind::LifecycleCall for $request {
            const KIND: $crate::kind::OperationKind = $kind;

            fn into_call(
                self,
            ) -> Result<$crate::kind::Call, $crate::cluster::validate::FieldError> {
                Ok($crate::kind::Call {
                    name: self.name,
                    request_id: self.request_id,
                    params: Default::default(),
                    wait_ms: self.wait_ms,
                })
            }
        }
    };
}
pub(super) use name_only_call;
