//! The infrastructure provider, reduced to its fencing: it remembers the
//! newest epoch it has seen per cluster and refuses calls carrying an older
//! one (as `server/src/provider/sim.rs` does, atomically with the call).

use crate::store::{ClusterId, OperationId, Revision};

/// The fencing token every mutating call carries (the cluster uid is the
/// cluster itself here: the model never re-creates a cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    pub cluster: ClusterId,
    pub epoch: Revision,
    pub operation: OperationId,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Provider {
    newest: Vec<Option<Revision>>,
    /// Every call the provider accepted, per cluster in order: what the
    /// properties about side effects look at. (Per cluster, so that calls
    /// on two clusters in either order make one state, not two.)
    pub accepted: Vec<Vec<Token>>,
}

impl Provider {
    pub fn new(clusters: usize) -> Self {
        Provider {
            newest: vec![None; clusters],
            accepted: vec![Vec::new(); clusters],
        }
    }

    /// Whether a call with `token` would be refused as stale.
    pub fn refuses(&self, token: Token) -> bool {
        self.newest[token.cluster].is_some_and(|newest| token.epoch < newest)
    }

    /// A fenced read (DescribeCluster with a token): refuses nothing that
    /// matters here, changes no node, and from now on refuses older epochs.
    pub fn fence(&mut self, cluster: ClusterId, epoch: Revision) {
        let newest = &mut self.newest[cluster];
        *newest = Some(newest.map_or(epoch, |n| n.max(epoch)));
    }

    /// Accepts a call that [`Self::refuses`] does not refuse.
    pub fn accept(&mut self, token: Token) {
        self.newest[token.cluster] = Some(token.epoch);
        self.accepted[token.cluster].push(token);
    }
}
