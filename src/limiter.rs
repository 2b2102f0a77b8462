//! Rate limiting without HTTP: the algorithms, their parameters, the decisions they make and the
//! stores that keep their state.
//!
//! The pieces are independent, as in `governor`: a [`Limit`] (algorithm × parameters × cost) says
//! what is allowed; [`algorithm::State`] holds one budget's state for one limit and decides as a
//! pure function of (state, now, parameters); a store keeps states per [`BudgetKey`]; a [`Clock`]
//! says what time it is. Nothing here knows about hyper or the config file.
//!
//! A request is decided by a list of [`Ask`]s, one per limit that applies to it, each naming the
//! budget that limit spends (the caller's identity, its IP, or the whole route). The stores
//! decide the list all-or-nothing: when one limit denies, nothing is spent from any of them.
//!
//! [`Algorithm`] and [`Limit`] cannot be built invalid: their fields are private and their
//! constructors check every bound the algorithms and the Redis scripts rely on (no zero
//! interval or window, no budget past 2^53 µs, no cost above what the budget holds).

pub mod algorithm;
pub mod batch;
mod clock;
mod decision;
pub mod guard;
mod key;
pub mod lease;
mod limit;
pub mod memory;
pub mod postgres;
pub mod redis;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use clock::{AnchoredClock, Clock, ManualClock, MonotonicClock, SystemClock};
pub use decision::{Admission, Decision, Outcome, Source, Verdict};
pub use key::{Ask, BudgetKey, KeyKind, hex, push_hex};
pub use limit::{Algorithm, AlgorithmKind, Limit, LimitError, LimitField};
pub use memory::MemoryStore;

/// The most limits one request may be decided against (the config checks it per route), so the
/// stores can keep one request's working set on the stack.
pub const MAX_LIMITS: usize = 16;

/// Why a store could not decide. The proxy answers these according to `storage.on_error`.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("limiter store timed out after {0:?}")]
    Timeout(Duration),
    #[error("limiter store unavailable: {0}")]
    Unavailable(String),
    #[error("limiter store answered something unexpected: {0}")]
    Protocol(String),
    /// The store is up but refused this request (an error reply for its keys, such as a script
    /// error on corrupt data). It says nothing about the store's health, so it does not count
    /// towards the circuit breaker.
    #[error("limiter store refused the request: {0}")]
    Refused(String),
}

/// What a request gets when the limiter store cannot decide (`storage.on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail open: forward the request.
    Allow,
    /// Fail closed: answer 503 `rate_limiter_unavailable`.
    Deny,
    /// Decide with the in-process limiter instead.
    Local,
}

/// The token that names one request's concurrency leases, so it can release them. Unique within
/// a process; the stores combine it with nothing else, so tokens of different instances sharing
/// one Redis start from a random point (64 bits: collisions are negligible).
pub type LeaseId = u64;

/// A new lease token.
pub fn next_lease() -> LeaseId {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::OnceLock;
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(RandomState::new().hash_one(0u8) >> 1))
        .fetch_add(1, Ordering::Relaxed)
}

/// What the proxy asks: a store, and what to do when it fails.
#[derive(Clone)]
pub enum Limiter {
    /// State in this process: never fails.
    Memory(Arc<MemoryStore>),
    /// State in Redis, behind the timeout, breaker and deny cache of [`guard::Guarded`].
    Redis(Arc<guard::Guarded<redis::RedisStore>>),
    /// State in PostgreSQL, behind the same guard.
    Postgres(Arc<guard::Guarded<postgres::PostgresStore>>),
}

/// `$remote` for either remote store (the guard is generic over the store, so each needs its own
/// arm), `$memory` for the memory store.
macro_rules! by_store {
    ($limiter:expr, $store:ident => $memory:expr, $guarded:ident => $remote:expr) => {
        match $limiter {
            Limiter::Memory($store) => $memory,
            Limiter::Redis($guarded) => $remote,
            Limiter::Postgres($guarded) => $remote,
        }
    };
}

impl Limiter {
    /// Applies a reloaded `storage` section to a remote store: the decision timeout, batching,
    /// and leases (`None`: off). The memory store has none of these.
    pub fn reconfigure(&self, timeout: Duration, batch: bool, lease_ttl: Option<Duration>) {
        by_store!(self,
            _store => {},
            guarded => guarded.reconfigure(timeout, batch, lease_ttl))
    }

    /// Decides one request against all `asks`, all-or-nothing. `Err` means the store failed and
    /// `on_error` is `deny`.
    pub async fn decide(
        &self,
        asks: &[Ask<'_>],
        on_error: OnError,
    ) -> Result<Admission, LimiterError> {
        let lease = next_lease();
        by_store!(self,
            store => Ok(match store.decide_leased(asks, lease) {
                Some(verdict) => Admission::Limited {
                    verdict,
                    source: Source::Store,
                    lease,
                },
                None => Admission::Unlimited,
            }),
            guarded => guarded.decide(asks, lease, on_error).await
        )
    }

    /// Gives back the concurrency leases `lease` holds in `asks` (those of other algorithms are
    /// skipped), in the store that granted them. Never fails: a lease that cannot be released
    /// runs out on its own.
    pub async fn release(&self, asks: &[Ask<'_>], lease: LeaseId, source: Source) {
        by_store!(self,
            store => store.release(asks, lease),
            guarded => guarded.release(asks, lease, source).await
        )
    }

    /// What `asks` would decide now, per limit (in the order asked), spending nothing.
    pub async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        by_store!(self,
            store => Ok(store.peek(asks)),
            guarded => guarded.peek(asks).await
        )
    }

    /// Readies a remote store for its first decision (connects, loads its scripts or schema),
    /// waiting at most `within`: true when it is ready. The memory store always is.
    pub async fn prepare(&self, within: Duration) -> bool {
        by_store!(self, _store => true, guarded => guarded.prepare(within).await)
    }

    /// True when the store answers: `/readyz`.
    pub async fn is_ready(&self) -> bool {
        by_store!(self, _store => true, guarded => guarded.is_ready().await)
    }

    /// The in-process store (the fallback, for a remote store).
    pub fn memory(&self) -> &Arc<MemoryStore> {
        by_store!(self, store => store, guarded => guarded.local())
    }

    /// The guard's counters, when there is a remote store.
    /// The store's name for metric labels: `memory`, `redis` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Limiter::Memory(_) => "memory",
            Limiter::Redis(_) => "redis",
            Limiter::Postgres(_) => "postgres",
        }
    }

    pub fn guard_stats(&self) -> Option<&guard::GuardStats> {
        by_store!(self, _store => None, guarded => Some(guarded.stats()))
    }

    /// The breaker's state, when there is a remote store.
    pub fn breaker_state(&self) -> Option<guard::BreakerState> {
        by_store!(self, _store => None, guarded => Some(guarded.breaker_now()))
    }
}

/// A budget key that owns its bytes: for leases held past the request's borrow.
#[derive(Debug, Clone)]
struct OwnedKey {
    limit: Limit,
    budget: String,
    kind: KeyKind,
    value: Vec<u8>,
}

/// The concurrency leases one admitted request holds. Dropping it gives them back (at once on
/// the memory store, in a spawned task on a remote store), so the proxy ties it to the response body:
/// every way a request can end (body sent, upstream error or timeout, client gone, a panic
/// unwinding the task) drops it.
pub struct HeldLeases {
    limiter: Limiter,
    keys: Vec<OwnedKey>,
    lease: LeaseId,
    source: Source,
}

impl Limiter {
    /// The leases `admission` granted in `asks`, if it allowed and any ask is a concurrency limit.
    pub fn hold(&self, asks: &[Ask<'_>], admission: &Admission) -> Option<HeldLeases> {
        let Admission::Limited {
            verdict,
            source,
            lease,
        } = *admission
        else {
            return None;
        };
        if !verdict.allowed() {
            return None;
        }
        let keys: Vec<OwnedKey> = asks
            .iter()
            .filter(|a| a.limit.algorithm().kind() == AlgorithmKind::Concurrency)
            .map(|a| OwnedKey {
                limit: *a.limit,
                budget: a.key.budget.to_string(),
                kind: a.key.kind,
                value: a.key.value.to_vec(),
            })
            .collect();
        (!keys.is_empty()).then(|| HeldLeases {
            limiter: self.clone(),
            keys,
            lease,
            source,
        })
    }
}

fn borrowed(keys: &[OwnedKey]) -> Vec<Ask<'_>> {
    keys.iter()
        .map(|k| Ask {
            limit: &k.limit,
            key: BudgetKey {
                budget: &k.budget,
                kind: k.kind,
                value: &k.value,
            },
        })
        .collect()
}

impl Drop for HeldLeases {
    fn drop(&mut self) {
        match &self.limiter {
            Limiter::Memory(store) => store.release(&borrowed(&self.keys), self.lease),
            Limiter::Redis(_) | Limiter::Postgres(_) => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return; // no runtime (process exit): the leases end on their own
                };
                let limiter = self.limiter.clone();
                let keys = std::mem::take(&mut self.keys);
                let (lease, source) = (self.lease, self.source);
                runtime.spawn(async move {
                    limiter.release(&borrowed(&keys), lease, source).await;
                });
            }
        }
    }
}
