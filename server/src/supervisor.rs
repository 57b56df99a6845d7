//! The replica's long-lived tasks, owned: each is spawned here under a
//! name and kept in one [`JoinSet`], so the replica can tell when one
//! panics and can join them all when it stops.
//!
//! # Guarantees
//! - A task that panics ends the replica: [`Supervisor::panicked`]
//!   completes with the task's name and the panic's message, `serve`
//!   returns it as an error and the process exits non-zero (70), so a
//!   supervisor (systemd, Kubernetes) starts it again. A replica never
//!   goes on serving with a dead loop: its peers take its clusters as
//!   after a crash (its liveness connections close with the process).
//! - [`Supervisor::join`] returns once every task has ended, or aborts
//!   those still running after its limit and names them.
//!
//! # Caveats
//! - Work a task spawns on its own (an operation's drive, a task run's
//!   wait) is not held here; a panic there ends that piece of work only.
//! - `DROVER_TEST_PANIC=<task>@<path>` makes the named task panic once
//!   `<path>` exists: the end-to-end test of the above. Unset, it costs
//!   one environment read at start-up.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tokio::task::{Id, JoinError, JoinSet};

/// The environment variable of the test hook.
const TEST_PANIC: &str = "DROVER_TEST_PANIC";
/// How often a task under the test hook looks for its file.
const TEST_POLL: Duration = Duration::from_millis(20);

/// A task that panicked: which, and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panicked {
    pub task: &'static str,
    pub message: String,
}

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {} panicked: {}", self.task, self.message)
    }
}

/// The replica's long-lived tasks.
#[derive(Default)]
pub struct Supervisor {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    /// The test hook's task and file, read once.
    test_panic: Option<(String, PathBuf)>,
}

impl Supervisor {
    pub fn new() -> Self {
        let test_panic = std::env::var(TEST_PANIC).ok().and_then(|value| {
            let (task, path) = value.split_once('@')?;
            Some((task.to_string(), PathBuf::from(path)))
        });
        Self {
            test_panic,
            ..Self::default()
        }
    }

    /// Runs `task` until it ends, under `name`.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = match &self.test_panic {
            Some((hooked, path)) if hooked == name => {
                let path = path.clone();
                self.set.spawn(async move {
                    tokio::select! {
                        _ = task => {}
                        _ = file_appears(&path) => panic!("{TEST_PANIC}: {path:?} exists"),
                    }
                })
            }
            _ => self.set.spawn(task),
        };
        self.names.insert(handle.id(), name);
    }

    /// Completes when a task panics; tasks that end otherwise are
    /// forgotten. Pending for ever when none panics (cancel-safe, for a
    /// `select!`).
    pub async fn panicked(&mut self) -> Panicked {
        loop {
            match self.set.join_next_with_id().await {
                None => std::future::pending::<()>().await,
                Some(Ok((id, ()))) => {
                    self.names.remove(&id);
                }
                Some(Err(error)) => {
                    let task = self.names.remove(&error.id()).unwrap_or("?");
                    if error.is_panic() {
                        let message = panic_message(error);
                        return Panicked { task, message };
                    }
                }
            }
        }
    }

    /// Waits up to `limit` for every task to end, then aborts the others;
    /// the names of those it aborted.
    pub async fn join(mut self, limit: Duration) -> Vec<&'static str> {
        let ended = tokio::time::timeout(limit, async {
            while let Some(joined) = self.set.join_next_with_id().await {
                let id = joined.map_or_else(|e| e.id(), |(id, ())| id);
                self.names.remove(&id);
            }
        })
        .await;
        if ended.is_ok() {
            return Vec::new();
        }
        self.set.abort_all();
        let mut left: Vec<&'static str> = self.names.into_values().collect();
        left.sort_unstable();
        left
    }
}

fn panic_message(error: JoinError) -> String {
    let payload = error.into_panic();
    match payload.downcast_ref::<&str>() {
        Some(text) => text.to_string(),
        None => match payload.downcast_ref::<String>() {
            Some(text) => text.clone(),
            None => "(no message)".to_string(),
        },
    }
}

async fn file_appears(path: &std::path::Path) {
    while !path.exists() {
        tokio::time::sleep(TEST_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_named_and_the_others_are_joined() {
        let mut tasks = Supervisor::default();
        tasks.spawn("ends", async {});
        tasks.spawn("panics", async { panic!("on purpose") });
        let panicked = tasks.panicked().await;
        assert_eq!(panicked.task, "panics");
        assert_eq!(panicked.message, "on purpose");
        tasks.spawn("runs on", std::future::pending());
        let aborted = tasks.join(Duration::from_millis(50)).await;
        assert_eq!(aborted, vec!["runs on"]);
    }
}
