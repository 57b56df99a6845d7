//! Maintenance windows (`spec.maintenance`): when Drover may start work of
//! its own on a cluster — a scheduled task run, a rollout step, a
//! remediation.
//!
//! A window is a list of bounds read in pairs, a start and an end, as
//! scylla-manager's `--window`: `HH:MM` (every day) or `WEEKDAY-HH:MM`
//! (once a week; `Mon`..`Sun`, in any case), in an IANA time zone (empty:
//! UTC). `["Sat-22:00", "Sun-06:00"]` is Saturday 22:00 to Sunday 06:00;
//! `["01:00", "05:00", "13:00", "14:00"]` is two windows every day.
//!
//! # Guarantees
//! - No bounds: always open.
//! - Bounds are wall-clock times of the window's zone: `01:00`..`05:00` in
//!   Europe/Warsaw is 01:00 to 05:00 there in winter and in summer.
//! - A start is inside its window, an end is not. A pair whose end comes
//!   before its start wraps: past midnight (daily) or past the end of
//!   Sunday (weekly). A pair whose end equals its start is refused (it would
//!   be empty, or everything: no window says "always open").
//! - The opening [`closed`] reports is the first instant after `now` at
//!   which the window is open, reopenings in a repeated (fall-back) hour
//!   included.
//! - [`validate`] refuses what [`closed`] could not read, naming the field
//!   (`spec.maintenance.window[3]`, `spec.maintenance.timezone`).
//!
//! # Caveats
//! - A window gates starts only: work started inside it runs past its end,
//!   and an operator's own requests are never held back (only the callers
//!   that start work of Drover's own ask).
//! - Across a spring-forward gap, a start that falls in the skipped hour
//!   opens its window when the clocks jump; a pair wholly inside the gap
//!   does not open that day. In a fall-back's repeated hour, wall-clock
//!   times come twice, and so does a window over them.
//! - A stored window that does not parse ([`validate`] refuses one, so it
//!   was written around the API or by a newer version) counts as closed,
//!   with no opening: Drover would rather wait than work when told not to.

use super::validate::{FieldError, Validation};
use super::MaintenanceWindow;
use crate::task::schedule::parse_timezone;
use chrono::{
    DateTime, Datelike, LocalResult, NaiveDate, NaiveTime, Offset, SecondsFormat, TimeZone,
    Timelike, Utc, Weekday,
};
use chrono_tz::Tz;
use std::fmt;

/// At most this many bounds (32 pairs): a window is read on every look at
/// a cluster's due work.
pub const MAX_BOUNDS: usize = 64;
const DAY: i64 = 86_400;
const WEEK: i64 = 7 * DAY;
/// Days searched for the next opening: a week, and a week more for a
/// weekly pair whose start fell in a DST gap.
const SEARCH_DAYS: u64 = 15;
/// Steps at which offsets are compared to find DST transitions: finer than
/// any two transitions of one zone.
const TRANSITION_STEP: i64 = 6 * 3600;

const WEEKDAYS: [(&str, Weekday); 7] = [
    ("Mon", Weekday::Mon),
    ("Tue", Weekday::Tue),
    ("Wed", Weekday::Wed),
    ("Thu", Weekday::Thu),
    ("Fri", Weekday::Fri),
    ("Sat", Weekday::Sat),
    ("Sun", Weekday::Sun),
];

/// One bound: a wall-clock time, on a weekday for a weekly pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bound {
    weekday: Option<Weekday>,
    hour: u32,
    minute: u32,
}

impl Bound {
    /// `HH:MM` or `WEEKDAY-HH:MM`; why not, otherwise.
    fn parse(text: &str) -> Result<Self, String> {
        let want = "want HH:MM or WEEKDAY-HH:MM (WEEKDAY Mon..Sun), e.g. Sat-22:00";
        let (weekday, time) = match text.split_once('-') {
            None => (None, text),
            Some((day, time)) => {
                let weekday = WEEKDAYS
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(day))
                    .map(|(_, weekday)| *weekday)
                    .ok_or_else(|| format!("{text:?}: {day:?} is not a weekday Mon..Sun"))?;
                (Some(weekday), time)
            }
        };
        let (hour, minute) = time
            .split_once(':')
            .ok_or_else(|| format!("{text:?} is not a bound: {want}"))?;
        let digits = |s: &str, len: std::ops::RangeInclusive<usize>| {
            len.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit())
        };
        if !digits(hour, 1..=2) || !digits(minute, 2..=2) {
            return Err(format!("{text:?} is not a bound: {want}"));
        }
        let (hour, minute) = (hour.parse().unwrap_or(99), minute.parse().unwrap_or(99));
        if hour > 23 || minute > 59 {
            return Err(format!("{text:?}: the time must lie within 00:00..23:59"));
        }
        Ok(Self {
            weekday,
            hour,
            minute,
        })
    }

    /// Seconds into the day, or into the week (from Monday 00:00) when the
    /// bound has a weekday.
    fn seconds(self) -> i64 {
        let of_day = i64::from(self.hour * 3600 + self.minute * 60);
        match self.weekday {
            None => of_day,
            Some(day) => i64::from(day.num_days_from_monday()) * DAY + of_day,
        }
    }

    fn time(self) -> NaiveTime {
        NaiveTime::from_hms_opt(self.hour, self.minute, 0).unwrap_or_default()
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(day) = self.weekday {
            write!(f, "{day}-")?;
        }
        write!(f, "{:02}:{:02}", self.hour, self.minute)
    }
}

/// A start and an end, both daily or both weekly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pair {
    start: Bound,
    end: Bound,
}

impl Pair {
    /// Whether the wall-clock time `local` lies in the pair.
    fn contains(&self, local: chrono::NaiveDateTime) -> bool {
        let of_day = i64::from(local.time().num_seconds_from_midnight());
        let at = match self.start.weekday {
            None => of_day,
            Some(_) => i64::from(local.weekday().num_days_from_monday()) * DAY + of_day,
        };
        let (start, end) = (self.start.seconds(), self.end.seconds());
        debug_assert!(start.max(end) < WEEK);
        if start < end {
            start <= at && at < end
        } else {
            at >= start || at < end
        }
    }
}

/// A window as read: its pairs in its zone.
#[derive(Debug, Clone, PartialEq)]
struct Window {
    pairs: Vec<Pair>,
    tz: Tz,
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.pairs.iter().enumerate() {
            let comma = if i == 0 { "" } else { ", " };
            write!(f, "{comma}{}..{}", pair.start, pair.end)?;
        }
        write!(f, " {}", self.tz.name())
    }
}

/// Reads `window`; a failure names the field below `spec.maintenance`.
fn parse(window: &MaintenanceWindow) -> Result<Window, FieldError> {
    let bounds = &window.window;
    if bounds.len() > MAX_BOUNDS {
        let reason = format!("at most {MAX_BOUNDS} bounds ({} pairs)", MAX_BOUNDS / 2);
        return Err(FieldError::new("window", reason));
    }
    if !bounds.len().is_multiple_of(2) {
        let reason = format!(
            "has {} bounds: bounds come in pairs, a start and an end",
            bounds.len()
        );
        return Err(FieldError::new("window", reason));
    }
    let mut read = Vec::with_capacity(bounds.len());
    for (i, text) in bounds.iter().enumerate() {
        read.push(
            Bound::parse(text).map_err(|reason| FieldError::new(format!("window[{i}]"), reason))?,
        );
    }
    let mut pairs = Vec::with_capacity(read.len() / 2);
    for (i, pair) in read.chunks(2).enumerate() {
        let (start, end) = (pair[0], pair[1]);
        let (field, start_field) = (
            format!("window[{}]", 2 * i + 1),
            format!("window[{}]", 2 * i),
        );
        if start.weekday.is_some() != end.weekday.is_some() {
            let reason = format!(
                "{end} and its start {start} ({start_field}) must both have a weekday or neither"
            );
            return Err(FieldError::new(field, reason));
        }
        if start == end {
            let reason = format!(
                "{end} equals its start ({start_field}): the window would be empty (no window at all is always open)"
            );
            return Err(FieldError::new(field, reason));
        }
        pairs.push(Pair { start, end });
    }
    let tz =
        parse_timezone(&window.timezone).map_err(|reason| FieldError::new("timezone", reason))?;
    Ok(Window { pairs, tz })
}

/// Checks `window`, a failure naming its field below `field` (e.g.
/// `spec.maintenance.window[3]`).
pub fn validate(field: &str, window: &MaintenanceWindow) -> Validation {
    parse(window)
        .map(drop)
        .map_err(|error| FieldError::new(format!("{field}.{}", error.field), error.reason))
}

impl Window {
    fn is_open(&self, at: DateTime<Utc>) -> bool {
        let local = at.with_timezone(&self.tz).naive_local();
        self.pairs.iter().any(|pair| pair.contains(local))
    }

    /// The first instant after `now` at which the window is open: a start
    /// bound's wall-clock time, or a DST transition (a start skipped by a
    /// gap, or wall-clock times that come again after a fall-back).
    fn next_open(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let today = now.with_timezone(&self.tz).date_naive();
        let mut candidates = Vec::new();
        for day in 0..=SEARCH_DAYS {
            let Some(date) = today.checked_add_days(chrono::Days::new(day)) else {
                break;
            };
            for pair in &self.pairs {
                candidates.extend(self.starts_on(date, pair.start));
            }
        }
        let until = now + chrono::Duration::days(SEARCH_DAYS as i64);
        candidates.extend(transitions(self.tz, now, until));
        candidates
            .into_iter()
            .filter(|at| *at > now && self.is_open(*at))
            .min()
    }

    /// The instants at which `start` falls on `date`: none when the date
    /// is another weekday or the time is skipped, two in a repeated hour.
    fn starts_on(&self, date: NaiveDate, start: Bound) -> Vec<DateTime<Utc>> {
        if start.weekday.is_some_and(|day| day != date.weekday()) {
            return Vec::new();
        }
        match self.tz.from_local_datetime(&date.and_time(start.time())) {
            LocalResult::Single(at) => vec![at.with_timezone(&Utc)],
            LocalResult::Ambiguous(first, second) => {
                vec![first.with_timezone(&Utc), second.with_timezone(&Utc)]
            }
            LocalResult::None => Vec::new(),
        }
    }
}

/// The instants in `(from, until]` at which `tz` changes its offset.
fn transitions(tz: Tz, from: DateTime<Utc>, until: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let offset = |at: i64| {
        DateTime::from_timestamp(at, 0)
            .map(|t| tz.offset_from_utc_datetime(&t.naive_utc()).fix())
            .map(|o| o.local_minus_utc())
    };
    let mut found = Vec::new();
    let (mut at, end) = (from.timestamp(), until.timestamp());
    while at < end {
        let next = (at + TRANSITION_STEP).min(end);
        if offset(at) != offset(next) {
            // The first second with the new offset.
            let (mut lo, mut hi) = (at, next);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if offset(mid) == offset(at) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            found.extend(DateTime::from_timestamp(hi, 0));
        }
        at = next;
    }
    found
}

/// Whether `window` holds Drover's own work back at `now`: `None` when it
/// is open (or there is none), otherwise why, and when it opens next.
pub fn closed(
    window: &MaintenanceWindow,
    now: DateTime<Utc>,
) -> Option<(String, Option<DateTime<Utc>>)> {
    if window.window.is_empty() {
        return None;
    }
    let window = match parse(window) {
        Ok(window) => window,
        Err(error) => {
            let reason = format!(
                "the maintenance window is invalid (spec.maintenance.{error}); nothing of Drover's own starts until it is fixed"
            );
            return Some((reason, None));
        }
    };
    if window.is_open(now) {
        return None;
    }
    let opens = window.next_open(now);
    let reason = match opens {
        Some(at) => format!(
            "outside the maintenance window ({window}); it opens at {}",
            at.to_rfc3339_opts(SecondsFormat::Secs, true)
        ),
        None => format!("outside the maintenance window ({window})"),
    };
    Some((reason, opens))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn window(bounds: &[&str], timezone: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            window: bounds.iter().map(|b| b.to_string()).collect(),
            timezone: timezone.into(),
        }
    }

    /// When the window opens next, seen from `now`: `None` while open.
    fn opens(w: &MaintenanceWindow, now: &str) -> Option<String> {
        closed(w, at(now)).map(|(_, opens)| {
            opens
                .expect("an opening")
                .to_rfc3339_opts(SecondsFormat::Secs, true)
        })
    }

    #[test]
    fn no_window_is_always_open() {
        let now = at("2026-12-09T12:00:00Z");
        assert_eq!(closed(&MaintenanceWindow::default(), now), None);
        assert_eq!(closed(&window(&[], "Europe/Warsaw"), now), None);
    }

    #[test]
    fn a_daily_window_opens_at_its_start_and_closes_at_its_end() {
        let w = window(&["01:00", "05:00"], "");
        assert_eq!(
            opens(&w, "2026-05-04T00:59:59Z").as_deref(),
            Some("2026-05-04T01:00:00Z")
        );
        assert_eq!(
            opens(&w, "2026-05-04T01:00:00Z"),
            None,
            "the start is inside"
        );
        assert_eq!(opens(&w, "2026-05-04T04:59:59Z"), None);
        assert_eq!(
            opens(&w, "2026-05-04T05:00:00Z").as_deref(),
            Some("2026-05-05T01:00:00Z"),
            "the end is outside; tomorrow's start is next"
        );
        let (why, _) = closed(&w, at("2026-05-04T12:00:00Z")).unwrap();
        assert_eq!(
            why,
            "outside the maintenance window (01:00..05:00 UTC); it opens at 2026-05-05T01:00:00Z"
        );
    }

    #[test]
    fn a_daily_window_wraps_past_midnight() {
        let w = window(&["22:00", "02:00"], "");
        assert_eq!(opens(&w, "2026-05-04T23:00:00Z"), None);
        assert_eq!(opens(&w, "2026-05-05T00:00:00Z"), None);
        assert_eq!(opens(&w, "2026-05-05T01:59:00Z"), None);
        assert_eq!(
            opens(&w, "2026-05-05T02:00:00Z").as_deref(),
            Some("2026-05-05T22:00:00Z")
        );
        assert_eq!(
            opens(&w, "2026-05-05T21:59:00Z").as_deref(),
            Some("2026-05-05T22:00:00Z")
        );
    }

    #[test]
    fn several_pairs_make_one_window() {
        let w = window(&["01:00", "02:00", "13:00", "14:00"], "");
        assert_eq!(opens(&w, "2026-05-04T01:30:00Z"), None);
        assert_eq!(opens(&w, "2026-05-04T13:30:00Z"), None);
        assert_eq!(
            opens(&w, "2026-05-04T03:00:00Z").as_deref(),
            Some("2026-05-04T13:00:00Z")
        );
        assert_eq!(
            opens(&w, "2026-05-04T15:00:00Z").as_deref(),
            Some("2026-05-05T01:00:00Z")
        );
        let (why, _) = closed(&w, at("2026-05-04T03:00:00Z")).unwrap();
        assert!(why.contains("(01:00..02:00, 13:00..14:00 UTC)"), "{why}");
    }

    /// The example of the API's comment: Saturday 22:00 to Sunday 06:00 in
    /// Warsaw (CET, UTC+1, in December).
    #[test]
    fn a_weekly_window_opens_on_its_weekday_in_its_zone() {
        let w = window(&["Sat-22:00", "Sun-06:00"], "Europe/Warsaw");
        let (why, opens_at) = closed(&w, at("2026-12-09T12:00:00Z")).unwrap();
        assert_eq!(
            why,
            "outside the maintenance window (Sat-22:00..Sun-06:00 Europe/Warsaw); it opens at 2026-12-12T21:00:00Z"
        );
        assert_eq!(opens_at, Some(at("2026-12-12T21:00:00Z")));
        assert_eq!(
            opens(&w, "2026-12-12T20:59:59Z").as_deref(),
            Some("2026-12-12T21:00:00Z")
        );
        assert_eq!(opens(&w, "2026-12-12T21:00:00Z"), None);
        assert_eq!(
            opens(&w, "2026-12-13T04:59:59Z"),
            None,
            "Sunday 05:59 local"
        );
        assert_eq!(
            opens(&w, "2026-12-13T05:00:00Z").as_deref(),
            Some("2026-12-19T21:00:00Z"),
            "closed at Sunday 06:00 local, until next Saturday"
        );
    }

    #[test]
    fn a_weekly_window_wraps_past_the_end_of_sunday() {
        // 2026-05-03 is a Sunday.
        let w = window(&["sun-22:00", "MON-02:00"], "");
        assert_eq!(opens(&w, "2026-05-03T22:00:00Z"), None);
        assert_eq!(opens(&w, "2026-05-03T23:59:59Z"), None);
        assert_eq!(
            opens(&w, "2026-05-04T01:59:59Z"),
            None,
            "Monday, still open"
        );
        assert_eq!(
            opens(&w, "2026-05-04T02:00:00Z").as_deref(),
            Some("2026-05-10T22:00:00Z")
        );
        assert_eq!(
            opens(&w, "2026-05-06T12:00:00Z").as_deref(),
            Some("2026-05-10T22:00:00Z")
        );
        // A weekly window across the middle of the week does not wrap.
        let w = window(&["Tue-08:00", "Thu-18:00"], "");
        assert_eq!(opens(&w, "2026-05-06T12:00:00Z"), None, "Wednesday");
        assert_eq!(
            opens(&w, "2026-05-08T12:00:00Z").as_deref(),
            Some("2026-05-12T08:00:00Z")
        );
    }

    /// 01:00..05:00 in Warsaw is 00:00..04:00 UTC in winter (CET) and
    /// 23:00..03:00 UTC in summer (CEST): wall-clock time, not a fixed
    /// offset.
    #[test]
    fn a_window_keeps_its_wall_clock_times_across_dst() {
        let w = window(&["01:00", "05:00"], "Europe/Warsaw");
        assert_eq!(opens(&w, "2026-01-15T03:30:00Z"), None, "04:30 CET");
        assert_eq!(
            opens(&w, "2026-01-15T04:30:00Z").as_deref(),
            Some("2026-01-16T00:00:00Z")
        );
        assert_eq!(opens(&w, "2026-07-15T02:30:00Z"), None, "04:30 CEST");
        assert_eq!(
            opens(&w, "2026-07-15T03:30:00Z").as_deref(),
            Some("2026-07-15T23:00:00Z")
        );
        // Across the spring transition (2026-03-29, 02:00 CET -> 03:00 CEST).
        assert_eq!(
            opens(&w, "2026-03-28T12:00:00Z").as_deref(),
            Some("2026-03-29T00:00:00Z")
        );
        assert_eq!(opens(&w, "2026-03-29T02:30:00Z"), None, "04:30 CEST");
        assert_eq!(
            opens(&w, "2026-03-29T03:00:00Z").as_deref(),
            Some("2026-03-29T23:00:00Z")
        );
    }

    #[test]
    fn a_start_skipped_by_the_spring_gap_opens_when_the_clocks_jump() {
        // 02:30 does not exist on 2026-03-29 in Warsaw: at 01:00 UTC the
        // clocks go from 02:00 to 03:00, inside 02:30..04:00.
        let w = window(&["02:30", "04:00"], "Europe/Warsaw");
        assert_eq!(
            opens(&w, "2026-03-29T00:30:00Z").as_deref(),
            Some("2026-03-29T01:00:00Z")
        );
        assert_eq!(opens(&w, "2026-03-29T01:30:00Z"), None, "03:30 CEST");
        // Wholly inside the gap: not that day, the next.
        let w = window(&["02:15", "02:45"], "Europe/Warsaw");
        assert_eq!(
            opens(&w, "2026-03-29T00:30:00Z").as_deref(),
            Some("2026-03-30T00:15:00Z")
        );
    }

    #[test]
    fn the_repeated_hour_of_a_fall_back_opens_a_window_twice() {
        // 2026-10-25 in Warsaw: at 01:00 UTC, 03:00 CEST becomes 02:00 CET.
        let w = window(&["01:00", "02:30"], "Europe/Warsaw");
        assert_eq!(opens(&w, "2026-10-25T00:15:00Z"), None, "02:15 CEST");
        assert_eq!(
            opens(&w, "2026-10-25T00:45:00Z").as_deref(),
            Some("2026-10-25T01:00:00Z"),
            "02:45 CEST is outside; 02:00 CET comes next"
        );
        assert_eq!(opens(&w, "2026-10-25T01:15:00Z"), None, "02:15 CET");
        let w = window(&["02:15", "02:45"], "Europe/Warsaw");
        assert_eq!(
            opens(&w, "2026-10-25T00:00:00Z").as_deref(),
            Some("2026-10-25T00:15:00Z")
        );
        assert_eq!(
            opens(&w, "2026-10-25T00:50:00Z").as_deref(),
            Some("2026-10-25T01:15:00Z"),
            "02:15 CET, the second 02:15"
        );
    }

    #[test]
    fn a_stored_window_that_does_not_parse_holds_work_back() {
        let w = window(&["Sat-22:00"], "");
        let (why, opens_at) = closed(&w, at("2026-12-09T12:00:00Z")).unwrap();
        assert!(why.contains("spec.maintenance.window"), "{why}");
        assert_eq!(opens_at, None);
    }

    #[test]
    fn bounds_are_read_in_any_case_and_shown_in_one() {
        let w = window(&["sat-9:00", "SUN-06:00"], "");
        let (why, _) = closed(&w, at("2026-12-09T12:00:00Z")).unwrap();
        assert!(why.contains("(Sat-09:00..Sun-06:00 UTC)"), "{why}");
        assert_eq!(validate("m", &window(&["00:00", "23:59"], "")), Ok(()));
        assert_eq!(
            validate("m", &window(&["Mon-00:00", "Sun-23:59"], "UTC")),
            Ok(())
        );
    }

    #[test]
    fn validation_names_the_field() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&["01:00"], "", "spec.maintenance.window"),
            (&["01:00", "02:00", "03:00"], "", "spec.maintenance.window"),
            (
                &["01:00", "02:00", "03:00", "24:00"],
                "",
                "spec.maintenance.window[3]",
            ),
            (&["1:0", "02:00"], "", "spec.maintenance.window[0]"),
            (&["01:60", "02:00"], "", "spec.maintenance.window[0]"),
            (&["Sat22:00", "02:00"], "", "spec.maintenance.window[0]"),
            (&["Fri-", "Sat-02:00"], "", "spec.maintenance.window[0]"),
            (
                &["Satur-01:00", "Sun-02:00"],
                "",
                "spec.maintenance.window[0]",
            ),
            (&["", "02:00"], "", "spec.maintenance.window[0]"),
            (&["Sat-22:00", "06:00"], "", "spec.maintenance.window[1]"),
            (&["22:00", "Sun-06:00"], "", "spec.maintenance.window[1]"),
            (
                &["01:00", "02:00", "03:00", "03:00"],
                "",
                "spec.maintenance.window[3]",
            ),
            (
                &["Sat-22:00", "sat-22:00"],
                "",
                "spec.maintenance.window[1]",
            ),
            (
                &["01:00", "02:00"],
                "Mars/Olympus",
                "spec.maintenance.timezone",
            ),
            (&[], "Europe/Nowhere", "spec.maintenance.timezone"),
        ];
        for (bounds, timezone, field) in cases {
            let error = validate("spec.maintenance", &window(bounds, timezone)).unwrap_err();
            assert_eq!(error.field, *field, "{bounds:?} {timezone:?}: {error}");
        }
        let many: Vec<&str> = ["01:00", "02:00"].repeat(MAX_BOUNDS / 2 + 1);
        let error = validate("spec.maintenance", &window(&many, "")).unwrap_err();
        assert_eq!(error.field, "spec.maintenance.window");
        let error = validate("maintenance", &window(&["Sat-22:00", "06:00"], "")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "maintenance.window[1]: 06:00 and its start Sat-22:00 (window[0]) must both have a weekday or neither"
        );
    }

    #[test]
    fn the_spec_checks_its_window() {
        let spec = super::super::Spec {
            version: "1.29.4".into(),
            control_nodes: 1,
            node_offering: "medium".into(),
            maintenance: window(&["01:00", "01:00"], ""),
            ..Default::default()
        };
        let error = super::super::validate::spec("spec", &spec).unwrap_err();
        assert_eq!(error.field, "spec.maintenance.window[1]");
    }
}
