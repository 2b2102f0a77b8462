//! A guard between QUIC and h3: reads the HTTP/3 frame headers on every stream a client opens as
//! the bytes pass, before h3 buffers anything, and closes the connection on what h3 0.0.8 would
//! hold or let through:
//!
//! - a frame other than DATA that declares more than [`MAX_FRAME`] bytes (h3 assembles HEADERS,
//!   SETTINGS and unknown frames whole: a declared 2^62 − 1 would be held as it arrives):
//!   `H3_EXCESSIVE_LOAD`;
//! - a frame on the control stream still incomplete `frame_time` after its first byte (a
//!   control stream that drips a frame forever; a request stream's head is timed by the
//!   listener, which gives up the stream): `H3_EXCESSIVE_LOAD`;
//! - a push stream from a client (RFC 9114 §6.2.2: only servers push): `H3_STREAM_CREATION_ERROR`;
//! - on the control stream, `MAX_PUSH_ID` lower than before (§7.2.7) or `CANCEL_PUSH` of a push
//!   ID above the one the client allowed (§7.2.3; floodgate never pushes): `H3_ID_ERROR`;
//! - on a request stream, a HEADERS frame whose pseudo-headers break RFC 9114 §4.1.2 and §4.3
//!   (`fields.rs`): `H3_MESSAGE_ERROR`, for the connection (§8 allows a stream error to be
//!   treated so), since the guard holds no handle on the stream's sending side.
//!
//! The bytes themselves go to h3 unchanged: this only reads them. DATA frames' payloads are not
//! looked at (a body is bounded by `max_body_size` further on); QPACK's streams and stream
//! types h3 ignores pass through.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};
use tokio::time::{Instant, Sleep};

/// The largest frame other than DATA a client may send: twice the listener's header section
/// limit (64 KiB), so that a header section somewhat past it is still read and answered 431 by
/// h3, the connection going on, while a frame far past it (a declared 2^62 − 1) closes the
/// connection before anything of it is held. SETTINGS, GOAWAY and the push frames are a few
/// bytes. At most `http3.max_streams` such frames are held at once per connection.
pub(super) const MAX_FRAME: u64 = 128 * 1024;

const H3_STREAM_CREATION_ERROR: u32 = 0x103;
const H3_MESSAGE_ERROR: u32 = 0x10e;
const H3_ID_ERROR: u32 = 0x108;
const H3_EXCESSIVE_LOAD: u32 = 0x107;

const DATA: u64 = 0x00;
const HEADERS: u64 = 0x01;
const CANCEL_PUSH: u64 = 0x03;
const MAX_PUSH_ID: u64 = 0x0d;

/// What one connection's guards share: the connection (to close it) and what its control
/// stream said.
pub(super) struct Shared {
    connection: quinn::Connection,
    /// The highest push ID the client allowed (`MAX_PUSH_ID`), if it sent one.
    max_push_id: Mutex<Option<u64>>,
    /// How long a frame other than DATA may take to arrive whole.
    frame_time: Duration,
}

impl Shared {
    /// Closes the connection with `code`, saying `why` in the log; the error h3 is handed.
    fn close(&self, code: u32, why: &'static str) -> StreamErrorIncoming {
        tracing::debug!(
            peer = %self.connection.remote_address(),
            code,
            why,
            "HTTP/3 connection closed"
        );
        self.connection.close(code.into(), why.as_bytes());
        StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: ConnectionErrorIncoming::ApplicationClose {
                error_code: u64::from(code),
            },
        }
    }
}

/// A QUIC variable-length integer read a byte at a time (RFC 9000 §16).
#[derive(Debug, Clone, Copy, Default)]
struct Varint {
    value: u64,
    /// Bytes still to come; `None` before the first.
    left: Option<u8>,
}

impl Varint {
    /// Feeds one byte; the value once whole.
    fn feed(&mut self, byte: u8) -> Option<u64> {
        let left = match self.left {
            None => {
                let len = 1u8 << (byte >> 6);
                self.value = u64::from(byte & 0x3f);
                len - 1
            }
            Some(left) => {
                self.value = (self.value << 8) | u64::from(byte);
                left - 1
            }
        };
        self.left = Some(left);
        (left == 0).then_some(self.value)
    }

    fn started(&self) -> bool {
        self.left.is_some()
    }
}

/// Where a stream's reader is.
#[derive(Debug, Clone)]
enum State {
    /// A unidirectional stream's type.
    StreamType(Varint),
    /// A frame's type.
    FrameType(Varint),
    /// A frame's length, after its type.
    Length { kind: u64, length: Varint },
    /// A frame's payload: `left` bytes still to come (a push frame's kept, to be read).
    Payload {
        kind: u64,
        left: u64,
        kept: Option<Vec<u8>>,
    },
    /// Bytes that are not frames (QPACK's streams, stream types h3 ignores): not looked at.
    Opaque,
}

/// What kind of stream a guard reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Request,
    Control,
    Other,
}

/// A stream the client opened, read through the guard.
pub(super) struct Guarded<S> {
    inner: S,
    shared: Arc<Shared>,
    state: State,
    kind: Kind,
    /// A request stream's HEADERS frames so far (the first is the head, later ones trailers).
    headers: u32,
    /// When the frame being read (other than DATA) began, and the timer for its deadline.
    frame_since: Option<Instant>,
    timer: Option<std::pin::Pin<Box<Sleep>>>,
}

impl<S> Guarded<S> {
    fn request(inner: S, shared: Arc<Shared>) -> Self {
        Guarded {
            inner,
            shared,
            state: State::FrameType(Varint::default()),
            kind: Kind::Request,
            headers: 0,
            frame_since: None,
            timer: None,
        }
    }

    fn unidirectional(inner: S, shared: Arc<Shared>) -> Self {
        Guarded {
            inner,
            shared,
            state: State::StreamType(Varint::default()),
            kind: Kind::Other,
            headers: 0,
            frame_since: None,
            timer: None,
        }
    }

    /// Reads `bytes` (what the stream just gave), checking each frame header as it completes.
    fn read(&mut self, mut bytes: &[u8]) -> Result<(), StreamErrorIncoming> {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Opaque => return Ok(()),
                State::StreamType(v) => {
                    if let Some(kind) = v.feed(bytes[0]) {
                        self.state = match kind {
                            0x00 => {
                                self.kind = Kind::Control;
                                State::FrameType(Varint::default())
                            }
                            0x01 => {
                                return Err(self.shared.close(
                                    H3_STREAM_CREATION_ERROR,
                                    "a client may not open a push stream",
                                ));
                            }
                            _ => State::Opaque,
                        };
                    }
                    bytes = &bytes[1..];
                }
                State::FrameType(v) => {
                    if !v.started() && self.kind == Kind::Control {
                        // A new frame: its clock starts (DATA's is stopped once known).
                        self.frame_since = Some(Instant::now());
                    }
                    if let Some(kind) = v.feed(bytes[0]) {
                        self.state = State::Length {
                            kind,
                            length: Varint::default(),
                        };
                    }
                    bytes = &bytes[1..];
                }
                State::Length { kind, length } => {
                    let kind = *kind;
                    if let Some(length) = length.feed(bytes[0]) {
                        if kind != DATA && length > MAX_FRAME {
                            return Err(self
                                .shared
                                .close(H3_EXCESSIVE_LOAD, "a frame larger than floodgate reads"));
                        }
                        if kind == DATA {
                            self.frame_since = None;
                        }
                        let push =
                            self.kind == Kind::Control && matches!(kind, CANCEL_PUSH | MAX_PUSH_ID);
                        let fields = self.kind == Kind::Request && kind == HEADERS;
                        self.state = State::Payload {
                            kind,
                            left: length,
                            kept: (push || fields).then(Vec::new),
                        };
                        if length == 0 {
                            self.frame_done()?;
                        }
                    }
                    bytes = &bytes[1..];
                }
                State::Payload { left, kept, .. } => {
                    let take = (*left).min(bytes.len() as u64) as usize;
                    if let Some(kept) = kept {
                        kept.extend_from_slice(&bytes[..take]);
                    }
                    *left -= take as u64;
                    bytes = &bytes[take..];
                    if *left == 0 {
                        self.frame_done()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A frame has arrived whole: a push frame on the control stream is checked.
    fn frame_done(&mut self) -> Result<(), StreamErrorIncoming> {
        let state = std::mem::replace(&mut self.state, State::FrameType(Varint::default()));
        self.frame_since = None;
        let State::Payload {
            kind,
            kept: Some(kept),
            ..
        } = state
        else {
            return Ok(());
        };
        if kind == HEADERS {
            let trailers = self.headers > 0;
            self.headers += 1;
            return match super::fields::malformed(&kept, trailers) {
                Some(why) => Err(self.shared.close(H3_MESSAGE_ERROR, why)),
                None => Ok(()),
            };
        }
        let mut id = Varint::default();
        let value = kept.iter().find_map(|&b| id.feed(b));
        let Some(value) = value else {
            // h3 refuses a malformed frame itself.
            return Ok(());
        };
        let mut allowed = self
            .shared
            .max_push_id
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match kind {
            MAX_PUSH_ID if allowed.is_some_and(|max| value < max) => Err(self
                .shared
                .close(H3_ID_ERROR, "MAX_PUSH_ID may not be lowered")),
            MAX_PUSH_ID => {
                *allowed = Some(value);
                Ok(())
            }
            _ if allowed.is_none_or(|max| value > max) => Err(self
                .shared
                .close(H3_ID_ERROR, "CANCEL_PUSH of a push ID never allowed")),
            _ => Ok(()),
        }
    }

    /// True once the frame being read has taken longer than it may; arms the timer otherwise.
    fn late(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(since) = self.frame_since else {
            return false;
        };
        let deadline = since + self.shared.frame_time;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx).is_ready()
    }
}

impl<S: quic::RecvStream<Buf = Bytes>> quic::RecvStream for Guarded<S> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        match self.inner.poll_data(cx) {
            Poll::Ready(Ok(Some(bytes))) => {
                self.read(bytes.chunk())?;
                Poll::Ready(Ok(Some(bytes)))
            }
            Poll::Pending if self.late(cx) => Poll::Ready(Err(self
                .shared
                .close(H3_EXCESSIVE_LOAD, "a frame took too long to arrive"))),
            other => other,
        }
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

impl<B: Buf, S: quic::SendStream<B>> quic::SendStream<B> for Guarded<S> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.inner.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.inner.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.inner.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.inner.reset(reset_code)
    }

    fn send_id(&self) -> StreamId {
        self.inner.send_id()
    }
}

impl<B, S> quic::BidiStream<B> for Guarded<S>
where
    B: Buf,
    S: quic::BidiStream<B> + quic::RecvStream<Buf = Bytes>,
    S::RecvStream: quic::RecvStream<Buf = Bytes>,
{
    type SendStream = S::SendStream;
    type RecvStream = Guarded<S::RecvStream>;

    fn split(self) -> (Self::SendStream, Self::RecvStream) {
        let (send, recv) = self.inner.split();
        let recv = Guarded {
            inner: recv,
            shared: self.shared,
            state: self.state,
            kind: self.kind,
            headers: self.headers,
            frame_since: self.frame_since,
            timer: None,
        };
        (send, recv)
    }
}

/// A QUIC connection whose streams from the client are read through [`Guarded`].
pub(super) struct Connection {
    inner: h3_quinn::Connection,
    /// What the streams floodgate opens are opened with (the connection's own too).
    opener: Opener,
    shared: Arc<Shared>,
}

impl Connection {
    pub(super) fn new(connection: quinn::Connection, frame_time: Duration) -> Self {
        let inner = h3_quinn::Connection::new(connection.clone());
        let shared = Arc::new(Shared {
            connection,
            max_push_id: Mutex::new(None),
            frame_time,
        });
        let opener = Opener {
            inner: <h3_quinn::Connection as quic::Connection<Bytes>>::opener(&inner),
            shared: shared.clone(),
        };
        Connection {
            inner,
            opener,
            shared,
        }
    }
}

impl<B: Buf> quic::Connection<B> for Connection {
    type RecvStream = Guarded<h3_quinn::RecvStream>;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::RecvStream, ConnectionErrorIncoming>> {
        let stream = std::task::ready!(
            <h3_quinn::Connection as quic::Connection<B>>::poll_accept_recv(&mut self.inner, cx)
        )?;
        Poll::Ready(Ok(Guarded::unidirectional(stream, self.shared.clone())))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        let stream = std::task::ready!(
            <h3_quinn::Connection as quic::Connection<B>>::poll_accept_bidi(&mut self.inner, cx)
        )?;
        Poll::Ready(Ok(Guarded::request(stream, self.shared.clone())))
    }

    fn opener(&self) -> Self::OpenStreams {
        self.opener.clone()
    }
}

impl<B: Buf> quic::OpenStreams<B> for Connection {
    type BidiStream = Guarded<h3_quinn::BidiStream<B>>;
    type SendStream = h3_quinn::SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        self.opener.poll_open_bidi(cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        self.opener.poll_open_send(cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        <Opener as quic::OpenStreams<B>>::close(&mut self.opener, code, reason)
    }
}

/// What h3 opens its own streams with (its control and QPACK streams: send only).
pub(super) struct Opener {
    inner: h3_quinn::OpenStreams,
    shared: Arc<Shared>,
}

impl<B: Buf> quic::OpenStreams<B> for Opener {
    type BidiStream = Guarded<h3_quinn::BidiStream<B>>;
    type SendStream = h3_quinn::SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        let stream = std::task::ready!(self.inner.poll_open_bidi(cx))?;
        Poll::Ready(Ok(Guarded::request(stream, self.shared.clone())))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        self.inner.poll_open_send(cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        <h3_quinn::OpenStreams as quic::OpenStreams<B>>::close(&mut self.inner, code, reason)
    }
}

impl Clone for Opener {
    fn clone(&self) -> Self {
        Opener {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Varint;

    #[test]
    fn varints_of_each_length_read_a_byte_at_a_time() {
        for (bytes, value) in [
            (&[0x25][..], 37u64),
            (&[0x7b, 0xbd], 15_293),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0xff; 8], (1 << 62) - 1),
        ] {
            let mut v = Varint::default();
            let (last, head) = bytes.split_last().unwrap();
            for &b in head {
                assert_eq!(v.feed(b), None);
            }
            assert_eq!(v.feed(*last), Some(value), "{bytes:x?}");
        }
    }
}
