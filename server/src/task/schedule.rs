//! Schedules: start dates, activations (cron in a time zone, a fixed
//! interval, or once) and retry back-off.
//!
//! Times are UTC instants; cron is evaluated in the task's time zone.

use super::TaskSchedule;
use chrono::{DateTime, SecondsFormat, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use std::time::Duration;

pub const DEFAULT_RETRY_WAIT: Duration = Duration::from_secs(600);
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(3 * 3600);

/// A start date as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartDate {
    /// `now`, or `now+<offset>`.
    Now(Duration),
    At(DateTime<Utc>),
}

/// How far ahead a start date may lie: beyond it, the arithmetic of
/// activations leaves the range of dates (a start of `now+1000000y` used to
/// crash the owner's scheduler).
const MAX_START_AHEAD_DAYS: i64 = 100 * 366;

/// Parses `""`, `now`, `now+3d2h` or an RFC 3339 time.
pub fn parse_start(text: &str) -> Result<StartDate, String> {
    let text = text.trim();
    if text.is_empty() || text == "now" {
        return Ok(StartDate::Now(Duration::ZERO));
    }
    if let Some(offset) = text.strip_prefix("now+") {
        return parse_duration(offset).map(StartDate::Now);
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| StartDate::At(t.with_timezone(&Utc)))
        .map_err(|_| format!("{text:?} is neither RFC 3339, \"now\" nor \"now+<duration>\""))
}

/// The instant a start date names, with `now` evaluated at `now`; at most
/// 100 years ahead of `now`.
pub fn evaluate_start(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let latest = now + chrono::Duration::days(MAX_START_AHEAD_DAYS);
    let start = match parse_start(text)? {
        StartDate::Now(offset) => chrono::Duration::from_std(offset)
            .ok()
            .and_then(|offset| now.checked_add_signed(offset)),
        StartDate::At(at) => Some(at),
    };
    start
        .filter(|start| *start <= latest)
        .ok_or_else(|| format!("{text:?} is more than 100 years ahead"))
}

/// A duration such as `10m`, `24h` or `3d2h`; empty is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if text.trim().is_empty() {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration (e.g. 10m, 24h, 3d2h): {e}"))
}

/// A five-field cron expression (no seconds, no year).
pub fn parse_cron(text: &str) -> Result<Cron, String> {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(text)
        .map_err(|e| format!("{text:?} is not a cron expression: {e}"))
}

/// A time zone by its IANA name; empty is UTC.
pub fn parse_timezone(text: &str) -> Result<chrono_tz::Tz, String> {
    if text.is_empty() {
        return Ok(chrono_tz::UTC);
    }
    text.parse::<chrono_tz::Tz>()
        .map_err(|_| format!("{text:?} is not a known time zone"))
}

/// The first activation at or after `start` that is strictly after `after`
/// (when given): the next slot. `None` when the schedule has no more slots
/// (a one-shot task that already had its slot). Fails when the schedule can
/// never fire (a cron for February 30th).
pub fn next_activation(
    schedule: &TaskSchedule,
    start: DateTime<Utc>,
    after: Option<DateTime<Utc>>,
) -> Result<Option<DateTime<Utc>>, String> {
    if !schedule.cron.is_empty() {
        let cron = parse_cron(&schedule.cron)?;
        let tz = parse_timezone(&schedule.timezone)?;
        let (from, inclusive) = match after {
            Some(after) if after >= start => (after, false),
            _ => (start, true),
        };
        return cron
            .find_next_occurrence(&from.with_timezone(&tz), inclusive)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|e| format!("cron {:?} has no next activation: {e}", schedule.cron));
    }
    let interval = parse_duration(&schedule.interval)?;
    match after {
        None => Ok(Some(start)),
        Some(after) if after < start => Ok(Some(start)),
        Some(_) if interval.is_zero() => Ok(None),
        Some(after) => {
            let interval = chrono::Duration::from_std(interval).map_err(|e| e.to_string())?;
            let step = interval.num_milliseconds();
            let periods = (after - start).num_milliseconds() / step + 1;
            // In milliseconds, as i64: a 1 s interval from a start a century
            // back is more periods than an i32 holds.
            step.checked_mul(periods)
                .map(chrono::Duration::milliseconds)
                .and_then(|offset| start.checked_add_signed(offset))
                .map(Some)
                .ok_or_else(|| "the next activation is out of range".to_string())
        }
    }
}

/// The delay before retry `attempt` (1 for the first retry): `retry_wait`
/// doubling per attempt, capped at three hours.
pub fn retry_delay(retry_wait: &str, attempt: u32) -> Duration {
    let base = match parse_duration(retry_wait) {
        Ok(wait) if !wait.is_zero() => wait,
        _ => DEFAULT_RETRY_WAIT,
    };
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
    base.saturating_mul(factor).min(MAX_RETRY_WAIT)
}

/// An instant as stored in records.
pub fn format_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A stored instant.
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        parse_time(text).unwrap()
    }

    #[test]
    fn start_dates_are_rfc3339_now_or_now_plus() {
        let now = at("2026-01-01T00:00:00Z");
        assert_eq!(evaluate_start("", now), Ok(now));
        assert_eq!(evaluate_start("now", now), Ok(now));
        assert_eq!(
            evaluate_start("now+3d2h", now),
            Ok(at("2026-01-04T02:00:00Z"))
        );
        assert_eq!(
            evaluate_start("2026-02-01T10:00:00+01:00", now),
            Ok(at("2026-02-01T09:00:00Z"))
        );
        assert!(evaluate_start("tomorrow", now).is_err());
        assert!(evaluate_start("now+soon", now).is_err());
    }

    #[test]
    fn cron_activations_follow_the_time_zone() {
        let schedule = TaskSchedule {
            cron: "0 3 * * *".into(),
            timezone: "Europe/Warsaw".into(),
            ..Default::default()
        };
        let start = at("2026-01-01T00:00:00Z");
        let first = next_activation(&schedule, start, None).unwrap().unwrap();
        // 03:00 in Warsaw is 02:00 UTC in winter.
        assert_eq!(first, at("2026-01-01T02:00:00Z"));
        let second = next_activation(&schedule, start, Some(first))
            .unwrap()
            .unwrap();
        assert_eq!(second, at("2026-01-02T02:00:00Z"));
    }

    /// The next `count` activations of `cron` in Berlin from `start`.
    fn berlin(cron: &str, start: &str, count: usize) -> Vec<DateTime<Utc>> {
        let schedule = TaskSchedule {
            cron: cron.into(),
            timezone: "Europe/Berlin".into(),
            ..Default::default()
        };
        let mut after = None;
        (0..count)
            .map(|_| {
                let next = next_activation(&schedule, at(start), after)
                    .unwrap()
                    .unwrap();
                after = Some(next);
                next
            })
            .collect()
    }

    #[test]
    fn a_daily_cron_fires_once_a_day_across_daylight_saving_changes() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist
        // that day, and the run comes at 03:00 (Vixie cron does the same).
        assert_eq!(
            berlin("30 2 * * *", "2026-03-28T12:00:00Z", 2),
            [at("2026-03-29T01:00:00Z"), at("2026-03-30T00:30:00Z")]
        );
        // 2026-10-25: 03:00 CEST goes back to 02:00 CET; 02:30 happens
        // twice, the run only once.
        assert_eq!(
            berlin("30 2 * * *", "2026-10-24T12:00:00Z", 2),
            [at("2026-10-25T00:30:00Z"), at("2026-10-26T01:30:00Z")]
        );
    }

    #[test]
    fn an_hourly_cron_fires_every_real_hour_across_daylight_saving_changes() {
        let hours = |from: &str| {
            let first = at(from);
            (0..4)
                .map(|h| first + chrono::Duration::hours(h))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            berlin("0 * * * *", "2026-03-29T00:30:00Z", 4),
            hours("2026-03-29T01:00:00Z")
        );
        assert_eq!(
            berlin("0 * * * *", "2026-10-24T23:30:00Z", 4),
            hours("2026-10-25T00:00:00Z")
        );
    }

    #[test]
    fn a_short_interval_from_a_long_past_start_stays_after_the_last_slot() {
        let schedule = TaskSchedule {
            interval: "1s".into(),
            ..Default::default()
        };
        let start = at("1900-01-01T00:00:00Z");
        let after = at("2026-12-03T10:00:00Z");
        let next = next_activation(&schedule, start, Some(after))
            .unwrap()
            .unwrap();
        assert_eq!(next, at("2026-12-03T10:00:01Z"));
    }

    #[test]
    fn a_cron_that_never_fires_is_an_error() {
        let schedule = TaskSchedule {
            cron: "0 0 30 2 *".into(),
            ..Default::default()
        };
        assert!(next_activation(&schedule, at("2026-01-01T00:00:00Z"), None).is_err());
    }

    #[test]
    fn intervals_keep_their_grid_and_one_shots_fire_once() {
        let start = at("2026-01-01T00:00:00Z");
        let hourly = TaskSchedule {
            interval: "1h".into(),
            ..Default::default()
        };
        assert_eq!(next_activation(&hourly, start, None), Ok(Some(start)));
        assert_eq!(
            next_activation(&hourly, start, Some(at("2026-01-01T02:30:00Z"))),
            Ok(Some(at("2026-01-01T03:00:00Z")))
        );
        let once = TaskSchedule::default();
        assert_eq!(next_activation(&once, start, None), Ok(Some(start)));
        assert_eq!(next_activation(&once, start, Some(start)), Ok(None));
    }

    #[test]
    fn retries_double_from_retry_wait_up_to_three_hours() {
        assert_eq!(retry_delay("", 1), Duration::from_secs(600));
        assert_eq!(retry_delay("10m", 2), Duration::from_secs(1200));
        assert_eq!(retry_delay("10m", 3), Duration::from_secs(2400));
        assert_eq!(retry_delay("10m", 10), MAX_RETRY_WAIT);
        assert_eq!(retry_delay("1s", 1), Duration::from_secs(1));
    }
}
