//! Whose allowance a limit spends: the store key ([`BudgetKey`]: the limit's id, the client's
//! kind and value) and one limit asked about one request ([`Ask`]).

use std::hash::{BuildHasherDefault, Hasher};

use super::Limit;

/// Lowercase hex of `bytes`: how floodgate writes digests (store keys, log fields, names).
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

/// Appends the lowercase hex of `bytes` to `out`.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
}

/// What a budget is keyed by, besides its route and limit: which kind of client value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// A raw API key (no `consumers:` section): hashed before it reaches any store.
    ApiKey,
    /// A known consumer, by name: all its keys share its budget.
    Consumer,
    /// A verified JWT's subject.
    Jwt,
    /// A user id set by a trusted proxy.
    UserId,
    /// A client IP address (its octets).
    Ip,
    /// A verified client certificate's name.
    ClientCert,
    /// The whole route: one budget for every client (the value is empty).
    Route,
    /// A combination of values read from the request (`per:` with `header:`, `query:`,
    /// `segment:` parts): hashed before it reaches any store, like an API key.
    Request,
    /// An endpoint of a route's pool (`per: endpoint`), by its `address:port`.
    Endpoint,
}

impl KeyKind {
    /// The name used in store keys, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::ApiKey => "api_key",
            KeyKind::Consumer => "consumer",
            KeyKind::Jwt => "jwt",
            KeyKind::UserId => "user_id",
            KeyKind::Ip => "ip",
            KeyKind::ClientCert => "client_cert",
            KeyKind::Route => "route",
            KeyKind::Request => "request",
            KeyKind::Endpoint => "endpoint",
        }
    }
}

/// Whose budget one limit spends, as the stores see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetKey<'a> {
    /// The limit's budget id: the route's name, the limit's position and a fingerprint of its
    /// parameters, so that a reload that changes a limit starts it afresh while unchanged limits
    /// keep their state.
    pub budget: &'a str,
    pub kind: KeyKind,
    /// The client value's bytes (IP addresses as their octets; empty for [`KeyKind::Route`]).
    pub value: &'a [u8],
}

impl BudgetKey<'_> {
    /// A 64-bit hash of the key under `hasher` (a per-process random seed, so clients cannot
    /// aim collisions). Separators keep `("ab", "c")` and `("a", "bc")` apart.
    pub fn hash_with(&self, hasher: &std::hash::RandomState) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = hasher.build_hasher();
        h.write(self.budget.as_bytes());
        h.write_u8(0xff);
        h.write_u8(self.kind as u8);
        h.write(self.value);
        h.finish()
    }
}

/// One limit asked about one request: the limit and the budget it spends.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub limit: &'a Limit,
    pub key: BudgetKey<'a>,
}

/// A map hasher for keys that are already [`BudgetKey::hash_with`] outputs.
pub(crate) type Prehashed = BuildHasherDefault<PrehashedKey>;

/// Keys are already SipHash outputs under a per-process random seed: hash them no further.
#[derive(Default)]
pub(crate) struct PrehashedKey(u64);

impl Hasher for PrehashedKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        assert_eq!(hex(&[0x00, 0x09, 0x9f, 0xa0, 0xff]), "00099fa0ff");
        assert_eq!(hex(&[]), "");
        let mut out = String::from("k:");
        push_hex(&mut out, &[0xab, 0x01]);
        assert_eq!(out, "k:ab01");
    }
}
