//! The fleet page's data: one pass over the cache's state keys for the
//! counts per state and the state filter, the cache's records for the
//! clusters on the page, and one read of etcd for the page's owners and
//! current operations (the cache holds neither).
//!
//! # Guarantees
//! - The counts cover every cluster in the cache, whatever the filter.
//! - Pages are by position in name order: a cluster created or deleted
//!   between two reads shifts the pages after it by one.

use crate::api::convert::{operation_to_proto, state_to_proto};
use crate::cluster::{from_json, ClusterCache, ClusterFilter, ClusterState};
use crate::keys::KeyLayout;
use crate::operation::OperationRecord;
use crate::replication::OwnerRecord;
use crate::store::{KeyValue, Op, OpResult, SharedStore, StoreError, Txn};
use drover_proto::v1;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

pub const DEFAULT_PAGE_SIZE: usize = 100;
pub const MAX_PAGE_SIZE: usize = 500;
/// Reads per transaction: etcd refuses more than 128 operations in one.
const READS_PER_TXN: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("{field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    #[error("the cluster cache is not ready yet (starting, or listing again): retry")]
    NotReady,
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// What the fleet page asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetQuery {
    /// Only clusters in this state.
    pub state: Option<ClusterState>,
    /// Only clusters with every one of these labels.
    pub labels: Vec<(String, String)>,
    /// 0-based.
    pub page: usize,
    pub page_size: usize,
}

/// One cluster as the fleet page lists it.
#[derive(Debug, Serialize)]
pub struct FleetRow {
    pub name: String,
    /// The proto name (`CLUSTER_STATE_RUNNING`).
    pub state: &'static str,
    /// The version asked for.
    pub version: String,
    /// The version the provider last reported.
    pub current_version: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Absent when unowned, or when the caller may not see owners.
    pub owner: Option<String>,
    /// The operation in the cluster's slot, as the API returns it.
    pub operation: Option<v1::Operation>,
}

#[derive(Debug, Serialize)]
pub struct FleetPage {
    /// Clusters in the cache.
    pub total: usize,
    /// Clusters the filter matches.
    pub matched: usize,
    pub page: usize,
    pub page_size: usize,
    /// Clusters per state (proto names), over the whole cache.
    pub counts: BTreeMap<&'static str, usize>,
    /// Whether `owner` was filled (the caller may call GetOwner).
    pub owners_shown: bool,
    pub clusters: Vec<FleetRow>,
}

/// A page of the fleet from `cache`, with owners when `show_owners`.
pub async fn fleet_page(
    cache: &ClusterCache,
    store: &SharedStore,
    keys: &KeyLayout,
    query: &FleetQuery,
    show_owners: bool,
) -> Result<FleetPage, FleetError> {
    let (total, counts, names) = scan(cache, query)?;
    let matched = names.len();
    let start = query.page.saturating_mul(query.page_size).min(matched);
    let end = start.saturating_add(query.page_size).min(matched);
    let mut rows: Vec<(FleetRow, Option<String>)> = names[start..end]
        .iter()
        .filter_map(|name| cache.get(name).and_then(Result::ok))
        .map(|c| {
            let slot = c.state.operation.as_ref().map(|s| s.id.clone());
            let row = FleetRow {
                name: c.spec.name,
                state: state_to_proto(c.state.state).as_str_name(),
                version: c.spec.spec.version,
                current_version: c.status.and_then(|s| s.current_version),
                labels: c.spec.spec.labels,
                owner: None,
                operation: None,
            };
            (row, slot)
        })
        .collect();
    fill_from_store(&mut rows, store, keys, show_owners).await?;
    Ok(FleetPage {
        total,
        matched,
        page: query.page,
        page_size: query.page_size,
        counts,
        owners_shown: show_owners,
        clusters: rows.into_iter().map(|(row, _)| row).collect(),
    })
}

type Scan = (usize, BTreeMap<&'static str, usize>, Vec<String>);

/// Every cluster in the cache: the total, the counts per state and the
/// names `query` selects, in name order. Reads what the cache parsed when
/// each record was written: no JSON per cluster per request.
fn scan(cache: &ClusterCache, query: &FleetQuery) -> Result<Scan, FleetError> {
    let filter = ClusterFilter {
        state: query.state,
        labels: query.labels.clone(),
    };
    let (mut total, mut counts, mut names) = (0, BTreeMap::new(), Vec::new());
    let ready = cache.visit_briefs(|name, brief| {
        total += 1;
        *counts
            .entry(state_to_proto(brief.state.state).as_str_name())
            .or_default() += 1;
        if brief.matches(&filter) {
            names.push(name.to_string());
        }
    });
    if !ready {
        return Err(FleetError::NotReady);
    }
    Ok((total, counts, names))
}

/// Reads the owner keys (when `show_owners`) and the current operations
/// of `rows` in as few transactions as etcd allows.
async fn fill_from_store(
    rows: &mut [(FleetRow, Option<String>)],
    store: &SharedStore,
    keys: &KeyLayout,
    show_owners: bool,
) -> Result<(), FleetError> {
    let mut wanted = Vec::new();
    for (row, slot) in rows.iter() {
        if show_owners {
            wanted.push(keys.owner(&row.name));
        }
        if let Some(id) = slot {
            wanted.push(keys.operation(&row.name, id));
        }
    }
    let found = get_many(store, wanted).await?;
    for (row, slot) in rows.iter_mut() {
        if show_owners {
            row.owner = found
                .get(&keys.owner(&row.name))
                .and_then(|kv| from_json::<OwnerRecord>(kv).ok())
                .map(|owner| owner.replica);
        }
        if let Some(id) = slot {
            row.operation = found
                .get(&keys.operation(&row.name, id))
                .and_then(|kv| from_json::<OperationRecord>(kv).ok())
                .map(operation_to_proto);
        }
    }
    Ok(())
}

/// The keys of `wanted` that exist, read in read-only transactions.
async fn get_many(
    store: &SharedStore,
    wanted: Vec<String>,
) -> Result<HashMap<String, KeyValue>, StoreError> {
    let mut found = HashMap::new();
    for chunk in wanted.chunks(READS_PER_TXN) {
        let read = Txn::new().and_then(chunk.iter().map(Op::get));
        for result in store.txn(read).await?.results {
            if let OpResult::Get(Some(kv)) = result {
                found.insert(kv.key.clone(), kv);
            }
        }
    }
    Ok(found)
}
