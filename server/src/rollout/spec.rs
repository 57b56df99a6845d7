//! What a rollout asks for, as stored (JSON) and as checked: every field a
//! request gets wrong is named the way the API spells it
//! (`spec.stages[1].max_concurrency`), and nothing is written.

use crate::cluster::validate::{self, FieldError};
use drover_proto::v1;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// The most stages a rollout has, and clusters it names explicitly.
const MAX_STAGES: usize = 20;
const MAX_NAMED_CLUSTERS: usize = 10_000;

/// A count, or a percentage of a whole (`"25%"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    Count(u32),
    Percent(u32),
}

impl Amount {
    /// Parses `"3"` or `"25%"`; empty is `default`.
    fn parse(field: &str, text: &str, default: Amount) -> Result<Amount, FieldError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(default);
        }
        let bad = || {
            FieldError::new(
                field,
                format!("{text:?} is neither a count nor a percentage like \"25%\""),
            )
        };
        match text.strip_suffix('%') {
            Some(percent) => {
                let percent: u32 = percent.parse().map_err(|_| bad())?;
                if percent > 100 {
                    return Err(FieldError::new(field, "a percentage is at most 100%"));
                }
                Ok(Amount::Percent(percent))
            }
            None => text.parse().map(Amount::Count).map_err(|_| bad()),
        }
    }

    /// The amount of `whole`, a percentage rounded up or down.
    pub fn of(self, whole: usize, round_up: bool) -> usize {
        match self {
            Amount::Count(count) => count as usize,
            Amount::Percent(percent) => {
                let scaled = whole * percent as usize;
                if round_up {
                    scaled.div_ceil(100)
                } else {
                    scaled / 100
                }
            }
        }
    }

    fn text(self) -> String {
        match self {
            Amount::Count(count) => count.to_string(),
            Amount::Percent(percent) => format!("{percent}%"),
        }
    }
}

/// The change a rollout makes on each target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Upgrade { version: String },
    NodeOffering { offering: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBusy {
    #[default]
    Wait,
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    pub max_concurrency: Amount,
    #[serde(default)]
    pub soak_seconds: u32,
    #[serde(default)]
    pub approval_required: bool,
}

impl Stage {
    /// How many of the stage's `targets` may run at once: at least one.
    pub fn concurrency(&self, targets: usize) -> usize {
        self.max_concurrency.of(targets, true).max(1)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    pub action: Action,
    pub stages: Vec<Stage>,
    pub max_failures: Amount,
    #[serde(default)]
    pub on_busy: OnBusy,
}

impl RolloutSpec {
    /// The stage a cluster with `labels` falls in: the first whose
    /// selector it matches.
    pub fn stage_of(&self, labels: &BTreeMap<String, String>) -> Option<usize> {
        self.stages
            .iter()
            .position(|stage| matches(&stage.selector, labels))
    }

    /// Whether a cluster named `name` with `labels` is a target.
    pub fn targets(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        if self.clusters.is_empty() {
            matches(&self.selector, labels)
        } else {
            self.clusters.iter().any(|c| c == name)
        }
    }

    /// Checks a requested spec; the first wrong field, otherwise.
    pub fn from_proto(spec: Option<v1::RolloutSpec>) -> Result<RolloutSpec, FieldError> {
        let spec = spec.ok_or_else(|| FieldError::new("spec", "is required"))?;
        let action = action(&spec)?;
        check_targets(&spec)?;
        if spec.stages.is_empty() {
            return Err(FieldError::new(
                "spec.stages",
                "at least one stage is required",
            ));
        }
        if spec.stages.len() > MAX_STAGES {
            let reason = format!("at most {MAX_STAGES} stages");
            return Err(FieldError::new("spec.stages", reason));
        }
        let mut names = HashSet::new();
        let mut stages = Vec::new();
        for (i, stage) in spec.stages.into_iter().enumerate() {
            let field = format!("spec.stages[{i}]");
            if !names.insert(stage.name.clone()) {
                let reason = format!("{:?} names an earlier stage too", stage.name);
                return Err(FieldError::new(format!("{field}.name"), reason));
            }
            stages.push(stage_from_proto(&field, stage)?);
        }
        let on_busy = match v1::OnBusy::try_from(spec.on_busy) {
            Ok(v1::OnBusy::Wait) => OnBusy::Wait,
            Ok(v1::OnBusy::Skip) => OnBusy::Skip,
            Err(_) => return Err(FieldError::new("spec.on_busy", "is not a known choice")),
        };
        Ok(RolloutSpec {
            selector: spec.selector.into_iter().collect(),
            clusters: spec.clusters,
            action,
            stages,
            max_failures: Amount::parse("spec.max_failures", &spec.max_failures, Amount::Count(0))?,
            on_busy,
        })
    }

    pub fn to_proto(&self) -> v1::RolloutSpec {
        let (version, node_offering) = match &self.action {
            Action::Upgrade { version } => (version.clone(), String::new()),
            Action::NodeOffering { offering } => (String::new(), offering.clone()),
        };
        v1::RolloutSpec {
            selector: self.selector.clone().into_iter().collect(),
            clusters: self.clusters.clone(),
            version,
            node_offering,
            stages: self.stages.iter().map(stage_to_proto).collect(),
            max_failures: self.max_failures.text(),
            on_busy: match self.on_busy {
                OnBusy::Wait => v1::OnBusy::Wait,
                OnBusy::Skip => v1::OnBusy::Skip,
            } as i32,
        }
    }
}

/// Whether `labels` carry every pair of `selector`.
fn matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn action(spec: &v1::RolloutSpec) -> Result<Action, FieldError> {
    match (spec.version.is_empty(), spec.node_offering.is_empty()) {
        (false, true) => {
            validate::version("spec.version", &spec.version)?;
            Ok(Action::Upgrade {
                version: spec.version.clone(),
            })
        }
        (true, false) => {
            validate::node_offering("spec.node_offering", &spec.node_offering)?;
            Ok(Action::NodeOffering {
                offering: spec.node_offering.clone(),
            })
        }
        (true, true) => Err(FieldError::new(
            "spec.version",
            "one of version and node_offering is required",
        )),
        (false, false) => Err(FieldError::new(
            "spec.node_offering",
            "only one of version and node_offering may be set",
        )),
    }
}

fn check_targets(spec: &v1::RolloutSpec) -> Result<(), FieldError> {
    match (spec.selector.is_empty(), spec.clusters.is_empty()) {
        (true, true) => {
            return Err(FieldError::new(
                "spec.selector",
                "one of selector and clusters is required",
            ))
        }
        (false, false) => {
            return Err(FieldError::new(
                "spec.clusters",
                "only one of selector and clusters may be set",
            ))
        }
        _ => {}
    }
    let selector = spec.selector.clone().into_iter().collect();
    validate::labels("spec.selector", &selector)?;
    if spec.clusters.len() > MAX_NAMED_CLUSTERS {
        let reason = format!("at most {MAX_NAMED_CLUSTERS} clusters");
        return Err(FieldError::new("spec.clusters", reason));
    }
    let mut seen = HashSet::new();
    for (i, name) in spec.clusters.iter().enumerate() {
        validate::cluster_name(&format!("spec.clusters[{i}]"), name)?;
        if !seen.insert(name) {
            let reason = format!("{name:?} is listed twice");
            return Err(FieldError::new(format!("spec.clusters[{i}]"), reason));
        }
    }
    Ok(())
}

fn stage_from_proto(field: &str, stage: v1::RolloutStage) -> Result<Stage, FieldError> {
    crate::names::dns_label(&stage.name)
        .map_err(|reason| FieldError::new(format!("{field}.name"), reason))?;
    let selector = stage.selector.into_iter().collect();
    validate::labels(&format!("{field}.selector"), &selector)?;
    let concurrency_field = format!("{field}.max_concurrency");
    let max_concurrency =
        Amount::parse(&concurrency_field, &stage.max_concurrency, Amount::Count(1))?;
    if matches!(max_concurrency, Amount::Count(0) | Amount::Percent(0)) {
        return Err(FieldError::new(
            concurrency_field,
            "must be at least 1 (or 1%)",
        ));
    }
    Ok(Stage {
        name: stage.name,
        selector,
        max_concurrency,
        soak_seconds: stage.soak_seconds,
        approval_required: stage.approval_required,
    })
}

fn stage_to_proto(stage: &Stage) -> v1::RolloutStage {
    v1::RolloutStage {
        name: stage.name.clone(),
        selector: stage.selector.clone().into_iter().collect(),
        max_concurrency: stage.max_concurrency.text(),
        soak_seconds: stage.soak_seconds,
        approval_required: stage.approval_required,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> v1::RolloutSpec {
        v1::RolloutSpec {
            selector: [("fleet".to_string(), "a".to_string())].into(),
            version: "1.31.2".into(),
            stages: vec![
                v1::RolloutStage {
                    name: "canary".into(),
                    max_concurrency: "1".into(),
                    ..Default::default()
                },
                v1::RolloutStage {
                    name: "rest".into(),
                    max_concurrency: "25%".into(),
                    ..Default::default()
                },
            ],
            max_failures: "10%".into(),
            ..Default::default()
        }
    }

    fn field_of(spec: v1::RolloutSpec) -> String {
        RolloutSpec::from_proto(Some(spec)).unwrap_err().field
    }

    #[test]
    fn a_good_spec_round_trips() {
        let spec = RolloutSpec::from_proto(Some(request())).unwrap();
        assert_eq!(spec.stages[1].max_concurrency, Amount::Percent(25));
        assert_eq!(spec.max_failures, Amount::Percent(10));
        assert_eq!(
            RolloutSpec::from_proto(Some(spec.to_proto())).unwrap(),
            spec
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut bad = request();
        bad.stages[1].max_concurrency = "lots".into();
        assert_eq!(field_of(bad), "spec.stages[1].max_concurrency");
        let mut bad = request();
        bad.stages[0].max_concurrency = "0".into();
        assert_eq!(field_of(bad), "spec.stages[0].max_concurrency");
        let mut bad = request();
        bad.stages[1].name = "canary".into();
        assert_eq!(field_of(bad), "spec.stages[1].name");
        let mut bad = request();
        bad.max_failures = "101%".into();
        assert_eq!(field_of(bad), "spec.max_failures");
        let mut bad = request();
        bad.version = "one".into();
        assert_eq!(field_of(bad), "spec.version");
        let mut bad = request();
        bad.node_offering = "m".into();
        assert_eq!(field_of(bad), "spec.node_offering");
        let mut bad = request();
        bad.clusters = vec!["a".into()];
        assert_eq!(field_of(bad), "spec.clusters");
        let mut bad = request();
        bad.stages.clear();
        assert_eq!(field_of(bad), "spec.stages");
        assert_eq!(RolloutSpec::from_proto(None).unwrap_err().field, "spec");
    }

    #[test]
    fn percentages_round_as_documented() {
        assert_eq!(Amount::Percent(25).of(10, true), 3);
        assert_eq!(Amount::Percent(25).of(10, false), 2);
        assert_eq!(Amount::Count(4).of(10, true), 4);
        let stage = RolloutSpec::from_proto(Some(request())).unwrap().stages[1].clone();
        assert_eq!(stage.concurrency(1), 1);
        assert_eq!(stage.concurrency(0), 1);
    }

    #[test]
    fn a_cluster_falls_in_the_first_stage_it_matches() {
        let mut spec = RolloutSpec::from_proto(Some(request())).unwrap();
        spec.stages[0].selector = [("ring".to_string(), "0".to_string())].into();
        let ring0 = [("ring".to_string(), "0".to_string())].into();
        assert_eq!(spec.stage_of(&ring0), Some(0));
        assert_eq!(spec.stage_of(&BTreeMap::new()), Some(1));
    }
}
