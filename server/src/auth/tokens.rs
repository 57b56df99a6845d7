//! The token file: TOML, one `[[token]]` per caller with its name, role and
//! the SHA-256 of the token (hex); the tokens themselves are never stored.
//!
//! ```toml
//! [[token]]
//! name = "ci"
//! role = "operator"
//! sha256 = "<the output of: printf %s "$TOKEN" | drover hash-token>"
//! ```

use super::Role;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashSet;

/// SHA-256 of a token.
pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// One caller.
#[derive(Debug, Clone)]
pub struct TokenSpec {
    pub name: String,
    pub role: Role,
    pub digest: [u8; 32],
}

/// A validated token file.
#[derive(Debug, Clone)]
pub struct TokenFile {
    tokens: Vec<TokenSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    token: Vec<RawToken>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: String,
    role: Role,
    sha256: String,
}

impl TokenFile {
    /// Parses and checks a token file: at least one token, names unique,
    /// each digest 64 hex digits and used once.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: RawFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
        if raw.token.is_empty() {
            return Err("no [[token]] entries".into());
        }
        let (mut names, mut digests) = (HashSet::new(), HashSet::new());
        let mut tokens = Vec::new();
        for (i, token) in raw.token.into_iter().enumerate() {
            if token.name.is_empty() || !names.insert(token.name.clone()) {
                return Err(format!("token[{i}].name: empty or used twice"));
            }
            let digest: [u8; 32] = hex::decode(token.sha256.trim())
                .ok()
                .and_then(|bytes| bytes.try_into().ok())
                .ok_or_else(|| {
                    format!(
                        "token[{i}].sha256: not 64 hex digits (the SHA-256 of the token, not the token)"
                    )
                })?;
            if !digests.insert(digest) {
                return Err(format!("token[{i}].sha256: the same token is listed twice"));
            }
            tokens.push(TokenSpec {
                name: token.name,
                role: token.role,
                digest,
            });
        }
        Ok(Self { tokens })
    }

    pub fn tokens(&self) -> &[TokenSpec] {
        &self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_are_checked() {
        let digest = hex::encode(hash_token("t"));
        let good = format!("[[token]]\nname = \"a\"\nrole = \"admin\"\nsha256 = \"{digest}\"\n");
        assert_eq!(
            TokenFile::parse(&good).unwrap().tokens()[0].role,
            Role::Admin
        );
        assert!(TokenFile::parse("").is_err());
        let twice = format!("{good}{good}");
        assert!(TokenFile::parse(&twice).unwrap_err().contains("name"));
        let plain = "[[token]]\nname = \"a\"\nrole = \"admin\"\nsha256 = \"t\"\n";
        assert!(TokenFile::parse(plain).unwrap_err().contains("sha256"));
        let bad_role = format!("[[token]]\nname = \"a\"\nrole = \"root\"\nsha256 = \"{digest}\"\n");
        assert!(TokenFile::parse(&bad_role).is_err());
    }
}
