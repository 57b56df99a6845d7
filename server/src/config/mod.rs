//! Configuration: flags, `DROVER_*` environment variables and an optional
//! TOML file, merged in that order of precedence and validated before any
//! port binds. A bad value is one clear line and exit code 64 (EX_USAGE).

mod security;
mod timeouts;

pub use security::{EtcdTls, EtcdUser, Secret, Security, ServerTls};
pub use timeouts::Timeouts;

use crate::kind::OperationKind;
use crate::names::dns_label;
use clap::{Args, Parser, Subcommand};
use security::SecuritySettings;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

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
pub const DEFAULT_SCAN_INTERVAL_SECONDS: u64 = 10;
pub const DEFAULT_COMPACT_INTERVAL_SECONDS: u64 = 300;
/// A day: repairs of large clusters take hours.
pub const DEFAULT_TASK_RUN_TIMEOUT_SECONDS: u64 = 86_400;
/// Long enough for a quick operation to finish on a rolling restart; an
/// orchestrator's own grace (30 s in Kubernetes) must cover it plus the
/// 10 s drain of in-flight requests.
pub const DEFAULT_HANDOFF_GRACE_SECONDS: u64 = 5;
const HANDOFF_GRACE_RANGE: std::ops::RangeInclusive<u64> = 0..=86_400;
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
    Dev(DevArgs),
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
    /// Admin HTTP address (/metrics, /healthz, /readyz).
    #[arg(long, env = "DROVER_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
}

/// Every setting, as given (flags/environment or file); all optional here so
/// that the sources can be layered.
#[derive(Debug, Default, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct Settings {
    /// gRPC listen address [default: 127.0.0.1:7070].
    #[arg(long, env = "DROVER_LISTEN")]
    pub listen: Option<String>,
    /// etcd client URLs, comma-separated [default: http://127.0.0.1:2379].
    #[arg(long, env = "DROVER_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Option<Vec<String>>,
    /// Prefix of every etcd key [default: /drover/v1/].
    #[arg(long, env = "DROVER_KEY_PREFIX")]
    pub key_prefix: Option<String>,
    /// Replica lease TTL in seconds, 2-60 [default: 5].
    #[arg(long, env = "DROVER_LEASE_TTL")]
    pub lease_ttl: Option<i64>,
    /// Safety margin in percent of the lease TTL, 5-30: the replica acts as
    /// an owner (and gives provider calls a deadline) only up to TTL minus
    /// this after a renewal was sent [default: 20].
    #[arg(long, env = "DROVER_LEASE_MARGIN_PERCENT")]
    pub lease_margin_percent: Option<u32>,
    /// Replica id, a DNS-1123 label [default: the host name].
    #[arg(long, env = "DROVER_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Provider gRPC endpoint (http:// or https:// URL).
    #[arg(long, env = "DROVER_PROVIDER")]
    pub provider: Option<String>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "DROVER_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Operation timeout per kind, KIND=SECONDS (repeatable; kinds: start,
    /// stop, scale, upgrade, add-nodes, remove-nodes, destroy, recover)
    /// [default: 3600, remove-nodes 900].
    #[arg(
        long = "operation-timeout",
        env = "DROVER_OPERATION_TIMEOUTS",
        value_delimiter = ','
    )]
    pub operation_timeout: Option<Vec<String>>,
    /// Finished operations kept per cluster [default: 50].
    #[arg(long, env = "DROVER_OPERATION_HISTORY")]
    pub operation_history: Option<usize>,
    /// Seconds between status scans, 1-3600 [default: 10].
    #[arg(long, env = "DROVER_SCAN_INTERVAL")]
    pub scan_interval: Option<u64>,
    /// Admin HTTP address for /metrics, /healthz and /readyz
    /// [default: 127.0.0.1:9070].
    #[arg(long, env = "DROVER_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// Seconds between compactions of etcd's history (keeping one interval
    /// of it); 0 disables [default: 300].
    #[arg(long, env = "DROVER_COMPACT_INTERVAL")]
    pub compact_interval: Option<u64>,
    /// Seconds a task run may take before it is stopped and counted as an
    /// error, 1-604800 [default: 86400].
    #[arg(long, env = "DROVER_TASK_RUN_TIMEOUT")]
    pub task_run_timeout: Option<u64>,
    /// Seconds the operations running at SIGTERM may take to finish here,
    /// 0-86400, while every other cluster is handed over at once; peers fail
    /// those still running after it as orphans [default: 5].
    #[arg(long, env = "DROVER_HANDOFF_GRACE")]
    pub handoff_grace: Option<u64>,
    /// PEM certificate chain for TLS on the gRPC port (with tls_key).
    #[arg(long, env = "DROVER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of tls_cert.
    #[arg(long, env = "DROVER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA: clients must present a certificate it signed (mutual TLS).
    #[arg(long, env = "DROVER_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Bearer-token file (TOML: [[token]] name, role, sha256); without it
    /// every caller may do everything.
    #[arg(long, env = "DROVER_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,
    /// PEM CA of etcd's certificate (with https:// etcd endpoints).
    #[arg(long, env = "DROVER_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd (with etcd_key).
    #[arg(long, env = "DROVER_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// PEM private key of etcd_cert.
    #[arg(long, env = "DROVER_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user name (with etcd_password_file).
    #[arg(long, env = "DROVER_ETCD_USERNAME")]
    pub etcd_username: Option<String>,
    /// File holding the etcd user's password (never given on the command
    /// line, so it cannot show in the process list).
    #[arg(long, env = "DROVER_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

impl Settings {
    /// `self` where set, otherwise `file`.
    fn or(self, file: Settings) -> Settings {
        Settings {
            listen: self.listen.or(file.listen),
            etcd_endpoints: self.etcd_endpoints.or(file.etcd_endpoints),
            key_prefix: self.key_prefix.or(file.key_prefix),
            lease_ttl: self.lease_ttl.or(file.lease_ttl),
            lease_margin_percent: self.lease_margin_percent.or(file.lease_margin_percent),
            replica_id: self.replica_id.or(file.replica_id),
            provider: self.provider.or(file.provider),
            log_format: self.log_format.or(file.log_format),
            operation_timeout: self.operation_timeout.or(file.operation_timeout),
            operation_history: self.operation_history.or(file.operation_history),
            scan_interval: self.scan_interval.or(file.scan_interval),
            admin_listen: self.admin_listen.or(file.admin_listen),
            compact_interval: self.compact_interval.or(file.compact_interval),
            task_run_timeout: self.task_run_timeout.or(file.task_run_timeout),
            handoff_grace: self.handoff_grace.or(file.handoff_grace),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            tls_client_ca: self.tls_client_ca.or(file.tls_client_ca),
            auth_tokens: self.auth_tokens.or(file.auth_tokens),
            etcd_ca: self.etcd_ca.or(file.etcd_ca),
            etcd_cert: self.etcd_cert.or(file.etcd_cert),
            etcd_key: self.etcd_key.or(file.etcd_key),
            etcd_username: self.etcd_username.or(file.etcd_username),
            etcd_password_file: self.etcd_password_file.or(file.etcd_password_file),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// A validated replica configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub etcd_endpoints: Vec<String>,
    pub key_prefix: String,
    pub lease_ttl_seconds: i64,
    /// How long before the lease TTL runs out the replica stops acting as
    /// an owner.
    pub lease_margin: std::time::Duration,
    pub replica_id: String,
    pub provider: Option<String>,
    pub log_format: LogFormat,
    pub operation_timeouts: Timeouts,
    pub operation_history: usize,
    pub scan_interval: std::time::Duration,
    pub admin_listen: SocketAddr,
    /// `None`: Drover does not compact etcd.
    pub compact_interval: Option<std::time::Duration>,
    pub task_run_timeout: std::time::Duration,
    /// How long the operations running at SIGTERM may take to finish here.
    pub handoff_grace: std::time::Duration,
    pub security: Security,
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

impl Config {
    /// Loads `drover serve` settings: flags/environment over the file.
    pub fn from_serve_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    invalid("config", format!("cannot read {}: {e}", path.display()))
                })?;
                toml::from_str::<Settings>(&text).map_err(|e| {
                    invalid("config", format!("{}: {}", path.display(), e.message()))
                })?
            }
            None => Settings::default(),
        };
        Self::from_settings(args.settings.or(file))
    }

    /// Loads `drover dev` settings (embedded mode).
    pub fn from_dev_args(args: DevArgs) -> Result<Self, ConfigError> {
        Self::from_settings(Settings {
            listen: args.listen,
            log_format: args.log_format,
            admin_listen: args.admin_listen,
            replica_id: Some("dev".to_string()),
            ..Settings::default()
        })
    }

    fn from_settings(settings: Settings) -> Result<Self, ConfigError> {
        let listen_text = settings
            .listen
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen = listen_text.parse().map_err(|_| {
            invalid(
                "listen",
                format!("{listen_text:?} is not an address of the form IP:PORT"),
            )
        })?;
        let etcd_endpoints = settings
            .etcd_endpoints
            .unwrap_or_else(|| vec![DEFAULT_ETCD.to_string()]);
        if etcd_endpoints.is_empty() {
            return Err(invalid(
                "etcd_endpoints",
                "at least one endpoint is required",
            ));
        }
        for endpoint in &etcd_endpoints {
            check_url("etcd_endpoints", endpoint)?;
        }
        let key_prefix = settings
            .key_prefix
            .unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_string());
        if !key_prefix.starts_with('/')
            || !key_prefix.ends_with('/')
            || key_prefix
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid(
                "key_prefix",
                format!("{key_prefix:?} must start and end with '/' and contain no spaces"),
            ));
        }
        let lease_ttl_seconds = settings.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL_SECONDS);
        if !LEASE_TTL_RANGE.contains(&lease_ttl_seconds) {
            return Err(invalid(
                "lease_ttl",
                format!(
                    "{lease_ttl_seconds} is outside {}..={} seconds",
                    LEASE_TTL_RANGE.start(),
                    LEASE_TTL_RANGE.end()
                ),
            ));
        }
        let lease_margin_percent = settings
            .lease_margin_percent
            .unwrap_or(DEFAULT_LEASE_MARGIN_PERCENT);
        if !LEASE_MARGIN_RANGE.contains(&lease_margin_percent) {
            return Err(invalid(
                "lease_margin_percent",
                format!(
                    "{lease_margin_percent} is outside {}..={} percent of the lease TTL",
                    LEASE_MARGIN_RANGE.start(),
                    LEASE_MARGIN_RANGE.end()
                ),
            ));
        }
        let lease_margin =
            std::time::Duration::from_secs(lease_ttl_seconds as u64) * lease_margin_percent / 100;
        let replica_id = match settings.replica_id {
            Some(id) => id,
            None => default_replica_id()?,
        };
        dns_label(&replica_id).map_err(|reason| invalid("replica_id", reason))?;
        if let Some(provider) = &settings.provider {
            check_url("provider", provider)?;
        }
        let log_format = match settings.log_format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(invalid(
                    "log_format",
                    format!("{other:?} is neither text nor json"),
                ))
            }
        };
        let mut operation_timeouts = Timeouts::default();
        for entry in settings.operation_timeout.unwrap_or_default() {
            let (kind, seconds) = entry.split_once('=').ok_or_else(|| {
                invalid(
                    "operation_timeout",
                    format!("{entry:?} is not KIND=SECONDS"),
                )
            })?;
            let kind = OperationKind::from_name(kind).ok_or_else(|| {
                invalid(
                    "operation_timeout",
                    format!("{kind:?} is not an operation kind"),
                )
            })?;
            let seconds: u64 = seconds
                .parse()
                .ok()
                .filter(|s| (1..=86_400).contains(s))
                .ok_or_else(|| {
                    invalid(
                        "operation_timeout",
                        format!("{seconds:?} is not 1-86400 seconds"),
                    )
                })?;
            operation_timeouts.set(kind, std::time::Duration::from_secs(seconds));
        }
        let operation_history = settings
            .operation_history
            .unwrap_or(DEFAULT_OPERATION_HISTORY);
        if !(1..=10_000).contains(&operation_history) {
            return Err(invalid(
                "operation_history",
                format!("{operation_history} is outside 1..=10000"),
            ));
        }
        let scan_interval = settings
            .scan_interval
            .unwrap_or(DEFAULT_SCAN_INTERVAL_SECONDS);
        if !(1..=3600).contains(&scan_interval) {
            return Err(invalid(
                "scan_interval",
                format!("{scan_interval} is outside 1..=3600 seconds"),
            ));
        }
        let admin_text = settings
            .admin_listen
            .unwrap_or_else(|| DEFAULT_ADMIN_LISTEN.to_string());
        let admin_listen = admin_text.parse().map_err(|_| {
            invalid(
                "admin_listen",
                format!("{admin_text:?} is not an address of the form IP:PORT"),
            )
        })?;
        let compact_interval = match settings
            .compact_interval
            .unwrap_or(DEFAULT_COMPACT_INTERVAL_SECONDS)
        {
            0 => None,
            seconds if seconds >= 10 => Some(std::time::Duration::from_secs(seconds)),
            seconds => {
                return Err(invalid(
                    "compact_interval",
                    format!("{seconds} is below 10 seconds (0 disables compaction)"),
                ))
            }
        };
        let task_run_timeout = settings
            .task_run_timeout
            .unwrap_or(DEFAULT_TASK_RUN_TIMEOUT_SECONDS);
        if !TASK_RUN_TIMEOUT_RANGE.contains(&task_run_timeout) {
            return Err(invalid(
                "task_run_timeout",
                format!("{task_run_timeout} is outside 1..=604800 seconds"),
            ));
        }
        let handoff_grace = settings
            .handoff_grace
            .unwrap_or(DEFAULT_HANDOFF_GRACE_SECONDS);
        if !HANDOFF_GRACE_RANGE.contains(&handoff_grace) {
            return Err(invalid(
                "handoff_grace",
                format!("{handoff_grace} is outside 0..=86400 seconds"),
            ));
        }
        let security = SecuritySettings {
            tls_cert: settings.tls_cert,
            tls_key: settings.tls_key,
            tls_client_ca: settings.tls_client_ca,
            auth_tokens: settings.auth_tokens,
            etcd_ca: settings.etcd_ca,
            etcd_cert: settings.etcd_cert,
            etcd_key: settings.etcd_key,
            etcd_username: settings.etcd_username,
            etcd_password_file: settings.etcd_password_file,
        }
        .load(&etcd_endpoints)?;
        Ok(Config {
            security,
            task_run_timeout: std::time::Duration::from_secs(task_run_timeout),
            handoff_grace: std::time::Duration::from_secs(handoff_grace),
            compact_interval,
            admin_listen,
            scan_interval: std::time::Duration::from_secs(scan_interval),
            operation_timeouts,
            operation_history,
            listen,
            etcd_endpoints,
            key_prefix,
            lease_ttl_seconds,
            lease_margin,
            replica_id,
            provider: settings.provider,
            log_format,
        })
    }
}

/// The host name, when it is a usable replica id.
fn default_replica_id() -> Result<String, ConfigError> {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_default();
    if dns_label(&host).is_ok() {
        Ok(host)
    } else {
        Err(invalid(
            "replica_id",
            format!("the host name {host:?} is not a DNS-1123 label; set --replica-id"),
        ))
    }
}

fn check_url(setting: &'static str, url: &str) -> Result<(), ConfigError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| {
            invalid(
                setting,
                format!("{url:?} must start with http:// or https://"),
            )
        })?;
    let authority = rest.trim_end_matches('/');
    let port_ok = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok || authority.contains('/') {
        return Err(invalid(
            setting,
            format!("{url:?} must be of the form http://HOST:PORT"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        assert_eq!(config.lease_margin, std::time::Duration::from_secs(1));
        assert_eq!(config.log_format, LogFormat::Text);
    }

    /// Every setting left out takes the default its help text names.
    #[test]
    fn every_default_is_the_documented_one() {
        let config = Config::from_settings(settings()).unwrap();
        assert_eq!(config.etcd_endpoints, vec![DEFAULT_ETCD.to_string()]);
        assert_eq!(config.admin_listen.to_string(), DEFAULT_ADMIN_LISTEN);
        assert_eq!(config.replica_id, "r1");
        assert_eq!(config.provider, None);
        assert_eq!(config.operation_history, 50);
        assert_eq!(config.scan_interval, Duration::from_secs(10));
        assert_eq!(config.compact_interval, Some(Duration::from_secs(300)));
        assert_eq!(config.task_run_timeout, Duration::from_secs(86_400));
        assert_eq!(config.handoff_grace, Duration::from_secs(5));
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
                    provider: Some("http://host".into()),
                    ..settings()
                },
                "provider",
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

    #[test]
    fn unknown_file_keys_are_refused() {
        assert!(toml::from_str::<Settings>("lease_tll = 3").is_err());
    }
}
