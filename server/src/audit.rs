//! The audit log: one JSON line for every request that changes something
//! (lifecycle, updates, tasks, rollouts, cancels; refused ones too) and
//! for every operation Drover starts by itself (the scanner's
//! remediation, a rollout's per-cluster operations), saying who asked,
//! what, on which cluster or rollout, and what came of it.
//!
//! ```text
//! {"time":"2026-01-02T03:04:05.678Z","caller":{"name":"ci","role":"operator"},
//!  "method":"/drover.v1.Clusters/StopCluster","cluster":"web","request_id":"r-1",
//!  "outcome":"accepted","operation_id":"0193..."}
//! ```
//!
//! # Guarantees
//! - Each line is written whole under a lock, so concurrent requests
//!   never interleave within a line.
//! - A failed write never fails or delays the request beyond the attempt:
//!   it counts in `drover_audit_write_failures_total` and is logged as a
//!   warning.
//! - No secret is written: the caller is the token's name (never the
//!   token or its digest) and the client certificate's subject.
//! - SIGHUP reopens the file at its path (logrotate's `create` mode);
//!   lines written before the reopen stay in the file that was moved.
//!
//! # Assumptions
//! - The file is on a local disk: a line is written synchronously, while
//!   the request waits (a request is not answered before its line is
//!   written, so an answered change is in the log unless the write
//!   failed).
//!
//! # Caveats
//! - A request refused for its token or role has no request id in its
//!   line: the auth layer reads only the message's first field (the
//!   cluster or rollout), and none at all from a compressed message.
//! - Lines are not fsynced: a machine crash may lose the last ones.
//! - A handler writes its line only for a request that went through the
//!   auth layer (which leaves it a [`RequestAudit`]); a service called
//!   in-process must leave one itself to be audited.

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Who made a request, as the audit log names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Caller {
    /// The bearer token's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The token's role; `anonymous` when Drover runs without tokens,
    /// `unauthenticated` for a missing or unknown token, `system` for
    /// Drover itself.
    pub role: String,
    /// The subject of the client certificate (mutual TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The replica that started an operation by itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

impl Caller {
    /// Drover itself, on replica `replica`.
    pub fn system(replica: &str) -> Self {
        Self {
            name: Some("drover".into()),
            role: "system".into(),
            subject: None,
            replica: Some(replica.into()),
        }
    }
}

/// What came of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Done, or accepted as the operation `operation_id` (also the
    /// operation a cancel acted on).
    Accepted {
        #[serde(skip_serializing_if = "Option::is_none")]
        operation_id: Option<String>,
    },
    /// Answered with gRPC status `code` (`PERMISSION_DENIED`, ...).
    Refused { code: &'static str, message: String },
    /// An operation Drover asked for by itself was not accepted.
    NotStarted { message: String },
}

impl Outcome {
    pub fn refused(status: &tonic::Status) -> Self {
        Outcome::Refused {
            code: code_name(status.code()),
            message: status.message().to_string(),
        }
    }
}

/// One line of the audit log.
#[derive(Debug, Serialize)]
pub struct Entry<'a> {
    pub caller: &'a Caller,
    /// The RPC's path (`/drover.v1.Clusters/StopCluster`); for what Drover
    /// starts by itself, the RPC a person would have called.
    pub method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub request_id: &'a str,
    #[serde(flatten)]
    pub outcome: Outcome,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot open the audit log {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot watch for SIGHUP (to reopen the audit log): {0}")]
    Signal(std::io::Error),
}

/// Where lines go.
enum Sink {
    Stdout,
    File { path: PathBuf, file: File },
}

/// The audit log of a replica, shared by the auth layer, the services and
/// what starts operations by itself.
pub struct AuditLog {
    /// `None`: `--audit-log` not given.
    sink: Option<Mutex<Sink>>,
    /// `drover_audit_write_failures_total`.
    failures: Counter,
    /// Drover itself, on this replica.
    system: Caller,
}

/// The value of `--audit-log` that means standard output.
pub const STDOUT: &str = "-";

impl AuditLog {
    /// Writes to `target` (a path, or [`STDOUT`]); nowhere when `None`.
    /// Failed writes count in `failures`.
    pub fn open(
        target: Option<&Path>,
        failures: Counter,
        replica: &str,
    ) -> Result<Arc<Self>, AuditError> {
        let sink = match target {
            None => None,
            Some(path) if path == Path::new(STDOUT) => Some(Sink::Stdout),
            Some(path) => Some(Sink::File {
                file: append(path)?,
                path: path.to_path_buf(),
            }),
        };
        Ok(Arc::new(Self {
            sink: sink.map(Mutex::new),
            failures,
            system: Caller::system(replica),
        }))
    }

    /// Writes the line of an operation Drover asked for by itself on
    /// `cluster` (for `rollout`): `method` is the RPC a person would have
    /// called, `accepted` the operation's id or why it was not accepted.
    pub fn started_by_drover(
        &self,
        method: &str,
        cluster: &str,
        rollout: Option<&str>,
        request_id: &str,
        accepted: Result<&str, String>,
    ) {
        let outcome = match accepted {
            Ok(id) => Outcome::Accepted {
                operation_id: Some(id.to_string()),
            },
            Err(message) => Outcome::NotStarted { message },
        };
        self.write(&Entry {
            caller: &self.system,
            method,
            cluster: Some(cluster),
            rollout,
            request_id,
            outcome,
        });
    }

    /// Writes `entry` as one line; a failure is counted and logged.
    pub fn write(&self, entry: &Entry<'_>) {
        let Some(sink) = &self.sink else {
            return;
        };
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let mut line = serde_json::to_vec(&Timed { time, entry })
            .expect("an entry of strings always serializes");
        line.push(b'\n');
        let written = match &mut *crate::sync::lock(sink) {
            Sink::Stdout => std::io::stdout().lock().write_all(&line),
            Sink::File { file, .. } => file.write_all(&line),
        };
        if let Err(error) = written {
            self.failures.inc();
            tracing::warn!(%error, method = entry.method, "cannot write the audit log; the request goes on");
        }
    }

    /// Opens the file at its path again (after logrotate moved it); on a
    /// failure lines keep going to the file open until now.
    pub fn reopen(&self) -> Result<(), AuditError> {
        let Some(sink) = &self.sink else {
            return Ok(());
        };
        if let Sink::File { path, file } = &mut *crate::sync::lock(sink) {
            *file = append(path)?;
            tracing::info!(path = %path.display(), "audit log reopened");
        }
        Ok(())
    }

    /// When lines go to a file: reopens it on every SIGHUP until
    /// `stopped`. The signal is caught from this call on (its default
    /// would end the process), and only then.
    pub fn reopen_on_sighup(
        self: &Arc<Self>,
        mut stopped: watch::Receiver<bool>,
    ) -> Result<Option<impl std::future::Future<Output = ()>>, AuditError> {
        use tokio::signal::unix::{signal, SignalKind};
        let to_file = self
            .sink
            .as_ref()
            .is_some_and(|sink| matches!(*crate::sync::lock(sink), Sink::File { .. }));
        if !to_file {
            return Ok(None);
        }
        let mut hangups = signal(SignalKind::hangup()).map_err(AuditError::Signal)?;
        let this = Arc::clone(self);
        Ok(Some(async move {
            loop {
                tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return,
                    received = hangups.recv() => if received.is_none() { return },
                }
                if let Err(error) = this.reopen() {
                    tracing::warn!(%error, "cannot reopen the audit log; writing on to the old file");
                }
            }
        }))
    }
}

/// What the auth layer leaves in the extensions of a request that changes
/// something, for its handler to write the request's line with.
#[derive(Clone)]
pub struct RequestAudit {
    pub log: Arc<AuditLog>,
    pub caller: Caller,
    /// The RPC's path.
    pub method: String,
}

/// An entry with its time first, as readers expect.
#[derive(Serialize)]
struct Timed<'a> {
    time: String,
    #[serde(flatten)]
    entry: &'a Entry<'a>,
}

fn append(path: &Path) -> Result<File, AuditError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// The canonical name of a gRPC status code, as in the gRPC spec.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(caller: &'a Caller, cluster: &'a str) -> Entry<'a> {
        Entry {
            caller,
            method: "/drover.v1.Clusters/StopCluster",
            cluster: Some(cluster),
            rollout: None,
            request_id: "",
            outcome: Outcome::refused(&tonic::Status::permission_denied("no")),
        }
    }

    fn read_lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_line_is_one_json_object_with_the_outcome_flattened() {
        let dir = std::env::temp_dir().join(format!("drover-audit-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let log = AuditLog::open(Some(&path), Counter::default(), "r1").unwrap();
        let caller = Caller {
            name: Some("ci".into()),
            role: "operator".into(),
            subject: None,
            replica: None,
        };
        log.write(&entry(&caller, "web"));
        let recover = "/drover.v1.Clusters/RecoverCluster";
        log.started_by_drover(recover, "db", Some("fleet"), "rollout-1-db", Ok("op-1"));
        let lines = read_lines(&path);
        assert_eq!(lines.len(), 2);
        let line = &lines[0];
        assert_eq!(
            line["caller"],
            serde_json::json!({"name": "ci", "role": "operator"})
        );
        assert_eq!(line["outcome"], "refused");
        assert_eq!(line["code"], "PERMISSION_DENIED");
        assert_eq!(line["cluster"], "web");
        assert!(line.get("request_id").is_none() && line.get("rollout").is_none());
        assert!(line["time"].as_str().unwrap().ends_with('Z'));
        let system = serde_json::json!({"name": "drover", "role": "system", "replica": "r1"});
        assert_eq!(lines[1]["caller"], system);
        assert_eq!(lines[1]["method"], recover);
        assert_eq!(lines[1]["rollout"], "fleet");
        assert_eq!(lines[1]["request_id"], "rollout-1-db");
        assert_eq!(lines[1]["outcome"], "accepted");
        assert_eq!(lines[1]["operation_id"], "op-1");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_reopen_after_a_move_writes_to_a_new_file_and_failures_are_counted() {
        let dir = std::env::temp_dir().join(format!("drover-audit-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let failures = Counter::default();
        let log = AuditLog::open(Some(&path), failures.clone(), "r1").unwrap();
        let caller = Caller::system("r1");
        log.write(&entry(&caller, "before"));
        let rotated = dir.join("audit.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen().unwrap();
        log.write(&entry(&caller, "after"));
        assert_eq!(read_lines(&rotated)[0]["cluster"], "before");
        assert_eq!(read_lines(&rotated).len(), 1);
        assert_eq!(read_lines(&path)[0]["cluster"], "after");
        assert_eq!(failures.get(), 0);
        std::fs::remove_dir_all(&dir).unwrap();

        // A file that cannot be written: counted, and the caller goes on.
        let full = AuditLog {
            sink: Some(Mutex::new(Sink::File {
                path: "/dev/full".into(),
                file: append(Path::new("/dev/full")).unwrap(),
            })),
            failures: failures.clone(),
            system: caller.clone(),
        };
        full.write(&entry(&caller, "lost"));
        assert_eq!(failures.get(), 1);
    }
}
