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

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        let sep = if self.first { "" } else { " " };
        self.first = false;
        let name = field.name();
        self.result = match name {
            "message" => write!(self.writer, "{sep}"),
            // `r#type` and the like: the raw-identifier prefix is not part of the name.
            _ => write!(
                self.writer,
                "{sep}{}=",
                name.strip_prefix("r#").unwrap_or(name)
            ),
        }
        .and_then(|()| escape_into(&text, &mut self.writer));
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
