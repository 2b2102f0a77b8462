//! A WebSocket on a route with `websocket:`, after its `101`: the two upgraded connections
//! spliced with the route's limits applied to what the client sends.
//!
//! - `max_connections`: the upgrade request was decided with a concurrency limit of that many per
//!   identity (the route's upgrade budget, `config/route/edge.rs`); its slot is held here for
//!   the connection's life, renewed every third of [`WEBSOCKET_LEASE`] on the store that
//!   granted it (so a crashed instance's connections are released within the lease), and given
//!   back when the connection ends.
//! - `messages`: the client's messages (a text or binary frame starts one) are counted against
//!   a token bucket of the connection's own; past it the connection is closed with 1008 (policy
//!   violation).
//! - `max_message`: a message whose frames add up to more is closed with 1009 (too big) at the
//!   frame that crosses it, before that frame's payload is sent on. Compression is never
//!   negotiated on such a route (the upgrade's `Sec-WebSocket-Extensions` is not forwarded),
//!   so a frame's length is its message's decompressed size.
//! - `idle_timeout`: no byte either way for that long closes the connection (1001).
//!
//! Frames are read as they pass (tungstenite's header parser; payloads are never held, only
//! the bytes of one read): floodgate never buffers a message.

use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tungstenite::protocol::frame::FrameHeader;
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};

use crate::config::{WEBSOCKET_LEASE, WebSocketLimits};
use crate::limiter::HeldLeases;
use crate::metrics::WebSocketMetrics;

/// Close codes (RFC 6455 §7.4.1).
pub const GOING_AWAY: u16 = 1001;
pub const PROTOCOL_ERROR: u16 = 1002;
pub const POLICY_VIOLATION: u16 = 1008;
pub const MESSAGE_TOO_BIG: u16 = 1009;

/// What an upgraded connection on a limited route takes into its life.
pub struct Socket {
    pub limits: Arc<WebSocketLimits>,
    /// The request's concurrency slots (`max_connections`'s among them), held until it ends.
    pub held: Vec<HeldLeases>,
    pub metrics: WebSocketMetrics,
}

/// A token bucket of one connection's own, on a clock its caller passes (the time since the
/// connection opened): `capacity` messages at once, `rate` more a second.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    rate: f64,
    tokens: f64,
    at: Duration,
}

impl Bucket {
    fn new(capacity: u32, rate: f64) -> Self {
        Bucket {
            capacity: f64::from(capacity),
            rate,
            tokens: f64::from(capacity),
            at: Duration::ZERO,
        }
    }

    /// Takes one token at `now`, if there is one.
    fn take(&mut self, now: Duration) -> bool {
        let elapsed = now.saturating_sub(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.at = self.at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The client's frames as they pass: where a frame's header ends, how much of its payload is
/// left, and the message it belongs to.
#[derive(Debug)]
struct Frames {
    header: [u8; 14],
    have: usize,
    payload_left: u64,
    /// Bytes of the message under way, and whether one is (its first frame was not final).
    message: u64,
    in_message: bool,
    bucket: Option<Bucket>,
    max_message: Option<u64>,
}

/// What a frame's header made of the connection.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Nothing new (a control frame, a continuation).
    Frame,
    /// A client message began.
    Message,
}

impl Frames {
    fn new(limits: &WebSocketLimits) -> Self {
        Frames {
            header: [0; 14],
            have: 0,
            payload_left: 0,
            message: 0,
            in_message: false,
            bucket: limits
                .messages
                .map(|(capacity, rate)| Bucket::new(capacity, rate)),
            max_message: limits.max_message,
        }
    }

    /// Reads `input` (the client's next bytes) at `now`: what may pass is appended to `out`
    /// (payload at once, a header once it is whole and allowed), and each message begun is
    /// counted with `message`. `Err` is the close code the connection ends with; what came
    /// before the frame at fault has been appended.
    fn feed(
        &mut self,
        mut input: &[u8],
        now: Duration,
        out: &mut Vec<u8>,
        mut message: impl FnMut(),
    ) -> Result<(), u16> {
        while !input.is_empty() {
            if self.payload_left > 0 {
                let n = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(input.len());
                out.extend_from_slice(&input[..n]);
                self.payload_left -= n as u64;
                input = &input[n..];
                continue;
            }
            let before = self.have;
            let n = (self.header.len() - before).min(input.len());
            self.header[before..before + n].copy_from_slice(&input[..n]);
            self.have += n;
            let mut cursor = Cursor::new(&self.header[..self.have]);
            let parsed = FrameHeader::parse(&mut cursor).map_err(|_| PROTOCOL_ERROR)?;
            let Some((header, length)) = parsed else {
                // Not yet whole: every byte given was taken into the header.
                input = &input[n..];
                continue;
            };
            let size = cursor.position() as usize;
            if self.check(&header, length, now)? == Seen::Message {
                message();
            }
            out.extend_from_slice(&self.header[..size]);
            input = &input[size - before..];
            self.have = 0;
            self.payload_left = length;
        }
        Ok(())
    }

    /// A whole frame header of `length` bytes of payload, at `now`.
    fn check(&mut self, header: &FrameHeader, length: u64, now: Duration) -> Result<Seen, u16> {
        let seen = match header.opcode {
            OpCode::Data(Data::Text | Data::Binary) => {
                if self.in_message {
                    return Err(PROTOCOL_ERROR);
                }
                if let Some(bucket) = &mut self.bucket
                    && !bucket.take(now)
                {
                    return Err(POLICY_VIOLATION);
                }
                self.message = 0;
                self.in_message = !header.is_final;
                Seen::Message
            }
            OpCode::Data(Data::Continue) => {
                if !self.in_message {
                    return Err(PROTOCOL_ERROR);
                }
                self.in_message = !header.is_final;
                Seen::Frame
            }
            OpCode::Data(Data::Reserved(_)) | OpCode::Control(Control::Reserved(_)) => {
                return Err(PROTOCOL_ERROR);
            }
            OpCode::Control(_) => return Ok(Seen::Frame),
        };
        self.message = self.message.saturating_add(length);
        if self.max_message.is_some_and(|max| self.message > max) {
            return Err(MESSAGE_TOO_BIG);
        }
        Ok(seen)
    }
}

/// A close frame with `code`, masked with `mask` (a client's frames must be; a server's must
/// not be).
fn close_frame(code: u16, mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    let mut out = Vec::with_capacity(8);
    let header = FrameHeader {
        mask,
        ..FrameHeader::default()
    };
    // Writing to a Vec cannot fail.
    let _ = header.format(payload.len() as u64, &mut out);
    if let Some(mask) = mask {
        for (i, byte) in payload.iter_mut().enumerate() {
            *byte ^= mask[i % 4];
        }
    }
    out.extend_from_slice(&payload);
    out
}

/// Splices `client` and `upstream` under `socket`'s limits until either side closes, a limit
/// closes it, or it goes idle; then what it held is given back.
pub async fn relay<C, U>(client: C, upstream: U, socket: Socket)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let _open = socket.metrics.opened();
    let reason = splice(client, upstream, &socket).await;
    socket.metrics.closed(reason);
    // `socket.held` drops here: the slots go back to the store that granted them.
}

async fn splice<C, U>(client: C, upstream: U, socket: &Socket) -> &'static str
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut upstream_r, mut upstream_w) = tokio::io::split(upstream);
    let started = tokio::time::Instant::now();
    let mut frames = Frames::new(&socket.limits);
    let (mut from_client, mut from_upstream) = (vec![0u8; 16 << 10], vec![0u8; 16 << 10]);
    let mut passing = Vec::with_capacity(16 << 10);
    // Without `idle_timeout`, a year: never, in effect, and far from overflowing an instant.
    let idle_timeout = (socket.limits.idle_timeout).unwrap_or(Duration::from_secs(365 * 86_400));
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    let mut renew = tokio::time::interval_at(started + WEBSOCKET_LEASE / 3, WEBSOCKET_LEASE / 3);
    let (mut client_open, mut upstream_open) = (true, true);
    let code = loop {
        if !client_open && !upstream_open {
            return "client";
        }
        tokio::select! {
            read = client_r.read(&mut from_client), if client_open => {
                idle.as_mut().reset(tokio::time::Instant::now() + idle_timeout);
                let n = match read {
                    Ok(0) | Err(_) => {
                        client_open = false;
                        let _ = upstream_w.shutdown().await;
                        if !upstream_open {
                            return "client";
                        }
                        continue;
                    }
                    Ok(n) => n,
                };
                passing.clear();
                let fed = frames.feed(&from_client[..n], started.elapsed(), &mut passing, || {
                    socket.metrics.message()
                });
                if !passing.is_empty() && upstream_w.write_all(&passing).await.is_err() {
                    upstream_open = false;
                }
                if let Err(code) = fed {
                    break code;
                }
            }
            read = upstream_r.read(&mut from_upstream), if upstream_open => {
                idle.as_mut().reset(tokio::time::Instant::now() + idle_timeout);
                match read {
                    Ok(0) | Err(_) => {
                        upstream_open = false;
                        let _ = client_w.shutdown().await;
                        if !client_open {
                            return "upstream";
                        }
                    }
                    Ok(n) => {
                        if client_w.write_all(&from_upstream[..n]).await.is_err() {
                            client_open = false;
                        }
                    }
                }
            }
            () = &mut idle => break GOING_AWAY,
            _ = renew.tick(), if !socket.held.is_empty() => {
                for held in &socket.held {
                    held.renew().await;
                }
            }
        }
    };
    // A limit (or idleness) ends it: both sides are told why, then the connection goes. (The
    // client's reply to the close is not awaited: nothing it sends would be forwarded.)
    let _ = client_w.write_all(&close_frame(code, None)).await;
    let _ = client_w.shutdown().await;
    let mask = started.elapsed().subsec_nanos() | 1;
    let _ = upstream_w
        .write_all(&close_frame(code, Some(mask.to_be_bytes())))
        .await;
    let _ = upstream_w.shutdown().await;
    match code {
        POLICY_VIOLATION => "rate",
        MESSAGE_TOO_BIG => "size",
        GOING_AWAY => "idle",
        _ => "protocol",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(messages: Option<(u32, f64)>, max_message: Option<u64>) -> WebSocketLimits {
        WebSocketLimits {
            messages,
            max_message,
            idle_timeout: None,
            upgrade: None,
            max_connections: None,
        }
    }

    /// A client frame: `opcode`, final or not, `payload` masked with a fixed key.
    fn frame(opcode: OpCode, is_final: bool, payload: &[u8]) -> Vec<u8> {
        let mask = [1, 2, 3, 4];
        let header = FrameHeader {
            is_final,
            opcode,
            mask: Some(mask),
            ..FrameHeader::default()
        };
        let mut out = Vec::new();
        header.format(payload.len() as u64, &mut out).unwrap();
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    const TEXT: OpCode = OpCode::Data(Data::Text);
    const MORE: OpCode = OpCode::Data(Data::Continue);
    const PING: OpCode = OpCode::Control(Control::Ping);

    #[test]
    fn frames_pass_whole_whatever_the_reads_that_carry_them() {
        let mut frames = Frames::new(&limits(None, None));
        let wire = [
            frame(TEXT, true, b"hello"),
            frame(PING, true, b""),
            frame(TEXT, true, &[7u8; 70_000]),
        ]
        .concat();
        let (mut out, mut messages) = (Vec::new(), 0);
        // One byte at a time, then in odd pieces: the same bytes come out, in order.
        for byte in &wire[..100] {
            frames
                .feed(std::slice::from_ref(byte), Duration::ZERO, &mut out, || {
                    messages += 1
                })
                .unwrap();
        }
        for piece in wire[100..].chunks(999) {
            frames
                .feed(piece, Duration::ZERO, &mut out, || messages += 1)
                .unwrap();
        }
        assert_eq!(out, wire);
        assert_eq!(messages, 2);
    }

    #[test]
    fn a_message_past_max_message_is_closed_at_the_frame_that_crosses_it() {
        let mut frames = Frames::new(&limits(None, Some(10)));
        let mut out = Vec::new();
        let first = frame(TEXT, false, b"123456");
        frames
            .feed(&first, Duration::ZERO, &mut out, || {})
            .unwrap();
        let crossing = frame(MORE, true, b"78901");
        assert_eq!(
            frames.feed(&crossing, Duration::ZERO, &mut out, || {}),
            Err(MESSAGE_TOO_BIG)
        );
        // What crossed was not sent on.
        assert_eq!(out, first);
        // A message of exactly the limit passes.
        let mut frames = Frames::new(&limits(None, Some(10)));
        frames
            .feed(
                &frame(TEXT, true, b"1234567890"),
                Duration::ZERO,
                &mut Vec::new(),
                || {},
            )
            .unwrap();
    }

    #[test]
    fn messages_past_the_bucket_close_with_1008_and_it_refills() {
        let mut frames = Frames::new(&limits(Some((2, 1.0)), None));
        let mut out = Vec::new();
        let message = frame(TEXT, true, b"x");
        for _ in 0..2 {
            frames
                .feed(&message, Duration::ZERO, &mut out, || {})
                .unwrap();
        }
        // Control frames are not messages.
        frames
            .feed(&frame(PING, true, b""), Duration::ZERO, &mut out, || {})
            .unwrap();
        assert_eq!(
            frames.feed(&message, Duration::from_millis(500), &mut out, || {}),
            Err(POLICY_VIOLATION)
        );
        // A second after the first two, one more is allowed (a fresh connection's bucket).
        let mut frames = Frames::new(&limits(Some((2, 1.0)), None));
        for _ in 0..2 {
            frames
                .feed(&message, Duration::ZERO, &mut out, || {})
                .unwrap();
        }
        frames
            .feed(&message, Duration::from_secs(1), &mut out, || {})
            .unwrap();
    }

    #[test]
    fn a_continuation_without_a_message_is_a_protocol_error() {
        let mut frames = Frames::new(&limits(None, None));
        assert_eq!(
            frames.feed(
                &frame(MORE, true, b"x"),
                Duration::ZERO,
                &mut Vec::new(),
                || {}
            ),
            Err(PROTOCOL_ERROR)
        );
    }

    #[test]
    fn a_close_frame_carries_its_code_masked_or_not() {
        assert_eq!(close_frame(1008, None), [0x88, 0x02, 0x03, 0xF0]);
        let masked = close_frame(1009, Some([0xFF, 0, 0, 0]));
        assert_eq!(masked[..2], [0x88, 0x82]);
        assert_eq!(masked[2..6], [0xFF, 0, 0, 0]);
        assert_eq!(masked[6..], [0x03 ^ 0xFF, 0xF1]);
    }
}
