//! The infrastructure provider, reduced to its fencing and its drain: it
//! remembers the newest epoch it has seen per cluster and refuses calls
//! carrying an older one (the rule `drover_machine::fence_admits` states,
//! which `server/src/provider/sim.rs` applies atomically with the call). A
//! fenced read (DescribeCluster with a token) raises that epoch too.
//!
//! A call is either taken and applied in one step, or admitted (its token
//! checked) and applied later, as a long call is. Whatever raises a
//! cluster's newest epoch first drains the calls of older epochs still
//! running for that cluster: they are aborted and apply nothing, then or
//! later (`provider.proto`, "Draining").

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
    /// Calls admitted and not applied yet, sorted.
    pub running: Vec<Token>,
    /// Every call the provider applied, per cluster in order: what the
    /// properties about side effects look at. (Per cluster, so that calls
    /// on two clusters in either order make one state, not two.)
    pub accepted: Vec<Vec<Landed>>,
}

impl Provider {
    pub fn new(clusters: usize) -> Self {
        Provider {
            newest: vec![None; clusters],
            running: Vec::new(),
            accepted: vec![Vec::new(); clusters],
        }
    }

    /// The newest epoch it has seen for `cluster`.
    pub fn newest(&self, cluster: ClusterId) -> Option<Revision> {
        self.newest[cluster]
    }

    /// Whether a call (or a fenced read) with `epoch` would be refused as
    /// stale.
    pub fn refuses(&self, cluster: ClusterId, epoch: Revision) -> bool {
        !fence_admits(self.newest[cluster].map(i64::from), i64::from(epoch))
    }

    /// A fenced call or read that the provider admits: from now on older
    /// epochs are refused and, when it `drains`, the calls of older epochs
    /// still running for the cluster are aborted. The aborted calls.
    pub fn fence(&mut self, cluster: ClusterId, epoch: Revision, drains: bool) -> Vec<Token> {
        let newest = &mut self.newest[cluster];
        *newest = Some(newest.map_or(epoch, |n| n.max(epoch)));
        if !drains {
            return Vec::new();
        }
        let (aborted, running) = self
            .running
            .iter()
            .partition(|t| t.cluster == cluster && t.epoch < epoch);
        self.running = running;
        aborted
    }

    /// Takes a call that [`Self::refuses`] does not refuse and applies it
    /// at once. The calls it drained.
    pub fn accept(&mut self, token: Token, ok: bool, drains: bool) -> Vec<Token> {
        let aborted = self.fence(token.cluster, token.epoch, drains);
        self.apply(token, ok);
        aborted
    }

    /// Admits a call that [`Self::refuses`] does not refuse, to apply it
    /// later. The calls it drained.
    pub fn admit(&mut self, token: Token, drains: bool) -> Vec<Token> {
        let aborted = self.fence(token.cluster, token.epoch, drains);
        let at = self.running.partition_point(|t| *t < token);
        self.running.insert(at, token);
        aborted
    }

    /// Applies a call: one admitted earlier leaves [`Self::running`].
    pub fn apply(&mut self, token: Token, ok: bool) {
        if let Some(at) = self.running.iter().position(|t| *t == token) {
            self.running.remove(at);
        }
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
