//! Whose budget a request spends: the API key header, else the user id header (believed only
//! from trusted proxies), else the client IP, found by walking `X-Forwarded-For` right to left
//! past trusted proxies.
//!
//! With a `consumers:` section, an API key is looked up (by its SHA-256) among the known
//! consumers: a known key is identified as its consumer, whose keys all share one budget; an
//! unknown one is rejected (401) or ignored, as `consumers.unknown_key` says.
//!
//! Security caveats, written where they live:
//! - without `consumers:`, a client picks its own API key, so a client that rotates keys gets a
//!   fresh budget per key; pair key-based limits with a `per: ip` or `per: route` limit;
//! - `X-User-Id` and `X-Forwarded-For` are believed only when the TCP peer is a trusted proxy;
//!   from anyone else they are ignored, so rotating them buys nothing.

use std::collections::HashMap;
use std::net::IpAddr;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;

use crate::limiter::KeyKind;

/// Which of the sources the identity came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityKind {
    ApiKey,
    Consumer,
    /// A verified JWT's subject (`identity.jwt`).
    Jwt,
    UserId,
    Ip,
    /// A verified client certificate's name (`identity.client_cert`).
    ClientCert,
}

impl IdentityKind {
    pub const ALL: [IdentityKind; 6] = [
        IdentityKind::ApiKey,
        IdentityKind::Consumer,
        IdentityKind::Jwt,
        IdentityKind::UserId,
        IdentityKind::Ip,
        IdentityKind::ClientCert,
    ];

    /// The kind named `label` ([`IdentityKind::as_str`]).
    pub fn from_label(label: &[u8]) -> Option<IdentityKind> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str().as_bytes() == label)
    }

    /// The name used in store keys, logs and metrics (and serde's).
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityKind::ApiKey => "api_key",
            IdentityKind::Consumer => "consumer",
            IdentityKind::Jwt => "jwt",
            IdentityKind::UserId => "user_id",
            IdentityKind::Ip => "ip",
            IdentityKind::ClientCert => "client_cert",
        }
    }

    /// How reports (`/top`, `floodgate replay`) name a hashed identity: its kind and the first
    /// 6 bytes of its SHA-256 `digest`, `api_key:9f86d081884c…`.
    pub fn short_label(self, digest: &[u8]) -> String {
        let short = &digest[..digest.len().min(6)];
        format!("{}:{}…", self.as_str(), crate::limiter::hex(short))
    }
}

impl From<IdentityKind> for KeyKind {
    fn from(kind: IdentityKind) -> KeyKind {
        match kind {
            IdentityKind::ApiKey => KeyKind::ApiKey,
            IdentityKind::Consumer => KeyKind::Consumer,
            IdentityKind::Jwt => KeyKind::Jwt,
            IdentityKind::UserId => KeyKind::UserId,
            IdentityKind::Ip => KeyKind::Ip,
            IdentityKind::ClientCert => KeyKind::ClientCert,
        }
    }
}

/// Whose budget a request spends. Borrowed from the request: building one allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity<'a> {
    /// The raw API key. Never log it or use it in a key unhashed.
    ApiKey(&'a [u8]),
    /// A known consumer, found by one of its keys.
    Consumer(&'a Consumer),
    /// A verified JWT's subject.
    Jwt(&'a [u8]),
    UserId(&'a [u8]),
    Ip(IpAddr),
    /// A verified client certificate's first DNS or URI name, else its subject's CN.
    ClientCert(&'a [u8]),
}

impl Identity<'_> {
    pub fn kind(&self) -> IdentityKind {
        match self {
            Identity::ApiKey(_) => IdentityKind::ApiKey,
            Identity::Consumer(_) => IdentityKind::Consumer,
            Identity::Jwt(_) => IdentityKind::Jwt,
            Identity::UserId(_) => IdentityKind::UserId,
            Identity::Ip(_) => IdentityKind::Ip,
            Identity::ClientCert(_) => IdentityKind::ClientCert,
        }
    }

    /// The identity's bytes for a store key; `buf` holds an IP's octets.
    pub fn key_bytes<'b>(&'b self, buf: &'b mut [u8; 16]) -> &'b [u8] {
        match self {
            Identity::ApiKey(v)
            | Identity::Jwt(v)
            | Identity::UserId(v)
            | Identity::ClientCert(v) => v,
            Identity::Consumer(c) => c.name.as_bytes(),
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

/// A request whose identity cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the {0} header appears more than once with different values")]
    Conflicting(HeaderName),
    /// An API key no consumer has, under `unknown_key: reject`.
    #[error("the API key is not known")]
    UnknownKey,
}

/// A known API client: every one of its keys spends its one budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    pub name: String,
    /// Which tier's limits apply to it (`default` unless the config says).
    pub tier: String,
}

/// What to do with an API key no consumer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownKey {
    /// 401 `invalid_api_key`, never forwarded.
    Reject,
    /// Ignore the key: identify by user id, then IP.
    Anonymous,
}

/// The tier of requests without a consumer.
pub const ANONYMOUS_TIER: &str = "anonymous";
/// The tier of a consumer whose entry names none.
pub const DEFAULT_TIER: &str = "default";

/// The known consumers, found by the SHA-256 of a key: one hash of the key and one hash-map
/// lookup per request, whatever the number of consumers. The lookup compares digests, not keys,
/// so its timing says nothing about which keys exist beyond what a hash-map lookup on a SHA-256
/// reveals.
#[derive(Debug, Clone)]
pub struct Consumers {
    pub unknown_key: UnknownKey,
    list: Vec<Consumer>,
    by_digest: HashMap<[u8; 32], usize>,
}

impl Consumers {
    /// No consumers yet; unknown keys follow `unknown_key`.
    pub fn new(unknown_key: UnknownKey) -> Self {
        Consumers {
            unknown_key,
            list: Vec::new(),
            by_digest: HashMap::new(),
        }
    }

    /// Adds a consumer; returns its index for [`Consumers::add_key`].
    pub fn add(&mut self, consumer: Consumer) -> usize {
        self.list.push(consumer);
        self.list.len() - 1
    }

    /// Gives consumer `index` the key whose SHA-256 is `digest`. `Err` names the consumer that
    /// already has it.
    pub fn add_key(&mut self, digest: [u8; 32], index: usize) -> Result<(), &str> {
        match self.by_digest.get(&digest) {
            Some(&owner) => Err(&self.list[owner].name),
            None => {
                self.by_digest.insert(digest, index);
                Ok(())
            }
        }
    }

    /// The consumer whose key `raw_key` is.
    pub fn find(&self, raw_key: &[u8]) -> Option<&Consumer> {
        let digest: [u8; 32] = sha2::Sha256::digest(raw_key).into();
        self.by_digest.get(&digest).map(|&i| &self.list[i])
    }

    /// The consumer whose key has this SHA-256: for logs that carry the digest, not the key.
    pub fn find_digest(&self, digest: &[u8; 32]) -> Option<&Consumer> {
        self.by_digest.get(digest).map(|&i| &self.list[i])
    }

    /// The consumer named `name` (a linear search: for the admin endpoint, not requests).
    pub fn named(&self, name: &str) -> Option<&Consumer> {
        self.list.iter().find(|c| c.name == name)
    }

    /// The consumers.
    pub fn iter(&self) -> impl Iterator<Item = &Consumer> {
        self.list.iter()
    }

    /// Finds the consumer of an API-key identity; passes other identities through. An unknown
    /// key is an error under `reject` and `Ok(None)` under `anonymous` (identify without it).
    pub fn resolve<'a>(
        &'a self,
        identity: Identity<'a>,
    ) -> Result<Option<Identity<'a>>, IdentityError> {
        let Identity::ApiKey(key) = identity else {
            return Ok(Some(identity));
        };
        match (self.find(key), self.unknown_key) {
            (Some(consumer), _) => Ok(Some(Identity::Consumer(consumer))),
            (None, UnknownKey::Reject) => Err(IdentityError::UnknownKey),
            (None, UnknownKey::Anonymous) => Ok(None),
        }
    }
}

use sha2::Digest as _;

/// How to find a request's identity: the `identity` section of the config.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub api_key_header: HeaderName,
    pub user_id_header: HeaderName,
    pub trusted_proxies: Vec<IpNet>,
    /// IPv6 clients are identified by this prefix of their address (default 64): one host
    /// usually holds a whole /64, and would otherwise have 2^64 budgets.
    pub ipv6_prefix: u8,
    /// Remove the user id header from requests whose peer is not a trusted proxy before
    /// forwarding them (default true): floodgate ignored it, and the upstream should too.
    pub strip_untrusted_user_id: bool,
    /// `identity.jwt`: verified bearer tokens, with their keys.
    pub jwt: Option<std::sync::Arc<jwt::JwtConfig>>,
    /// `identity.client_ip_header`: a one-value header naming the client (`CF-Connecting-IP`),
    /// believed from trusted proxies instead of walking `X-Forwarded-For`.
    pub client_ip_header: Option<HeaderName>,
    /// `identity.forwarded`: RFC 7239 `Forwarded: for=` walked (where the request has one)
    /// instead of `X-Forwarded-For`.
    pub forwarded: bool,
    /// `identity.client_cert`: a verified client certificate names the client first.
    pub client_cert: bool,
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
        if let Some(key) = single_value(headers, &self.api_key_header)? {
            return Ok(Identity::ApiKey(self.key_of(key)));
        }
        self.identify_without_key(headers, peer)
    }

    /// The API key in a value of `api_key_header`: with `api_key_header: Authorization`, the
    /// credential of a `Bearer` value (as OpenAI's SDKs and most LLM clients send their key),
    /// otherwise the whole value.
    fn key_of<'a>(&self, value: &'a [u8]) -> &'a [u8] {
        if self.api_key_header != http::header::AUTHORIZATION || value.len() < 7 {
            return value;
        }
        let (scheme, credential) = value.split_at(7);
        if scheme.eq_ignore_ascii_case(b"bearer ") {
            let credential = credential.trim_ascii();
            if !credential.is_empty() {
                return credential;
            }
        }
        value
    }

    /// [`IdentityConfig::identify`] as if no API key were sent: user id, then IP.
    pub fn identify_without_key<'a>(
        &self,
        headers: &'a HeaderMap,
        peer: IpAddr,
    ) -> Result<Identity<'a>, IdentityError> {
        let peer = peer.to_canonical();
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
        let client = if self.is_trusted(peer) {
            self.client_ip(headers, peer)
        } else {
            peer
        };
        self.budget_addr(client)
    }

    /// The address a budget is kept for: IPv6 addresses cut to `ipv6_prefix`.
    pub fn budget_addr(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => {
                let bits = u128::from(v6);
                let mask = u128::MAX
                    .checked_shl(u32::from(128 - self.ipv6_prefix))
                    .unwrap_or(0);
                IpAddr::V6((bits & mask).into())
            }
            other => other,
        }
    }

    /// The client address behind a trusted peer: the rightmost `X-Forwarded-For` entry that is not
    /// itself a trusted proxy. When every entry is trusted, the leftmost (the origin as far as the
    /// trusted chain knows, as nginx's `real_ip_recursive` does). A malformed entry met on the walk,
    /// or a header too long to walk, means the header cannot be believed: the peer is used.
    ///
    /// With `client_ip_header`, that header's one address where the request has it (one
    /// malformed or repeated with different values: the peer); with `forwarded`, RFC 7239's
    /// `Forwarded` walked the same way where the request has one.
    pub fn client_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        if let Some(name) = &self.client_ip_header
            && headers.contains_key(name)
        {
            return match single_value(headers, name) {
                Ok(Some(value)) => parse_ip(value).unwrap_or(peer),
                _ => peer,
            };
        }
        if self.forwarded && headers.contains_key(http::header::FORWARDED) {
            return self.forwarded_ip(headers, peer);
        }
        // Several X-Forwarded-For lines form one list, in order; walk them last to first.
        self.walk(headers.get_all(X_FORWARDED_FOR), parse_ip, peer)
    }

    /// The walk of a list header's entries (`X-Forwarded-For`'s, `Forwarded`'s), right to left:
    /// the first entry that is not a trusted proxy, or when all are, the leftmost; the peer
    /// when an entry cannot be read (`parse` says `None`) or there are too many to walk.
    fn walk(
        &self,
        lines: http::header::GetAll<'_, http::HeaderValue>,
        parse: impl Fn(&[u8]) -> Option<IpAddr>,
        peer: IpAddr,
    ) -> IpAddr {
        let mut hops = 0;
        let mut leftmost_trusted = None;
        for line in lines.iter().rev() {
            for entry in line.as_bytes().rsplit(|&b| b == b',') {
                hops += 1;
                if hops > MAX_FORWARDED_HOPS {
                    return peer;
                }
                let Some(ip) = parse(entry) else {
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

impl IdentityConfig {
    /// [`IdentityConfig::client_ip`]'s walk over RFC 7239 `Forwarded` elements, right to left:
    /// each element's `for=` (a quoted `"[v6]:port"`, `v4:port`, or a bare address). An element
    /// without `for=`, or one naming no address (`unknown`, an obfuscated `_hidden`), ends the
    /// walk with nothing to believe: the peer.
    fn forwarded_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        self.walk(
            headers.get_all(http::header::FORWARDED),
            forwarded_for,
            peer,
        )
    }
}

/// The address of one `Forwarded` element's `for=` parameter (RFC 7239 §4, §6), if it names one.
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let element = std::str::from_utf8(element).ok()?;
    let value = element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then_some(value.trim())
    })?;
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    // `[2001:db8::1]:4711` or `[2001:db8::1]`; `192.0.2.1:4711` or `192.0.2.1`.
    let host = match value.strip_prefix('[') {
        Some(rest) => rest.split_once(']')?.0,
        None => value.split(':').next()?,
    };
    host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
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

pub mod jwks;
pub mod jwt;
#[cfg(test)]
mod tests;
