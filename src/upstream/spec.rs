//! A route's pool as the config gives it: its origins with their weights, how a request picks
//! among the endpoints, when an endpoint is taken out, and when a failed attempt is tried again.
//! Plain values, checked by the config (`config/route/pool.rs`), read by the pool at every
//! reload.

use std::time::Duration;

use http::HeaderName;

use super::Origin;

/// `upstream:` or `upstreams:` with what goes with them on a route.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// The origins, each with its weight (1-100); every address a name resolves to is an
    /// endpoint of that weight.
    pub origins: Vec<(Origin, u32)>,
    pub balance: Balance,
    pub outlier: OutlierSpec,
    pub retries: RetrySpec,
    /// Active checks (`health_check:`), if any.
    pub health: Option<HealthSpec>,
}

/// Active health checks (`health_check:`): a GET from every instance to every endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    /// The path checked; a 2xx within `timeout` passes.
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    /// Passes in a row that bring an unhealthy endpoint back.
    pub healthy_after: u32,
    /// Failures in a row that take a healthy endpoint out.
    pub unhealthy_after: u32,
}

/// How a request picks an endpoint (`balance:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// The endpoint with fewer requests in flight (weighted) of two picked at random; every
    /// endpoint compared when there are at most three.
    LeastRequest,
    /// Each endpoint in turn, as often as its weight says (smooth: nginx's weighted round robin).
    RoundRobin,
    /// The same key to the same endpoint while it is available; only its share moves when the
    /// pool changes (weighted rendezvous hashing).
    Hash(HashOn),
}

/// What `balance: hash` hashes (`hash_on:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashOn {
    /// The request's identity (its API key, user id or address: whose budget it spends).
    Identity,
    /// A request header's value; a request without it is balanced as `least_request`.
    Header(HeaderName),
}

/// Passive ejection (`outlier:`), on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierSpec {
    /// Failures in a row (connect failures, resets before a response head, 502/503/504) that
    /// take an endpoint out; 0 turns passive ejection off.
    pub consecutive_failures: u32,
    /// The first ejection; the n-th lasts n times as long, at most [`MAX_EJECTION`].
    pub ejection: Duration,
    /// The most of the pool out at once, in percent; one endpoint may always be out.
    pub max_ejected_percent: u32,
}

/// The longest an ejection lasts.
pub const MAX_EJECTION: Duration = Duration::from_secs(300);

impl Default for OutlierSpec {
    fn default() -> Self {
        OutlierSpec {
            consecutive_failures: 5,
            ejection: Duration::from_secs(30),
            max_ejected_percent: 50,
        }
    }
}

/// Retries (`retries:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySpec {
    /// Attempts in all, the first included (1: no retry).
    pub attempts: u32,
    /// What a failed attempt must have been to be tried again.
    pub on: RetryOn,
    /// Retries at most this share of the route's requests (percent, over 10 s), plus
    /// [`RETRY_FLOOR_PER_SECOND`] a second.
    pub budget_percent: u32,
}

/// Retries allowed every second whatever the share (Linkerd's and Envoy's floor).
pub const RETRY_FLOOR_PER_SECOND: u32 = 10;

impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            attempts: 2,
            on: RetryOn::default(),
            budget_percent: 20,
        }
    }
}

/// The failures a retry follows (`retries.on:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryOn {
    /// No connection could be made (the request never left): any method.
    pub connect_failure: bool,
    /// An HTTP/2 upstream refused the stream unprocessed: any method.
    pub refused_stream: bool,
    /// The connection failed after the request was sent: idempotent requests only.
    pub reset: bool,
    /// The upstream answered 502, 503 or 504 (bit 0, 1, 2): idempotent requests only.
    pub statuses: u8,
}

impl Default for RetryOn {
    fn default() -> Self {
        RetryOn {
            connect_failure: true,
            refused_stream: true,
            reset: false,
            statuses: 0,
        }
    }
}

impl RetryOn {
    /// True when an answer with `status` is retried (502, 503 or 504 listed).
    pub fn status(&self, status: u16) -> bool {
        matches!(status, 502..=504) && self.statuses & (1 << (status - 502)) != 0
    }
}
