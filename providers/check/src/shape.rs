//! The shapes the checks ask for, chosen from the provider's capabilities
//! so that every request is one the provider says it can build.

use drover_proto::provider::v1 as pb;
use drover_proto::v1 as api;

/// Version asked for when the provider names none (any is fine then).
const ANY_VERSION: &str = "1.0.0";
/// Upgrade target when the provider names no versions.
const ANY_NEXT_VERSION: &str = "1.0.1";
/// Offering asked for when the provider names none.
const ANY_OFFERING: &str = "small";

/// What the checks create, resize to and upgrade to.
#[derive(Clone, Debug)]
pub struct Plan {
    pub control_nodes: u32,
    pub worker_nodes: u32,
    pub version: String,
    pub offering: String,
    /// The version UpgradeNode goes to: another one the provider runs when
    /// it names two or more, else the same (upgrading to it changes nothing).
    pub upgrade_to: String,
    /// The worker count ResizeNodes goes to, within the limits: one more
    /// worker when allowed, else one fewer; `None` when neither is.
    pub resize_workers: Option<u32>,
    /// The offering ResizeNodes moves to, when the provider names another.
    pub resize_offering: Option<String>,
    /// Whether RunTask can be checked: the provider offers "repair" tasks
    /// (a backup would need a location the kit cannot know).
    pub repair: bool,
}

impl Plan {
    /// The smallest shape with a worker (when workers are allowed), at the
    /// first version and offering the provider names. No capabilities
    /// (GetCapabilities UNIMPLEMENTED): the contract's defaults, any version
    /// and offering, one control node and two workers, both task types.
    pub fn from_capabilities(capabilities: Option<&pb::Capabilities>) -> Self {
        let default = pb::Capabilities {
            task_types: vec!["repair".into()],
            ..Default::default()
        };
        let caps = capabilities.unwrap_or(&default);
        let control_nodes = caps.min_control_nodes.max(1);
        let worker_nodes = match caps.max_worker_nodes {
            0 => caps.min_worker_nodes.max(1),
            max => caps.min_worker_nodes.max(1).min(max),
        };
        let version = caps.versions.first().cloned();
        let upgrade_to = match caps.versions.get(1) {
            Some(next) => next.clone(),
            None => version.clone().unwrap_or_else(|| ANY_NEXT_VERSION.into()),
        };
        let offering = caps.offerings.first().cloned();
        let more = worker_nodes + 1;
        let resize_workers = if caps.max_worker_nodes == 0 || more <= caps.max_worker_nodes {
            Some(more)
        } else {
            worker_nodes
                .checked_sub(1)
                .filter(|fewer| *fewer >= caps.min_worker_nodes)
        };
        Self {
            control_nodes,
            worker_nodes,
            version: version.unwrap_or_else(|| ANY_VERSION.into()),
            offering: offering.unwrap_or_else(|| ANY_OFFERING.into()),
            upgrade_to,
            resize_workers,
            resize_offering: caps.offerings.get(1).cloned(),
            repair: caps.task_types.iter().any(|t| t == "repair"),
        }
    }

    /// The shape the checks create.
    pub fn shape(&self) -> pb::ClusterShape {
        pb::ClusterShape {
            control_nodes: self.control_nodes,
            worker_nodes: self.worker_nodes,
            offering: self.offering.clone(),
            version: self.version.clone(),
        }
    }

    /// The task spec RunTask carries: a repair named `name`, with the
    /// default properties.
    pub fn repair_spec(name: &str) -> api::TaskSpec {
        api::TaskSpec {
            r#type: api::TaskType::Repair as i32,
            name: name.to_string(),
            schedule: None,
            properties: Some(api::task_spec::Properties::Repair(
                api::RepairProperties::default(),
            )),
        }
    }
}
