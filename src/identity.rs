//! Whose budget a request spends: the API key header, else the user id header (believed only
//! from trusted proxies), else the client IP, found by walking `X-Forwarded-For` right to left
//! past trusted proxies.
//!
//! Security caveats, written where they live:
//! - a client picks its own API key, so a client that rotates keys gets a fresh budget per key
//!   unless something upstream of floodgate validates keys; pair key-based limits with an IP limit
//!   on a separate route if that matters;
//! - `X-User-Id` and `X-Forwarded-For` are believed only when the TCP peer is a trusted proxy;
//!   from anyone else they are ignored, so rotating them buys nothing.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use crate::limiter::KeyKind;

/// Which of the three sources the identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdentityKind {
    ApiKey,
    UserId,
    Ip,
}

impl IdentityKind {
    /// The name used in store keys, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityKind::ApiKey => "api_key",
            IdentityKind::UserId => "user_id",
            IdentityKind::Ip => "ip",
        }
    }
}

impl From<IdentityKind> for KeyKind {
    fn from(kind: IdentityKind) -> KeyKind {
        match kind {
            IdentityKind::ApiKey => KeyKind::ApiKey,
            IdentityKind::UserId => KeyKind::UserId,
            IdentityKind::Ip => KeyKind::Ip,
        }
    }
}

/// Whose budget a request spends. Borrowed from the request: building one allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity<'a> {
    /// The raw API key. Never log it or use it in a key unhashed.
    ApiKey(&'a [u8]),
    UserId(&'a [u8]),
    Ip(IpAddr),
}

impl Identity<'_> {
    pub fn kind(&self) -> IdentityKind {
        match self {
            Identity::ApiKey(_) => IdentityKind::ApiKey,
            Identity::UserId(_) => IdentityKind::UserId,
            Identity::Ip(_) => IdentityKind::Ip,
        }
    }

    /// The identity's bytes for a store key; `buf` holds an IP's octets.
    pub fn key_bytes<'b>(&'b self, buf: &'b mut [u8; 16]) -> &'b [u8] {
        match self {
            Identity::ApiKey(v) | Identity::UserId(v) => v,
            Identity::Ip(ip) => ip_octets(*ip, buf),
        }
    }
}

/// An address's octets, in `buf`: 4 for IPv4, 16 for IPv6.
pub fn ip_octets(ip: IpAddr, buf: &mut [u8; 16]) -> &[u8] {
    match ip {
        IpAddr::V4(ip) => {
            buf[..4].copy_from_slice(&ip.octets());
            &buf[..4]
        }
        IpAddr::V6(ip) => {
            *buf = ip.octets();
            &buf[..]
        }
    }
}

/// A request whose identity headers cannot be read unambiguously.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the {0} header appears more than once with different values")]
    Conflicting(HeaderName),
}

/// How to find a request's identity: the `identity` section of the config.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub api_key_header: HeaderName,
    pub user_id_header: HeaderName,
    pub trusted_proxies: Vec<IpNet>,
}

/// How many `X-Forwarded-For` entries the walk looks at before giving up on the header.
const MAX_FORWARDED_HOPS: usize = 32;

impl IdentityConfig {
    /// True when `ip` is inside one of the trusted proxy ranges.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    /// Works out whose budget the request spends, in the contract's order.
    pub fn identify<'a>(
        &self,
        headers: &'a HeaderMap,
        peer: IpAddr,
    ) -> Result<Identity<'a>, IdentityError> {
        let peer = peer.to_canonical();
        if let Some(key) = single_value(headers, &self.api_key_header)? {
            return Ok(Identity::ApiKey(key));
        }
        let trusted_peer = self.is_trusted(peer);
        if trusted_peer && let Some(user) = single_value(headers, &self.user_id_header)? {
            return Ok(Identity::UserId(user));
        }
        Ok(Identity::Ip(self.client_addr(headers, peer)))
    }

    /// The client's address: the peer, or behind a trusted peer the `X-Forwarded-For` walk's
    /// answer ([`IdentityConfig::client_ip`]). What `per: ip` limits spend.
    pub fn client_addr(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        let peer = peer.to_canonical();
        if self.is_trusted(peer) {
            self.client_ip(headers, peer)
        } else {
            peer
        }
    }

    /// The client address behind a trusted peer: the rightmost `X-Forwarded-For` entry that is not
    /// itself a trusted proxy. When every entry is trusted, the leftmost (the origin as far as the
    /// trusted chain knows, as nginx's `real_ip_recursive` does). A malformed entry met on the walk,
    /// or a header too long to walk, means the header cannot be believed: the peer is used.
    pub fn client_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        let mut hops = 0;
        let mut leftmost_trusted = None;
        // Several X-Forwarded-For lines form one list, in order; walk them last to first.
        for line in headers.get_all(X_FORWARDED_FOR).iter().rev() {
            for entry in line.as_bytes().rsplit(|&b| b == b',') {
                hops += 1;
                if hops > MAX_FORWARDED_HOPS {
                    return peer;
                }
                let Some(ip) = parse_ip(entry) else {
                    return peer;
                };
                if !self.is_trusted(ip) {
                    return ip;
                }
                leftmost_trusted = Some(ip);
            }
        }
        leftmost_trusted.unwrap_or(peer)
    }
}

/// The `X-Forwarded-For` header name.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

fn parse_ip(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?.trim();
    text.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// The header's value if present and not blank; an error if it is repeated with different values.
fn single_value<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a [u8]>, IdentityError> {
    let mut values = headers
        .get_all(name)
        .iter()
        .map(|v| v.as_bytes().trim_ascii());
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.any(|other| other != first) {
        return Err(IdentityError::Conflicting(name.clone()));
    }
    Ok((!first.is_empty()).then_some(first))
}

#[cfg(test)]
mod tests;
