//! The drain: what a replica does between the shutdown signal and its exit.
//!
//! One sequence, in one place, because its order is what makes a rolling
//! restart lose nothing: load balancers must stop sending before the
//! replica stops taking work, running operations must get their grace
//! before the lease goes, and the cluster cache must follow etcd until the
//! hand-off no longer reads it.
//!
//! # Guarantees
//! - The steps run in this order: health NotServing, /readyz false, the
//!   executor and the task scheduler take no new work, every background
//!   worker is told to stop, the hand-off (at most `--handoff-grace`), the
//!   lease revoked (nothing running) or left to expire (something still
//!   running), the cache stopped; then in-flight RPCs get [`DRAIN_GRACE`].
//! - A cluster whose operation does not run here goes to the peers during
//!   the hand-off at once, not when the slowest operation ends.
//!
//! # Assumptions
//! - etcd may not answer during the drain: every hand-off step is bounded
//!   by the grace, and what is not handed over by then goes with the lease.
//!
//! # Caveats
//! - An operation still running when the grace ends is not cut short here;
//!   the lease is left to expire and a peer recovers it as an orphan.

use crate::cluster::ClusterCache;
use crate::owner_work::OwnerWork;
use crate::replica::{Switches, Workers};
use crate::replication::Ownership;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long in-flight RPCs may take to finish after SIGTERM.
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// How often a draining replica looks again for clusters it can hand over
/// (an operation that ended, one accepted for a cluster it still owns).
const HANDOFF_RECHECK: Duration = Duration::from_millis(500);

/// What the drain stops, taken from a started [`crate::replica::Replica`].
pub struct Drain {
    pub switches: Switches,
    pub workers: Option<Workers>,
    pub cache: Arc<ClusterCache>,
    /// How long running operations may take to finish (`--handoff-grace`).
    pub handoff_grace: Duration,
}

impl Drain {
    /// The drain as two futures: the first waits for `signal`, runs the
    /// sequence (`withdraw` first: it tells load balancers) and resolves
    /// when the gRPC server should stop accepting; the second resolves
    /// [`DRAIN_GRACE`] after that, so that clients keeping idle connections
    /// open do not hold the exit hostage (and never if the drain never ran).
    pub fn after(
        self,
        signal: impl Future<Output = ()> + Send + 'static,
        withdraw: impl Future<Output = ()> + Send + 'static,
    ) -> (
        impl Future<Output = ()> + Send + 'static,
        impl Future<Output = ()> + Send + 'static,
    ) {
        let (drained, drained_seen) = oneshot::channel::<()>();
        let drain = async move {
            signal.await;
            self.run(withdraw).await;
            tracing::info!(grace = ?DRAIN_GRACE, "shutting down: draining in-flight requests");
            let _ = drained.send(());
        };
        let grace_over = async move {
            if drained_seen.await.is_ok() {
                tokio::time::sleep(DRAIN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        (drain, grace_over)
    }

    /// Tells load balancers first, then takes no new work, lets running
    /// operations finish for a while, and hands the clusters off at once
    /// by revoking the lease.
    async fn run(self, withdraw: impl Future<Output = ()>) {
        let Self {
            switches:
                Switches {
                    ready,
                    stop_work,
                    stop_cache,
                },
            workers,
            cache,
            handoff_grace,
        } = self;
        withdraw.await;
        ready.store(false, Ordering::SeqCst);
        if let Some(workers) = &workers {
            workers.work.stop_taking_work();
        }
        let _ = stop_work.send(true);
        if let Some(workers) = workers {
            leave(workers, &cache, handoff_grace).await;
        }
        let _ = stop_cache.send(true);
    }
}

/// Hands the clusters over and leaves the membership: by revoking the
/// lease when nothing runs here any more, else by letting it expire so that
/// no peer takes a cluster whose operation still calls the provider.
async fn leave(workers: Workers, cache: &ClusterCache, grace: Duration) {
    let Workers {
        replication, work, ..
    } = workers;
    hand_off(&replication, &work, cache, grace).await;
    if work.in_flight() == 0 {
        replication.resign().await;
    } else {
        tracing::warn!(
            running = work.in_flight(),
            "operations still running: leaving without revoking the lease, peers take over once this process exits (seen through their liveness connections) or after the TTL"
        );
        replication.leave();
    }
}

/// Lets the operations running here finish, for at most `grace`, while
/// every other cluster goes to the peers at once (see
/// [`Ownership::release_unbusy`]); with nothing running the lease revoke
/// that follows hands everything over in one go.
async fn hand_off(
    replication: &Ownership,
    work: &OwnerWork,
    cache: &ClusterCache,
    grace: Duration,
) {
    if work.in_flight() == 0 {
        return;
    }
    let deadline = tokio::time::Instant::now() + grace;
    // etcd may not answer at all: the grace bounds every step, and what is
    // not handed over by then goes with the lease.
    match tokio::time::timeout_at(deadline, replication.begin_draining()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot mark this replica draining; its clusters go with the lease");
        }
        Err(_) => tracing::warn!("marking this replica draining took the whole hand-off grace"),
    }
    let mut running = work.in_flight();
    let mut next_release = tokio::time::Instant::now();
    while running > 0 && tokio::time::Instant::now() < deadline {
        if tokio::time::Instant::now() >= next_release {
            let released = replication.release_unbusy(cache, |id| work.runs(id));
            match tokio::time::timeout_at(deadline, released).await {
                Ok(Ok(left)) => tracing::info!(running, owned = left, "draining"),
                Ok(Err(error)) => tracing::warn!(%error, "hand-off release failed; retrying"),
                Err(_) => break,
            }
            next_release = tokio::time::Instant::now() + HANDOFF_RECHECK;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now_running = work.in_flight();
        if now_running < running {
            // An operation ended: its cluster can go as soon as the cache
            // shows it idle.
            next_release = tokio::time::Instant::now();
        }
        running = now_running;
    }
    if running > 0 {
        tracing::warn!(
            running,
            "hand-off grace over: peers will recover the running operations"
        );
    }
}
