//! The etcd key layout, a user-facing contract (documented in the README).
//!
//! Every cluster key ends its name with `/`, so `clusters/foo/` is never a
//! prefix of `clusters/foobar/`.

/// The leaf names under `clusters/<name>/`: the rest of a cluster key, as
/// [`KeyLayout::split_cluster_key`](crate::keys::KeyLayout::split_cluster_key)
/// returns it.
pub mod leaf {
    /// The desired state, written by users.
    pub const SPEC: &str = "spec";
    /// The lifecycle state and operation slot: the CAS target.
    pub const STATE: &str = "state";
    /// The observed status, written only by Drover.
    pub const STATUS: &str = "status";
    /// The newest spec generation whose tasks were reconciled.
    pub const TASK_SET: &str = "taskset";
    /// What every task record's leaf starts with (`tasks/<type>/<name>`).
    pub const TASKS: &str = "tasks/";
}

/// Builds every key Drover writes, under one configurable prefix.
#[derive(Debug, Clone)]
pub struct KeyLayout {
    prefix: String,
}

impl KeyLayout {
    /// `prefix` must start and end with `/` (checked by the config).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// `<prefix>`: every key Drover writes (what a replica's one watch
    /// covers).
    pub fn all(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>clusters/`: every key of every cluster.
    pub fn clusters(&self) -> String {
        format!("{}clusters/", self.prefix)
    }

    /// `<prefix>clusters/<name>/`: every key of one cluster.
    pub fn cluster(&self, name: &str) -> String {
        format!("{}clusters/{name}/", self.prefix)
    }

    /// The desired state, written by users.
    pub fn cluster_spec(&self, name: &str) -> String {
        format!("{}{}", self.cluster(name), leaf::SPEC)
    }

    /// The lifecycle state and operation slot: the CAS target.
    pub fn cluster_state(&self, name: &str) -> String {
        format!("{}{}", self.cluster(name), leaf::STATE)
    }

    /// The observed status, written only by Drover.
    pub fn cluster_status(&self, name: &str) -> String {
        format!("{}{}", self.cluster(name), leaf::STATUS)
    }

    /// `<prefix>clusters/<name>/tasks/`: the task records of a cluster.
    pub fn tasks(&self, name: &str) -> String {
        format!("{}{}", self.cluster(name), leaf::TASKS)
    }

    /// One task record; identity is (type, name).
    pub fn task(&self, name: &str, task_type: &str, task: &str) -> String {
        format!("{}{task_type}/{task}", self.tasks(name))
    }

    /// The newest spec generation whose tasks were reconciled.
    pub fn task_set(&self, name: &str) -> String {
        format!("{}{}", self.cluster(name), leaf::TASK_SET)
    }

    /// `<prefix>runs/<cluster>/`: the task runs of a cluster.
    pub fn cluster_runs(&self, cluster: &str) -> String {
        format!("{}runs/{cluster}/", self.prefix)
    }

    /// `<prefix>runs/<cluster>/<task-id>/`: the runs of one task, by slot.
    pub fn task_runs(&self, cluster: &str, task_id: &str) -> String {
        format!("{}{task_id}/", self.cluster_runs(cluster))
    }

    /// One run, keyed by its slot in milliseconds (zero-padded, so key
    /// order is time order).
    pub fn task_run(&self, cluster: &str, task_id: &str, slot_ms: i64) -> String {
        format!("{}{slot_ms:013}", self.task_runs(cluster, task_id))
    }

    /// `<prefix>operations/`: every operation of every cluster.
    pub fn all_operations(&self) -> String {
        format!("{}operations/", self.prefix)
    }

    /// `<prefix>operations/<cluster>/`: the operation history of a cluster.
    pub fn operations(&self, cluster: &str) -> String {
        format!("{}operations/{cluster}/", self.prefix)
    }

    /// One operation record; ids are time-ordered (UUIDv7).
    pub fn operation(&self, cluster: &str, id: &str) -> String {
        format!("{}{id}", self.operations(cluster))
    }

    /// The idempotency index: request id -> the operation it created (a
    /// JSON entry, see `RequestRecord`).
    pub fn request(&self, cluster: &str, request_id: &str) -> String {
        format!("{}requests/{cluster}/{request_id}", self.prefix)
    }

    /// `<prefix>members/`: the live replicas.
    pub fn members(&self) -> String {
        format!("{}members/", self.prefix)
    }

    /// One replica's membership, bound to its lease.
    pub fn member(&self, replica: &str) -> String {
        format!("{}{replica}", self.members())
    }

    /// `<prefix>fence`: the generation of fencing epochs, bumped when etcd
    /// was restored from a snapshot (see `replication::restore`).
    pub fn fence(&self) -> String {
        format!("{}fence", self.prefix)
    }

    /// `<prefix>owners/`: which replica owns which cluster.
    pub fn owners(&self) -> String {
        format!("{}owners/", self.prefix)
    }

    /// One cluster's owner, bound to the owner's lease. Its create revision
    /// and the generation in its record make the owner's fencing epoch.
    pub fn owner(&self, cluster: &str) -> String {
        format!("{}{cluster}", self.owners())
    }

    /// `<prefix>rollouts/`: every rollout's spec and controls, one key
    /// each (what the replicas follow to find rollouts to own).
    pub fn rollouts(&self) -> String {
        format!("{}rollouts/", self.prefix)
    }

    pub fn rollout(&self, name: &str) -> String {
        format!("{}{name}", self.rollouts())
    }

    /// `<prefix>rollout-status/`: where every rollout is.
    pub fn rollout_statuses(&self) -> String {
        format!("{}rollout-status/", self.prefix)
    }

    /// Where a rollout is, written by its owner.
    pub fn rollout_status(&self, name: &str) -> String {
        format!("{}{name}", self.rollout_statuses())
    }

    /// `<prefix>rollout-targets/<name>/`: the targets, fixed at create.
    pub fn rollout_targets(&self, name: &str) -> String {
        format!("{}rollout-targets/{name}/", self.prefix)
    }

    /// One chunk of targets; numbered so that key order is their order.
    pub fn rollout_target_chunk(&self, name: &str, chunk: usize) -> String {
        format!("{}{chunk:06}", self.rollout_targets(name))
    }

    /// `<prefix>rollout-clusters/<name>/`: the targets' progress.
    pub fn rollout_clusters(&self, name: &str) -> String {
        format!("{}rollout-clusters/{name}/", self.prefix)
    }

    pub fn rollout_cluster(&self, name: &str, cluster: &str) -> String {
        format!("{}{cluster}", self.rollout_clusters(name))
    }

    /// `<prefix>rollout-owners/`: which replica runs which rollout.
    pub fn rollout_owners(&self) -> String {
        format!("{}rollout-owners/", self.prefix)
    }

    /// A rollout's owner, bound to the owner's lease: its lease and create
    /// revision are the fence of every write the owner makes.
    pub fn rollout_owner(&self, name: &str) -> String {
        format!("{}{name}", self.rollout_owners())
    }

    /// The first key after every key of cluster `name`, for paging: `/` is
    /// followed by `0` in byte order and no cluster name contains `/`.
    pub fn after_cluster(&self, name: &str) -> String {
        format!("{}clusters/{name}0", self.prefix)
    }

    /// The cluster name and the rest of a key under `clusters/`.
    pub fn split_cluster_key<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        let (dir, leaf) = self.split_cluster_dir(key)?;
        Some((&dir[..dir.len() - 1], leaf))
    }

    /// As [`Self::split_cluster_key`], the name with its trailing `/`
    /// (`foo/`), as the cluster's keys share it.
    pub fn split_cluster_dir<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix("clusters/")?;
        let slash = rest.find('/')?;
        Some((&rest[..=slash], &rest[slash + 1..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_keys_are_not_prefixes_of_each_other() {
        let keys = KeyLayout::new("/drover/v1/");
        assert_eq!(keys.cluster_state("foo"), "/drover/v1/clusters/foo/state");
        assert!(!keys
            .cluster_spec("foobar")
            .starts_with(&keys.cluster("foo")));
    }

    #[test]
    fn paging_skips_all_keys_of_a_cluster_and_nothing_else() {
        let keys = KeyLayout::new("/p/");
        let after = keys.after_cluster("foo");
        assert!(keys.cluster_status("foo") < after);
        assert!(keys.cluster_spec("foo0") >= after);
        assert!(keys.cluster_spec("fooa") > after);
        assert!(keys.cluster_spec("foo-bar") < keys.cluster_spec("foo"));
    }

    #[test]
    fn split_cluster_key_returns_name_and_leaf() {
        let keys = KeyLayout::new("/p/");
        assert_eq!(
            keys.split_cluster_key("/p/clusters/foo/state"),
            Some(("foo", "state"))
        );
        assert_eq!(keys.split_cluster_key("/p/owners/foo"), None);
        assert_eq!(
            keys.split_cluster_dir("/p/clusters/foo/tasks/repair/a"),
            Some(("foo/", "tasks/repair/a"))
        );
    }
}
