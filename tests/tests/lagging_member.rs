//! A lagging etcd member is not a restore. On a 3-member etcd, a replica
//! whose view of etcd's raft progress comes from a member far behind
//! (restarted, catching up: its raft index below the fence record's)
//! takes it for a restore and moves the epoch base up. Every replica then
//! claims under the new base — the other replica's next claim fails on
//! the fence record and reads it again — so a cluster that moves from the
//! lagging replica to its peer gets a higher epoch, and the provider
//! accepts it (before, the peer claimed under the old generation and was
//! refused as stale for ever).
//!
//! The lag is injected where a replica reads it: the in-process replica's
//! store answers `raft_progress` as a member that restarted from an early
//! snapshot would (raft index and revision 1); every other call reaches
//! the real members.
//!
//! Bounded: every wait has a deadline; loopback only; only processes this
//! test started are signalled.

use async_trait::async_trait;
use clap::Parser;
use drover_client::v1;
use drover_client::Client;
use drover_server::config::{Cli, Command, Config};
use drover_server::provider::Providers;
use drover_server::store::{
    EtcdOptions, EtcdStore, GetResult, LeaseId, RaftProgress, RangeRequest, Result, SharedStore,
    Store, Txn, TxnResult, WatchStream,
};
use drover_tests::etcd::EtcdCluster;
use drover_tests::history::{ends, provider_violations};
use drover_tests::provider::SimProcess;
use drover_tests::replica::{health, ReplicaProcess};
use drover_tests::{create_running, free_port, operations_of, owner, stop_and_start, wait_until};
use std::sync::Arc;
use std::time::Duration;
use tonic_health::pb::health_check_response::ServingStatus;

const WAIT: Duration = Duration::from_secs(60);

/// etcd as seen through a member far behind, for the raft progress only.
struct Lagging(EtcdStore);

#[async_trait]
impl Store for Lagging {
    async fn get(&self, key: &str) -> Result<GetResult> {
        self.0.get(key).await
    }
    async fn range(&self, request: RangeRequest) -> Result<GetResult> {
        self.0.range(request).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        self.0.txn(txn).await
    }
    async fn grant_lease(&self, ttl_seconds: i64) -> Result<LeaseId> {
        self.0.grant_lease(ttl_seconds).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<i64> {
        self.0.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.0.revoke_lease(lease).await
    }
    async fn lease_time_to_live(&self, lease: LeaseId) -> Result<Option<i64>> {
        self.0.lease_time_to_live(lease).await
    }
    async fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        self.0.watch(prefix, from_revision).await
    }
    async fn compact(&self, revision: i64) -> Result<()> {
        self.0.compact(revision).await
    }
    async fn server_version(&self) -> Result<Option<String>> {
        self.0.server_version().await
    }
    async fn raft_progress(&self) -> Result<Option<RaftProgress>> {
        Ok(Some(RaftProgress {
            raft_index: 1,
            revision: 1,
        }))
    }
}

/// A replica served in this process over `store`, stopped when
/// `stop` is sent or dropped.
struct InProcess {
    endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<()>,
}

impl InProcess {
    async fn serve(store: SharedStore, args: &[&str]) -> Self {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let admin = format!("127.0.0.1:{}", free_port());
        let mut argv = vec![
            "drover",
            "serve",
            "--listen",
            &listen,
            "--admin-listen",
            &admin,
        ];
        argv.extend_from_slice(args);
        let Command::Serve(serve) = Cli::try_parse_from(argv).expect("flags").command else {
            panic!("not a serve command");
        };
        let config = Config::from_serve_args(*serve).expect("a valid configuration");
        let providers = config.providers.as_ref().map(Providers::connect);
        let providers = providers.transpose().expect("providers").map(Arc::new);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(async move {
            let stopped = async move {
                let _ = stopped.await;
            };
            drover_server::server::serve(&config, store, providers, stopped)
                .await
                .expect("the in-process replica serves");
        });
        let endpoint = format!("http://{listen}");
        wait_until(WAIT, "the in-process replica to serve", || {
            let endpoint = endpoint.clone();
            async move { health(&endpoint).await == Some(ServingStatus::Serving) }
        })
        .await;
        Self {
            endpoint,
            stop: Some(stop),
            serving,
        }
    }

    async fn shut_down(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        tokio::time::timeout(WAIT, &mut self.serving)
            .await
            .expect("the in-process replica stops")
            .expect("it stopped cleanly");
    }
}

/// Polls the owners of `clusters` through `endpoint`'s admin service
/// until every cluster has one and `done` holds of them.
async fn owners_until(
    endpoint: &str,
    clusters: &[String],
    what: &str,
    done: impl Fn(&[(String, v1::Owner)]) -> bool,
) -> Vec<(String, v1::Owner)> {
    let mut admin = v1::admin_client::AdminClient::connect(endpoint.to_string())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut found = Vec::new();
        for cluster in clusters {
            if let Some(now) = owner(&mut admin, cluster).await {
                found.push((cluster.clone(), now));
            }
        }
        if found.len() == clusters.len() && done(&found) {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what} within {WAIT:?}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_member_moves_every_replica_to_one_epoch_base() {
    let etcd = EtcdCluster::start(3).await;
    let endpoints = etcd.endpoints().join(",");
    let sim = SimProcess::start().await;
    let provider = sim.endpoint();
    let common = [
        "--provider",
        provider.as_str(),
        "--lease-ttl",
        "2",
        "--scan-interval",
        "1",
    ];
    let r1 = ReplicaProcess::serve_with(&endpoints, "r1", &common).await;
    let mut client = r1.client().await;
    let clusters: Vec<String> = (0..6).map(|i| format!("lag-{i}")).collect();
    for cluster in &clusters {
        create_running(&mut client, cluster, 1).await;
    }

    // r2 joins through the lagging view and takes part of the clusters,
    // each of which it drives once, so the provider sees its epochs.
    let lagging = Arc::new(Lagging(
        EtcdStore::connect(&EtcdOptions::new(etcd.endpoints()))
            .await
            .unwrap(),
    ));
    let mut args = vec!["--etcd-endpoints", endpoints.as_str(), "--replica-id", "r2"];
    args.extend_from_slice(&common);
    let r2 = InProcess::serve(lagging, &args).await;
    let taken = owners_until(&r1.endpoint(), &clusters, "cluster owned by r2", |owners| {
        owners.iter().any(|(_, o)| o.replica == "r2")
    })
    .await;
    let mut r2_client = Client::connect(&r2.endpoint).await.unwrap();
    let mut r2_epochs = Vec::new();
    for (cluster, owner) in taken.iter().filter(|(_, o)| o.replica == "r2") {
        stop_and_start(&mut r2_client, cluster, WAIT).await;
        r2_epochs.push(owner.epoch);
    }

    // r2 leaves: its clusters move to r1, which must claim them above
    // r2's epochs, and every cluster goes on working.
    r2.shut_down().await;
    let after = owners_until(
        &r1.endpoint(),
        &clusters,
        "r1 owning every cluster",
        |owners| owners.iter().all(|(_, o)| o.replica == "r1"),
    )
    .await;
    for cluster in &clusters {
        stop_and_start(&mut client, cluster, WAIT).await;
    }
    let highest_r2 = r2_epochs.iter().max().copied().unwrap_or_default();
    for (cluster, owner) in &after {
        if taken.iter().any(|(c, o)| c == cluster && o.replica == "r2") {
            assert!(
                owner.epoch > highest_r2,
                "{cluster}: epoch {} <= r2's {highest_r2}",
                owner.epoch
            );
        }
    }
    let mut operations = Vec::new();
    for cluster in &clusters {
        operations.extend(operations_of(&client, cluster).await);
    }
    let audit = sim.audit("").await;
    let violations = provider_violations(&audit, &ends(&operations));
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    eprintln!(
        "lagging member: r2 claimed under epochs {r2_epochs:?}; after it left, r1 owns all at {:?}",
        after.iter().map(|(_, o)| o.epoch).collect::<Vec<_>>()
    );
}
