//! The store conformance suite: the etcd semantics Drover relies on, checked
//! the same way against every [`Store`] implementation.
//!
//! Each case takes a fresh, empty store. Revisions are compared relative to
//! each other, never to absolute numbers.

use crate::wait_until;
use drover_server::store::{
    CmpOp, Compare, EventKind, Op, OpResult, RangeRequest, Store, StoreError, Txn, WatchEvent,
    WatchStream,
};
use std::time::Duration;

const WATCH_DEADLINE: Duration = Duration::from_secs(10);

async fn put(store: &dyn Store, key: &str, value: &str) -> i64 {
    store
        .txn(Txn::new().and_then([Op::put(key, value)]))
        .await
        .expect("put")
        .revision
}

async fn next_event(watch: &mut WatchStream) -> WatchEvent {
    tokio::time::timeout(WATCH_DEADLINE, watch.next())
        .await
        .expect("a watch event within the deadline")
        .expect("the watch is still open")
        .expect("a watch event, not an error")
}

fn keys(result: &drover_server::store::GetResult) -> Vec<&str> {
    result.kvs.iter().map(|kv| kv.key.as_str()).collect()
}

/// A put creates a key with create == mod revision and version 1; a second
/// put keeps the create revision, bumps mod revision and version.
pub async fn put_and_get_report_revisions(store: &dyn Store) {
    let first = put(store, "/t/a", "1").await;
    let kv = store.get("/t/a").await.unwrap().into_single().unwrap();
    assert_eq!(kv.value, b"1");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (first, first, 1)
    );
    let second = put(store, "/t/a", "2").await;
    assert_eq!(second, first + 1, "every write bumps the revision by one");
    let read = store.get("/t/a").await.unwrap();
    assert_eq!(read.revision, second);
    let kv = read.into_single().unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (first, second, 2)
    );
    assert!(store.get("/t/missing").await.unwrap().kvs.is_empty());
}

/// A prefix range returns only that prefix, in key order, honouring start
/// and limit; `foo/` never matches `foobar/`.
pub async fn range_by_prefix_start_and_limit(store: &dyn Store) {
    for key in [
        "/t/c/foo/2",
        "/t/c/foo/1",
        "/t/c/foobar/1",
        "/t/c/foo/3",
        "/t/d",
    ] {
        put(store, key, "x").await;
    }
    let all = store
        .range(RangeRequest::prefix("/t/c/foo/"))
        .await
        .unwrap();
    assert_eq!(keys(&all), ["/t/c/foo/1", "/t/c/foo/2", "/t/c/foo/3"]);
    assert!(!all.more);
    let limited = store
        .range(RangeRequest::prefix("/t/c/").limit(2))
        .await
        .unwrap();
    assert_eq!(keys(&limited), ["/t/c/foo/1", "/t/c/foo/2"]);
    assert!(limited.more);
    assert_eq!(limited.count, 4, "the count ignores the limit");
    assert_eq!(all.count, 3);
    let started = store
        .range(RangeRequest::prefix("/t/c/").starting_at("/t/c/foo/3"))
        .await
        .unwrap();
    assert_eq!(keys(&started), ["/t/c/foo/3", "/t/c/foobar/1"]);
    assert_eq!(started.count, 2, "the count starts where the range does");
}

/// A range's count covers exactly the prefix (`foo/` never `foobar/`),
/// whatever the limit, and follows deletes.
pub async fn count_by_prefix(store: &dyn Store) {
    for key in ["/t/c/foo/1", "/t/c/foo/2", "/t/c/foobar/1", "/t/d"] {
        put(store, key, "x").await;
    }
    let count = |prefix: &'static str| async move {
        let one = RangeRequest::prefix(prefix).limit(1);
        store.range(one).await.unwrap().count
    };
    assert_eq!(count("/t/c/foo/").await, 2);
    assert_eq!(count("/t/c/").await, 3);
    assert_eq!(count("/t/none/").await, 0);
    store
        .txn(Txn::new().and_then([Op::delete("/t/c/foo/1")]))
        .await
        .unwrap();
    assert_eq!(count("/t/c/foo/").await, 1);
}

/// A prefix larger than any single response (the etcd store pages it)
/// still comes back whole, in order, and limits still cut it exactly.
pub async fn range_larger_than_a_page(store: &dyn Store) {
    for batch in 0..20 {
        let puts = (0..125).map(|i| Op::put(format!("/t/big/{:05}", batch * 125 + i), "x"));
        store.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    let all = store.range(RangeRequest::prefix("/t/big/")).await.unwrap();
    assert_eq!(all.kvs.len(), 2500);
    assert!(all.kvs.windows(2).all(|w| w[0].key < w[1].key), "key order");
    assert!(!all.more);
    let limited = store
        .range(RangeRequest::prefix("/t/big/").limit(1500))
        .await
        .unwrap();
    assert_eq!(limited.kvs.len(), 1500);
    assert!(limited.more);
    assert_eq!(limited.kvs.last().unwrap().key, "/t/big/01499");
    assert_eq!((all.count, limited.count), (2500, 2500));
}

/// Compares on mod revision, create revision and version pick the branch;
/// a failed compare runs the failure ops and writes nothing else.
pub async fn txn_compares_on_revisions_and_version(store: &dyn Store) {
    let created = put(store, "/t/k", "v1").await;
    let ok = store
        .txn(
            Txn::new()
                .when([
                    Compare::mod_revision("/t/k", CmpOp::Equal, created),
                    Compare::create_revision("/t/k", CmpOp::Equal, created),
                    Compare::version("/t/k", CmpOp::Equal, 1),
                    Compare::absent("/t/other"),
                ])
                .and_then([Op::put("/t/k", "v2"), Op::put("/t/other", "o")]),
        )
        .await
        .unwrap();
    assert!(ok.succeeded);
    let stale = store
        .txn(
            Txn::new()
                .when([Compare::mod_revision("/t/k", CmpOp::Equal, created)])
                .and_then([Op::put("/t/k", "lost")])
                .or_else([Op::get("/t/k")]),
        )
        .await
        .unwrap();
    assert!(!stale.succeeded);
    assert_eq!(
        stale.revision, ok.revision,
        "a read-only branch writes nothing"
    );
    match &stale.results[..] {
        [OpResult::Get(Some(kv))] => assert_eq!(kv.value, b"v2"),
        other => panic!("expected the failure branch's get, got {other:?}"),
    }
    let greater = store
        .txn(Txn::new().when([Compare::version("/t/k", CmpOp::Greater, 1)]))
        .await
        .unwrap();
    assert!(greater.succeeded);
    let less = store
        .txn(Txn::new().when([Compare::mod_revision("/t/k", CmpOp::Less, created)]))
        .await
        .unwrap();
    assert!(!less.succeeded);
}

/// Value compares; on a missing key a value compare fails whatever the
/// operator, while revision compares read 0.
pub async fn txn_compares_on_value_and_missing_keys(store: &dyn Store) {
    put(store, "/t/v", "same").await;
    let equal = store
        .txn(Txn::new().when([Compare::value("/t/v", CmpOp::Equal, "same")]))
        .await
        .unwrap();
    assert!(equal.succeeded);
    let differs = store
        .txn(Txn::new().when([Compare::value("/t/v", CmpOp::Equal, "other")]))
        .await
        .unwrap();
    assert!(!differs.succeeded);
    let missing_value = store
        .txn(Txn::new().when([Compare::value("/t/none", CmpOp::NotEqual, "x")]))
        .await
        .unwrap();
    assert!(
        !missing_value.succeeded,
        "value compare on a missing key fails"
    );
    let missing_version = store
        .txn(Txn::new().when([
            Compare::version("/t/none", CmpOp::Equal, 0),
            Compare::mod_revision("/t/none", CmpOp::Equal, 0),
            Compare::lease("/t/none", CmpOp::Equal, 0),
        ]))
        .await
        .unwrap();
    assert!(missing_version.succeeded);
}

/// All writes of one transaction share one revision; deletes report counts
/// and reset the key's version and create revision.
pub async fn txn_writes_share_one_revision_and_deletes_reset(store: &dyn Store) {
    let result = store
        .txn(Txn::new().and_then([Op::put("/t/x/1", "a"), Op::put("/t/x/2", "b")]))
        .await
        .unwrap();
    let one = store.get("/t/x/1").await.unwrap().into_single().unwrap();
    let two = store.get("/t/x/2").await.unwrap().into_single().unwrap();
    assert_eq!(one.mod_revision, result.revision);
    assert_eq!(two.mod_revision, result.revision);
    let deleted = store
        .txn(Txn::new().and_then([Op::delete("/t/x/1"), Op::delete("/t/x/nothing")]))
        .await
        .unwrap();
    assert_eq!(
        deleted.results,
        [
            OpResult::Delete { deleted: 1 },
            OpResult::Delete { deleted: 0 }
        ]
    );
    let recreated = put(store, "/t/x/1", "again").await;
    let kv = store.get("/t/x/1").await.unwrap().into_single().unwrap();
    assert_eq!((kv.create_revision, kv.version), (recreated, 1));
    let by_prefix = store
        .txn(Txn::new().and_then([Op::delete_prefix("/t/x/")]))
        .await
        .unwrap();
    assert_eq!(by_prefix.results, [OpResult::Delete { deleted: 2 }]);
    assert!(store
        .range(RangeRequest::prefix("/t/x/"))
        .await
        .unwrap()
        .kvs
        .is_empty());
}

/// A transaction writing one key twice is refused and writes nothing.
pub async fn txn_with_duplicate_key_is_refused(store: &dyn Store) {
    let error = store
        .txn(Txn::new().and_then([Op::put("/t/dup", "1"), Op::put("/t/dup", "2")]))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Other(_)), "{error:?}");
    assert!(store.get("/t/dup").await.unwrap().kvs.is_empty());
}

/// Transactions sent at once (the etcd store sends such transactions
/// together, see `store::etcd::batch`) each get their own outcome:
/// compare-and-swap increments of shared counters lose none; a compare
/// that fails runs its own failure branch; a put under an unknown lease
/// fails alone.
pub async fn concurrent_txns_each_get_their_own_outcome(store: &dyn Store) {
    const COUNTERS: usize = 8;
    const INCREMENTS: usize = 25;
    for counter in 0..COUNTERS {
        put(store, &format!("/t/n/{counter}"), "0").await;
    }
    let increment = |counter: usize| async move {
        let key = format!("/t/n/{counter}");
        loop {
            let read = store.get(&key).await.unwrap().into_single().unwrap();
            let n: u64 = String::from_utf8(read.value).unwrap().parse().unwrap();
            let txn = Txn::new()
                .when([Compare::mod_revision(&key, CmpOp::Equal, read.mod_revision)])
                .and_then([Op::put(&key, (n + 1).to_string())])
                .or_else([Op::get(&key)]);
            let result = store.txn(txn).await.unwrap();
            if result.succeeded {
                return;
            }
            match &result.results[..] {
                [OpResult::Get(Some(now))] => assert!(now.mod_revision > read.mod_revision),
                other => panic!("the failure branch's read, not {other:?}"),
            }
        }
    };
    let orphan = async {
        // A read first, so that the put comes amid the others.
        store.get("/t/n/0").await.unwrap();
        let unknown_lease = 0x7e57_1ea5e;
        let put = Op::put_with_lease("/t/n-orphan", "x", unknown_lease);
        let error = store.txn(Txn::new().and_then([put])).await.unwrap_err();
        assert!(matches!(error, StoreError::LeaseNotFound(_)), "{error:?}");
    };
    let increments =
        futures_util::future::join_all((0..COUNTERS * INCREMENTS).map(|i| increment(i % COUNTERS)));
    tokio::join!(increments, orphan);
    for counter in 0..COUNTERS {
        let kv = store.get(&format!("/t/n/{counter}")).await.unwrap();
        assert_eq!(
            kv.into_single().unwrap().value,
            INCREMENTS.to_string().into_bytes()
        );
    }
    assert!(store.get("/t/n-orphan").await.unwrap().kvs.is_empty());
}

/// `cas` turns failed compares into a Conflict error.
pub async fn cas_reports_conflict(store: &dyn Store) {
    put(store, "/t/cas", "1").await;
    let error = store
        .cas(
            Txn::new()
                .when([Compare::absent("/t/cas")])
                .and_then([Op::put("/t/cas", "2")]),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Conflict { .. }), "{error:?}");
    assert!(!error.is_retryable());
}

/// Leases: keys bound to one; lease compares; keep-alive; revoke deletes the
/// keys; an unknown lease is refused.
pub async fn leases_bind_keys_and_revoke_deletes_them(store: &dyn Store) {
    let lease = store.grant_lease(30).await.unwrap();
    store
        .txn(Txn::new().and_then([Op::put_with_lease("/t/owned", "me", lease)]))
        .await
        .unwrap();
    let kv = store.get("/t/owned").await.unwrap().into_single().unwrap();
    assert_eq!(kv.lease, lease);
    let bound = store
        .txn(Txn::new().when([Compare::lease("/t/owned", CmpOp::Equal, lease)]))
        .await
        .unwrap();
    assert!(bound.succeeded);
    assert!(store.keep_alive(lease).await.unwrap() > 0);
    let left = store.lease_time_to_live(lease).await.unwrap().unwrap();
    assert!(left > 0 && left <= 30, "{left}");
    store.revoke_lease(lease).await.unwrap();
    assert!(store.get("/t/owned").await.unwrap().kvs.is_empty());
    assert_eq!(store.lease_time_to_live(lease).await.unwrap(), None);
    assert!(matches!(
        store.keep_alive(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
    let error = store
        .txn(Txn::new().and_then([Op::put_with_lease("/t/orphan", "x", lease)]))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::LeaseNotFound(_)), "{error:?}");
    assert!(store.get("/t/orphan").await.unwrap().kvs.is_empty());
}

/// An unrenewed lease expires and its keys vanish, with a delete event.
pub async fn lease_expiry_deletes_bound_keys(store: &dyn Store) {
    let lease = store.grant_lease(2).await.unwrap();
    let written = store
        .txn(Txn::new().and_then([Op::put_with_lease("/t/ephemeral", "x", lease)]))
        .await
        .unwrap();
    let mut watch = store
        .watch("/t/ephemeral", written.revision + 1)
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "the lease to expire", || async {
        store.get("/t/ephemeral").await.unwrap().kvs.is_empty()
    })
    .await;
    let event = next_event(&mut watch).await;
    assert_eq!(event.kind, EventKind::Delete);
    assert!(matches!(
        store.keep_alive(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
}

/// A watch from a past revision replays history in order, then goes live;
/// deletes carry their revision; other prefixes are not seen.
pub async fn watch_replays_from_revision_then_follows(store: &dyn Store) {
    let first = put(store, "/t/w/a", "1").await;
    put(store, "/t/wx/ignored", "1").await;
    let second = put(store, "/t/w/b", "2").await;
    let mut watch = store.watch("/t/w/", first).await.unwrap();
    let a = next_event(&mut watch).await;
    assert_eq!(
        (a.kind, a.kv.key.as_str(), a.kv.mod_revision),
        (EventKind::Put, "/t/w/a", first)
    );
    let b = next_event(&mut watch).await;
    assert_eq!((b.kv.key.as_str(), b.kv.mod_revision), ("/t/w/b", second));
    let deleted = store
        .txn(Txn::new().and_then([Op::delete("/t/w/a")]))
        .await
        .unwrap();
    let d = next_event(&mut watch).await;
    assert_eq!(
        (d.kind, d.kv.key.as_str(), d.kv.mod_revision),
        (EventKind::Delete, "/t/w/a", deleted.revision)
    );
    let live = put(store, "/t/w/c", "3").await;
    let c = next_event(&mut watch).await;
    assert_eq!(
        (c.kv.key.as_str(), c.kv.value.as_slice(), c.kv.mod_revision),
        ("/t/w/c", b"3".as_slice(), live)
    );
}

/// A watch from revision 0 sees only later changes.
pub async fn watch_from_now_skips_history(store: &dyn Store) {
    put(store, "/t/n/old", "1").await;
    let mut watch = store.watch("/t/n/", 0).await.unwrap();
    put(store, "/t/n/new", "2").await;
    assert_eq!(next_event(&mut watch).await.kv.key, "/t/n/new");
}

/// The watch's first item is [`StoreError::Compacted`].
async fn assert_reports_compaction(mut stale: WatchStream) {
    let error = tokio::time::timeout(WATCH_DEADLINE, stale.next())
        .await
        .expect("the compaction is reported")
        .expect("an item before the stream ends");
    assert!(
        matches!(error, Err(StoreError::Compacted { .. })),
        "{error:?}"
    );
}

/// A puts-only watch skips deletes, and still reports a compacted start.
pub async fn watch_puts_skips_deletes(store: &dyn Store) {
    let first = put(store, "/t/p/a", "1").await;
    store
        .txn(Txn::new().and_then([Op::delete("/t/p/a")]))
        .await
        .unwrap();
    let after = put(store, "/t/p/b", "2").await;
    let mut watch = store.watch_puts("/t/p/", first).await.unwrap();
    let a = next_event(&mut watch).await;
    assert_eq!((a.kind, a.kv.mod_revision), (EventKind::Put, first));
    let b = next_event(&mut watch).await;
    assert_eq!(
        (b.kind, b.kv.key.as_str(), b.kv.mod_revision),
        (EventKind::Put, "/t/p/b", after)
    );
    store.compact(after).await.unwrap();
    let stale = store.watch_puts("/t/p/", first).await.unwrap();
    assert_reports_compaction(stale).await;
}

/// After compaction, a watch from an older revision reports Compacted; one
/// from the compaction point works.
pub async fn watch_reports_compaction(store: &dyn Store) {
    let old = put(store, "/t/cmp/a", "1").await;
    put(store, "/t/cmp/a", "2").await;
    let head = put(store, "/t/cmp/a", "3").await;
    store.compact(head).await.unwrap();
    let stale = store.watch("/t/cmp/", old).await.unwrap();
    assert_reports_compaction(stale).await;
    let mut fresh = store.watch("/t/cmp/", head).await.unwrap();
    assert_eq!(next_event(&mut fresh).await.kv.mod_revision, head);
}

/// Every conformance case, by name, so both stores run the same list.
#[macro_export]
macro_rules! for_each_conformance_case {
    ($m:ident) => {
        $m! {
            put_and_get_report_revisions,
            range_by_prefix_start_and_limit,
            range_larger_than_a_page,
            count_by_prefix,
            txn_compares_on_revisions_and_version,
            txn_compares_on_value_and_missing_keys,
            txn_writes_share_one_revision_and_deletes_reset,
            txn_with_duplicate_key_is_refused,
            cas_reports_conflict,
            concurrent_txns_each_get_their_own_outcome,
            leases_bind_keys_and_revoke_deletes_them,
            lease_expiry_deletes_bound_keys,
            watch_replays_from_revision_then_follows,
            watch_from_now_skips_history,
            watch_puts_skips_deletes,
            watch_reports_compaction,
        }
    };
}
