//! The keys of one cluster as the watch cache holds them: a small sorted
//! vector rather than a map.
//!
//! A cluster has three to five keys. A `BTreeMap` gives each cluster a node
//! sized for eleven entries (about 1.2 KiB with `KeyValue`s), more than the
//! records themselves; at 100,000 clusters per replica that was half its
//! memory. A vector sized to its entries costs what they hold. Each entry
//! keeps its leaf (`state`), not its whole key: the prefix, `clusters/`
//! and the name, repeated in every key of the fleet, were another sixth of
//! a replica's memory. The key is built again for the few reads that hand
//! out whole records (a Get, a page of a List).
//!
//! Beside the keys it keeps what scans over every cluster ask (the state,
//! whether an operation holds the cluster, the labels), read once when the
//! key is written: a resync of 100,000 clusters, a filtered list or the
//! console's counts then parse no JSON. Label strings are interned: a fleet
//! repeats a few keys and values across every cluster.
//!
//! # Guarantees
//! - Entries stay in key order (so in leaf order, as etcd lists them).
//! - At most one entry per leaf.
//! - The brief and the labels are those of the state and spec keys held.

use super::{ClusterFilter, ClusterState};
use crate::keys::leaf;
use crate::store::{KeyValue, LeaseId};
use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// A cluster's labels, sorted by key.
type Labels = Box<[(Arc<str>, Arc<str>)]>;

/// What a scan needs of a cluster's state record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBrief {
    pub state: ClusterState,
    /// Whether an operation holds the cluster.
    pub busy: bool,
}

impl StateBrief {
    /// `None` for a record this replica does not understand.
    pub fn parse(json: &[u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Fields {
            state: ClusterState,
            #[serde(default)]
            operation: Option<IgnoredAny>,
        }
        let fields: Fields = serde_json::from_slice(json).ok()?;
        Some(Self {
            state: fields.state,
            busy: fields.operation.is_some(),
        })
    }
}

/// A cluster as a scan sees it: its state and its labels.
#[derive(Debug, Clone, Copy)]
pub struct ClusterBrief<'a> {
    pub state: StateBrief,
    labels: &'a [(Arc<str>, Arc<str>)],
}

impl ClusterBrief<'_> {
    /// Whether the cluster passes `filter` (as [`ClusterFilter::matches`]
    /// on the whole record would say).
    pub fn matches(&self, filter: &ClusterFilter) -> bool {
        filter.admits(self.state.state, |key| {
            let pair = self.labels.iter().find(|(k, _)| **k == *key);
            pair.map(|(_, value)| &**value)
        })
    }
}

/// The label strings every cluster's labels share.
#[derive(Debug, Default)]
pub struct Interner {
    strings: HashSet<Arc<str>>,
    /// The set's size after the last time unheld strings were forgotten.
    kept: usize,
}

impl Interner {
    /// The labels of a spec record; none for one not understood.
    fn labels(&mut self, spec_json: &[u8]) -> Labels {
        #[derive(Deserialize)]
        struct Record {
            spec: Fields,
        }
        #[derive(Deserialize)]
        struct Fields {
            #[serde(default)]
            labels: BTreeMap<String, String>,
        }
        let Ok(record) = serde_json::from_slice::<Record>(spec_json) else {
            return Labels::default();
        };
        self.forget_unheld();
        let labels = record.spec.labels.iter();
        labels
            .map(|(k, v)| (self.intern(k), self.intern(v)))
            .collect()
    }

    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(held) = self.strings.get(text) {
            return Arc::clone(held);
        }
        let new: Arc<str> = Arc::from(text);
        self.strings.insert(Arc::clone(&new));
        new
    }

    /// Once the set has doubled, drops the strings no cluster holds (their
    /// clusters relabelled or gone), so it grows with the labels in use.
    fn forget_unheld(&mut self) {
        if self.strings.len() < 2 * self.kept.max(1024) {
            return;
        }
        self.strings.retain(|text| Arc::strong_count(text) > 1);
        self.kept = self.strings.len();
    }
}

/// One key of a cluster as the cache holds it: its leaf, and what etcd
/// holds under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedKey {
    /// The key after the cluster's directory (`state`, `tasks/<type>/<name>`).
    leaf: Box<str>,
    pub value: Box<[u8]>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: LeaseId,
}

impl CachedKey {
    /// `kv`, whose key ends in `leaf`.
    pub fn new(leaf: Box<str>, kv: KeyValue) -> Self {
        Self {
            leaf,
            value: kv.value.into_boxed_slice(),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }

    /// The key as `kv` rewrote it.
    fn set(&mut self, kv: KeyValue) {
        *self = Self::new(std::mem::take(&mut self.leaf), kv);
    }

    pub fn leaf(&self) -> &str {
        &self.leaf
    }

    /// The key as etcd holds it, under the cluster's directory `dir`
    /// (`<prefix>clusters/<name>/`).
    pub fn to_key_value(&self, dir: &str) -> KeyValue {
        KeyValue {
            key: format!("{dir}{}", self.leaf),
            value: self.value.to_vec(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        }
    }
}

/// The keys of one cluster directory (`<prefix>clusters/<name>/`).
#[derive(Debug, Default)]
pub struct Leaves {
    /// Sorted by leaf (so by key).
    entries: Vec<CachedKey>,
    /// From the state key; `None` without one (or not understood).
    brief: Option<StateBrief>,
    /// From the spec key.
    labels: Labels,
}

impl Leaves {
    /// The cluster's state and labels; `None` without a state key.
    pub fn brief(&self) -> Option<ClusterBrief<'_>> {
        Some(ClusterBrief {
            state: self.brief?,
            labels: &self.labels,
        })
    }

    /// The key whose leaf is `leaf`.
    pub fn get(&self, leaf: &str) -> Option<&CachedKey> {
        self.entries.iter().find(|held| held.leaf() == leaf)
    }

    /// Stores `kv`, whose key is the cluster's directory (`dir_len` bytes)
    /// then its leaf, replacing the key it rewrites.
    pub fn put(&mut self, dir_len: usize, kv: KeyValue, interner: &mut Interner) {
        let leaf = kv.key.get(dir_len..).unwrap_or_default();
        match leaf {
            leaf::STATE => self.brief = StateBrief::parse(&kv.value),
            leaf::SPEC => self.labels = interner.labels(&kv.value),
            _ => {}
        }
        match self.entries.binary_search_by(|held| held.leaf().cmp(leaf)) {
            // Most changes rewrite a key the cache holds: its leaf is kept.
            Ok(at) => self.entries[at].set(kv),
            Err(at) => {
                let entry = CachedKey::new(leaf.into(), kv);
                // Exactly as many slots as keys: clusters rarely grow.
                self.entries.reserve_exact(1);
                self.entries.insert(at, entry);
            }
        }
    }

    /// Removes the key whose leaf is `leaf`.
    pub fn remove(&mut self, leaf: &str) {
        let found = self.entries.iter().position(|held| held.leaf() == leaf);
        if let Some(at) = found {
            match leaf {
                leaf::STATE => self.brief = None,
                leaf::SPEC => self.labels = Labels::default(),
                _ => {}
            }
            self.entries.remove(at);
            self.entries.shrink_to_fit();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every key, in key order.
    pub fn values(&self) -> impl Iterator<Item = &CachedKey> {
        self.entries.iter()
    }

    /// Every leaf, in key order.
    pub fn leaves(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(CachedKey::leaf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = "/drover/clusters/a/";

    fn kv(leaf: &str, revision: i64) -> KeyValue {
        KeyValue {
            key: format!("{DIR}{leaf}"),
            value: revision.to_string().into_bytes(),
            create_revision: 1,
            mod_revision: revision,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn keys_are_kept_in_order_once_each_and_found_by_leaf() {
        let mut leaves = Leaves::default();
        for (leaf, revision) in [("state", 1), ("spec", 2), ("tasks/x/y", 3), ("state", 4)] {
            leaves.put(DIR.len(), kv(leaf, revision), &mut Interner::default());
        }
        let order: Vec<&str> = leaves.leaves().collect();
        assert_eq!(order, ["spec", "state", "tasks/x/y"]);
        assert_eq!(leaves.get("state").map(|kv| kv.mod_revision), Some(4));
        // A leaf is matched whole, not as a suffix of a task's key.
        assert!(leaves.get("y").is_none());
        leaves.remove("spec");
        leaves.remove("spec");
        assert_eq!(leaves.values().count(), 2);
        leaves.remove("state");
        leaves.remove("tasks/x/y");
        assert!(leaves.is_empty());
    }

    #[test]
    fn a_task_named_state_is_not_the_state() {
        let mut leaves = Leaves::default();
        let task = "tasks/backup/state";
        leaves.put(DIR.len(), kv(task, 1), &mut Interner::default());
        assert!(leaves.get("state").is_none());
        leaves.put(DIR.len(), kv("state", 2), &mut Interner::default());
        assert_eq!(leaves.get("state").map(|kv| kv.mod_revision), Some(2));
    }

    #[test]
    fn a_key_is_held_by_its_leaf_and_handed_out_whole() {
        let mut leaves = Leaves::default();
        let task = "tasks/backup/nightly";
        leaves.put(DIR.len(), kv(task, 3), &mut Interner::default());
        let held = leaves.get(task).unwrap();
        assert_eq!(held.leaf(), task);
        assert_eq!(held.to_key_value(DIR), kv(task, 3));
    }
}
