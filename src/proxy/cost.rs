//! Costs known only after the response (`cost: {reserve, actual}`): what a request reserved is
//! held out of its budgets ([`Reservation`]) while the response streams; `CostMeter` reads
//! the real cost as the response goes by (a header or trailer, a JSON body's field, or the
//! usage an OpenAI-style event stream carries in its last `data:` event) and settles when the
//! response ends, in the phase after the response. A response that fails or is abandoned
//! settles at what is known: the reserve when nothing is.

use std::io::{self, Write};
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

use crate::config::cost::{Field, Settled, header_units, lookup, units_of};
use crate::limiter::Reservation;
use crate::metrics::CostCounters;

/// The most of a JSON response body kept to read its cost from (a larger body settles at its
/// reserve).
const MAX_JSON_BODY: usize = 8 << 20;
/// The longest event-stream line kept (a longer one is skipped).
const MAX_EVENT_LINE: usize = 1 << 20;

/// One settled limit of an admitted request: where its cost is read, and its counters.
pub(super) struct Metered {
    pub settled: Arc<Settled>,
    pub counters: CostCounters,
    /// The limit's position in its route's `limits:` (the access log names it so).
    pub position: usize,
}

/// How the (decoded) response body is read for costs.
enum BodyMode {
    /// No limit reads the body (or it is past its cap, or could not be decoded).
    Skip,
    /// A JSON document, kept whole until it ends.
    Json(Vec<u8>),
    /// `text/event-stream`: read line by line, each `data:` line's JSON looked at.
    Events(Vec<u8>),
}

/// The reading of the figures: the settled limits, the cost read so far for each, and the
/// body as decoded. A [`Write`] sink, so a decoder can write what it decodes straight into it
/// (nothing decoded is kept but a JSON body within its cap, or one event-stream line).
struct Figures {
    limits: Vec<Metered>,
    /// Per limit, the cost read so far (the last figure an event stream gave), cut to the
    /// limit's `actual.max`.
    found: Vec<Option<u64>>,
    body: BodyMode,
}

/// Why the decoder stops: the decoded body is past what is kept of it.
const PAST_CAP: &str = "decoded response body past the cost meter's cap";

impl Write for Figures {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.data(bytes);
        match self.body {
            BodyMode::Skip => Err(io::Error::other(PAST_CAP)),
            _ => Ok(bytes.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The response's `Content-Encoding`, undone into [`Figures`] for reading only: the client
/// gets the bytes as they came.
enum Decoding {
    Identity(Figures),
    Gzip(Box<flate2::write::MultiGzDecoder<Figures>>),
    /// HTTP's `deflate` is the zlib format (RFC 9110 §8.4.1.2).
    Deflate(Box<flate2::write::ZlibDecoder<Figures>>),
    Brotli(Box<brotli_decompressor::DecompressorWriter<Figures>>),
    Zstd(Box<zstd::stream::write::Decoder<'static, Figures>>),
    /// A decoder failed (corrupt data, an encoding floodgate does not read, past the cap):
    /// the rest of the body is not read.
    Stopped(Figures),
}

/// Bytes the brotli decoder decodes at a time.
const BROTLI_BUFFER: usize = 16 << 10;

impl Decoding {
    /// How to read a body encoded as `encoding` (a `Content-Encoding` value) into `figures`.
    fn new(encoding: Option<&str>, figures: Figures) -> Decoding {
        let encoding = encoding.map(|e| e.trim().to_ascii_lowercase());
        match encoding.as_deref() {
            None | Some("" | "identity") => Decoding::Identity(figures),
            Some("gzip" | "x-gzip") => {
                Decoding::Gzip(Box::new(flate2::write::MultiGzDecoder::new(figures)))
            }
            Some("deflate") => {
                Decoding::Deflate(Box::new(flate2::write::ZlibDecoder::new(figures)))
            }
            Some("br") => Decoding::Brotli(Box::new(brotli_decompressor::DecompressorWriter::new(
                figures,
                BROTLI_BUFFER,
            ))),
            Some("zstd") => match zstd::stream::write::Decoder::new(figures) {
                Ok(decoder) => Decoding::Zstd(Box::new(decoder)),
                Err(_) => Decoding::Stopped(Figures::empty()),
            },
            // Several codings, or one floodgate does not read: settled at the reserve.
            Some(_) => Decoding::Stopped(figures.skipping()),
        }
    }

    fn figures(&mut self) -> &mut Figures {
        match self {
            Decoding::Identity(f) | Decoding::Stopped(f) => f,
            Decoding::Gzip(d) => d.get_mut(),
            Decoding::Deflate(d) => d.get_mut(),
            Decoding::Brotli(d) => d.get_mut(),
            Decoding::Zstd(d) => d.get_mut(),
        }
    }

    /// A piece of the body as it came.
    fn write(&mut self, bytes: &[u8]) {
        let written = match self {
            Decoding::Identity(figures) => {
                figures.data(bytes);
                Ok(())
            }
            Decoding::Stopped(_) => Ok(()),
            // Flushed after each piece: a decoder keeps what it decoded until then, and an
            // event is read when it arrives.
            Decoding::Gzip(d) => d.write_all(bytes).and_then(|()| d.flush()),
            Decoding::Deflate(d) => d.write_all(bytes).and_then(|()| d.flush()),
            Decoding::Brotli(d) => d.write_all(bytes).and_then(|()| d.flush()),
            Decoding::Zstd(d) => d.write_all(bytes).and_then(|()| d.flush()),
        };
        if written.is_err() {
            self.stop();
        }
    }

    /// The body ended: whatever the decoder still holds is decoded.
    fn end(&mut self) {
        let ended = match self {
            Decoding::Identity(_) | Decoding::Stopped(_) => Ok(()),
            Decoding::Gzip(d) => d.try_finish(),
            Decoding::Deflate(d) => d.try_finish(),
            Decoding::Brotli(d) => d.flush(),
            Decoding::Zstd(d) => d.flush(),
        };
        if ended.is_err() {
            self.stop();
        }
    }

    /// Reads no more of the body: what was read of an event stream stands, a JSON body
    /// unfinished is not read.
    fn stop(&mut self) {
        let figures = std::mem::replace(self.figures(), Figures::empty());
        *self = Decoding::Stopped(figures.skipping());
    }
}

impl Figures {
    fn empty() -> Figures {
        Figures {
            limits: Vec::new(),
            found: Vec::new(),
            body: BodyMode::Skip,
        }
    }

    /// The same figures, reading no more of the body.
    fn skipping(mut self) -> Figures {
        self.body = BodyMode::Skip;
        self
    }

    /// A piece of the decoded body.
    fn data(&mut self, bytes: &[u8]) {
        match &mut self.body {
            BodyMode::Skip => {}
            BodyMode::Json(kept) => {
                if kept.len() + bytes.len() > MAX_JSON_BODY {
                    self.body = BodyMode::Skip;
                } else {
                    kept.extend_from_slice(bytes);
                }
            }
            BodyMode::Events(line) => {
                let mut rest = bytes;
                while let Some(end) = memchr::memchr(b'\n', rest) {
                    if line.len() + end <= MAX_EVENT_LINE {
                        line.extend_from_slice(&rest[..end]);
                        let complete = std::mem::take(line);
                        Self::event_line(&self.limits, &mut self.found, &complete);
                    } else {
                        line.clear();
                    }
                    rest = &rest[end + 1..];
                }
                if line.len() + rest.len() <= MAX_EVENT_LINE {
                    line.extend_from_slice(rest);
                } else {
                    line.clear();
                }
            }
        }
    }

    /// `refund_on` / `spend_on`: the answer's status decides, at its head (whether or not the
    /// body then ends well): the units back (0), or kept (the reserve).
    fn read_status(&mut self, status: u16) {
        for (limit, found) in self.limits.iter().zip(&mut self.found) {
            if let Field::Status(statuses) = &limit.settled.actual
                && statuses.refunds(status)
            {
                *found = Some(0);
            }
        }
    }

    fn read_headers(&mut self, headers: &HeaderMap) {
        for (limit, found) in self.limits.iter().zip(&mut self.found) {
            if let Field::Header(name) = &limit.settled.actual
                && let Some(n) = header_units(headers, name)
            {
                *found = Some(n.min(limit.settled.actual_max));
            }
        }
    }

    /// One event-stream line: a `data:` line whose JSON has a limit's field sets its cost (a
    /// later one replaces it: the usage comes last).
    fn event_line(limits: &[Metered], found: &mut [Option<u64>], line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data.first() != Some(&b'{') {
            return; // `[DONE]`, or not JSON
        }
        let Ok(event) = serde_json::from_slice::<Map<String, Value>>(data) else {
            return;
        };
        Self::read_json(limits, found, &event);
    }

    fn read_json(limits: &[Metered], found: &mut [Option<u64>], document: &Map<String, Value>) {
        for (limit, found) in limits.iter().zip(found.iter_mut()) {
            if let Field::Json(path) = &limit.settled.actual
                && let Some(n) = lookup(document, path).and_then(units_of)
            {
                *found = Some(n.min(limit.settled.actual_max));
            }
        }
    }

    /// The body has ended: what is kept of it is read.
    fn end(&mut self) {
        match std::mem::replace(&mut self.body, BodyMode::Skip) {
            BodyMode::Json(kept) if !kept.is_empty() => {
                if let Ok(document) = serde_json::from_slice::<Map<String, Value>>(&kept) {
                    Self::read_json(&self.limits, &mut self.found, &document);
                }
            }
            BodyMode::Events(line) if !line.is_empty() => {
                Self::event_line(&self.limits, &mut self.found, &line);
            }
            _ => {}
        }
    }
}

/// The reading of one response's costs, and the reservation it settles.
pub(super) struct CostMeter {
    /// Taken by [`CostMeter::finish`]; still here when the request never reached a response
    /// (refused after its limits, by the upstream's learned limit): see `Drop`.
    reservation: Option<Reservation>,
    reading: Decoding,
    /// What was settled at the response head, when only statuses settle this reservation
    /// (`refund_on`, `spend_on`): [`CostMeter::finish`] hands it on for the log.
    settled: Option<Vec<(usize, u64, u64)>>,
}

impl CostMeter {
    /// A meter for `reservation`, whose settled limits are `limits`, in the order reserved.
    pub fn new(reservation: Reservation, limits: Vec<Metered>) -> CostMeter {
        for (reserved, limit) in reservation.reserved().zip(&limits) {
            limit.counters.reserved.inc_by(reserved);
        }
        let found = vec![None; limits.len()];
        CostMeter {
            reservation: Some(reservation),
            reading: Decoding::Identity(Figures {
                limits,
                found,
                body: BodyMode::Skip,
            }),
            settled: None,
        }
    }

    /// The response head: costs in headers, and how to read (and decode) the body.
    pub fn head(&mut self, status: http::StatusCode, headers: &HeaderMap) {
        let figures = self.reading.figures();
        figures.read_status(status.as_u16());
        figures.read_headers(headers);
        // Statuses alone settle this reservation: their word is final at the head, so the
        // units go back now (a login window's 200 that streams its body for a minute must not
        // hold the unit the next 401 needs), not when the body ends.
        if figures
            .limits
            .iter()
            .all(|l| matches!(l.settled.actual, Field::Status(_)))
        {
            self.settled = Some(self.settle(false));
            return;
        }
        let reads_json = figures
            .limits
            .iter()
            .any(|l| matches!(l.settled.actual, Field::Json(_)));
        if !reads_json {
            return;
        }
        let events = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
        figures.body = if events {
            BodyMode::Events(Vec::new())
        } else {
            BodyMode::Json(Vec::new())
        };
        let figures = std::mem::replace(figures, Figures::empty());
        let encoding = headers
            .get(http::header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap_or("unreadable"));
        self.reading = Decoding::new(encoding, figures);
    }

    /// A piece of the response body, as the client gets it.
    pub fn data(&mut self, bytes: &Bytes) {
        self.reading.write(bytes);
    }

    /// The response's trailers: costs a trailer carries.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        self.reading.figures().read_headers(trailers);
    }

    /// The response ended (`complete`: its end was read) or was abandoned: each limit settles
    /// at the cost read, or at its reserve (when nothing was read, or the response was cut
    /// short, whatever an early event said). Returns, per limit, its position, reserve and
    /// settled cost (for the access log).
    pub fn finish(mut self, complete: bool) -> Vec<(usize, u64, u64)> {
        if let Some(settled) = self.settled.take() {
            return settled;
        }
        self.settle(complete)
    }

    /// The request was abandoned before it was forwarded: every reserved unit goes back.
    pub fn give_back(mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let limits = &self.reading.figures().limits;
        for (reserved, limit) in reservation.reserved().zip(limits) {
            limit.counters.refunded.inc_by(reserved);
        }
        let none = vec![0; reservation.len()];
        reservation.settle(&none);
    }

    /// Settles the reservation at what was read (see [`CostMeter::finish`]); once.
    fn settle(&mut self, complete: bool) -> Vec<(usize, u64, u64)> {
        if complete {
            self.reading.end();
        }
        let figures = self.reading.figures();
        figures.end();
        let Some(reservation) = self.reservation.take() else {
            return Vec::new();
        };
        let reserved: Vec<u64> = reservation.reserved().collect();
        let actual: Vec<u64> = reserved
            .iter()
            .zip(&figures.found)
            .zip(&figures.limits)
            .map(|((&reserved, found), limit)| match found {
                // A status's word is final at the head; a figure read from the body only if
                // the body ended well.
                Some(found) if complete || matches!(limit.settled.actual, Field::Status(_)) => {
                    *found
                }
                _ => reserved,
            })
            .collect();
        let mut out = Vec::with_capacity(figures.limits.len());
        for ((limit, &reserved), &actual) in figures.limits.iter().zip(&reserved).zip(&actual) {
            limit.counters.settled.inc_by(actual);
            limit
                .counters
                .refunded
                .inc_by(reserved.saturating_sub(actual));
            limit
                .counters
                .charged
                .inc_by(actual.saturating_sub(reserved));
            out.push((limit.position, reserved, actual));
        }
        reservation.settle(&actual);
        out
    }
}

impl Drop for CostMeter {
    /// A request that never had a response (refused after its limits reserved) keeps its
    /// reserve, as one whose cost is unknown does: counted as settled at it.
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            let limits = &self.reading.figures().limits;
            for (reserved, limit) in reservation.reserved().zip(limits) {
                limit.counters.settled.inc_by(reserved);
            }
        }
    }
}

/// The settled limits a reservation holds (at `positions` of `budget`, in the order it holds
/// them), with their counters from `costs` (by limit position).
pub(super) fn metered(
    budget: &crate::config::Budget,
    positions: &[usize],
    costs: &[Option<CostCounters>],
) -> Vec<Metered> {
    positions
        .iter()
        .filter_map(|&index| {
            let limit = budget.limits.get(index)?;
            let position = limit.position();
            Some(Metered {
                settled: limit.settled.clone()?,
                counters: costs.get(position).cloned().flatten().unwrap_or_default(),
                position,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::config::cost::Reserve;

    /// Figures for one limit whose actual cost is `usage.total_tokens` (at most `max`), reading
    /// a body of `content_type` encoded as `encoding`.
    fn reading(encoding: Option<&str>, events: bool, max: u64) -> Decoding {
        let settled = Arc::new(Settled {
            reserve: Reserve::Units(10),
            actual: Field::Json(["usage".to_string(), "total_tokens".to_string()].into()),
            actual_max: max,
        });
        let figures = Figures {
            limits: vec![Metered {
                settled,
                counters: CostCounters::default(),
                position: 0,
            }],
            found: vec![None],
            body: if events {
                BodyMode::Events(Vec::new())
            } else {
                BodyMode::Json(Vec::new())
            },
        };
        Decoding::new(encoding, figures)
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn encode(encoding: &str, bytes: &[u8]) -> Vec<u8> {
        match encoding {
            "gzip" => gzip(bytes),
            "deflate" => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(bytes).unwrap();
                e.finish().unwrap()
            }
            "br" => {
                let mut out = Vec::new();
                brotli::BrotliCompress(&mut &bytes[..], &mut out, &Default::default()).unwrap();
                out
            }
            "zstd" => zstd::encode_all(bytes, 3).unwrap(),
            _ => bytes.to_vec(),
        }
    }

    /// Feeds `body` in pieces of 7 bytes (a decoder must not need a whole frame at once).
    fn read(mut reading: Decoding, body: &[u8]) -> Option<u64> {
        for piece in body.chunks(7) {
            reading.write(piece);
        }
        reading.end();
        let figures = reading.figures();
        figures.end();
        figures.found[0]
    }

    #[test]
    fn a_compressed_json_body_is_read_in_every_encoding() {
        let padding = "x".repeat(5000);
        let body = format!(r#"{{"pad": "{padding}", "usage": {{"total_tokens": 123}}}}"#);
        for encoding in ["identity", "gzip", "deflate", "br", "zstd", "GZIP"] {
            let encoded = encode(&encoding.to_ascii_lowercase(), body.as_bytes());
            let found = read(reading(Some(encoding), false, 1000), &encoded);
            assert_eq!(found, Some(123), "{encoding}");
        }
    }

    #[test]
    fn a_compressed_event_stream_is_read_as_it_goes() {
        // Each event flushed on its own, as a streaming server compresses.
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut pieces = Vec::new();
        for event in [
            "data: {\"usage\": null}\n\n",
            "data: {\"usage\": {\"total_tokens\": 7}}\n\n",
            "data: [DONE]\n\n",
        ] {
            e.write_all(event.as_bytes()).unwrap();
            e.flush().unwrap();
            pieces.push(std::mem::take(e.get_mut()));
        }
        let mut reading = reading(Some("gzip"), true, 1000);
        reading.write(&pieces[0]);
        reading.write(&pieces[1]);
        // Read as soon as its event arrived, before the stream's end.
        assert_eq!(reading.figures().found[0], Some(7));
        reading.write(&pieces[2]);
        reading.write(&e.finish().unwrap());
        reading.end();
        assert_eq!(reading.figures().found[0], Some(7));
    }

    #[test]
    fn a_body_that_decodes_past_the_cap_or_is_corrupt_is_not_read() {
        // 64 MiB of spaces before the usage: compressed to a few tens of KiB, decoded only as
        // far as the 8 MiB kept.
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b"{").unwrap();
        let spaces = vec![b' '; 1 << 20];
        for _ in 0..64 {
            e.write_all(&spaces).unwrap();
        }
        e.write_all(br#""usage": {"total_tokens": 5}}"#).unwrap();
        let bomb = e.finish().unwrap();
        assert!(bomb.len() < 1 << 20);
        let mut reading = reading(Some("gzip"), false, 1000);
        reading.write(&bomb);
        assert!(
            matches!(reading, Decoding::Stopped(_)),
            "stopped at the cap"
        );
        reading.end();
        assert_eq!(reading.figures().found[0], None);

        let body = br#"{"usage": {"total_tokens": 5}}"#;
        let mut corrupt = gzip(body);
        corrupt[12] ^= 0xff;
        assert_eq!(read(reading_for("gzip"), &corrupt), None);
        // Encodings floodgate does not read, or several: not read (settled at the reserve).
        assert_eq!(read(reading_for("compress"), body), None);
        assert_eq!(read(reading_for("gzip, br"), &gzip(body)), None);
    }

    fn reading_for(encoding: &str) -> Decoding {
        reading(Some(encoding), false, 1000)
    }

    #[test]
    fn a_figure_is_cut_to_actual_max_and_a_figure_that_is_no_count_is_not_read() {
        let figure = |usage: &str| {
            let body = format!(r#"{{"usage": {{"total_tokens": {usage}}}}}"#);
            read(reading(None, false, 1000), body.as_bytes())
        };
        assert_eq!(figure("1e30"), Some(1000));
        assert_eq!(figure("18446744073709551615"), Some(1000));
        assert_eq!(figure("36028797018963668"), Some(1000));
        assert_eq!(figure("12.2"), Some(13));
        assert_eq!(figure("\"40\""), Some(40));
        assert_eq!(figure("-5"), None);
        assert_eq!(figure("\"-5\""), None);
        assert_eq!(figure("\"NaN\""), None);
        assert_eq!(figure("\"inf\""), None);
        assert_eq!(figure("\"ten\""), None);
        assert_eq!(
            figure("1e400"),
            None,
            "not JSON serde reads: the document is not read"
        );
    }
}
