//! The operation kinds: one module per kind holds everything the server
//! knows of it, behind [`KindRules`].
//!
//! A kind's module says which RPC asks for it and the least role that may
//! call it, how that request's fields are read and checked
//! ([`LifecycleCall`]), which event of the state table it sends, how it
//! changes the spec, what it refuses on the cluster as read, whether its
//! plan depends on the nodes as the provider shows them, its steps, and
//! whether a go-ahead of it moves the cluster. The accept
//! (`operation::accept`), the executor's plan and finish, the API and the
//! role table ask [`rules`] instead of matching on the kind.
//!
//! Adding a kind: its RPC in the proto, its rows in the state table
//! (`drover-machine`), a variant here with its line in [`rules`], and its
//! module with its tests.
//!
//! # Guarantees
//! - [`OperationKind::from_name`] accepts exactly the names
//!   [`OperationKind::name`] gives.
//! - Every kind has rules, and every kind's RPC is distinct (a unit test
//!   checks both).
//!
//! # Caveats
//! - Records store a kind by its variant name (serde's form): renaming a
//!   variant changes the stored form.

mod add_nodes;
mod destroy;
mod recover;
mod remove_nodes;
mod rules;
mod scale;
mod start;
mod step;
mod stop;
mod upgrade;

pub use rules::{Call, KindRules, LifecycleCall};
pub use step::Step;

use serde::{Deserialize, Serialize};

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OperationKind {
    Start,
    Stop,
    Scale,
    Upgrade,
    AddNodes,
    RemoveNodes,
    Destroy,
    Recover,
}

impl OperationKind {
    pub const ALL: [OperationKind; 8] = [
        OperationKind::Start,
        OperationKind::Stop,
        OperationKind::Scale,
        OperationKind::Upgrade,
        OperationKind::AddNodes,
        OperationKind::RemoveNodes,
        OperationKind::Destroy,
        OperationKind::Recover,
    ];

    /// The lower-case name used in flags and logs.
    pub fn name(self) -> &'static str {
        match self {
            OperationKind::Start => "start",
            OperationKind::Stop => "stop",
            OperationKind::Scale => "scale",
            OperationKind::Upgrade => "upgrade",
            OperationKind::AddNodes => "add-nodes",
            OperationKind::RemoveNodes => "remove-nodes",
            OperationKind::Destroy => "destroy",
            OperationKind::Recover => "recover",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What the server knows of this kind.
    pub fn rules(self) -> &'static dyn KindRules {
        rules(self)
    }
}

/// The one place a kind is tied to its module.
pub fn rules(kind: OperationKind) -> &'static dyn KindRules {
    match kind {
        OperationKind::Start => &start::Start,
        OperationKind::Stop => &stop::Stop,
        OperationKind::Scale => &scale::Scale,
        OperationKind::Upgrade => &upgrade::Upgrade,
        OperationKind::AddNodes => &add_nodes::AddNodes,
        OperationKind::RemoveNodes => &remove_nodes::RemoveNodes,
        OperationKind::Destroy => &destroy::Destroy,
        OperationKind::Recover => &recover::Recover,
    }
}

/// The kind an RPC path asks for, when it is a lifecycle RPC.
pub fn kind_of_rpc(path: &str) -> Option<OperationKind> {
    OperationKind::ALL
        .into_iter()
        .find(|kind| kind.rules().rpc() == path)
}

#[cfg(test)]
mod tests {
    use super::OperationKind;

    #[test]
    fn every_kind_is_found_by_its_name_and_no_other() {
        for kind in OperationKind::ALL {
            assert_eq!(OperationKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(OperationKind::from_name("AddNodes"), None);
        assert_eq!(OperationKind::from_name(""), None);
    }

    #[test]
    fn every_kind_has_its_own_rpc() {
        for kind in OperationKind::ALL {
            assert_eq!(super::kind_of_rpc(kind.rules().rpc()), Some(kind));
            assert!(kind.rules().rpc().starts_with("/drover.v1.Clusters/"));
        }
    }
}
