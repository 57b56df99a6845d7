//! The rules of the settings table: each gives a setting its default when
//! it is not set and checks its value, failing with one line that names
//! the setting.
//!
//! Every rule has the shape `(setting, given) -> Result<checked, _>`, where
//! `setting` is the row's name (as in the file and in messages) and `given`
//! what the flags, environment or file said, if anything.

use super::{invalid, ConfigError, LogFormat, OrphanPolicy};
use crate::names::dns_label;
use std::fmt::Display;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

/// Taken as given; another part of the configuration checks it (the
/// security settings are read and checked together).
pub(super) fn given<T>(_setting: &'static str, given: Option<T>) -> Result<Option<T>, ConfigError> {
    Ok(given)
}

/// A number within `range`; `unit` ends the message when it is not.
pub(super) fn within<T: Copy + PartialOrd + Display>(
    default: T,
    range: RangeInclusive<T>,
    unit: &'static str,
) -> impl Fn(&'static str, Option<T>) -> Result<T, ConfigError> {
    move |setting, given| {
        let value = given.unwrap_or(default);
        if range.contains(&value) {
            return Ok(value);
        }
        let unit = if unit.is_empty() {
            String::new()
        } else {
            format!(" {unit}")
        };
        Err(invalid(
            setting,
            format!(
                "{value} is outside {}..={}{unit}",
                range.start(),
                range.end()
            ),
        ))
    }
}

/// An `IP:PORT` to listen on.
pub(super) fn address(
    default: &'static str,
) -> impl Fn(&'static str, Option<String>) -> Result<SocketAddr, ConfigError> {
    move |setting, given| {
        let text = given.unwrap_or_else(|| default.to_string());
        text.parse().map_err(|_| {
            invalid(
                setting,
                format!("{text:?} is not an address of the form IP:PORT"),
            )
        })
    }
}

/// One or more `http(s)://HOST:PORT` URLs.
pub(super) fn urls(
    default: &'static str,
) -> impl Fn(&'static str, Option<Vec<String>>) -> Result<Vec<String>, ConfigError> {
    move |setting, given| {
        let urls = given.unwrap_or_else(|| vec![default.to_string()]);
        if urls.is_empty() {
            return Err(invalid(setting, "at least one endpoint is required"));
        }
        for url in &urls {
            check_url(setting, url)?;
        }
        Ok(urls)
    }
}

/// A key prefix: starts and ends with `/`, no spaces or control characters.
pub(super) fn key_prefix(
    default: &'static str,
) -> impl Fn(&'static str, Option<String>) -> Result<String, ConfigError> {
    move |setting, given| {
        let prefix = given.unwrap_or_else(|| default.to_string());
        if !prefix.starts_with('/')
            || !prefix.ends_with('/')
            || prefix.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid(
                setting,
                format!("{prefix:?} must start and end with '/' and contain no spaces"),
            ));
        }
        Ok(prefix)
    }
}

/// A replica id: a DNS-1123 label; by default the host name.
pub(super) fn replica_id(
    setting: &'static str,
    given: Option<String>,
) -> Result<String, ConfigError> {
    let id = match given {
        Some(id) => id,
        None => host_name(setting)?,
    };
    dns_label(&id).map_err(|reason| invalid(setting, reason))?;
    Ok(id)
}

/// The host name, when it is a usable replica id.
fn host_name(setting: &'static str) -> Result<String, ConfigError> {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_default();
    if dns_label(&host).is_ok() {
        Ok(host)
    } else {
        Err(invalid(
            setting,
            format!("the host name {host:?} is not a DNS-1123 label; set --replica-id"),
        ))
    }
}

/// `text` (the default) or `json`.
pub(super) fn log_format(
    setting: &'static str,
    given: Option<String>,
) -> Result<LogFormat, ConfigError> {
    match given.as_deref().unwrap_or("text") {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(invalid(
            setting,
            format!("{other:?} is neither text nor json"),
        )),
    }
}

/// `resume` (the limit is its own setting) or `fail`.
pub(super) fn orphan_policy(
    setting: &'static str,
    given: Option<String>,
) -> Result<OrphanPolicy, ConfigError> {
    match given.as_deref().unwrap_or("resume") {
        "resume" => Ok(OrphanPolicy::Resume {
            limit: super::DEFAULT_ORPHAN_RESUME_LIMIT,
        }),
        "fail" => Ok(OrphanPolicy::Fail),
        other => Err(invalid(
            setting,
            format!("{other:?} is neither resume nor fail"),
        )),
    }
}

/// `on` or `off`, `default` when not given.
pub(super) fn on_off(
    default: bool,
) -> impl Fn(&'static str, Option<String>) -> Result<bool, ConfigError> {
    move |setting, given| match given.as_deref() {
        None => Ok(default),
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(invalid(setting, format!("{other:?} is neither on nor off"))),
    }
}

/// Seconds between compactions, at least 10, or 0 for none.
pub(super) fn compaction(
    default: u64,
) -> impl Fn(&'static str, Option<u64>) -> Result<Option<Duration>, ConfigError> {
    move |setting, given| match given.unwrap_or(default) {
        0 => Ok(None),
        seconds if seconds >= 10 => Ok(Some(Duration::from_secs(seconds))),
        seconds => Err(invalid(
            setting,
            format!("{seconds} is below 10 seconds (0 disables compaction)"),
        )),
    }
}

pub(super) fn check_url(setting: &'static str, url: &str) -> Result<(), ConfigError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| {
            invalid(
                setting,
                format!("{url:?} must start with http:// or https://"),
            )
        })?;
    let authority = rest.trim_end_matches('/');
    let port_ok = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok || authority.contains('/') {
        return Err(invalid(
            setting,
            format!("{url:?} must be of the form http://HOST:PORT"),
        ));
    }
    Ok(())
}
