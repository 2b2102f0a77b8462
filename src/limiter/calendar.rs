//! Calendar periods for `algorithm: quota`: "1,000 a day" that resets at local midnight, "50,000
//! a month" from the 1st, in an IANA time zone.
//!
//! A quota is a fixed window whose bounds come from the calendar instead of the Unix epoch: a
//! day in `America/New_York` is 23 hours long on the day clocks go forward and 25 on the day
//! they go back, and a month is 28 to 31 days. The arithmetic is [`jiff`]'s, on its bundled copy
//! of the time zone database (the same on every instance, whatever the host has installed).
//!
//! Every store decides a quota on the period's *end*: floodgate works it out here, from its own
//! clock, and hands it to the store with the limit (the Redis script and the SQL function keep no
//! calendar); the store, deciding on its own clock as always, counts the request in the period
//! that ends there. Instances agree on a period's end as long as their clocks agree on which
//! period it is: within their skew of a period's turn (milliseconds, with NTP), a request may
//! count in the period before.

use std::hash::{Hash, Hasher};
use std::sync::{Mutex, OnceLock};

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// How long a quota's count lasts before it starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// From midnight to midnight.
    Day,
    /// From Monday's midnight to the next Monday's.
    Week,
    /// From midnight on the 1st to midnight on the next month's 1st.
    Month,
}

impl Period {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// The period named `name` in the config file.
    pub fn parse(name: &str) -> Option<Period> {
        match name {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    /// Its usual length in µs (a day of 24 hours, a month of 30 days): what the IETF policy
    /// header's window says, and how long a quota's state is expected to live.
    pub fn nominal_us(self) -> u64 {
        const DAY: u64 = 86_400_000_000;
        match self {
            Period::Day => DAY,
            Period::Week => 7 * DAY,
            Period::Month => 30 * DAY,
        }
    }
}

/// The period whose [`Period::nominal_us`] is `span_us` (a day for any other span).
pub fn period_of_us(span_us: u64) -> Period {
    [Period::Week, Period::Month]
        .into_iter()
        .find(|p| p.nominal_us() == span_us)
        .unwrap_or(Period::Day)
}

/// A time zone, by name, with the bounds of the period it last computed for each [`Period`]
/// (so that deciding a quota does not redo the calendar arithmetic on every request).
pub struct Zone {
    name: Box<str>,
    tz: TimeZone,
    last: Mutex<[(u64, u64); 3]>,
}

impl std::fmt::Debug for Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// The zones in use, each made once for the process's life (a reload that names a zone again
/// finds it here): at most the time zone database's few hundred names.
fn zones() -> &'static Mutex<Vec<&'static Zone>> {
    static ZONES: OnceLock<Mutex<Vec<&'static Zone>>> = OnceLock::new();
    ZONES.get_or_init(|| Mutex::new(Vec::new()))
}

/// A quota's calendar: a period in a time zone.
#[derive(Debug, Clone, Copy)]
pub struct Calendar {
    period: Period,
    zone: &'static Zone,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        // Zones are made once per name, so one name is one address.
        self.period == other.period && std::ptr::eq(self.zone, other.zone)
    }
}

impl Eq for Calendar {}

impl Hash for Calendar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.period.hash(state);
        self.zone.name.hash(state);
    }
}

/// Why a calendar cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a time zone in the IANA database (e.g. UTC, Europe/Paris, America/New_York)")]
pub struct UnknownZone(pub String);

impl Calendar {
    /// `period` in the IANA time zone `zone` (`UTC` included).
    pub fn new(period: Period, zone: &str) -> Result<Calendar, UnknownZone> {
        if zone == "UTC" {
            return Ok(Calendar::utc(period));
        }
        let mut zones = zones().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&found) = zones.iter().find(|z| &*z.name == zone) {
            return Ok(Calendar {
                period,
                zone: found,
            });
        }
        let tz = TimeZone::get(zone).map_err(|_| UnknownZone(zone.to_string()))?;
        let made: &'static Zone = Box::leak(Box::new(Zone {
            name: zone.into(),
            tz,
            last: Mutex::new([(0, 0); 3]),
        }));
        zones.push(made);
        Ok(Calendar { period, zone: made })
    }

    /// `period` in UTC.
    pub fn utc(period: Period) -> Calendar {
        static UTC: OnceLock<Zone> = OnceLock::new();
        let zone = UTC.get_or_init(|| Zone {
            name: "UTC".into(),
            tz: TimeZone::UTC,
            last: Mutex::new([(0, 0); 3]),
        });
        Calendar { period, zone }
    }

    /// The period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The time zone's name.
    pub fn zone(&self) -> &str {
        &self.zone.name
    }

    /// The period that `now_us` (µs since the Unix epoch) falls in: its start and its end (the
    /// next one's start), in µs since the epoch.
    pub fn bounds(&self, now_us: u64) -> (u64, u64) {
        let slot = self.period as usize;
        let mut last = self.zone.last.lock().unwrap_or_else(|e| e.into_inner());
        let (start, end) = last[slot];
        if start <= now_us && now_us < end {
            return (start, end);
        }
        let found = bounds_in(self.period, &self.zone.tz, now_us);
        last[slot] = found;
        found
    }
}

/// [`Calendar::bounds`] worked out: the start of the period holding `now_us` in `tz`, and the
/// start of the next. A day starts at its first instant (midnight, or whenever midnight's gap
/// ends in a zone that moves its clocks at midnight).
fn bounds_in(period: Period, tz: &TimeZone, now_us: u64) -> (u64, u64) {
    let now = Timestamp::from_microsecond(now_us.min(i64::MAX as u64) as i64)
        .unwrap_or(Timestamp::MAX)
        .to_zoned(tz.clone());
    let today = now.date();
    let first = match period {
        Period::Day => today,
        Period::Week => today
            .checked_sub(i64::from(today.weekday().to_monday_zero_offset()).days())
            .unwrap_or(today),
        Period::Month => today.first_of_month(),
    };
    let next = match period {
        Period::Day => first.checked_add(1.day()),
        Period::Week => first.checked_add(1.week()),
        Period::Month => first.checked_add(1.month()),
    };
    let start = start_of(first, tz).unwrap_or(0);
    let end = next
        .ok()
        .and_then(|d| start_of(d, tz))
        .unwrap_or(u64::MAX >> 11);
    (start.min(now_us), end.max(now_us + 1))
}

/// The first instant of `date` in `tz`, in µs since the epoch.
fn start_of(date: Date, tz: &TimeZone) -> Option<u64> {
    let zoned = date.to_zoned(tz.clone()).ok()?.start_of_day().ok()?;
    u64::try_from(zoned.timestamp().as_microsecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000_000;

    /// µs since the epoch of an RFC 3339 instant.
    fn at(instant: &str) -> u64 {
        instant.parse::<Timestamp>().unwrap().as_microsecond() as u64
    }

    #[test]
    fn a_day_in_new_york_is_23_hours_when_clocks_go_forward_and_25_when_they_go_back() {
        let ny = Calendar::new(Period::Day, "America/New_York").unwrap();
        // 2026-03-08: clocks go from 02:00 EST to 03:00 EDT.
        let (start, end) = ny.bounds(at("2026-03-08T12:00:00-04:00"));
        assert_eq!(start, at("2026-03-08T00:00:00-05:00"));
        assert_eq!(end, at("2026-03-09T00:00:00-04:00"));
        assert_eq!(end - start, 23 * HOUR);
        // 2026-11-01: clocks go from 02:00 EDT back to 01:00 EST.
        let (start, end) = ny.bounds(at("2026-11-01T01:30:00-05:00"));
        assert_eq!(start, at("2026-11-01T00:00:00-04:00"));
        assert_eq!(end, at("2026-11-02T00:00:00-05:00"));
        assert_eq!(end - start, 25 * HOUR);
    }

    #[test]
    fn a_period_holds_its_start_and_not_its_end() {
        let ny = Calendar::new(Period::Day, "America/New_York").unwrap();
        let midnight = at("2026-03-09T00:00:00-04:00");
        assert_eq!(ny.bounds(midnight).0, midnight);
        assert_eq!(ny.bounds(midnight - 1).1, midnight);
    }

    #[test]
    fn a_week_starts_on_monday_and_a_month_on_the_first() {
        let week = Calendar::new(Period::Week, "Europe/Paris").unwrap();
        // Sunday 2026-03-29 is the day Paris goes to summer time.
        let (start, end) = week.bounds(at("2026-03-29T20:00:00+02:00"));
        assert_eq!(start, at("2026-03-23T00:00:00+01:00"));
        assert_eq!(end, at("2026-03-30T00:00:00+02:00"));
        assert_eq!(end - start, 7 * 24 * HOUR - HOUR);
        let month = Calendar::new(Period::Month, "UTC").unwrap();
        let (start, end) = month.bounds(at("2028-02-29T23:59:59Z"));
        assert_eq!(start, at("2028-02-01T00:00:00Z"));
        assert_eq!(end, at("2028-03-01T00:00:00Z"));
    }

    #[test]
    fn a_zone_that_skips_midnight_starts_its_day_when_the_gap_ends() {
        // America/Santiago moved its clocks forward at midnight on 2026-09-06.
        let santiago = Calendar::new(Period::Day, "America/Santiago").unwrap();
        let (start, _) = santiago.bounds(at("2026-09-06T12:00:00-03:00"));
        assert_eq!(start, at("2026-09-06T01:00:00-03:00"));
    }

    #[test]
    fn the_cached_period_is_recomputed_once_now_leaves_it() {
        let day = Calendar::new(Period::Day, "UTC").unwrap();
        let first = day.bounds(at("2026-01-01T10:00:00Z"));
        assert_eq!(day.bounds(at("2026-01-01T23:59:59Z")), first);
        let second = day.bounds(at("2026-01-02T00:00:00Z"));
        assert_eq!(second.0, first.1);
        // And back: an earlier instant (another store's clock) is not given the later period.
        assert_eq!(day.bounds(at("2026-01-01T10:00:00Z")), first);
    }

    #[test]
    fn an_unknown_zone_is_named() {
        let e = Calendar::new(Period::Day, "Mars/Olympus_Mons").unwrap_err();
        assert!(e.to_string().contains("Mars/Olympus_Mons"), "{e}");
        assert_eq!(
            Calendar::new(Period::Day, "Europe/Paris").unwrap(),
            Calendar::new(Period::Day, "Europe/Paris").unwrap()
        );
    }

    #[test]
    fn a_windowed_algorithm_names_the_window_an_instant_falls_in() {
        use crate::limiter::Algorithm;
        let minute = Algorithm::fixed_window(5, std::time::Duration::from_secs(60)).unwrap();
        let t = at("2026-12-02T10:15:42Z");
        assert_eq!(
            minute.period_at(t),
            Some((at("2026-12-02T10:15:00Z"), at("2026-12-02T10:16:00Z")))
        );
        // The last µs of a window is in it; the next is the next window's first.
        let end = at("2026-12-02T10:16:00Z");
        assert_eq!(minute.period_at(end - 1).map(|w| w.1), Some(end));
        assert_eq!(minute.period_at(end).map(|w| w.0), Some(end));
        let month =
            Algorithm::quota(5, Calendar::new(Period::Month, "Asia/Kolkata").unwrap()).unwrap();
        assert_eq!(
            month.period_at(t),
            Some((
                at("2026-12-01T00:00:00+05:30"),
                at("2027-01-01T00:00:00+05:30")
            ))
        );
        let bucket = Algorithm::token_bucket(5, 1.0).unwrap();
        assert_eq!(bucket.period_at(t), None);
    }
}
