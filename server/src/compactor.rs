//! Keeps etcd's history bounded: every interval, compacts to the revision
//! seen one interval earlier, so at least one interval of history stays
//! for watches to resume from (older ones re-list, which every watcher in
//! Drover does).
//!
//! Every replica runs it; compacting to a revision another replica already
//! compacted is refused by etcd as compacted and ignored here.

use crate::store::{SharedStore, StoreError};
use std::time::Duration;
use tokio::sync::watch;

pub async fn run(
    store: SharedStore,
    prefix: String,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut previous: Option<i64> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let now = match store.get(&prefix).await {
            Ok(read) => read.revision,
            Err(error) => {
                tracing::warn!(%error, "compactor cannot read the revision");
                continue;
            }
        };
        if let Some(revision) = previous.filter(|r| *r > 1) {
            match store.compact(revision).await {
                Ok(()) => tracing::info!(revision, "compacted etcd history"),
                Err(StoreError::Compacted { .. }) => {}
                Err(error) => tracing::warn!(%error, revision, "compaction failed"),
            }
        }
        previous = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, Op, Store, Txn};
    use std::sync::Arc;

    #[tokio::test]
    async fn history_older_than_an_interval_is_compacted() {
        let store = Arc::new(MemoryStore::new());
        for i in 0..5 {
            store
                .txn(Txn::new().and_then([Op::put("/t/k", i.to_string())]))
                .await
                .unwrap();
        }
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(run(
            store.clone(),
            "/t/".into(),
            Duration::from_millis(50),
            stopped,
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut old = store.watch("/t/", 2).await.unwrap();
            if matches!(old.next().await, Some(Err(StoreError::Compacted { .. }))) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "history was never compacted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The newest revision stays watchable.
        let head = store.get("/t/").await.unwrap().revision;
        let mut recent = store.watch("/t/", head).await.unwrap();
        assert!(matches!(recent.next().await, Some(Ok(_))));
        let _ = stop.send(true);
    }
}
