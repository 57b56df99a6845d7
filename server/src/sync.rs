//! Locking a mutex a panic poisoned: a panic while holding a lock cannot leave
//! what it guards half-updated in a way later calls would misread, so poisoning is ignored.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, taking it over from a holder that panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
