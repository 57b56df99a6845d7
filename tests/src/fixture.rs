//! One end-to-end test's world, built in one place: a real etcd, the
//! simulated provider process, `drover serve` replica processes on both,
//! and a client of the first replica.
//!
//! ```ignore
//! let mut f = Fixture::builder()
//!     .replicas(3)
//!     .ttl(5)
//!     .sim_args(&["--offerings", "medium"])
//!     .replica_args(&["--operation-history", "2"])
//!     .start()
//!     .await;
//! create_running(&mut f.client, "web", 1).await;
//! let audit = f.sim.audit("").await;
//! ```

use crate::etcd::EtcdProcess;
use crate::history::assert_transitions_are_edges;
use crate::provider::SimProcess;
use crate::replica::ReplicaProcess;
use drover_client::{v1, Client};
use drover_server::cluster::ClusterState;
use std::collections::HashMap;
use std::time::Duration;

/// How long [`Fixture::finish`] waits for an operation to end.
pub const FINISH_WAIT: Duration = Duration::from_secs(30);

/// etcd and the simulated provider: what every replica of a test shares.
/// On its own for tests whose replicas are not plain processes (in the
/// test's process, logged, with an environment of their own).
///
/// Fields drop in order: the provider first, etcd last.
pub struct Backends {
    pub sim: SimProcess,
    pub etcd: EtcdProcess,
}

/// etcd, the simulated provider, replica processes `r1`, `r2`, ... serving
/// on both with the same flags, and a client of `r1`.
///
/// Fields drop in order: the replicas first (they stop before what they
/// depend on), etcd last.
pub struct Fixture {
    pub replicas: Vec<ReplicaProcess>,
    pub client: Client,
    pub sim: SimProcess,
    pub etcd: EtcdProcess,
    /// The flags every replica was given, for the ones added later.
    replica_args: Vec<String>,
}

/// How a [`Fixture`] is to be built; see [`Fixture::builder`].
#[derive(Debug, Clone)]
pub struct FixtureBuilder {
    replicas: usize,
    ttl: Option<u64>,
    scan_interval: Option<u64>,
    sim_args: Vec<String>,
    replica_args: Vec<String>,
}

impl Backends {
    /// Starts etcd and a simulator with none of its flags.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts etcd and a simulator with `sim_args`.
    pub async fn start_with(sim_args: &[&str]) -> Self {
        let etcd = EtcdProcess::start().await;
        let sim = SimProcess::start_with(sim_args).await;
        Self { sim, etcd }
    }

    /// Starts a replica process `id` on these, `--provider` first, then
    /// `extra`.
    pub async fn serve(&self, id: &str, extra: &[&str]) -> ReplicaProcess {
        let provider = self.sim.endpoint();
        let mut args = vec!["--provider", provider.as_str()];
        args.extend_from_slice(extra);
        ReplicaProcess::serve_with(&self.etcd.endpoint(), id, &args).await
    }

    /// As [`Self::serve`] for a replica serving TLS (`--tls-cert` ...
    /// among `extra`), whose health the harness checks with `tls`.
    pub async fn serve_tls(
        &self,
        id: &str,
        extra: &[&str],
        tls: tonic::transport::ClientTlsConfig,
    ) -> ReplicaProcess {
        let provider = self.sim.endpoint();
        let mut args = vec!["--provider", provider.as_str()];
        args.extend_from_slice(extra);
        ReplicaProcess::serve_tls(&self.etcd.endpoint(), id, &args, tls).await
    }
}

impl Fixture {
    /// One replica, the replica's own defaults (a 2 s lease TTL, see
    /// [`ReplicaProcess::serve`]), a simulator with none of its flags.
    pub fn builder() -> FixtureBuilder {
        FixtureBuilder {
            replicas: 1,
            ttl: None,
            scan_interval: None,
            sim_args: Vec::new(),
            replica_args: Vec::new(),
        }
    }

    /// The flags every replica of this fixture serves with (`--provider`
    /// first), for a test that starts one of its own alike.
    pub fn replica_args(&self) -> Vec<&str> {
        self.replica_args.iter().map(String::as_str).collect()
    }

    /// Starts another replica, `id`, with the fixture's flags and keeps it
    /// last in [`Self::replicas`].
    pub async fn add_replica(&mut self, id: &str) -> &mut ReplicaProcess {
        let etcd = self.etcd.endpoint();
        let replica = ReplicaProcess::serve_with(&etcd, id, &self.replica_args()).await;
        self.replicas.push(replica);
        self.replicas.last_mut().expect("just added")
    }

    /// Waits up to [`FINISH_WAIT`] for `operation` to end, and returns it
    /// ended (whatever its outcome); panics if it is still going.
    pub async fn finish(&mut self, operation: v1::Operation) -> v1::Operation {
        let done = self
            .client
            .wait_operation(&operation, FINISH_WAIT)
            .await
            .expect("wait");
        assert!(
            done.state >= v1::OperationState::Succeeded as i32,
            "still {done:?} after {FINISH_WAIT:?}"
        );
        done
    }

    /// Replays the state keys' history and checks each change against the
    /// table; returns every cluster's states, by uid, oldest first.
    pub async fn check_history(&self) -> HashMap<String, Vec<ClusterState>> {
        assert_transitions_are_edges(&self.etcd.store().await, "/drover/v1/").await
    }
}

impl FixtureBuilder {
    /// How many replica processes (`r1` ... `rN`) to start; at least one.
    pub fn replicas(mut self, count: usize) -> Self {
        self.replicas = count;
        self
    }

    /// Every replica's lease TTL (`--lease-ttl`), in seconds.
    pub fn ttl(mut self, seconds: u64) -> Self {
        self.ttl = Some(seconds);
        self
    }

    /// How often every replica's status scanner looks at its clusters
    /// (`--scan-interval`), in seconds.
    pub fn scan_interval(mut self, seconds: u64) -> Self {
        self.scan_interval = Some(seconds);
        self
    }

    /// More flags for the simulator (e.g. `--offerings medium`).
    pub fn sim_args(mut self, args: &[&str]) -> Self {
        self.sim_args = args.iter().map(|s| s.to_string()).collect();
        self
    }

    /// More flags for every replica (e.g. `--operation-history 2`).
    pub fn replica_args(mut self, args: &[&str]) -> Self {
        self.replica_args = args.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Starts etcd, the simulator and the replicas, each waited for until
    /// it serves, and connects a client to the first replica.
    pub async fn start(self) -> Fixture {
        assert!(
            self.replicas > 0,
            "a fixture needs a replica for its client"
        );
        let sim_args: Vec<&str> = self.sim_args.iter().map(String::as_str).collect();
        let Backends { sim, etcd } = Backends::start_with(&sim_args).await;
        let replica_args = self.replica_flags(&sim);
        let mut replicas = Vec::with_capacity(self.replicas);
        for i in 1..=self.replicas {
            let args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
            let id = format!("r{i}");
            replicas.push(ReplicaProcess::serve_with(&etcd.endpoint(), &id, &args).await);
        }
        let client = replicas[0].client().await;
        Fixture {
            replicas,
            client,
            sim,
            etcd,
            replica_args,
        }
    }

    /// `--provider` on `sim`, then the TTL and scan interval if set, then
    /// the test's own flags.
    fn replica_flags(&self, sim: &SimProcess) -> Vec<String> {
        let mut flags = vec!["--provider".to_string(), sim.endpoint()];
        if let Some(ttl) = self.ttl {
            flags.extend(["--lease-ttl".to_string(), ttl.to_string()]);
        }
        if let Some(interval) = self.scan_interval {
            flags.extend(["--scan-interval".to_string(), interval.to_string()]);
        }
        flags.extend(self.replica_args.iter().cloned());
        flags
    }
}
