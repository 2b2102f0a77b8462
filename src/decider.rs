//! The decider: one request's rate-limit decision, knowing no transport.
//!
//! Every front end that spends a budget calls [`Decider::decide`] with a [`Question`], so none
//! can decide differently from another:
//!
//! - the proxy ([`crate::proxy`]), for a live HTTP or gRPC request;
//! - `floodgate replay` ([`crate::replay`]), for an access-log line, on its own memory store at
//!   the log's clock (the memory store answers at once: [`Decider::decide_now`]);
//! - the rate-limit service for other proxies, whose requests are descriptors: it finds their
//!   limits in its rules and asks [`Question::Limits`], which names no route and no client.
//!
//! Those that only look (the admin `/budgets` endpoint, the usage endpoint) ask
//! [`Decider::peek_route`] what a request would be told, spending nothing.
//!
//! For a request on a route ([`Question::Request`]), a caller first resolves whose it is
//! ([`Policy::resolve`], on the decider's policy), then hands the decider the route, that
//! [`Whose`], and the request's [`Facts`]: the values its composite keys read and the units its
//! settled limits reserve, which only the caller can read (headers and a JSON body; a log line's
//! digests and costs). In order, the decider:
//!
//! 1. answers `unlimited` for a route without limits and `exempt` for an exempt client, and
//!    refuses a banned identity (`control.rs`);
//! 2. builds each limit's ask (the budget it spends, at the cost it reserves), enforced limits
//!    (an override's in their place, for an identity that has one) and shadow limits alike;
//! 3. asks the store for the enforced limits, all-or-nothing (with the store's batching, leases,
//!    deny cache, breaker and `on_error`, all inside [`Limiter::decide`]), then for the shadow
//!    limits, which never refuse;
//! 4. holds what an admitted request keeps until it ends (concurrency leases, reservations of
//!    settled costs), and reads the answers through the one limit phase ([`LimitPhase`]): the
//!    refusal if any, the label, the limit whose figures the headers carry;
//! 5. after the store's answer, counts a denial towards a limit's penalty box, and tells the
//!    quota alerts (`alerts.rs`) how spent an admitted request left its headline budget.
//!
//! One job a file: this one holds the question, the answer ([`Decided`]) and the entry;
//! `request.rs` steps 1, 2 and 5 for a request on a route; `endpoints.rs` the search over
//! endpoints for limits `per: endpoint`; `asks.rs` steps 3 and 4 (the store's decision and what
//! an admitted request keeps); `global.rs` the fold of `scope: global` limits into it;
//! `penalty.rs` the penalty box; `peek.rs` what a request would be told, spending nothing.

use std::time::Instant;

use crate::config::{Budget, Per, RouteConfig, RouteLimit};
use crate::identity::ip_octets;
use crate::limiter::{
    Admission, Ask, HeldLeases, KeyKind, Limit, Limiter, MAX_LIMITS, OnError, Reservation, Ruling,
};
use crate::metrics::{DecisionLabel, Metrics};
use crate::policy::{Asks, LimitPhase, LimitRef, Policy, Refused, RequestKeys, Whose};

/// What only the caller can read of a request: the values of its limits' composite keys, and
/// the units its settled limits (`cost: {reserve, actual}`) reserve.
pub trait Facts {
    /// The composite keys (`per:` with request parts) of `budget`'s limits for a client known
    /// by `identity` and `ip` (see [`RequestKeys`]).
    fn keys(&mut self, budget: &Budget, identity: (KeyKind, &[u8]), ip: &[u8]) -> RequestKeys;
    /// The units `limit` (a settled one) reserves for this request.
    fn reserve(&mut self, limit: &RouteLimit) -> u32;
}

/// The facts of a request whose route reads none (a route without limits: only bans apply).
pub struct NoFacts;

impl Facts for NoFacts {
    fn keys(&mut self, _: &Budget, _: (KeyKind, &[u8]), _: &[u8]) -> RequestKeys {
        RequestKeys::default()
    }

    fn reserve(&mut self, limit: &RouteLimit) -> u32 {
        limit.limit.cost()
    }
}

/// Where a request may be sent, for its route's limits `per: endpoint`: the pool's endpoints
/// in the balancer's order, offered one at a time ([`Question::Request`]'s `endpoints`).
pub trait Endpoints {
    /// The next endpoint's name (`address:port`, its budget's key); `None` when none is left.
    /// The last one offered before an admission is the one the request is sent to.
    fn next(&mut self) -> Option<&[u8]>;
}

/// One request as the decider asks for it: whose it is (the identity's and the address's
/// bytes), the budgets it spends (enforced, shadow) and their composite keys.
struct Request<'a, 'w> {
    whose: &'a Whose<'w>,
    id: &'a [u8],
    ip: &'a [u8],
    budgets: [&'a Budget; 2],
    keys: [RequestKeys; 2],
}

/// The enforced limits of a route, or its shadow ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Enforced,
    Shadow,
}

/// What one reservation of settled costs holds: the reservation, its side, and per settled
/// limit (in the order the reservation holds them) the limit's position in its budget.
pub struct Reserved {
    pub reservation: Reservation,
    pub side: Side,
    pub positions: Vec<usize>,
}

/// What was decided for one request.
pub struct Decided {
    /// Why it is refused, if it is; `None`: it goes on.
    pub refused: Option<Refused>,
    /// The label of a request that goes on (`allowed`, `shadow_denied`, `store_error`,
    /// `unlimited`, `exempt`); a refusal has its own.
    pub label: DecisionLabel,
    /// The verdict whose figures the answer carries, and its limit.
    pub headline: Option<(Ruling, LimitRef)>,
    /// Concurrency leases held until the request ends (dropping them gives them back).
    pub leases: Vec<HeldLeases>,
    /// Reservations of settled costs, to settle once the cost is known (dropped unsettled,
    /// they stay spent).
    pub reservations: Vec<Reserved>,
    /// Which limits denied (bit `p` for the limit at position `p` of its budget), enforced and
    /// shadow.
    pub denied: [u16; 2],
    /// What a rate-limit service reports per descriptor, kept only by a decider asked to
    /// ([`Decider::report`]): boxed, so that a proxy's decision, which reports one limit's
    /// figures, does not carry (and move, future to future) 264 bytes and more.
    pub report: Option<Box<Report>>,
    /// The store round trips the decision waited on (not the answers a lease, the deny cache
    /// or the in-process store gave): when each began and how long it took, for traces.
    pub store_calls: Vec<(Instant, std::time::Duration)>,
    /// What an admitted request spent that can be given back, kept only by a decider asked to
    /// ([`Decider::undoable`]).
    pub spent: Option<Box<Spent>>,
}

/// What a decision reports of every limit asked, beyond the headline's figures.
#[derive(Default)]
pub struct Report {
    /// Where each limit asked stands after the decision (by its position in its budget),
    /// enforced and shadow.
    pub standings: [crate::limiter::Standings; 2],
    /// What each checked ask of a [`Question::Limits`] found, in the order asked (empty when
    /// none was checked, or the store could not be asked).
    pub checks: Vec<crate::limiter::Decision>,
    /// True when the spent asks were decided: false when a check refused first, and nothing
    /// was spent.
    pub spent: bool,
}

/// The units an admitted request spent, kept so that they can all be given back
/// ([`Spent::give_back`]) if it is abandoned before it is forwarded; dropped, they stay spent.
/// Held: the units of every limit a refund can reach (token buckets, fixed windows, sliding
/// window counters, quotas, enforced and shadow; a `scope: global` limit's go back to the
/// region's slice). Concurrency leases go back when their [`HeldLeases`] are dropped, settled
/// costs through their own reservation; a sliding window log or a leaky bucket keeps a unit once
/// spent, as `refund_on` cannot have them either.
#[derive(Default)]
pub struct Spent {
    reservations: Vec<Reservation>,
    global: Vec<crate::global::Refund>,
}

impl Spent {
    /// Gives every unit held back to its budget (at once on the memory store, in a spawned task
    /// on a remote one).
    pub fn give_back(self) {
        for reservation in self.reservations {
            let none = vec![0; reservation.len()];
            reservation.settle(&none);
        }
        for refund in self.global {
            refund.give();
        }
    }
}

impl Decided {
    fn of(label: DecisionLabel) -> Decided {
        Decided {
            refused: None,
            label,
            headline: None,
            leases: Vec::new(),
            reservations: Vec::new(),
            denied: [0; 2],
            report: None,
            store_calls: Vec::new(),
            spent: None,
        }
    }

    /// A banned identity's refusal, `wait_us` before the ban ends.
    fn banned(wait_us: u64) -> Decided {
        let mut decided = Decided::of(DecisionLabel::Banned);
        decided.refused = Some(Refused::Banned(wait_us));
        decided
    }

    /// True when the limit at `position` of `side`'s budget denied.
    pub fn denied_by(&self, side: Side, position: usize) -> bool {
        position < MAX_LIMITS && self.denied[side as usize] & (1 << position) != 0
    }
}

/// Whom a peek ([`Decider::peek_route`]) is about: what the caller knows of the client.
pub struct Peek<'a> {
    pub tier: &'a str,
    /// The identity's kind and bytes, if the caller names one.
    pub identity: Option<(KeyKind, &'a [u8])>,
    /// The address's octets (`ip_octets`), if known.
    pub ip: Option<&'a [u8]>,
    /// What the composite keys read.
    pub view: &'a crate::config::RequestView<'a>,
}

/// One limit as a peek sees it.
#[derive(Debug, Clone)]
pub struct Peeked {
    pub algorithm: &'static str,
    pub per: &'static str,
    /// Its units (a bucket's capacity, a window's limit).
    pub limit: u64,
    pub shadow: bool,
    /// `scope: global`.
    pub global: bool,
    /// What is left now (a check that allowed gives back what it counted) and µs to the
    /// reset; `None` when the caller does not name the limit's client.
    pub figures: Option<(u64, u64)>,
    /// A global limit's slice held by this region: the region, its units.
    pub slice: Option<(String, u64)>,
}

/// One budget's asks for one request, each at the cost it reserves.
pub struct BudgetAsks<'a> {
    pub asks: &'a [Ask<'a>],
    /// Each ask's limit's position in its budget.
    pub positions: &'a [usize],
}

/// The decider: the snapshot's decision rules and the store they are decided on.
#[derive(Clone, Copy)]
pub struct Decider<'s> {
    pub policy: Policy<'s>,
    pub limiter: &'s Limiter,
    pub on_error: OnError,
    /// Where store latency is observed (`floodgate_limiter_duration_seconds`); replay has none.
    pub metrics: Option<&'s Metrics>,
    /// The bans and overrides in force (`control.rs`); replay has none.
    pub control: Option<&'s crate::control::Control>,
    /// Quota alerts (`alerts.rs`), told of every admission; replay has none.
    pub alerts: Option<&'s crate::alerts::Alerter>,
    /// Budgets shared across regions (`global.rs`): `scope: global` limits are spent there.
    /// Without it (replay), they are decided in the store like any other.
    pub global: Option<&'s crate::global::Global>,
    /// Keep where every limit asked stands and what each check found ([`Decided::report`]):
    /// the rate-limit service reports it per descriptor; the proxy and replay do not.
    pub report: bool,
    /// Keep what an admitted request spent, to give back should its client leave before it is
    /// forwarded ([`Decided::spent`]): the proxy asks for it where the front end can tell (an
    /// HTTP/3 stream's reset), so that no other request pays for the bookkeeping.
    pub undoable: bool,
    /// Count a refusal toward its limit's penalty box (`penalty:`); off for a refusal that may
    /// be held for the limit (`wait:`), which counts only if it is refused in the end.
    pub penalizes: bool,
}

/// What a decision is about: a client's request on a route, or limits a caller found itself.
pub enum Question<'q, 'w, F: Facts = NoFacts> {
    /// A client's request on a route (the proxy, `floodgate replay`): every step applies.
    Request {
        route: &'q RouteConfig,
        whose: &'q Whose<'w>,
        /// What only the caller reads: the composite keys' values, settled limits' reserves.
        facts: &'q mut F,
        /// Where it may be sent, for the route's limits `per: endpoint`: they spend the budget
        /// of the first endpoint offered that has one left (`None`: they are left out).
        endpoints: Option<&'q mut (dyn Endpoints + Send)>,
    },
    /// Limits the caller found itself, each ask at its cost, side and take: the rate-limit
    /// service's descriptors, whose values the calling proxy chose. They name no route and no
    /// client, so only the store's steps apply (3 and 4 above): there is no one to exempt, ban,
    /// override, penalize or alert about (docs/service.md, "What the service does not apply").
    /// `decider/limits.rs` says how each take is taken.
    Limits { asks: &'q [Taken<'q>] },
}

/// How an ask of [`Question::Limits`] is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Spent, all-or-nothing with every other spent ask.
    Spend,
    /// Checked, spending nothing (the service's `hits_addend: 0`): an enforced one with no room
    /// for one more refuses the request, and then nothing is spent.
    Check,
    /// Its units given back (the service's `is_negative_hits`), whatever is decided.
    GiveBack,
}

/// One ask of [`Question::Limits`]: the ask, its side and how it is taken.
#[derive(Clone, Copy)]
pub struct Taken<'a> {
    pub ask: Ask<'a>,
    pub side: Side,
    pub take: Take,
}

impl<'q> Question<'q, 'static, NoFacts> {
    /// [`Question::Limits`], typed (it reads no facts).
    pub fn limits(asks: &'q [Taken<'q>]) -> Self {
        Question::Limits { asks }
    }
}

impl<'s> Decider<'s> {
    /// Decides `question`: the one entry every front end that spends a budget calls.
    pub async fn decide<F: Facts>(&self, question: Question<'_, '_, F>) -> Decided {
        match question {
            Question::Request {
                route,
                whose,
                facts,
                endpoints,
            } => self.decide_request(route, whose, facts, endpoints).await,
            Question::Limits { asks } => self.decide_limits(asks).await,
        }
    }

    /// [`Decider::decide`] when the store answers without waiting (the memory store: replay),
    /// from synchronous code. `None` if it would have waited.
    pub fn decide_now<F: Facts>(&self, question: Question<'_, '_, F>) -> Option<Decided> {
        let future = std::pin::pin!(self.decide(question));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.poll(&mut cx) {
            std::task::Poll::Ready(decided) => Some(decided),
            std::task::Poll::Pending => None,
        }
    }

    /// Gives `ask`'s units back to its budget (the service's `is_negative_hits`).
    pub async fn give_back(&self, ask: &Ask<'_>) {
        self.limiter.give_back(ask).await;
    }
}

mod asks;
mod endpoints;
mod global;
mod limits;
mod owned;
mod peek;
mod penalty;
mod request;

pub use owned::Core;

#[cfg(test)]
mod tests;
