//! Forwarding to the upstream, in three steps: the request filter (`Forwarder::request_head`:
//! hop-by-hop headers stripped, `X-Forwarded-*` set, the URI and `Host` for the hop's HTTP
//! version), the send with its one retry (`Forwarder::send`), and the response filter
//! (`Forwarder::response_head`: hop-by-hop headers stripped, redirects to the upstream's origin
//! rewritten to the client's, WebSocket upgrades spliced).
//!
//! An upstream is spoken to in the route's `upstream_protocol`: HTTP/1.1 over pooled keep-alive
//! connections (`upstream/conn/http1.rs`), HTTP/2 with many streams per connection
//! (`upstream/conn/http2.rs`: what gRPC needs, trailers included), or on `https://` whichever ALPN
//! picks (`auto`, learned per upstream at its first connection). Bodies stream both ways, with
//! their trailers where both hops are HTTP/2.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HOST, TE, UPGRADE};
use http::request::Parts;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::rt::TokioIo;

use std::sync::Arc;

use super::body::{BodyFault, ClientBody, ClientFault, RequestBody, ResponseBody};
use crate::answer::{Body, BoxError, Rejection};
use crate::config::{RouteConfig, Upstream, UpstreamCa, UpstreamProtocol};
use crate::upstream::conn::{
    Connection, Io, Key, Multiplex, MultiplexBody, Pool, PoolError, PooledBody, Resend,
    ResendHandle, copy_head, dial,
};
use crate::upstream::{Attempted, Endpoint, Failed, InFlight, RoutePool};

mod failure;
mod headers;
pub(super) use headers::X_FORWARDED_HOST;
pub(super) use headers::is_websocket_upgrade;
pub(super) use headers::push_ip;

use failure::{
    is_idempotent, is_stale_connection, is_tls_error, route_tls_config, upstream_tls_config,
};
use headers::{
    X_FORWARDED_PROTO, append_forwarded_for, header_has_token, join_cookies, prefix_redirects,
    replace_prefix, rewrite_redirects,
};
pub use headers::{strip_connection_listed, strip_hop_by_hop};

/// Sends requests to upstreams over pooled connections.
pub struct Forwarder {
    /// Connections made with `upstream_ca` (else the system's roots) and no client certificate.
    connections: Connections,
    /// Routes with `upstream_tls`: connections of their own, by route name (none: every route
    /// uses `connections`, and no lookup is made).
    by_route: HashMap<Arc<str>, Connections>,
    response_timeout: Duration,
    limits: BodyLimits,
    /// What its connections were made with: a reload with the same keeps them.
    made_with: Option<Duration>,
}

/// The connections made with one TLS client config (or none, for `http://`).
#[derive(Clone)]
struct Connections {
    /// HTTP/1.1 connections (ALPN `http/1.1` on `https://`).
    pool: Arc<Pool<RequestBody>>,
    /// HTTP/2 connections (ALPN `h2`, or h2c by prior knowledge).
    multiplex: Arc<Multiplex<RequestBody>>,
    /// Offers both in ALPN: the first connection to an `auto` upstream.
    negotiating: HttpsConnector<HttpConnector>,
    /// What ALPN chose for each `auto` upstream so far.
    negotiated: Arc<Mutex<HashMap<Key, Version>>>,
}

impl Connections {
    /// Connections with `tls`, sending `server_name` as SNI (and verifying it) where given,
    /// else each upstream's host.
    fn new(
        connect_timeout: Duration,
        tls: rustls::ClientConfig,
        server_name: Option<rustls::pki_types::ServerName<'static>>,
    ) -> Connections {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let builder = || {
            let b = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http();
            match &server_name {
                Some(name) => b.with_server_name_resolver(
                    hyper_rustls::FixedServerNameResolver::new(name.clone()),
                ),
                None => b,
            }
        };
        // An idle timeout below common upstream keep-alive timeouts (nginx 75 s, Go 90 s), so
        // floodgate usually closes an idle connection first; with shorter ones (Node's 5 s) the
        // pool's check before reuse and the retry of idempotent requests cover the race.
        let idle = Duration::from_secs(30);
        Connections {
            pool: Pool::new(
                builder().enable_http1().wrap_connector(http.clone()),
                1024,
                idle,
            ),
            multiplex: Multiplex::new(builder().enable_http2().wrap_connector(http.clone()), idle),
            negotiating: builder().enable_all_versions().wrap_connector(http),
            negotiated: Arc::new(Mutex::new(HashMap::new())),
        }
    }
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
    Http1(Option<Box<Io>>),
    Http2(Option<Box<Io>>),
}

impl Hop {
    fn version(&self) -> Version {
        match self {
            Hop::Http1(_) => Version::HTTP_11,
            Hop::Http2(_) => Version::HTTP_2,
        }
    }
}

/// Why a request could not be forwarded, by whose fault: the client's or the upstream's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardError {
    /// What the client did wrong on the way through: its body.
    Client(ClientFault),
    Upstream(UpstreamFault),
    /// The route's pool has no endpoint (a name that never resolved): 503 with `Retry-After`.
    NoUpstream,
}

/// What the upstream did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamFault {
    /// It could not be reached, or its connection failed (with what floodgate can say): 502.
    Unreachable(String),
    /// No response head within `timeouts.upstream_response` (or the client's `grpc-timeout`):
    /// 504.
    Timeout,
}

impl From<ClientFault> for Rejection {
    /// A request body's fault: 413 past `max_body_size`, 408 when it went silent, 400 when its
    /// framing was invalid or it was cut short.
    fn from(fault: ClientFault) -> Rejection {
        match fault {
            ClientFault::TooLarge => Rejection::PayloadTooLarge,
            ClientFault::Idle => Rejection::RequestTimeout,
            ClientFault::Malformed => {
                Rejection::BadRequest("the request body is malformed or was cut short".into())
            }
        }
    }
}

impl From<ForwardError> for Rejection {
    fn from(error: ForwardError) -> Rejection {
        match error {
            ForwardError::Client(fault) => Rejection::from(fault),
            ForwardError::Upstream(UpstreamFault::Unreachable(detail)) => {
                Rejection::BadGateway(detail)
            }
            ForwardError::Upstream(UpstreamFault::Timeout) => Rejection::GatewayTimeout,
            ForwardError::NoUpstream => Rejection::NoUpstream,
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
        Self::new_after(
            None,
            connect_timeout,
            response_timeout,
            limits,
            upstream_ca,
            &[],
        )
    }

    /// A forwarder for a reload: it keeps `previous`'s connections (so every endpoint that
    /// stays keeps its pooled and multiplexed connections) when they were made the same way
    /// (the same connect timeout, the system's roots); with an `upstream_ca`, which the reload
    /// has read again, connections are made anew.
    pub fn new_after(
        previous: Option<&Forwarder>,
        connect_timeout: Duration,
        response_timeout: Duration,
        limits: BodyLimits,
        upstream_ca: Option<&UpstreamCa>,
        routes: &[RouteConfig],
    ) -> Self {
        let made_with = upstream_ca.is_none().then_some(connect_timeout);
        let by_route = routes
            .iter()
            .filter_map(|route| {
                let own = route.upstream_tls.as_ref()?;
                let tls = route_tls_config(own, upstream_ca);
                let connections = Connections::new(connect_timeout, tls, own.server_name.clone());
                Some((route.name.clone(), connections))
            })
            .collect();
        if let Some(previous) = previous
            && made_with.is_some()
            && previous.made_with == made_with
        {
            return Forwarder {
                connections: previous.connections.clone(),
                by_route,
                response_timeout,
                limits,
                made_with,
            };
        }
        let tls = upstream_tls_config(upstream_ca);
        Forwarder {
            connections: Connections::new(connect_timeout, tls, None),
            by_route,
            response_timeout,
            limits,
            made_with,
        }
    }

    /// The connections `route`'s upstreams are reached on: its own with `upstream_tls`.
    fn connections(&self, route: &RouteConfig) -> &Connections {
        match self.by_route.is_empty() {
            true => &self.connections,
            false => self.by_route.get(&route.name).unwrap_or(&self.connections),
        }
    }

    /// The bounds on bodies of a request on `route`: its own `max_body_size` and
    /// `timeouts.client_body` / `upstream_body` where it sets them, else the top level's.
    pub fn body_limits(&self, route: &RouteConfig) -> BodyLimits {
        let own = &route.timeouts;
        BodyLimits {
            max_request_bytes: route.max_body_size.unwrap_or(self.limits.max_request_bytes),
            client_idle: own.client_body.unwrap_or(self.limits.client_idle),
            upstream_idle: own.upstream_body.unwrap_or(self.limits.upstream_idle),
        }
    }

    /// How long a request on `route` waits for its response head: its own
    /// `timeouts.upstream_response`, else the top level's.
    fn response_timeout(&self, route: &RouteConfig) -> Duration {
        route
            .timeouts
            .upstream_response
            .unwrap_or(self.response_timeout)
    }

    /// Forwards `req` to an endpoint of `to.route`'s pool and returns its response, or the
    /// rejection that replaces it. A failed attempt is tried again on an endpoint not yet tried,
    /// as the route's `retries` say and its budget allows ([`Failed::retryable`]: any request
    /// whose attempt never reached an upstream, an idempotent one without a body after a reset
    /// or a listed 502/503/504). Every attempt's outcome goes to its endpoint's passive health.
    /// `to.deadline`, a gRPC client's `grpc-timeout`, shortens the wait for the response head
    /// (never beyond `timeouts.upstream_response`; it bounds every attempt together). `used`
    /// is set to the address of the last endpoint tried.
    pub async fn forward(
        &self,
        mut req: Request<ClientBody>,
        to: Outbound<'_>,
        used: &mut Option<std::net::SocketAddr>,
    ) -> Result<Response<Body>, ForwardError> {
        let upgrade = is_websocket_upgrade(&req);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (pool, route) = (to.pool, to.route);
        let (parts, body) = req.into_parts();
        let fault = Arc::new(BodyFault::default());
        let mut attempts = self.attempts(parts, body, &to, upgrade, fault.clone())?;
        let first = (to.first).or_else(|| {
            let endpoint = pool.pick(to.key, &[], crate::upstream::Fallback::Unwell)?;
            Some(pool.start(&endpoint))
        });
        let Some(first) = first else {
            return Err(ForwardError::NoUpstream);
        };
        let retries = pool.retries();
        let response_timeout = self.response_timeout(route);
        let wait = (to.deadline).map_or(response_timeout, |d| d.min(response_timeout));
        // The endpoint of the attempt under way, for a timeout to be counted against.
        let mut current: Option<u64> = None;
        let sent = async {
            let mut attempt = first;
            let mut tried = Tried::default();
            loop {
                let endpoint = attempt.endpoint().clone();
                tried.push(endpoint.id);
                *used = endpoint.addr;
                current = Some(endpoint.id);
                let sent = self.send(&mut attempts, &endpoint).await;
                let failed = match self.attempted(&attempts, sent, attempt) {
                    Ok(response) => {
                        pool.outcome(&endpoint, Attempted::Answered);
                        return Ok((response, endpoint));
                    }
                    Err(failed) => failed,
                };
                pool.outcome(&endpoint, Attempted::Failed);
                if failed.retryable(&retries.on, attempts.resendable)
                    && tried.ids().len() < retries.attempts as usize
                    && let Some(next) = pool.retry(to.key, tried.ids())
                {
                    attempt = next;
                    continue;
                }
                // A discovered route's container gone before the engine said so: a request
                // that never reached it waits for the next one (`recreate_grace`).
                if let Some(grace) = to.route.recreate_grace
                    && !failed.reached()
                    && let Some(next) = Box::pin(pool.wait_for_another(tried.ids(), grace)).await
                {
                    attempt = next;
                    continue;
                }
                return failed.into_result().map(|response| (*response, endpoint));
            }
        };
        let (response, endpoint) = match tokio::time::timeout(wait, sent).await {
            Ok(Ok(sent)) => sent,
            Ok(Err(e)) => return Err(self.failure(e, &fault, route)),
            Err(_) => {
                // No head within `timeouts.upstream_response`: a gateway failure of the
                // endpoint, for outlier detection as Envoy counts it (an endpoint that accepts
                // and never answers is ejected like one that refuses). A client's own shorter
                // `grpc-timeout` says nothing of the endpoint.
                if wait == response_timeout
                    && let Some(id) = current
                    && let Some(endpoint) = pool.endpoints().into_iter().find(|e| e.id == id)
                {
                    pool.outcome(&endpoint, Attempted::Failed);
                }
                return Err(ForwardError::Upstream(UpstreamFault::Timeout));
            }
        };
        let client = attempts.client.take().unwrap_or(ClientSide {
            version: Version::HTTP_11,
            origin: None,
        });
        Self::response_head(
            response,
            &endpoint.origin,
            route,
            client,
            client_upgrade.map(|on| (on, to.socket)),
        )
    }

    /// What every attempt of a request starts from: its head, its body (refused before
    /// anything is sent when it is announced larger than allowed, as nginx does), and what
    /// may follow a sent attempt.
    fn attempts<'a>(
        &self,
        parts: Parts,
        body: ClientBody,
        to: &Outbound<'a>,
        upgrade: bool,
        fault: Arc<BodyFault>,
    ) -> Result<Attempts<'a>, ForwardError> {
        let limits = self.body_limits(to.route);
        let limit = limits.max_request_bytes;
        let announced = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(limit) = limit
            && announced.is_some_and(|n| n > limit.get())
        {
            if let (true, ClientBody::Streaming(body)) = (parts.version <= Version::HTTP_11, body) {
                tokio::spawn(super::body::linger(body));
            }
            return Err(ForwardError::Client(ClientFault::TooLarge));
        }
        let linger = parts.version <= Version::HTTP_11;
        let mut body = RequestBody::new(body, limit, limits.client_idle, fault.clone(), linger);
        if !hyper::body::Body::is_end_stream(&body) {
            body = body.deny_trailers(to.route.trailers_denied.clone());
        }
        let retries = to.pool.retries();
        // Only a request with nothing to send beyond its head can be sent again after it
        // reached an upstream.
        let resendable = is_idempotent(&parts.method) && hyper::body::Body::is_end_stream(&body);
        // Whether an attempt that was sent may be followed by another (which needs the request's
        // head again): otherwise the head is moved into the one attempt, not copied.
        let may_again = retries.attempts > 1 && to.pool.len() > 1;
        let again_http1 = may_again && resendable && (retries.on.reset || retries.on.statuses != 0);
        let again_http2 = again_http1 || (may_again && retries.on.refused_stream);
        Ok(Attempts {
            parts,
            body: Some(body),
            resend: None,
            client: None,
            route: to.route,
            client_ip: to.client_ip,
            client_tls: to.client_tls,
            upgrade,
            resendable,
            again_http1,
            again_http2,
            fault,
        })
    }

    /// What one attempt on an endpoint came to, from its send ([`Forwarder::send`]); `held`
    /// counts the attempt in flight there until its response body ends. A 502, 503 or 504 is
    /// an answer that failed ([`Failed::Answered`], boxed: rare, and it keeps the error small);
    /// a failure after the client's own body failed is final (the client's to answer for, not
    /// the upstream's). Not an `async fn`: the send is awaited in the retry loop itself, since
    /// each layer of `async` would copy the send's large future once more.
    fn attempted(
        &self,
        a: &Attempts<'_>,
        sent: Result<Response<Upstreamed>, Failed<Box<Response<Body>>, PoolError>>,
        held: InFlight,
    ) -> Result<Response<Body>, Failed<Box<Response<Body>>, PoolError>> {
        let sent = match sent {
            Ok(response) => response,
            Err(failed) if a.fault.get().is_some() => return Err(failed.into_final()),
            Err(failed) => return Err(failed),
        };
        let status = sent.status().as_u16();
        let upstream_idle = (a.route.timeouts.upstream_body).unwrap_or(self.limits.upstream_idle);
        let response = sent.map(|b| b.relay(upstream_idle, a.route, held));
        match status {
            502..=504 => Err(Failed::Answered(Box::new(response), status)),
            _ => Ok(response),
        }
    }

    /// One attempt's send: the response head as it came, or why there is none.
    async fn send(
        &self,
        a: &mut Attempts<'_>,
        endpoint: &Endpoint,
    ) -> Result<Response<Upstreamed>, Failed<Box<Response<Body>>, PoolError>> {
        let c = self.connections(a.route);
        // WebSocket upgrades are HTTP/1.1 only.
        let hop = match a.upgrade {
            true => Hop::Http1(None),
            false => (Self::hop(c, &endpoint.target).await).map_err(Failed::Connect)?,
        };
        match &a.client {
            None => {
                a.client = Some(Self::request_head(
                    &mut a.parts,
                    a.route,
                    a.client_ip,
                    a.client_tls,
                    &hop,
                    a.upgrade,
                ));
            }
            Some(_) => a.parts.version = hop.version(),
        }
        Self::address(&mut a.parts, &endpoint.origin, &hop);
        let (scheme, authority) = (&endpoint.target.scheme, &endpoint.target.authority);
        let unsendable = || Failed::Final(PoolError::Closed { reused: false });
        match hop {
            _ if a.upgrade => {
                let b = a.body.take().ok_or_else(unsendable)?;
                let request = Request::from_parts(head(&mut a.parts, false), b);
                // Boxed: rare, and large (see `Pool::send`).
                match Box::pin(c.pool.send_upgrade(scheme, authority, request)).await {
                    Ok(r) => Ok(r.map(Upstreamed::Upgrade)),
                    Err(e) => Err(Failed::Final(e)),
                }
            }
            Hop::Http1(fresh) => {
                // The connection first: a failure to get one leaves the request here.
                let connection =
                    (c.pool.connection(scheme, authority, fresh).await).map_err(Failed::Connect)?;
                let b = match (a.body.take(), a.resendable) {
                    (Some(b), _) => b,
                    (None, true) => RequestBody::empty(),
                    (None, false) => return Err(unsendable()),
                };
                let request = Request::from_parts(head(&mut a.parts, a.again_http1), b);
                match Self::send_http1(c, connection, request, scheme, authority).await {
                    Ok(r) => Ok(r.map(Upstreamed::Http1)),
                    // A stale connection whose second try found no connection: neither sent
                    // the request to be processed, and its head comes back for another endpoint.
                    Err((e, Some(head))) => {
                        a.parts = head;
                        Err(Failed::Connect(e))
                    }
                    Err((e, None)) => Err(Failed::Broken(e)),
                }
            }
            Hop::Http2(fresh) => {
                let b = match (
                    a.body.take(),
                    a.resend.as_ref().and_then(ResendHandle::again),
                ) {
                    (Some(b), _) => Resend::new(b),
                    (None, Some(again)) => again,
                    (None, None) => return Err(unsendable()),
                };
                a.resend = Some(b.handle());
                let request = Request::from_parts(head(&mut a.parts, a.again_http2), b);
                let key = (scheme.clone(), authority.clone());
                match Box::pin(c.multiplex.send(&key, request, fresh)).await {
                    Ok(r) => Ok(r.map(Upstreamed::Http2)),
                    Err(e @ PoolError::Connect(_)) => Err(Failed::Connect(e)),
                    Err(e @ PoolError::Unprocessed(_)) => Err(Failed::Unprocessed(e)),
                    Err(e) => Err(Failed::Broken(e)),
                }
            }
        }
    }

    /// The rejection for a request no attempt could forward: the client's, when its own body
    /// failed; else the upstream's, with what floodgate can say of it.
    fn failure(&self, e: PoolError, fault: &BodyFault, route: &RouteConfig) -> ForwardError {
        if let Some(fault) = fault.get() {
            return ForwardError::Client(fault);
        }
        let detail = if is_tls_error(&e) {
            "the TLS handshake with the upstream failed"
        } else if matches!(e, PoolError::Connect(_)) {
            "cannot connect to the upstream"
        } else {
            "the upstream connection failed"
        };
        tracing::debug!(error = %e, route = &*route.name, "upstream request failed");
        ForwardError::Upstream(UpstreamFault::Unreachable(detail.to_string()))
    }

    /// The HTTP version to speak to `upstream`: its `upstream_protocol`, and for `auto` on
    /// `https://` what ALPN chose (learned at the first connection, which is then used).
    async fn hop(c: &Connections, upstream: &Upstream) -> Result<Hop, PoolError> {
        match upstream.protocol {
            UpstreamProtocol::Http1 => return Ok(Hop::Http1(None)),
            UpstreamProtocol::Http2 => return Ok(Hop::Http2(None)),
            UpstreamProtocol::Auto if upstream.scheme != Scheme::HTTPS => {
                return Ok(Hop::Http1(None));
            }
            UpstreamProtocol::Auto => {}
        }
        let key = (upstream.scheme.clone(), upstream.authority.clone());
        let known = c.negotiated.lock().ok().and_then(|n| n.get(&key).copied());
        match known {
            Some(Version::HTTP_2) => Ok(Hop::Http2(None)),
            Some(_) => Ok(Hop::Http1(None)),
            None => {
                // Boxed, as the HTTP/2 send below: rare paths must not grow every request's
                // future (hyper moves it into place once per request).
                let io = Box::new(Box::pin(dial(&c.negotiating, &key.0, &key.1)).await?);
                let h2 = io.connected().is_negotiated_h2();
                let version = if h2 {
                    Version::HTTP_2
                } else {
                    Version::HTTP_11
                };
                if let Ok(mut negotiated) = c.negotiated.lock() {
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
        parts.headers.append(http::header::VIA, via().clone());
        parts.headers.insert(
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if client_tls { "https" } else { "http" }),
        );
        if let Some(host) = original_host {
            parts.headers.insert(X_FORWARDED_HOST, host);
        }
        // `rewrite_prefix`: the matched prefix of the (normalised) path replaced, once, for
        // every attempt.
        if let Some(new) = &route.rewrite_prefix {
            let path = parts.uri.path();
            let mut rewritten = replace_prefix(path, &route.path_prefix, new);
            if let Some(query) = parts.uri.query() {
                rewritten.push('?');
                rewritten.push_str(query);
            }
            if let Ok(path) = PathAndQuery::try_from(rewritten) {
                parts.uri = Uri::from(path);
            }
        }
        ClientSide {
            version: client_version,
            origin,
        }
    }

    /// Names the upstream in the request for `hop`: the URI origin-form with the origin's
    /// `Host` on HTTP/1.1, absolute (its `:authority`) on HTTP/2. Done again for each attempt
    /// (another endpoint may belong to another origin).
    fn address(parts: &mut Parts, origin: &Upstream, hop: &Hop) {
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        match hop {
            Hop::Http1(_) => {
                // Origin-form (`/path?query`): the upstream is named by the connection and `Host`.
                parts.uri = Uri::from(path);
                join_cookies(&mut parts.headers);
                parts.headers.insert(HOST, origin.host_header.clone());
            }
            Hop::Http2(_) => {
                // HTTP/2 names the upstream in `:authority`, taken from an absolute URI.
                let mut uri = http::uri::Parts::default();
                uri.scheme = Some(origin.scheme.clone());
                uri.authority = Some(origin.authority.clone());
                uri.path_and_query = Some(path);
                if let Ok(uri) = Uri::from_parts(uri) {
                    parts.uri = uri;
                }
                parts.headers.remove(HOST);
            }
        }
    }

    /// Sends an HTTP/1.1 request on `connection`, once more on a new connection when the
    /// upstream provably did not process it: an idempotent request without a body whose reused
    /// connection the upstream had just closed (nginx: `proxy_next_upstream error`).
    async fn send_http1(
        c: &Connections,
        connection: Connection<RequestBody>,
        request: Request<RequestBody>,
        scheme: &Scheme,
        authority: &http::uri::Authority,
    ) -> Result<Response<PooledBody<RequestBody>>, (PoolError, Option<Parts>)> {
        // The head is copied only when the request could be sent again.
        let retry = (connection.reused
            && is_idempotent(request.method())
            && hyper::body::Body::is_end_stream(request.body()))
        .then(|| copy_head(&request));
        match c.pool.send_on(connection, request).await {
            Err(e) if retry.is_some() && is_stale_connection(&e) => {
                tracing::debug!(error = %e, "the upstream closed a reused connection; retrying once");
                let Some(head) = retry else {
                    return Err((e, None));
                };
                let again = copy_head(&head).map(|()| RequestBody::empty());
                match Box::pin(c.pool.send(scheme, authority, again, None)).await {
                    Ok(response) => Ok(response),
                    // Not even a new connection: the request never left, and its head goes back
                    // for another endpoint.
                    Err(e @ PoolError::Connect(_)) => Err((e, Some(head.into_parts().0))),
                    Err(e) => Err((e, None)),
                }
            }
            Ok(response) => Ok(response),
            Err(e) => Err((e, None)),
        }
    }

    /// The response filter: hop-by-hop headers go, the response speaks the client's version,
    /// redirects to the upstream's origin point at the client's, and a `101` to a WebSocket
    /// handshake splices the two connections.
    fn response_head(
        mut response: Response<Body>,
        upstream: &Upstream,
        route: &RouteConfig,
        client: ClientSide,
        client_upgrade: Option<(hyper::upgrade::OnUpgrade, Option<super::websocket::Socket>)>,
    ) -> Result<Response<Body>, ForwardError> {
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some((client_upgrade, socket)) = client_upgrade else {
                // The client asked for no upgrade: a 101 cannot be relayed.
                return Err(ForwardError::Upstream(UpstreamFault::Unreachable(
                    "unexpected 101 from the upstream".to_string(),
                )));
            };
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, upstream_upgrade) {
                    Ok((client, upstream)) => {
                        let mut client = TokioIo::new(client);
                        let mut upstream = TokioIo::new(upstream);
                        match socket {
                            Some(socket) => {
                                super::websocket::relay(client, upstream, socket).await;
                            }
                            None => {
                                let _ =
                                    tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                            }
                        }
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
        if let Some((tls, host)) = &client.origin {
            rewrite_redirects(response.headers_mut(), upstream, *tls, host);
        }
        if let Some(new) = &route.rewrite_prefix {
            prefix_redirects(response.headers_mut(), new, &route.path_prefix, &client);
        }
        Ok(response)
    }
}

/// An upstream response body as one attempt got it, by the connection it came on.
enum Upstreamed {
    Http1(PooledBody<RequestBody>),
    Http2(MultiplexBody<RequestBody>),
    Upgrade(hyper::body::Incoming),
}

impl Upstreamed {
    /// The body as relayed to the client: cut off after `idle` without data, and logged with
    /// `route` if the upstream ends it early; `held` counts the attempt in flight until it ends.
    fn relay(self, idle: Duration, route: &RouteConfig, held: InFlight) -> Body {
        fn boxed<B>(body: B, idle: Duration, route: &RouteConfig, held: InFlight) -> Body
        where
            B: hyper::body::Body<Data = Bytes, Error = hyper::Error> + Send + Unpin + 'static,
        {
            ResponseBody::new(body, idle, route.name.clone(), Some(held))
                .map_err(BoxError::from)
                .boxed_unsync()
        }
        match self {
            Upstreamed::Http1(b) => boxed(b, idle, route, held),
            Upstreamed::Http2(b) => boxed(b, idle, route, held),
            Upstreamed::Upgrade(b) => boxed(b, idle, route, held),
        }
    }
}

/// Where a request is forwarded, and what the forward needs to know of its client.
pub struct Outbound<'a> {
    pub route: &'a RouteConfig,
    pub pool: &'a RoutePool,
    /// What `balance: hash` hashes.
    pub key: Option<u64>,
    /// The first attempt, when the limits `per: endpoint` chose its endpoint.
    pub first: Option<InFlight>,
    pub client_ip: IpAddr,
    pub client_tls: bool,
    /// A gRPC client's `grpc-timeout`.
    pub deadline: Option<Duration>,
    /// A WebSocket upgrade on a route with `websocket:` limits: what its connection is held to.
    pub socket: Option<super::websocket::Socket>,
}

/// A request's state across its attempts.
struct Attempts<'a> {
    /// The head, rewritten for each hop (a copy goes out when another attempt may follow).
    parts: Parts,
    /// The body, until an attempt takes it.
    body: Option<RequestBody>,
    /// The HTTP/2 attempt's body, to send again.
    resend: Option<ResendHandle<RequestBody>>,
    /// What the response filter needs of the client, once the first head was made.
    client: Option<ClientSide>,
    route: &'a RouteConfig,
    client_ip: IpAddr,
    client_tls: bool,
    upgrade: bool,
    /// It may be sent twice: idempotent, nothing beyond its head.
    resendable: bool,
    /// Another attempt may follow a sent one (the head is copied, not moved, into each).
    again_http1: bool,
    again_http2: bool,
    /// Set when the client's own body failed.
    fault: Arc<BodyFault>,
}

/// The request ids tried so far (at most five attempts: `retries.attempts`' bound).
#[derive(Default)]
struct Tried {
    ids: [u64; 5],
    len: usize,
}

impl Tried {
    fn push(&mut self, id: u64) {
        if self.len < self.ids.len() {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }

    fn ids(&self) -> &[u64] {
        &self.ids[..self.len]
    }
}

/// The head for an attempt: a copy when another attempt may follow (the original stays for
/// it), else the head itself (`parts` is left empty: nothing follows).
fn head(parts: &mut Parts, again: bool) -> Parts {
    match again {
        true => copy_parts(parts),
        false => std::mem::replace(parts, Request::new(()).into_parts().0),
    }
}

/// A request head's copy, for an attempt (the original stays for the next).
fn copy_parts(parts: &Parts) -> Parts {
    let mut head = Request::new(());
    *head.method_mut() = parts.method.clone();
    *head.uri_mut() = parts.uri.clone();
    *head.version_mut() = parts.version;
    *head.headers_mut() = parts.headers.clone();
    head.into_parts().0
}

/// This process's `Via` entry (RFC 9110 §7.6.3): `1.1 floodgate-` and a random id drawn at
/// start, so that a request that comes back to the same process is recognised, while a chain
/// of distinct floodgates is not mistaken for a loop.
fn via() -> &'static HeaderValue {
    static VIA: std::sync::OnceLock<HeaderValue> = std::sync::OnceLock::new();
    VIA.get_or_init(|| {
        let id = fastrand::u64(..);
        HeaderValue::from_str(&format!("1.1 floodgate-{id:016x}"))
            .unwrap_or(HeaderValue::from_static("1.1 floodgate"))
    })
}

/// True when `headers` carry this process's `Via` entry: the request passed through here.
pub fn came_through_here(headers: &http::HeaderMap) -> bool {
    let mut values = headers.get_all(http::header::VIA).iter().peekable();
    if values.peek().is_none() {
        return false;
    }
    let ours = via().as_bytes();
    let ours = &ours[4..]; // `floodgate-<id>`, without the protocol version
    values.any(|v| v.as_bytes().windows(ours.len()).any(|w| w == ours))
}
