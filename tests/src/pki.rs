//! A throwaway certificate authority for TLS tests: a CA, server
//! certificates for loopback and client certificates, written as PEM files
//! into a temporary directory.

use crate::TempDir;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use std::path::PathBuf;

pub struct Pki {
    dir: TempDir,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

/// A certificate and its key, as files and as PEM.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl Pki {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "drover test CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = params.self_signed(&ca_key).expect("CA certificate");
        let dir = TempDir::new("pki");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write CA");
        Self { dir, ca, ca_key }
    }

    /// The CA certificate file.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        self.ca.pem().into_bytes()
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, name: &str) -> Issued {
        self.issue(
            name,
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Issued {
        self.issue(name, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A replica's certificate for 127.0.0.1 and localhost, for server and
    /// client authentication: with `--tls-client-ca` it is also the one a
    /// replica presents to its peers' `/liveness`.
    pub fn replica(&self, name: &str) -> Issued {
        let sans = vec!["127.0.0.1".into(), "localhost".into()];
        let usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.issue_for(name, sans, usages)
    }

    fn issue(&self, name: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Issued {
        self.issue_for(name, sans, vec![usage])
    }

    fn issue_for(
        &self,
        name: &str,
        sans: Vec<String>,
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> Issued {
        let mut params = CertificateParams::new(sans).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages;
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("sign");
        let (cert_path, key_path) = (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Issued {
            cert: cert_path,
            key: key_path,
            cert_pem: cert.pem().into_bytes(),
            key_pem: key.serialize_pem().into_bytes(),
        }
    }

    /// The PKI's directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// A file in the PKI's directory (for token and password files).
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).expect("write file");
        path
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
