//! How log lines are written: the text format's fields with every control character escaped.
//!
//! Values from requests and admin bodies (a ban's reason, an identity, a descriptor, a path)
//! reach the log. Written raw, a `\n` or `\r` in one of them starts a forged line that a reader
//! (or a log shipper) takes for floodgate's own, and an ESC sequence reaches the terminal of
//! whoever tails the log. The JSON format escapes them already (JSON strings cannot hold them);
//! the text format's fields go through [`EscapedFields`], which writes every field as the
//! default formatter does (`name=value`, strings quoted) and escapes what the value's own
//! formatting left raw: C0 and C1 control characters (`\n`, `\r`, ESC, DEL, ...) and the Unicode
//! line and paragraph separators, as `\n`, `\r`, `\t` or `\u{..}`. So one event is one line,
//! whatever a client sent.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// The text format's field formatter (see the module's docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = Visitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Visitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visitor<'_> {
    /// Writes the separator and `name=` (nothing for the message), as the default formatter
    /// does; false once a write failed.
    fn begin(&mut self, field: &Field) -> bool {
        if self.result.is_err() {
            return false;
        }
        let sep = if self.first { "" } else { " " };
        self.first = false;
        let name = field.name();
        self.result = match name {
            "message" => self.writer.write_str(sep),
            // `r#type` and the like: the raw-identifier prefix is not part of the name.
            _ => self
                .writer
                .write_str(sep)
                .and_then(|()| {
                    self.writer
                        .write_str(name.strip_prefix("r#").unwrap_or(name))
                })
                .and_then(|()| self.writer.write_char('=')),
        };
        self.result.is_ok()
    }

    /// Writes a value whose `Debug` text holds no character to escape (a number, a bool): as
    /// the default formatter would, with no buffer between.
    fn plain(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.begin(field) {
            self.result = write!(self.writer, "{value:?}");
        }
    }
}

/// True when `text`'s `Debug` form is `text` in quotes: printable ASCII with no quote or
/// backslash (what an access log's paths, routes, addresses and labels almost always are).
fn debug_is_quoted(text: &str) -> bool {
    text.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else if self.begin(field) {
            self.result = quoted_into(value, &mut self.writer);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.plain(field, &value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.plain(field, &value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.plain(field, &value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.plain(field, &value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.begin(field) {
            return;
        }
        // The value's text, escaped on its way out; the buffer is the thread's own, reused.
        // (A value whose formatting logs, and so comes back here, gets a buffer of its own.)
        // (And one whose thread is ending, its buffer gone.)
        let done = TEXT
            .try_with(|text| {
                let Ok(mut text) = text.try_borrow_mut() else {
                    return false;
                };
                text.clear();
                let _ = write!(text, "{value:?}");
                self.result = escape_into(&text, &mut self.writer);
                if text.capacity() > TEXT_KEPT {
                    *text = String::new();
                }
                true
            })
            .unwrap_or(false);
        if !done {
            let mut text = String::new();
            let _ = write!(text, "{value:?}");
            self.result = escape_into(&text, &mut self.writer);
        }
    }
}

/// The largest buffer a thread keeps for a value's text between fields (a larger one, from a
/// long value, is let go).
const TEXT_KEPT: usize = 4096;

thread_local! {
    static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The log's timestamp, as tracing's `SystemTime` writes it (`2026-11-28T16:27:00.123456Z`,
/// UTC, microseconds), with the date and time of day formatted once a second per thread: most
/// lines of a busy second share them, and the formatter's field-by-field `write!` cost about as
/// much as the rest of an access log line.
#[derive(Debug, Default, Clone, Copy)]
pub struct CachedTime;

thread_local! {
    /// The Unix second last written on this thread, and its `YYYY-MM-DDTHH:MM:SS`.
    static SECOND: std::cell::Cell<(u64, [u8; 19])> = const { std::cell::Cell::new((u64::MAX, [0; 19])) };
}

impl tracing_subscriber::fmt::time::FormatTime for CachedTime {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = now.as_secs();
        let (cached, mut text) = SECOND.get();
        if cached != secs {
            text = date_time(secs);
            SECOND.set((secs, text));
        }
        let mut micros = *b".000000Z";
        let mut n = now.subsec_micros();
        for digit in micros[1..7].iter_mut().rev() {
            *digit = b'0' + (n % 10) as u8;
            n /= 10;
        }
        // Both are ASCII digits and separators.
        w.write_str(std::str::from_utf8(&text).unwrap_or_default())?;
        w.write_str(std::str::from_utf8(&micros).unwrap_or_default())
    }
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of the Unix second `secs` (years 1970 to 9999; a later one
/// is written as 9999-12-31T23:59:59, which no clock this runs on reaches).
fn date_time(secs: u64) -> [u8; 19] {
    let secs = secs.min(253_402_300_799);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = *b"0000-00-00T00:00:00";
    let mut put = |at: usize, width: usize, mut value: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year as u64);
    put(5, 2, month as u64);
    put(8, 2, day as u64);
    put(11, 2, rem / 3_600);
    put(14, 2, rem % 3_600 / 60);
    put(17, 2, rem % 60);
    out
}

/// Writes `value` as the text format writes a string field: its `Debug` form (quoted, with
/// quotes and backslashes escaped), every control character and line separator escaped.
pub fn quoted_into(value: &str, out: &mut impl Write) -> fmt::Result {
    if debug_is_quoted(value) {
        // What `{value:?}` writes, without formatting it char by char into a buffer.
        out.write_char('"')?;
        out.write_str(value)?;
        out.write_char('"')
    } else {
        escape_into(&format!("{value:?}"), out)
    }
}

/// Writes `text` with every control character and line separator escaped.
pub fn escape_into(text: &str, out: &mut impl Write) -> fmt::Result {
    let mut rest = text;
    while let Some(at) = rest.find(needs_escape) {
        out.write_str(&rest[..at])?;
        let c = rest[at..].chars().next().unwrap_or_default();
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c => write!(out, "\\u{{{:x}}}", c as u32)?,
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.write_str(rest)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// `version` as OpenTelemetry's `network.protocol.version` writes it.
pub fn protocol_version(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_11 => "1.1",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(json: bool, log: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || out.clone());
        if json {
            tracing::subscriber::with_default(builder.json().finish(), log);
        } else {
            tracing::subscriber::with_default(builder.fmt_fields(EscapedFields).finish(), log);
        }
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    /// An event's line with the given field formatter, without its time.
    fn line_with<N>(fields: N, log: impl FnOnce()) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .fmt_fields(fields)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn values_with_nothing_to_escape_are_written_as_the_default_formatter_writes_them() {
        // The fast paths (a quoted printable string, numbers, bools) against tracing's own
        // formatter, in a span's fields and an event's.
        let log = || {
            let span =
                tracing::info_span!("request", path = "/api/x", route = tracing::field::Empty);
            span.record("route", "api");
            let _entered = span.enter();
            tracing::info!(
                s = "a-b/c_d.e:f",
                quote = "say \"hi\"",
                slash = "a\\b",
                unicode = "café",
                n = 42u64,
                i = -3i64,
                f = 1.0f64,
                g = 0.25f64,
                b = true,
                d = %"display",
                r#type = "raw",
                "done {}", 7
            );
        };
        let ours = line_with(EscapedFields, log);
        let theirs = line_with(tracing_subscriber::fmt::format::DefaultFields::new(), log);
        assert_eq!(ours, theirs);
        assert!(ours.contains("s=\"a-b/c_d.e:f\" "), "{ours}");
    }

    #[test]
    fn unix_seconds_become_the_dates_tracing_writes() {
        // Checked against Python's datetime (UTC): the epoch, two leap days, a time of day,
        // the last second of a century.
        for (secs, text) in [
            (0, "1970-01-01T00:00:00"),
            (951_782_400, "2000-02-29T00:00:00"),
            (1_709_164_800, "2024-02-29T00:00:00"),
            (1_795_915_620, "2026-11-29T01:27:00"),
            (4_102_444_799, "2099-12-31T23:59:59"),
        ] {
            assert_eq!(std::str::from_utf8(&date_time(secs)).unwrap(), text);
        }
    }

    #[test]
    fn the_cached_time_is_the_format_of_tracings_own() {
        use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
        let (mut ours, mut theirs) = (String::new(), String::new());
        CachedTime.format_time(&mut Writer::new(&mut ours)).unwrap();
        SystemTime
            .format_time(&mut Writer::new(&mut theirs))
            .unwrap();
        assert_eq!(ours.len(), theirs.len(), "{ours} {theirs}");
        // The same second, unless the two calls straddled one.
        assert!(ours[..17] == theirs[..17], "{ours} {theirs}");
        assert!(ours.ends_with('Z') && ours.as_bytes()[19] == b'.');
    }

    const FORGED: &str = "spam\n2026-11-28T10:00:00Z  INFO floodgate: ban removed\r\u{1b}[2J\u{1b}]0;owned\u{7}\u{2028}x";

    #[test]
    fn a_value_holding_line_breaks_and_escape_sequences_stays_on_one_line() {
        for json in [false, true] {
            let text = logged(json, || {
                let reason = FORGED.to_string();
                tracing::info!(reason = %reason, quoted = FORGED, "ban added {}", FORGED);
            });
            assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
            assert!(text.ends_with('\n'));
            assert!(
                !text.contains('\r') && !text.contains('\u{1b}') && !text.contains('\u{7}'),
                "{text:?}"
            );
            // (JSON may hold U+2028 as it is: a line reader splits on `\n` alone.)
            assert!(json || !text.contains('\u{2028}'), "{text:?}");
            assert!(
                text.contains("ban removed"),
                "the value is kept, escaped: {text:?}"
            );
        }
    }

    #[test]
    fn plain_fields_read_as_the_default_formatter_writes_them() {
        let text = logged(
            false,
            || tracing::info!(n = 3, s = "a b", d = %"x", "hello"),
        );
        assert!(text.contains("hello n=3 s=\"a b\" d=x"), "{text:?}");
    }
}
