//! An origin: what a route's `upstream` or an entry of its `upstreams` names (scheme,
//! authority, the HTTP version it is spoken to in). A name's every address is an endpoint of
//! the pool ([`super::Endpoint`]); the origin is what the forwarded request says it is talking
//! to (its `Host`, its `:authority`, the redirects rewritten).

use http::uri::{Authority, Scheme};

/// An upstream origin: scheme and authority (the request's path is forwarded unchanged), and
/// the HTTP version it is spoken to in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scheme: Scheme,
    pub authority: Authority,
    /// The `Host` header forwarded requests carry, built once.
    pub host_header: http::HeaderValue,
    /// The authority's host (a forwarded request's span names it `server.address`), taken
    /// out once.
    pub host: std::sync::Arc<str>,
    pub protocol: UpstreamProtocol,
}

/// How floodgate speaks to a route's upstream (`upstream_protocol:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 on pooled keep-alive connections, one request at a time on each.
    #[default]
    Http1,
    /// HTTP/2, many streams on each connection: cleartext by prior knowledge (h2c) on
    /// `http://`, ALPN `h2` on `https://`. What gRPC upstreams need.
    Http2,
    /// On `https://`, whichever of `h2` and `http/1.1` the upstream picks in ALPN; HTTP/1.1 on
    /// `http://` (cleartext has no negotiation that does not cost a round trip).
    Auto,
}

impl UpstreamProtocol {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::Http2 => "http2",
            UpstreamProtocol::Auto => "auto",
        }
    }
}

impl Origin {
    /// `scheme://authority`: what names the upstream (in `floodgate_adaptive_limit{upstream}`,
    /// and for the routes that share its learned limit).
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }
}
