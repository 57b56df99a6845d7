//! Known etcd issues Drover's guarantees depend on, told from the version of
//! the etcd server in use: a replica warns at start-up (a log line and
//! `drover_etcd_known_issue{issue=...} 1`) rather than refusing to run.
//!
//! # Assumptions
//! - Every etcd member runs the version the one answering reports (during
//!   an etcd rolling upgrade they may not: the check runs once, at start).

use super::SharedStore;
use crate::metrics::{IssueLabels, Metrics};

/// An old leader that was slow (fdatasync, CPU) could still revoke leases
/// after losing leadership, before their TTL ran out (etcd issue 15247):
/// every replica would lose its claims at once. Fixed by "ignore old
/// leader's leases revoking request" in v3.4.31 and v3.5.13 (and 3.6.0).
pub const EARLY_LEASE_REVOKE: &str = "early-lease-revoke";

/// Whether etcd `version` (as its Status reports it, `3.5.9` say) has the
/// early lease revoke; `None` when the version cannot be read.
pub fn has_early_lease_revoke(version: &str) -> Option<bool> {
    let release = version.trim_start_matches('v');
    let release = release.split(['-', '+']).next()?;
    let mut parts = release.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
    Some(match (major, minor) {
        (3, 4) => patch < 31,
        (3, 5) => patch < 13,
        (3, minor) => minor < 4,
        (major, _) => major < 3,
    })
}

/// Reads etcd's version and reports the known issues it has (logs and the
/// metric); a store that is not etcd, or an etcd that does not answer now,
/// is left alone.
pub async fn report(store: &SharedStore, metrics: &Metrics) {
    let version = match store.server_version().await {
        Ok(Some(version)) => version,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, "cannot read etcd's version to check it for known issues");
            return;
        }
    };
    let flagged = match has_early_lease_revoke(&version) {
        Some(flagged) => flagged,
        None => {
            tracing::warn!(%version, "etcd reports a version Drover cannot read; not checked for known issues");
            return;
        }
    };
    let labels = IssueLabels {
        issue: EARLY_LEASE_REVOKE.to_string(),
    };
    metrics
        .etcd_known_issues
        .get_or_create(&labels)
        .set(i64::from(flagged));
    if flagged {
        tracing::warn!(
            %version,
            issue = EARLY_LEASE_REVOKE,
            "this etcd may revoke leases early when its leader is slow: every replica can lose its clusters at once; upgrade etcd to 3.4.31, 3.5.13 or later"
        );
    } else {
        tracing::info!(%version, "etcd version checked: no known issue");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_releases_are_told_from_the_affected_ones() {
        for (version, affected) in [
            ("3.4.30", Some(true)),
            ("3.4.31", Some(false)),
            ("3.5.0", Some(true)),
            ("3.5.12", Some(true)),
            ("3.5.13", Some(false)),
            ("3.5.21", Some(false)),
            ("v3.6.0", Some(false)),
            ("3.6.0-rc.2", Some(false)),
            ("3.3.27", Some(true)),
            ("4.0.0", Some(false)),
            ("3.5", None),
            ("banana", None),
        ] {
            assert_eq!(has_early_lease_revoke(version), affected, "{version}");
        }
    }

    #[tokio::test]
    async fn a_store_that_is_not_etcd_is_not_flagged() {
        let store: SharedStore = std::sync::Arc::new(super::super::MemoryStore::new());
        let metrics = Metrics::new();
        report(&store, &metrics).await;
        assert!(!metrics.render().contains("etcd_known_issue{"));
    }
}
