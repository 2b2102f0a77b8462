//! What a store in another process (Redis, PostgreSQL) does for the limiter: the trait each
//! remote backend implements (`redis.rs`, `postgres.rs`), and that the guard (`guard.rs`: the
//! timeout, the breaker, the deny cache, `on_error`) wraps. The in-process store
//! (`memory.rs`) needs no guard and is called directly.

use std::future::Future;

use prometheus_client::metrics::counter::Counter;

use super::wire::Reply;
use super::{Ask, Decision, LeaseId, LimiterError};

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

/// A store in another process: what the guard needs of Redis and of PostgreSQL.
///
/// A store implements the calls of the wire protocol (`wire.rs`): [`RemoteStore::invoke`] (a
/// decision, on the store's clock or, for a test store, the caller's; or a peek),
/// [`RemoteStore::settle_at`], [`RemoteStore::release`], and its own upkeep; the decisions every
/// caller makes are provided here in terms of them, once for every store.
pub trait RemoteStore: Send + Sync + 'static {
    /// One call doing what `call` says for `asks`, all-or-nothing, in one round trip (or in a
    /// batch): a decision whose concurrency leases are named by the call's lease, that also
    /// leases, per ask, up to `wants[i].want` more requests' worth of units for this instance to
    /// spend itself (`Reply::leased`) and first takes back what an ended lease left unspent
    /// (`wants[i].back`); or a peek. An answer that comes after the caller gave up goes to
    /// `late`, where the store can tell (a batched decision that had left). A store that cannot
    /// lease leases nothing (and is never given anything back).
    fn invoke(
        &self,
        asks: &[Ask<'_>],
        call: super::wire::Call,
        wants: &[super::lease::LeaseAsk],
        late: Option<super::batch::Late>,
    ) -> impl Future<Output = Result<Reply, LimiterError>> + Send;
    /// Settles the reservations of `asks` (`settlements[i]` for `asks[i]`): refunds and
    /// charges (`cost: {reserve, actual}`), at `now_us` on the caller's clock for a test store
    /// (`None`: the store's clock).
    fn settle_at(
        &self,
        asks: &[Ask<'_>],
        settlements: &[super::Settlement],
        now_us: Option<u64>,
    ) -> impl Future<Output = Result<(), LimiterError>> + Send;
    /// True for a store made to decide on the caller's clock (the differential tests'):
    /// [`RemoteStore::decide_leasing_at_for_test`] is refused by any other.
    fn reads_callers_clock(&self) -> bool {
        false
    }

    /// Decides `asks` all-or-nothing in one round trip; concurrency leases are named `lease`.
    /// Returns the verdict and each limit's own decision (for the deny cache).
    fn decide(
        &self,
        asks: &[Ask<'_>],
        lease: LeaseId,
    ) -> impl Future<Output = Result<Reply, LimiterError>> + Send {
        self.invoke(asks, super::wire::Call::Decide { lease }, &[], None)
    }
    /// [`RemoteStore::decide`], also leasing and taking back as `wants` says (see
    /// [`RemoteStore::invoke`]).
    fn decide_leasing(
        &self,
        asks: &[Ask<'_>],
        lease: LeaseId,
        wants: &[super::lease::LeaseAsk],
        late: Option<super::batch::Late>,
    ) -> impl Future<Output = Result<Reply, LimiterError>> + Send {
        self.invoke(asks, super::wire::Call::Decide { lease }, wants, late)
    }
    /// [`RemoteStore::decide_leasing`] at `now_us` on the caller's clock, on a store that
    /// [`RemoteStore::reads_callers_clock`]: for the differential tests.
    fn decide_leasing_at_for_test(
        &self,
        asks: &[Ask<'_>],
        now_us: u64,
        lease: LeaseId,
        wants: &[super::lease::LeaseAsk],
    ) -> impl Future<Output = Result<Reply, LimiterError>> + Send {
        let refused = !self.reads_callers_clock();
        let call = super::wire::Call::DecideAt { lease, now_us };
        async move {
            if refused {
                return Err(LimiterError::protocol(
                    "this store reads its own clock; make it with connect_for_test",
                ));
            }
            self.invoke(asks, call, wants, None).await
        }
    }
    /// What `asks` would decide now, per limit, spending nothing.
    fn peek(
        &self,
        asks: &[Ask<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, LimiterError>> + Send {
        let reply = self.invoke(asks, super::wire::Call::Peek, &[], None);
        async move { Ok(reply.await?.decisions) }
    }
    /// [`RemoteStore::settle_at`] on the store's clock.
    fn settle(
        &self,
        asks: &[Ask<'_>],
        settlements: &[super::Settlement],
    ) -> impl Future<Output = Result<(), LimiterError>> + Send {
        self.settle_at(asks, settlements, None)
    }
    /// This store with batched decisions (`storage.batch`): see [`RemoteStore::set_batching`].
    fn batched(self) -> Self
    where
        Self: Sized,
    {
        self.set_batching(true);
        self
    }
    /// Gives back the concurrency leases named `lease` in `asks`' budgets.
    fn release(
        &self,
        asks: &[Ask<'_>],
        lease: LeaseId,
    ) -> impl Future<Output = Result<(), LimiterError>> + Send;
    /// A decision failed (an error or the timeout): a store that can find its server anew
    /// (Redis behind Sentinel asks the sentinels again) starts doing so. Does nothing by default.
    fn after_failure(&self) {}
    /// Forgets the state of `asks`' budgets: each is fresh (full) at its next decision
    /// (`POST /reset`).
    fn reset(&self, asks: &[Ask<'_>]) -> impl Future<Output = Result<(), LimiterError>> + Send;
    /// Whether the store answers at all: `/readyz`.
    fn ping(&self) -> impl Future<Output = Result<(), LimiterError>> + Send;
    /// The shared control list (bans, overrides, resets: `control.rs`): a version that changes with every write,
    /// and, when it differs from `known`, every entry. `None`: the store keeps no such list.
    fn control_read(
        &self,
        known: Option<String>,
    ) -> impl Future<Output = Result<Option<ControlList>, LimiterError>> + Send {
        let _ = known;
        async { Ok(None) }
    }
    /// Writes entries of the control list, all of them or none: each change an id and its
    /// entry (`None`: removes it). False when the store keeps no such list.
    fn control_write(
        &self,
        changes: &[ControlChange<'_>],
    ) -> impl Future<Output = Result<bool, LimiterError>> + Send {
        let _ = changes;
        async { Ok(false) }
    }
    /// Claims `key` for every instance for `ttl_us` (µs): true when this call claimed it (nobody
    /// held it), false when another claim holds it (an alert sent once across instances:
    /// `alerts.rs`). A store that keeps no claims grants every one.
    fn claim(
        &self,
        key: &str,
        ttl_us: u64,
    ) -> impl Future<Output = Result<bool, LimiterError>> + Send {
        let _ = (key, ttl_us);
        async { Ok(true) }
    }
    /// Gives up the claim on `key`, whoever holds it.
    fn unclaim(&self, key: &str) -> impl Future<Output = Result<(), LimiterError>> + Send {
        let _ = key;
        async { Ok(()) }
    }
    /// Gets ready to decide (connects, loads scripts or a schema) before the first request, which
    /// would otherwise pay for that within its timeout. Pings by default.
    fn prepare(&self) -> impl Future<Output = Result<(), LimiterError>> + Send {
        self.ping()
    }
    /// Turns batching (`storage.batch`) on or off for the decisions that follow; a store that
    /// does not batch ignores it.
    fn set_batching(&self, _on: bool) {}

    /// Counts its round trips in `counter` itself (a store that batches); false when it does
    /// not, and the guard counts one per decision.
    fn count_calls(&self, counter: Counter) -> bool {
        let _ = counter;
        false
    }
}
