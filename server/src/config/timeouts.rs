//! Per-kind operation timeouts: the `operation_timeout` setting, which the
//! executor reads.
//!
//! The type lives with the configuration that fills it, so the
//! configuration depends on no layer above it; the executor imports it
//! from here.

use super::{invalid, ConfigError};
use crate::kind::OperationKind;
use std::collections::HashMap;
use std::time::Duration;

/// Per-kind operation timeouts.
#[derive(Debug, Clone)]
pub struct Timeouts(HashMap<OperationKind, Duration>);

impl Default for Timeouts {
    /// Each kind's own default (the reference's: 3600 s, remove-nodes
    /// 900 s).
    fn default() -> Self {
        let map = OperationKind::ALL
            .into_iter()
            .map(|kind| (kind, kind.rules().default_timeout()))
            .collect();
        Self(map)
    }
}

impl Timeouts {
    pub fn set(&mut self, kind: OperationKind, timeout: Duration) {
        self.0.insert(kind, timeout);
    }

    pub fn get(&self, kind: OperationKind) -> Duration {
        self.0
            .get(&kind)
            .copied()
            .unwrap_or(Duration::from_secs(3600))
    }
}

/// The defaults with each `KIND=SECONDS` entry (1-86400 s) over its kind.
pub(super) fn operation_timeouts(
    setting: &'static str,
    entries: Option<Vec<String>>,
) -> Result<Timeouts, ConfigError> {
    let mut timeouts = Timeouts::default();
    for entry in entries.unwrap_or_default() {
        let (kind, seconds) = entry
            .split_once('=')
            .ok_or_else(|| invalid(setting, format!("{entry:?} is not KIND=SECONDS")))?;
        let kind = OperationKind::from_name(kind)
            .ok_or_else(|| invalid(setting, format!("{kind:?} is not an operation kind")))?;
        let seconds: u64 = seconds
            .parse()
            .ok()
            .filter(|s| (1..=86_400).contains(s))
            .ok_or_else(|| invalid(setting, format!("{seconds:?} is not 1-86400 seconds")))?;
        timeouts.set(kind, Duration::from_secs(seconds));
    }
    Ok(timeouts)
}
