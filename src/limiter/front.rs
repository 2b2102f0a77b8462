//! The front of the limiter: [`Limiter`], what the proxy asks (a store, and what to do when it
//! fails), and [`LimiterSpec`], the one way to build one.

use std::sync::Arc;
use std::time::Duration;

use super::owned_key::{OwnedKey, borrowed};
use super::store::{
    CacheScope, CacheVariant, CacheWrite, ControlChange, ControlList, RoomBounds, RoomEntered,
    Store,
};
use super::{
    Admission, AlgorithmKind, AnchoredClock, Ask, Decision, LeaseId, LimiterError, MemoryStore,
    OnError, Settlement, Source, guard, next_lease, postgres, redis,
};

/// Where budgets live.
#[derive(Debug, Clone)]
pub enum StoreSpec {
    /// In this process.
    Memory,
    /// Redis: one server, a cluster, or a master behind Sentinel.
    Redis(redis::RedisTarget),
    /// PostgreSQL, at this URL.
    Postgres(String),
}

/// Everything a [`Limiter`] is built from: the `storage:` section in the limiter's own terms.
#[derive(Debug, Clone)]
pub struct LimiterSpec {
    pub store: StoreSpec,
    /// How long a decision waits for a remote store.
    pub timeout: Duration,
    /// Decisions waiting for the same store leave together.
    pub batch: bool,
    /// Leases of shared budgets, lasting at most this long (`None`: off).
    pub lease_ttl: Option<Duration>,
    /// What every store key starts with.
    pub key_prefix: String,
    /// The most budgets the in-process store keeps (the whole store, or the `local` fallback).
    pub max_keys: usize,
}

impl LimiterSpec {
    /// The limiter: the store connected (lazily: a remote server need not be up yet), behind
    /// its guard for a remote store. `Err` for an address that cannot be used at all.
    pub fn build(&self) -> Result<Limiter, LimiterError> {
        let local = MemoryStore::new(AnchoredClock::default(), self.max_keys);
        let store: Box<dyn Store> = match &self.store {
            StoreSpec::Memory => return Ok(Limiter::Memory(Arc::new(local))),
            StoreSpec::Redis(target) => Box::new(redis::RedisStore::connect(
                target,
                &self.key_prefix,
                self.timeout,
            )?),
            StoreSpec::Postgres(url) => Box::new(postgres::PostgresStore::connect(
                url,
                &self.key_prefix,
                self.timeout,
            )?),
        };
        store.set_batching(self.batch);
        let guarded = guard::Guarded::new(store, self.timeout, Arc::new(local));
        let guarded = Arc::new(match self.lease_ttl {
            Some(ttl) => guarded.with_leases(ttl),
            None => guarded,
        });
        guard::spawn_settle_retries(&guarded);
        Ok(Limiter::Remote(guarded))
    }
}

/// What the proxy asks: a store, and what to do when it fails. Two kinds, because only one
/// needs a guard: every remote store is one `dyn Store` behind [`guard::Guarded`].
#[derive(Clone)]
pub enum Limiter {
    /// State in this process: never fails, decided with no future to await.
    Memory(Arc<MemoryStore>),
    /// State in Redis or PostgreSQL, behind the timeout, breaker and deny cache of
    /// [`guard::Guarded`].
    Remote(Arc<guard::Guarded>),
}

impl Limiter {
    /// Applies a reloaded `storage` section to a remote store: the decision timeout, batching,
    /// and leases (`None`: off). The memory store has none of these.
    pub fn reconfigure(&self, timeout: Duration, batch: bool, lease_ttl: Option<Duration>) {
        if let Limiter::Remote(guarded) = self {
            guarded.reconfigure(timeout, batch, lease_ttl);
        }
    }

    /// The guard, for a remote store.
    fn guarded(&self) -> Option<&Arc<guard::Guarded>> {
        match self {
            Limiter::Memory(_) => None,
            Limiter::Remote(guarded) => Some(guarded),
        }
    }

    /// Decides one request against all `asks`, all-or-nothing. `Err` means the store failed and
    /// `on_error` is `deny`.
    pub async fn decide(
        &self,
        asks: &[Ask<'_>],
        on_error: OnError,
    ) -> Result<Admission, LimiterError> {
        let lease = next_lease();
        match self {
            Limiter::Memory(store) => Ok(match store.decide_leased(asks, lease) {
                Some(verdict) => Admission::Limited {
                    verdict,
                    source: Source::Store,
                    lease,
                    round_trip: false,
                },
                None => Admission::Unlimited,
            }),
            // The round trip's future (a store call, its timeout) is boxed: a decision made
            // here (a lease's units, the deny cache) and the memory store's carry none of its
            // size, which every future above this one would otherwise copy at each move.
            Limiter::Remote(guarded) => match guarded.decide_here(asks, lease, on_error) {
                guard::Here::Decided(decided) => decided,
                guard::Here::AskTheStore(trip) => {
                    Box::pin(guarded.decide_remotely(asks, lease, on_error, trip)).await
                }
            },
        }
    }

    /// Gives back the concurrency leases `lease` holds in `asks` (those of other algorithms are
    /// skipped), in the store that granted them. Never fails: a lease that cannot be released
    /// runs out on its own.
    pub async fn release(&self, asks: &[Ask<'_>], lease: LeaseId, source: Source) {
        match self {
            Limiter::Memory(store) => store.release(asks, lease),
            Limiter::Remote(guarded) => guarded.release(asks, lease, source).await,
        }
    }

    /// Extends the concurrency leases `lease` holds in `asks` to a whole lease from now, in the
    /// store that granted them: a connection holding its slot for its life (a WebSocket's
    /// `max_connections`) renews it well before it ends. Never fails.
    pub async fn renew(&self, asks: &[Ask<'_>], lease: LeaseId, source: Source) {
        match self {
            Limiter::Memory(store) => store.renew(asks, lease),
            Limiter::Remote(guarded) => guarded.renew(asks, lease, source).await,
        }
    }

    /// What `asks` would decide now, per limit (in the order asked), spending nothing.
    pub async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        match self {
            Limiter::Memory(store) => Ok(store.peek(asks)),
            Limiter::Remote(guarded) => guarded.peek(asks).await,
        }
    }

    /// The shared control list (`control.rs`) the store keeps, if it keeps one: Redis and
    /// PostgreSQL do.
    pub async fn control_read(
        &self,
        known: Option<String>,
    ) -> Result<Option<ControlList>, LimiterError> {
        match self.guarded() {
            None => Ok(None),
            Some(guarded) => guarded.control_read(known).await,
        }
    }

    /// Writes entries of the store's shared control list, all or none (each an id and its
    /// entry, `None`: it goes); false when the store keeps none (the memory store).
    pub async fn control_write(&self, changes: &[ControlChange<'_>]) -> Result<bool, LimiterError> {
        match self.guarded() {
            None => Ok(false),
            Some(guarded) => guarded.control_write(changes).await,
        }
    }

    /// Claims `key` for every instance sharing the store, for `ttl_us`: true when this call
    /// claimed it. The memory store is one instance's: every claim is granted.
    pub async fn claim(&self, key: &str, ttl_us: u64) -> Result<bool, LimiterError> {
        match self.guarded() {
            None => Ok(true),
            Some(guarded) => guarded.claim(key, ttl_us).await,
        }
    }

    /// [`Limiter::claim`] on a request's path (`cache.shared`'s fill claim), within twice the
    /// store's decision timeout.
    pub async fn cache_claim(&self, key: &str, ttl_us: u64) -> Result<bool, LimiterError> {
        match self.guarded() {
            None => Ok(true),
            Some(guarded) => guarded.cache_claim(key, ttl_us).await,
        }
    }

    /// A waiting room's answer to `client`, from the store every instance shares; `None` on
    /// the memory store (the room keeps its line itself).
    pub async fn room_enter(
        &self,
        room: &str,
        client: &str,
        bounds: RoomBounds,
    ) -> Result<Option<RoomEntered>, LimiterError> {
        match self.guarded() {
            None => Ok(None),
            Some(guarded) => guarded.room_enter(room, client, bounds).await,
        }
    }

    /// True when the store keeps what instances share (Redis, PostgreSQL), false for the
    /// memory store.
    pub fn is_shared(&self) -> bool {
        self.guarded().is_some()
    }

    /// The bytes kept under `key` for every instance sharing the store; none on the memory
    /// store.
    pub async fn blob_read(&self, key: &str) -> Result<Option<Vec<u8>>, LimiterError> {
        match self.guarded() {
            None => Ok(None),
            Some(guarded) => guarded.blob_read(key).await,
        }
    }

    /// Keeps `bytes` under `key` for every instance sharing the store (nothing on the memory
    /// store).
    pub async fn blob_write(&self, key: &str, bytes: &[u8]) -> Result<(), LimiterError> {
        match self.guarded() {
            None => Ok(()),
            Some(guarded) => guarded.blob_write(key, bytes).await,
        }
    }

    /// Forgets what is kept under `key`.
    pub async fn blob_remove(&self, key: &str) -> Result<(), LimiterError> {
        match self.guarded() {
            None => Ok(()),
            Some(guarded) => guarded.blob_remove(key).await,
        }
    }

    /// Gives up the claim on `key`.
    pub async fn unclaim(&self, key: &str) -> Result<(), LimiterError> {
        match self.guarded() {
            None => Ok(()),
            Some(guarded) => guarded.unclaim(key).await,
        }
    }

    /// `cache.shared`: the variants of `route`'s cache entry `key`; none on the memory store.
    pub async fn cache_read(
        &self,
        route: &str,
        key: &str,
    ) -> Result<Vec<CacheVariant>, LimiterError> {
        match self.guarded() {
            None => Ok(Vec::new()),
            Some(guarded) => guarded.cache_read(route, key).await,
        }
    }

    /// Stores a shared cache entry's variant (nothing on the memory store).
    pub async fn cache_write(&self, write: CacheWrite<'_>) -> Result<(), LimiterError> {
        match self.guarded() {
            None => Ok(()),
            Some(guarded) => guarded.cache_write(write).await,
        }
    }

    /// Removes `route`'s shared cache entries that `scope` names.
    pub async fn cache_remove(
        &self,
        route: &str,
        scope: CacheScope<'_>,
    ) -> Result<(), LimiterError> {
        match self.guarded() {
            None => Ok(()),
            Some(guarded) => guarded.cache_remove(route, scope).await,
        }
    }

    /// Resets `asks`' budgets: full again at their next decision, in the store and in what this
    /// instance keeps of them (`POST /reset`).
    pub async fn reset(&self, asks: &[Ask<'_>]) -> Result<(), LimiterError> {
        match self {
            Limiter::Memory(store) => Store::reset(store.as_ref(), asks).await,
            Limiter::Remote(guarded) => guarded.reset(asks).await,
        }
    }

    /// Forgets what this instance keeps of the budgets `keys` (cached denials, leases): another
    /// instance reset them in the shared store. The memory store is not shared: nothing to do.
    pub fn forget(&self, keys: &[super::BudgetKey<'_>]) {
        if let Some(guarded) = self.guarded() {
            guarded.forget(keys);
        }
    }

    /// Readies a remote store for its first decision (connects, loads its scripts or schema),
    /// waiting at most `within`: true when it is ready. The memory store always is.
    pub async fn prepare(&self, within: Duration) -> bool {
        match self.guarded() {
            None => true,
            Some(guarded) => guarded.prepare(within).await,
        }
    }

    /// True when the store answers: `/readyz`.
    pub async fn is_ready(&self) -> bool {
        match self.guarded() {
            None => true,
            Some(guarded) => guarded.is_ready().await,
        }
    }

    /// The in-process store (the fallback, for a remote store).
    pub fn memory(&self) -> &Arc<MemoryStore> {
        match self {
            Limiter::Memory(store) => store,
            Limiter::Remote(guarded) => guarded.local(),
        }
    }

    /// The store's name for metric labels: `memory`, `redis` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Limiter::Memory(store) => store.name(),
            Limiter::Remote(guarded) => guarded.store_name(),
        }
    }

    /// The guard's counters, when there is a remote store.
    pub fn guard_stats(&self) -> Option<&guard::GuardStats> {
        self.guarded().map(|guarded| guarded.stats())
    }

    /// The breaker's state, when there is a remote store.
    pub fn breaker_state(&self) -> Option<guard::BreakerState> {
        self.guarded().map(|guarded| guarded.breaker_now())
    }
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
        let (keys, _, source, lease) = admitted(asks, admission, |a| {
            a.limit.algorithm().kind() == AlgorithmKind::Concurrency
        })?;
        Some(HeldLeases {
            limiter: self.clone(),
            keys,
            lease,
            source,
        })
    }
}

/// The owned keys of the asks `which` picks, when a store's verdict `admission` allowed and
/// there is one; with the verdict, where it was decided, and the request's lease token.
fn admitted(
    asks: &[Ask<'_>],
    admission: &Admission,
    which: impl Fn(&Ask<'_>) -> bool,
) -> Option<(Vec<OwnedKey>, super::Verdict, Source, LeaseId)> {
    let Admission::Limited {
        verdict,
        source,
        lease,
        ..
    } = *admission
    else {
        return None;
    };
    if !verdict.allowed() {
        return None;
    }
    let keys: Vec<OwnedKey> = asks.iter().filter(|a| which(a)).map(OwnedKey::of).collect();
    (!keys.is_empty()).then_some((keys, verdict, source, lease))
}

/// What one admitted request reserved of its settled limits (`cost: {reserve, actual}`), held
/// out of their budgets until [`Reservation::settle`] says what it really cost. Dropped
/// unsettled, it stays spent: a response whose cost is unknown costs its reserve.
pub struct Reservation {
    limiter: Limiter,
    keys: Vec<OwnedKey>,
    /// When the store decided (its clock): a refund counts only in the window it was spent in.
    at_us: u64,
    source: Source,
}

impl Limiter {
    /// The reservation `admission` made in the settled limits among `asks` (each ask's limit
    /// costing its reserve), if it allowed. Nothing is reserved when no store decided (the
    /// store failed and `on_error` let the request through).
    pub fn reserve(&self, asks: &[Ask<'_>], admission: &Admission) -> Option<Reservation> {
        self.reserve_where(asks, admission, |a| a.limit.is_settled())
    }

    /// The units `admission` spent in the asks among `asks` that `which` picks, held as a
    /// reservation at their costs (settled at 0, they go back), if it allowed.
    pub fn reserve_where(
        &self,
        asks: &[Ask<'_>],
        admission: &Admission,
        which: impl Fn(&Ask<'_>) -> bool,
    ) -> Option<Reservation> {
        let (keys, verdict, source, _) = admitted(asks, admission, which)?;
        Some(Reservation {
            limiter: self.clone(),
            keys,
            at_us: verdict.now_us,
            source,
        })
    }

    /// Gives `ask`'s cost back to its budget (the rate-limit service's `is_negative_hits`): a
    /// refund, as a settlement of a reserve that cost nothing, dated now by this process' clock
    /// (a refund counts in the window it is dated in). A store that fails has it tried again.
    pub async fn give_back(&self, ask: &Ask<'_>) {
        let keys = vec![OwnedKey::of(ask)];
        let settlements = vec![Settlement::of(
            u64::from(ask.limit.cost()),
            0,
            super::wall_clock_us(),
        )];
        self.settle(keys, settlements, Source::Store).await;
    }

    /// Settles reservations of `keys` in the store that made them (`source`); a remote store
    /// that fails has them tried again later (see `guard/settle_retry.rs`).
    async fn settle(&self, keys: Vec<OwnedKey>, settlements: Vec<Settlement>, source: Source) {
        let Limiter::Remote(guarded) = self else {
            return self.memory().settle(&borrowed(&keys), &settlements);
        };
        if let Err(e) = guarded.settle(&borrowed(&keys), &settlements, source).await {
            tracing::warn!(error = %e, "settling reserved costs failed: it will be tried again");
            guarded.retry_settlement(keys, settlements, source);
        }
    }
}

impl Reservation {
    /// The units reserved in each settled limit, in the order they were asked.
    pub fn reserved(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys.iter().map(|k| u64::from(k.limit.cost()))
    }

    /// How many settled limits it holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when it holds none (never, once made).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Settles each limit at `actual[i]` units (refunding or charging the difference from its
    /// reserve): at once on the memory store, in a spawned task on a remote one (the response
    /// has ended; nobody waits for it).
    pub fn settle(self, actual: &[u64]) {
        let settlements: Vec<Settlement> = self
            .reserved()
            .zip(actual)
            .map(|(reserved, &actual)| Settlement::of(reserved, actual, self.at_us))
            .collect();
        if settlements.iter().all(Settlement::is_even) {
            return;
        }
        match &self.limiter {
            Limiter::Memory(store) => store.settle(&borrowed(&self.keys), &settlements),
            Limiter::Remote(_) => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return; // no runtime (process exit): the reserves stand
                };
                let Reservation {
                    limiter,
                    keys,
                    source,
                    ..
                } = self;
                runtime.spawn(async move {
                    limiter.settle(keys, settlements, source).await;
                });
            }
        }
    }
}

impl HeldLeases {
    /// Extends these leases to a whole lease from now (a WebSocket holds its slot for its life).
    pub async fn renew(&self) {
        self.limiter
            .renew(&borrowed(&self.keys), self.lease, self.source)
            .await;
    }
}

impl Drop for HeldLeases {
    fn drop(&mut self) {
        match &self.limiter {
            Limiter::Memory(store) => store.release(&borrowed(&self.keys), self.lease),
            Limiter::Remote(_) => {
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
