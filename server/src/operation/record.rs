//! The operation record, `operations/<cluster>/<id>`.

use crate::cluster::machine::Event;
use crate::cluster::{ClusterState, SCHEMA_VERSION};
use serde::{Deserialize, Serialize};

pub use crate::kind::OperationKind;

/// Where an operation is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl OperationState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OperationState::Succeeded | OperationState::Failed | OperationState::Cancelled
        )
    }
}

/// Parameters, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_offering: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<crate::cluster::Autoscaling>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_ids: Vec<String>,
    /// A start that provisions the cluster's nodes first (the first start).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provision: bool,
    /// An upgrade whose caller accepted that it may lower the version.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_downgrade: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub step: u32,
    pub total_steps: u32,
    pub step_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationError {
    /// Canonical gRPC code name.
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationRecord {
    pub schema: u32,
    pub id: String,
    pub cluster: String,
    pub cluster_uid: String,
    pub kind: OperationKind,
    /// The request event that admitted it.
    pub event: EventName,
    pub params: OperationParams,
    pub state: OperationState,
    pub from_state: ClusterState,
    pub entered_state: ClusterState,
    /// Whether it holds the slot without having moved the state.
    #[serde(default)]
    pub go_ahead: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<OperationError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_epoch: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default)]
    pub cancel_requested: bool,
    /// Why an admin abandoned it (AbandonOperation): a cancel that ends
    /// even an operation whose provider cannot be fenced, saying so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandon_reason: Option<String>,
    /// Every owner that ran it, in order (more than one once a new owner
    /// resumed it after its owner was lost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<OperationRun>,
    /// The W3C `traceparent` of its accept, when traced: every owner's run
    /// continues that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
}

/// One owner's turn at running an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationRun {
    pub replica: String,
    pub epoch: i64,
    /// The `traceparent` of this owner's run span, when traced: a later
    /// owner's run links to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_span: Option<String>,
}

/// An [`Event`] stored by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventName(#[serde(with = "event_serde")] pub Event);

mod event_serde {
    use crate::cluster::machine::Event;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(event: &Event, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&event.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Event, D::Error> {
        let name = String::deserialize(d)?;
        Event::ALL
            .into_iter()
            .find(|e| e.to_string() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown event {name:?}")))
    }
}

impl OperationRecord {
    /// A new PENDING operation.
    #[allow(clippy::too_many_arguments)]
    pub fn pending(
        id: String,
        cluster: &str,
        cluster_uid: &str,
        kind: OperationKind,
        event: Event,
        params: OperationParams,
        from_state: ClusterState,
        entered_state: ClusterState,
        request_id: &str,
        now: String,
    ) -> Self {
        Self {
            schema: SCHEMA_VERSION,
            id,
            cluster: cluster.to_string(),
            cluster_uid: cluster_uid.to_string(),
            kind,
            event: EventName(event),
            params,
            state: OperationState::Pending,
            go_ahead: from_state == entered_state,
            from_state,
            entered_state,
            progress: None,
            error: None,
            replica: None,
            owner_epoch: None,
            request_id: request_id.to_string(),
            created_at: now,
            started_at: None,
            finished_at: None,
            cancel_requested: false,
            abandon_reason: None,
            runs: Vec::new(),
            // The accept's span, current here: the trace every run continues.
            trace_parent: drover_telemetry::traceparent(&tracing::Span::current()),
        }
    }

    /// Records that `replica` runs it from now on, under `epoch`.
    pub fn run_by(&mut self, replica: &str, epoch: i64) {
        if let (true, Some(earlier), Some(by)) =
            (self.runs.is_empty(), self.owner_epoch, &self.replica)
        {
            // Written before runs were recorded: its first owner.
            let first = OperationRun {
                replica: by.clone(),
                epoch: earlier,
                trace_span: None,
            };
            self.runs.push(first);
        }
        self.replica = Some(replica.to_string());
        self.owner_epoch = Some(epoch);
        if self.runs.last().is_none_or(|last| last.epoch != epoch) {
            self.runs.push(OperationRun {
                replica: replica.to_string(),
                epoch,
                trace_span: None,
            });
        }
    }

    /// Records the run span of the owner at `epoch` (see
    /// [`OperationRun::trace_span`]).
    pub fn trace_run(&mut self, epoch: i64, traceparent: Option<String>) {
        if let Some(run) = self.runs.iter_mut().rfind(|run| run.epoch == epoch) {
            run.trace_span = run.trace_span.take().or(traceparent);
        }
    }

    /// The run spans of the owners before the one at `epoch`.
    pub fn earlier_run_spans(&self, epoch: i64) -> impl Iterator<Item = &str> {
        let earlier = self.runs.iter().filter(move |run| run.epoch != epoch);
        earlier.filter_map(|run| run.trace_span.as_deref())
    }

    /// How many times an owner was lost while running it.
    pub fn orphaned(&self) -> usize {
        self.runs.len().saturating_sub(1)
    }
}

/// The idempotency index entry, `requests/<cluster>/<request_id>`: the
/// operation a request id created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub schema: u32,
    pub operation_id: String,
    /// The operation as it ended, once history collection deleted its own
    /// record: a retried request id still answers with it (see
    /// `REQUEST_RETENTION`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Box<OperationRecord>>,
}

impl RequestRecord {
    /// The entry written when the operation is accepted.
    pub fn new(operation_id: &str) -> Self {
        Self {
            schema: SCHEMA_VERSION,
            operation_id: operation_id.to_string(),
            operation: None,
        }
    }

    /// The entry that outlives the operation's own record, carrying it.
    pub fn carrying(operation: OperationRecord) -> Self {
        Self {
            schema: SCHEMA_VERSION,
            operation_id: operation.id.clone(),
            operation: Some(Box::new(operation)),
        }
    }

    /// Reads either form: the JSON record, or the bare operation id that
    /// replicas wrote before the entry became JSON (still found during and
    /// after a rolling upgrade).
    pub fn parse(value: &[u8]) -> Result<Self, serde_json::Error> {
        if value.first() == Some(&b'{') {
            return serde_json::from_slice(value);
        }
        match std::str::from_utf8(value) {
            Ok(id) if !id.is_empty() && !id.contains(char::is_whitespace) => Ok(Self::new(id)),
            // Neither form: serde's own error says what is wrong with it.
            _ => serde_json::from_slice(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::machine::Event;

    #[test]
    fn a_request_entry_reads_in_both_forms() {
        let id = "0193a4b2-7c1d-7e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(
            RequestRecord::parse(id.as_bytes()).unwrap(),
            RequestRecord::new(id),
            "the bare id older replicas wrote"
        );
        let json = crate::cluster::to_json(&RequestRecord::new(id));
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["operation_id"], id);
        assert_eq!(RequestRecord::parse(&json).unwrap(), RequestRecord::new(id));

        let operation = OperationRecord::pending(
            id.into(),
            "c",
            "uid",
            OperationKind::Stop,
            Event::StopRequested,
            OperationParams::default(),
            ClusterState::Running,
            ClusterState::Stopping,
            "stop-1",
            "2026-01-01T00:00:00Z".into(),
        );
        let carrying = RequestRecord::carrying(operation.clone());
        let read = RequestRecord::parse(&crate::cluster::to_json(&carrying)).unwrap();
        assert_eq!(read.operation.as_deref(), Some(&operation));
        assert!(RequestRecord::parse(b"").is_err());
        assert!(RequestRecord::parse(b"not an id").is_err());
    }
}
