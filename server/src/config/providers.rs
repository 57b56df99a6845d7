//! The providers a replica reaches: `provider` entries of the form
//! `[NAME=]URL[,OPTION=VALUE...]` and the `default_provider` among them.
//!
//! Options, for the link to that provider:
//! - `ca=FILE`: PEM CA its certificate must chain to (https only; without
//!   it the system's roots).
//! - `cert=FILE`, `key=FILE`: this replica's client certificate and key
//!   (mutual TLS; https only; both or neither).
//! - `token-file=FILE`: a bearer token sent as `authorization: Bearer ...`
//!   on every call (the file's first line).
//!
//! # Guarantees
//! - Every file is read and every certificate parsed here, before any port
//!   binds: a link that could not work is a configuration error naming the
//!   setting and the file, not a stream of failed calls later.
//! - Names are DNS-1123 labels, unique; a bare URL is the provider named
//!   `default`.
//! - Exactly one provider is the default: the one `default_provider`
//!   names, or the only one, or the one named `default`; anything else is
//!   an error naming `default_provider`.
//!
//! # Caveats
//! - A bearer token over http:// travels in the clear; it is allowed (a
//!   loopback provider) and logged as a warning at start.

use super::security::{KeyPair, Secret};
use super::{invalid, ConfigError};
use crate::names::dns_label;
use std::path::Path;

/// The name of the provider a bare URL configures.
pub const DEFAULT_NAME: &str = "default";

/// One provider and how to reach it, files read.
#[derive(Debug, Clone)]
pub struct ProviderLink {
    pub name: String,
    pub endpoint: String,
    /// The CA its certificate must chain to; `None` over https: the
    /// system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (mutual TLS).
    pub identity: Option<KeyPair>,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub token: Option<Secret<String>>,
}

impl ProviderLink {
    /// Whether the link uses TLS.
    pub fn tls(&self) -> bool {
        self.endpoint.starts_with("https://")
    }

    /// The transport endpoint: TLS over https (this link's CA, or the
    /// system's roots), with the client certificate when there is one.
    /// Parses the certificates, so the configuration calls it to check them.
    pub fn transport(&self) -> Result<tonic::transport::Endpoint, String> {
        let endpoint = tonic::transport::Endpoint::from_shared(self.endpoint.clone())
            .map_err(|e| e.to_string())?;
        if !self.tls() {
            return Ok(endpoint);
        }
        let tls = tonic::transport::ClientTlsConfig::new();
        let tls = match &self.ca_pem {
            Some(ca) => tls.ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        let tls = match &self.identity {
            Some((cert, key)) => {
                tls.identity(tonic::transport::Identity::from_pem(cert, key.expose()))
            }
            None => tls,
        };
        endpoint.tls_config(tls).map_err(|e| {
            // The transport error's own text is terse; its source says why.
            let source = std::error::Error::source(&e).map(|s| format!(": {s}"));
            format!("{e}{}", source.unwrap_or_default())
        })
    }
}

/// Every configured provider (at least one) and which is the default.
#[derive(Debug, Clone)]
pub struct ProviderLinks {
    /// In name order.
    pub links: Vec<ProviderLink>,
    /// The name of the default one; one of `links`.
    pub default: String,
}

/// The `provider` rule: each entry parsed and its files read; no default.
pub(super) fn providers(
    setting: &'static str,
    given: Option<Vec<String>>,
) -> Result<Vec<ProviderLink>, ConfigError> {
    let mut links: Vec<ProviderLink> = Vec::new();
    for entry in given.unwrap_or_default() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let link = parse(setting, entry)?;
        if links.iter().any(|l| l.name == link.name) {
            return Err(invalid(
                setting,
                format!("provider {:?} is configured twice", link.name),
            ));
        }
        links.push(link);
    }
    links.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(links)
}

/// The default among `links`, or `None` when there are no providers.
pub(super) fn with_default(
    links: Vec<ProviderLink>,
    default: Option<String>,
) -> Result<Option<ProviderLinks>, ConfigError> {
    const SETTING: &str = "default_provider";
    let names = || {
        links
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let default = match default {
        _ if links.is_empty() && default.is_some() => {
            return Err(invalid(SETTING, "names a provider but no provider is set"))
        }
        _ if links.is_empty() => return Ok(None),
        Some(name) if links.iter().any(|l| l.name == name) => name,
        Some(name) => {
            return Err(invalid(
                SETTING,
                format!("{name:?} is not a configured provider ({})", names()),
            ))
        }
        None if links.len() == 1 => links[0].name.clone(),
        None if links.iter().any(|l| l.name == DEFAULT_NAME) => DEFAULT_NAME.to_string(),
        None => {
            return Err(invalid(
                SETTING,
                format!(
                "is required with several providers and none named {DEFAULT_NAME:?} (one of {})",
                names()
            ),
            ))
        }
    };
    Ok(Some(ProviderLinks { links, default }))
}

/// One `[NAME=]URL[,OPTION=VALUE...]`.
fn parse(setting: &'static str, entry: &str) -> Result<ProviderLink, ConfigError> {
    let mut parts = entry.split(',');
    let head = parts.next().unwrap_or_default().trim();
    let (name, endpoint) = if head.starts_with("http://") || head.starts_with("https://") {
        (DEFAULT_NAME, head)
    } else {
        head.split_once('=')
            .ok_or_else(|| invalid(setting, format!("{head:?} is neither NAME=URL nor a URL")))?
    };
    dns_label(name)
        .map_err(|reason| invalid(setting, format!("provider name {name:?}: {reason}")))?;
    super::rules::check_url(setting, endpoint)?;
    let mut link = ProviderLink {
        name: name.to_string(),
        endpoint: endpoint.to_string(),
        ca_pem: None,
        identity: None,
        token: None,
    };
    let (mut cert, mut key) = (None, None);
    for option in parts {
        let (option, value) = option.trim().split_once('=').ok_or_else(|| {
            invalid(
                setting,
                format!("{name}: option {option:?} is not of the form OPTION=VALUE"),
            )
        })?;
        let path = Path::new(value);
        match option {
            "ca" => link.ca_pem = Some(certificate(setting, name, path)?),
            "cert" => cert = Some(certificate(setting, name, path)?),
            "key" => key = Some(Secret::new(read(setting, name, path)?)),
            "token-file" => link.token = Some(token(setting, name, path)?),
            other => {
                return Err(invalid(
                    setting,
                    format!("{name}: unknown option {other:?} (ca, cert, key, token-file)"),
                ))
            }
        }
    }
    link.identity = match (cert, key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => {
            return Err(invalid(
                setting,
                format!("{name}: cert and key go together"),
            ))
        }
    };
    if !link.tls() && (link.ca_pem.is_some() || link.identity.is_some()) {
        return Err(invalid(
            setting,
            format!("{name}: ca, cert and key need an https:// endpoint"),
        ));
    }
    link.transport().map_err(|e| {
        invalid(
            setting,
            format!("{name}: unusable certificate, key or CA: {e}"),
        )
    })?;
    Ok(link)
}

fn read(setting: &'static str, name: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| {
        invalid(
            setting,
            format!("{name}: cannot read {}: {e}", path.display()),
        )
    })
}

/// A PEM file holding a certificate. Checked here because a CA file with
/// none would leave the link trusting nothing (every call failing), not
/// fail the TLS set-up.
fn certificate(setting: &'static str, name: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let pem = read(setting, name, path)?;
    let marker = b"-----BEGIN CERTIFICATE-----";
    if !pem.windows(marker.len()).any(|w| w == marker) {
        return Err(invalid(
            setting,
            format!("{name}: {} holds no PEM certificate", path.display()),
        ));
    }
    Ok(pem)
}

/// The token file's first line: printable ASCII, as a header value must be.
fn token(setting: &'static str, name: &str, path: &Path) -> Result<Secret<String>, ConfigError> {
    let text = String::from_utf8(read(setting, name, path)?).unwrap_or_default();
    let token = text.lines().next().unwrap_or_default().trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            setting,
            format!(
                "{name}: {} holds no token (one line of printable ASCII)",
                path.display()
            ),
        ));
    }
    Ok(Secret::new(token.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(entries: &[&str], default: Option<&str>) -> Result<Option<ProviderLinks>, ConfigError> {
        let given = entries.iter().map(|e| e.to_string()).collect();
        with_default(
            providers("provider", Some(given))?,
            default.map(str::to_string),
        )
    }

    #[test]
    fn a_bare_url_is_the_default_provider() {
        let links = load(&["http://127.0.0.1:7080"], None).unwrap().unwrap();
        assert_eq!(links.default, "default");
        assert_eq!(links.links[0].name, "default");
        assert_eq!(links.links[0].endpoint, "http://127.0.0.1:7080");
    }

    #[test]
    fn the_default_is_named_or_the_only_one_or_the_one_named_default() {
        let two = ["sim=http://127.0.0.1:1", "pg=http://127.0.0.1:2"];
        assert_eq!(load(&two, Some("pg")).unwrap().unwrap().default, "pg");
        assert_eq!(load(&two[..1], None).unwrap().unwrap().default, "sim");
        let with_default = ["sim=http://127.0.0.1:1", "http://127.0.0.1:2"];
        assert_eq!(
            load(&with_default, None).unwrap().unwrap().default,
            "default"
        );
        let ambiguous = load(&two, None).unwrap_err();
        assert_eq!(ambiguous.setting, "default_provider", "{ambiguous}");
        assert!(ambiguous.to_string().contains("pg, sim"), "{ambiguous}");
        let unknown = load(&two, Some("aws")).unwrap_err();
        assert_eq!(unknown.setting, "default_provider", "{unknown}");
        assert_eq!(
            load(&[], Some("pg")).unwrap_err().setting,
            "default_provider"
        );
        assert!(load(&[], None).unwrap().is_none());
    }

    #[test]
    fn bad_entries_name_the_setting_and_say_why() {
        let cases = [
            ("Sim=http://127.0.0.1:1", "DNS-1123"),
            ("sim=127.0.0.1:1", "http://"),
            ("sim", "neither NAME=URL nor a URL"),
            ("sim=http://127.0.0.1:1,colour=red", "unknown option"),
            ("sim=http://127.0.0.1:1,ca", "OPTION=VALUE"),
            (
                "sim=http://127.0.0.1:1,token-file=/nonexistent/t",
                "/nonexistent/t",
            ),
            (
                "sim=https://127.0.0.1:1,ca=/nonexistent/ca.pem",
                "/nonexistent/ca.pem",
            ),
        ];
        for (entry, says) in cases {
            let error = load(&[entry], None).unwrap_err();
            assert_eq!(error.setting, "provider", "{entry}: {error}");
            assert!(error.to_string().contains(says), "{entry}: {error}");
        }
        let twice = load(&["http://127.0.0.1:1", "default=http://127.0.0.1:2"], None);
        assert!(twice.unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn tls_options_need_https_and_come_in_pairs() {
        let dir = std::env::temp_dir().join(format!("drover-providers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("x.pem");
        std::fs::write(&file, "-----BEGIN CERTIFICATE-----\nx\n").unwrap();
        let file = file.display();
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "x").unwrap();
        let plain_ca = load(&[&format!("p=http://127.0.0.1:1,ca={file}")], None).unwrap_err();
        assert!(plain_ca.to_string().contains("https://"), "{plain_ca}");
        let half = load(&[&format!("p=https://127.0.0.1:1,key={file}")], None).unwrap_err();
        assert!(half.to_string().contains("go together"), "{half}");
        let ca = format!("p=https://127.0.0.1:1,ca={}", garbage.display());
        let not_pem = load(&[&ca], None).unwrap_err();
        assert!(
            not_pem.to_string().contains("no PEM certificate"),
            "{not_pem}"
        );
        let token = dir.join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let entry = format!("p=https://127.0.0.1:1,token-file={}", token.display());
        let links = load(&[&entry], None).unwrap().unwrap();
        assert_eq!(links.links[0].token.as_ref().unwrap().expose(), "s3cret");
        assert!(links.links[0].tls());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
