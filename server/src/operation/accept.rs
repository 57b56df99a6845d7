//! Accepting a lifecycle request: decide the event from the request and the
//! cluster as read, check the table, and commit everything in one
//! transaction guarded by the state key's revision.

use super::*;
use crate::cluster::machine::{self, Admission, Event};
use crate::cluster::validate::{self, FieldError};
use crate::cluster::{ClusterRecord, FirstOperation, OperationSlot, Spec, SpecRecord, StateRecord};

/// A request to run an operation on a cluster.
#[derive(Debug, Clone)]
pub struct LifecycleRequest {
    pub kind: OperationKind,
    pub params: OperationParams,
    pub request_id: String,
}

/// What accepting a request in the cluster's current state means.
struct Admitted {
    event: Event,
    entered: ClusterState,
    /// The spec after the request, when it changes it.
    spec: Option<Spec>,
    /// Only the spec changes (scaling a Created cluster): no execution.
    spec_only: bool,
}

/// The spec after `request` on a cluster with `current`, validated; None
/// when the request leaves it as it is.
fn desired_spec(current: &Spec, request: &LifecycleRequest) -> Result<Option<Spec>> {
    let mut spec = current.clone();
    if !request.kind.rules().edit_spec(&mut spec, &request.params)? {
        return Ok(None);
    }
    validate::spec("spec", &spec).map_err(|mut error| {
        error.field = request_field(request.kind, &error.field);
        error
    })?;
    Ok((spec != *current).then_some(spec))
}

/// The request's own field for a field of the spec it would produce: the
/// caller sent `count` or `autoscaling`, not a spec.
pub fn request_field(kind: OperationKind, spec_field: &str) -> String {
    let field = spec_field.strip_prefix("spec.").unwrap_or(spec_field);
    kind.rules()
        .request_field(field)
        .unwrap_or(field)
        .to_string()
}

fn admit(cluster: &ClusterRecord, request: &LifecycleRequest) -> Result<Admitted> {
    let rules = request.kind.rules();
    let state = cluster.state.state;
    let spec = &cluster.spec.spec;
    let event = rules.event(spec, &request.params);
    let desired = desired_spec(spec, request)?;
    rules.refuse(cluster, &request.params, desired.as_ref())?;
    if rules.spec_only(state) {
        return Ok(Admitted {
            event,
            entered: state,
            spec: desired,
            spec_only: true,
        });
    }
    let entered = match machine::admit(state, event) {
        Some(Admission::Moves(to)) => to,
        Some(Admission::GoAhead) => state,
        None => {
            return Err(LifecycleError::NoTransition {
                cluster: cluster.spec.name.clone(),
                state,
                kind: request.kind.name(),
            })
        }
    };
    rules.refuse_admitted(cluster, &request.params)?;
    Ok(Admitted {
        event,
        entered,
        spec: desired,
        spec_only: false,
    })
}

/// The state record an accept leaves: the slot filled and the state
/// entered, or, for an edit of the spec alone, the state as it was (and the
/// operation already done).
fn state_after(
    view: &ClusterRecord,
    operation: &mut OperationRecord,
    admitted: &Admitted,
    now: String,
) -> StateRecord {
    let mut state = view.state.clone();
    if admitted.spec_only {
        operation.state = OperationState::Succeeded;
        operation.started_at = Some(now.clone());
        operation.finished_at = Some(now);
        // The state key is rewritten unchanged so that a concurrent
        // request racing on its revision loses.
        return state;
    }
    state.operation = Some(OperationSlot {
        id: operation.id.clone(),
        kind: operation.kind.name().to_string(),
    });
    if state.state != admitted.entered {
        state.state = admitted.entered;
        state.changed_at = now;
    }
    state
}

/// A new, time-ordered operation id.
fn new_operation_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// An accept as one transaction, not yet committed: what it compares and
/// writes, and the records as it leaves them. Building one has no side
/// effect; the executor adds its claim to it when this replica owns the
/// cluster, and [`Operations::commit_accept`] commits it.
#[derive(Debug)]
pub struct AcceptPlan {
    /// The operation the accept writes (PENDING, or RUNNING once claimed).
    pub operation: OperationRecord,
    /// The cluster as the accept read it.
    view: ClusterRecord,
    spec_after: Option<SpecRecord>,
    state_after: StateRecord,
    compares: Vec<Compare>,
    /// Every write but the operation record's, which is written as
    /// `operation` is at the commit.
    writes: Vec<Op>,
    /// Whether the operation has anything to run (an edit of a Created
    /// cluster's spec is done at the accept).
    executes: bool,
}

impl AcceptPlan {
    /// The cluster as the accept read it.
    pub fn view(&self) -> &ClusterRecord {
        &self.view
    }

    /// The spec the cluster has once the accept commits.
    pub fn spec_after(&self) -> &Spec {
        self.spec_after
            .as_ref()
            .map_or(&self.view.spec.spec, |s| &s.spec)
    }

    pub fn executes(&self) -> bool {
        self.executes
    }

    /// Makes the accept also depend on `compares`.
    pub fn compare(&mut self, compares: impl IntoIterator<Item = Compare>) {
        self.compares.extend(compares);
    }
}

/// An accept as committed: the operation and the cluster as it left them.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub cluster: ClusterRecord,
    pub operation: OperationRecord,
    pub revision: i64,
}

impl Operations {
    /// The operation a repeated request id created, when `request` repeats
    /// one; INVALID_ARGUMENT when the id belongs to another request.
    pub async fn answer_retry(
        &self,
        cluster: &str,
        request: &LifecycleRequest,
    ) -> Result<Option<OperationRecord>> {
        let Some(existing) = self.by_request_id(cluster, &request.request_id).await? else {
            return Ok(None);
        };
        let existing = existing.record;
        // Rare (a retry): worth the read that tells a destroyed
        // predecessor's request from this cluster's.
        let uid = self.registry.get(cluster).await?.spec.uid;
        let predecessor = existing.cluster_uid != uid;
        if predecessor || existing.kind != request.kind {
            // Another request's answer would mislead the caller.
            let whose = if predecessor {
                format!("an earlier cluster {cluster} (since destroyed)")
            } else {
                format!("cluster {cluster}")
            };
            return Err(FieldError::new(
                "request_id",
                format!(
                    "already used for the {} operation {} of {whose}; a new request needs a new id",
                    existing.kind.name(),
                    existing.id
                ),
            )
            .into());
        }
        Ok(Some(existing))
    }

    /// Plans accepting `request` on the cluster as read in `view`: the
    /// transaction that fills its operation slot if the view is still
    /// current, or why the request is refused.
    pub fn plan_accept(
        &self,
        view: ClusterRecord,
        request: &LifecycleRequest,
    ) -> Result<AcceptPlan> {
        let cluster = view.spec.name.clone();
        self.check_schema(&view)?;
        if let Some(slot) = &view.state.operation {
            return Err(busy(&cluster, slot));
        }
        let admitted = admit(&view, request)?;
        let now = crate::cluster::now_rfc3339();
        let mut operation = OperationRecord::pending(
            new_operation_id(),
            &cluster,
            &view.spec.uid,
            request.kind,
            admitted.event,
            request.params.clone(),
            view.state.state,
            admitted.entered,
            &request.request_id,
            now.clone(),
        );
        let state_key = self.keys.cluster_state(&cluster);
        let mut compares = vec![Compare::mod_revision(
            &state_key,
            CmpOp::Equal,
            view.state_revision,
        )];
        let state_after = state_after(&view, &mut operation, &admitted, now);
        let mut writes = vec![Op::put(&state_key, to_json(&state_after))];
        let spec_after = admitted.spec.map(|spec| SpecRecord {
            generation: view.spec.generation + 1,
            spec,
            ..view.spec.clone()
        });
        if let Some(spec_after) = &spec_after {
            // A concurrent label or task edit must not be overwritten.
            let spec_key = self.keys.cluster_spec(&cluster);
            compares.push(Compare::mod_revision(
                &spec_key,
                CmpOp::Equal,
                view.spec_revision,
            ));
            writes.push(Op::put(spec_key, to_json(spec_after)));
        }
        if !request.request_id.is_empty() {
            let request_key = self.keys.request(&cluster, &request.request_id);
            compares.push(Compare::absent(&request_key));
            let record = RequestRecord::new(&operation.id);
            writes.push(Op::put(request_key, to_json(&record)));
        }
        Ok(AcceptPlan {
            operation,
            view,
            spec_after,
            state_after,
            compares,
            writes,
            executes: !admitted.spec_only,
        })
    }

    /// Commits an accept: the operation and the cluster as it left them,
    /// or `None` when the cluster changed since it was read (nothing
    /// written).
    pub async fn commit_accept(&self, plan: AcceptPlan) -> Result<Option<Accepted>> {
        let AcceptPlan {
            operation,
            view,
            spec_after,
            state_after,
            compares,
            mut writes,
            ..
        } = plan;
        let cluster = view.spec.name.clone();
        let operation_key = self.keys.operation(&cluster, &operation.id);
        let operation_json = to_json(&operation);
        writes.push(Op::put(&operation_key, operation_json.clone()));
        let txn = Txn::new().when(compares).and_then(writes);
        let revision = match self.store.cas(txn).await {
            Ok(result) => result.revision,
            Err(StoreError::Conflict { .. }) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        self.record_own_write(operation_key, operation_json, revision);
        self.metrics
            .transition(operation.from_state, operation.entered_state);
        tracing::info!(
            cluster,
            operation = %operation.id,
            kind = operation.kind.name(),
            from = %operation.from_state,
            to = %operation.entered_state,
            "operation accepted"
        );
        let spec_revision = match spec_after {
            Some(_) => revision,
            None => view.spec_revision,
        };
        Ok(Some(Accepted {
            cluster: ClusterRecord {
                spec: spec_after.unwrap_or(view.spec),
                spec_revision,
                state: state_after,
                state_revision: revision,
                status: view.status,
                status_revision: view.status_revision,
            },
            operation,
            revision,
        }))
    }
    pub async fn explain_lost_race(
        &self,
        cluster: &str,
        request: &LifecycleRequest,
    ) -> LifecycleError {
        match self.by_request_id(cluster, &request.request_id).await {
            Ok(Some(_)) => {
                // The same request won concurrently; the caller retries and
                // then gets that operation.
                return LifecycleError::Raced(cluster.to_string());
            }
            Err(error) => return error,
            Ok(None) => {}
        }
        match self.registry.get(cluster).await {
            Ok(now) => match &now.state.operation {
                Some(slot) => busy(cluster, slot),
                None => LifecycleError::Raced(cluster.to_string()),
            },
            Err(error) => error.into(),
        }
    }

    /// Creates a cluster and, when `start`, accepts its first start (which
    /// provisions the nodes) in the same transaction.
    pub async fn create_cluster(
        &self,
        name: &str,
        spec: Spec,
        request_id: &str,
        start: bool,
    ) -> Result<(ClusterRecord, Option<OperationRecord>)> {
        let uid = uuid::Uuid::new_v4().to_string();
        let first = start.then(|| {
            let record = OperationRecord::pending(
                new_operation_id(),
                name,
                &uid,
                OperationKind::Start,
                Event::StartRequested,
                OperationParams {
                    provision: true,
                    ..OperationParams::default()
                },
                ClusterState::Created,
                machine::next(ClusterState::Created, Event::StartRequested)
                    .unwrap_or(ClusterState::Starting),
                request_id,
                crate::cluster::now_rfc3339(),
            );
            let mut writes = vec![Op::put(
                self.keys.operation(name, &record.id),
                to_json(&record),
            )];
            if !request_id.is_empty() {
                writes.push(Op::put(
                    self.keys.request(name, request_id),
                    to_json(&RequestRecord::new(&record.id)),
                ));
            }
            let first = FirstOperation {
                slot: OperationSlot {
                    id: record.id.clone(),
                    kind: OperationKind::Start.name().to_string(),
                },
                entered: record.entered_state,
                writes,
            };
            (first, record)
        });
        let (first, record) = first.unzip();
        let cluster = self
            .registry
            .create(name, uid, spec, request_id, first)
            .await?;
        let operation = match record {
            // A retried create returns the start it accepted the first time.
            Some(record) if record.cluster_uid == cluster.spec.uid => Some(record),
            _ => self
                .by_request_id(name, request_id)
                .await?
                .map(|v| v.record),
        };
        Ok((cluster, operation))
    }
}

fn busy(cluster: &str, slot: &OperationSlot) -> LifecycleError {
    LifecycleError::Busy {
        cluster: cluster.to_string(),
        operation: slot.id.clone(),
        kind: slot.kind.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, Store};
    use std::sync::Arc;

    fn spec() -> Spec {
        Spec {
            version: "1.29.0".into(),
            control_nodes: 1,
            worker_nodes: 2,
            node_offering: "m".into(),
            ..Spec::default()
        }
    }

    fn on_memory() -> (Arc<MemoryStore>, KeyLayout, Operations) {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let metrics = crate::metrics::Metrics::new();
        let operations = Operations::new(store.clone(), keys.clone(), 10, metrics);
        (store, keys, operations)
    }

    /// Accepts `request` as a replica that does not own the cluster does.
    async fn accept(
        operations: &Operations,
        cluster: &str,
        request: LifecycleRequest,
    ) -> Result<OperationRecord> {
        if let Some(existing) = operations.answer_retry(cluster, &request).await? {
            return Ok(existing);
        }
        let view = operations.registry().get(cluster).await?;
        let plan = operations.plan_accept(view, &request)?;
        match operations.commit_accept(plan).await? {
            Some(accepted) => Ok(accepted.operation),
            None => Err(operations.explain_lost_race(cluster, &request).await),
        }
    }

    fn request(kind: OperationKind) -> LifecycleRequest {
        LifecycleRequest {
            kind,
            params: OperationParams::default(),
            request_id: String::new(),
        }
    }

    #[tokio::test]
    async fn a_cluster_with_a_newer_schema_is_never_rewritten() {
        let (store, keys, operations) = on_memory();
        operations
            .create_cluster("future", spec(), "", false)
            .await
            .unwrap();
        let state_key = keys.cluster_state("future");
        let kv = store.get(&state_key).await.unwrap().into_single().unwrap();
        let mut state: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
        state["schema"] = 99.into();
        state["state"] = "Running".into();
        let newer = serde_json::to_vec(&state).unwrap();
        store
            .txn(Txn::new().and_then([Op::put(&state_key, newer.clone())]))
            .await
            .unwrap();

        let error = accept(&operations, "future", request(OperationKind::Stop))
            .await
            .unwrap_err();
        assert!(
            matches!(error, LifecycleError::NewerSchema { schema: 99, .. }),
            "{error:?}"
        );
        let after = store.get(&state_key).await.unwrap().into_single().unwrap();
        assert_eq!(after.value, newer, "the record was left alone");
        assert!(store
            .range(crate::store::RangeRequest::prefix(
                keys.operations("future")
            ))
            .await
            .unwrap()
            .kvs
            .is_empty());
    }

    #[tokio::test]
    async fn a_request_id_of_a_destroyed_predecessor_is_refused_not_answered() {
        let (store, keys, operations) = on_memory();
        let (first, _) = operations
            .create_cluster("again", spec(), "", false)
            .await
            .unwrap();
        let start = LifecycleRequest {
            request_id: "start-1".into(),
            ..request(OperationKind::Start)
        };
        let earlier = accept(&operations, "again", start.clone()).await.unwrap();
        // The first cluster ends destroyed; one of the same name replaces it.
        let destroyed = crate::cluster::StateRecord {
            state: ClusterState::Destroyed,
            operation: None,
            ..first.state
        };
        store
            .txn(Txn::new().and_then([Op::put(keys.cluster_state("again"), to_json(&destroyed))]))
            .await
            .unwrap();
        operations
            .create_cluster("again", spec(), "", false)
            .await
            .unwrap();

        let error = accept(&operations, "again", start).await.unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, LifecycleError::Invalid(_)), "{message}");
        assert!(
            message.contains("request_id") && message.contains(&earlier.id),
            "{message}"
        );
        let state = store
            .get(&keys.cluster_state("again"))
            .await
            .unwrap()
            .into_single()
            .unwrap();
        let state: crate::cluster::StateRecord = crate::cluster::from_json(&state).unwrap();
        assert_eq!(state.state, ClusterState::Created, "nothing was written");
    }

    #[tokio::test]
    async fn a_busy_cluster_refuses_with_the_operation_holding_it() {
        let (_, _, operations) = on_memory();
        let (_, start) = operations
            .create_cluster("busy", spec(), "", true)
            .await
            .unwrap();
        let start = start.unwrap();
        let error = accept(&operations, "busy", request(OperationKind::Stop))
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, LifecycleError::Busy { .. }), "{message}");
        assert!(
            message.contains(&start.id) && message.contains("(start)"),
            "{message}"
        );
    }

    /// An owner key for `cluster` bound to a fresh lease, and the claim it
    /// makes (the owner's epoch is the key's create revision).
    async fn owner(store: &MemoryStore, keys: &KeyLayout, cluster: &str) -> Claim {
        let lease = store.grant_lease(30).await.unwrap();
        let written = store
            .txn(Txn::new().and_then([Op::put_with_lease(keys.owner(cluster), "{}", lease)]))
            .await
            .unwrap();
        Claim::new(lease, 0, written.revision)
    }

    /// Writes `count` finished operations of `cluster` as accepted with
    /// request ids `req-<i>`, oldest first; returns them.
    async fn finished_history(
        store: &MemoryStore,
        keys: &KeyLayout,
        cluster: &ClusterRecord,
        count: usize,
    ) -> Vec<OperationRecord> {
        let mut records = Vec::new();
        for i in 0..count {
            let mut record = OperationRecord::pending(
                new_operation_id(),
                &cluster.spec.name,
                &cluster.spec.uid,
                OperationKind::Stop,
                Event::StopRequested,
                OperationParams::default(),
                ClusterState::Running,
                ClusterState::Stopping,
                &format!("req-{i}"),
                crate::cluster::now_rfc3339(),
            );
            record.state = OperationState::Succeeded;
            let name = &cluster.spec.name;
            store
                .txn(Txn::new().and_then([
                    Op::put(keys.operation(name, &record.id), to_json(&record)),
                    Op::put(
                        keys.request(name, &record.request_id),
                        to_json(&RequestRecord::new(&record.id)),
                    ),
                ]))
                .await
                .unwrap();
            records.push(record);
        }
        records
    }

    async fn history_size(store: &MemoryStore, keys: &KeyLayout, cluster: &str) -> usize {
        store
            .range(crate::store::RangeRequest::prefix(keys.operations(cluster)))
            .await
            .unwrap()
            .kvs
            .len()
    }

    #[tokio::test]
    async fn history_collection_under_a_claim_that_no_longer_holds_deletes_nothing() {
        let (store, keys, operations) = on_memory();
        let (cluster, _) = operations
            .create_cluster("fenced", spec(), "", false)
            .await
            .unwrap();
        finished_history(&store, &keys, &cluster, 20).await;
        let claim = owner(&store, &keys, "fenced").await;
        // The owner key was claimed again since (a new epoch).
        let stale = Claim::new(claim.lease, 0, claim.revision - 1);
        assert_eq!(
            operations
                .collect_garbage("fenced", 20, &stale)
                .await
                .unwrap(),
            20
        );
        assert_eq!(history_size(&store, &keys, "fenced").await, 20);

        let left = operations
            .collect_garbage("fenced", 20, &claim)
            .await
            .unwrap();
        assert_eq!(left, 10, "down to the limit");
        assert_eq!(history_size(&store, &keys, "fenced").await, 10);
    }

    #[tokio::test]
    async fn a_request_id_answers_with_its_operation_after_history_collection() {
        let (store, keys, operations) = on_memory();
        let (cluster, _) = operations
            .create_cluster("kept", spec(), "", false)
            .await
            .unwrap();
        let history = finished_history(&store, &keys, &cluster, 20).await;
        let claim = owner(&store, &keys, "kept").await;
        operations
            .collect_garbage("kept", 20, &claim)
            .await
            .unwrap();
        let oldest = &history[0];
        assert!(
            operations.get("kept", &oldest.id).await.is_err(),
            "the record itself was collected"
        );

        let retry = LifecycleRequest {
            request_id: oldest.request_id.clone(),
            ..request(OperationKind::Stop)
        };
        let answer = accept(&operations, "kept", retry).await.unwrap();
        assert_eq!(&answer, oldest, "the operation as it ended");
        assert_eq!(history_size(&store, &keys, "kept").await, 10, "nothing new");
        let entry = store
            .get(&keys.request("kept", &oldest.request_id))
            .await
            .unwrap()
            .into_single()
            .unwrap();
        assert_ne!(entry.lease, 0, "kept for the retention period only");
        let ttl = store.lease_time_to_live(entry.lease).await.unwrap();
        assert!(
            ttl.unwrap() >= REQUEST_RETENTION.as_secs() as i64,
            "{ttl:?}"
        );
        // A kept one still points at its record.
        let kept = &history[19];
        let found = operations.by_request_id("kept", &kept.request_id).await;
        assert_eq!(found.unwrap().unwrap().record, *kept);
    }

    #[tokio::test]
    async fn a_request_entry_written_as_a_bare_id_still_answers() {
        let (store, keys, operations) = on_memory();
        let (cluster, _) = operations
            .create_cluster("old", spec(), "", false)
            .await
            .unwrap();
        let history = finished_history(&store, &keys, &cluster, 1).await;
        let record = &history[0];
        // As replicas before the entry became JSON wrote it.
        store
            .txn(Txn::new().and_then([Op::put(
                keys.request("old", &record.request_id),
                record.id.clone(),
            )]))
            .await
            .unwrap();
        let found = operations.by_request_id("old", &record.request_id).await;
        assert_eq!(found.unwrap().unwrap().record, *record);
    }
}
