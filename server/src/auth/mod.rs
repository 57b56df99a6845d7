//! Who may call what: bearer tokens with the roles viewer, operator and
//! admin, checked on every RPC by one tower layer in front of all services.
//!
//! # Guarantees
//! - Every drover.v1 RPC has a role in [`all_rpc_roles`] ([`RPC_ROLES`] and
//!   each operation kind's own; a unit test checks it against the proto
//!   descriptors); a path in neither needs admin.
//! - Only health checks and server reflection (the schema, no data) are
//!   open, so load balancers and probes work without a token.
//! - Tokens are stored and compared as SHA-256 digests; no token and no
//!   digest is ever logged, only the token's name.
//! - Every request that changes something ([`changes_something`]) is
//!   written to the audit log ([`crate::audit`]): here when it is refused,
//!   else by its handler, with the caller this layer identified (the
//!   token's name and role, the client certificate's subject).
//!
//! # Assumptions
//! - Tokens travel over TLS (`--tls-cert`); over plaintext they can be
//!   sniffed like any bearer credential.

mod layer;
mod roles;
mod tokens;

pub use layer::{AuthLayer, Authorized};
pub use roles::{all_rpc_roles, changes_something, required_role, Access, Role, RPC_ROLES};
pub use tokens::{hash_token, TokenFile, TokenSpec};

use crate::audit::Caller;
use std::collections::HashMap;
use tonic::codegen::http::HeaderMap;
use tonic::Status;

/// Checks credentials against the token file, or lets everything through
/// when Drover runs without one.
pub struct Authenticator {
    /// Digest -> (token name, role); `None` when authentication is off.
    tokens: Option<HashMap<[u8; 32], (String, Role)>>,
}

impl Authenticator {
    /// No authentication: every caller may do everything.
    pub fn open() -> Self {
        Self { tokens: None }
    }

    pub fn from_tokens(file: &TokenFile) -> Self {
        let tokens = file
            .tokens()
            .iter()
            .map(|t| (t.digest, (t.name.clone(), t.role)))
            .collect();
        Self {
            tokens: Some(tokens),
        }
    }

    /// Whether the caller presenting `headers` may call `path`
    /// (`/drover.v1.Clusters/CreateCluster`).
    pub fn check(&self, path: &str, headers: &HeaderMap) -> Result<(), Status> {
        self.identify(path, headers, None).1
    }

    /// Who the caller presenting `headers` (and the client certificate
    /// whose subject is `subject`) is, and whether they may call `path`.
    pub fn identify(
        &self,
        path: &str,
        headers: &HeaderMap,
        subject: Option<String>,
    ) -> (Caller, Result<(), Status>) {
        let mut caller = Caller {
            name: None,
            role: "anonymous".into(),
            subject,
            replica: None,
        };
        let (Some(tokens), Access::Needs(needed)) = (&self.tokens, required_role(path)) else {
            return (caller, Ok(()));
        };
        caller.role = "unauthenticated".into();
        let (name, role) = match token(tokens, path, headers) {
            Ok(found) => found,
            Err(status) => return (caller, Err(status)),
        };
        caller.name = Some(name.clone());
        caller.role = role.to_string();
        if role < needed {
            tracing::info!(path, token = %name, role = %role, needed = %needed, "permission denied");
            let denied = Status::permission_denied(format!(
                "token {name:?} has role {role}; {} needs {needed}",
                path.trim_start_matches('/')
            ));
            return (caller, Err(denied));
        }
        (caller, Ok(()))
    }
}

/// The name and role of the bearer token in `headers`.
fn token<'a>(
    tokens: &'a HashMap<[u8; 32], (String, Role)>,
    path: &str,
    headers: &HeaderMap,
) -> Result<(&'a String, Role), Status> {
    let presented = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .ok_or_else(|| {
            Status::unauthenticated(
                "a bearer token is required (metadata authorization: Bearer <token>)",
            )
        })?;
    let (name, role) = tokens.get(&hash_token(presented)).ok_or_else(|| {
        tracing::info!(path, "refused an unknown bearer token");
        Status::unauthenticated("the bearer token is not valid for this deployment")
    })?;
    Ok((name, *role))
}

/// The subject of a DER client certificate (`CN=laptop, O=ops`), as the
/// audit log names the caller; `None` when it does not parse.
fn certificate_subject(der: &[u8]) -> Option<String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(certificate.subject().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::http::HeaderValue;

    fn authenticator() -> Authenticator {
        let file = TokenFile::parse(&format!(
            "[[token]]\nname = \"dashboards\"\nrole = \"viewer\"\nsha256 = \"{}\"\n",
            hex::encode(hash_token("s3cret"))
        ))
        .unwrap();
        Authenticator::from_tokens(&file)
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        headers
    }

    #[test]
    fn roles_are_enforced_and_messages_name_no_secret() {
        let auth = authenticator();
        let read = "/drover.v1.Clusters/GetCluster";
        let write = "/drover.v1.Clusters/StopCluster";
        assert!(auth.check(read, &bearer("s3cret")).is_ok());
        let denied = auth.check(write, &bearer("s3cret")).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("dashboards") && !denied.message().contains("s3cret"));
        let unknown = auth.check(read, &bearer("guess")).unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::Unauthenticated);
        let missing = auth.check(read, &HeaderMap::new()).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(auth
            .check("/grpc.health.v1.Health/Check", &HeaderMap::new())
            .is_ok());
        assert!(Authenticator::open()
            .check(write, &HeaderMap::new())
            .is_ok());
    }

    #[test]
    fn the_caller_is_named_by_the_token_and_never_by_its_secret() {
        let auth = authenticator();
        let write = "/drover.v1.Clusters/StopCluster";
        let (caller, verdict) = auth.identify(write, &bearer("s3cret"), Some("CN=laptop".into()));
        assert_eq!(verdict.unwrap_err().code(), tonic::Code::PermissionDenied);
        assert_eq!(caller.name.as_deref(), Some("dashboards"));
        assert_eq!(caller.role, "viewer");
        assert_eq!(caller.subject.as_deref(), Some("CN=laptop"));
        let (caller, _) = auth.identify(write, &bearer("guess"), None);
        assert_eq!(
            (caller.name, caller.role.as_str()),
            (None, "unauthenticated")
        );
        let (caller, verdict) = Authenticator::open().identify(write, &HeaderMap::new(), None);
        assert!(verdict.is_ok());
        assert_eq!(caller.role, "anonymous");
    }
}
