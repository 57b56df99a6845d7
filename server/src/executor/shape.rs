//! Asking the provider, before an accept writes anything, whether it can
//! build the shape a request asks for: a create, or a change of shape
//! (scale, add or remove nodes, upgrade). Requests that keep the shape
//! (start, stop, destroy, recover) never ask.
//!
//! # Guarantees
//! - A shape the provider refuses is refused with INVALID_ARGUMENT naming
//!   the field as the request named it (`spec.node_offering` in a create,
//!   `version` in an upgrade), with the provider's reason; nothing is
//!   written.
//! - A provider that cannot be asked (unreachable, failing, or silent for
//!   [`DESCRIBE_TIMEOUT`]) refuses with UNAVAILABLE; nothing is written.
//!
//! # Assumptions
//! - ValidateSpec acts on nothing and is not fenced. A provider without it
//!   answers UNIMPLEMENTED and accepts whatever Drover's own validation
//!   lets through, as before it existed.
//!
//! # Caveats
//! - The check and the accept are not one step: a provider whose abilities
//!   change between them fails the operation later, as any provider error.

use super::Executor;
use crate::cluster::validate::FieldError;
use crate::cluster::Spec;
use crate::operation::{request_field, LifecycleError, OperationKind};
use crate::provider::DESCRIBE_TIMEOUT;
use drover_proto::provider::v1 as pb;
use tonic::Code;

/// What a cluster looks like to its provider.
pub fn shape(spec: &Spec) -> pb::ClusterShape {
    pb::ClusterShape {
        control_nodes: spec.control_nodes,
        worker_nodes: spec.worker_nodes,
        offering: spec.node_offering.clone(),
        version: spec.version.clone(),
    }
}

/// The request a shape comes from, for naming a refused field the way the
/// caller wrote it.
#[derive(Debug, Clone, Copy)]
pub enum Asked<'a> {
    /// A create: every field is the spec's.
    Create,
    /// A change of `kind` from the shape `before`: a field it changes is
    /// the request's own (`version`, `count`), one it keeps the spec's.
    Change {
        kind: OperationKind,
        before: &'a pb::ClusterShape,
    },
}

impl Asked<'_> {
    /// The API's name for `field` of the shape (provider spelling:
    /// `control_nodes`, `worker_nodes`, `node_offering`, `version`).
    fn field(&self, field: &str, after: &pb::ClusterShape) -> String {
        let spec_field = format!("spec.{field}");
        let Asked::Change { kind, before } = self else {
            return spec_field;
        };
        let changed = match field {
            "control_nodes" => before.control_nodes != after.control_nodes,
            "worker_nodes" => before.worker_nodes != after.worker_nodes,
            "node_offering" => before.offering != after.offering,
            "version" => before.version != after.version,
            _ => false,
        };
        if changed {
            request_field(*kind, &spec_field)
        } else {
            spec_field
        }
    }
}

/// The refusal for the provider's `violations` of `after` (none: accepted).
pub fn refusal(
    asked: Asked<'_>,
    after: &pb::ClusterShape,
    violations: &[pb::SpecViolation],
) -> Option<FieldError> {
    let first = violations.first()?;
    let mut reason = format!("the provider refuses it: {}", first.reason);
    for other in &violations[1..] {
        let field = asked.field(&other.field, after);
        reason.push_str(&format!("; also {field}: {}", other.reason));
    }
    Some(FieldError::new(asked.field(&first.field, after), reason))
}

/// The provider's last answer within one request: an accept decided again
/// on a fresh read (the cached view lost) asks again only for another shape.
#[derive(Debug, Default)]
pub struct Answered(Option<(pb::ClusterShape, Vec<pb::SpecViolation>)>);

impl Executor {
    /// Refuses `after` (the shape the request leaves the cluster
    /// `cluster_uid` in; empty for a create) when the provider would, or
    /// when it cannot be asked.
    pub async fn check_shape(
        &self,
        provider: &str,
        cluster_uid: &str,
        asked: Asked<'_>,
        after: pb::ClusterShape,
        answered: &mut Answered,
    ) -> Result<(), LifecycleError> {
        let violations = match &answered.0 {
            Some((shape, violations)) if *shape == after => violations.clone(),
            _ => {
                let request = pb::ValidateSpecRequest {
                    cluster_uid: cluster_uid.to_string(),
                    shape: Some(after.clone()),
                };
                let Some(answer) = self.validate_spec(provider, request).await? else {
                    return Ok(());
                };
                answered.0 = Some((after.clone(), answer.violations.clone()));
                answer.violations
            }
        };
        match refusal(asked, &after, &violations) {
            Some(refused) => Err(refused.into()),
            None => Ok(()),
        }
    }

    /// The provider's ValidateSpec answer, bounded by [`DESCRIBE_TIMEOUT`];
    /// `None` from a provider without it.
    async fn validate_spec(
        &self,
        provider: &str,
        request: pb::ValidateSpecRequest,
    ) -> Result<Option<pb::ValidateSpecResponse>, LifecycleError> {
        let mut provider = match self.providers.named(provider) {
            Ok(link) => link.client(),
            Err(unknown) => return Err(LifecycleError::ProviderUnavailable(unknown.to_string())),
        };
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(DESCRIBE_TIMEOUT, provider.validate_spec(request)).await;
        self.observe_provider("ValidateSpec", started);
        let why = match answer {
            Ok(Ok(response)) => return Ok(Some(response.into_inner())),
            Ok(Err(status)) if status.code() == Code::Unimplemented => return Ok(None),
            Ok(Err(status)) => format!("{:?}: {}", status.code(), status.message()),
            Err(_) => format!("no answer within {DESCRIBE_TIMEOUT:?}"),
        };
        Err(LifecycleError::ProviderUnavailable(format!(
            "the provider could not be asked whether it can build this shape ({why}); nothing was written, retry later"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violation(field: &str, reason: &str) -> pb::SpecViolation {
        pb::SpecViolation {
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn shape_of(workers: u32, offering: &str, version: &str) -> pb::ClusterShape {
        pb::ClusterShape {
            control_nodes: 1,
            worker_nodes: workers,
            offering: offering.into(),
            version: version.into(),
        }
    }

    #[test]
    fn a_refused_field_is_named_as_the_request_named_it() {
        let before = shape_of(2, "m", "1.29.0");
        let after = shape_of(2, "m", "9.9.9");
        let unknown = [violation("version", "9.9.9 is not a version it runs")];
        let created = refusal(Asked::Create, &after, &unknown).unwrap();
        assert_eq!(created.field, "spec.version");
        assert!(created.reason.contains("9.9.9 is not"), "{created}");
        let upgrade = Asked::Change {
            kind: OperationKind::Upgrade,
            before: &before,
        };
        assert_eq!(refusal(upgrade, &after, &unknown).unwrap().field, "version");
        // A field the request keeps is the spec's, not the request's.
        let offering = [violation("node_offering", "gone")];
        let kept = refusal(upgrade, &after, &offering).unwrap();
        assert_eq!(kept.field, "spec.node_offering");
        let added = shape_of(5, "m", "1.29.0");
        let add = Asked::Change {
            kind: OperationKind::AddNodes,
            before: &before,
        };
        let workers = [violation("worker_nodes", "at most 4")];
        assert_eq!(refusal(add, &added, &workers).unwrap().field, "count");
        assert!(
            refusal(add, &added, &[]).is_none(),
            "no violation: accepted"
        );
    }

    #[test]
    fn every_violation_is_in_the_refusal() {
        let after = shape_of(2, "xl", "9.9.9");
        let both = [
            violation("node_offering", "unknown"),
            violation("version", "unknown"),
        ];
        let refused = refusal(Asked::Create, &after, &both).unwrap();
        assert_eq!(refused.field, "spec.node_offering");
        assert!(refused.reason.contains("also spec.version"), "{refused}");
    }
}
