//! A cluster's health policy with its defaults, its validation, and how a
//! node is judged under it.

use crate::cluster::validate::{FieldError, Validation};
use crate::cluster::{HealthPolicy, NodeStatus};
use chrono::{DateTime, Utc};
use std::time::Duration;

pub const DEFAULT_UNHEALTHY_TIMEOUT: u32 = 300;
pub const DEFAULT_STARTUP_TIMEOUT: u32 = 600;
pub const DEFAULT_MAX_UNHEALTHY: &str = "40%";
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 1;
pub const DEFAULT_MAX_RETRY: u32 = 3;
pub const DEFAULT_RETRY_PERIOD: u32 = 300;
pub const DEFAULT_MIN_HEALTHY_PERIOD: u32 = 600;
/// `remediation`: RepairNodes in place (the default).
pub const REPAIR: &str = "repair";
/// `remediation`: a new worker added, then the bad one deleted.
pub const REPLACE: &str = "replace";

/// A count or a share of the cluster's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Count(u32),
    Percent(u32),
}

impl Limit {
    /// `"2"` or `"40%"` (0..=100); why not, otherwise.
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = || format!("{text:?} is neither a count (\"2\") nor a percentage (\"40%\")");
        match text.strip_suffix('%') {
            Some(percent) => {
                let percent: u32 = percent.parse().map_err(|_| invalid())?;
                if percent > 100 {
                    return Err(format!("{text:?}: a percentage is at most 100%"));
                }
                Ok(Limit::Percent(percent))
            }
            None => text.parse().map(Limit::Count).map_err(|_| invalid()),
        }
    }

    /// The count it allows out of `total`, a percentage rounded up (so any
    /// share above 0% allows at least one node).
    pub fn of(self, total: usize) -> usize {
        match self {
            Limit::Count(count) => count as usize,
            Limit::Percent(percent) => (total * percent as usize).div_ceil(100),
        }
    }
}

/// The effective policy: every field given or defaulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub unhealthy_timeout: Duration,
    pub startup_timeout: Duration,
    pub max_unhealthy: Limit,
    pub max_in_flight: u32,
    pub max_retry: u32,
    pub retry_period: Duration,
    pub min_healthy_period: Duration,
    /// Unhealthy workers are replaced (where the provider can), not
    /// repaired.
    pub replace_workers: bool,
}

impl Policy {
    /// `spec.health` with its defaults (a stored policy is valid: it was
    /// checked when written; an unparsable limit takes the default).
    pub fn of(spec: &HealthPolicy) -> Self {
        let seconds = |given: Option<u32>, default: u32| {
            Duration::from_secs(u64::from(given.unwrap_or(default)))
        };
        let max_unhealthy = match spec.max_unhealthy.as_str() {
            "" => DEFAULT_MAX_UNHEALTHY,
            given => given,
        };
        Self {
            unhealthy_timeout: seconds(spec.unhealthy_timeout_seconds, DEFAULT_UNHEALTHY_TIMEOUT),
            startup_timeout: seconds(spec.startup_timeout_seconds, DEFAULT_STARTUP_TIMEOUT),
            max_unhealthy: Limit::parse(max_unhealthy).unwrap_or(Limit::Percent(40)),
            max_in_flight: spec.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT),
            max_retry: spec.max_retry.unwrap_or(DEFAULT_MAX_RETRY),
            retry_period: seconds(spec.retry_period_seconds, DEFAULT_RETRY_PERIOD),
            min_healthy_period: seconds(
                spec.min_healthy_period_seconds,
                DEFAULT_MIN_HEALTHY_PERIOD,
            ),
            replace_workers: spec.remediation == REPLACE,
        }
    }
}

/// Checks `spec.health` under `field` (`spec.health`).
pub fn validate(field: &str, spec: &HealthPolicy) -> Validation {
    if !spec.max_unhealthy.is_empty() {
        Limit::parse(&spec.max_unhealthy)
            .map_err(|reason| FieldError::new(format!("{field}.max_unhealthy"), reason))?;
    }
    let timeouts = [
        ("unhealthy_timeout_seconds", spec.unhealthy_timeout_seconds),
        ("startup_timeout_seconds", spec.startup_timeout_seconds),
    ];
    for (name, given) in timeouts {
        if given == Some(0) {
            return Err(FieldError::new(
                format!("{field}.{name}"),
                "must be at least 1",
            ));
        }
    }
    if !["", REPAIR, REPLACE].contains(&spec.remediation.as_str()) {
        let reason = format!(
            "{:?} is neither {REPAIR:?} nor {REPLACE:?}",
            spec.remediation
        );
        return Err(FieldError::new(format!("{field}.remediation"), reason));
    }
    if spec.max_in_flight == Some(0) {
        let reason = "must be at least 1 (max_retry 0 turns remediation off)";
        return Err(FieldError::new(format!("{field}.max_in_flight"), reason));
    }
    Ok(())
}

/// A node's health as of a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeHealth {
    Healthy,
    /// Not ready, within its timeout.
    NotReady,
    /// Not ready past its timeout.
    Unhealthy,
}

/// A node judged: its health and, when not healthy, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub health: NodeHealth,
    pub reason: String,
    /// When a node not ready turns unhealthy (its timeout's end).
    pub unhealthy_at: Option<DateTime<Utc>>,
}

/// Judges `node` at `now` under `policy`: ready is healthy; not ready
/// (powered off, or on and not ready) is unhealthy once it has been so
/// longer than its timeout — the startup timeout for a node never ready.
pub fn judge(node: &NodeStatus, policy: &Policy, now: DateTime<Utc>) -> Judged {
    if node.ready {
        return Judged {
            health: NodeHealth::Healthy,
            reason: String::new(),
            unhealthy_at: None,
        };
    }
    let what = match (node.never_ready, node.power_state.as_str()) {
        (_, NodeStatus::MISSING) => "missing (the provider no longer shows it)",
        (true, _) => "never ready since it appeared",
        (false, "off") => "powered off",
        (false, _) => "not ready",
    };
    let timeout = if node.never_ready {
        policy.startup_timeout
    } else {
        policy.unhealthy_timeout
    };
    // A node without its time (written before health checks) counts from
    // now: never judged on a guess.
    let since = node
        .not_ready_since
        .as_deref()
        .and_then(crate::task::schedule::parse_time)
        .unwrap_or(now);
    let unhealthy_at = since + chrono::Duration::from_std(timeout).unwrap_or_default();
    let elapsed = (now - since).to_std().unwrap_or_default();
    let timeout_text = humantime::format_duration(timeout);
    let elapsed_text = humantime::format_duration(Duration::from_secs(elapsed.as_secs()));
    let health = if now >= unhealthy_at {
        NodeHealth::Unhealthy
    } else {
        NodeHealth::NotReady
    };
    Judged {
        health,
        reason: format!("{what} for {elapsed_text} (timeout {timeout_text})"),
        unhealthy_at: Some(unhealthy_at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_and_percentages_round_up() {
        assert_eq!(Limit::parse("2"), Ok(Limit::Count(2)));
        assert_eq!(Limit::parse("40%"), Ok(Limit::Percent(40)));
        assert!(Limit::parse("140%").is_err());
        assert!(Limit::parse("two").is_err());
        assert!(Limit::parse("-1").is_err());
        assert_eq!(Limit::Percent(40).of(3), 2);
        assert_eq!(Limit::Percent(40).of(1), 1);
        assert_eq!(Limit::Percent(40).of(10), 4);
        assert_eq!(Limit::Percent(0).of(10), 0);
        assert_eq!(Limit::Count(2).of(10), 2);
    }

    #[test]
    fn a_bad_policy_names_its_field() {
        let mut spec = HealthPolicy {
            max_unhealthy: "lots".into(),
            ..Default::default()
        };
        let error = validate("spec.health", &spec).unwrap_err();
        assert_eq!(error.field, "spec.health.max_unhealthy");
        spec.max_unhealthy = String::new();
        spec.unhealthy_timeout_seconds = Some(0);
        let error = validate("spec.health", &spec).unwrap_err();
        assert_eq!(error.field, "spec.health.unhealthy_timeout_seconds");
        spec.unhealthy_timeout_seconds = None;
        spec.max_in_flight = Some(0);
        let error = validate("spec.health", &spec).unwrap_err();
        assert_eq!(error.field, "spec.health.max_in_flight");
        spec.max_in_flight = None;
        spec.remediation = "reboot".into();
        let error = validate("spec.health", &spec).unwrap_err();
        assert_eq!(error.field, "spec.health.remediation");
        spec.remediation = REPLACE.into();
        assert!(validate("spec.health", &spec).is_ok());
    }

    #[test]
    fn a_node_turns_unhealthy_after_its_timeout_a_new_one_after_the_startup_timeout() {
        let policy = Policy::of(&HealthPolicy {
            unhealthy_timeout_seconds: Some(60),
            startup_timeout_seconds: Some(600),
            ..Default::default()
        });
        let since = "2026-01-01T00:00:00Z";
        let mut node = NodeStatus {
            id: "w1".into(),
            role: "worker".into(),
            power_state: "on".into(),
            version: "1.30.0".into(),
            ready: false,
            facts: Default::default(),
            not_ready_since: Some(since.into()),
            never_ready: false,
        };
        let at = |s: &str| crate::task::schedule::parse_time(s).unwrap();
        let early = judge(&node, &policy, at("2026-01-01T00:00:59Z"));
        assert_eq!(early.health, NodeHealth::NotReady);
        let late = judge(&node, &policy, at("2026-01-01T00:01:00Z"));
        assert_eq!(late.health, NodeHealth::Unhealthy);
        assert_eq!(late.reason, "not ready for 1m (timeout 1m)");
        node.never_ready = true;
        let new = judge(&node, &policy, at("2026-01-01T00:05:00Z"));
        assert_eq!(
            new.health,
            NodeHealth::NotReady,
            "within its startup timeout"
        );
        node.never_ready = false;
        node.ready = true;
        assert_eq!(
            judge(&node, &policy, at("2026-01-01T00:05:00Z")).health,
            NodeHealth::Healthy
        );
    }
}
