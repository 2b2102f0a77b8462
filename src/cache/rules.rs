//! What the config says of the cache: the whole cache's bounds (`cache:`) and a route's rules
//! (a route's `cache:`), as the config builds them.

use std::time::Duration;

use http::HeaderName;

/// `cache:` at the top level: the bounds every cached route shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Bytes the entries may hold (bodies, headers and keys), evicted by size past it.
    pub memory: usize,
    /// The largest answer stored; a larger one streams through uncached.
    pub max_entry: usize,
    /// Entries and fill claims kept in the store every instance shares (`cache.shared`).
    pub shared: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            memory: 64 << 20,
            max_entry: 1 << 20,
            shared: false,
        }
    }
}

/// One part of a route's cache key beyond the host and path (`key:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The query string as the client sent it.
    Query,
    /// One request header's value (its absence is a value too).
    Header(HeaderName),
    /// Whose the request is: one cache per client.
    Identity,
}

/// A route's `cache:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Freshness where the upstream gives none (and always, with `force`).
    pub ttl: Duration,
    /// `ttl` whatever the upstream says of freshness (`no-store` and `private` still honoured).
    pub force: bool,
    pub key: Vec<KeyPart>,
    /// The answers are the same for every client: credentialed requests use the cache too.
    pub public: bool,
    /// The statuses stored.
    pub statuses: Vec<u16>,
    /// One upstream fetch per key at a time.
    pub coalesce: bool,
    /// How long a request waits for another's fetch before it goes upstream itself.
    pub coalesce_wait: Duration,
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
    pub stale_if_overloaded: Duration,
    pub stale_if_limited: Duration,
}

/// RFC 9110 §15.1: the statuses cacheable by default.
pub const DEFAULT_STATUSES: [u16; 11] = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];

impl Default for Rules {
    /// The contract's defaults: `ttl` 1 s, the query in the key, RFC 9110's statuses, one fetch
    /// per key with a 2 s wait, no stale windows.
    fn default() -> Self {
        Rules {
            ttl: Duration::from_secs(1),
            force: false,
            key: vec![KeyPart::Query],
            public: false,
            statuses: DEFAULT_STATUSES.to_vec(),
            coalesce: true,
            coalesce_wait: Duration::from_secs(2),
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
            stale_if_overloaded: Duration::ZERO,
            stale_if_limited: Duration::ZERO,
        }
    }
}

impl Rules {
    /// The longest a copy may be served after it went stale, whatever the reason.
    pub fn longest_stale(&self) -> Duration {
        self.stale_while_revalidate
            .max(self.stale_if_error)
            .max(self.stale_if_overloaded)
            .max(self.stale_if_limited)
    }

    /// True when the key holds whose the request is.
    pub fn keys_identity(&self) -> bool {
        self.key.contains(&KeyPart::Identity)
    }

    /// True when a request carrying credentials may use the cache whatever the answer says.
    pub fn shares_credentialed(&self) -> bool {
        self.public || self.keys_identity()
    }
}
