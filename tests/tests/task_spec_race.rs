//! A task put that lands while the owner is reconciling the previous one.
//!
//! The replica runs in this process (against a real etcd and the simulated
//! provider process) over a store that, as soon as the owner's reconcile
//! commits, makes the next PutTask through the API and waits for it: the
//! spec then changes between the reconcile and the owner's read after it,
//! deterministically. The owner used to count that read as reconciled, so
//! the new task waited for the cluster's next unrelated change.

use async_trait::async_trait;
use drover_client::v1::{self, TaskType as T};
use drover_client::Client;
use drover_server::config::{Config, ServeArgs, Settings};
use drover_server::store::{
    EtcdStore, GetResult, LeaseId, Op, RangeRequest, Result, Store, Txn, TxnResult, WatchStream,
};
use drover_tests::etcd::EtcdProcess;
use drover_tests::provider::SimProcess;
use drover_tests::{create_running, free_port, wait_until};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Hook = Pin<Box<dyn Future<Output = ()> + Send>>;

/// etcd, plus `after_reconcile` run once right after the first transaction
/// that writes a task-set marker (the owner's reconcile) commits.
struct PutAfterReconcile {
    etcd: EtcdStore,
    after_reconcile: Mutex<Option<Hook>>,
}

#[async_trait]
impl Store for PutAfterReconcile {
    async fn get(&self, key: &str) -> Result<GetResult> {
        self.etcd.get(key).await
    }
    async fn range(&self, request: RangeRequest) -> Result<GetResult> {
        self.etcd.range(request).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let reconcile = txn
            .success
            .iter()
            .any(|op| matches!(op, Op::Put { key, .. } if key.ends_with("/taskset")));
        let result = self.etcd.txn(txn).await?;
        if reconcile && result.succeeded {
            let hook = self.after_reconcile.lock().unwrap().take();
            if let Some(hook) = hook {
                hook.await;
            }
        }
        Ok(result)
    }
    async fn grant_lease(&self, ttl_seconds: i64) -> Result<LeaseId> {
        self.etcd.grant_lease(ttl_seconds).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<i64> {
        self.etcd.keep_alive(lease).await
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

/// A repair at 03:00 every day: reconciling it starts no run, so nothing
/// else touches the cluster's keys afterwards.
fn nightly(name: &str) -> v1::TaskSpec {
    v1::TaskSpec {
        r#type: T::Repair as i32,
        name: name.into(),
        schedule: Some(v1::TaskSchedule {
            cron: "0 3 * * *".into(),
            ..Default::default()
        }),
        properties: Some(v1::task_spec::Properties::Repair(v1::RepairProperties {
            intensity: "0.5".into(),
            ..Default::default()
        })),
    }
}

async fn put_task(client: &mut Client, task: v1::TaskSpec) {
    let request = v1::PutTaskRequest {
        cluster: "db".into(),
        task: Some(task),
    };
    client.tasks().put_task(request).await.expect("put task");
}

async fn task_id(client: &mut Client, name: &str) -> Option<String> {
    let request = v1::GetTaskRequest {
        cluster: "db".into(),
        r#type: T::Repair as i32,
        name: name.into(),
    };
    let task = client.tasks().get_task(request).await.ok()?.into_inner();
    task.status.and_then(|status| status.id)
}

#[tokio::test]
async fn a_task_put_while_the_owner_reconciles_the_previous_one_is_reconciled() {
    let etcd = EtcdProcess::start().await;
    let sim = SimProcess::start().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let settings = Settings {
        listen: Some(listen.clone()),
        admin_listen: Some(format!("127.0.0.1:{}", free_port())),
        etcd_endpoints: Some(vec![etcd.endpoint()]),
        replica_id: Some("r1".into()),
        provider: Some(sim.endpoint()),
        ..Default::default()
    };
    let config = Config::from_serve_args(ServeArgs {
        config: None,
        settings,
    })
    .expect("a valid config");
    let endpoint = format!("http://{listen}");
    let store = Arc::new(PutAfterReconcile {
        etcd: etcd.store().await,
        after_reconcile: Mutex::new(None),
    });
    let provider = drover_server::provider::connect_lazy(&sim.endpoint()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let replica = tokio::spawn({
        let store = Arc::clone(&store) as Arc<dyn Store>;
        async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            drover_server::server::serve(&config, store, Some(provider), shutdown).await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut client = loop {
        match Client::connect(&endpoint).await {
            Ok(client) => break client,
            Err(error) => assert!(Instant::now() < deadline, "the replica: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    create_running(&mut client, "db", 1).await;

    let mut concurrent = client.clone();
    *store.after_reconcile.lock().unwrap() = Some(Box::pin(async move {
        put_task(&mut concurrent, nightly("second")).await;
    }));
    put_task(&mut client, nightly("first")).await;
    wait_until(
        Duration::from_secs(10),
        "the second task to be reconciled",
        || {
            let mut client = client.clone();
            async move { task_id(&mut client, "second").await.is_some() }
        },
    )
    .await;
    assert!(
        store.after_reconcile.lock().unwrap().is_none(),
        "the second put was made during the first reconcile"
    );
    assert!(task_id(&mut client, "first").await.is_some());

    stop.send(()).unwrap();
    replica.await.unwrap().expect("the replica stops cleanly");
}
