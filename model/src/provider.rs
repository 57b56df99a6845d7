//! The infrastructure provider, reduced to its fencing: it remembers the
//! newest epoch it has seen per cluster and refuses calls carrying an older
//! one (the rule `drover_machine::fence_admits` states, which
//! `server/src/provider/sim.rs` applies atomically with the call).
//! A fenced read (DescribeCluster with a token) raises that epoch too.

use crate::store::{ClusterId, OperationId, Revision};
use drover_machine::fence_admits;

/// The fencing token every call carries (the cluster uid is the cluster
/// itself here: the model never re-creates a cluster), and the step of the
/// operation the call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token {
    pub cluster: ClusterId,
    pub epoch: Revision,
    pub operation: OperationId,
    pub step: u8,
}

/// A call the provider took, and whether the step worked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Landed {
    pub token: Token,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Provider {
    newest: Vec<Option<Revision>>,
    /// Every call the provider took, per cluster in order: what the
    /// properties about side effects look at. (Per cluster, so that calls
    /// on two clusters in either order make one state, not two.)
    pub accepted: Vec<Vec<Landed>>,
}

impl Provider {
    pub fn new(clusters: usize) -> Self {
        Provider {
            newest: vec![None; clusters],
            accepted: vec![Vec::new(); clusters],
        }
    }

    /// Whether a call (or a fenced read) with `epoch` would be refused as
    /// stale.
    pub fn refuses(&self, cluster: ClusterId, epoch: Revision) -> bool {
        !fence_admits(self.newest[cluster].map(i64::from), i64::from(epoch))
    }

    /// A fenced read that the provider answered: it changes no node, and
    /// from now on older epochs are refused.
    pub fn fence(&mut self, cluster: ClusterId, epoch: Revision) {
        let newest = &mut self.newest[cluster];
        *newest = Some(newest.map_or(epoch, |n| n.max(epoch)));
    }

    /// Takes a call that [`Self::refuses`] does not refuse.
    pub fn accept(&mut self, token: Token, ok: bool) {
        self.fence(token.cluster, token.epoch);
        self.accepted[token.cluster].push(Landed { token, ok });
    }

    /// Whether a call for `step` of `operation` on `cluster` was taken and
    /// worked.
    pub fn did(&self, cluster: ClusterId, operation: OperationId, step: u8) -> bool {
        self.accepted[cluster]
            .iter()
            .any(|l| l.ok && l.token.operation == operation && l.token.step == step)
    }
}
