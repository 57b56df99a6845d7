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

/// A request etcd refuses for one transaction's sake (a put under a lease
/// it does not hold) is sent again one transaction per request: the others
/// of its batch commit, only that one fails.
#[tokio::test]
async fn etcd_refusing_a_batch_for_one_transaction_fails_only_that_one() {
    use drover_server::store::{Op, Txn};
    let etcd = EtcdProcess::start().await;
    let store = etcd.store().await;
    // Bounded: the put under the unknown lease must land in a batch, which
    // a few attempts make all but certain.
    for attempt in 0..10 {
        // Sent at once, the orphan in the middle: all but the first wait
        // for the first's request, and go together.
        let txns = (0..50).map(|i| {
            let put = match i {
                25 => Op::put_with_lease(format!("/t/orphan/{attempt}"), "x", 0x7e57_1ea5e),
                _ => Op::put(format!("/t/again/{attempt}/{i}"), "v"),
            };
            store.txn(Txn::new().and_then([put]))
        });
        let mut results = futures_util::future::join_all(txns).await;
        let error = results.remove(25).unwrap_err();
        assert!(matches!(error, StoreError::LeaseNotFound(_)), "{error:?}");
        assert!(results
            .iter()
            .all(|r| r.as_ref().is_ok_and(|r| r.succeeded)));
        if store.batches_sent_again() > 0 {
            let written = store.get(&format!("/t/again/{attempt}/49")).await.unwrap();
            assert_eq!(written.kvs.len(), 1);
            return;
        }
    }
    panic!("the put under an unknown lease never shared a request in 10 attempts");
}
