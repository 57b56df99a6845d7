//! The form of the names Drover puts into etcd keys: cluster names (checked
//! by the API) and replica ids (checked by the configuration) are DNS-1123
//! labels.
//!
//! A leaf: it imports nothing from the crate, so the configuration does not
//! depend on the cluster layer for this one rule.
//!
//! # Guarantees
//! - A name that passes is 1-63 characters of `a-z`, `0-9` and `-`, starting
//!   and ending with a letter or digit, so it contains no `/` and cannot
//!   reach outside its key.

/// Why `name` is not a DNS-1123 label, if it is not; the reason does not
/// name the setting or field, which the caller adds.
pub fn dns_label(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is required".into());
    }
    if name.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    let valid_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let alnum_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid_chars || !alnum_ends {
        return Err(format!(
            "{name:?} is not a DNS-1123 label (lower-case letters, digits and '-', \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}
