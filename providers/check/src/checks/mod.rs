//! The checks, and what they share: the kit (link, plan, capabilities),
//! each check's scope (the clusters it made, deleted afterwards), and the
//! comparison of node lists.

mod fencing;
mod nodes;
mod tasks;

use crate::client::{Link, Provider};
use crate::{Plan, Verdict};
use drover_proto::provider::v1 as pb;
use std::time::Duration;
use tonic::{Code, Response, Status};

/// Every check, in the order the runner runs them.
pub const NAMES: &[&str] = &[
    "capabilities",
    "validate-spec",
    "create-describe",
    "create-idempotent",
    "stop-idempotent",
    "start-idempotent",
    "resize-idempotent",
    "upgrade-idempotent",
    "delete-idempotent",
    "repair-healthy",
    "missing-token",
    "unknown-cluster",
    "stale-token-refused",
    "fenced-describe",
    "drain",
    "deadline",
    "long-work",
    "task-run",
    "task-stop-unknown",
    "task-fenced-stop",
];

/// The epoch a check's clusters are made under; checks go one above it
/// to fence and one below is never needed.
const EPOCH: i64 = 5;
/// The epoch of the cleanup: above any a check uses, so it is admitted
/// (and drains whatever a failed check left in flight).
const CLEANUP_EPOCH: i64 = 1_000_000;
/// A check's time bound, in call timeouts: the longest check makes about
/// ten calls in a row.
const CHECK_CALLS: u32 = 12;

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    #[error("{call}: {code:?}: {message}")]
    Rpc {
        call: String,
        code: Code,
        message: String,
    },
    #[error("{call}: answered {code:?} ({message}), the contract says {want:?}")]
    Code {
        call: String,
        code: Code,
        message: String,
        want: Code,
    },
    #[error("{call}: succeeded, the contract says {want:?}")]
    Succeeded { call: String, want: Code },
    #[error("{0}")]
    Broken(String),
    /// Not what the contract says, but maybe a race with the provider's
    /// own timing: a check may try again.
    #[error("{0}")]
    Raced(String),
    #[error("the check did not end within {0:?}")]
    TimedOut(Duration),
}

/// What a check found when it did not fail.
pub(crate) type Outcome = Result<Verdict, Failure>;

/// The answer of `call`, or the failure naming it.
pub(crate) fn ok<T>(call: &str, answer: Result<Response<T>, Status>) -> Result<T, Failure> {
    answer
        .map(Response::into_inner)
        .map_err(|status| Failure::Rpc {
            call: call.to_string(),
            code: status.code(),
            message: status.message().to_string(),
        })
}

/// The refusal of `call` with `want`, or the failure saying what came.
pub(crate) fn refused<T>(
    call: &str,
    answer: Result<Response<T>, Status>,
    want: Code,
) -> Result<Status, Failure> {
    match answer {
        Err(status) if status.code() == want => Ok(status),
        Err(status) => Err(Failure::Code {
            call: call.to_string(),
            code: status.code(),
            message: status.message().to_string(),
            want,
        }),
        Ok(_) => Err(Failure::Succeeded {
            call: call.to_string(),
            want,
        }),
    }
}

/// What the kit compares of a node: what a call sets. Health and facts
/// may move between an answer and the describe after it (a standby
/// catching up), so they are not compared.
pub(crate) fn idents(nodes: &[pb::ProviderNode]) -> Vec<String> {
    let mut idents: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{} {} {} {} {}",
                n.id, n.role, n.power_state, n.version, n.offering
            )
        })
        .collect();
    idents.sort();
    idents
}

/// A cluster a check acts on, by uid.
#[derive(Clone)]
pub(crate) struct Cluster {
    pub uid: String,
}

impl Cluster {
    pub fn token(&self, epoch: i64) -> Option<pb::FencingToken> {
        Some(pb::FencingToken {
            cluster_uid: self.uid.clone(),
            epoch,
            operation_id: format!("drover-provider-check-{epoch}"),
        })
    }
}

/// What the checks run with.
pub struct Kit {
    link: Link,
    plan: Plan,
    capabilities: Option<pb::Capabilities>,
    simulator: bool,
}

impl Kit {
    pub(crate) fn new(
        link: Link,
        plan: Plan,
        capabilities: Option<pb::Capabilities>,
        simulator: bool,
    ) -> Self {
        Self {
            link,
            plan,
            capabilities,
            simulator,
        }
    }

    /// Runs check `name` within its time bound, then deletes the clusters it
    /// made, whatever it ended with.
    pub(crate) async fn run(&self, name: &str) -> Verdict {
        let mut scope = Scope {
            kit: self,
            made: Vec::new(),
        };
        let bound = self.link.call_timeout * CHECK_CALLS;
        let outcome = tokio::time::timeout(bound, dispatch(name, &mut scope))
            .await
            .unwrap_or(Err(Failure::TimedOut(bound)));
        let cleanup = scope.clean_up().await;
        match (outcome, cleanup) {
            (Err(failure), _) => Verdict::Fail(failure.to_string()),
            (Ok(_), Err(failure)) => Verdict::Fail(format!("cleanup: {failure}")),
            (Ok(verdict), Ok(())) => verdict,
        }
    }
}

async fn dispatch(name: &str, s: &mut Scope<'_>) -> Outcome {
    match name {
        "capabilities" => nodes::capabilities(s).await,
        "validate-spec" => nodes::validate_spec(s).await,
        "create-describe" => nodes::create_describe(s).await,
        "create-idempotent" => nodes::create_idempotent(s).await,
        "stop-idempotent" => nodes::stop_idempotent(s).await,
        "start-idempotent" => nodes::start_idempotent(s).await,
        "resize-idempotent" => nodes::resize_idempotent(s).await,
        "upgrade-idempotent" => nodes::upgrade_idempotent(s).await,
        "delete-idempotent" => nodes::delete_idempotent(s).await,
        "repair-healthy" => nodes::repair_healthy(s).await,
        "missing-token" => fencing::missing_token(s).await,
        "unknown-cluster" => fencing::unknown_cluster(s).await,
        "stale-token-refused" => fencing::stale_token_refused(s).await,
        "fenced-describe" => fencing::fenced_describe(s).await,
        "drain" => fencing::drain(s).await,
        "deadline" => fencing::deadline(s).await,
        "long-work" => fencing::long_work(s).await,
        "task-run" => tasks::task_run(s).await,
        "task-stop-unknown" => tasks::task_stop_unknown(s).await,
        "task-fenced-stop" => tasks::task_fenced_stop(s).await,
        other => Err(Failure::Broken(format!("no check named {other}"))),
    }
}

/// One check's view: the kit, and the clusters it made.
pub(crate) struct Scope<'k> {
    kit: &'k Kit,
    made: Vec<String>,
}

impl Scope<'_> {
    pub fn plan(&self) -> &Plan {
        &self.kit.plan
    }

    pub fn capabilities(&self) -> Option<&pb::Capabilities> {
        self.kit.capabilities.as_ref()
    }

    pub fn link(&self) -> &Link {
        &self.kit.link
    }

    pub fn provider(&self) -> Provider {
        self.kit.link.provider()
    }

    /// A fresh cluster uid, deleted after the check.
    pub fn cluster(&mut self) -> Cluster {
        let uid = format!("drover-provider-check-{}", uuid::Uuid::new_v4());
        self.made.push(uid.clone());
        Cluster { uid }
    }

    /// The nodes of `cluster`, as an unfenced DescribeCluster sees them.
    pub async fn describe(&self, cluster: &Cluster) -> Result<Vec<pb::ProviderNode>, Failure> {
        let request = pb::DescribeClusterRequest {
            cluster_uid: cluster.uid.clone(),
            token: None,
        };
        let answer = self
            .provider()
            .describe_cluster(self.link().due(request))
            .await;
        Ok(ok("DescribeCluster", answer)?.nodes)
    }

    /// Checks that a DescribeCluster now shows the nodes `call` answered.
    pub async fn agrees(
        &self,
        call: &str,
        cluster: &Cluster,
        answered: &[pb::ProviderNode],
    ) -> Result<(), Failure> {
        let described = self.describe(cluster).await?;
        if idents(&described) != idents(answered) {
            return Err(Failure::Broken(format!(
                "DescribeCluster after {call} shows {:?}, the call answered {:?}",
                idents(&described),
                idents(answered)
            )));
        }
        Ok(())
    }

    /// The CreateNodes request of the plan's shape under `epoch`.
    pub fn create_request(&self, cluster: &Cluster, epoch: i64) -> pb::CreateNodesRequest {
        let plan = self.plan();
        pb::CreateNodesRequest {
            token: cluster.token(epoch),
            control_nodes: plan.control_nodes,
            worker_nodes: plan.worker_nodes,
            offering: plan.offering.clone(),
            version: plan.version.clone(),
        }
    }

    /// Creates `cluster` in the plan's shape under [`EPOCH`]; checks that
    /// the answer has every node asked for, on, and that describe agrees.
    pub async fn create(&self, cluster: &Cluster) -> Result<Vec<pb::ProviderNode>, Failure> {
        let request = self.link().due(self.create_request(cluster, EPOCH));
        let nodes = ok("CreateNodes", self.provider().create_nodes(request).await)?.nodes;
        self.has_shape("CreateNodes", &nodes)?;
        self.agrees("CreateNodes", cluster, &nodes).await?;
        Ok(nodes)
    }

    /// Checks that `nodes` are the plan's shape, every node on.
    pub fn has_shape(&self, call: &str, nodes: &[pb::ProviderNode]) -> Result<(), Failure> {
        let plan = self.plan();
        let count = |role: &str| nodes.iter().filter(|n| n.role == role).count() as u32;
        let wrong = nodes.iter().find(|n| {
            n.power_state != "on" || n.version != plan.version || n.offering != plan.offering
        });
        if count("control") != plan.control_nodes || count("worker") != plan.worker_nodes {
            return Err(Failure::Broken(format!(
                "{call} asked for {} control and {} worker nodes, answered {:?}",
                plan.control_nodes,
                plan.worker_nodes,
                idents(nodes)
            )));
        }
        if let Some(node) = wrong {
            return Err(Failure::Broken(format!(
                "{call} asked for nodes on at version {} offering {}, answered {:?}",
                plan.version,
                plan.offering,
                idents(std::slice::from_ref(node))
            )));
        }
        Ok(())
    }

    /// Sets the simulator's configuration, when the kit may use it.
    pub async fn simulator(&self, config: pb::SimulatorConfig) -> Result<(), Failure> {
        if !self.kit.simulator {
            return Ok(());
        }
        let request = self.link().due(config);
        ok(
            "Simulator.Configure",
            self.link().simulator().configure(request).await,
        )?;
        Ok(())
    }

    /// Deletes every node of every cluster the check made, under an epoch
    /// above any it used; checks that none is left.
    async fn clean_up(&self) -> Result<(), Failure> {
        for uid in &self.made {
            let cluster = Cluster { uid: uid.clone() };
            let request = pb::DeleteNodesRequest {
                token: cluster.token(CLEANUP_EPOCH),
                node_ids: Vec::new(),
            };
            let answer = self.provider().delete_nodes(self.link().due(request)).await;
            let left = ok("DeleteNodes (all)", answer)?.nodes;
            if !left.is_empty() {
                return Err(Failure::Broken(format!(
                    "DeleteNodes (all) left {:?}",
                    idents(&left)
                )));
            }
        }
        Ok(())
    }
}

pub(crate) fn pass(note: impl Into<String>) -> Outcome {
    Ok(Verdict::Pass(note.into()))
}

pub(crate) fn skip(note: impl Into<String>) -> Outcome {
    Ok(Verdict::Skip(note.into()))
}
