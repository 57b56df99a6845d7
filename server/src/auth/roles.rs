//! The role table: the least role each RPC needs.

use crate::kind::{kind_of_rpc, OperationKind};
use serde::Deserialize;

/// Roles, each allowed everything the one before it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads clusters, operations and tasks; waits for operations.
    Viewer,
    /// Runs lifecycle operations, cancels them, edits labels and tasks.
    Operator,
    /// Destroys clusters and reads replication internals (members, owners).
    Admin,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        })
    }
}

/// What calling a path takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Health checks and reflection: no token.
    Open,
    Needs(Role),
}

/// Every drover.v1 RPC but the lifecycle ones (each kind's module names its
/// own: `crate::kind`) and the least role that may call it.
pub const RPC_ROLES: &[(&str, Role)] = &[
    ("/drover.v1.Clusters/GetCluster", Role::Viewer),
    ("/drover.v1.Clusters/ListClusters", Role::Viewer),
    ("/drover.v1.Clusters/WatchClusters", Role::Viewer),
    ("/drover.v1.Clusters/CreateCluster", Role::Operator),
    ("/drover.v1.Clusters/UpdateCluster", Role::Operator),
    ("/drover.v1.Operations/GetOperation", Role::Viewer),
    ("/drover.v1.Operations/ListOperations", Role::Viewer),
    ("/drover.v1.Operations/WaitOperation", Role::Viewer),
    ("/drover.v1.Operations/CancelOperation", Role::Operator),
    ("/drover.v1.Operations/AbandonOperation", Role::Admin),
    ("/drover.v1.Tasks/GetTask", Role::Viewer),
    ("/drover.v1.Tasks/ListTasks", Role::Viewer),
    ("/drover.v1.Tasks/ListTaskRuns", Role::Viewer),
    ("/drover.v1.Tasks/PutTask", Role::Operator),
    ("/drover.v1.Tasks/DeleteTask", Role::Operator),
    ("/drover.v1.Rollouts/GetRollout", Role::Viewer),
    ("/drover.v1.Rollouts/ListRollouts", Role::Viewer),
    ("/drover.v1.Rollouts/WatchRollout", Role::Viewer),
    ("/drover.v1.Rollouts/CreateRollout", Role::Operator),
    ("/drover.v1.Rollouts/PauseRollout", Role::Operator),
    ("/drover.v1.Rollouts/ResumeRollout", Role::Operator),
    ("/drover.v1.Rollouts/ApproveRollout", Role::Operator),
    ("/drover.v1.Rollouts/CancelRollout", Role::Operator),
    ("/drover.v1.Admin/ListMembers", Role::Admin),
    ("/drover.v1.Admin/GetOwner", Role::Admin),
    ("/drover.v1.Admin/ListProviders", Role::Viewer),
];

/// Every drover.v1 RPC and its least role: [`RPC_ROLES`] and the
/// lifecycle RPCs of the operation kinds.
pub fn all_rpc_roles() -> Vec<(&'static str, Role)> {
    let lifecycle = OperationKind::ALL.map(|kind| (kind.rules().rpc(), kind.rules().role()));
    RPC_ROLES.iter().copied().chain(lifecycle).collect()
}

const OPEN_SERVICES: [&str; 3] = [
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// What calling `path` takes; a path not in the table needs admin.
pub fn required_role(path: &str) -> Access {
    if OPEN_SERVICES.iter().any(|open| path.starts_with(open)) {
        return Access::Open;
    }
    let listed = RPC_ROLES.iter().find(|(rpc, _)| *rpc == path);
    let role = match listed {
        Some((_, role)) => *role,
        None => kind_of_rpc(path).map_or(Role::Admin, |kind| kind.rules().role()),
    };
    Access::Needs(role)
}

/// Whether `path` is a drover.v1 RPC that changes something, which the
/// audit log records: every one but the reads, whose names say so.
pub fn changes_something(path: &str) -> bool {
    let method = path
        .strip_prefix("/drover.v1.")
        .and_then(|rest| rest.split_once('/'))
        .map(|(_, method)| method);
    method.is_some_and(|method| {
        !["Get", "List", "Watch", "Wait"]
            .iter()
            .any(|read| method.starts_with(read))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Every RPC the contract declares is in the table (and nothing else).
    #[test]
    fn the_table_covers_every_rpc_of_the_contract() {
        let set = prost_types::FileDescriptorSet::decode(drover_proto::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let mut declared: Vec<String> = set
            .file
            .iter()
            .filter(|f| f.package() == "drover.v1")
            .flat_map(|f| {
                f.service.iter().flat_map(move |s| {
                    s.method
                        .iter()
                        .map(move |m| format!("/{}.{}/{}", f.package(), s.name(), m.name()))
                })
            })
            .collect();
        declared.sort();
        let mut listed: Vec<String> = all_rpc_roles().iter().map(|(p, _)| p.to_string()).collect();
        listed.sort();
        assert_eq!(declared, listed);
    }

    /// Every RPC a viewer may call is a read; the changes are exactly the
    /// operator's and admin's RPCs but the admin's reads of replication.
    #[test]
    fn the_changes_are_the_rpcs_beyond_a_viewer_but_two_reads() {
        let admin_reads = ["/drover.v1.Admin/ListMembers", "/drover.v1.Admin/GetOwner"];
        for (path, role) in all_rpc_roles() {
            let change = role > Role::Viewer && !admin_reads.contains(&path);
            assert_eq!(changes_something(path), change, "{path}");
        }
        assert!(!changes_something("/grpc.health.v1.Health/Check"));
    }

    #[test]
    fn probes_are_open_and_unknown_paths_need_admin() {
        assert_eq!(required_role("/grpc.health.v1.Health/Check"), Access::Open);
        assert_eq!(
            required_role("/drover.v1.Clusters/Nope"),
            Access::Needs(Role::Admin)
        );
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
    }

    #[test]
    fn lifecycle_rpcs_need_their_kinds_role() {
        let start = required_role("/drover.v1.Clusters/StartCluster");
        assert_eq!(start, Access::Needs(Role::Operator));
        let delete = required_role("/drover.v1.Clusters/DeleteCluster");
        assert_eq!(delete, Access::Needs(Role::Admin));
    }
}
