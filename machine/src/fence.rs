//! The provider's fencing rule.

/// Whether a provider admits a call whose fencing token carries `epoch`,
/// given `newest`, the newest epoch it has seen for that cluster (`None`:
/// none yet). A token older than the newest is refused; an equal or newer
/// one is admitted and becomes the newest. The simulator applies this to
/// every call and fenced read, and the model checks its protocol against it.
pub fn fence_admits(newest: Option<i64>, epoch: i64) -> bool {
    newest.is_none_or(|newest| epoch >= newest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_older_epoch_is_refused() {
        assert!(fence_admits(None, 1));
        assert!(fence_admits(None, i64::MIN));
        assert!(fence_admits(Some(5), 5));
        assert!(fence_admits(Some(5), 6));
        assert!(!fence_admits(Some(5), 4));
        assert!(!fence_admits(Some(i64::MAX), 0));
    }
}
