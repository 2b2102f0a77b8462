//! Forwarding to the upstream, in three steps: the request filter ([`Forwarder::request_head`]:
//! hop-by-hop headers stripped, `X-Forwarded-*` set, the URI and `Host` for the hop's HTTP
//! version), the send with its one retry ([`Forwarder::send`]), and the response filter
//! ([`Forwarder::response_head`]: hop-by-hop headers stripped, redirects to the upstream's origin
//! rewritten to the client's, WebSocket upgrades spliced).
//!
//! An upstream is spoken to in the route's `upstream_protocol`: HTTP/1.1 over pooled keep-alive
//! connections (`proxy/pool.rs`), HTTP/2 with many streams per connection
//! (`proxy/multiplex.rs`: what gRPC needs, trailers included), or on `https://` whichever ALPN
//! picks (`auto`, learned per upstream at its first connection). Bodies stream both ways, with
//! their trailers where both hops are HTTP/2.

use std::collections::HashMap;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LOCATION, COOKIE, HOST, LOCATION, TE, UPGRADE};
use http::request::Parts;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::rt::TokioIo;

use std::sync::Arc;

use super::body::{BodyFault, Fault, Replay, RequestBody, ResponseBody};
use super::multiplex::{Multiplex, copy_head};
use super::pool::{Io, Key, Pool, PoolError, dial};
use super::response::{Body, BoxError, Rejection};
use crate::config::{RouteConfig, Upstream, UpstreamCa, UpstreamProtocol};
use crate::identity::X_FORWARDED_FOR;
use crate::tls;

const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Hop-by-hop headers (RFC 9110 §7.6.1), plus the non-standard ones proxies also drop.
const HOP_BY_HOP: [HeaderName; 8] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
];

/// Sends requests to upstreams over pooled connections.
pub struct Forwarder {
    /// HTTP/1.1 connections (ALPN `http/1.1` on `https://`).
    pool: Arc<Pool>,
    /// HTTP/2 connections (ALPN `h2`, or h2c by prior knowledge).
    multiplex: Arc<Multiplex>,
    /// Offers both in ALPN: the first connection to an `auto` upstream.
    negotiating: HttpsConnector<HttpConnector>,
    /// What ALPN chose for each `auto` upstream so far.
    negotiated: Mutex<HashMap<Key, Version>>,
    response_timeout: Duration,
    limits: BodyLimits,
}

/// The limits on bodies in flight (see [`super::body`]).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// The most bytes a request body may have, if limited.
    pub max_request_bytes: Option<std::num::NonZeroU64>,
    /// How long a request body may go without data.
    pub client_idle: Duration,
    /// How long a response body may go without data.
    pub upstream_idle: Duration,
}

/// The HTTP version of the hop to the upstream, and for `auto` the connection whose ALPN
/// chose it.
enum Hop {
    Http1(Option<Io>),
    Http2(Option<Io>),
}

impl Hop {
    fn version(&self) -> Version {
        match self {
            Hop::Http1(_) => Version::HTTP_11,
            Hop::Http2(_) => Version::HTTP_2,
        }
    }
}

/// What the response filter needs to know of the client's side of the request.
struct ClientSide {
    version: Version,
    /// For redirect rewriting: whether the client came over TLS, and the `Host` it used.
    origin: Option<(bool, HeaderValue)>,
}

impl Forwarder {
    /// A forwarder with its own connection pools. `https://` upstreams are verified against
    /// `upstream_ca` when given, else against the system's roots; the server name checked (and
    /// sent as SNI) is the upstream's host.
    pub fn new(
        connect_timeout: Duration,
        response_timeout: Duration,
        limits: BodyLimits,
        upstream_ca: Option<&UpstreamCa>,
    ) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let tls = upstream_tls_config(upstream_ca);
        let builder = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
        };
        // An idle timeout below common upstream keep-alive timeouts (nginx 75 s, Go 90 s), so
        // floodgate usually closes an idle connection first; with shorter ones (Node's 5 s) the
        // pool's check before reuse and the retry of idempotent requests cover the race.
        let idle = Duration::from_secs(30);
        Forwarder {
            pool: Pool::new(
                builder().enable_http1().wrap_connector(http.clone()),
                1024,
                idle,
            ),
            multiplex: Multiplex::new(builder().enable_http2().wrap_connector(http.clone()), idle),
            negotiating: builder().enable_all_versions().wrap_connector(http),
            negotiated: Mutex::new(HashMap::new()),
            response_timeout,
            limits,
        }
    }

    /// Forwards `req` to `route`'s upstream and returns its response, or the rejection that
    /// replaces it. `deadline`, a gRPC client's `grpc-timeout`, shortens the wait for the
    /// response head (never beyond `timeouts.upstream_response`).
    pub async fn forward(
        &self,
        mut req: Request<Incoming>,
        route: &RouteConfig,
        client_ip: IpAddr,
        client_tls: bool,
        deadline: Option<Duration>,
    ) -> Result<Response<Body>, Rejection> {
        let upstream = &route.upstream;
        let upgrade = is_websocket_upgrade(&req);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));

        let (mut parts, body) = req.into_parts();
        // A body announced larger than allowed is refused before anything is sent (as nginx).
        let limit = self.limits.max_request_bytes;
        let announced = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(limit) = limit
            && announced.is_some_and(|n| n > limit.get())
        {
            if parts.version <= Version::HTTP_11 {
                tokio::spawn(super::body::linger(body));
            }
            return Err(Rejection::PayloadTooLarge);
        }
        let fault = Arc::new(BodyFault::default());
        let linger = parts.version <= Version::HTTP_11;
        let body = RequestBody::new(body, limit, self.limits.client_idle, fault.clone(), linger);

        let wait = deadline.map_or(self.response_timeout, |d| d.min(self.response_timeout));
        let sent = async {
            // WebSocket upgrades are HTTP/1.1 only.
            let hop = if upgrade {
                Hop::Http1(None)
            } else {
                self.hop(upstream).await?
            };
            let client =
                Self::request_head(&mut parts, route, client_ip, client_tls, &hop, upgrade);
            let request = Request::from_parts(parts, body);
            let response = if upgrade {
                let (scheme, authority) = (&upstream.scheme, &upstream.authority);
                let response = self.pool.send_upgrade(scheme, authority, request).await?;
                response.map(|b| relay(b, self.limits.upstream_idle, route))
            } else {
                self.send(upstream, request, hop, route).await?
            };
            Ok::<_, PoolError>((response, client))
        };
        let (response, client) = match tokio::time::timeout(wait, sent).await {
            Err(_) => return Err(Rejection::GatewayTimeout),
            // The request's own body failed: the client's error, not the upstream's.
            Ok(Err(_)) if fault.get() == Some(Fault::TooLarge) => {
                return Err(Rejection::PayloadTooLarge);
            }
            Ok(Err(_)) if fault.get() == Some(Fault::Idle) => {
                return Err(Rejection::RequestTimeout);
            }
            Ok(Err(_)) if fault.get() == Some(Fault::Malformed) => {
                return Err(Rejection::BadRequest(
                    "the request body is malformed or was cut short".into(),
                ));
            }
            Ok(Err(e)) => {
                let detail = if is_tls_error(&e) {
                    "the TLS handshake with the upstream failed".to_string()
                } else if matches!(e, PoolError::Connect(_)) {
                    "cannot connect to the upstream".to_string()
                } else {
                    "the upstream connection failed".to_string()
                };
                tracing::debug!(error = %e, upstream = %upstream.authority, "upstream request failed");
                return Err(Rejection::BadGateway(detail));
            }
            Ok(Ok(sent)) => sent,
        };
        Self::response_head(response, upstream, client, client_upgrade)
    }

    /// The HTTP version to speak to `upstream`: its `upstream_protocol`, and for `auto` on
    /// `https://` what ALPN chose (learned at the first connection, which is then used).
    async fn hop(&self, upstream: &Upstream) -> Result<Hop, PoolError> {
        match upstream.protocol {
            UpstreamProtocol::Http1 => return Ok(Hop::Http1(None)),
            UpstreamProtocol::Http2 => return Ok(Hop::Http2(None)),
            UpstreamProtocol::Auto if upstream.scheme != Scheme::HTTPS => {
                return Ok(Hop::Http1(None));
            }
            UpstreamProtocol::Auto => {}
        }
        let key = (upstream.scheme.clone(), upstream.authority.clone());
        let known = self
            .negotiated
            .lock()
            .ok()
            .and_then(|n| n.get(&key).copied());
        match known {
            Some(Version::HTTP_2) => Ok(Hop::Http2(None)),
            Some(_) => Ok(Hop::Http1(None)),
            None => {
                let io = dial(&self.negotiating, &key.0, &key.1).await?;
                let h2 = io.connected().is_negotiated_h2();
                let version = if h2 {
                    Version::HTTP_2
                } else {
                    Version::HTTP_11
                };
                if let Ok(mut negotiated) = self.negotiated.lock() {
                    negotiated.insert(key, version);
                }
                Ok(if h2 {
                    Hop::Http2(Some(io))
                } else {
                    Hop::Http1(Some(io))
                })
            }
        }
    }

    /// The request filter: the request as the upstream is sent it over `hop`. Hop-by-hop
    /// headers go (but `te: trailers` on an HTTP/2 hop, which gRPC needs), `X-Forwarded-For`,
    /// `-Proto` and `-Host` are set, the URI is origin-form with the upstream's `Host` on
    /// HTTP/1.1 and absolute (its `:authority`) on HTTP/2, and split cookie fields are joined
    /// for HTTP/1.1.
    fn request_head(
        parts: &mut Parts,
        route: &RouteConfig,
        client_ip: IpAddr,
        client_tls: bool,
        hop: &Hop,
        upgrade: bool,
    ) -> ClientSide {
        let upstream = &route.upstream;
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let original_host = parts.headers.get(HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        // The version is per hop, so the response goes back in the client's.
        let client_version = std::mem::replace(&mut parts.version, hop.version());
        let origin = (route.rewrite_redirects)
            .then(|| original_host.clone().map(|host| (client_tls, host)))
            .flatten();
        let trailers =
            hop.version() == Version::HTTP_2 && header_has_token(&parts.headers, &TE, "trailers");
        let upgrade_value = upgrade
            .then(|| parts.headers.get(UPGRADE).cloned())
            .flatten();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(value) = upgrade_value {
            parts
                .headers
                .insert(CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(UPGRADE, value);
        }
        if trailers {
            parts
                .headers
                .insert(TE, HeaderValue::from_static("trailers"));
        }
        append_forwarded_for(&mut parts.headers, client_ip);
        parts.headers.insert(
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if client_tls { "https" } else { "http" }),
        );
        if let Some(host) = original_host {
            parts.headers.insert(X_FORWARDED_HOST, host);
        }
        match hop {
            Hop::Http1(_) => {
                // Origin-form (`/path?query`): the upstream is named by the connection and `Host`.
                parts.uri = Uri::from(path);
                join_cookies(&mut parts.headers);
                parts.headers.insert(HOST, upstream.host_header.clone());
            }
            Hop::Http2(_) => {
                // HTTP/2 names the upstream in `:authority`, taken from an absolute URI.
                let mut uri = http::uri::Parts::default();
                uri.scheme = Some(upstream.scheme.clone());
                uri.authority = Some(upstream.authority.clone());
                uri.path_and_query = Some(path);
                if let Ok(uri) = Uri::from_parts(uri) {
                    parts.uri = uri;
                }
                parts.headers.remove(HOST);
            }
        }
        ClientSide {
            version: client_version,
            origin,
        }
    }

    /// Sends the request over `hop`, once more when the upstream provably did not process it:
    /// on HTTP/1.1 an idempotent request without a body whose reused connection the upstream
    /// had just closed (nginx: `proxy_next_upstream error`), on HTTP/2 a stream the upstream
    /// refused or dropped in a graceful GOAWAY, if its body so far was small enough to keep.
    async fn send(
        &self,
        upstream: &Upstream,
        request: Request<RequestBody>,
        hop: Hop,
        route: &RouteConfig,
    ) -> Result<Response<Body>, PoolError> {
        let (scheme, authority) = (&upstream.scheme, &upstream.authority);
        let idle = self.limits.upstream_idle;
        match hop {
            Hop::Http1(fresh) => {
                // The head is copied only when the request could be sent again.
                let retry = (is_idempotent(request.method())
                    && hyper::body::Body::is_end_stream(request.body()))
                .then(|| copy_head(&request));
                let response = match self.pool.send(scheme, authority, request, fresh).await {
                    Err(e) if retry.is_some() && is_stale_connection(&e) => {
                        tracing::debug!(error = %e, "the upstream closed a reused connection; retrying once");
                        let Some(head) = retry else { return Err(e) };
                        let head = head.map(|()| RequestBody::empty());
                        self.pool.send(scheme, authority, head, None).await?
                    }
                    other => other?,
                };
                Ok(response.map(|b| relay(b, idle, route)))
            }
            Hop::Http2(fresh) => {
                let key = (scheme.clone(), authority.clone());
                let request = request.map(Replay::new);
                let response = self.multiplex.send(&key, request, fresh).await?;
                Ok(response.map(|b| relay(b, idle, route)))
            }
        }
    }

    /// The response filter: hop-by-hop headers go, the response speaks the client's version,
    /// redirects to the upstream's origin point at the client's, and a `101` to a WebSocket
    /// handshake splices the two connections.
    fn response_head(
        mut response: Response<Body>,
        upstream: &Upstream,
        client: ClientSide,
        client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    ) -> Result<Response<Body>, Rejection> {
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_upgrade) = client_upgrade else {
                // The client asked for no upgrade: a 101 cannot be relayed.
                return Err(Rejection::BadGateway(
                    "unexpected 101 from the upstream".to_string(),
                ));
            };
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, upstream_upgrade) {
                    Ok((client, upstream)) => {
                        let mut client = TokioIo::new(client);
                        let mut upstream = TokioIo::new(upstream);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "upgrade failed"),
                }
            });
            let upgrade_value = response.headers().get(UPGRADE).cloned();
            strip_hop_by_hop(response.headers_mut());
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("upgrade"));
            if let Some(value) = upgrade_value {
                response.headers_mut().insert(UPGRADE, value);
            }
            return Ok(response);
        }
        // Chunked framing wins over a Content-Length sent with it (RFC 9112 §6.3): relayed
        // chunked, the length would describe a body the client is not sent as such.
        if response
            .headers()
            .contains_key(http::header::TRANSFER_ENCODING)
        {
            response.headers_mut().remove(http::header::CONTENT_LENGTH);
        }
        strip_hop_by_hop(response.headers_mut());
        *response.version_mut() = client.version;
        if let Some((tls, host)) = client.origin {
            rewrite_redirects(response.headers_mut(), upstream, tls, &host);
        }
        Ok(response)
    }
}

/// An upstream response body as relayed to the client: cut off after `idle` without data, and
/// logged with `route` if the upstream ends it early.
fn relay<B>(body: B, idle: Duration, route: &RouteConfig) -> Body
where
    B: hyper::body::Body<Data = Bytes, Error = hyper::Error> + Send + Unpin + 'static,
{
    ResponseBody::new(body, idle, route.name.clone())
        .map_err(BoxError::from)
        .boxed_unsync()
}

/// Joins split `cookie` fields into one, separated by `"; "`. HTTP/2 clients may send each
/// cookie in a field of its own (RFC 9113 §8.2.3), and those MUST be joined before an HTTP/1.1
/// hop: most HTTP/1.1 servers read only one `Cookie` line or join lines with `,`.
fn join_cookies(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(COOKIE).iter();
    let (Some(first), Some(_)) = (fields.next(), fields.next()) else {
        return;
    };
    let mut joined = Vec::with_capacity(first.len() * 2);
    for field in headers.get_all(COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(field.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(joined)) {
        headers.insert(COOKIE, value);
    }
}

/// Rewrites `Location` and `Content-Location` values that point at `upstream`'s origin to the
/// origin the client used (`https` when it came over TLS, and its `Host`), as nginx's
/// `proxy_redirect default` does: a redirect must not send the client around the proxy. Relative
/// references and other origins are left as they are.
fn rewrite_redirects(
    headers: &mut HeaderMap,
    upstream: &Upstream,
    client_tls: bool,
    host: &HeaderValue,
) {
    for name in [LOCATION, CONTENT_LOCATION] {
        let Some(value) = headers.get(&name) else {
            continue;
        };
        let Some(rest) = value.to_str().ok().and_then(|v| strip_origin(v, upstream)) else {
            continue;
        };
        let scheme = if client_tls { "https" } else { "http" };
        let Ok(host) = host.to_str() else { return };
        if let Ok(rewritten) = HeaderValue::from_str(&format!("{scheme}://{host}{rest}")) {
            headers.insert(name, rewritten);
        }
    }
}

/// What follows `upstream`'s origin in the absolute URL `value` (the path, query and fragment,
/// possibly empty), or `None` when `value` is not on that origin. Scheme and host compare
/// without case, and a default port (80, 443) may be written or left out.
fn strip_origin<'v>(value: &'v str, upstream: &Upstream) -> Option<&'v str> {
    let (scheme, rest) = value.split_once("://")?;
    if !scheme.eq_ignore_ascii_case(upstream.scheme.as_str()) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority: http::uri::Authority = authority.parse().ok()?;
    let default_port = if upstream.scheme == http::uri::Scheme::HTTPS {
        443
    } else {
        80
    };
    let port = |a: &http::uri::Authority| a.port_u16().unwrap_or(default_port);
    let same = authority
        .host()
        .eq_ignore_ascii_case(upstream.authority.host())
        && port(&authority) == port(&upstream.authority);
    same.then_some(tail)
}

/// Methods a request may be sent twice with (RFC 9110 §9.2.2).
fn is_idempotent(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::OPTIONS
            | http::Method::PUT
            | http::Method::DELETE
            | http::Method::TRACE
    )
}

/// True when a request failed because a reused connection was already closed by the upstream
/// (closed before the response began, or reset), not because the upstream refused or timed out.
fn is_stale_connection(e: &PoolError) -> bool {
    let error = match e {
        PoolError::Request {
            error,
            reused: true,
        } => error,
        PoolError::Closed { reused } => return *reused,
        _ => return false,
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = source {
        if let Some(hyper_err) = err.downcast_ref::<hyper::Error>()
            && (hyper_err.is_incomplete_message() || hyper_err.is_canceled())
        {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// The rustls client config for `https://` upstreams. Without `upstream_ca` it trusts the
/// system's roots; if there are none, it trusts nothing (every HTTPS upstream then fails with
/// 502) and says so once in the log.
fn upstream_tls_config(upstream_ca: Option<&UpstreamCa>) -> rustls::ClientConfig {
    match upstream_ca {
        Some(ca) => tls::client_config(ca.roots()),
        None => tls::client_config(tls::system_roots("https:// upstreams without upstream_ca")),
    }
}

/// True when a failed upstream request failed in the TLS handshake (an untrusted certificate,
/// a name mismatch, no common protocol version).
fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<rustls::Error>() {
            return true;
        }
        next = match e.downcast_ref::<std::io::Error>() {
            // An io::Error's `source()` skips the error it wraps: look at that one itself.
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}

/// True for an HTTP/1.1 `Connection: upgrade` + `Upgrade: websocket` request.
fn is_websocket_upgrade<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && header_has_token(req.headers(), &CONNECTION, "upgrade")
        && header_has_token(req.headers(), &UPGRADE, "websocket")
}

fn header_has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Removes the hop-by-hop headers and every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // The `Connection` lines are copied out (a reference count each, no bytes) so that the names
    // in them can be removed as they are read, looked up by `&str` without building `HeaderName`s.
    let mut lines = headers.get_all(CONNECTION).iter();
    if let Some(first) = lines.next().cloned() {
        let more: Vec<HeaderValue> = lines.cloned().collect();
        for line in std::iter::once(&first).chain(&more) {
            let Ok(line) = line.to_str() else { continue };
            for token in line.split(',') {
                // A token that is no header name (empty, spaces) matches nothing.
                headers.remove(token.trim());
            }
        }
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(UPGRADE);
}

/// Appends the client's address to `X-Forwarded-For`, keeping earlier hops in one header line.
fn append_forwarded_for(headers: &mut HeaderMap, client_ip: IpAddr) {
    // One buffer, formatted into directly, that becomes the header value without a copy.
    let mut value = Vec::with_capacity(48);
    for line in headers.get_all(X_FORWARDED_FOR) {
        if !value.is_empty() {
            value.extend_from_slice(b", ");
        }
        value.extend_from_slice(line.as_bytes());
    }
    if !value.is_empty() {
        value.extend_from_slice(b", ");
    }
    let _ = write!(value, "{client_ip}");
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_removed() {
        let mut headers = HeaderMap::new();
        headers.append(
            CONNECTION,
            HeaderValue::from_static("Keep-Alive, X-Trace ,,"),
        );
        headers.append(CONNECTION, HeaderValue::from_static("x-other"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-trace", HeaderValue::from_static("1"));
        headers.insert("x-other", HeaderValue::from_static("2"));
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers.insert(UPGRADE, HeaderValue::from_static("h2c"));
        headers.insert("x-kept", HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn split_cookie_fields_are_joined_into_one() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, HeaderValue::from_static("a=1"));
        headers.append(COOKIE, HeaderValue::from_static("b=2"));
        headers.append(COOKIE, HeaderValue::from_static("c=3; d=4"));
        join_cookies(&mut headers);
        let fields: Vec<_> = headers.get_all(COOKIE).iter().collect();
        assert_eq!(fields, ["a=1; b=2; c=3; d=4"]);

        let mut one = HeaderMap::new();
        one.insert(COOKIE, HeaderValue::from_static("a=1; b=2"));
        join_cookies(&mut one);
        assert_eq!(one[COOKIE], "a=1; b=2");
    }

    fn upstream(url: &str) -> Upstream {
        let uri: Uri = url.parse().unwrap();
        let authority = uri.authority().unwrap().clone();
        Upstream {
            scheme: uri.scheme().unwrap().clone(),
            host_header: HeaderValue::from_str(authority.as_str()).unwrap(),
            authority,
            protocol: UpstreamProtocol::Http1,
        }
    }

    #[test]
    fn redirects_to_the_upstream_origin_are_rewritten_to_the_clients() {
        let up = upstream("http://127.0.0.1:9000");
        let rewrite = |location: &str, tls: bool| {
            let mut headers = HeaderMap::new();
            headers.insert(LOCATION, HeaderValue::from_str(location).unwrap());
            headers.insert(CONTENT_LOCATION, HeaderValue::from_str(location).unwrap());
            rewrite_redirects(
                &mut headers,
                &up,
                tls,
                &HeaderValue::from_static("api.example"),
            );
            assert_eq!(headers[LOCATION], headers[CONTENT_LOCATION]);
            headers[LOCATION].to_str().unwrap().to_string()
        };
        assert_eq!(
            rewrite("http://127.0.0.1:9000/a?b=1#c", false),
            "http://api.example/a?b=1#c"
        );
        assert_eq!(
            rewrite("HTTP://127.0.0.1:9000", true),
            "https://api.example"
        );
        assert_eq!(
            rewrite("http://127.0.0.1:9000?q", false),
            "http://api.example?q"
        );
        // Other origins, other ports, relative references and look-alike hosts stay.
        for kept in [
            "http://127.0.0.1:9001/a",
            "https://127.0.0.1:9000/a",
            "http://127.0.0.1:90000/a",
            "http://127.0.0.1:9000.evil.example/a",
            "/relative",
            "//127.0.0.1:9000/scheme-relative",
        ] {
            assert_eq!(rewrite(kept, false), kept);
        }
        // A default port may be written or left out.
        let up80 = upstream("http://backend");
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_static("http://BACKEND:80/x"));
        rewrite_redirects(
            &mut headers,
            &up80,
            false,
            &HeaderValue::from_static("h:8080"),
        );
        assert_eq!(headers[LOCATION], "http://h:8080/x");
    }

    #[test]
    fn the_client_is_appended_to_forwarded_for_in_one_line() {
        let mut headers = HeaderMap::new();
        append_forwarded_for(&mut headers, "192.0.2.1".parse().unwrap());
        assert_eq!(headers[X_FORWARDED_FOR], "192.0.2.1");
        headers.append(X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.2"));
        append_forwarded_for(&mut headers, "2001:db8::1".parse().unwrap());
        let lines: Vec<_> = headers.get_all(X_FORWARDED_FOR).iter().collect();
        assert_eq!(lines, ["192.0.2.1, 198.51.100.2, 2001:db8::1"]);
    }
}
