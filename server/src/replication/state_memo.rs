//! What the ownership passes need of each cluster's state key, kept from
//! pass to pass.
//!
//! A pass goes over every cluster at least every TTL/3. Parsing every state
//! key and hashing every name each time kept a replica busy at rest with
//! ten thousand clusters; the memo parses a state key again only when it
//! changed, and hashes a name again only when the members changed.

use crate::cluster::{CachedKey, StateRecord};
use std::collections::HashMap;

/// One cluster's state key, as a pass needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct StateSummary {
    /// The state key's mod revision.
    pub revision: i64,
    /// No operation holds the cluster.
    pub idle: bool,
    /// Readable, in a schema this replica understands (others are left to
    /// replicas that do: a rolling upgrade).
    pub understood: bool,
    /// The state record's schema (0 when unreadable).
    pub schema: u32,
    /// Whether this replica is the cluster's preferred member, for the
    /// members of [`StateMemo::begin_pass`]; `None` until asked.
    mine: Option<bool>,
    /// The pass that last saw the cluster.
    seen: u64,
}

/// A live member as a pass needs it: its id and the newest record schema
/// it understands.
pub(super) type Member = (String, u32);

pub(super) struct StateMemo {
    clusters: HashMap<Box<str>, StateSummary>,
    pass: u64,
    members: Vec<Member>,
    /// The newest record schema this replica understands.
    known: u32,
}

impl StateMemo {
    pub(super) fn new(known: u32) -> Self {
        Self {
            clusters: HashMap::new(),
            pass: 0,
            members: Vec::new(),
            known,
        }
    }

    /// Starts a pass over the clusters with `members` live.
    pub(super) fn begin_pass(&mut self, members: &[Member]) {
        self.pass += 1;
        if self.members != members {
            self.members = members.to_vec();
            for summary in self.clusters.values_mut() {
                summary.mine = None;
            }
        }
    }

    /// Notes `cluster`'s state key as `kv` holds it and returns what a pass needs of
    /// it; `is_mine` answers whether this replica is preferred (given the
    /// state record's schema), once per state revision and member list.
    pub(super) fn note(
        &mut self,
        cluster: &str,
        kv: &CachedKey,
        is_mine: impl FnOnce(&str, u32, &[Member]) -> bool,
    ) -> (StateSummary, bool) {
        let fresh = self
            .clusters
            .get(cluster)
            .is_some_and(|held| held.revision == kv.mod_revision);
        if !fresh {
            let state = serde_json::from_slice::<StateRecord>(&kv.value).ok();
            let summary = StateSummary {
                revision: kv.mod_revision,
                idle: state.as_ref().is_some_and(|s| s.operation.is_none()),
                understood: state.as_ref().is_some_and(|s| s.schema <= self.known),
                schema: state.map_or(0, |s| s.schema),
                mine: None,
                seen: self.pass,
            };
            match self.clusters.get_mut(cluster) {
                Some(held) => *held = summary,
                None => {
                    self.clusters.insert(cluster.into(), summary);
                }
            }
        }
        let members = &self.members;
        let summary = self.clusters.get_mut(cluster).expect("noted above");
        summary.seen = self.pass;
        let schema = summary.schema;
        let mine = *summary
            .mine
            .get_or_insert_with(|| is_mine(cluster, schema, members));
        (*summary, mine)
    }

    /// The live members of the last pass.
    pub(super) fn members(&self) -> &[Member] {
        &self.members
    }

    /// Forgets the clusters this pass did not see (deleted).
    pub(super) fn end_pass(&mut self) {
        let pass = self.pass;
        self.clusters.retain(|_, summary| summary.seen == pass);
    }

    /// Whether `cluster` exists, as this pass saw it, in a schema this
    /// replica understands.
    pub(super) fn understood(&self, cluster: &str) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|summary| summary.understood)
    }

    /// The state key's mod revision as this pass saw it, if it saw the
    /// cluster.
    pub(super) fn revision(&self, cluster: &str) -> Option<i64> {
        self.clusters.get(cluster).map(|summary| summary.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{to_json, ClusterState, OperationSlot, SCHEMA_VERSION};
    use crate::store::KeyValue;

    fn state(revision: i64, operation: bool, schema: u32) -> CachedKey {
        let record = StateRecord {
            schema,
            uid: "u".into(),
            state: ClusterState::Running,
            operation: operation.then(|| OperationSlot {
                id: "op".into(),
                kind: "stop".into(),
            }),
            changed_at: String::new(),
        };
        let kv = KeyValue {
            key: "/t/clusters/a/state".into(),
            value: to_json(&record),
            create_revision: 1,
            mod_revision: revision,
            version: 1,
            lease: 0,
        };
        CachedKey::new("state".into(), kv)
    }

    #[test]
    fn parses_and_hashes_again_only_what_changed() {
        let mut memo = StateMemo::new(SCHEMA_VERSION);
        let members = vec![("r1".to_string(), SCHEMA_VERSION)];
        let asked = std::cell::Cell::new(0);
        let is_mine = |_: &str, _: u32, _: &[Member]| {
            asked.set(asked.get() + 1);
            true
        };
        memo.begin_pass(&members);
        let (summary, mine) = memo.note("a", &state(5, false, SCHEMA_VERSION), is_mine);
        assert!(summary.idle && summary.understood && mine);
        memo.end_pass();

        // Unchanged key, same members: neither parsed nor hashed again (an
        // unreadable value at the same revision would show otherwise).
        memo.begin_pass(&members);
        let mut unreadable = state(5, false, SCHEMA_VERSION);
        unreadable.value = b"not json".to_vec().into();
        let (summary, _) = memo.note("a", &unreadable, is_mine);
        assert!(summary.idle && summary.understood);
        memo.end_pass();

        // A new revision is parsed again; new members are asked again.
        memo.begin_pass(&[
            ("r1".to_string(), SCHEMA_VERSION),
            ("r2".to_string(), SCHEMA_VERSION),
        ]);
        let (summary, _) = memo.note("a", &state(9, true, SCHEMA_VERSION), is_mine);
        assert!(!summary.idle);
        assert_eq!(summary.revision, 9);
        memo.end_pass();
        assert_eq!(asked.get(), 2);

        memo.begin_pass(&members);
        let (summary, _) = memo.note("a", &state(11, false, SCHEMA_VERSION + 1), is_mine);
        assert!(!summary.understood, "a newer schema is left alone");
        assert!(!memo.understood("a"));
        memo.end_pass();

        // A cluster the pass did not see is gone.
        memo.begin_pass(&members);
        memo.end_pass();
        assert!(!memo.understood("a"));
    }
}
