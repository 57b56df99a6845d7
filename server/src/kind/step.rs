//! The provider calls an operation is made of: what each kind's plan
//! returns and the executor runs, one at a time.

use crate::cluster::machine::Event;

/// One provider call of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Provisions the cluster's nodes (powered on).
    CreateNodes,
    StartNodes,
    StopNodes,
    Resize {
        workers: Option<u32>,
        offering: Option<String>,
    },
    UpgradeNode {
        node_id: String,
        version: String,
    },
    /// Adds surge workers (a resize to `workers`) and upgrades the workers
    /// not among `known` (the nodes when it was planned) to `version`.
    Surge {
        workers: u32,
        known: Vec<String>,
        version: String,
    },
    /// Upgrades these workers side by side (the upgrade policy's
    /// `max_unavailable`), one UpgradeNode call each.
    UpgradeNodes {
        node_ids: Vec<String>,
        version: String,
    },
    /// Deletes these nodes, or every node when empty.
    DeleteNodes(Vec<String>),
    /// Restarts or rebuilds these nodes, or every node that is down when
    /// empty (a provider without RepairNodes has nothing to do here: the
    /// health check decides).
    RepairNodes(Vec<String>),
    /// Every node must be on and healthy.
    HealthCheck,
}

impl Step {
    pub fn name(&self) -> String {
        match self {
            Step::CreateNodes => "create nodes".into(),
            Step::StartNodes => "start nodes".into(),
            Step::StopNodes => "stop nodes".into(),
            Step::Resize { workers, offering } => match (workers, offering) {
                (Some(n), Some(o)) => format!("resize to {n} workers of offering {o}"),
                (Some(n), None) => format!("resize to {n} workers"),
                (None, Some(o)) => format!("change the node offering to {o}"),
                (None, None) => "resize".into(),
            },
            Step::UpgradeNode { node_id, version } => {
                format!("upgrade node {node_id} to {version}")
            }
            Step::UpgradeNodes { node_ids, version } => {
                format!("upgrade nodes {} to {version}", node_ids.join(","))
            }
            Step::Surge {
                workers, version, ..
            } => format!("surge to {workers} workers, the new ones at {version}"),
            Step::DeleteNodes(ids) if ids.is_empty() => "delete all nodes".into(),
            Step::DeleteNodes(ids) => format!("delete nodes {}", ids.join(",")),
            Step::RepairNodes(ids) if ids.is_empty() => "repair nodes".into(),
            Step::RepairNodes(ids) => format!("repair nodes {}", ids.join(",")),
            Step::HealthCheck => "health check".into(),
        }
    }

    /// The provider call the step makes: a metric label, so bounded.
    pub fn provider_call(&self) -> &'static str {
        match self {
            Step::CreateNodes => "CreateNodes",
            Step::StartNodes => "StartNodes",
            Step::StopNodes => "StopNodes",
            Step::Resize { .. } | Step::Surge { .. } => "ResizeNodes",
            Step::UpgradeNode { .. } | Step::UpgradeNodes { .. } => "UpgradeNode",
            Step::DeleteNodes(_) => "DeleteNodes",
            Step::RepairNodes(_) => "RepairNodes",
            Step::HealthCheck => "DescribeCluster",
        }
    }

    /// Whether the step changes anything at the provider. Progress is
    /// persisted (and a cancel noticed) only before such steps: a read-only
    /// step needs neither.
    pub fn is_mutating(&self) -> bool {
        !matches!(self, Step::HealthCheck)
    }

    /// The event a failure of this step sends: provisioning failures end in
    /// Error, everything else as the table says for OperationFailed.
    pub fn failure_event(&self) -> Event {
        match self {
            Step::CreateNodes => Event::CreateFailed,
            _ => Event::OperationFailed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Step;

    /// Step names are what an operator reads in progress and errors: words,
    /// not Rust's debug text.
    #[test]
    fn a_resize_is_named_in_words() {
        let resize = |workers, offering: Option<&str>| Step::Resize {
            workers,
            offering: offering.map(String::from),
        };
        assert_eq!(resize(Some(3), None).name(), "resize to 3 workers");
        assert_eq!(
            resize(None, Some("m2")).name(),
            "change the node offering to m2"
        );
        assert_eq!(
            resize(Some(5), Some("m2")).name(),
            "resize to 5 workers of offering m2"
        );
        let all = [resize(Some(3), None), resize(None, Some("m2"))];
        assert!(all.iter().all(|s| !s.name().contains("Some(")));
    }
}
