//! The security settings: TLS (and client certificates) on the gRPC and
//! admin ports, the bearer-token file, and TLS and a user towards etcd. Every file is
//! read and checked while the configuration loads, before any port binds.
//!
//! Secrets (private keys, the etcd password) are held in [`Secret`], whose
//! `Debug` prints nothing, so no log line can carry them.

use super::admin_tls::AdminTls;
use super::{invalid, ConfigError};
use crate::auth::TokenFile;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A value that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> std::fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// TLS on the gRPC port.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Secret<Vec<u8>>,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl ServerTls {
    pub fn config(&self) -> tonic::transport::ServerTlsConfig {
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, self.key_pem.expose());
        let config = tonic::transport::ServerTlsConfig::new().identity(identity);
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(tonic::transport::Certificate::from_pem(ca)),
            None => config,
        }
    }
}

/// A PEM certificate and its private key.
pub type KeyPair = (Vec<u8>, Secret<Vec<u8>>);

/// TLS towards etcd.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    pub ca_pem: Vec<u8>,
    /// Client certificate and key, for etcd's `--client-cert-auth`.
    pub identity: Option<KeyPair>,
}

/// An etcd user (etcd's `auth enable`).
#[derive(Debug, Clone)]
pub struct EtcdUser {
    pub name: String,
    pub password: Secret<String>,
}

/// Everything security-related, validated.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub server_tls: Option<ServerTls>,
    /// The admin port's TLS, from `server_tls`: set exactly when it is.
    pub admin_tls: Option<AdminTls>,
    pub tokens: Option<TokenFile>,
    pub etcd_tls: Option<EtcdTls>,
    pub etcd_user: Option<EtcdUser>,
}

/// The security settings as given.
#[derive(Debug, Default)]
pub struct SecuritySettings {
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub auth_tokens: Option<PathBuf>,
    pub etcd_ca: Option<PathBuf>,
    pub etcd_cert: Option<PathBuf>,
    pub etcd_key: Option<PathBuf>,
    pub etcd_username: Option<String>,
    pub etcd_password_file: Option<PathBuf>,
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path)
        .map_err(|e| invalid(setting, format!("cannot read {}: {e}", path.display())))
}

fn pair(
    cert_setting: &'static str,
    key_setting: &'static str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<KeyPair>, ConfigError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some((
            read(cert_setting, &cert)?,
            Secret::new(read(key_setting, &key)?),
        ))),
        (Some(_), None) => Err(invalid(
            key_setting,
            format!("is required with {cert_setting}"),
        )),
        (None, Some(_)) => Err(invalid(
            cert_setting,
            format!("is required with {key_setting}"),
        )),
    }
}

impl SecuritySettings {
    /// Reads and checks every file; `etcd_endpoints` decide whether etcd
    /// is reached over TLS.
    pub fn load(self, etcd_endpoints: &[String]) -> Result<Security, ConfigError> {
        let server_tls = server_tls(self.tls_cert, self.tls_key, self.tls_client_ca)?;
        let admin_tls = server_tls
            .as_ref()
            .map(AdminTls::new)
            .transpose()
            .map_err(|e| invalid("tls_cert", format!("unusable on the admin port: {e}")))?;
        Ok(Security {
            server_tls,
            admin_tls,
            tokens: self.auth_tokens.map(|path| tokens(&path)).transpose()?,
            etcd_tls: etcd_tls(etcd_endpoints, self.etcd_ca, self.etcd_cert, self.etcd_key)?,
            etcd_user: etcd_user(self.etcd_username, self.etcd_password_file)?,
        })
    }
}

/// The gRPC port's certificate, key and (for mTLS) client CA, parsed now
/// rather than at bind.
fn server_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<ServerTls>, ConfigError> {
    let Some((cert_pem, key_pem)) = pair("tls_cert", "tls_key", cert, key)? else {
        if client_ca.is_some() {
            return Err(invalid("tls_client_ca", "needs tls_cert and tls_key"));
        }
        return Ok(None);
    };
    let client_ca_pem = client_ca
        .map(|path| read("tls_client_ca", &path))
        .transpose()?;
    let tls = ServerTls {
        cert_pem,
        key_pem,
        client_ca_pem,
    };
    tonic::transport::Server::builder()
        .tls_config(tls.config())
        .map_err(|e| invalid("tls_cert", format!("unusable certificate or key: {e}")))?;
    Ok(Some(tls))
}

/// Plain HTTP on the admin port (no `tls_cert`) only on loopback, unless
/// `admin_plain_http` says so: off loopback the console's bearer tokens
/// would cross the network in clear text.
pub(super) fn admin_plain_http(
    admin_listen: SocketAddr,
    plain_http: bool,
    security: &Security,
) -> Result<(), ConfigError> {
    if security.admin_tls.is_some() || plain_http || admin_listen.ip().is_loopback() {
        return Ok(());
    }
    Err(invalid(
        "admin_listen",
        format!(
            "{admin_listen} is not loopback and there is no TLS: the console's tokens would \
             cross the network in clear text; give tls_cert and tls_key (the admin port then \
             serves HTTPS), or --admin-plain-http (DROVER_ADMIN_PLAIN_HTTP=on) to serve plain \
             HTTP there anyway"
        ),
    ))
}

fn tokens(path: &Path) -> Result<TokenFile, ConfigError> {
    let text = String::from_utf8(read("auth_tokens", path)?)
        .map_err(|_| invalid("auth_tokens", "is not UTF-8"))?;
    TokenFile::parse(&text).map_err(|e| invalid("auth_tokens", format!("{}: {e}", path.display())))
}

/// TLS to etcd: all endpoints https:// with a CA (and optionally a client
/// certificate), or none.
fn etcd_tls(
    endpoints: &[String],
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<EtcdTls>, ConfigError> {
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if https != 0 && https != endpoints.len() {
        return Err(invalid(
            "etcd_endpoints",
            "mixes http:// and https:// endpoints",
        ));
    }
    let identity = pair("etcd_cert", "etcd_key", cert, key)?;
    match ca {
        Some(ca) if https > 0 => Ok(Some(EtcdTls {
            ca_pem: read("etcd_ca", &ca)?,
            identity,
        })),
        Some(_) => Err(invalid("etcd_ca", "needs https:// etcd endpoints")),
        None if https > 0 => Err(invalid(
            "etcd_ca",
            "is required with https:// etcd endpoints (the CA that signed etcd's certificate)",
        )),
        None if identity.is_some() => {
            Err(invalid("etcd_cert", "needs etcd_ca and https:// endpoints"))
        }
        None => Ok(None),
    }
}

/// etcd's own authentication: a user name and a password file, both or
/// neither.
fn etcd_user(
    name: Option<String>,
    password_file: Option<PathBuf>,
) -> Result<Option<EtcdUser>, ConfigError> {
    match (name, password_file) {
        (None, None) => Ok(None),
        (Some(name), Some(path)) => {
            let password = String::from_utf8(read("etcd_password_file", &path)?)
                .map_err(|_| invalid("etcd_password_file", "is not UTF-8"))?
                .trim_end_matches(['\n', '\r'])
                .to_string();
            if name.is_empty() || password.is_empty() {
                return Err(invalid(
                    "etcd_username",
                    "the user name and the password file must not be empty",
                ));
            }
            Ok(Some(EtcdUser {
                name,
                password: Secret::new(password),
            }))
        }
        (Some(_), None) => Err(invalid(
            "etcd_password_file",
            "is required with etcd_username",
        )),
        (None, Some(_)) => Err(invalid(
            "etcd_username",
            "is required with etcd_password_file",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let user = EtcdUser {
            name: "drover".into(),
            password: Secret::new("hunter2".into()),
        };
        let printed = format!("{user:?}");
        assert!(
            printed.contains("drover") && !printed.contains("hunter2"),
            "{printed}"
        );
    }

    /// Plain HTTP on the admin port: on loopback, or off it when asked
    /// for; otherwise one line naming the flag that allows it.
    #[test]
    fn plain_http_off_loopback_needs_the_flag() {
        let none = Security::default();
        let loopback = "127.0.0.1:9070".parse().unwrap();
        let v6_loopback = "[::1]:9070".parse().unwrap();
        let wildcard = "0.0.0.0:9070".parse().unwrap();
        assert!(admin_plain_http(loopback, false, &none).is_ok());
        assert!(admin_plain_http(v6_loopback, false, &none).is_ok());
        assert!(admin_plain_http(wildcard, true, &none).is_ok());
        let error = admin_plain_http(wildcard, false, &none).unwrap_err();
        assert_eq!(error.setting, "admin_listen");
        let message = error.to_string();
        assert!(message.contains("--admin-plain-http"), "{message}");
        assert!(message.contains("tls_cert") && !message.contains('\n'));
    }

    #[test]
    fn half_given_pairs_name_the_missing_setting() {
        let only_cert = SecuritySettings {
            tls_cert: Some("/nonexistent".into()),
            ..Default::default()
        };
        assert_eq!(only_cert.load(&[]).unwrap_err().setting, "tls_key");
        let only_user = SecuritySettings {
            etcd_username: Some("u".into()),
            ..Default::default()
        };
        assert_eq!(
            only_user.load(&[]).unwrap_err().setting,
            "etcd_password_file"
        );
        let https_without_ca = SecuritySettings::default();
        let endpoints = ["https://127.0.0.1:2379".to_string()];
        assert_eq!(
            https_without_ca.load(&endpoints).unwrap_err().setting,
            "etcd_ca"
        );
    }
}
