//! The stores of budgets across regions (`scope: global`; the policy is `crate::global`'s): the
//! **global store**, where each budget is a token bucket on the store's own clock that regions
//! take slices of ([`GlobalStore`]), and a **region's store**, which holds the slices its
//! instances spend ([`SliceStore`]). Each is Redis (`redis/slices.rs`: Lua scripts) or
//! PostgreSQL (`postgres/slices.rs`: the same operations as PL/pgSQL functions), chosen by the
//! URL's scheme ([`global_store`], [`slice_store`]), and held as a `dyn` store. A call is one round trip; what to ask
//! for, when, and what a failure means are the caller's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::LimiterError;
use super::postgres::{PgGlobal, PgSlices};
use super::redis::{RedisGlobal, RedisSlices};
use super::store::StoreCall;

/// One `take` from the global store (see [`GlobalStore::take`]).
#[derive(Debug, Clone)]
pub struct Take {
    /// The budget's key in the global store.
    pub key: String,
    /// The bucket's capacity, and µs per unit of refill.
    pub capacity: u32,
    pub interval_us: u64,
    /// Units for the request that asks (0 for the keeper): all of them or none.
    pub need: u64,
    /// Units the region's slice would like beyond `need`.
    pub want: u64,
    /// The asking region, the slice's life, and what it holds now (recorded beside the bucket,
    /// so that the units of a slice that lapses unrenewed are counted as lost).
    pub region: String,
    pub ttl_ms: u64,
    pub held: u64,
    /// A windowed budget's window (`[start, end)` in µs since the epoch, as the asker reckons
    /// the global store's clock): the store grants only while its own clock is inside it.
    /// `None` for a token bucket.
    pub window: Option<(u64, u64)>,
}

/// What a `take` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Units granted (0, or `need` and up to `want` more).
    pub granted: u64,
    /// Units the budget has left after the grant.
    pub left: u64,
    /// Units other regions' slices held when they lapsed, found by this call.
    pub lapsed: u64,
    /// The global store's clock when it decided, in µs since the epoch.
    pub now_us: u64,
    /// The store's clock was not inside [`Take::window`]: nothing granted, and the asker
    /// reckons the window again from `now_us`.
    pub outside: bool,
}

/// One `give` to the global store (see [`GlobalStore::give`]).
#[derive(Debug, Clone)]
pub struct Give {
    pub key: String,
    pub capacity: u32,
    pub interval_us: u64,
    pub units: u64,
    pub region: String,
    /// A windowed budget's window: units are refunded only while the store's clock is inside
    /// it (a unit belongs to the window it was granted in).
    pub window: Option<(u64, u64)>,
}

/// A boxed call that owns what it needs: it can finish after its caller stopped waiting.
pub type OwnedCall<T> = Pin<Box<dyn Future<Output = Result<T, LimiterError>> + Send + 'static>>;

/// The global store: a token bucket per budget on the store's clock, whose grants to regions are
/// spends and whose returns are refunds, so that what it has left plus every slice granted never
/// exceeds the budget (plus its refill).
pub trait GlobalStore: Send + Sync + 'static {
    /// Connects, and loads the scripts or installs the functions.
    fn prepare(&self) -> StoreCall<'_, ()>;
    /// Grants `need` units and up to `want` more (at most half of what is left beyond
    /// `need`), or nothing when `need` cannot be met; records the region's slice and counts the
    /// slices that lapsed.
    fn take(&self, take: Take) -> OwnedCall<Taken>;
    /// Refunds `units` (up to the capacity) and clears the region's slice: what is left.
    fn give(&self, give: Give) -> OwnedCall<u64>;
}

/// What [`SliceStore::add`] puts in a slice: units granted, demand seen, and the slice's new life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub units: u64,
    pub demand: u64,
    /// The slice's life from now; 0 keeps the end it has (units given back to it), and then
    /// a slice that is gone stays gone (its units lapsed with it).
    pub ttl_ms: u64,
}

/// A slice as [`SliceStore::read`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRead {
    pub units: u64,
    /// Units asked of it since the last read.
    pub demand: u64,
    /// Reads in a row that found no demand.
    pub idle: u64,
}

/// A region's store of slices. A slice has `units`, `demand` and `idle`, and an end after which
/// it is as if it were not there.
pub trait SliceStore: Send + Sync + 'static {
    /// Connects, and loads the scripts or installs the functions.
    fn prepare(&self) -> StoreCall<'_, ()>;
    /// Pays `cost` from the slice if it holds that much, counting the demand either way:
    /// (paid, units left).
    fn spend<'a>(&'a self, key: &'a str, cost: u64) -> StoreCall<'a, (bool, u64)>;
    /// Adds `grant` to the slice and renews it: what it holds.
    fn add<'a>(&'a self, key: &'a str, grant: Grant) -> StoreCall<'a, u64>;
    /// The slice, its demand starting again from 0.
    fn read<'a>(&'a self, key: &'a str) -> StoreCall<'a, SliceRead>;
    /// Takes every unit out of the slice (to give them back): how many.
    fn drain<'a>(&'a self, key: &'a str) -> StoreCall<'a, u64>;
    /// What the slice holds, changing nothing.
    fn held<'a>(&'a self, key: &'a str) -> StoreCall<'a, u64>;
    /// Claims `key` for `ms` for `holder` (one instance of a region renews a slice each pass):
    /// true when this call has it.
    fn claim<'a>(&'a self, key: &'a str, holder: &'a str, ms: u64) -> StoreCall<'a, bool>;
}

/// True for the URLs PostgreSQL serves.
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The global store a URL names: `redis://`/`rediss://`, or `postgres://`/`postgresql://`.
/// Connects lazily (the store need not be up); a call waits up to `timeout` to connect, and its
/// answer up to 10 s (a late answer is still read). Fails only on a malformed URL.
pub fn global_store(url: &str, timeout: Duration) -> Result<Box<dyn GlobalStore>, LimiterError> {
    Ok(match is_postgres(url) {
        true => Box::new(PgGlobal::connect(url, timeout)?),
        false => Box::new(RedisGlobal::connect(url, timeout)?),
    })
}

/// The region's store a URL names. Connects lazily; every call waits at most `timeout`. Fails
/// only on a malformed URL.
pub fn slice_store(url: &str, timeout: Duration) -> Result<Arc<dyn SliceStore>, LimiterError> {
    Ok(match is_postgres(url) {
        true => Arc::new(PgSlices::connect(url, timeout)?),
        false => Arc::new(RedisSlices::connect(url, timeout)?),
    })
}
