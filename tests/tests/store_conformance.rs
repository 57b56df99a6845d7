//! The store conformance suite, against a real etcd process and against the
//! in-memory store: the same cases, the same assertions.

use drover_server::store::{MemoryStore, Store, StoreError};
use drover_tests::conformance;
use drover_tests::etcd::EtcdProcess;

macro_rules! memory_cases {
    ($($case:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    conformance::$case(&MemoryStore::new()).await;
                }
            )*
        }
    };
}

macro_rules! etcd_cases {
    ($($case:ident),* $(,)?) => {
        mod etcd {
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let etcd = EtcdProcess::start().await;
                    conformance::$case(&etcd.store().await).await;
                }
            )*
        }
    };
}

drover_tests::for_each_conformance_case!(memory_cases);
drover_tests::for_each_conformance_case!(etcd_cases);

/// Only etcd can be unreachable: that must read as a retryable error.
#[tokio::test]
async fn etcd_down_is_unavailable_and_retryable() {
    let mut etcd = EtcdProcess::start().await;
    let store = etcd.store().await;
    store.get("/t/up").await.expect("etcd is up");
    etcd.kill();
    let error = store.get("/t/up").await.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
    assert!(error.is_retryable());
}

/// The etcd store sends transactions asked for together in one request
/// (group commit); the conformance case above checks their outcomes, this
/// that they were in fact sent together.
#[tokio::test]
async fn etcd_sends_concurrent_transactions_together() {
    let etcd = EtcdProcess::start().await;
    let store = etcd.store().await;
    conformance::concurrent_txns_each_get_their_own_outcome(&store).await;
    let batched = store.txns_batched();
    assert!(batched > 0, "no transaction shared a request");
    println!("{batched} transactions were sent in shared requests");
}
