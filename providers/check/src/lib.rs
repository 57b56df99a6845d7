//! The provider conformance kit: drives any implementation of
//! drover.provider.v1 through the contract written in provider.proto and
//! says, check by check, which rules it keeps.
//!
//! The runner ([`run`]) asks the provider what it supports (GetCapabilities)
//! to choose a shape it can build, then runs each named check in turn
//! ([`checks::NAMES`]). Each check works on clusters of its own, with fresh
//! uids, so the kit can run against a provider other callers share; after
//! each check, whatever it ended with, the runner deletes the clusters it
//! made.
//!
//! # Guarantees
//! - Every call carries a deadline ([`Config::call_timeout`]) and every
//!   check is bounded in time, so a provider that hangs fails the check
//!   instead of stalling the run.
//! - A check passes only on what the provider answered and then described:
//!   an answer is compared with a DescribeCluster made after it.
//! - Clusters made by a check are deleted (all nodes, under an epoch above
//!   any the checks use) even when the check fails; a failed deletion turns
//!   the check's line into a FAIL that says so.
//!
//! # Assumptions
//! - The provider keeps fencing state per cluster uid (the contract), so
//!   fresh uids per run never meet another caller's epochs.
//! - The simulator's control service is used only when asked
//!   ([`Config::simulator`]); it then assumes a simulator of its own, as it
//!   changes the simulator's global latency and fault settings.
//!
//! # Caveats
//! - Draining and the stop of older task runs can only be observed while
//!   the older call or run is still going: against a provider whose calls
//!   end at once, those checks say so (pass with a note, or skip) rather
//!   than prove the rule.

pub mod checks;
mod client;
mod shape;

pub use client::{LinkError, APPLY_BY};
pub use shape::Plan;

use client::Link;
use drover_proto::provider::v1 as pb;
use std::path::PathBuf;
use std::time::Duration;

/// What the kit drives, and how.
#[derive(Clone, Debug)]
pub struct Config {
    /// Provider endpoint, e.g. `http://127.0.0.1:7080`.
    pub provider: String,
    /// PEM CA certificate: TLS to the provider, verified against it.
    pub ca_cert: Option<PathBuf>,
    /// File holding a bearer token sent with every call.
    pub token_file: Option<PathBuf>,
    /// Only the checks named (all when empty).
    pub only: Vec<String>,
    /// Deadline of each call; a check may take a few of them.
    pub call_timeout: Duration,
    /// Also use the Simulator control service to make calls and task runs
    /// last long enough for the drain checks to observe them.
    pub simulator: bool,
}

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The rule holds; the note says what was seen.
    Pass(String),
    /// The rule does not apply to this provider (e.g. an optional call
    /// answered UNIMPLEMENTED), or could not be observed.
    Skip(String),
    /// The rule is broken; the reason says how.
    Fail(String),
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Report {
    pub check: &'static str,
    pub verdict: Verdict,
}

impl Report {
    pub fn failed(&self) -> bool {
        matches!(self.verdict, Verdict::Fail(_))
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (word, text) = match &self.verdict {
            Verdict::Pass(note) => ("PASS", note),
            Verdict::Skip(note) => ("SKIP", note),
            Verdict::Fail(reason) => ("FAIL", reason),
        };
        write!(f, "{word} {}", self.check)?;
        if !text.is_empty() {
            write!(f, ": {text}")?;
        }
        Ok(())
    }
}

/// Why the kit could not run its checks at all.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("--only {0}: no such check (the checks: {names})", names = checks::NAMES.join(", "))]
    UnknownCheck(String),
    #[error("GetCapabilities failed, so no shape can be chosen: {0}")]
    Capabilities(tonic::Status),
}

/// Connects to the provider and runs the checks `config` selects, in the
/// kit's order, calling `each` with every line as it is decided.
pub async fn run(
    config: &Config,
    mut each: impl FnMut(&Report),
) -> Result<Vec<Report>, SetupError> {
    if let Some(unknown) = config
        .only
        .iter()
        .find(|n| !checks::NAMES.contains(&n.as_str()))
    {
        return Err(SetupError::UnknownCheck(unknown.clone()));
    }
    let link = Link::connect(
        &config.provider,
        config.ca_cert.as_deref(),
        config.token_file.as_deref(),
        config.call_timeout,
    )
    .await?;
    let capabilities = capabilities(&link).await?;
    let plan = Plan::from_capabilities(capabilities.as_ref());
    let kit = checks::Kit::new(link, plan, capabilities, config.simulator);
    let mut reports = Vec::new();
    for &name in checks::NAMES {
        if !config.only.is_empty() && !config.only.iter().any(|n| n == name) {
            continue;
        }
        let report = Report {
            check: name,
            verdict: kit.run(name).await,
        };
        each(&report);
        reports.push(report);
    }
    Ok(reports)
}

/// The provider's capabilities; `None` when it does not implement the call
/// (the contract's defaults apply).
async fn capabilities(link: &Link) -> Result<Option<pb::Capabilities>, SetupError> {
    let request = link.due(pb::GetCapabilitiesRequest {});
    match link.provider().get_capabilities(request).await {
        Ok(answer) => Ok(Some(answer.into_inner())),
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
        Err(status) => Err(SetupError::Capabilities(status)),
    }
}
