//! Validation of what users ask for. Every failure names the field, in the
//! API's own spelling (`spec.worker_nodes`), so a client can point at it.

use super::Spec;
use std::collections::BTreeMap;

/// A field that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

pub type Validation = Result<(), FieldError>;

pub const MAX_CONTROL_NODES: u32 = 7;
pub const MAX_WORKER_NODES: u32 = 1000;
pub const MAX_LABELS: usize = 64;
pub const MAX_REQUEST_ID_LEN: usize = 128;
pub const MAX_VERSION_LEN: usize = 64;

/// A cluster name: a DNS-1123 label.
pub fn cluster_name(field: &str, name: &str) -> Validation {
    crate::names::dns_label(name).map_err(|reason| FieldError::new(field, reason))
}

/// A provider's name: a DNS-1123 label, as `--provider NAME=URL` requires.
pub fn provider_name(field: &str, name: &str) -> Validation {
    crate::names::dns_label(name).map_err(|reason| FieldError::new(field, reason))
}

/// A version: a semantic version, `MAJOR.MINOR.PATCH` in digits without
/// leading zeros, optionally with a pre-release (`1.30.0-rc.1`, ordered
/// before `1.30.0` as semver says). Build metadata (`+build.5`) is refused:
/// semver ignores it when ordering, so `1.30.0+a` and `1.30.0+b` would be
/// neither an upgrade nor a downgrade of each other.
pub fn version(field: &str, version: &str) -> Validation {
    parse_version(version)
        .map(|_| ())
        .map_err(|reason| FieldError::new(field, reason))
}

/// Parses a version as [`version`] accepts it; why not, otherwise.
pub fn parse_version(version: &str) -> Result<semver::Version, String> {
    if version.is_empty() {
        return Err("is required".into());
    }
    if version.len() > MAX_VERSION_LEN {
        return Err(format!("must be at most {MAX_VERSION_LEN} characters"));
    }
    let parsed = semver::Version::parse(version).map_err(|error| {
        format!("{version:?} is not a semantic version MAJOR.MINOR.PATCH[-PRERELEASE]: {error}")
    })?;
    if !parsed.build.is_empty() {
        return Err(format!(
            "{version:?}: build metadata (+{}) is not allowed, it does not order versions",
            parsed.build
        ));
    }
    Ok(parsed)
}

/// A node offering name.
pub fn node_offering(field: &str, offering: &str) -> Validation {
    if offering.is_empty() {
        return Err(FieldError::new(field, "is required"));
    }
    if !is_token(offering) {
        return Err(FieldError::new(
            field,
            format!("{offering:?} must be 1-63 characters of letters, digits, '.', '_' and '-'"),
        ));
    }
    Ok(())
}

/// Labels: bounded in number, keys and values tokens.
pub fn labels(field: &str, labels: &BTreeMap<String, String>) -> Validation {
    if labels.len() > MAX_LABELS {
        return Err(FieldError::new(
            field,
            format!("at most {MAX_LABELS} labels are allowed"),
        ));
    }
    for (key, value) in labels {
        if !is_token(key) {
            return Err(FieldError::new(
                format!("{field}[{key:?}]"),
                "a label key must be 1-63 characters of letters, digits, '.', '_' and '-'",
            ));
        }
        if !is_token(value) {
            return Err(FieldError::new(
                format!("{field}[{key:?}]"),
                "a label value must be 1-63 characters of letters, digits, '.', '_' and '-'",
            ));
        }
    }
    Ok(())
}

/// A whole cluster spec, fields prefixed by `field` (usually `spec`).
pub fn spec(field: &str, spec: &Spec) -> Validation {
    version(&format!("{field}.version"), &spec.version)?;
    if !(1..=MAX_CONTROL_NODES).contains(&spec.control_nodes) {
        return Err(FieldError::new(
            format!("{field}.control_nodes"),
            format!("must be between 1 and {MAX_CONTROL_NODES}"),
        ));
    }
    if spec.worker_nodes > MAX_WORKER_NODES {
        return Err(FieldError::new(
            format!("{field}.worker_nodes"),
            format!("must be at most {MAX_WORKER_NODES}"),
        ));
    }
    node_offering(&format!("{field}.node_offering"), &spec.node_offering)?;
    crate::health::policy::validate(&format!("{field}.health"), &spec.health)?;
    upgrade_policy(&format!("{field}.upgrade_policy"), &spec.upgrade_policy)?;
    super::window::validate(&format!("{field}.maintenance"), &spec.maintenance)?;
    if !spec.provider.is_empty() {
        provider_name(&format!("{field}.provider"), &spec.provider)?;
    }
    let autoscaling = &spec.autoscaling;
    if autoscaling.enabled {
        if autoscaling.min < 1 || autoscaling.min > autoscaling.max {
            return Err(FieldError::new(
                format!("{field}.autoscaling"),
                "min must be at least 1 and at most max",
            ));
        }
        if autoscaling.max > MAX_WORKER_NODES {
            return Err(FieldError::new(
                format!("{field}.autoscaling.max"),
                format!("must be at most {MAX_WORKER_NODES}"),
            ));
        }
        if !(autoscaling.min..=autoscaling.max).contains(&spec.worker_nodes) {
            return Err(FieldError::new(
                format!("{field}.worker_nodes"),
                "must lie between autoscaling.min and autoscaling.max",
            ));
        }
    }
    labels(&format!("{field}.labels"), &spec.labels)
}

/// An idempotency key.
pub fn request_id(field: &str, request_id: &str) -> Validation {
    if request_id.len() > MAX_REQUEST_ID_LEN || request_id.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            format!("must be at most {MAX_REQUEST_ID_LEN} printable characters"),
        ));
    }
    Ok(())
}

/// The longest wait a call may ask for, in milliseconds (an hour).
pub const MAX_WAIT_MS: u64 = 3_600_000;

/// A wait in milliseconds, at most [`MAX_WAIT_MS`]; 0 is none.
pub fn wait_ms(field: &str, ms: u64) -> Result<Option<std::time::Duration>, FieldError> {
    match ms {
        0 => Ok(None),
        ms if ms <= MAX_WAIT_MS => Ok(Some(std::time::Duration::from_millis(ms))),
        _ => Err(FieldError::new(
            field,
            format!("must be at most {MAX_WAIT_MS} (an hour)"),
        )),
    }
}

fn is_token(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// An upgrade policy: `max_unavailable`, when given, at least 1.
pub fn upgrade_policy(field: &str, policy: &super::UpgradePolicy) -> Validation {
    if policy.max_unavailable == Some(0) {
        let reason = "must be at least 1 (workers upgraded side by side)";
        return Err(FieldError::new(format!("{field}.max_unavailable"), reason));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good_spec() -> Spec {
        Spec {
            version: "1.29.4".into(),
            control_nodes: 1,
            worker_nodes: 3,
            node_offering: "medium".into(),
            ..Spec::default()
        }
    }

    #[test]
    fn names_must_be_dns_labels() {
        for good in ["a", "prod-1", "0abc", &"a".repeat(63)] {
            assert_eq!(cluster_name("name", good), Ok(()), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a/b", &"a".repeat(64)] {
            let error = cluster_name("name", bad).unwrap_err();
            assert_eq!(error.field, "name", "{bad}");
        }
    }

    #[test]
    fn spec_errors_name_the_field() {
        assert_eq!(spec("spec", &good_spec()), Ok(()));
        type Edit = Box<dyn Fn(&mut Spec)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|s| s.version = "1.2".into()), "spec.version"),
            (Box::new(|s| s.version = String::new()), "spec.version"),
            (Box::new(|s| s.control_nodes = 0), "spec.control_nodes"),
            (Box::new(|s| s.control_nodes = 8), "spec.control_nodes"),
            (Box::new(|s| s.worker_nodes = 1001), "spec.worker_nodes"),
            (
                Box::new(|s| s.node_offering = "a b".into()),
                "spec.node_offering",
            ),
            (
                Box::new(|s| {
                    s.autoscaling = super::super::Autoscaling {
                        enabled: true,
                        min: 5,
                        max: 2,
                    }
                }),
                "spec.autoscaling",
            ),
            (
                Box::new(|s| {
                    s.autoscaling = super::super::Autoscaling {
                        enabled: true,
                        min: 4,
                        max: 6,
                    }
                }),
                "spec.worker_nodes",
            ),
            (
                Box::new(|s| {
                    s.labels.insert("team".into(), "a/b".into());
                }),
                "spec.labels[\"team\"]",
            ),
        ];
        for (mutate, field) in cases {
            let mut s = good_spec();
            mutate(&mut s);
            assert_eq!(spec("spec", &s).unwrap_err().field, field);
        }
    }

    #[test]
    fn versions_are_semantic_versions_without_build_metadata() {
        for good in [
            "1.29.4",
            "0.0.0",
            "10.200.3000",
            "1.30.0-rc.1",
            "2.0.0-alpha",
        ] {
            assert_eq!(version("version", good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "1.2",
            "1.2.3.4",
            "v1.2.3",
            "01.2.3",
            "1.2.x",
            "1.2.3+build.5",
            "1.2.3-",
            &format!("1.2.3-{}", "a".repeat(64)),
        ] {
            let error = version("version", bad).unwrap_err();
            assert_eq!(error.field, "version", "{bad}");
        }
        let order = |a: &str, b: &str| parse_version(a).unwrap() < parse_version(b).unwrap();
        assert!(order("1.9.0", "1.10.0"), "numeric, not lexical");
        assert!(order("1.30.0-rc.1", "1.30.0"), "a pre-release comes first");
    }

    #[test]
    fn request_ids_are_bounded() {
        assert_eq!(request_id("request_id", "abc-123"), Ok(()));
        assert!(request_id("request_id", &"x".repeat(129)).is_err());
        assert!(request_id("request_id", "a\nb").is_err());
    }
}
