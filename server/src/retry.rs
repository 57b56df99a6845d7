//! The waits between attempts, from one well-kept crate (`backon`)
//! instead of a doubling loop written again at every retry site.
//!
//! Each is a delay that doubles from a first wait up to a cap, without
//! jitter (the logs' `retry_in` and the tests' timings stay as they read)
//! and without a count: the caller decides when to give up (a claim lost,
//! a deadline, a shutdown).

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;

/// Waits of `first`, then twice as long each time, at most `max`.
pub fn doubling(first: Duration, max: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(max)
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_stay_there() {
        let ms = Duration::from_millis;
        // backon multiplies in floating point: whole milliseconds compared.
        let waits = doubling(ms(100), ms(500)).take(5).map(|d| d.as_millis());
        assert_eq!(waits.collect::<Vec<_>>(), [100, 200, 400, 500, 500]);
    }
}
