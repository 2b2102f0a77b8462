//! Who is being limited right now: per route, the heaviest identities of the recent past, in
//! memory bounded whatever the number of identities (admin `GET /top`, `floodgate top`).
//!
//! Space-Saving ([`space_saving`]) with [`CAPACITY`] counters per route:
//! an identity already counted adds to its counter; a new one takes a free counter, or replaces
//! the smallest and starts from its count (an overestimate of at most that count, reported as
//! `error`). Any identity with more than `1 / CAPACITY` of a route's requests is guaranteed a
//! counter, so the heaviest are never missed, and the memory is `CAPACITY` entries per route
//! (each holding the identity's key bytes, at most [`MAX_KEY_BYTES`]). "Recent": every
//! [`DECAY`], every count halves (and counters that reach 0 are freed), so a client that stopped
//! an hour ago has left the table.
//!
//! Cost on the request path: one hash of the identity's bytes and one short lock per request
//! (a linear scan of the counters only when a new identity replaces the smallest; measured with
//! `cargo bench --bench top`).

use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::Duration;

use crate::identity::{Identity, IdentityKind, ip_octets};

pub mod space_saving;

use space_saving::{Counted, SpaceSaving};

/// Counters per route.
pub const CAPACITY: usize = 128;
/// How often every count halves.
pub const DECAY: Duration = Duration::from_secs(10);
/// The longest identity value kept (longer API keys are cut; they are shown hashed anyway).
pub const MAX_KEY_BYTES: usize = 64;

/// What a counter counts: an identity's kind and key bytes.
type Key = (IdentityKind, Box<[u8]>);

/// One route's heavy hitters.
pub struct TopTable {
    hasher: RandomState,
    inner: Mutex<Inner>,
}

struct Inner {
    counts: SpaceSaving<Key>,
    /// When the counts last halved (µs, the caller's clock).
    decayed_at: u64,
}

/// One row of `/top`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    /// How the identity is shown: an API key or user id hashed (`api_key:1a2b3c4d5e6f…`), a
    /// consumer by name, an address as such.
    pub identity: String,
    pub kind: &'static str,
    pub allowed: u64,
    pub denied: u64,
    /// How much of `allowed + denied` may belong to identities this counter replaced.
    pub error: u64,
}

impl Default for TopTable {
    fn default() -> Self {
        TopTable {
            hasher: RandomState::new(),
            inner: Mutex::new(Inner {
                counts: SpaceSaving::new(CAPACITY),
                decayed_at: 0,
            }),
        }
    }
}

impl TopTable {
    /// Counts one request of `identity` at `now_us`, allowed or not.
    pub fn record(&self, identity: &Identity<'_>, allowed: bool, now_us: u64) {
        let mut buf = [0u8; 16];
        let value = match identity {
            Identity::ApiKey(v)
            | Identity::Jwt(v)
            | Identity::UserId(v)
            | Identity::ClientCert(v) => *v,
            Identity::Consumer(c) => c.name.as_bytes(),
            Identity::Ip(ip) => ip_octets(*ip, &mut buf),
        };
        let value = &value[..value.len().min(MAX_KEY_BYTES)];
        let kind = identity.kind();
        let hash = self.hasher.hash_one((kind as u8, value));
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.decay(now_us);
        inner.counts.count(hash, || (kind, value.into()), allowed);
    }

    /// The `n` heaviest identities, most requests first, or most denied first when `by_denied`.
    pub fn top(&self, n: usize, by_denied: bool, now_us: u64) -> Vec<Row> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.decay(now_us);
        let mut counters: Vec<Counted<Key>> = inner.counts.counters().to_vec();
        drop(inner);
        if by_denied {
            counters.sort_by(|a, b| b.denied.cmp(&a.denied).then(b.total().cmp(&a.total())));
        } else {
            counters.sort_by_key(|c| std::cmp::Reverse(c.total()));
        }
        counters.truncate(n);
        counters.iter().map(row).collect()
    }

    /// How many identities are counted now (at most [`CAPACITY`]).
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .counts
            .counters()
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Halves every count once per [`DECAY`] that passed; frees the counters that reach 0.
    fn decay(&mut self, now_us: u64) {
        let period = DECAY.as_micros() as u64;
        if self.decayed_at == 0 {
            self.decayed_at = now_us;
            return;
        }
        let periods = now_us.saturating_sub(self.decayed_at) / period;
        if periods == 0 {
            return;
        }
        self.decayed_at += periods * period;
        self.counts.halve(periods.min(63) as u32);
    }
}

/// A counter as a row of `/top`.
fn row(c: &Counted<Key>) -> Row {
    let (kind, value) = &c.key;
    {
        let identity = match kind {
            IdentityKind::Consumer => format!("consumer:{}", String::from_utf8_lossy(value)),
            IdentityKind::Ip => {
                if let Ok(v4) = <[u8; 4]>::try_from(&value[..]) {
                    format!("ip:{}", std::net::Ipv4Addr::from(v4))
                } else if let Ok(v6) = <[u8; 16]>::try_from(&value[..]) {
                    format!("ip:{}", std::net::Ipv6Addr::from(v6))
                } else {
                    "ip:?".to_string()
                }
            }
            // A certificate's name is no secret, but it is the client's word in a log.
            IdentityKind::ApiKey
            | IdentityKind::Jwt
            | IdentityKind::UserId
            | IdentityKind::ClientCert => {
                use sha2::Digest;
                kind.short_label(&sha2::Sha256::digest(value))
            }
        };
        Row {
            identity,
            kind: kind.as_str(),
            allowed: c.allowed,
            denied: c.denied,
            error: c.error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn the_heaviest_identity_of_a_skewed_load_is_named_whatever_the_number_of_others() {
        let table = TopTable::default();
        // A million distinct keys, each once, and one key in every 20 requests (5%).
        let mut key = [0u8; 8];
        for i in 0u64..1_000_000 {
            key.copy_from_slice(&i.to_be_bytes());
            table.record(&Identity::ApiKey(&key), true, S);
            if i % 19 == 0 {
                table.record(&Identity::ApiKey(b"the-heavy-one"), i % 2 == 0, S);
            }
        }
        assert_eq!(table.len(), CAPACITY, "memory bounded by CAPACITY");
        let top = table.top(3, false, S);
        assert!(top[0].identity.starts_with("api_key:"), "{top:?}");
        // Exactly its count: it held a counter from its first request on.
        assert_eq!(top[0].allowed + top[0].denied, 52_632, "{top:?}");
        // And by denials: the same one (half its requests were denied).
        assert_eq!(table.top(1, true, S)[0].identity, top[0].identity);
        assert_eq!(top[0].denied, 26_316);
        assert_eq!(top[0].error, 0, "counted since its first request");
    }

    #[test]
    fn counts_halve_every_decay_and_a_quiet_client_leaves() {
        let table = TopTable::default();
        let ip = Identity::Ip("203.0.113.7".parse().unwrap());
        table.record(&ip, true, S);
        for _ in 0..99 {
            table.record(&ip, false, S);
        }
        let row = &table.top(1, false, S)[0];
        assert_eq!(
            (row.identity.as_str(), row.allowed, row.denied),
            ("ip:203.0.113.7", 1, 99)
        );
        let later = S + DECAY.as_micros() as u64;
        assert_eq!(table.top(1, false, later)[0].denied, 49);
        // Seven more halvings: gone.
        assert!(
            table
                .top(1, false, later + 7 * DECAY.as_micros() as u64)
                .is_empty()
        );
    }

    #[test]
    fn keys_and_user_ids_are_shown_hashed() {
        let table = TopTable::default();
        table.record(&Identity::ApiKey(b"secret-key"), true, S);
        table.record(&Identity::UserId(b"rider-42"), true, S);
        let rows = table.top(10, false, S);
        assert!(
            rows.iter()
                .all(|r| !r.identity.contains("secret") && !r.identity.contains("rider"))
        );
        assert!(rows.iter().any(|r| r.kind == "user_id"));
    }
}
