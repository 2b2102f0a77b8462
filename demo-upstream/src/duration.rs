//! A tiny duration parser for the command line: `20ms`, `1s`, `1.5s`, `2m`, `500us`.

use std::time::Duration;

/// Parses a number followed by a unit (`us`, `ms`, `s` or `m`) into a [`Duration`].
///
/// The number may be fractional (`1.5s`); it must be finite and not negative.
/// A unit is required so that `--service-time 20` cannot silently mean seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?}: missing unit (use us, ms, s or m, e.g. 20ms)"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: {number:?} is not a number"))?;
    let seconds_per_unit = match unit.trim() {
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use us, ms, s or m)"
            ));
        }
    };
    Duration::try_from_secs_f64(value * seconds_per_unit)
        .map_err(|e| format!("{text:?}: out of range: {e}"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    }

    #[test]
    fn parses_fractions_and_zero() {
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn rejects_missing_or_unknown_units_and_garbage() {
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("20h").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("1..2s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
