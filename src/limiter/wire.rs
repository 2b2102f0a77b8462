//! What the remote stores (Redis and PostgreSQL) have in common on the wire: the name each budget
//! is stored under, and the layout of a decision's reply. Both run the same algorithms server-side
//! (Lua in Redis, PL/pgSQL in PostgreSQL) and answer with the same list of integers.

use sha2::{Digest, Sha256};

use super::{Ask, Decision, Figures, LeaseId, LimiterError, Verdict};

/// The reply's leading items: the all-or-nothing verdict (0/1) and the time decided at (µs).
pub const REPLY_HEADER: usize = 2;
/// The reply's items per limit: allowed, limit, remaining, reset_after_us, retry_after_us,
/// delay_us (the fields of [`Decision`], in order).
pub const REPLY_FIELDS: usize = 6;

/// The stored name of one ask's budget: `{prefix}{budget}:{kind}:{{hash}}:{algorithm}`. The
/// client value is hashed (SHA-256 of kind and value, 128 bits kept), so no raw API key or
/// address is stored; in braces, the hash is the Redis Cluster hash tag, which puts the budgets
/// one client spends in one slot.
pub fn key_name(prefix: &str, ask: &Ask<'_>) -> String {
    let key = &ask.key;
    let mut digest = Sha256::new();
    digest.update(key.kind.as_str().as_bytes());
    digest.update([0]);
    digest.update(key.value);
    let hash = digest.finalize();
    let mut name = String::with_capacity(prefix.len() + key.budget.len() + 64);
    name.push_str(prefix);
    name.push_str(key.budget);
    name.push(':');
    name.push_str(key.kind.as_str());
    name.push_str(":{");
    super::push_hex(&mut name, &hash[..16]);
    name.push_str("}:");
    name.push_str(ask.limit.algorithm().name());
    name
}

/// A decision's reply, read: [`REPLY_HEADER`] items, then [`REPLY_FIELDS`] per limit.
#[derive(Debug)]
pub struct Reply {
    pub verdict: Verdict,
    pub decisions: Vec<Decision>,
    /// Per limit, the requests' worth of units leased beyond this request (see
    /// `lease.rs`); empty when none were asked for.
    pub leased: Vec<u64>,
}

impl Reply {
    /// Reads a reply of `len` items, where `item(i)` is the i-th as a non-negative integer (or
    /// the reason it is not one), for a request that asked `limits` limits.
    pub fn read(
        len: usize,
        limits: usize,
        item: impl Fn(usize) -> Result<u64, LimiterError>,
    ) -> Result<Reply, LimiterError> {
        let body = len.saturating_sub(REPLY_HEADER);
        if len < REPLY_HEADER || body == 0 || !body.is_multiple_of(REPLY_FIELDS) {
            return Err(LimiterError::protocol(format!(
                "reply has {len} items, expected {REPLY_HEADER} plus {REPLY_FIELDS} per limit"
            )));
        }
        if body / REPLY_FIELDS != limits {
            return Err(LimiterError::protocol(format!(
                "reply has {} decisions for {limits} limits",
                body / REPLY_FIELDS
            )));
        }
        let decisions = (0..limits)
            .map(|i| {
                let at = REPLY_HEADER + i * REPLY_FIELDS;
                let (limit, remaining, reset) = (item(at + 1)?, item(at + 2)?, item(at + 3)?);
                Ok(if item(at)? == 1 {
                    Decision::allow(
                        Figures {
                            limit,
                            remaining,
                            reset_after_us: reset,
                        },
                        item(at + 5)?,
                    )
                } else {
                    Decision::deny(
                        Figures {
                            limit,
                            remaining,
                            reset_after_us: reset,
                        },
                        item(at + 4)?,
                    )
                })
            })
            .collect::<Result<Vec<_>, LimiterError>>()?;
        let verdict = Verdict::from_decisions(item(1)?, &decisions)
            .ok_or_else(|| LimiterError::protocol("empty reply"))?;
        if verdict.allowed() != (item(0)? == 1) {
            return Err(LimiterError::protocol(
                "the store's verdict disagrees with its decisions",
            ));
        }
        Ok(Reply {
            verdict,
            decisions,
            leased: Vec::new(),
        })
    }

    /// [`Reply::read`] of a reply that ends with one leased count per limit (`Reply::leased`),
    /// as both stores' scripts answer.
    pub fn read_with_leases(
        len: usize,
        limits: usize,
        item: impl Fn(usize) -> Result<u64, LimiterError>,
    ) -> Result<Reply, LimiterError> {
        let Some(decided) = len.checked_sub(limits) else {
            return Err(LimiterError::protocol(format!(
                "reply has {len} items for {limits} limits"
            )));
        };
        let mut read = Reply::read(decided, limits, &item)?;
        read.leased = (decided..len).map(&item).collect::<Result<_, _>>()?;
        Ok(read)
    }

    /// [`Reply::read_with_leases`] over signed integers (PostgreSQL's `bigint[]`).
    pub fn from_ints(items: &[i64], limits: usize) -> Result<Reply, LimiterError> {
        Reply::read_with_leases(items.len(), limits, |at| {
            u64::try_from(items[at]).map_err(|_| {
                LimiterError::refused(format!(
                    "reply item {at} is {}, expected a non-negative number",
                    items[at]
                ))
            })
        })
    }
}

/// What one call to a remote store does: its mode, in place of optional arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Decide and spend, on the store's own clock; the request's concurrency leases are named
    /// `lease`.
    Decide { lease: LeaseId },
    /// The same at `now_us` on the caller's clock (a test store's entry point).
    DecideAt { lease: LeaseId, now_us: u64 },
    /// Decide without spending anything (`/budgets`).
    Peek,
}

impl Call {
    /// The lease token, when the call spends.
    pub fn lease(self) -> Option<LeaseId> {
        match self {
            Call::Decide { lease } | Call::DecideAt { lease, .. } => Some(lease),
            Call::Peek => None,
        }
    }

    /// The caller's instant, when the call does not read the store's clock.
    pub fn at(self) -> Option<u64> {
        match self {
            Call::DecideAt { now_us, .. } => Some(now_us),
            _ => None,
        }
    }

    /// True for the calls a batch can carry: decisions on the store's clock.
    pub fn batchable(self) -> bool {
        matches!(self, Call::Decide { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_read_by_its_named_layout() {
        let reply = [0, 7, 1, 10, 9, 100, 0, 0, 0, 5, 0, 300, 40, 0, 3, 0];
        let read = Reply::from_ints(&reply, 2).unwrap();
        assert_eq!(read.leased, vec![3, 0]);
        assert_eq!(read.decisions.len(), 2);
        assert!(!read.verdict.allowed());
        assert_eq!(read.verdict.now_us, 7);
        assert_eq!(read.verdict.retry_after_us(), 40);
        assert_eq!(read.verdict.headline_index, 1);
    }

    #[test]
    fn malformed_replies_are_protocol_errors_and_unreadable_figures_are_about_the_keys() {
        // A figure that is no count comes from a key's state, not the store's health: it must
        // not count towards the breaker.
        for bad in [
            &[1, 7, 1, 10, 9, 100, 0, -1, 0][..],
            &[1, 7, 1, 10, 9, 100, 0, 0, -1][..],
            &[1, 7, 1, 10, i64::MIN, 100, 0, 0, 0][..],
        ] {
            assert!(
                matches!(Reply::from_ints(bad, 1), Err(LimiterError::Refused(_))),
                "{bad:?}"
            );
        }
        for (bad, limits) in [
            (&[1, 7][..], 1),
            (&[1, 7, 1, 10, 9, 0][..], 1),
            (&[0, 7, 1, 10, 9, 100, 0, 0, 0][..], 1),
            (&[1, 7, 1, 10, 9, 100, 0, 0, 0][..], 2),
        ] {
            assert!(
                matches!(
                    Reply::from_ints(bad, limits),
                    Err(LimiterError::Protocol(_))
                ),
                "{bad:?}"
            );
        }
    }
}
