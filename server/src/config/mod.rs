//! Configuration: flags, `DROVER_*` environment variables and an optional
//! TOML file, merged in that order of precedence and validated before any
//! port binds. A bad value is one clear line and exit code 64 (EX_USAGE).
//!
//! Every setting is one row of the [`Settings`] table below: its name (the
//! file key, and in kebab case the flag), its `DROVER_*` variable, its help,
//! and the rule (in `rules`) that gives its default and checks it. Adding a
//! setting is a row there plus the [`Config`] field it fills.
//!
//! # Guarantees
//! - Every failure is one line naming the setting as the file spells it.
//! - Settings are checked in the table's order; the first bad one is
//!   reported.
//!
//! # Assumptions
//! - The configuration is a leaf: it imports nothing from the layers that
//!   read it (the per-kind [`Timeouts`] live here, the operation kinds and
//!   the DNS-1123 rule in leaf modules of their own).
//!
//! # Caveats
//! - The `[default: ...]` in a setting's help is written by hand beside the
//!   default its rule is given.

mod admin_tls;
mod providers;
mod rules;
mod security;
mod timeouts;

pub use admin_tls::{anonymous_peers, AdminTls, AdminTlsError};
pub use providers::{ProviderLink, ProviderLinks, DEFAULT_NAME as DEFAULT_PROVIDER_NAME};
pub use security::{EtcdTls, EtcdUser, KeyPair, Secret, Security, ServerTls};
pub use timeouts::Timeouts;

use crate::provider::sim::flags::SimFlags;
use clap::{Args, Parser, Subcommand};
use providers::providers;
use rules::{
    address, compaction, given, key_prefix, log_format, on_off, orphan_policy, replica_id, urls,
    within,
};
use security::SecuritySettings;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use timeouts::operation_timeouts;

/// Exit code for a configuration error (sysexits EX_USAGE).
pub const EXIT_CONFIG: i32 = 64;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9070";
pub const DEFAULT_ETCD: &str = "http://127.0.0.1:2379";
pub const DEFAULT_KEY_PREFIX: &str = "/drover/v1/";
/// Short enough for fast failover, long enough to ride out a GC pause or an
/// etcd leader election (which renews every lease anyway).
pub const DEFAULT_LEASE_TTL_SECONDS: i64 = 5;
pub const DEFAULT_OPERATION_HISTORY: usize = 50;
/// Times an operation is resumed after its owner was lost before the next
/// loss fails it.
pub const DEFAULT_ORPHAN_RESUME_LIMIT: u32 = 3;
pub const DEFAULT_SCAN_INTERVAL_SECONDS: u64 = 10;
pub const DEFAULT_COMPACT_INTERVAL_SECONDS: u64 = 300;
/// A day: repairs of large clusters take hours.
pub const DEFAULT_TASK_RUN_TIMEOUT_SECONDS: u64 = 86_400;
/// Long enough for a quick operation to finish on a rolling restart; an
/// orchestrator's own grace (30 s in Kubernetes) must cover it plus the
/// 10 s drain of in-flight requests.
pub const DEFAULT_HANDOFF_GRACE_SECONDS: u64 = 5;
const HANDOFF_GRACE_RANGE: std::ops::RangeInclusive<u64> = 0..=86_400;
/// Long enough that a provider restarting (a deploy, a crash) is waited
/// for, short against the default operation timeout.
pub const DEFAULT_PROVIDER_HANDOVER_SECONDS: u64 = 30;
const PROVIDER_HANDOVER_RANGE: std::ops::RangeInclusive<u64> = 0..=86_400;
const TASK_RUN_TIMEOUT_RANGE: std::ops::RangeInclusive<u64> = 1..=604_800;
const LEASE_TTL_RANGE: std::ops::RangeInclusive<i64> = 2..=60;
/// The share of the lease TTL a replica stops believing in its lease before
/// etcd could expire it: room for clock drift, a slow keep-alive reply and an
/// etcd that revokes a lease early (a slow leader, see PRODUCTION.md). A
/// second at the default TTL.
pub const DEFAULT_LEASE_MARGIN_PERCENT: u32 = 20;
/// At most half: renewals come every third of the TTL, so a larger margin
/// would leave the belief lapsing between two renewals at the slightest delay.
const LEASE_MARGIN_RANGE: std::ops::RangeInclusive<u32> = 5..=30;

/// The command line of the `drover` binary.
#[derive(Debug, Parser)]
#[command(
    name = "drover",
    version,
    about = "A replicated coordinator for cluster lifecycle operations"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a replica against etcd.
    Serve(Box<ServeArgs>),
    /// Run one replica with an in-memory store on loopback: no etcd needed.
    Dev(Box<DevArgs>),
    /// Print the SHA-256 (hex) of the token read from standard input, for
    /// the --auth-tokens file.
    HashToken,
}

/// Flags of `drover serve`; each also reads a `DROVER_*` variable.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (flags and environment win).
    #[arg(long, env = "DROVER_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}

/// Flags of `drover dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// gRPC listen address.
    #[arg(long, env = "DROVER_LISTEN")]
    pub listen: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "DROVER_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Admin HTTP address (/metrics, /healthz, /readyz). Not given: the
    /// default, or a free port when another instance holds it.
    #[arg(long, env = "DROVER_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// Where the in-process simulated provider listens (its Provider and
    /// Simulator services and reflection, for grpcurl).
    #[arg(long, env = "DROVER_SIM_LISTEN", default_value = "127.0.0.1:0")]
    pub sim_listen: SocketAddr,
    #[command(flatten)]
    pub simulator: SimFlags,
}

/// Declares the settings, one row each:
///
/// ```text
/// /// Help (the flag's, and the file's documentation).
/// name: Given = "DROVER_NAME", rule => Checked;
/// ```
///
/// From the rows it derives [`Settings`] (each field optional, so that the
/// sources can be layered: flag `--name`, variable `DROVER_NAME`, file key
/// `name`), `Settings::or` (flags and environment over the file) and
/// `Settings::check`, which applies each row's `rule` (`(setting, given) ->
/// Result<Checked, ConfigError>`) in row order.
macro_rules! settings {
    ($(
        $(#[$attr:meta])*
        $name:ident: $given:ty = $env:literal, $rule:expr => $checked:ty;
    )*) => {
        /// Every setting, as given (flags/environment or file); all optional
        /// here so that the sources can be layered.
        #[derive(Debug, Default, Args, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "snake_case")]
        pub struct Settings {
            $(
                $(#[$attr])*
                #[arg(long, env = $env)]
                pub $name: Option<$given>,
            )*
        }

        /// Every setting, defaulted and checked.
        struct Checked {
            $($name: $checked,)*
        }

        impl Settings {
            /// `self` where set, otherwise `file`.
            fn or(self, file: Settings) -> Settings {
                Settings {
                    $($name: self.$name.or(file.$name),)*
                }
            }

            /// Each row's rule, in row order.
            fn check(self) -> Result<Checked, ConfigError> {
                Ok(Checked {
                    $($name: ($rule)(stringify!($name), self.$name)?,)*
                })
            }
        }
    };
}

settings! {
    /// gRPC listen address [default: 127.0.0.1:7070].
    listen: String = "DROVER_LISTEN", address(DEFAULT_LISTEN) => SocketAddr;
    /// etcd client URLs, comma-separated [default: http://127.0.0.1:2379].
    #[arg(value_delimiter = ',')]
    etcd_endpoints: Vec<String> = "DROVER_ETCD_ENDPOINTS", urls(DEFAULT_ETCD) => Vec<String>;
    /// Prefix of every etcd key [default: /drover/v1/].
    key_prefix: String = "DROVER_KEY_PREFIX", key_prefix(DEFAULT_KEY_PREFIX) => String;
    /// Replica lease TTL in seconds, 2-60 [default: 5].
    lease_ttl: i64 = "DROVER_LEASE_TTL",
        within(DEFAULT_LEASE_TTL_SECONDS, LEASE_TTL_RANGE, "seconds") => i64;
    /// Safety margin in percent of the lease TTL, 5-30: the replica acts as
    /// an owner (and gives provider calls a deadline) only up to TTL minus
    /// this after a renewal was sent [default: 20].
    lease_margin_percent: u32 = "DROVER_LEASE_MARGIN_PERCENT",
        within(DEFAULT_LEASE_MARGIN_PERCENT, LEASE_MARGIN_RANGE, "percent of the lease TTL") => u32;
    /// Replica id, a DNS-1123 label [default: the host name].
    replica_id: String = "DROVER_REPLICA_ID", replica_id => String;
    /// A provider, NAME=URL[,ca=FILE][,cert=FILE,key=FILE][,token-file=FILE]
    /// (repeatable; ';' between several in one value); a bare URL is the
    /// provider named "default". https uses TLS (ca: the CA to trust, else
    /// the system's roots; cert/key: a client certificate); the token file's
    /// line goes as a bearer token on every call. None: no operations run.
    #[arg(value_delimiter = ';')]
    #[serde(default, deserialize_with = "one_or_many")]
    provider: Vec<String> = "DROVER_PROVIDER", providers => Vec<ProviderLink>;
    /// The provider of clusters created without spec.provider [default: the
    /// only provider, or the one named "default"].
    default_provider: String = "DROVER_DEFAULT_PROVIDER", given => Option<String>;
    /// Log format: text or json [default: text].
    log_format: String = "DROVER_LOG_FORMAT", log_format => LogFormat;
    /// Where OpenTelemetry traces go over OTLP/gRPC (`http://host:4317`)
    /// [default: the standard OTEL_EXPORTER_OTLP_ENDPOINT; neither: no
    /// traces].
    otlp_endpoint: String = "DROVER_OTLP_ENDPOINT", given => Option<String>;
    /// Operation timeout per kind, KIND=SECONDS (repeatable; kinds: start,
    /// stop, scale, upgrade, add-nodes, remove-nodes, destroy, recover)
    /// [default: 3600, remove-nodes 900].
    #[arg(value_delimiter = ',')]
    operation_timeout: Vec<String> = "DROVER_OPERATION_TIMEOUTS", operation_timeouts => Timeouts;
    /// Finished operations kept per cluster [default: 50].
    operation_history: usize = "DROVER_OPERATION_HISTORY",
        within(DEFAULT_OPERATION_HISTORY, 1..=10_000, "") => usize;
    /// What a new owner does with an operation its lost owner left
    /// running: resume (fence the provider, then go on from its last
    /// persisted step) or fail (the reference's behaviour) [default: resume].
    orphaned_operations: String = "DROVER_ORPHANED_OPERATIONS", orphan_policy => OrphanPolicy;
    /// Times one operation may be resumed after its owner was lost, 0-100;
    /// a further loss fails it, so a poison pill cannot take down every
    /// replica in turn [default: 3].
    orphan_resume_limit: u32 = "DROVER_ORPHAN_RESUME_LIMIT",
        within(DEFAULT_ORPHAN_RESUME_LIMIT, 0..=100, "") => u32;
    /// Fast crash detection: on, a replica watches every peer over its
    /// /liveness connection and revokes the lease of one seen crashed; off,
    /// a crashed peer's clusters wait for its lease TTL (to compare the two)
    /// [default: on].
    peer_liveness: String = "DROVER_PEER_LIVENESS", on_off(true) => bool;
    /// Seconds between status scans, 1-3600 [default: 10].
    scan_interval: u64 = "DROVER_SCAN_INTERVAL",
        within(DEFAULT_SCAN_INTERVAL_SECONDS, 1..=3600, "seconds") => u64;
    /// Admin HTTP address for /metrics, /healthz, /readyz, /liveness and
    /// the console; HTTPS with tls_cert, and plain HTTP only on loopback
    /// without admin_plain_http [default: 127.0.0.1:9070].
    admin_listen: String = "DROVER_ADMIN_LISTEN", address(DEFAULT_ADMIN_LISTEN) => SocketAddr;
    /// Serve the admin port over plain HTTP on an address other than
    /// loopback (no tls_cert): the console's tokens then cross the network
    /// in clear text. With tls_cert the admin port serves HTTPS whatever
    /// this says [default: off].
    #[arg(num_args = 0..=1, default_missing_value = "on")]
    admin_plain_http: String = "DROVER_ADMIN_PLAIN_HTTP", on_off(false) => bool;
    /// Seconds between compactions of etcd's history (keeping one interval
    /// of it); 0 disables [default: 300].
    compact_interval: u64 = "DROVER_COMPACT_INTERVAL",
        compaction(DEFAULT_COMPACT_INTERVAL_SECONDS) => Option<Duration>;
    /// Seconds a task run may take before it is stopped and counted as an
    /// error, 1-604800 [default: 86400].
    task_run_timeout: u64 = "DROVER_TASK_RUN_TIMEOUT",
        within(DEFAULT_TASK_RUN_TIMEOUT_SECONDS, TASK_RUN_TIMEOUT_RANGE, "seconds") => u64;
    /// Seconds the operations running at SIGTERM may take to finish here,
    /// 0-86400, while every other cluster is handed over at once; peers fail
    /// those still running after it as orphans [default: 5].
    handoff_grace: u64 = "DROVER_HANDOFF_GRACE",
        within(DEFAULT_HANDOFF_GRACE_SECONDS, HANDOFF_GRACE_RANGE, "seconds") => u64;
    /// Seconds this replica may go without reaching a provider (probed
    /// every few seconds) before it hands its clusters to peers that reach
    /// every provider, 0-86400, 0 never: a gray failure (the replica keeps
    /// its lease but cannot work). When no replica reaches a provider it is
    /// down, and nobody hands over [default: 30].
    provider_handover_after: u64 = "DROVER_PROVIDER_HANDOVER_AFTER",
        within(DEFAULT_PROVIDER_HANDOVER_SECONDS, PROVIDER_HANDOVER_RANGE, "seconds") => u64;
    /// PEM certificate chain for TLS on the gRPC port (with tls_key).
    tls_cert: PathBuf = "DROVER_TLS_CERT", given => Option<PathBuf>;
    /// PEM private key of tls_cert.
    tls_key: PathBuf = "DROVER_TLS_KEY", given => Option<PathBuf>;
    /// PEM CA: clients must present a certificate it signed (mutual TLS).
    tls_client_ca: PathBuf = "DROVER_TLS_CLIENT_CA", given => Option<PathBuf>;
    /// Bearer-token file (TOML: [[token]] name, role, sha256); without it
    /// every caller may do everything.
    auth_tokens: PathBuf = "DROVER_AUTH_TOKENS", given => Option<PathBuf>;
    /// Audit log: one JSON line per request that changes something, to
    /// this file (appended; reopened on SIGHUP, for logrotate) or to
    /// standard output with `-` [default: none].
    audit_log: PathBuf = "DROVER_AUDIT_LOG", given => Option<PathBuf>;
    /// PEM CA of etcd's certificate (with https:// etcd endpoints).
    etcd_ca: PathBuf = "DROVER_ETCD_CA", given => Option<PathBuf>;
    /// PEM client certificate for etcd (with etcd_key).
    etcd_cert: PathBuf = "DROVER_ETCD_CERT", given => Option<PathBuf>;
    /// PEM private key of etcd_cert.
    etcd_key: PathBuf = "DROVER_ETCD_KEY", given => Option<PathBuf>;
    /// etcd user name (with etcd_password_file).
    etcd_username: String = "DROVER_ETCD_USERNAME", given => Option<String>;
    /// File holding the etcd user's password (never given on the command
    /// line, so it cannot show in the process list).
    etcd_password_file: PathBuf = "DROVER_ETCD_PASSWORD_FILE", given => Option<PathBuf>;
}

/// A file value given as one string (`provider = "URL"`, as before there
/// could be several) or a list of them.
fn one_or_many<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(Some(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    }))
}

/// What a new owner does with an operation its lost owner left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanPolicy {
    /// Resume it from its last persisted step, up to `limit` times.
    Resume { limit: u32 },
    /// Fail it, as the reference does.
    Fail,
}

pub use drover_telemetry::LogFormat;

/// A validated replica configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub etcd_endpoints: Vec<String>,
    pub key_prefix: String,
    pub lease_ttl_seconds: i64,
    /// How long before the lease TTL runs out the replica stops acting as
    /// an owner.
    pub lease_margin: Duration,
    pub replica_id: String,
    /// The providers and the default one; `None`: no provider, so no
    /// operations run here.
    pub providers: Option<ProviderLinks>,
    pub log_format: LogFormat,
    /// Where traces go; `None`: the standard variables decide.
    pub otlp_endpoint: Option<String>,
    pub operation_timeouts: Timeouts,
    pub operation_history: usize,
    pub orphaned_operations: OrphanPolicy,
    /// Whether this replica watches its peers for crashes (off: a crashed
    /// peer's clusters wait for its lease TTL).
    pub peer_liveness: bool,
    pub scan_interval: Duration,
    pub admin_listen: SocketAddr,
    /// When `admin_listen` is taken, serve the admin port on a free port of
    /// the same address instead of failing: `drover dev` without
    /// `--admin-listen`, so that a second instance starts.
    pub admin_listen_fallback: bool,
    /// `None`: Drover does not compact etcd.
    pub compact_interval: Option<Duration>,
    pub task_run_timeout: Duration,
    /// How long the operations running at SIGTERM may take to finish here.
    pub handoff_grace: Duration,
    /// How long a provider may go unreached before this replica hands its
    /// clusters over; `None`: never.
    pub provider_handover_after: Option<Duration>,
    pub security: Security,
    /// Where the audit log goes: a file, or standard output for `-`;
    /// `None`: nowhere.
    pub audit_log: Option<PathBuf>,
}

/// A configuration error: one line naming the setting.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {setting}: {reason}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub reason: String,
}

pub(crate) fn invalid(setting: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        reason: reason.into(),
    }
}

/// Parses a configuration file; an error names the file, the line and
/// column, and the key (`drover.toml:3:13: lease_ttl: invalid type: ...`),
/// in one line: toml's own report spans several lines and names no key.
fn parse_file(origin: &str, text: &str) -> Result<Settings, ConfigError> {
    toml::from_str::<Settings>(text).map_err(|error| {
        let Some(span) = error.span() else {
            return invalid("config", format!("{origin}: {}", error.message()));
        };
        let (line, column) = line_and_column(text, span.start);
        let key = key_at(text, line)
            .map(|key| format!("{key}: "))
            .unwrap_or_default();
        let message = error.message().trim_end();
        invalid(
            "config",
            format!("{origin}:{line}:{column}: {key}{message}"),
        )
    })
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..text.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// The key whose value is on (or, for a value over several lines, starts
/// above) 1-based `line`, dotted with its table's name: `tls.cert`.
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().take(line).collect();
    let header = |l: &str| {
        let l = l.trim();
        let name = l.strip_prefix('[')?.strip_suffix(']')?;
        Some(name.trim_matches(['[', ']', ' ']).to_string())
    };
    // A table where none belongs: the table is the key.
    if let Some(table) = lines.last().and_then(|l| header(l)) {
        return Some(table);
    }
    // Only a key before the `=`: a string in an array may hold one too.
    let is_key = |key: &str| {
        let bare = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        let quoted = key.len() >= 2 && key.starts_with('"') && key.ends_with('"');
        bare || quoted
    };
    let (index, key) = lines.iter().enumerate().rev().find_map(|(i, l)| {
        let (key, _) = l.split_once('=')?;
        let key = key.trim();
        is_key(key).then(|| (i, key.trim_matches('"')))
    })?;
    let table = lines[..index].iter().rev().find_map(|l| header(l));
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_string(),
    })
}

impl Config {
    /// Loads `drover serve` settings: flags/environment over the file.
    pub fn from_serve_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    invalid("config", format!("cannot read {}: {e}", path.display()))
                })?;
                parse_file(&path.display().to_string(), &text)?
            }
            None => Settings::default(),
        };
        Self::from_settings(args.settings.or(file))
    }

    /// Loads `drover dev` settings (embedded mode).
    pub fn from_dev_args(args: DevArgs) -> Result<Self, ConfigError> {
        let admin_listen_fallback = args.admin_listen.is_none();
        let config = Self::from_settings(Settings {
            listen: args.listen,
            log_format: args.log_format,
            admin_listen: args.admin_listen,
            replica_id: Some("dev".to_string()),
            ..Settings::default()
        })?;
        Ok(Self {
            admin_listen_fallback,
            ..config
        })
    }

    /// Checks every row, then assembles what depends on several: the lease
    /// margin and the security settings.
    fn from_settings(settings: Settings) -> Result<Self, ConfigError> {
        let s = settings.check()?;
        let security = SecuritySettings {
            tls_cert: s.tls_cert,
            tls_key: s.tls_key,
            tls_client_ca: s.tls_client_ca,
            auth_tokens: s.auth_tokens,
            etcd_ca: s.etcd_ca,
            etcd_cert: s.etcd_cert,
            etcd_key: s.etcd_key,
            etcd_username: s.etcd_username,
            etcd_password_file: s.etcd_password_file,
        }
        .load(&s.etcd_endpoints)?;
        security::admin_plain_http(s.admin_listen, s.admin_plain_http, &security)?;
        Ok(Config {
            listen: s.listen,
            etcd_endpoints: s.etcd_endpoints,
            key_prefix: s.key_prefix,
            lease_ttl_seconds: s.lease_ttl,
            lease_margin: Duration::from_secs(s.lease_ttl as u64) * s.lease_margin_percent / 100,
            replica_id: s.replica_id,
            providers: providers::with_default(s.provider, s.default_provider)?,
            log_format: s.log_format,
            otlp_endpoint: s.otlp_endpoint,
            operation_timeouts: s.operation_timeout,
            operation_history: s.operation_history,
            orphaned_operations: match s.orphaned_operations {
                OrphanPolicy::Resume { .. } => OrphanPolicy::Resume {
                    limit: s.orphan_resume_limit,
                },
                OrphanPolicy::Fail => OrphanPolicy::Fail,
            },
            peer_liveness: s.peer_liveness,
            scan_interval: Duration::from_secs(s.scan_interval),
            admin_listen: s.admin_listen,
            admin_listen_fallback: false,
            compact_interval: s.compact_interval,
            task_run_timeout: Duration::from_secs(s.task_run_timeout),
            handoff_grace: Duration::from_secs(s.handoff_grace),
            provider_handover_after: (s.provider_handover_after > 0)
                .then(|| Duration::from_secs(s.provider_handover_after)),
            security,
            audit_log: s.audit_log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::OperationKind;

    fn settings() -> Settings {
        Settings {
            replica_id: Some("r1".into()),
            ..Settings::default()
        }
    }

    #[test]
    fn defaults_are_valid() {
        let config = Config::from_settings(settings()).unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(config.key_prefix, DEFAULT_KEY_PREFIX);
        assert_eq!(config.lease_ttl_seconds, DEFAULT_LEASE_TTL_SECONDS);
        // A second of the default five: the ownership belief ends before
        // etcd could let the lease go.
        assert_eq!(config.lease_margin, Duration::from_secs(1));
        assert_eq!(config.log_format, LogFormat::Text);
    }

    /// Every setting left out takes the default its help text names.
    #[test]
    fn every_default_is_the_documented_one() {
        let config = Config::from_settings(settings()).unwrap();
        assert_eq!(config.etcd_endpoints, vec![DEFAULT_ETCD.to_string()]);
        assert_eq!(config.admin_listen.to_string(), DEFAULT_ADMIN_LISTEN);
        assert_eq!(config.replica_id, "r1");
        assert!(config.providers.is_none());
        assert_eq!(config.operation_history, 50);
        assert_eq!(config.scan_interval, Duration::from_secs(10));
        assert_eq!(config.compact_interval, Some(Duration::from_secs(300)));
        assert_eq!(config.task_run_timeout, Duration::from_secs(86_400));
        assert_eq!(config.handoff_grace, Duration::from_secs(5));
        assert_eq!(
            config.provider_handover_after,
            Some(Duration::from_secs(30))
        );
        assert!(config.peer_liveness);
        for kind in OperationKind::ALL {
            let expected = match kind {
                OperationKind::RemoveNodes => 900,
                _ => 3600,
            };
            assert_eq!(
                config.operation_timeouts.get(kind),
                Duration::from_secs(expected),
                "{kind:?}"
            );
        }
        assert!(config.security.server_tls.is_none() && config.security.tokens.is_none());
        assert!(config.security.etcd_tls.is_none() && config.security.etcd_user.is_none());
    }

    #[test]
    fn operation_timeouts_override_their_kind_only() {
        let config = Config::from_settings(Settings {
            operation_timeout: Some(vec!["stop=7".into(), "remove-nodes=8".into()]),
            ..settings()
        })
        .unwrap();
        let timeouts = &config.operation_timeouts;
        assert_eq!(timeouts.get(OperationKind::Stop), Duration::from_secs(7));
        assert_eq!(
            timeouts.get(OperationKind::RemoveNodes),
            Duration::from_secs(8)
        );
        assert_eq!(
            timeouts.get(OperationKind::Start),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn peer_liveness_can_be_turned_off() {
        let with = |value: &str| {
            Config::from_settings(Settings {
                peer_liveness: Some(value.into()),
                ..settings()
            })
        };
        assert!(!with("off").unwrap().peer_liveness);
        assert!(with("on").unwrap().peer_liveness);
        let error = with("yes").unwrap_err();
        assert_eq!(error.setting, "peer_liveness", "{error}");
        assert!(error.to_string().contains("neither on nor off"), "{error}");
    }

    #[test]
    fn compaction_can_be_turned_off() {
        let config = Config::from_settings(Settings {
            compact_interval: Some(0),
            ..settings()
        })
        .unwrap();
        assert_eq!(config.compact_interval, None);
    }

    #[test]
    fn each_bad_value_names_its_setting() {
        let cases: Vec<(Settings, &str)> = vec![
            (
                Settings {
                    listen: Some("nowhere".into()),
                    ..settings()
                },
                "listen",
            ),
            (
                Settings {
                    etcd_endpoints: Some(vec!["127.0.0.1:2379".into()]),
                    ..settings()
                },
                "etcd_endpoints",
            ),
            (
                Settings {
                    etcd_endpoints: Some(vec![]),
                    ..settings()
                },
                "etcd_endpoints",
            ),
            (
                Settings {
                    key_prefix: Some("drover".into()),
                    ..settings()
                },
                "key_prefix",
            ),
            (
                Settings {
                    lease_ttl: Some(1),
                    ..settings()
                },
                "lease_ttl",
            ),
            (
                Settings {
                    lease_ttl: Some(61),
                    ..settings()
                },
                "lease_ttl",
            ),
            (
                Settings {
                    lease_margin_percent: Some(4),
                    ..settings()
                },
                "lease_margin_percent",
            ),
            (
                Settings {
                    lease_margin_percent: Some(31),
                    ..settings()
                },
                "lease_margin_percent",
            ),
            (
                Settings {
                    replica_id: Some("Bad_Id".into()),
                    ..Settings::default()
                },
                "replica_id",
            ),
            (
                Settings {
                    provider: Some(vec!["http://host".into()]),
                    ..settings()
                },
                "provider",
            ),
            (
                Settings {
                    provider: Some(vec!["a=http://a:1".into(), "b=http://b:1".into()]),
                    ..settings()
                },
                "default_provider",
            ),
            (
                Settings {
                    log_format: Some("xml".into()),
                    ..settings()
                },
                "log_format",
            ),
            (
                Settings {
                    operation_timeout: Some(vec!["upgrade".into()]),
                    ..settings()
                },
                "operation_timeout",
            ),
            (
                Settings {
                    operation_timeout: Some(vec!["fly=3".into()]),
                    ..settings()
                },
                "operation_timeout",
            ),
            (
                Settings {
                    operation_timeout: Some(vec!["stop=0".into()]),
                    ..settings()
                },
                "operation_timeout",
            ),
            (
                Settings {
                    operation_history: Some(0),
                    ..settings()
                },
                "operation_history",
            ),
            (
                Settings {
                    scan_interval: Some(0),
                    ..settings()
                },
                "scan_interval",
            ),
            (
                Settings {
                    admin_listen: Some("9070".into()),
                    ..settings()
                },
                "admin_listen",
            ),
            (
                Settings {
                    compact_interval: Some(3),
                    ..settings()
                },
                "compact_interval",
            ),
            (
                Settings {
                    task_run_timeout: Some(0),
                    ..settings()
                },
                "task_run_timeout",
            ),
            (
                Settings {
                    handoff_grace: Some(86_401),
                    ..settings()
                },
                "handoff_grace",
            ),
            (
                Settings {
                    provider_handover_after: Some(86_401),
                    ..settings()
                },
                "provider_handover_after",
            ),
        ];
        for (settings, setting) in cases {
            let error = Config::from_settings(settings).unwrap_err();
            assert_eq!(error.setting, setting, "{error}");
            assert!(!error.to_string().contains('\n'));
        }
    }

    #[test]
    fn flags_override_the_file() {
        let file: Settings =
            toml::from_str("lease_ttl = 9\nlisten = \"127.0.0.1:1\"\nreplica_id = \"f\"").unwrap();
        let flags = Settings {
            lease_ttl: Some(3),
            ..Settings::default()
        };
        let config = Config::from_settings(flags.or(file)).unwrap();
        assert_eq!(config.lease_ttl_seconds, 3);
        assert_eq!(config.listen.port(), 1);
        assert_eq!(config.replica_id, "f");
    }

    /// The file takes one provider as a string (as before there could be
    /// several) or several as a list.
    #[test]
    fn the_file_takes_one_provider_or_a_list() {
        let one: Settings = toml::from_str("provider = \"http://127.0.0.1:7080\"").unwrap();
        let config = Config::from_settings(Settings {
            replica_id: Some("r1".into()),
            ..one
        })
        .unwrap();
        let providers = config.providers.unwrap();
        assert_eq!(providers.default, "default");
        let many: Settings = toml::from_str(
            "provider = [\"sim=http://127.0.0.1:1\", \"pg=http://127.0.0.1:2\"]\ndefault_provider = \"pg\"",
        )
        .unwrap();
        let config = Config::from_settings(Settings {
            replica_id: Some("r1".into()),
            ..many
        })
        .unwrap();
        let providers = config.providers.unwrap();
        let names: Vec<&str> = providers.links.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            (names, providers.default.as_str()),
            (vec!["pg", "sim"], "pg")
        );
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        assert!(toml::from_str::<Settings>("lease_tll = 3").is_err());
    }

    /// A file error names the line, the column and the key, in one line.
    #[test]
    fn a_file_error_names_the_key_and_the_line() {
        let cases = [
            (
                "replica_id = \"r1\"\nlease_ttl = \"soon\"\n",
                "drover.toml:2:13: lease_ttl: ",
            ),
            (
                "# comment\n\nlease_tll = 3\n",
                "drover.toml:3:1: lease_tll: ",
            ),
            (
                "provider = [\n  \"a=http://127.0.0.1:1\",\n  7,\n]\n",
                "drover.toml:1:12: provider: ",
            ),
            ("[x]\nkey = 1\n", "drover.toml:1:2: x: unknown field"),
            ("listen = \"127.0.0.1:1\nx", "drover.toml:1:"),
        ];
        for (text, start) in cases {
            let error = parse_file("drover.toml", text).unwrap_err();
            assert_eq!(error.setting, "config");
            let message = error.to_string();
            assert!(message.contains(start), "{text:?}: {message}");
            assert!(!message.contains('\n'), "one line: {message}");
        }
        let (line, column) = line_and_column("a = 1\né = 2", 9);
        assert_eq!((line, column), (2, 3), "columns count characters");
    }
}
