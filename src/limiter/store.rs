//! What a store of budgets does, for every store: the in-process one (`memory.rs`), Redis
//! (`redis.rs`) and PostgreSQL (`postgres.rs`) implement [`Store`], the calls of the wire
//! protocol (`wire.rs`). A store in another process is reached through the guard (`guard.rs`: the
//! timeout, the breaker, the deny cache, `on_error`), which holds it as a `dyn Store`; the
//! in-process store needs no guard, and the request path calls it directly (`front.rs`).
//!
//! What instances sharing a store keep there beside budgets (the control list, claims) is
//! [`Shared`], a trait of its own: the memory store is one instance's and has none.

use std::future::Future;
use std::pin::Pin;

use prometheus_client::metrics::counter::Counter;

use super::batch::Late;
use super::lease::LeaseAsk;
use super::wire::{Call, Reply};
use super::{Ask, Decision, LeaseId, LimiterError, Settlement};

/// A store's call: boxed, so that a store is a `dyn Store` and its callers are one code path
/// whatever the store (a remote call's round trip outweighs the allocation by far; the request
/// path's in-process decisions do not go through it).
pub type StoreCall<'a, T> = Pin<Box<dyn Future<Output = Result<T, LimiterError>> + Send + 'a>>;

/// A call already answered: what the in-process store returns.
pub(super) fn answered<'a, T: Send + 'a>(result: Result<T, LimiterError>) -> StoreCall<'a, T> {
    Box::pin(std::future::ready(result))
}

/// One change of the shared control list: an entry's id, and its text (`None`: it goes).
pub type ControlChange<'a> = (&'a str, Option<&'a str>);

/// The control list as a store holds it: its version, and its entries (unchanged since `known`:
/// `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlList {
    pub version: String,
    pub entries: Option<Vec<String>>,
}

impl ControlList {
    /// The list at `version`: no entries when the caller knows that version already, else
    /// `entries`, read.
    pub async fn read(
        version: String,
        known: Option<String>,
        entries: impl Future<Output = Result<Vec<String>, LimiterError>>,
    ) -> Result<Option<ControlList>, LimiterError> {
        let entries = match known.as_deref() == Some(version.as_str()) {
            true => None,
            false => Some(entries.await?),
        };
        Ok(Some(ControlList { version, entries }))
    }
}

/// Where budgets live: the one trait of the memory store, Redis and PostgreSQL.
///
/// A store implements the calls of the wire protocol: [`Store::invoke`] (a decision, on the
/// store's clock or, for a store that [`Store::reads_callers_clock`], the caller's; or a peek),
/// [`Store::settle_at`], [`Store::release`], [`Store::reset`], and its own upkeep; the
/// decisions every caller makes are provided here in terms of them, once for every store.
pub trait Store: Send + Sync + 'static {
    /// The store's name for metric labels: `memory`, `redis` or `postgres`.
    fn name(&self) -> &'static str;
    /// One call doing what `call` says for `asks`, all-or-nothing, in one round trip (or in a
    /// batch): a decision whose concurrency leases are named by the call's lease, that also
    /// leases, per ask, up to `wants[i].want` more requests' worth of units for this instance to
    /// spend itself (`Reply::leased`) and first takes back what an ended lease left unspent
    /// (`wants[i].back`); or a peek. An answer that comes after the caller gave up goes to
    /// `late`, where the store can tell (a batched decision that had left). A store that cannot
    /// lease leases nothing (and is never given anything back).
    fn invoke<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        call: Call,
        wants: &'a [LeaseAsk],
        late: Option<Late>,
    ) -> StoreCall<'a, Reply>;
    /// Settles the reservations of `asks` (`settlements[i]` for `asks[i]`): refunds and
    /// charges (`cost: {reserve, actual}`), at `now_us` on the caller's clock for a store that
    /// reads it (`None`: the store's clock).
    fn settle_at<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        settlements: &'a [Settlement],
        now_us: Option<u64>,
    ) -> StoreCall<'a, ()>;
    /// Gives back the concurrency leases named `lease` in `asks`' budgets.
    fn release<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()>;
    /// Extends the concurrency leases named `lease` in `asks`' budgets to a whole lease span
    /// from now, on the store's clock (a lease that already ended stays ended).
    fn renew<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()>;
    /// Forgets the state of `asks`' budgets: each is fresh (full) at its next decision
    /// (`POST /reset`).
    fn reset<'a>(&'a self, asks: &'a [Ask<'a>]) -> StoreCall<'a, ()>;
    /// Whether the store answers at all: `/readyz`.
    fn ping(&self) -> StoreCall<'_, ()>;
    /// Gets ready to decide (connects, loads scripts or a schema) before the first request, which
    /// would otherwise pay for that within its timeout. Pings by default.
    fn prepare(&self) -> StoreCall<'_, ()> {
        self.ping()
    }
    /// True for a store that decides on the caller's clock when asked to (the memory store, and
    /// the differential tests' remote stores): [`Call::DecideAt`] is refused by any other.
    fn reads_callers_clock(&self) -> bool {
        false
    }
    /// What instances sharing this store keep in it beside budgets (the control list, claims);
    /// `None` for a store that is one instance's.
    fn shared(&self) -> Option<&dyn Shared> {
        None
    }
    /// A decision failed (an error or the timeout): a store that can find its server anew
    /// (Redis behind Sentinel asks the sentinels again) starts doing so. Does nothing by default.
    fn after_failure(&self) {}
    /// Turns batching (`storage.batch`) on or off for the decisions that follow; a store that
    /// does not batch ignores it.
    fn set_batching(&self, _on: bool) {}
    /// Counts its round trips in `counter` itself (a store that batches); false when it does
    /// not, and the guard counts one per decision.
    fn count_calls(&self, counter: Counter) -> bool {
        let _ = counter;
        false
    }

    /// Decides `asks` all-or-nothing in one round trip; concurrency leases are named `lease`.
    /// Returns the verdict and each limit's own decision (for the deny cache).
    fn decide<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, Reply> {
        self.invoke(asks, Call::Decide { lease }, &[], None)
    }
    /// [`Store::decide_leasing`] at `now_us` on the caller's clock, on a store that
    /// [`Store::reads_callers_clock`]: for the tests that drive a store on their own clock.
    fn decide_leasing_at<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        now_us: u64,
        lease: LeaseId,
        wants: &'a [LeaseAsk],
    ) -> StoreCall<'a, Reply> {
        if !self.reads_callers_clock() {
            return answered(Err(LimiterError::protocol(
                "this store reads its own clock; make it with connect_for_test",
            )));
        }
        self.invoke(asks, Call::DecideAt { lease, now_us }, wants, None)
    }
    /// What `asks` would decide now, per limit, spending nothing.
    fn peek<'a>(&'a self, asks: &'a [Ask<'a>]) -> StoreCall<'a, Vec<Decision>> {
        let reply = self.invoke(asks, Call::Peek, &[], None);
        Box::pin(async move { Ok(reply.await?.decisions) })
    }
    /// [`Store::settle_at`] on the store's clock.
    fn settle<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        settlements: &'a [Settlement],
    ) -> StoreCall<'a, ()> {
        self.settle_at(asks, settlements, None)
    }
    /// This store with batched decisions (`storage.batch`): see [`Store::set_batching`].
    fn batched(self) -> Self
    where
        Self: Sized,
    {
        self.set_batching(true);
        self
    }
}

/// What instances sharing a store keep in it beside budgets: the control list (bans, overrides,
/// resets: `control.rs`) and claims (an alert sent once across instances: `alerts.rs`). Redis
/// and PostgreSQL keep them; [`Store::shared`] finds them.
pub trait Shared: Send + Sync {
    /// The shared control list: a version that changes with every write, and, when it differs
    /// from `known`, every entry.
    fn control_read(&self, known: Option<String>) -> StoreCall<'_, Option<ControlList>>;
    /// Writes entries of the control list, all of them or none: each change an id and its
    /// entry (`None`: removes it).
    fn control_write<'a>(&'a self, changes: &'a [ControlChange<'a>]) -> StoreCall<'a, ()>;
    /// Claims `key` for every instance for `ttl_us` (µs): true when this call claimed it (nobody
    /// held it), false when another claim holds it.
    fn claim<'a>(&'a self, key: &'a str, ttl_us: u64) -> StoreCall<'a, bool>;
    /// Gives up the claim on `key`, whoever holds it.
    fn unclaim<'a>(&'a self, key: &'a str) -> StoreCall<'a, ()>;
    /// The bytes kept under `key` for every instance (ACME's account, certificates and
    /// challenge answers: `src/acme.rs`), if any.
    fn blob_read<'a>(&'a self, key: &'a str) -> StoreCall<'a, Option<Vec<u8>>>;
    /// Keeps `bytes` under `key` for every instance, replacing what was there.
    fn blob_write<'a>(&'a self, key: &'a str, bytes: &'a [u8]) -> StoreCall<'a, ()>;
    /// Forgets what is kept under `key`.
    fn blob_remove<'a>(&'a self, key: &'a str) -> StoreCall<'a, ()>;
    /// `cache.shared`: the variants stored under the cache entry `key` of `route`, each with how
    /// long ago the store wrote it (on the store's clock, so instances' clocks do not matter).
    fn cache_read<'a>(&'a self, route: &'a str, key: &'a str) -> StoreCall<'a, Vec<CacheVariant>>;
    /// Stores `bytes` as the variant `variant` of the cache entry `key`, kept `keep_us` (µs), at
    /// `place` (what a removal matches on).
    fn cache_write<'a>(&'a self, write: CacheWrite<'a>) -> StoreCall<'a, ()>;
    /// Removes the cache entries of `route` that `scope` names.
    fn cache_remove<'a>(&'a self, route: &'a str, scope: CacheScope<'a>) -> StoreCall<'a, ()>;
    /// A waiting room: `client` (a digest) asks to enter `room`, on the store's clock (see
    /// `room/line.rs`, whose rules the store applies in one atomic step).
    fn room_enter<'a>(
        &'a self,
        room: &'a str,
        client: &'a str,
        bounds: RoomBounds,
    ) -> StoreCall<'a, RoomEntered>;
}

/// A waiting room's bounds, as the store applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoomBounds {
    pub active: u64,
    /// Admissions a second.
    pub admit_rate: f64,
    pub session_ms: u64,
    /// How long a waiting client may go without asking before it leaves the line.
    pub linger_ms: u64,
    /// The most clients in line.
    pub max_line: u64,
}

/// What a waiting room's store said to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomEntered {
    pub admitted: bool,
    /// Its place in line (1: next); 0 when admitted.
    pub position: u64,
    pub active: u64,
    pub waiting: u64,
    /// Admissions since the room began, every instance together.
    pub admitted_total: u64,
}

/// One variant of a shared cache entry, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheVariant {
    /// How long ago the store wrote it (µs, on the store's clock).
    pub elapsed_us: u64,
    pub bytes: Vec<u8>,
}

/// A shared cache entry's variant to write.
#[derive(Debug, Clone, Copy)]
pub struct CacheWrite<'a> {
    pub route: &'a str,
    pub key: &'a str,
    pub variant: &'a str,
    /// Where it sits: the host (without its port), the path and the query the client asked.
    pub host: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub bytes: &'a [u8],
    /// How long the store keeps it (µs).
    pub keep_us: u64,
}

/// Which of a route's shared cache entries a removal names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheScope<'a> {
    /// Every one.
    Route,
    /// Every host's and query's entries of one path.
    Path(&'a str),
    /// Every path under a prefix.
    Prefix(&'a str),
    /// One URI: a host, a path and a query (an unsafe method's invalidation).
    Uri {
        host: &'a str,
        path: &'a str,
        query: Option<&'a str>,
    },
}

impl CacheScope<'_> {
    /// True for an entry at `host`, `path` and `query` that the removal names.
    pub fn covers(&self, host: &str, path: &str, query: Option<&str>) -> bool {
        match *self {
            CacheScope::Route => true,
            CacheScope::Path(p) => path == p,
            CacheScope::Prefix(prefix) => path.starts_with(prefix),
            CacheScope::Uri {
                host: h,
                path: p,
                query: q,
            } => host == h && path == p && query == q,
        }
    }
}
