//! The keys of one cluster as the watch cache holds them: a small sorted
//! vector rather than a map.
//!
//! A cluster has three to five keys. A `BTreeMap` gives each cluster a node
//! sized for eleven entries (about 1.2 KiB with `KeyValue`s), more than the
//! records themselves; at 100,000 clusters per replica that was half its
//! memory. A vector sized to its entries costs what they hold, and each
//! entry's leaf is read off the end of its key instead of being stored
//! again.
//!
//! # Guarantees
//! - Entries stay in key order (so in leaf order, as etcd lists them).
//! - At most one entry per leaf.

use crate::store::KeyValue;

/// The keys of one cluster directory (`<prefix>clusters/<name>/`).
#[derive(Debug, Default)]
pub struct Leaves {
    /// Sorted by key; every key is the directory followed by its leaf.
    entries: Vec<KeyValue>,
    /// The length of the directory every key starts with.
    dir_len: u32,
}

impl Leaves {
    /// The key whose leaf is `leaf`.
    pub fn get(&self, leaf: &str) -> Option<&KeyValue> {
        self.entries.iter().find(|kv| self.leaf_of(kv) == leaf)
    }

    /// Stores `kv`, whose key is the cluster's directory (`dir_len` bytes)
    /// then its leaf, replacing the key it rewrites.
    pub fn put(&mut self, dir_len: usize, kv: KeyValue) {
        match self.entries.binary_search_by(|held| held.key.cmp(&kv.key)) {
            // Most changes rewrite a key the cache holds: no allocation.
            Ok(at) => self.entries[at] = kv,
            Err(at) => {
                self.dir_len = dir_len as u32;
                // Exactly as many slots as keys: clusters rarely grow.
                self.entries.reserve_exact(1);
                self.entries.insert(at, kv);
            }
        }
    }

    /// Removes the key whose leaf is `leaf`.
    pub fn remove(&mut self, leaf: &str) {
        let found = self.entries.iter().position(|kv| self.leaf_of(kv) == leaf);
        if let Some(at) = found {
            self.entries.remove(at);
            self.entries.shrink_to_fit();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every key, in key order.
    pub fn values(&self) -> impl Iterator<Item = &KeyValue> {
        self.entries.iter()
    }

    /// Every leaf, in key order.
    pub fn leaves(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|kv| self.leaf_of(kv))
    }

    /// The leaf of `kv`, one of the entries: its key after the directory.
    fn leaf_of<'a>(&self, kv: &'a KeyValue) -> &'a str {
        kv.key.get(self.dir_len as usize..).unwrap_or_default()
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
            leaves.put(DIR.len(), kv(leaf, revision));
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
        leaves.put(DIR.len(), kv("tasks/backup/state", 1));
        assert!(leaves.get("state").is_none());
        leaves.put(DIR.len(), kv("state", 2));
        assert_eq!(leaves.get("state").map(|kv| kv.mod_revision), Some(2));
    }
}
