//! One long-lived watch of every operation record, shared by every waiter.
//!
//! A watch created per wait starts "in the past" whenever anything was
//! written between the read and the watch, and etcd serves such watches from
//! a catch-up loop that runs every 100 ms; a single watch started once stays
//! current and delivers each change at once.

use crate::store::{EventKind, KeyValue, SharedStore};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::broadcast;

const CAPACITY: usize = 4096;
const RESTART_DELAY: Duration = Duration::from_millis(200);

/// What a waiter sees.
#[derive(Debug, Clone)]
pub enum FeedEvent {
    /// An operation record was written.
    Put(Arc<KeyValue>),
    /// The feed (re)started and may have missed changes: read again.
    Resync,
}

pub struct OperationFeed {
    events: broadcast::Sender<FeedEvent>,
    started: OnceLock<()>,
}

impl OperationFeed {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            events: broadcast::channel(CAPACITY).0,
            started: OnceLock::new(),
        })
    }

    /// Subscribes to every operation write under `prefix`, starting the feed
    /// on first use.
    pub fn subscribe(&self, store: &SharedStore, prefix: &str) -> broadcast::Receiver<FeedEvent> {
        let receiver = self.events.subscribe();
        self.started.get_or_init(|| {
            tokio::spawn(run(store.clone(), prefix.to_string(), self.events.clone()));
        });
        receiver
    }
}

async fn run(store: SharedStore, prefix: String, events: broadcast::Sender<FeedEvent>) {
    loop {
        let watch = match store.get(&prefix).await {
            Ok(now) => store.watch(&prefix, now.revision + 1).await,
            Err(error) => Err(error),
        };
        let mut watch = match watch {
            Ok(watch) => watch,
            Err(error) => {
                tracing::warn!(%error, "operation feed cannot watch; retrying");
                tokio::time::sleep(RESTART_DELAY).await;
                continue;
            }
        };
        let _ = events.send(FeedEvent::Resync);
        while let Some(Ok(event)) = watch.next().await {
            if event.kind == EventKind::Put {
                // No receiver is fine: nobody is waiting.
                let _ = events.send(FeedEvent::Put(Arc::new(event.kv)));
            }
        }
        tracing::info!("operation feed watch ended; restarting");
    }
}
