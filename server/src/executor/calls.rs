//! The provider calls of a held operation: each under the claim, due by
//! the end of the claim and the operation's deadline, asked again when cut
//! at the claim's end; and the looks (describes) that plan and follow the
//! steps.

use super::holding::{error, Holding};
use super::Step;
use crate::operation::OperationError;
use crate::provider::{call_span, due_by, node_ready, DESCRIBE_TIMEOUT};
use drover_proto::provider::v1 as pb;
use std::time::{Duration, Instant};
use tonic::Code;
use tracing::Instrument;

/// Resizes to `workers`, then upgrades the new workers (not among `known`)
/// not yet at `version`: sent again after a crash, it adds nothing more
/// and upgrades what is left.
async fn surge(
    mut provider: crate::provider::Provider,
    token: Option<pb::FencingToken>,
    workers: u32,
    known: &[String],
    version: &str,
    deadline: Instant,
) -> Result<tonic::Response<pb::NodesResponse>, tonic::Status> {
    let resize = pb::ResizeNodesRequest {
        token: token.clone(),
        worker_nodes: Some(workers),
        offering: None,
    };
    let resized = provider.resize_nodes(due_by(deadline, resize)).await?;
    let new: Vec<String> = resized
        .get_ref()
        .nodes
        .iter()
        .filter(|n| n.role == "worker" && !known.contains(&n.id) && n.version != version)
        .map(|n| n.id.clone())
        .collect();
    if new.is_empty() {
        return Ok(resized);
    }
    upgrade_side_by_side(provider, token, &new, version, deadline).await
}

/// One UpgradeNode call per node, sent together under one token: the
/// first failure in node order (the step fails, or is retried, as one), or
/// else the last node's answer (every answer lists all the nodes).
/// A power request (start, stop, repair) for `node_ids`; none means all.
fn power(token: Option<pb::FencingToken>, node_ids: Vec<String>) -> pb::PowerRequest {
    pb::PowerRequest { node_ids, token }
}

async fn upgrade_side_by_side(
    provider: crate::provider::Provider,
    token: Option<pb::FencingToken>,
    node_ids: &[String],
    version: &str,
    deadline: Instant,
) -> Result<tonic::Response<pb::NodesResponse>, tonic::Status> {
    let mut calls = tokio::task::JoinSet::new();
    for (index, node_id) in node_ids.iter().enumerate() {
        let mut provider = provider.clone();
        let request = pb::UpgradeNodeRequest {
            token: token.clone(),
            node_id: node_id.clone(),
            version: version.to_string(),
        };
        let request = due_by(deadline, request);
        let call = async move { (index, provider.upgrade_node(request).await) };
        calls.spawn(call.instrument(tracing::Span::current()));
    }
    let mut answers: Vec<_> = calls.join_all().await;
    answers.sort_by_key(|(index, _)| *index);
    let mut last = None;
    for (_, answer) in answers {
        last = Some(answer?);
    }
    last.ok_or_else(|| tonic::Status::internal("an upgrade step with no nodes"))
}

/// How far the provider's clock may be ahead of this replica's for its
/// DEADLINE_EXCEEDED to be read as the end of the claim (see
/// [`cut_at_claim_end`]).
const PROVIDER_CLOCK_SLACK: Duration = Duration::from_secs(1);

/// How much earlier than the operation's deadline a step's provider call is
/// due (see `Holding::call`).
const OPERATION_DEADLINE_SLACK: Duration = Duration::from_millis(200);

/// The first wait before asking the provider again after an answer that
/// may pass (see [`is_transient`]); each wait doubles, up to
/// [`RETRY_MAX_WAIT`].
const RETRY_FIRST_WAIT: Duration = Duration::from_millis(200);

/// The longest wait between two attempts: a provider back from a restart
/// is asked again within this.
const RETRY_MAX_WAIT: Duration = Duration::from_secs(5);

/// Attempts at a call the provider keeps answering with a failure that may
/// pass (UNAVAILABLE, or RESOURCE_EXHAUSTED for a describe): about 16 s
/// of waits in all (see [`Backoff::allows`]).
const ANSWERED_FAILURE_ATTEMPTS: u32 = 8;

impl Holding<'_> {
    /// Runs `step` at the provider, under this replica's claim and by the
    /// operation's deadline (the gRPC deadline the provider learns is the
    /// earlier of the two, so no call lands after the operation ended).
    pub(super) async fn call(
        &mut self,
        step: &Step,
        operation_deadline: tokio::time::Instant,
    ) -> Result<(), tonic::Status> {
        if *step == Step::HealthCheck {
            return self.health_check(operation_deadline).await;
        }
        // The provider learns a deadline a little before the operation's: a
        // deadline travels as time left, so the provider's clock for it
        // starts when the call arrives, and a call it lands just in time
        // must not land after this replica has written the operation off.
        let cutoff = operation_deadline.into_std() - OPERATION_DEADLINE_SLACK;
        let started = Instant::now();
        let mut backoff = Backoff::default();
        let response = loop {
            let deadline = self.claim_deadline().await?.min(cutoff);
            let sent = self.send(step, deadline);
            match sent.instrument(call_span(step.provider_call())).await {
                Err(status) if cut_at_claim_end(&status, deadline) && Instant::now() < cutoff => {
                    // A step longer than many claims: a cancel request ends
                    // the wait.
                    if self.cancel_seen().await {
                        return Err(cancelled_waiting(&status));
                    }
                    tracing::debug!(cluster = %self.cluster.spec.name, step = %step.name(), "a provider call outlasted the claim; asking again");
                    // A provider answering DEADLINE_EXCEEDED early (its
                    // clock ahead) is asked again at the deadline, not at once.
                    tokio::time::sleep_until(deadline.into()).await;
                }
                // Cut at the cutoff: the operation's own timeout, moments
                // away, ends the step (the caller bounds it by that deadline).
                Err(status) if cut_at_claim_end(&status, deadline) => {
                    std::future::pending::<()>().await;
                }
                // Unreachable, restarting, or saying it is unavailable: the
                // call is idempotent (the provider contract), so it is sent
                // again, under the same token, as `Backoff::allows` says:
                // until the provider answers or the operation's deadline
                // passes. A step is never failed for a provider that is
                // only briefly gone.
                Err(status) if unavailable(&status) && backoff.allows(&status, cutoff) => {
                    // Waiting may be long: a cancel request ends it.
                    if self.cancel_seen().await {
                        return Err(cancelled_waiting(&status));
                    }
                    tracing::warn!(cluster = %self.cluster.spec.name, step = %step.name(), %status, retry_in = ?backoff.wait, "the provider is unavailable; asking again");
                    self.executor.count_retry(step.provider_call());
                    backoff.sleep().await;
                }
                other => break other,
            }
        };
        self.executor
            .observe_provider(step.provider_call(), started);
        let response = match response {
            // A provider older than RepairNodes cannot repair: nothing to do
            // here, and the health check that follows decides.
            Err(status)
                if matches!(step, Step::RepairNodes(_)) && status.code() == Code::Unimplemented =>
            {
                return Ok(());
            }
            other => other?,
        };
        self.nodes = response.into_inner().nodes;
        self.nodes_fresh = true;
        Ok(())
    }

    /// Sends `step`'s provider call, due by `deadline`.
    async fn send(
        &self,
        step: &Step,
        deadline: std::time::Instant,
    ) -> Result<tonic::Response<pb::NodesResponse>, tonic::Status> {
        let spec = &self.cluster.spec.spec;
        let mut provider = self.executor.providers.for_cluster(spec)?;
        let token = self.token();
        match step {
            Step::CreateNodes => {
                let request = pb::CreateNodesRequest {
                    token,
                    control_nodes: spec.control_nodes,
                    worker_nodes: spec.worker_nodes,
                    offering: spec.node_offering.clone(),
                    version: spec.version.clone(),
                };
                provider.create_nodes(due_by(deadline, request)).await
            }
            Step::StartNodes => {
                let request = due_by(deadline, power(token, Vec::new()));
                provider.start_nodes(request).await
            }
            Step::StopNodes => {
                let request = due_by(deadline, power(token, Vec::new()));
                provider.stop_nodes(request).await
            }
            Step::Resize { workers, offering } => {
                provider
                    .resize_nodes(due_by(
                        deadline,
                        pb::ResizeNodesRequest {
                            token,
                            worker_nodes: *workers,
                            offering: offering.clone(),
                        },
                    ))
                    .await
            }
            Step::UpgradeNode { node_id, version } => {
                provider
                    .upgrade_node(due_by(
                        deadline,
                        pb::UpgradeNodeRequest {
                            token,
                            node_id: node_id.clone(),
                            version: version.clone(),
                        },
                    ))
                    .await
            }
            Step::UpgradeNodes { node_ids, version } => {
                upgrade_side_by_side(provider, token, node_ids, version, deadline).await
            }
            Step::Surge {
                workers,
                known,
                version,
            } => surge(provider, token, *workers, known, version, deadline).await,
            Step::DeleteNodes(ids) => {
                provider
                    .delete_nodes(due_by(
                        deadline,
                        pb::DeleteNodesRequest {
                            token,
                            node_ids: ids.clone(),
                        },
                    ))
                    .await
            }
            Step::RepairNodes(node_ids) => {
                let request = due_by(deadline, power(token, node_ids.clone()));
                provider.repair_nodes(request).await
            }
            Step::HealthCheck => unreachable!("the health check describes"),
        }
    }

    /// Every node is on and ready (a read-only step). The provider's last
    /// answer in this execution (the start, create, resize or upgrade just
    /// run) lists the nodes as it left them: when it shows every node ready
    /// there is nothing more to learn. Otherwise, or when this execution
    /// resumed at the check, the cluster is described (fenced).
    async fn health_check(
        &mut self,
        operation_deadline: tokio::time::Instant,
    ) -> Result<(), tonic::Status> {
        if self.nodes_fresh && !self.nodes.is_empty() && self.nodes.iter().all(node_ready) {
            return Ok(());
        }
        let nodes = match self.look(operation_deadline).await {
            Ok(nodes) => nodes,
            Err(Some(status)) => return Err(status),
            Err(None) => {
                return Err(tonic::Status::deadline_exceeded(
                    "no answer from the provider",
                ))
            }
        };
        let unhealthy: Vec<&str> = nodes
            .iter()
            .filter(|n| !node_ready(n))
            .map(|n| n.id.as_str())
            .collect();
        if nodes.is_empty() {
            return Err(tonic::Status::failed_precondition(
                "the cluster has no nodes",
            ));
        }
        if !unhealthy.is_empty() {
            return Err(tonic::Status::failed_precondition(format!(
                "nodes not ready: {}",
                unhealthy.join(", ")
            )));
        }
        Ok(())
    }

    pub(super) async fn describe(&mut self) -> Result<Vec<pb::ProviderNode>, tonic::Status> {
        // Fenced: once this owner has looked, its predecessors' calls are
        // refused (orphan recovery relies on it).
        let started = Instant::now();
        let response = loop {
            let deadline = self.claim_deadline().await?;
            let request = pb::DescribeClusterRequest {
                cluster_uid: self.cluster.spec.uid.clone(),
                token: self.token(),
            };
            let mut provider = self
                .executor
                .providers
                .for_cluster(&self.cluster.spec.spec)?;
            let call = async { provider.describe_cluster(due_by(deadline, request)).await };
            match call.instrument(call_span("DescribeCluster")).await {
                Err(status) if cut_at_claim_end(&status, deadline) => {}
                other => break other,
            }
        };
        self.executor.observe_provider("DescribeCluster", started);
        let nodes = response?.into_inner().nodes;
        self.nodes = nodes.clone();
        self.nodes_fresh = true;
        Ok(nodes)
    }

    /// The nodes to plan from, as the provider describes them now. A look
    /// that fails is never "no nodes" (an upgrade planned from it had no
    /// steps and succeeded): a transient error is retried a few times, any
    /// other ends the operation with the provider's error.
    pub(super) async fn look_before_plan(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<pb::ProviderNode>, Option<OperationError>> {
        match self.look(deadline).await {
            Ok(nodes) => Ok(nodes),
            Err(Some(status)) => {
                let message = format!(
                    "describing the cluster's nodes before the first step failed: {}",
                    status.message()
                );
                Err(error(status.code(), message))
            }
            Err(None) => {
                let message = "timed out describing the cluster's nodes before the first step";
                Err(error(Code::DeadlineExceeded, message))
            }
        }
    }

    /// After a failed mutating step: learns what exists, so the status
    /// mirrors it (the step may have done part of its work). Bounded by the
    /// operation's deadline and [`DESCRIBE_TIMEOUT`]; a look that fails
    /// leaves the nodes unknown, and the status message says so.
    pub(super) async fn look_after_failure(&mut self, deadline: tokio::time::Instant) {
        self.nodes_fresh = false;
        let now = tokio::time::Instant::now();
        if !self.holds_claim() || now >= deadline {
            return;
        }
        if let Err(error) = self.look(deadline.min(now + DESCRIBE_TIMEOUT)).await {
            let error = error.map_or("no answer".to_string(), |s| s.to_string());
            tracing::warn!(cluster = %self.cluster.spec.name, %error, "cannot describe the nodes after a failed step");
        }
    }

    /// Describes the nodes by `deadline`, asking again (with backoff) while
    /// the provider's error says it may pass (see [`is_transient`]).
    /// `Err(None)`: no answer by the deadline.
    async fn look(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<pb::ProviderNode>, Option<tonic::Status>> {
        let looking = async {
            let mut backoff = Backoff::default();
            loop {
                match self.describe().await {
                    Err(status)
                        if is_transient(&status)
                            && backoff.allows(&status, deadline.into_std()) =>
                    {
                        if self.cancel_seen().await {
                            return Err(cancelled_waiting(&status));
                        }
                        tracing::warn!(cluster = %self.cluster.spec.name, %status, retry_in = ?backoff.wait, "describing the nodes failed; asking again");
                        self.executor.count_retry("DescribeCluster");
                        backoff.sleep().await;
                    }
                    answer => return answer,
                }
            }
        };
        match tokio::time::timeout_at(deadline, looking).await {
            Ok(answer) => answer.map_err(Some),
            Err(_) => Err(None),
        }
    }
}

impl Holding<'_> {
    /// The provider's capabilities, by `deadline`, for a plan that depends
    /// on them: asked once (then cached); a provider without
    /// GetCapabilities has the defaults (control nodes upgraded first, no
    /// replacement). A provider that cannot be asked fails the operation
    /// rather than have it go in a way that may harm it (a primary upgraded
    /// before its replicas).
    pub(super) async fn capabilities_by(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<pb::Capabilities, Option<OperationError>> {
        let bound = deadline.min(tokio::time::Instant::now() + DESCRIBE_TIMEOUT);
        let provider = &self.cluster.spec.spec.provider;
        match tokio::time::timeout_at(bound, self.executor.capabilities(provider)).await {
            Ok(Ok(capabilities)) => Ok(capabilities),
            Ok(Err(status)) => {
                let message = format!(
                    "asking the provider's capabilities before planning failed: {}",
                    status.message()
                );
                Err(error(status.code(), message))
            }
            Err(_) => {
                let message = "timed out asking the provider's capabilities before planning";
                Err(error(Code::DeadlineExceeded, message))
            }
        }
    }
}

impl super::Executor {
    /// What the provider named `provider` supports, asked once and kept
    /// (it says callers may cache it); a provider without GetCapabilities
    /// has the defaults.
    pub(super) async fn capabilities(
        &self,
        provider: &str,
    ) -> Result<pb::Capabilities, tonic::Status> {
        if let Some(known) = self.capabilities_cache().get(provider) {
            return Ok(known.clone());
        }
        let mut client = self.providers.named(provider)?.client();
        let started = Instant::now();
        let answer = client.get_capabilities(pb::GetCapabilitiesRequest {}).await;
        self.observe_provider("GetCapabilities", started);
        let capabilities = match answer {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == Code::Unimplemented => pb::Capabilities::default(),
            Err(status) => return Err(status),
        };
        self.capabilities_cache()
            .insert(provider.to_string(), capabilities.clone());
        Ok(capabilities)
    }

    fn capabilities_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, pb::Capabilities>> {
        self.capabilities.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `status` ended a call at the end of the claim it was made
/// under (see [`due_by`]), rather than being the provider's answer. Such a
/// call is asked again once the claim is renewed: provider calls are
/// idempotent, and a slow provider is bounded by the operation's timeout,
/// not by one lease period.
///
/// The provider may say so itself: DEADLINE_EXCEEDED at the deadline
/// (give or take [`PROVIDER_CLOCK_SLACK`]) means it applied nothing because
/// the deadline came first (work longer than one claim's window goes on at
/// the provider across the repeated calls). One answered well before it is
/// a timeout of the provider's own: a failure.
fn cut_at_claim_end(status: &tonic::Status, deadline: std::time::Instant) -> bool {
    let now = std::time::Instant::now();
    match status.code() {
        Code::Cancelled => now >= deadline,
        Code::DeadlineExceeded => now + PROVIDER_CLOCK_SLACK >= deadline,
        _ => false,
    }
}

/// Whether the provider's error says that asking again may work: it is
/// unavailable, or busy. A mutating step is asked again only when the
/// provider is [`unavailable`]: RESOURCE_EXHAUSTED from a create or a
/// resize may be a quota that does not pass by itself.
fn is_transient(status: &tonic::Status) -> bool {
    unavailable(status) || status.code() == Code::ResourceExhausted
}

/// The provider said it is unavailable, or could not be asked at all (see
/// [`unreachable`]).
fn unavailable(status: &tonic::Status) -> bool {
    status.code() == Code::Unavailable || unreachable(status)
}

/// No answer from the provider: no connection, or one that broke mid-call
/// (a provider killed while it worked, which tonic reports as UNKNOWN).
/// Such a status is made here, with the transport error as its source; a
/// status the provider sent has none.
fn unreachable(status: &tonic::Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::Unknown)
        && std::error::Error::source(status).is_some()
}

/// The error that ends a call waiting for an unavailable provider when the
/// operation is cancelled (`Holding::cancel_seen`).
fn cancelled_waiting(status: &tonic::Status) -> tonic::Status {
    tonic::Status::cancelled(format!(
        "cancelled while waiting for the provider ({})",
        status.message()
    ))
}

/// The waits between attempts at a provider call: doubling from
/// [`RETRY_FIRST_WAIT`] up to [`RETRY_MAX_WAIT`].
struct Backoff {
    /// The next wait, and the ones after it.
    wait: Duration,
    waits: backon::ExponentialBackoff,
    /// Failures the provider answered (not [`unreachable`]) so far.
    answered: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        let mut waits = crate::retry::doubling(RETRY_FIRST_WAIT, RETRY_MAX_WAIT);
        Self {
            wait: waits.next().unwrap_or(RETRY_FIRST_WAIT),
            waits,
            answered: 0,
        }
    }
}

impl Backoff {
    /// Whether to ask again after `status`: while the next wait ends before
    /// `cutoff`, always for a provider that does not answer (restarting,
    /// cut off), [`ANSWERED_FAILURE_ATTEMPTS`] times for one that answers
    /// with a failure: a provider up and saying "unavailable" for longer
    /// may never get better (a node that cannot start), and its operation
    /// ends with its message instead of waiting for the timeout.
    fn allows(&mut self, status: &tonic::Status, cutoff: std::time::Instant) -> bool {
        if Instant::now() + self.wait >= cutoff {
            return false;
        }
        if unreachable(status) {
            return true;
        }
        self.answered += 1;
        self.answered < ANSWERED_FAILURE_ATTEMPTS
    }

    async fn sleep(&mut self) {
        tokio::time::sleep(self.wait).await;
        self.wait = self.waits.next().unwrap_or(RETRY_MAX_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider nobody listens for: the status tonic makes is told apart
    /// from one the provider sent, so the call is waited for, not failed
    /// after a few attempts.
    #[tokio::test]
    async fn a_refused_connection_is_unreachable_and_an_answer_is_not() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        let mut provider = crate::provider::connect_lazy(&endpoint).unwrap();
        let request = pb::GetCapabilitiesRequest {};
        let refused = provider.get_capabilities(request).await.unwrap_err();
        assert!(unreachable(&refused), "{refused:?}");
        assert!(unavailable(&refused));

        let answered = tonic::Status::unavailable("the provider says: not now");
        assert!(!unreachable(&answered));
        assert!(unavailable(&answered));
    }

    /// An answered failure is asked again a bounded number of times; an
    /// unreachable provider for as long as the cutoff allows.
    #[test]
    fn answered_failures_are_retried_a_bounded_number_of_times() {
        let cutoff = std::time::Instant::now() + Duration::from_secs(3600);
        let answered = tonic::Status::unavailable("not now");
        let mut backoff = Backoff::default();
        let allowed = (0..20)
            .filter(|_| backoff.allows(&answered, cutoff))
            .count();
        assert_eq!(allowed as u32, ANSWERED_FAILURE_ATTEMPTS - 1);

        let soon = std::time::Instant::now() + Duration::from_millis(100);
        assert!(
            !Backoff::default().allows(&answered, soon),
            "past the cutoff"
        );
    }
}
