//! A replica in the test's own process, over a real etcd seen through a
//! store the test can inject faults into at exact points: after a chosen
//! transaction commits, or instead of it. A replica process can only be
//! raced; this one can be stopped between two of its own steps.

use crate::etcd::EtcdProcess;
use crate::free_port;
use async_trait::async_trait;
use drover_client::Client;
use drover_server::config::{Config, ServeArgs, Settings};
use drover_server::server::ServeError;
use drover_server::store::{
    EtcdStore, GetResult, LeaseId, Op, RangeRequest, Result, Store, StoreError, Txn, TxnResult,
    WatchStream,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What happens to the transaction a rule picks.
pub enum Injection {
    /// This runs first, then it is sent.
    Before(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Once it has committed, this runs before the replica sees the result.
    After(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// It is not sent; the replica gets "etcd unavailable".
    Fail,
    /// It commits, this runs, and the replica gets "etcd unavailable": a
    /// reply lost on its way back, so the outcome is unknown to the replica.
    Lose(Pin<Box<dyn Future<Output = ()> + Send>>),
}

type Picks = Box<dyn Fn(&Txn) -> bool + Send + Sync>;
type PicksRead = Box<dyn Fn(&RangeRequest) -> bool + Send + Sync>;

/// etcd, with rules that each fire once, on the first transaction they
/// pick, and reads that fail while the test says so.
pub struct InjectingStore {
    etcd: EtcdStore,
    rules: Mutex<Vec<(Picks, Injection)>>,
    failing_reads: Mutex<Vec<PicksRead>>,
    /// Keep-alives reach etcd (the lease is renewed) but their replies are
    /// lost, while this is set.
    losing_keep_alive_replies: std::sync::atomic::AtomicBool,
}

impl InjectingStore {
    /// Adds a rule: `injection` applies to the first transaction `picks`
    /// accepts (for [`Injection::After`], the first one that commits).
    pub fn inject(
        &self,
        picks: impl Fn(&Txn) -> bool + Send + Sync + 'static,
        injection: Injection,
    ) {
        lock(&self.rules).push((Box::new(picks), injection));
    }

    /// Every read `picks` accepts (a key read is picked as the prefix of
    /// itself) fails with "etcd unavailable", until [`Self::heal_reads`].
    pub fn fail_reads(&self, picks: impl Fn(&RangeRequest) -> bool + Send + Sync + 'static) {
        lock(&self.failing_reads).push(Box::new(picks));
    }

    /// Keep-alives still renew the lease in etcd, but the replica hears
    /// "etcd unavailable" instead of their replies (`false`: heard again).
    pub fn lose_keep_alive_replies(&self, lose: bool) {
        use std::sync::atomic::Ordering;
        self.losing_keep_alive_replies.store(lose, Ordering::SeqCst);
    }

    /// Reads succeed again.
    pub fn heal_reads(&self) {
        lock(&self.failing_reads).clear();
    }

    /// Whether a read (a key read as the prefix of itself) is to fail.
    fn read_fails(&self, read: &RangeRequest) -> bool {
        lock(&self.failing_reads).iter().any(|picks| picks(read))
    }

    /// Transaction rules that have not fired yet.
    pub fn pending(&self) -> usize {
        lock(&self.rules).len()
    }

    /// Drops the rules that have not fired.
    pub fn clear_rules(&self) {
        lock(&self.rules).clear();
    }

    fn take(&self, txn: &Txn) -> Option<(Picks, Injection)> {
        let mut rules = lock(&self.rules);
        let index = rules.iter().position(|(picks, _)| picks(txn))?;
        Some(rules.remove(index))
    }
}

/// Whether `txn` writes a key for which `key` holds (and, if the value is
/// given, a value containing it).
pub fn writes(txn: &Txn, key: impl Fn(&str) -> bool, value: Option<&str>) -> bool {
    txn.success.iter().any(|op| match op {
        Op::Put {
            key: k, value: v, ..
        } => key(k) && value.is_none_or(|value| String::from_utf8_lossy(v).contains(value)),
        _ => false,
    })
}

#[async_trait]
impl Store for InjectingStore {
    async fn get(&self, key: &str) -> Result<GetResult> {
        if self.read_fails(&RangeRequest::prefix(key)) {
            return Err(StoreError::Unavailable("read failed by the test".into()));
        }
        self.etcd.get(key).await
    }
    async fn range(&self, request: RangeRequest) -> Result<GetResult> {
        if self.read_fails(&request) {
            return Err(StoreError::Unavailable("read failed by the test".into()));
        }
        self.etcd.range(request).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let Some((picks, injection)) = self.take(&txn) else {
            return self.etcd.txn(txn).await;
        };
        match injection {
            Injection::Before(first) => {
                first.await;
                self.etcd.txn(txn).await
            }
            Injection::Fail => Err(StoreError::Unavailable("injected by the test".into())),
            Injection::Lose(then) => {
                self.etcd.txn(txn).await?;
                then.await;
                Err(StoreError::Unavailable("reply lost by the test".into()))
            }
            Injection::After(then) => {
                let result = self.etcd.txn(txn).await?;
                if result.succeeded {
                    then.await;
                } else {
                    lock(&self.rules).push((picks, Injection::After(then)));
                }
                Ok(result)
            }
        }
    }
    async fn grant_lease(&self, ttl_seconds: i64) -> Result<LeaseId> {
        self.etcd.grant_lease(ttl_seconds).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<i64> {
        let ttl = self.etcd.keep_alive(lease).await?;
        if self
            .losing_keep_alive_replies
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(StoreError::Unavailable("reply lost by the test".into()));
        }
        Ok(ttl)
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        self.etcd.revoke_lease(lease).await
    }
    async fn lease_time_to_live(&self, lease: LeaseId) -> Result<Option<i64>> {
        self.etcd.lease_time_to_live(lease).await
    }
    async fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        self.etcd.watch(prefix, from_revision).await
    }
    async fn watch_puts(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        self.etcd.watch_puts(prefix, from_revision).await
    }
    async fn compact(&self, revision: i64) -> Result<()> {
        self.etcd.compact(revision).await
    }
}

/// `drover serve` as a task of this process.
pub struct InProcessReplica {
    pub store: Arc<InjectingStore>,
    endpoint: String,
    admin_endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::result::Result<(), ServeError>>,
}

impl InProcessReplica {
    /// Serves on free loopback ports with the provider at `provider`, and
    /// returns once the gRPC port answers.
    pub async fn serve(etcd: &EtcdProcess, replica_id: &str, provider: &str, ttl: i64) -> Self {
        Self::serve_with(
            etcd,
            replica_id,
            provider,
            Settings {
                lease_ttl: Some(ttl),
                ..Default::default()
            },
        )
        .await
    }

    /// [`Self::serve`] with `arm` called on the store before the replica
    /// starts: an injection then also catches its first writes (a takeover
    /// at start-up may be over before `serve` returns).
    pub async fn serve_armed(
        etcd: &EtcdProcess,
        replica_id: &str,
        provider: &str,
        ttl: i64,
        arm: impl FnOnce(&InjectingStore),
    ) -> Self {
        let settings = Settings {
            lease_ttl: Some(ttl),
            ..Default::default()
        };
        Self::serve_inner(etcd, replica_id, provider, settings, arm).await
    }

    /// [`Self::serve`] with more `settings` (the ports, etcd, replica id and
    /// provider are filled in).
    pub async fn serve_with(
        etcd: &EtcdProcess,
        replica_id: &str,
        provider: &str,
        settings: Settings,
    ) -> Self {
        Self::serve_inner(etcd, replica_id, provider, settings, |_| {}).await
    }

    async fn serve_inner(
        etcd: &EtcdProcess,
        replica_id: &str,
        provider: &str,
        settings: Settings,
        arm: impl FnOnce(&InjectingStore),
    ) -> Self {
        let listen = format!("127.0.0.1:{}", free_port());
        let admin_listen = format!("127.0.0.1:{}", free_port());
        let settings = Settings {
            listen: Some(listen.clone()),
            admin_listen: Some(admin_listen.clone()),
            etcd_endpoints: Some(vec![etcd.endpoint()]),
            replica_id: Some(replica_id.into()),
            provider: Some(vec![provider.into()]),
            ..settings
        };
        let config = Config::from_serve_args(ServeArgs {
            config: None,
            settings,
        })
        .expect("a valid config");
        let store = Arc::new(InjectingStore {
            etcd: etcd.store().await,
            rules: Mutex::new(Vec::new()),
            failing_reads: Mutex::new(Vec::new()),
            losing_keep_alive_replies: Default::default(),
        });
        arm(&store);
        let providers = config.providers.as_ref().expect("a provider");
        let providers = drover_server::provider::Providers::connect(providers).expect("providers");
        let providers = Some(Arc::new(providers));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = Arc::clone(&store) as Arc<dyn Store>;
        let served = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            drover_server::server::serve(&config, shared, providers, shutdown).await
        });
        let replica = Self {
            store,
            endpoint: format!("http://{listen}"),
            admin_endpoint: format!("http://{admin_listen}"),
            stop: Some(stop),
            served,
        };
        replica.client().await;
        replica
    }

    /// A client of this replica; retries until it answers (30 s).
    pub async fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match Client::connect(&self.endpoint).await {
                Ok(client) => return client,
                Err(error) => assert!(
                    Instant::now() < deadline,
                    "in-process replica at {}: {error}",
                    self.endpoint
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The address of its gRPC API.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The address of its admin HTTP port (`/metrics`).
    pub fn admin_endpoint(&self) -> &str {
        &self.admin_endpoint
    }

    /// Starts a shutdown as SIGTERM would, without waiting for it.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops it as SIGTERM would, and checks that it stopped cleanly.
    pub async fn stop(mut self) {
        self.begin_stop();
        (&mut self.served)
            .await
            .expect("the replica task")
            .expect("the replica stops cleanly");
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
