//! The timestamps of both log formats, as µs since the Unix epoch: RFC 3339 (floodgate's JSON
//! log; a fast path for the form tracing-subscriber writes, a general one for the rest) and
//! nginx's `$time_local`.

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn number(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Two to four ASCII digits at `at`.
fn digits(b: &[u8], at: usize, n: usize) -> Option<i64> {
    let mut v = 0i64;
    for &c in b.get(at..at + n)? {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(c - b'0');
    }
    Some(v)
}

/// `2026-11-22T18:30:41.123456Z` (or `+01:00`) as µs since the epoch.
pub fn parse_rfc3339_us(text: &str) -> Option<u64> {
    // The layout tracing writes, read by position; anything else goes the general way.
    let b = text.as_bytes();
    if b.len() == 27
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[26] == b'Z'
    {
        let (y, m, d) = (digits(b, 0, 4)?, digits(b, 5, 2)?, digits(b, 8, 2)?);
        let (h, mi, s) = (digits(b, 11, 2)?, digits(b, 14, 2)?, digits(b, 17, 2)?);
        let micros = digits(b, 20, 6)?;
        if (1..=12).contains(&m) && (1..=31).contains(&d) && h <= 23 && mi <= 59 && s <= 60 {
            let secs = days_from_civil(y, m, d) * 86_400 + h * 3600 + mi * 60 + s;
            return u64::try_from(secs * 1_000_000 + micros).ok();
        }
        return None;
    }
    parse_rfc3339_general(text)
}

fn parse_rfc3339_general(text: &str) -> Option<u64> {
    let (date, rest) = text.split_once('T')?;
    let mut ymd = date.split('-');
    let (y, m, d) = (
        number(ymd.next()?)?,
        number(ymd.next()?)?,
        number(ymd.next()?)?,
    );
    if ymd.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let zone_at = rest.find(['Z', 'z', '+', '-'])?;
    let (clock, zone) = rest.split_at(zone_at);
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut parts = hms.split(':');
    let (h, mi, s) = (
        number(parts.next()?)?,
        number(parts.next()?)?,
        number(parts.next()?)?,
    );
    if parts.next().is_some() || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut micros = 0i64;
    for (i, b) in fraction.bytes().take(6).enumerate() {
        if !b.is_ascii_digit() {
            return None;
        }
        micros += i64::from(b - b'0') * 10i64.pow(5 - i as u32);
    }
    let offset = match zone {
        "Z" | "z" => 0,
        _ => {
            let (hh, mm) = zone[1..].split_once(':')?;
            let minutes = number(hh)? * 60 + number(mm)?;
            if zone.starts_with('-') {
                -minutes
            } else {
                minutes
            }
        }
    };
    let secs = days_from_civil(y, m, d) * 86_400 + h * 3600 + mi * 60 + s - offset * 60;
    u64::try_from(secs * 1_000_000 + micros).ok()
}

/// `10/Oct/2000:13:55:36 -0700` as µs since the epoch (a whole second).
pub(super) fn parse_time_local(text: &str) -> Option<u64> {
    let (when, zone) = text.split_once(' ')?;
    let mut parts = when.split([':', '/']);
    let d = number(parts.next()?)?;
    let month = parts.next()?;
    let y = number(parts.next()?)?;
    let (h, mi, s) = (
        number(parts.next()?)?,
        number(parts.next()?)?,
        number(parts.next()?)?,
    );
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|&name| name == month)? as i64 + 1;
    if !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 || parts.next().is_some() {
        return None;
    }
    if zone.len() != 5 || !(zone.starts_with('+') || zone.starts_with('-')) {
        return None;
    }
    let minutes = number(&zone[1..3])? * 60 + number(&zone[3..5])?;
    let offset = if zone.starts_with('-') {
        -minutes
    } else {
        minutes
    };
    let secs = days_from_civil(y, m, d) * 86_400 + h * 3600 + mi * 60 + s - offset * 60;
    u64::try_from(secs * 1_000_000).ok()
}
