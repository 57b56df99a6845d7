//! The operation kinds and the names flags, logs and records know them by.
//!
//! A leaf: it imports nothing from the crate, so the configuration (which
//! reads per-kind timeouts) and the operations (which store the kind) both
//! depend on it rather than on each other. `crate::operation` re-exports
//! [`OperationKind`], where most code names it.
//!
//! # Guarantees
//! - [`OperationKind::from_name`] accepts exactly the names
//!   [`OperationKind::name`] gives.
//!
//! # Caveats
//! - Records store a kind by its variant name (serde's form): renaming a
//!   variant changes the stored form.

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
}
