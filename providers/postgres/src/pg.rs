//! Drives PostgreSQL's own programs (initdb, pg_ctl, pg_basebackup, psql,
//! pg_controldata) for one node at a time, as the configured user when the
//! provider runs as root (PostgreSQL refuses to run as root).
//!
//! # Guarantees
//! - Every program runs with a bounded wait (pg_ctl's `-t`, psql's connect
//!   timeout) and is killed if the future running it is dropped, so a
//!   stopped task leaves no child behind.
//!
//! # Assumptions
//! - Nodes listen on 127.0.0.1 only, without Unix sockets, and trust local
//!   TCP connections (initdb's `-A trust`): the loopback is the boundary.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::process::Command;

/// How long pg_ctl waits for a start, stop or promote.
const PG_CTL_WAIT_SECS: &str = "60";

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("{what} failed: {detail}")]
    Failed { what: String, detail: String },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("user {0:?} to run PostgreSQL as is unknown")]
    UnknownUser(String),
}

fn io_err(what: &str) -> impl FnOnce(io::Error) -> PgError + '_ {
    move |source| PgError::Io {
        what: what.to_string(),
        source,
    }
}

/// Lines of a node's server log a failed start quotes.
const LOG_TAIL_LINES: usize = 5;

/// A failed `pg_ctl start` says only "examine the log output": why the
/// server did not start is in the node's log, whose last lines go into the
/// error (and from there into the operation's error and the status).
fn with_log_tail(error: PgError, log: &Path) -> PgError {
    let PgError::Failed { what, detail } = error else {
        return error;
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut tail: Vec<&str> = text.lines().rev().take(LOG_TAIL_LINES).collect();
    if tail.is_empty() {
        return PgError::Failed { what, detail };
    }
    tail.reverse();
    let detail = format!("{detail}; {} ends: {}", log.display(), tail.join(" | "));
    PgError::Failed { what, detail }
}

/// Settings a node's `drover.conf` holds (included from postgresql.conf,
/// rewritten before every start).
pub struct NodeConf<'a> {
    pub port: u16,
    pub shared_buffers: &'a str,
    pub max_connections: u32,
    /// For a standby: the primary's port and the slot it streams from.
    pub follow: Option<(u16, &'a str)>,
    pub application_name: &'a str,
    pub fsync: bool,
}

/// Runs PostgreSQL programs, as `user` (uid, gid) when set.
#[derive(Clone, Debug)]
pub struct Pg {
    user: Option<(u32, u32)>,
}

impl Pg {
    /// Runs programs as `run_as` when this process runs as root, else as
    /// itself.
    pub fn new(run_as: &str) -> Result<Self, PgError> {
        let me = std::fs::metadata("/proc/self").map_err(io_err("/proc/self"))?;
        if me.uid() != 0 {
            return Ok(Self { user: None });
        }
        let passwd = std::fs::read_to_string("/etc/passwd").map_err(io_err("/etc/passwd"))?;
        let user = passwd.lines().find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.len() > 3 && f[0] == run_as)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
        });
        let user = user.ok_or_else(|| PgError::UnknownUser(run_as.to_string()))?;
        Ok(Self { user: Some(user) })
    }

    /// Makes `path` the run-as user's, so PostgreSQL can use it.
    pub fn own(&self, path: &Path) -> Result<(), PgError> {
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(io_err(&path.display().to_string()))?;
        }
        Ok(())
    }

    /// Creates `dir` (and its parents) owned by the run-as user.
    pub fn make_dir(&self, dir: &Path) -> Result<(), PgError> {
        std::fs::create_dir_all(dir).map_err(io_err(&dir.display().to_string()))?;
        self.own(dir)
    }

    fn command(&self, bin: &Path, program: &str) -> Command {
        let mut cmd = Command::new(bin.join(program));
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        // The run-as user may not be able to enter the provider's cwd.
        cmd.current_dir("/")
            .env("PGCONNECT_TIMEOUT", "5")
            .env_remove("PGDATA")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    async fn run(&self, mut cmd: Command, what: &str) -> Result<String, PgError> {
        let out = cmd.output().await.map_err(io_err(what))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        Err(PgError::Failed {
            what: what.to_string(),
            detail: format!(
                "{}: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ),
        })
    }

    pub async fn initdb(&self, bin: &Path, dir: &Path) -> Result<(), PgError> {
        let mut cmd = self.command(bin, "initdb");
        cmd.arg("-D")
            .arg(dir)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]);
        self.run(cmd, "initdb").await?;
        let conf = dir.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).map_err(io_err("postgresql.conf"))?;
        text.push_str("\n# Drover's settings for this node (port, offering, primary).\ninclude 'drover.conf'\n");
        std::fs::write(&conf, text).map_err(io_err("postgresql.conf"))
    }

    /// Writes the node's settings; a standby also gets its standby.signal.
    /// Answers whether the settings changed (a running node then needs a
    /// reload).
    pub fn write_conf(&self, dir: &Path, c: &NodeConf) -> Result<bool, PgError> {
        let mut text = format!(
            "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n\
             shared_buffers = '{}'\nmax_connections = {}\nfsync = {}\n\
             wal_level = replica\nhot_standby = on\nmax_wal_senders = 20\n\
             max_replication_slots = 20\nwal_keep_size = '64MB'\n",
            c.port,
            c.shared_buffers,
            c.max_connections,
            if c.fsync { "on" } else { "off" },
        );
        let signal = dir.join("standby.signal");
        if let Some((port, slot)) = c.follow {
            text.push_str(&format!(
                "primary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name={}'\n\
                 primary_slot_name = '{slot}'\nrecovery_target_timeline = 'latest'\n",
                c.application_name
            ));
            std::fs::write(&signal, "").map_err(io_err("standby.signal"))?;
            self.own(&signal)?;
        } else if signal.exists() {
            std::fs::remove_file(&signal).map_err(io_err("standby.signal"))?;
        }
        let path = dir.join("drover.conf");
        if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
            return Ok(false);
        }
        std::fs::write(&path, text).map_err(io_err("drover.conf"))?;
        self.own(&path)?;
        Ok(true)
    }

    /// Starts the node's postgres (detached: it outlives the provider).
    pub async fn start(&self, bin: &Path, dir: &Path, log: &Path) -> Result<(), PgError> {
        if running(dir) {
            return Ok(());
        }
        // A killed postmaster's pid file (its process gone or a zombie no
        // one reaps) would make postgres think it still runs.
        let _ = std::fs::remove_file(dir.join("postmaster.pid"));
        let mut cmd = self.command(bin, "pg_ctl");
        cmd.arg("start").arg("-D").arg(dir).arg("-l").arg(log);
        cmd.args(["-w", "-t", PG_CTL_WAIT_SECS]);
        let started = self.run(cmd, "pg_ctl start").await;
        started.map(drop).map_err(|error| with_log_tail(error, log))
    }

    /// Stops the node cleanly (fast mode: sessions end, a checkpoint is
    /// written); nothing to do when it is not running.
    pub async fn stop(&self, bin: &Path, dir: &Path) -> Result<(), PgError> {
        if !running(dir) {
            return Ok(());
        }
        let mut cmd = self.command(bin, "pg_ctl");
        cmd.arg("stop")
            .arg("-D")
            .arg(dir)
            .args(["-m", "fast", "-w", "-t", PG_CTL_WAIT_SECS]);
        self.run(cmd, "pg_ctl stop").await.map(drop)
    }

    /// Asks the standby to promote itself and returns at once (pg_ctl
    /// writes `promote.signal` and signals the postmaster): the caller
    /// polls `pg_is_in_recovery()`, so a slow promotion is a state it can
    /// see rather than a timeout it cannot interpret.
    pub async fn request_promotion(&self, bin: &Path, dir: &Path) -> Result<(), PgError> {
        let mut cmd = self.command(bin, "pg_ctl");
        cmd.arg("promote").arg("-D").arg(dir).arg("-W");
        self.run(cmd, "pg_ctl promote").await.map(drop)
    }

    pub async fn reload(&self, bin: &Path, dir: &Path) -> Result<(), PgError> {
        let mut cmd = self.command(bin, "pg_ctl");
        cmd.arg("reload").arg("-D").arg(dir);
        self.run(cmd, "pg_ctl reload").await.map(drop)
    }

    /// Runs `sql` on the node at `port` and returns its rows, unaligned
    /// (columns split by '|', rows by newlines).
    pub async fn query(
        &self,
        bin: &Path,
        port: u16,
        db: &str,
        sql: &str,
    ) -> Result<String, PgError> {
        let mut cmd = self.command(bin, "psql");
        cmd.args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
        ])
        .arg("-p")
        .arg(port.to_string())
        .arg("-d")
        .arg(db)
        .arg("-c")
        .arg(sql);
        self.run(cmd, "psql").await
    }

    /// Copies the node at `port` into `dir` (which must not exist), with
    /// the WAL it needs; streams from `slot` when given.
    pub async fn basebackup(
        &self,
        bin: &Path,
        port: u16,
        dir: &Path,
        slot: Option<&str>,
    ) -> Result<(), PgError> {
        let mut cmd = self.command(bin, "pg_basebackup");
        cmd.args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ])
        .arg("-p")
        .arg(port.to_string())
        .arg("-D")
        .arg(dir);
        if let Some(slot) = slot {
            cmd.arg("-S").arg(slot);
        }
        self.run(cmd, "pg_basebackup").await.map(drop)
    }

    /// What the node's control file says (pg_controldata): readable
    /// whether the node runs or not.
    pub async fn control(&self, bin: &Path, dir: &Path) -> Result<Control, PgError> {
        let mut cmd = self.command(bin, "pg_controldata");
        cmd.arg(dir);
        let out = self.run(cmd, "pg_controldata").await?;
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let missing = |what: &str| PgError::Failed {
            what: "pg_controldata".into(),
            detail: format!("no {what}"),
        };
        Ok(Control {
            state: field("Database cluster state:").ok_or_else(|| missing("state"))?,
            checkpoint_lsn: field("Latest checkpoint location:")
                .and_then(|v| parse_lsn(&v))
                .ok_or_else(|| missing("checkpoint location"))?,
            timeline: field("Latest checkpoint's TimeLineID:")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| missing("timeline"))?,
        })
    }
}

/// A node's control file, as far as roles and timelines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Control {
    /// "shut down", "shut down in recovery", "in production", ...
    pub state: String,
    /// Its last checkpoint (a clean shutdown's, once it stopped cleanly).
    pub checkpoint_lsn: u64,
    /// The timeline of that checkpoint.
    pub timeline: u32,
}

impl Control {
    /// The node last ran (or is running, or crashed) as a primary, so its
    /// timeline may hold writes no other node has. Only the two recovery
    /// states prove it a standby; anything else counts as a primary.
    pub fn was_primary(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "shut down in recovery" | "in archive recovery"
        )
    }

    pub fn shut_down_cleanly(&self) -> bool {
        self.state == "shut down"
    }
}

/// A node's timeline history, from the newest `*.history` file in its
/// `pg_wal` (none: timeline 1, no ancestors).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The newest timeline the node knows of.
    pub timeline: u32,
    /// Each ancestor timeline and the position its child forked from it.
    pub forks: std::collections::BTreeMap<u32, u64>,
}

pub fn history(dir: &Path) -> History {
    let newest = std::fs::read_dir(dir.join("pg_wal"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let tli = u32::from_str_radix(name.strip_suffix(".history")?, 16).ok()?;
            Some((tli, e.path()))
        })
        .max_by_key(|(tli, _)| *tli);
    let Some((timeline, path)) = newest else {
        return History {
            timeline: 1,
            forks: Default::default(),
        };
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let forks = text
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let parent = f.next()?.parse().ok()?;
            Some((parent, parse_lsn(f.next()?)?))
        })
        .collect();
    History { timeline, forks }
}

/// Whether the node's postmaster runs: its pid file names a live process
/// (not a zombie).
pub fn running(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("postmaster.pid")) else {
        return false;
    };
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<u32>().ok())
    else {
        return false;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Whether `dir` holds a whole data directory (a version file and a
/// control file): one deleted, or deleted in part, cannot start.
pub fn complete(dir: &Path) -> bool {
    dir.join("PG_VERSION").is_file() && dir.join("global/pg_control").is_file()
}

/// PostgreSQL processes working in `dir` (or in a directory once there
/// and since deleted): every postgres process runs in its data directory.
/// Zombies, which hold nothing, are not listed (their cwd is unreadable).
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let deleted = format!("{} (deleted)", dir.display());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
            continue;
        };
        if cwd != dir && cwd.as_os_str() != deleted.as_str() {
            continue;
        }
        let exe = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
        let exe = exe.to_string_lossy();
        if exe.ends_with("/postgres") || exe.ends_with("/postgres (deleted)") {
            pids.push(pid);
        }
    }
    pids
}

/// Sends SIGKILL to `pid` (best effort: it may have exited already).
pub fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

/// The pid of the node's postmaster, if it runs.
pub fn pid(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("postmaster.pid")).ok()?;
    running(dir).then(|| text.lines().next()?.trim().parse().ok())?
}

/// Parses a WAL position such as `0/3000060`.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// Total size in bytes of the files under `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_quotes_the_end_of_the_servers_log() {
        let log = std::env::temp_dir().join(format!("drover-pg-log-{}", std::process::id()));
        let lines: Vec<String> = (1..=8).map(|i| format!("line {i}")).collect();
        std::fs::write(&log, lines.join("\n")).unwrap();
        let failed = || PgError::Failed {
            what: "pg_ctl start".into(),
            detail: "exit status: 1: examine the log output".into(),
        };
        let quoted = with_log_tail(failed(), &log).to_string();
        assert!(
            quoted.ends_with("line 4 | line 5 | line 6 | line 7 | line 8"),
            "{quoted}"
        );
        assert!(!quoted.contains("line 3"), "{quoted}");
        std::fs::remove_file(&log).unwrap();
        let no_log = with_log_tail(failed(), &log).to_string();
        assert_eq!(no_log, failed().to_string());
    }

    #[test]
    fn wal_positions_parse() {
        assert_eq!(parse_lsn("0/3000060"), Some(0x3000060));
        assert_eq!(parse_lsn("1/0"), Some(1 << 32));
        assert_eq!(parse_lsn("x"), None);
    }
}
