//! The deadline of a fenced provider call, as a provider reads it: the
//! earlier of the gRPC deadline (`grpc-timeout`, time left) and Drover's
//! wall-clock one ([`APPLY_BY`], milliseconds since the Unix epoch). See
//! the Deadlines paragraph of `provider.proto`. One reading for every Rust
//! provider (the simulator, the PostgreSQL provider) and the conformance
//! kit, so they cannot disagree on what a deadline is.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::metadata::MetadataMap;

/// The metadata key of a provider call's deadline as wall-clock time.
pub const APPLY_BY: &str = "drover-apply-by";

/// The time left of a call whose metadata is `metadata`: the earlier of its
/// two deadlines, if it has either.
pub fn time_left(metadata: &MetadataMap) -> Option<Duration> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let apply_by = metadata
        .get(APPLY_BY)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(|at| Duration::from_millis(at.saturating_sub(now_ms)));
    match (grpc_timeout(metadata), apply_by) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The `grpc-timeout` header as time left (digits and a unit, H M S m u n),
/// if there is one.
pub fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(key: &'static str, value: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert(key, value.parse().unwrap());
        metadata
    }

    #[test]
    fn a_grpc_deadline_reads_in_every_unit() {
        let left = |value: &str| time_left(&with("grpc-timeout", value));
        assert_eq!(left("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(left("2S"), Some(Duration::from_secs(2)));
        assert_eq!(left("3M"), Some(Duration::from_secs(180)));
        assert_eq!(left("7u"), Some(Duration::from_micros(7)));
        assert_eq!(left("x"), None);
        assert_eq!(time_left(&MetadataMap::new()), None);
    }

    #[test]
    fn the_earlier_of_the_two_deadlines_counts() {
        let mut metadata = with("grpc-timeout", "60S");
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let apply_by = (now_ms + 1_000).to_string();
        metadata.insert(APPLY_BY, apply_by.parse().unwrap());
        let left = time_left(&metadata).unwrap();
        assert!(left <= Duration::from_secs(1), "{left:?}");
    }
}
