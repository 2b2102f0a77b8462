//! Who spends which allowance: the one place that turns what is known about a request into the
//! identity it is limited as, its client address, its tier, and the limits it asks.
//!
//! Three callers know different things about a request, and all three go through here, so they
//! cannot disagree:
//!
//! - the proxy ([`crate::proxy`]) has the live request: its headers and its peer;
//! - `floodgate replay` ([`crate::replay`]) has an access-log record: the digest of the API key
//!   or user id (never the raw value) and the client address;
//! - the admin `/budgets` endpoint (`admin/budgets.rs`) has a query: a key, a consumer's
//!   name, a user id or an address.
//!
//! Words used here and across the crate: a **limit** is one rule of a route (an algorithm and its
//! numbers, `per:` and `tiers:`); a route's **budget** is its list of limits, enforced or shadow;
//! an **allowance** is what one client may still spend from one limit, kept by the store under a
//! **key** (`limiter::BudgetKey`): the limit's id, the client's kind and value.

use std::net::IpAddr;

use crate::config::{Budget, Per, RequestView};
use crate::identity::{
    ANONYMOUS_TIER, Consumers, Identity, IdentityConfig, IdentityError, UnknownKey,
};
use crate::limiter::{Ask, KeyKind, MAX_LIMITS};

mod phase;
pub use phase::{LimitPhase, LimitRef, Refused};

/// What a caller knows about who sent a request, before consumers are looked up.
#[derive(Debug, Clone, Copy)]
pub enum Claim<'a> {
    /// An API key as sent (a live request, an admin query).
    ApiKey(&'a [u8]),
    /// An API key's SHA-256 (an access-log record: floodgate never logs a raw key). Without
    /// `consumers:`, its allowance is kept under the digest: replay's own store, consistent
    /// with itself.
    ApiKeyDigest(&'a [u8; 32]),
    /// A consumer by name (an admin query).
    Consumer(&'a str),
    /// No API key: a user id (from a trusted proxy) or the client address.
    Keyless(Identity<'a>),
    /// A verified client certificate's name (`identity.client_cert`): the consumer of that name
    /// when `consumers:` has one (its tier), else the certificate itself.
    Certificate(&'a str),
}

/// Why a claim cannot be limited.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The request itself is malformed (a conflicting header).
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// An admin query names a consumer the config does not have.
    #[error("no consumer is named {0:?}")]
    UnknownConsumer(String),
    /// Nothing is known of the request without its key (an admin query with no address).
    #[error("nothing identifies the request without its API key")]
    Unidentified,
}

/// The rules that resolve a claim: the `identity:` and `consumers:` sections, and the global
/// `shadow:` switch.
#[derive(Clone, Copy)]
pub struct Policy<'c> {
    pub identity: &'c IdentityConfig,
    pub consumers: Option<&'c Consumers>,
    /// The tiers the config names: a token's tier claim is one of them or `default`.
    pub tiers: &'c crate::config::KnownTiers,
    /// `shadow: true`: an enforced limit's denial is logged (`shadow_denied`), not answered.
    pub shadow: bool,
}

/// Who a request is limited as.
#[derive(Debug, Clone, Copy)]
pub struct Whose<'a> {
    pub identity: Identity<'a>,
    /// The client address `per: ip` limits spend (an IPv6 client's prefix).
    pub ip: IpAddr,
    /// The consumer's tier, or `anonymous`: which limits apply.
    pub tier: &'a str,
}

/// The limits of a budget that apply to one request, each with the allowance it spends.
pub struct Asks<'a> {
    pub asks: Vec<Ask<'a>>,
    /// Each ask's limit's position in the budget.
    pub positions: [usize; MAX_LIMITS],
}

impl<'c> Policy<'c> {
    /// Resolves `claim`: an API key becomes its consumer when there are consumers (an unknown
    /// key is refused under `unknown_key: reject`, and under `anonymous` the request is
    /// `keyless()` instead: user id, then address). `client()` is the client address, asked
    /// for only when the identity is not the address itself.
    ///
    /// The tier: a consumer's own; for a verified token's subject, the tier its claim names
    /// (`token_tier`), if the config names that tier, else `default` (a claim is the client's
    /// word: [`KnownTiers::claimed`](crate::config::KnownTiers::claimed)), and `anonymous` when it
    /// claims none; `anonymous` for anyone else. The proxy passes the verified token's claim,
    /// replay the tier the access log recorded, `/budgets` its `tier=`.
    pub fn resolve<'a>(
        &self,
        claim: Claim<'a>,
        token_tier: Option<&'a str>,
        keyless: impl FnOnce() -> Result<Identity<'a>, ResolveError>,
        client: impl FnOnce() -> IpAddr,
    ) -> Result<Whose<'a>, ResolveError>
    where
        'c: 'a,
    {
        let consumer = |found: Option<&'c crate::identity::Consumer>| match (
            found,
            self.consumers.map(|c| c.unknown_key),
        ) {
            (Some(consumer), _) => Ok(Some(Identity::Consumer(consumer))),
            (None, Some(UnknownKey::Reject)) => Err(IdentityError::UnknownKey),
            (None, _) => Ok(None),
        };
        let identity = match (claim, self.consumers) {
            (Claim::ApiKey(key), None) => Some(Identity::ApiKey(key)),
            (Claim::ApiKeyDigest(digest), None) => Some(Identity::ApiKey(&digest[..])),
            (Claim::ApiKey(key), Some(consumers)) => consumer(consumers.find(key))?,
            (Claim::ApiKeyDigest(digest), Some(consumers)) => {
                consumer(consumers.find_digest(digest))?
            }
            (Claim::Consumer(name), consumers) => Some(Identity::Consumer(
                consumers
                    .and_then(|c| c.named(name))
                    .ok_or_else(|| ResolveError::UnknownConsumer(name.to_string()))?,
            )),
            (Claim::Keyless(identity), _) => Some(identity),
            (Claim::Certificate(name), consumers) => {
                Some(match consumers.and_then(|c| c.named(name)) {
                    Some(consumer) => Identity::Consumer(consumer),
                    None => Identity::ClientCert(name.as_bytes()),
                })
            }
        };
        let identity = match identity {
            Some(identity) => identity,
            None => keyless()?,
        };
        let ip = match identity {
            Identity::Ip(ip) => ip,
            _ => client(),
        };
        let tier = match identity {
            Identity::Consumer(consumer) => consumer.tier.as_str(),
            Identity::Jwt(_) => token_tier.map_or(ANONYMOUS_TIER, |t| self.tiers.claimed(t)),
            _ => ANONYMOUS_TIER,
        };
        Ok(Whose { identity, ip, tier })
    }
}

/// The composite keys (`per:` with request parts) of one budget's limits for one request: one
/// buffer, and per limit (by index in the budget) the range of its key; `None` for a limit of
/// another scope, or one whose part the request lacks (it spends its identity's budget).
#[derive(Default)]
pub struct RequestKeys {
    buf: Vec<u8>,
    ranges: Vec<Option<std::ops::Range<usize>>>,
}

impl RequestKeys {
    /// The keys of `budget`'s composite limits for the request `view`, whose identity and
    /// address are `identity` and `ip`. Nothing is built (or allocated) for a budget without
    /// one.
    pub fn of(
        budget: &Budget,
        view: &RequestView<'_>,
        identity: (KeyKind, &[u8]),
        ip: &[u8],
    ) -> RequestKeys {
        let mut out = RequestKeys::default();
        if !budget.limits.iter().any(|l| l.per == Per::Request) {
            return out;
        }
        for limit in &budget.limits {
            let start = out.buf.len();
            let built =
                limit.per == Per::Request && limit.request_key(view, identity, ip, &mut out.buf);
            out.ranges.push(built.then_some(start..out.buf.len()));
        }
        out
    }

    fn get(&self, index: usize) -> Option<&[u8]> {
        let range = self.ranges.get(index)?.clone()?;
        Some(&self.buf[range])
    }

    /// For the access log: per composite key built, its limit's position in the route and a
    /// digest of the key (SHA-256, 128 bits: no header, claim or body value is logged), which
    /// replay spends instead of the key ([`RequestKeys::recorded`]).
    pub fn digests<'b>(
        &'b self,
        budget: &'b Budget,
    ) -> impl Iterator<Item = (usize, [u8; 16])> + 'b {
        use sha2::Digest;
        budget
            .limits
            .iter()
            .enumerate()
            .filter_map(|(index, limit)| {
                let key = self.get(index)?;
                let digest = sha2::Sha256::digest(key);
                let mut short = [0u8; 16];
                short.copy_from_slice(&digest[..16]);
                Some((limit.position(), short))
            })
    }

    /// The keys a logged request had (`recorded`: per limit position, the digest
    /// [`RequestKeys::digests`] logged), as replay spends them: one budget per digest, as the
    /// proxy had one per key.
    pub fn recorded(budget: &Budget, recorded: &[(usize, [u8; 16])]) -> RequestKeys {
        let mut out = RequestKeys::default();
        if recorded.is_empty() {
            return out;
        }
        for limit in &budget.limits {
            let range = recorded
                .iter()
                .find(|(position, _)| *position == limit.position())
                .map(|(_, digest)| {
                    let start = out.buf.len();
                    out.buf.extend_from_slice(digest);
                    start..out.buf.len()
                });
            out.ranges.push(range);
        }
        out
    }
}

impl<'a> Whose<'a> {
    /// The asks of `budget`'s limits that apply to this request. `id` and `ip` are the
    /// identity's and the address's bytes (`Identity::key_bytes`, `ip_octets`), `keys` its
    /// composite keys ([`RequestKeys::of`]) and `endpoint` the name of the endpoint it would be
    /// sent to (`per: endpoint` limits are left out without one), which the asks borrow.
    pub fn asks(
        &self,
        budget: &'a Budget,
        id: &'a [u8],
        ip: &'a [u8],
        keys: &'a RequestKeys,
        endpoint: Option<&'a [u8]>,
    ) -> Asks<'a> {
        asks_with(
            budget,
            self.tier,
            Some((KeyKind::from(self.identity.kind()), id)),
            Some(ip),
            keys,
            endpoint,
        )
    }
}

/// The asks of `budget`'s limits that apply to tier `tier`, for a client known by `identity` and
/// `ip` (either may be unknown to an admin query: limits that need it are left out).
pub fn asks<'a>(
    budget: &'a Budget,
    tier: &str,
    identity: Option<(KeyKind, &'a [u8])>,
    ip: Option<&'a [u8]>,
) -> Asks<'a> {
    static NONE: std::sync::LazyLock<RequestKeys> = std::sync::LazyLock::new(RequestKeys::default);
    asks_with(budget, tier, identity, ip, &NONE, None)
}

/// [`asks`] with the request's composite keys, and the endpoint it would be sent to for the
/// limits `per: endpoint` (left out without one).
pub fn asks_with<'a>(
    budget: &'a Budget,
    tier: &str,
    identity: Option<(KeyKind, &'a [u8])>,
    ip: Option<&'a [u8]>,
    keys: &'a RequestKeys,
    endpoint: Option<&'a [u8]>,
) -> Asks<'a> {
    let mut out = Asks {
        asks: Vec::with_capacity(budget.limits.len()),
        positions: [0; MAX_LIMITS],
    };
    for (position, limit) in budget.limits.iter().enumerate() {
        if !limit.applies_to(tier) || out.asks.len() == MAX_LIMITS {
            continue;
        }
        let ask = match (limit.per, keys.get(position)) {
            (Per::Endpoint, _) => endpoint.map(|e| limit.ask_endpoint(e)),
            (_, Some(key)) => Some(limit.ask_request(key)),
            (_, None) => limit.ask(identity, ip),
        };
        if let Some(ask) = ask {
            out.positions[out.asks.len()] = position;
            out.asks.push(ask);
        }
    }
    out
}
