//! What an HTTP/2 upstream sends, read before `h2` reads it: the frames as they come off the
//! connection, for two things `h2` does not do for a client.
//!
//! - **Its SETTINGS.** [`PeerSettings`] says when the upstream's first SETTINGS frame has come
//!   and what `SETTINGS_MAX_CONCURRENT_STREAMS` it set, so the pool opens no stream over a limit
//!   it has not learned yet (`multiplex.rs`).
//! - **Malformed header blocks** (RFC 9113 §8.1.1, §8.3): a response head carrying a request
//!   pseudo-header (`:path`, `:method`, `:scheme`, `:authority`, `:protocol`), and trailers
//!   carrying any pseudo-header. `h2` drops such fields silently, so a malformed response would
//!   be relayed as a success. Each header block is decoded here with a second HPACK decoder
//!   that sees the same blocks in the same order (so its dynamic table is `h2`'s); a malformed
//!   one is passed on with one more field that `h2` itself refuses, a `connection` field
//!   (§8.2.2), in a CONTINUATION frame of its own and encoded without indexing (so `h2`'s
//!   table is untouched): `h2` then resets the stream with `PROTOCOL_ERROR`, and the request
//!   gets a 502 (a response head) or a cut response (trailers), never a success.
//!
//! Frames are only parsed, never buffered beyond one frame, and passed on unchanged otherwise.
//! What cannot be parsed (a frame larger than any `h2` accepts, an HPACK error, which `h2` turns
//! into a connection error of its own) stops the inspection: the bytes then pass untouched.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};

/// The largest frame parsed (h2's client accepts 16 KiB frames unless told otherwise; a larger
/// one is its error to report).
const MAX_FRAME: usize = 1 << 20;
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;
/// The header table size floodgate's client allows the upstream (h2's default).
const HEADER_TABLE_SIZE: usize = 4096;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// `SETTINGS_MAX_CONCURRENT_STREAMS`.
const MAX_CONCURRENT_STREAMS: u16 = 0x3;

/// The literal field `connection: x`, without indexing, with a new name (RFC 7541 §6.2.2):
/// what makes `h2` refuse a header block as malformed (RFC 9113 §8.2.2).
const REFUSED_FIELD: &[u8] = b"\x00\x0aconnection\x01x";

/// What the upstream's SETTINGS said, as far as the pool needs it.
#[derive(Debug, Default)]
pub struct PeerSettings {
    received: AtomicBool,
    /// `u64::MAX`: not set (no limit).
    max_streams: AtomicU64,
    /// Woken at each SETTINGS frame (the pool's requests waiting for a stream).
    changed: Arc<tokio::sync::Notify>,
}

impl PeerSettings {
    /// Settings not yet received, whose arrival wakes `changed`'s waiters.
    pub fn new(changed: Arc<tokio::sync::Notify>) -> PeerSettings {
        PeerSettings {
            received: AtomicBool::new(false),
            max_streams: AtomicU64::new(u64::MAX),
            changed,
        }
    }

    /// True once the upstream's first SETTINGS frame has been read.
    pub fn received(&self) -> bool {
        self.received.load(Ordering::Acquire)
    }

    /// The `SETTINGS_MAX_CONCURRENT_STREAMS` it last set (`None`: none, or none yet). The pool
    /// reads h2's copy of it; this one is for tests.
    #[cfg(test)]
    pub fn max_streams(&self) -> Option<u64> {
        Some(self.max_streams.load(Ordering::Acquire)).filter(|n| *n != u64::MAX)
    }
}

/// A header block being read: its stream, the kind of frame that opened it, its fragments.
struct Block {
    stream: u32,
    promise: bool,
    fragment: Vec<u8>,
}

/// The parser: what has been read and not yet passed on, and what is known of the streams.
pub(super) struct Inspector {
    /// Bytes read but not yet a whole frame.
    input: BytesMut,
    /// Frames ready for `h2`.
    output: BytesMut,
    /// Set when inspecting stopped: bytes pass untouched from then on.
    passthrough: bool,
    decoder: loona_hpack::Decoder<'static>,
    block: Option<Block>,
    /// Streams whose final (non-1xx) response head has come: a header block after it is
    /// trailers.
    answered: HashSet<u32>,
    settings: Arc<PeerSettings>,
}

impl Inspector {
    pub(super) fn new(settings: Arc<PeerSettings>) -> Inspector {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Inspector {
            input: BytesMut::new(),
            output: BytesMut::new(),
            passthrough: false,
            decoder,
            block: None,
            answered: HashSet::new(),
            settings,
        }
    }

    /// Takes `bytes` as read from the upstream; the frames complete so far move to the output.
    pub(super) fn read(&mut self, bytes: &[u8]) {
        if self.passthrough {
            self.output.extend_from_slice(bytes);
            return;
        }
        self.input.extend_from_slice(bytes);
        while self.input.len() >= 9 {
            let length = usize::from(self.input[0]) << 16
                | usize::from(self.input[1]) << 8
                | usize::from(self.input[2]);
            if length > MAX_FRAME {
                self.stop("a frame larger than floodgate parses");
                return;
            }
            if self.input.len() < 9 + length {
                return;
            }
            let frame = self.input.split_to(9 + length);
            self.frame(frame);
            if self.passthrough {
                return;
            }
        }
    }

    /// Bytes ready for `h2`.
    pub(super) fn output(&mut self) -> &mut BytesMut {
        &mut self.output
    }

    fn stop(&mut self, why: &str) {
        tracing::debug!(
            why,
            "no longer inspecting an upstream HTTP/2 connection's frames"
        );
        self.passthrough = true;
        let rest = self.input.split();
        self.output.extend_from_slice(&rest);
    }

    fn frame(&mut self, mut frame: BytesMut) {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[9..];
        match kind {
            SETTINGS if stream == 0 && flags & ACK == 0 => {
                for setting in payload.chunks_exact(6) {
                    if u16::from_be_bytes([setting[0], setting[1]]) == MAX_CONCURRENT_STREAMS {
                        let n =
                            u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                        self.settings
                            .max_streams
                            .store(u64::from(n), Ordering::Release);
                    }
                }
                self.settings.received.store(true, Ordering::Release);
                self.settings.changed.notify_waiters();
            }
            HEADERS | PUSH_PROMISE | CONTINUATION => {
                let Some(fragment) = fragment(kind, flags, payload) else {
                    self.stop("a header frame that does not parse");
                    self.output.extend_from_slice(&frame);
                    return;
                };
                match (&mut self.block, kind) {
                    (Some(block), CONTINUATION) if block.stream == stream => {
                        block.fragment.extend_from_slice(fragment);
                    }
                    (None, HEADERS | PUSH_PROMISE) => {
                        self.block = Some(Block {
                            stream,
                            promise: kind == PUSH_PROMISE,
                            fragment: fragment.to_vec(),
                        });
                    }
                    // Out of order: h2 ends the connection for it.
                    _ => {
                        self.stop("header frames out of order");
                        self.output.extend_from_slice(&frame);
                        return;
                    }
                }
                if flags & END_HEADERS != 0 {
                    let block = self.block.take();
                    if let Some(block) = block {
                        match self.malformed(&block, kind == HEADERS && flags & END_STREAM != 0) {
                            Ok(false) => {}
                            Ok(true) => {
                                // The block goes on, plus a CONTINUATION with the refused
                                // field.
                                frame[4] &= !END_HEADERS;
                                self.output.extend_from_slice(&frame);
                                self.refuse(block.stream);
                                return;
                            }
                            Err(()) => {
                                self.output.extend_from_slice(&frame);
                                self.stop("an HPACK block that does not decode");
                                return;
                            }
                        }
                    }
                }
                if kind == HEADERS && flags & END_STREAM != 0 {
                    self.answered.remove(&stream);
                }
            }
            DATA if flags & END_STREAM != 0 => {
                self.answered.remove(&stream);
            }
            RST_STREAM => {
                self.answered.remove(&stream);
            }
            _ => {}
        }
        self.output.extend_from_slice(&frame);
    }

    /// Decodes `block` (keeping the table in step with h2's) and says whether it is malformed:
    /// a response head with a request pseudo-header, or trailers with any pseudo-header.
    /// `ends`: its HEADERS frame ends the stream. `Err`: it does not decode.
    fn malformed(&mut self, block: &Block, ends: bool) -> Result<bool, ()> {
        let trailers = self.answered.contains(&block.stream);
        let (mut status, mut bad) = (None::<Vec<u8>>, false);
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                if name.first() == Some(&b':') {
                    if trailers || block.promise || &name[..] != b":status" {
                        bad |= !block.promise;
                    } else {
                        status = Some(value.into_owned());
                    }
                }
            })
            .map_err(|_| ())?;
        if block.promise {
            return Ok(false);
        }
        let informational = status.as_deref().is_some_and(|s| s.first() == Some(&b'1'));
        if !trailers && !informational && !ends && status.is_some() {
            self.answered.insert(block.stream);
        }
        Ok(bad)
    }

    /// Passes on a CONTINUATION frame ending `stream`'s header block with the field h2 refuses.
    fn refuse(&mut self, stream: u32) {
        let length = REFUSED_FIELD.len() as u32;
        self.output.put_slice(&length.to_be_bytes()[1..]);
        self.output.put_u8(CONTINUATION);
        self.output.put_u8(END_HEADERS);
        self.output.put_u32(stream);
        self.output.put_slice(REFUSED_FIELD);
        self.answered.remove(&stream);
        tracing::warn!(
            stream,
            "the upstream sent a malformed header block (a request pseudo-header in a response, or a pseudo-header in trailers): the stream is refused"
        );
    }
}

/// A header frame's block fragment: its payload without padding, priority or promised stream.
fn fragment(kind: u8, flags: u8, payload: &[u8]) -> Option<&[u8]> {
    if kind == CONTINUATION {
        return Some(payload);
    }
    let (mut start, mut end) = (0, payload.len());
    if flags & PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    if kind == HEADERS && flags & PRIORITY != 0 {
        start += 5;
    }
    if kind == PUSH_PROMISE {
        start += 4;
    }
    payload.get(start..end)
}

/// An upstream connection whose incoming frames go through an [`Inspector`] before `h2`.
pub struct Inspected<T> {
    inner: T,
    inspector: Box<Inspector>,
}

impl<T> Inspected<T> {
    pub fn new(inner: T, settings: Arc<PeerSettings>) -> Inspected<T> {
        Inspected {
            inner,
            inspector: Box::new(Inspector::new(settings)),
        }
    }
}

impl<T: Read + Unpin> Read for Inspected<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            let ready = this.inspector.output();
            if !ready.is_empty() {
                let n = ready.len().min(buf.remaining());
                buf.put_slice(&ready[..n]);
                ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, read.unfilled()) {
                Poll::Ready(Ok(())) => {
                    let filled = read.filled();
                    if filled.is_empty() {
                        // The end: whatever is left (a partial frame) goes to h2 as it is.
                        let rest = this.inspector.input.split();
                        if rest.is_empty() {
                            return Poll::Ready(Ok(()));
                        }
                        this.inspector.output.extend_from_slice(&rest);
                        continue;
                    }
                    this.inspector.read(filled);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<T: Write + Unpin> Write for Inspected<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    fn block(fields: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut encoder = loona_hpack::Encoder::new();
        encoder.encode(fields.iter().copied())
    }

    /// One frame: kind, flags, stream, payload.
    type Parsed = (u8, u8, u32, Vec<u8>);

    /// Every frame in `bytes`.
    fn frames(mut bytes: &[u8]) -> Vec<Parsed> {
        let mut out = Vec::new();
        while bytes.len() >= 9 {
            let length = (usize::from(bytes[0]) << 16)
                | (usize::from(bytes[1]) << 8)
                | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + length].to_vec()));
            bytes = &bytes[9 + length..];
        }
        out
    }

    fn inspect(input: &[u8], piece: usize) -> (Vec<Parsed>, Arc<PeerSettings>) {
        let settings = Arc::new(PeerSettings::new(Default::default()));
        let mut inspector = Inspector::new(settings.clone());
        for chunk in input.chunks(piece) {
            inspector.read(chunk);
        }
        (frames(&inspector.output().split()), settings)
    }

    #[test]
    fn settings_are_noted_and_frames_pass_unchanged() {
        let mut input = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 1, 0, 4, 0, 1, 0, 0]);
        let head = block(&[(b":status", b"200"), (b"content-type", b"application/grpc")]);
        input.extend(frame(HEADERS, END_HEADERS, 1, &head));
        input.extend(frame(DATA, 0, 1, b"hello"));
        let trailers = block(&[(b"grpc-status", b"0")]);
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &trailers));
        for piece in [1, 7, 4096] {
            let (out, settings) = inspect(&input, piece);
            assert!(settings.received());
            assert_eq!(settings.max_streams(), Some(1));
            assert_eq!(out, frames(&input), "byte for byte, read {piece} at a time");
        }
    }

    #[test]
    fn a_request_pseudo_header_in_a_head_or_any_in_trailers_is_refused_to_h2() {
        let head = block(&[(b":status", b"200"), (b":path", b"/x")]);
        let input = frame(HEADERS, END_HEADERS, 3, &head);
        let (out, _) = inspect(&input, 5);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].1 & END_HEADERS, 0, "the block goes on");
        assert_eq!(
            (out[1].0, out[1].1, out[1].2),
            (CONTINUATION, END_HEADERS, 3)
        );
        assert_eq!(out[1].3, REFUSED_FIELD);

        // Trailers after a good head: `:status` (or any pseudo) is malformed there.
        let mut input = frame(HEADERS, END_HEADERS, 5, &block(&[(b":status", b"200")]));
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            5,
            &block(&[(b":status", b"200"), (b"grpc-status", b"0")]),
        ));
        let (out, _) = inspect(&input, 64);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].1, END_STREAM, "END_HEADERS cleared, END_STREAM kept");
        assert_eq!(out[2].0, CONTINUATION);
    }

    #[test]
    fn the_dynamic_table_stays_in_step_across_blocks_and_informational_heads_are_not_final() {
        // One encoder for the connection, as the upstream's: the second block refers to the
        // first's entries.
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = frame(
            HEADERS,
            END_HEADERS,
            1,
            &encoder.encode([(&b":status"[..], &b"103"[..]), (b"link", b"</a>")]),
        );
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encoder.encode([(&b":status"[..], &b"200"[..]), (b"x-custom", b"one")]),
        ));
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &encoder.encode([(&b"x-custom"[..], &b"one"[..])]),
        ));
        let (out, _) = inspect(&input, 3);
        assert_eq!(out, frames(&input), "nothing malformed");
    }

    #[test]
    fn a_block_split_over_continuation_frames_is_decoded_whole() {
        let head = block(&[(b":status", b"299"), (b":method", b"FETCH")]);
        let (first, rest) = head.split_at(3);
        let mut input = frame(HEADERS, 0, 7, first);
        input.extend(frame(CONTINUATION, END_HEADERS, 7, rest));
        let (out, _) = inspect(&input, 2);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1].1 & END_HEADERS, 0);
        assert_eq!(out[2].3, REFUSED_FIELD);
    }
}
