//! `--health` and `--upgrade-policy`: a cluster's health policy and upgrade
//! policy as `KEY=VALUE[,KEY=VALUE...]`, the keys the proto fields'
//! names, read into the messages before anything is sent; and how
//! `cluster describe` shows them.

use drover_client::v1;

/// The keys of `--health`, as the fields of `drover.v1.HealthPolicy`.
const HEALTH_KEYS: [&str; 8] = [
    "unhealthy_timeout_seconds",
    "startup_timeout_seconds",
    "max_unhealthy",
    "max_in_flight",
    "max_retry",
    "retry_period_seconds",
    "min_healthy_period_seconds",
    "remediation",
];

/// The keys of `--upgrade-policy`, as the fields of
/// `drover.v1.UpgradePolicy`.
const UPGRADE_POLICY_KEYS: [&str; 4] = [
    "max_unavailable",
    "max_surge",
    "step_retries",
    "step_timeout_seconds",
];

/// The remediations `remediation=` takes.
const REMEDIATIONS: [&str; 2] = ["repair", "replace"];

/// `--health`'s value: a whole health policy (the keys not given unset,
/// i.e. at their defaults).
pub fn parse_health(text: &str) -> Result<v1::HealthPolicy, String> {
    let mut policy = v1::HealthPolicy::default();
    for (key, value) in key_values(text, &HEALTH_KEYS)? {
        let number = || whole_number(key, value).map(Some);
        match key {
            "unhealthy_timeout_seconds" => policy.unhealthy_timeout_seconds = number()?,
            "startup_timeout_seconds" => policy.startup_timeout_seconds = number()?,
            "max_unhealthy" => policy.max_unhealthy = count_or_percentage(key, value)?,
            "max_in_flight" => policy.max_in_flight = number()?,
            "max_retry" => policy.max_retry = number()?,
            "retry_period_seconds" => policy.retry_period_seconds = number()?,
            "min_healthy_period_seconds" => policy.min_healthy_period_seconds = number()?,
            "remediation" => policy.remediation = remediation(key, value)?,
            _ => unreachable!("key_values lets only HEALTH_KEYS through"),
        }
    }
    Ok(policy)
}

/// `--upgrade-policy`'s value: a whole upgrade policy (the keys not given
/// unset, i.e. at their defaults).
pub fn parse_upgrade_policy(text: &str) -> Result<v1::UpgradePolicy, String> {
    let mut policy = v1::UpgradePolicy::default();
    for (key, value) in key_values(text, &UPGRADE_POLICY_KEYS)? {
        let number = Some(whole_number(key, value)?);
        match key {
            "max_unavailable" => policy.max_unavailable = number,
            "max_surge" => policy.max_surge = number,
            "step_retries" => policy.step_retries = number,
            "step_timeout_seconds" => policy.step_timeout_seconds = number,
            _ => unreachable!("key_values lets only UPGRADE_POLICY_KEYS through"),
        }
    }
    Ok(policy)
}

/// The `KEY=VALUE` pairs of `text` (comma-separated, spaces around each
/// trimmed), each key one of `keys` and given once.
fn key_values<'a>(text: &'a str, keys: &[&str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for item in text.split(',').map(str::trim) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!(
                "{item:?} is not KEY=VALUE (expected KEY=VALUE[,KEY=VALUE...])"
            ));
        };
        let (key, value) = (key.trim(), value.trim());
        if !keys.contains(&key) {
            return Err(format!(
                "unknown key {key:?} (the keys are {})",
                keys.join(", ")
            ));
        }
        if pairs.iter().any(|(given, _)| *given == key) {
            return Err(format!("{key} is given twice"));
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

fn whole_number(key: &str, value: &str) -> Result<u32, String> {
    value
        .parse()
        .map_err(|_| format!("{key}: {value:?} is not a whole number (0 to {})", u32::MAX))
}

/// `max_unhealthy`: a count ("2") or a percentage of the nodes ("40%",
/// at most 100%).
fn count_or_percentage(key: &str, value: &str) -> Result<String, String> {
    let invalid =
        || format!("{key}: {value:?} is neither a count (\"2\") nor a percentage (\"40%\")");
    match value.strip_suffix('%') {
        Some(percent) => match percent.parse::<u32>() {
            Ok(percent) if percent <= 100 => Ok(value.to_string()),
            Ok(_) => Err(format!("{key}: {value:?}: a percentage is at most 100%")),
            Err(_) => Err(invalid()),
        },
        None => value
            .parse::<u32>()
            .map(|_| value.to_string())
            .map_err(|_| invalid()),
    }
}

fn remediation(key: &str, value: &str) -> Result<String, String> {
    match REMEDIATIONS.contains(&value) {
        true => Ok(value.to_string()),
        false => Err(format!(
            "{key}: {value:?} is neither \"repair\" nor \"replace\""
        )),
    }
}

/// A health policy as `cluster describe` shows it: the fields given, in
/// `--health`'s syntax; `None` when none is (every field at its default).
pub fn health_shown(policy: Option<&v1::HealthPolicy>) -> Option<String> {
    let p = policy?;
    let text = |value: &str| (!value.is_empty()).then(|| value.to_string());
    let fields = [
        (
            "unhealthy_timeout_seconds",
            p.unhealthy_timeout_seconds.map(|n| n.to_string()),
        ),
        (
            "startup_timeout_seconds",
            p.startup_timeout_seconds.map(|n| n.to_string()),
        ),
        ("max_unhealthy", text(&p.max_unhealthy)),
        ("max_in_flight", p.max_in_flight.map(|n| n.to_string())),
        ("max_retry", p.max_retry.map(|n| n.to_string())),
        (
            "retry_period_seconds",
            p.retry_period_seconds.map(|n| n.to_string()),
        ),
        (
            "min_healthy_period_seconds",
            p.min_healthy_period_seconds.map(|n| n.to_string()),
        ),
        ("remediation", text(&p.remediation)),
    ];
    fields_shown(fields)
}

/// An upgrade policy as `cluster describe` shows it: the fields given, in
/// `--upgrade-policy`'s syntax; `None` when none is.
pub fn upgrade_policy_shown(policy: Option<&v1::UpgradePolicy>) -> Option<String> {
    let p = policy?;
    let fields = [
        ("max_unavailable", p.max_unavailable),
        ("max_surge", p.max_surge),
        ("step_retries", p.step_retries),
        ("step_timeout_seconds", p.step_timeout_seconds),
    ];
    fields_shown(fields.map(|(key, value)| (key, value.map(|n| n.to_string()))))
}

/// `key=value` for each field given, comma-separated; `None` when none is.
fn fields_shown<const N: usize>(fields: [(&str, Option<String>); N]) -> Option<String> {
    let given: Vec<String> = fields
        .into_iter()
        .filter_map(|(key, value)| value.map(|value| format!("{key}={value}")))
        .collect();
    (!given.is_empty()).then(|| given.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_health_policy_is_read_from_its_keys() {
        let policy = parse_health(
            "unhealthy_timeout_seconds=120, startup_timeout_seconds=900,max_unhealthy=40%,\
             max_in_flight=2,max_retry=0,retry_period_seconds=60,\
             min_healthy_period_seconds=30,remediation=replace",
        );
        let expected = v1::HealthPolicy {
            unhealthy_timeout_seconds: Some(120),
            startup_timeout_seconds: Some(900),
            max_unhealthy: "40%".into(),
            max_in_flight: Some(2),
            max_retry: Some(0),
            retry_period_seconds: Some(60),
            min_healthy_period_seconds: Some(30),
            remediation: "replace".into(),
        };
        assert_eq!(policy, Ok(expected));
        let some = parse_health("max_unhealthy=2").unwrap();
        assert_eq!(
            some,
            v1::HealthPolicy {
                max_unhealthy: "2".into(),
                ..Default::default()
            },
            "the keys not given stay unset: their defaults"
        );
    }

    #[test]
    fn an_upgrade_policy_is_read_from_its_keys() {
        let policy = parse_upgrade_policy(
            "max_unavailable=2,max_surge=1,step_retries=3,step_timeout_seconds=600",
        );
        let expected = v1::UpgradePolicy {
            max_unavailable: Some(2),
            max_surge: Some(1),
            step_retries: Some(3),
            step_timeout_seconds: Some(600),
        };
        assert_eq!(policy, Ok(expected));
        let surge = parse_upgrade_policy("max_surge=1").unwrap();
        assert_eq!(surge.max_surge, Some(1));
        assert_eq!(surge.step_retries, None);
    }

    /// Each refusal names what is wrong, so the operator can fix it.
    #[test]
    fn a_bad_pair_is_refused_naming_its_key() {
        let refused = |text: &str, words: &[&str]| {
            let error = parse_health(text).unwrap_err();
            for word in words {
                assert!(error.contains(word), "{text}: {error}");
            }
        };
        refused(
            "unhealthy_timeout=120",
            &["unknown key", "unhealthy_timeout"],
        );
        refused(
            "unhealthy_timeout_seconds=2m",
            &["unhealthy_timeout_seconds", "2m"],
        );
        refused("max_retry=-1", &["max_retry", "whole number"]);
        refused("max_in_flight=", &["max_in_flight"]);
        refused("max_unhealthy=lots", &["max_unhealthy", "percentage"]);
        refused("max_unhealthy=140%", &["max_unhealthy", "at most 100%"]);
        refused("remediation=reboot", &["remediation", "reboot"]);
        refused("max_retry=1,max_retry=2", &["max_retry", "twice"]);
        refused("max_retry", &["KEY=VALUE"]);
        refused("", &["KEY=VALUE"]);
        refused("max_retry=1,", &["KEY=VALUE"]);
        let error = parse_upgrade_policy("max_surge=1,surge=2").unwrap_err();
        assert!(error.contains("\"surge\""), "{error}");
        let error = parse_upgrade_policy("step_retries=many").unwrap_err();
        assert!(error.contains("step_retries"), "{error}");
        let error = parse_upgrade_policy("remediation=repair").unwrap_err();
        assert!(error.contains("unknown key \"remediation\""), "{error}");
    }

    #[test]
    fn a_policy_is_shown_by_the_fields_given() {
        assert_eq!(health_shown(None), None);
        assert_eq!(health_shown(Some(&v1::HealthPolicy::default())), None);
        let health = parse_health("remediation=replace,unhealthy_timeout_seconds=120").unwrap();
        assert_eq!(
            health_shown(Some(&health)).as_deref(),
            Some("unhealthy_timeout_seconds=120,remediation=replace")
        );
        assert_eq!(
            upgrade_policy_shown(Some(&v1::UpgradePolicy::default())),
            None
        );
        let upgrade = parse_upgrade_policy("step_retries=0,max_surge=1").unwrap();
        assert_eq!(
            upgrade_policy_shown(Some(&upgrade)).as_deref(),
            Some("max_surge=1,step_retries=0")
        );
        // What describe shows reads back as the same policy.
        let shown = health_shown(Some(&health)).unwrap();
        assert_eq!(parse_health(&shown), Ok(health));
    }
}
