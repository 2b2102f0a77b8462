//! The HTTP/3 listener: QUIC (quinn) on a UDP socket beside the TCP listener, HTTP/3 (h3) on each
//! connection, and every request through the proxy's one pipeline ([`Proxy::handle`]), as the
//! TCP listener's: this module only turns QUIC streams into requests and responses back.
//!
//! What a flood meets here (`docs/deployment.md`, "HTTP/3"):
//! - 0-RTT is never accepted (the TLS config offers no early data), so no request is decided
//!   before its handshake is complete and a replayed one is never seen;
//! - handshakes in progress past [`RETRY_ABOVE`] make every new client prove its address first
//!   (a Retry: one more round trip, and a spoofed source gets nowhere); connections past
//!   `max_connections` (shared with TCP) are refused; QUIC's own queue of connection attempts
//!   not yet looked at is bounded ([`MAX_INCOMING`]);
//! - per connection, `http3.max_streams` request streams at once (QUIC's stream credit), a
//!   request's head within `timeouts.header_read` (else its stream is given up),
//!   header sections of at most 64 KiB, QPACK without a dynamic table (h3 encodes and decodes
//!   statelessly, so a client cannot make the server hold one), and `http3.idle_timeout`;
//! - a stream reset before floodgate looked at it is dropped unanswered: nothing decided,
//!   nothing forwarded; one reset while it is decided is found by the proxy's look just before
//!   forwarding ([`ClientLeft`]): not forwarded, what its decision spent given back, the stream
//!   cancelled;
//! - every frame header a client sends is read as it arrives, before h3 buffers the frame
//!   (`frames.rs`): a frame other than DATA is at most 128 KiB, a control-stream frame must
//!   arrive whole within `timeouts.header_read`, a client's push stream, a lowered
//!   `MAX_PUSH_ID` and pseudo-headers out of place (`fields.rs`) close the connection;
//! - a malformed request (connection-specific fields, `content-length` that is not one number
//!   or disagrees with the DATA frames) is refused before it is decided or forwarded whole;
//! - streams a connection abandons before their answer spend `http2_max_resets_per_second`,
//!   as HTTP/2's do; past it the connection is closed;
//! - a drain (SIGTERM) sends GOAWAY, lets the streams already accepted finish, then closes.

mod fields;
mod frames;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::{Buf, Bytes};
use http::Response;
use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::Serving;
use crate::config::Http3Config;
use crate::proxy::body::{Abandoned, BoxError, ClientLeft, Incoming};
use crate::proxy::{Body, Proxy};

/// Handshakes in progress past which new clients must prove their address (a Retry) first.
const RETRY_ABOVE: usize = 256;

/// Connection attempts QUIC holds before floodgate has looked at them; more are dropped.
const MAX_INCOMING: usize = 4096;

/// The largest header section a request may send (nginx's `large_client_header_buffers`
/// default is 4 × 8 KiB; HTTP/2's listener allows 64 KiB).
const MAX_FIELD_SECTION: u64 = 64 * 1024;

/// HTTP/3's "no error" code, for closing a connection that is done.
const H3_NO_ERROR: u32 = 0x100;

/// HTTP/3's "excessive load" code, for a connection that resets streams past its budget.
const H3_EXCESSIVE_LOAD: u32 = 0x107;

/// HTTP/3's "internal error" code, for a response whose body failed mid-way.
const H3_INTERNAL_ERROR: u64 = 0x102;

/// HTTP/3's "request cancelled" code (RFC 9114 §8.1), for a request its client abandoned.
const H3_REQUEST_CANCELLED: u64 = 0x10c;

/// HTTP/3's "malformed message" code (RFC 9114 §4.1.2), for a request refused as one.
const H3_MESSAGE_ERROR: u64 = 0x10e;

/// Why `req`'s head is a malformed HTTP/3 request (RFC 9114 §4.2, §4.1.2) that h3 0.0.8 lets
/// through, if it is: a connection-specific field, or `content-length` values that are not one
/// number. Its body's length is held to that number as it arrives ([`RecvBody`]).
fn malformed(req: &http::Request<()>) -> Option<&'static str> {
    let headers = req.headers();
    let connection_specific = [CONNECTION, TRANSFER_ENCODING, UPGRADE]
        .iter()
        .any(|name| headers.contains_key(name))
        || headers.contains_key("keep-alive")
        || headers.contains_key("proxy-connection");
    if connection_specific {
        return Some("a connection-specific field");
    }
    if headers
        .get_all(TE)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"trailers"))
    {
        return Some("TE other than trailers");
    }
    declared_length(headers).err()
}

/// The body length `content-length` declares: none, or one number however many times it is
/// repeated (RFC 9110 §8.6); two different values or anything else is an error.
fn declared_length(headers: &http::HeaderMap) -> Result<Option<u64>, &'static str> {
    let mut declared = None;
    for value in headers.get_all(http::header::CONTENT_LENGTH) {
        let text = value
            .to_str()
            .map_err(|_| "content-length is not a number")?;
        for item in text.split(',') {
            let item = item.trim();
            if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                return Err("content-length is not a number");
            }
            let n: u64 = item.parse().map_err(|_| "content-length is not a number")?;
            if declared.is_some_and(|d| d != n) {
                return Err("two content-length values that differ");
            }
            declared = Some(n);
        }
    }
    Ok(declared)
}

/// The QUIC config a [`Serving`] gives new connections: the TCP listener's certificate and key,
/// ALPN `h3`, no early data, and the `http3:` limits.
pub(super) fn quic_config(
    tls: &rustls::ServerConfig,
    http3: &Http3Config,
) -> Result<Arc<quinn::ServerConfig>, String> {
    let mut tls = tls.clone();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    // 0-RTT refused: early data would be decided before the handshake proves the client.
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| format!("the certificate cannot serve QUIC: {e}"))?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(http3.max_streams.into())
        // The client's control stream and QPACK's two, and room for greased ones.
        .max_concurrent_uni_streams(8u8.into())
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(http3.idle_timeout)
                .map_err(|e| format!("http3.idle_timeout: {e}"))?,
        ));
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    config.max_incoming(MAX_INCOMING);
    config.incoming_buffer_size_total(16 << 20);
    Ok(Arc::new(config))
}

/// The UDP endpoint, bound.
pub(super) struct Http3Listener {
    endpoint: quinn::Endpoint,
}

impl Http3Listener {
    /// Binds `addr` (UDP). Must be called within the runtime that serves it.
    pub(super) fn bind(addr: SocketAddr, first: Arc<quinn::ServerConfig>) -> std::io::Result<Self> {
        let endpoint = quinn::Endpoint::server((*first).clone(), addr)?;
        Ok(Http3Listener { endpoint })
    }

    pub(super) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Accepts connections until `draining` changes, then tells each open connection to finish
    /// (GOAWAY) and returns the endpoint, which must be kept until they are closed
    /// ([`close`]); each connection's task holds a permit of `connections` until it ends, so the
    /// server's drain waits for them as for TCP's.
    pub(super) async fn run(
        self,
        proxy: Arc<Proxy>,
        settings: Arc<ArcSwap<Serving>>,
        connections: Arc<Semaphore>,
        mut draining: watch::Receiver<()>,
    ) -> quinn::Endpoint {
        let handshaking = Arc::new(AtomicUsize::new(0));
        loop {
            let incoming = tokio::select! {
                incoming = self.endpoint.accept() => match incoming {
                    Some(incoming) => incoming,
                    None => break,
                },
                _ = draining.changed() => break,
            };
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                incoming.refuse();
                continue;
            };
            if handshaking.load(Ordering::Relaxed) >= RETRY_ABOVE
                && !incoming.remote_address_validated()
                && incoming.may_retry()
            {
                if let Err(e) = incoming.retry() {
                    e.into_incoming().ignore();
                }
                continue;
            }
            let serving = settings.load_full();
            // A reload that turned HTTP/3 off leaves the socket bound until a restart, and
            // new connections are refused.
            let Some(config) = serving.quic.clone() else {
                incoming.refuse();
                continue;
            };
            let connecting = match incoming.accept_with(config) {
                Ok(connecting) => connecting,
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC connection refused");
                    continue;
                }
            };
            let handshake = Handshake::start(&handshaking);
            let proxy = proxy.clone();
            let draining = draining.clone();
            let header_read = serving.per_connection.header_read;
            let resets = serving.per_connection.resets;
            tokio::spawn(async move {
                let connection = tokio::time::timeout(header_read, connecting).await;
                drop(handshake);
                match connection {
                    Ok(Ok(connection)) => {
                        let limits = (header_read, resets);
                        serve_connection(connection, proxy, draining, permit, limits).await
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "QUIC handshake failed"),
                    Err(_) => tracing::debug!("QUIC handshake timed out"),
                }
            });
        }
        // New connection attempts are refused from here; open ones drain in their tasks.
        self.endpoint.set_server_config(None);
        self.endpoint
    }
}

/// After the drain: lets the connections' closes reach their clients (a closed QUIC
/// connection lingers for three probe timeouts to answer late packets), for at most `within`.
pub(super) async fn close(endpoint: quinn::Endpoint, within: std::time::Duration) {
    let _ = tokio::time::timeout(within, endpoint.wait_idle()).await;
}

/// One handshake in progress, counted until dropped.
struct Handshake(Arc<AtomicUsize>);

impl Handshake {
    fn start(count: &Arc<AtomicUsize>) -> Handshake {
        count.fetch_add(1, Ordering::Relaxed);
        Handshake(count.clone())
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one QUIC connection's requests until it closes, or a drain ends it.
async fn serve_connection(
    connection: quinn::Connection,
    proxy: Arc<Proxy>,
    mut draining: watch::Receiver<()>,
    _permit: OwnedSemaphorePermit,
    (header_read, resets): (std::time::Duration, crate::limiter::Limit),
) {
    let peer = connection.remote_address();
    // A certificate the handshake verified (`tls.client_auth`), as on TCP.
    let peer_name = (connection.peer_identity())
        .and_then(|any| {
            any.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .and_then(|chain| chain.first().and_then(crate::tls::PeerName::of));
    // Streams the client abandons before their answer, as an HTTP/2 connection's are counted
    // (`http2_max_resets_per_second`): past the budget the connection is closed.
    let watch = super::watch::ConnWatch::new(resets, None, proxy.metrics().clone());
    let open = proxy.metrics().http3_connections().clone();
    open.inc();
    let _open = scopeguard(move || {
        open.dec();
    });
    let built = h3::server::builder()
        .max_field_section_size(MAX_FIELD_SECTION)
        .build::<_, Bytes>(frames::Connection::new(connection.clone(), header_read))
        .await;
    let mut h3 = match built {
        Ok(h3) => h3,
        Err(e) => {
            tracing::debug!(error = %e, %peer, "HTTP/3 connection failed to start");
            return;
        }
    };
    let mut requests = tokio::task::JoinSet::new();
    let mut closing = false;
    loop {
        tokio::select! {
            accepted = h3.accept() => match accepted {
                Ok(Some(resolver)) => {
                    let stream = super::watch::StreamGuard::open(&watch);
                    requests.spawn(serve_request(resolver, proxy.clone(), (peer, peer_name.clone()), header_read, stream));
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, %peer, "HTTP/3 connection ended");
                    break;
                }
            },
            Some(_) = requests.join_next(), if !requests.is_empty() => {
                if closing && requests.is_empty() {
                    break;
                }
            }
            () = watch.abusive() => {
                tracing::debug!(%peer, "HTTP/3 connection closed: too many streams reset before their answer");
                connection.close(H3_EXCESSIVE_LOAD.into(), b"too many streams reset");
                break;
            }
            _ = draining.changed(), if !closing => {
                closing = true;
                // GOAWAY: the streams already accepted are served, later ones refused.
                if h3.shutdown(0).await.is_err() || requests.is_empty() {
                    break;
                }
            }
        }
    }
    while requests.join_next().await.is_some() {}
    // Closing a QUIC connection drops what it has not yet sent, and h3 does not say when the
    // last answer's bytes were acknowledged: give them a few round trips (1 s at most) to be,
    // unless the client closes first.
    let linger = (connection.rtt() * 4 + std::time::Duration::from_millis(25))
        .min(std::time::Duration::from_secs(1));
    tokio::select! {
        () = tokio::time::sleep(linger) => {}
        _ = connection.closed() => return,
    }
    connection.close(H3_NO_ERROR.into(), b"");
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

type H3Resolver = h3::server::RequestResolver<frames::Connection, Bytes>;
type RecvStream = h3::server::RequestStream<frames::Guarded<h3_quinn::RecvStream>, Bytes>;
type SendStream = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Reads one request's head, hands the request to the pipeline and sends its answer back.
/// A stream whose head has not come within `header_read` (`timeouts.header_read`, as a TCP
/// connection's) is given up: dropped, so the client is told to stop sending and the stream's
/// place in `max_streams` comes back.
async fn serve_request(
    resolver: H3Resolver,
    proxy: Arc<Proxy>,
    (peer, peer_name): (SocketAddr, Option<crate::tls::PeerName>),
    header_read: std::time::Duration,
    abandoned: super::watch::StreamGuard,
) {
    let (req, stream) = match tokio::time::timeout(header_read, resolver.resolve_request()).await {
        Ok(Ok(resolved)) => resolved,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, %peer, "HTTP/3 request stream failed before its head");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "HTTP/3 request head not received in time");
            return;
        }
    };
    let (mut send, mut recv) = stream.split();
    // A malformed request is a stream error (RFC 9114 §4.1.2): never decided, never forwarded.
    if let Some(why) = malformed(&req) {
        tracing::debug!(%peer, why, "HTTP/3 request malformed");
        send.stop_stream(h3::error::Code::from(H3_MESSAGE_ERROR));
        recv.stop_sending(h3::error::Code::from(H3_MESSAGE_ERROR));
        return;
    }
    let declared = declared_length(req.headers()).ok().flatten();
    let body = RecvBody::new(recv, declared);
    // A stream the client reset as soon as it opened it (a rapid-reset flood) costs nothing:
    // it is neither decided nor forwarded. (One reset after it was forwarded is an abandoned
    // stream, counted against the connection's budget.)
    if body.reset() {
        return;
    }
    // A reset while it is decided is found by the proxy's look just before forwarding: not
    // forwarded, and what it spent given back (`ClientLeft`).
    let probe = body.shared.clone();
    let mut req = req.map(|()| Incoming::Other(Box::pin(body)));
    (req.extensions_mut()).insert(ClientLeft::new(move || lock(&probe).look()));
    if let Some(name) = peer_name {
        req.extensions_mut().insert(name);
    }
    let response = proxy.handle(req, peer).await;
    if response.extensions().get::<Abandoned>().is_some() {
        send.stop_stream(h3::error::Code::from(H3_REQUEST_CANCELLED));
        return;
    }
    match respond(&mut send, response).await {
        Err(e) => tracing::debug!(error = %e, %peer, "HTTP/3 response not delivered"),
        Ok(()) => abandoned.answered_whole(),
    }
}

/// Sends `response` on `send`: its head, its body's data as it comes, its trailers.
async fn respond(send: &mut SendStream, response: Response<Body>) -> Result<(), BoxError> {
    use http_body_util::BodyExt as _;
    let (mut parts, body) = response.into_parts();
    // Connection-specific fields have no meaning in HTTP/3 (RFC 9114 §4.2) and make the
    // response malformed.
    for name in [CONNECTION, TRANSFER_ENCODING, UPGRADE, TE] {
        parts.headers.remove(name);
    }
    parts.headers.remove("keep-alive");
    parts.headers.remove("proxy-connection");
    send.send_response(Response::from_parts(parts, ())).await?;
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                // The upstream's body failed: the client must not take a cut body for a whole
                // one.
                send.stop_stream(h3::error::Code::from(H3_INTERNAL_ERROR));
                return Err(e);
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if !data.is_empty() {
                    send.send_data(data).await?;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    // The last frame: the stream ends after it (h3 does not end it itself).
                    send.send_trailers(trailers).await?;
                    break;
                }
            }
        }
    }
    send.finish().await?;
    Ok(())
}

/// A request stream's receiving side, and what looks at it before the body was read found
/// there (data, or its end), kept for the body.
struct Probed {
    stream: RecvStream,
    early: std::collections::VecDeque<Bytes>,
    early_bytes: usize,
    ended: bool,
}

/// What looks at a stream before its body is read keep of its data at most: past it a look
/// says "not reset" without reading on (the QUIC stream's own window bounds what waits there).
const MAX_EARLY: usize = 64 * 1024;

impl Probed {
    /// Looks at the stream without waiting (a no-op waker: nobody else waits on it, the body
    /// not being read yet), keeping what data has come: true when the client has reset it.
    fn look(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while !self.ended && self.early_bytes < MAX_EARLY {
            match self.stream.poll_recv_data(&mut cx) {
                Poll::Pending => return false,
                Poll::Ready(Ok(Some(mut data))) => {
                    let data = data.copy_to_bytes(data.remaining());
                    self.early_bytes += data.len();
                    self.early.push_back(data);
                }
                Poll::Ready(Ok(None)) => self.ended = true,
                Poll::Ready(Err(e)) => {
                    tracing::debug!(error = %e, "HTTP/3 stream reset before it was forwarded");
                    return true;
                }
            }
        }
        false
    }
}

/// `probed`, locked (never contended: see [`RecvBody::shared`]).
fn lock(probed: &std::sync::Mutex<Probed>) -> std::sync::MutexGuard<'_, Probed> {
    probed.lock().unwrap_or_else(|e| e.into_inner())
}

/// A request's body as it arrives on its QUIC stream: data, then trailers, if any.
struct RecvBody {
    /// Behind a mutex to be `Sync` (the pipeline's futures hold `&Request`) and shared with
    /// the request's [`ClientLeft`], which looks only before the body is read: never contended.
    shared: Arc<std::sync::Mutex<Probed>>,
    state: RecvState,
    /// What `content-length` declared, if it did, and what came so far: the DATA frames must
    /// add up to it exactly (RFC 9114 §4.1.2). The piece that reaches it is held until the
    /// stream is seen to end, so an upstream never gets a whole body of a request that goes on.
    declared: Option<u64>,
    seen: u64,
    held: Option<Bytes>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RecvState {
    Data,
    Trailers,
    Done,
}

impl RecvBody {
    fn new(stream: RecvStream, declared: Option<u64>) -> Self {
        RecvBody {
            shared: Arc::new(std::sync::Mutex::new(Probed {
                stream,
                early: Default::default(),
                early_bytes: 0,
                ended: false,
            })),
            state: RecvState::Data,
            declared,
            seen: 0,
            held: None,
        }
    }

    /// Looks once at the stream without waiting: true when the client has reset it already.
    fn reset(&self) -> bool {
        lock(&self.shared).look()
    }

    /// Counts `data` against the declared length: an error past it.
    fn count(&mut self, data: &Bytes) -> Result<(), BoxError> {
        self.seen += data.len() as u64;
        match self.declared {
            Some(declared) if self.seen > declared => {
                self.state = RecvState::Done;
                Err("the request's DATA frames are longer than its content-length".into())
            }
            _ => Ok(()),
        }
    }

    /// The stream's data has ended: an error when short of the declared length.
    fn ended(&mut self) -> Result<(), BoxError> {
        match self.declared {
            Some(declared) if self.seen < declared => {
                self.state = RecvState::Done;
                Err("the request's DATA frames are shorter than its content-length".into())
            }
            _ => Ok(()),
        }
    }

    /// The next piece of data: what a look found first, then the stream's.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BoxError>> {
        let mut shared = lock(&self.shared);
        if let Some(data) = shared.early.pop_front() {
            return Poll::Ready(Ok(Some(data)));
        }
        if shared.ended {
            return Poll::Ready(Ok(None));
        }
        match shared.stream.poll_recv_data(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(mut data))) => {
                Poll::Ready(Ok(Some(data.copy_to_bytes(data.remaining()))))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(Ok(None)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
        }
    }
}

impl HttpBody for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        while this.state == RecvState::Data {
            match this.poll_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Some(data))) => {
                    if let Err(e) = this.count(&data) {
                        return Poll::Ready(Some(Err(e)));
                    }
                    // The piece that completes the declared length waits for the stream's end.
                    if this.declared == Some(this.seen) && !data.is_empty() {
                        if let Some(held) = this.held.replace(data) {
                            return Poll::Ready(Some(Ok(Frame::data(held))));
                        }
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Ok(None)) => {
                    this.state = RecvState::Trailers;
                    if let Err(e) = this.ended() {
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                Poll::Ready(Err(e)) => {
                    this.state = RecvState::Done;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
        if let Some(held) = this.held.take() {
            return Poll::Ready(Some(Ok(Frame::data(held))));
        }
        if this.state == RecvState::Trailers {
            let mut shared = lock(&this.shared);
            let polled = shared.stream.poll_recv_trailers(cx);
            if polled.is_ready() {
                this.state = RecvState::Done;
            }
            return match polled {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                Poll::Ready(Ok(None)) => Poll::Ready(None),
                Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            };
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.state == RecvState::Done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
