//! The provider's configuration: where it keeps data, which version labels
//! map to which PostgreSQL binaries, what each offering means, which ports
//! nodes may use and which user runs PostgreSQL.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Settings an offering maps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offering {
    /// A PostgreSQL size, e.g. "16MB".
    pub shared_buffers: String,
    pub max_connections: u32,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Data directories, the state store and logs live here.
    pub root: PathBuf,
    /// Version label (MAJOR.MINOR.PATCH) to the directory of its binaries.
    pub versions: BTreeMap<String, PathBuf>,
    pub offerings: BTreeMap<String, Offering>,
    /// Node ports are taken from this range (inclusive).
    pub ports: (u16, u16),
    /// The user PostgreSQL runs as when the provider runs as root.
    pub run_as: String,
    /// Most standbys one cluster may have.
    pub max_workers: u32,
    /// Run PostgreSQL with fsync off: fast, and loses data on a machine
    /// crash. For tests only.
    pub unsafe_no_fsync: bool,
    /// A named step (e.g. `switchover.promoted`) at which the process
    /// aborts, as a crash there would: the tests' fault injection.
    pub fault_point: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--pg-version: {0:?} is not LABEL=BINDIR with LABEL like 15.0.0")]
    Version(String),
    #[error("--offering: {0:?} is not NAME=SHARED_BUFFERS:MAX_CONNECTIONS")]
    Offering(String),
    #[error("--port-range: {0:?} is not FROM-TO with FROM <= TO")]
    PortRange(String),
}

/// Parses `LABEL=BINDIR`; the label must be MAJOR.MINOR.PATCH, as Drover
/// requires of versions.
pub fn parse_version(s: &str) -> Result<(String, PathBuf), ConfigError> {
    let err = || ConfigError::Version(s.to_string());
    let (label, dir) = s.split_once('=').ok_or_else(err)?;
    let parts: Vec<&str> = label.split('.').collect();
    let numeric = parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok());
    if !numeric || dir.is_empty() {
        return Err(err());
    }
    Ok((label.to_string(), PathBuf::from(dir)))
}

/// Parses `NAME=SHARED_BUFFERS:MAX_CONNECTIONS`, e.g. `small=16MB:50`.
pub fn parse_offering(s: &str) -> Result<(String, Offering), ConfigError> {
    let err = || ConfigError::Offering(s.to_string());
    let (name, settings) = s.split_once('=').ok_or_else(err)?;
    let (buffers, conns) = settings.split_once(':').ok_or_else(err)?;
    let size_ok = !buffers.is_empty() && buffers.chars().all(|c| c.is_ascii_alphanumeric());
    let max_connections: u32 = conns.parse().map_err(|_| err())?;
    if name.is_empty() || !size_ok || max_connections == 0 {
        return Err(err());
    }
    let offering = Offering {
        shared_buffers: buffers.to_string(),
        max_connections,
    };
    Ok((name.to_string(), offering))
}

pub fn parse_port_range(s: &str) -> Result<(u16, u16), ConfigError> {
    let err = || ConfigError::PortRange(s.to_string());
    let (from, to) = s.split_once('-').ok_or_else(err)?;
    let from: u16 = from.parse().map_err(|_| err())?;
    let to: u16 = to.parse().map_err(|_| err())?;
    if from == 0 || from > to {
        return Err(err());
    }
    Ok((from, to))
}

/// Where the kernel takes the source ports of outgoing connections from
/// (Linux: `ip_local_port_range`, less `ip_local_reserved_ports`).
#[derive(Debug, PartialEq, Eq)]
pub struct OutgoingPorts {
    range: (u16, u16),
    reserved: Vec<(u16, u16)>,
}

impl OutgoingPorts {
    /// This machine's; `None` where they cannot be read.
    pub fn read() -> Option<Self> {
        let sysctl = |name| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"));
        let range = sysctl("ip_local_port_range").ok()?;
        let reserved = sysctl("ip_local_reserved_ports").unwrap_or_default();
        Self::parse(&range, &reserved)
    }

    /// `range` as "FROM TO", `reserved` as "PORT,FROM-TO,...".
    fn parse(range: &str, reserved: &str) -> Option<Self> {
        let mut bounds = range.split_whitespace().map(str::parse::<u16>);
        let range = match (bounds.next(), bounds.next()) {
            (Some(Ok(from)), Some(Ok(to))) if from <= to => (from, to),
            _ => return None,
        };
        let reserved = reserved
            .trim()
            .split(',')
            .filter_map(|item| match item.split_once('-') {
                Some((from, to)) => Some((from.parse().ok()?, to.parse().ok()?)),
                None => item.parse().ok().map(|port| (port, port)),
            })
            .collect();
        Some(Self { range, reserved })
    }

    /// How many of `ports` an outgoing connection may take as its source
    /// port: a node down for a moment (restarted, rebuilt) whose port one
    /// holds cannot start again until it lets go.
    pub fn shared_with(&self, ports: (u16, u16)) -> usize {
        let (from, to) = (ports.0.max(self.range.0), ports.1.min(self.range.1));
        (from..=to)
            .filter(|port| !self.reserved.iter().any(|&(a, b)| (a..=b).contains(port)))
            .count()
    }
}

/// The offerings used when none are configured.
pub fn default_offerings() -> BTreeMap<String, Offering> {
    [
        ("small", "16MB", 50),
        ("medium", "128MB", 100),
        ("large", "512MB", 200),
    ]
    .into_iter()
    .map(|(name, buffers, conns)| {
        let offering = Offering {
            shared_buffers: buffers.to_string(),
            max_connections: conns,
        };
        (name.to_string(), offering)
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_must_be_three_numbers() {
        assert!(parse_version("15.0.0=/pg/bin").is_ok());
        assert!(parse_version("15=/pg/bin").is_err());
        assert!(parse_version("15.0.x=/pg/bin").is_err());
        assert!(parse_version("15.0.0=").is_err());
    }

    #[test]
    fn offerings_and_ranges_parse_or_name_the_flag() {
        let (name, o) = parse_offering("tiny=8MB:20").unwrap();
        assert_eq!((name.as_str(), o.max_connections), ("tiny", 20));
        assert!(parse_offering("tiny=8MB").is_err());
        assert!(parse_offering("tiny=8MB;x:20").is_err());
        assert_eq!(parse_port_range("100-200"), Ok((100, 200)));
        assert!(parse_port_range("200-100").is_err());
    }

    #[test]
    fn node_ports_the_kernel_may_give_outgoing_connections_are_counted() {
        let linux = OutgoingPorts::parse("32768\t60999\n", "\n").unwrap();
        assert_eq!(linux.shared_with((54320, 54420)), 101);
        assert_eq!(linux.shared_with((32000, 32767)), 0);
        assert_eq!(linux.shared_with((32760, 32770)), 3);
        let reserved = OutgoingPorts::parse("32768 60999", "8080,54320-54419\n").unwrap();
        assert_eq!(reserved.shared_with((54320, 54420)), 1);
        assert_eq!(OutgoingPorts::parse("60999 32768", ""), None);
        assert_eq!(OutgoingPorts::parse("", ""), None);
    }
}
