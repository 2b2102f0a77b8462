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

/// True when the limits that denied (`denied`, bits by position in `budget`) are all
/// `per: endpoint` ones: another endpoint may still admit.
fn only_per_endpoint(budget: &Budget, denied: u16) -> bool {
    denied != 0
        && budget
            .limits
            .iter()
            .enumerate()
            .all(|(p, l)| p >= MAX_LIMITS || denied & (1 << p) == 0 || l.per == Per::Endpoint)
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
    /// Where each limit asked stands after the decision (by its position in its budget),
    /// enforced and shadow: what a rate-limit service reports per descriptor. Kept only by a
    /// decider asked to ([`Decider::standings`]): boxed, so that a proxy's decision, which
    /// reports one limit's figures, does not carry (and move, future to future) 264 bytes.
    pub standings: Option<Box<[crate::limiter::Standings; 2]>>,
    /// The store round trips the decision waited on (not the answers a lease, the deny cache
    /// or the in-process store gave): when each began and how long it took, for traces.
    pub store_calls: Vec<(Instant, std::time::Duration)>,
    /// What an admitted request spent that can be given back, kept only by a decider asked to
    /// ([`Decider::undoable`]).
    pub spent: Option<Box<Spent>>,
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
            standings: None,
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
    /// Keep where every limit asked stands ([`Decided::standings`]): the rate-limit service
    /// reports it per descriptor; the proxy and replay do not.
    pub standings: bool,
    /// Keep what an admitted request spent, to give back should its client leave before it is
    /// forwarded ([`Decided::spent`]): the proxy asks for it where the front end can tell (an
    /// HTTP/3 stream's reset), so that no other request pays for the bookkeeping.
    pub undoable: bool,
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
    /// Limits the caller found itself, each side's asks at their costs: the rate-limit
    /// service's descriptors, whose values the calling proxy chose. They name no route and no
    /// client, so only the store's steps apply (3 and 4 above): there is no one to exempt, ban,
    /// override, penalize or alert about (docs/service.md, "What the service does not apply").
    Limits {
        enforced: BudgetAsks<'q>,
        shadow: BudgetAsks<'q>,
    },
}

impl<'q> Question<'q, 'static, NoFacts> {
    /// [`Question::Limits`], typed (it reads no facts).
    pub fn limits(enforced: BudgetAsks<'q>, shadow: BudgetAsks<'q>) -> Self {
        Question::Limits { enforced, shadow }
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
            Question::Limits { enforced, shadow } => self.decide_asks(enforced, shadow).await,
        }
    }

    /// A client's request on `route` (see [`Question::Request`]), steps 1 to 5.
    async fn decide_request(
        &self,
        route: &RouteConfig,
        whose: &Whose<'_>,
        facts: &mut impl Facts,
        endpoints: Option<&mut (dyn Endpoints + Send)>,
    ) -> Decided {
        if !route.is_limited() {
            // Nothing to spend; a ban covers the route all the same.
            let mut buf = [0u8; 16];
            let id = whose.identity.key_bytes(&mut buf);
            let kind = KeyKind::from(whose.identity.kind());
            return match self.control.and_then(|c| c.banned(&route.name, kind, id)) {
                Some(wait_us) => Decided::banned(wait_us),
                None => Decided::of(DecisionLabel::Unlimited),
            };
        }
        if route.exempt.covers(whose.ip, &whose.identity, whose.tier) {
            return Decided::of(DecisionLabel::Exempt);
        }
        let (mut id_buf, mut ip_buf) = ([0u8; 16], [0u8; 16]);
        // (An API key or user id is borrowed from the request; only an IP needs these buffers.)
        let id = whose.identity.key_bytes(&mut id_buf);
        let ip = ip_octets(whose.ip, &mut ip_buf);
        let kind = KeyKind::from(whose.identity.kind());
        // A banned identity is refused before anything is asked; an identity with an override
        // spends the override's budgets in place of the route's enforced ones.
        let found = match self.control {
            Some(control) => control.find(&route.name, kind, id),
            None => Default::default(),
        };
        if let Some(wait_us) = found.banned_us {
            return Decided::banned(wait_us);
        }
        let budget = found.over.as_ref().map_or(&route.enforced, |o| &o.budget);
        // Both budgets' keys are built before either is decided (the access log records a
        // refused request's shadow keys too); most routes have no shadow limit.
        let shadow_keys = match route.shadow.is_empty() {
            true => RequestKeys::default(),
            false => facts.keys(&route.shadow, (kind, id), ip),
        };
        let request = Request {
            whose,
            id,
            ip,
            budgets: [budget, &route.shadow],
            keys: [facts.keys(budget, (kind, id), ip), shadow_keys],
        };
        let by_endpoint = [budget, &route.shadow]
            .iter()
            .any(|b| b.limits.iter().any(|l| l.per == Per::Endpoint));
        let decided = match endpoints {
            // Boxed: its search holds a decision beside the next one's future, and most routes
            // have no limit `per: endpoint`.
            Some(endpoints) if by_endpoint => {
                Box::pin(self.pass_over(&request, facts, endpoints)).await
            }
            _ => self.attempt(&request, facts, None).await,
        };
        // Boxed, and only where a limit has a penalty box: its store calls would otherwise
        // size every decision's future (and every refusal would allocate).
        if let Some(Refused::RateLimited(..)) = decided.refused
            && self.control.is_some()
            && budget.limits.iter().any(|l| l.penalty.is_some())
        {
            Box::pin(self.penalize(&route.name, budget, &decided, kind, id)).await;
        }
        if let (Some(alerts), None, Some((verdict, LimitRef::Enforced(position)))) = (
            self.alerts.filter(|a| a.is_on()),
            &decided.refused,
            &decided.headline,
        ) && let Some(limit) = budget.limits.get(*position)
            && let Some(ask) = limit.ask(Some((kind, id)), Some(ip))
        {
            alerts.observe(&route.name, limit, ask.key, verdict);
        }
        decided
    }

    /// The request's decision with its limits `per: endpoint` (a replica's budget): the
    /// endpoints `endpoints` offers, in the balancer's order, one at a time until one's budget
    /// admits; an endpoint whose budget is spent (only limits `per: endpoint` refused) is passed
    /// over. When every one is spent, the refusal that can be retried soonest. A refusal by any
    /// other limit, or a store failure, ends the search: no endpoint would change it. Each try
    /// is all-or-nothing (a refused one spends nothing), so the search never over-admits.
    async fn pass_over(
        &self,
        request: &Request<'_, '_>,
        facts: &mut impl Facts,
        endpoints: &mut (dyn Endpoints + Send),
    ) -> Decided {
        let mut soonest: Option<(u64, Decided)> = None;
        while let Some(endpoint) = endpoints.next() {
            let decided = self.attempt(request, facts, Some(endpoint)).await;
            let retry_us = match &decided.refused {
                Some(Refused::RateLimited(verdict, _))
                    if only_per_endpoint(request.budgets[0], decided.denied[0]) =>
                {
                    verdict.retry_after_us()
                }
                _ => return decided,
            };
            if soonest
                .as_ref()
                .is_none_or(|(soonest, _)| retry_us < *soonest)
            {
                soonest = Some((retry_us, decided));
            }
        }
        match soonest {
            Some((_, decided)) => decided,
            // No endpoint at all: the other limits decide (the forward answers 503 `no_upstream`).
            None => self.attempt(request, facts, None).await,
        }
    }

    /// One decision of `request`'s budgets, for a request sent to `endpoint` (`None`: the
    /// limits `per: endpoint` are left out).
    async fn attempt(
        &self,
        request: &Request<'_, '_>,
        facts: &mut impl Facts,
        endpoint: Option<&[u8]>,
    ) -> Decided {
        let Request {
            whose,
            id,
            ip,
            budgets: [budget, shadow_budget],
            keys: [enforced_keys, shadow_keys],
        } = request;
        let enforced = whose.asks(budget, id, ip, enforced_keys, endpoint);
        let enforced_costs = reserves(budget, &enforced, facts);
        let enforced_asks = costed(&enforced, &enforced_costs);
        let shadow = (!shadow_budget.is_empty())
            .then(|| whose.asks(shadow_budget, id, ip, shadow_keys, endpoint));
        let shadow_costs = match &shadow {
            Some(shadow) => reserves(shadow_budget, shadow, facts),
            None => Vec::new(),
        };
        let shadow_asks = shadow.as_ref().and_then(|s| costed(s, &shadow_costs));
        let shadow = match &shadow {
            Some(shadow) => BudgetAsks {
                asks: shadow_asks.as_deref().unwrap_or(&shadow.asks),
                positions: &shadow.positions[..shadow.asks.len()],
            },
            None => BudgetAsks {
                asks: &[],
                positions: &[],
            },
        };
        self.decide_asks(
            BudgetAsks {
                asks: enforced_asks.as_deref().unwrap_or(&enforced.asks),
                positions: &enforced.positions[..enforced.asks.len()],
            },
            shadow,
        )
        .await
    }

    /// The override of `kind`/`id`'s limits on `route`, if one is in force: its budget stands
    /// in for the route's enforced one ([`Decider::peek_route`] asks this).
    fn override_of(
        &self,
        route: &str,
        kind: KeyKind,
        id: &[u8],
    ) -> Option<std::sync::Arc<crate::control::Override>> {
        self.control?.find(route, kind, id).over
    }

    /// The penalty box: a denial by a limit with `penalty:` is counted, per identity, in the
    /// store (so every instance's denials count); the one that fills the count bans the
    /// identity on the route for `penalty.ban`.
    async fn penalize(
        &self,
        route: &str,
        budget: &Budget,
        decided: &Decided,
        kind: KeyKind,
        id: &[u8],
    ) {
        let Some(control) = self.control else {
            return;
        };
        for (position, limit) in budget.limits.iter().enumerate() {
            let Some(penalty) = &limit.penalty else {
                continue;
            };
            if !decided.denied_by(Side::Enforced, position) {
                continue;
            }
            let full = penalty.first_denial_bans || {
                let ask = Ask {
                    limit: &penalty.counter,
                    key: crate::limiter::BudgetKey {
                        budget: &penalty.budget_id,
                        kind,
                        value: id,
                    },
                };
                matches!(
                    self.limiter.decide(&[ask], OnError::Allow).await,
                    Ok(Admission::Limited { verdict, .. }) if !verdict.allowed()
                )
            };
            if full {
                let now = crate::limiter::wall_clock_us();
                let until =
                    now.saturating_add(u64::try_from(penalty.ban.as_micros()).unwrap_or(u64::MAX));
                let ban = crate::control::Ban {
                    id: control.new_id("ban"),
                    route: Some(route.to_string()),
                    kind,
                    value: id.to_vec(),
                    until_us: until,
                    reason: format!("penalty of {}", limit.name()),
                    by: "penalty",
                };
                control.ban(ban.clone());
                tracing::info!(ban = %ban.id, %route, limit = limit.name(), ban_for = ?penalty.ban, "penalty box: identity banned");
                let id = ban.id.clone();
                // The penalty holds here whatever the store says (this instance counted the
                // denials); the other instances learn of it when the store takes it.
                let entry = crate::control::Entry::Ban(ban);
                if let Err(e) =
                    crate::control::share(self.limiter, &[(&id, Some(&entry))], &[]).await
                {
                    tracing::warn!(ban = %id, error = %e, "the penalty's ban could not be written to the store: it holds on this instance only");
                }
            }
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

    /// Steps 3 and 4 for a request's asks: the enforced ones all-or-nothing (a denial refuses,
    /// unless `shadow: true`; a store failure follows `on_error`), then, if it goes on, the
    /// shadow ones, which never refuse.
    async fn decide_asks(&self, enforced: BudgetAsks<'_>, shadow: BudgetAsks<'_>) -> Decided {
        let mut phase = LimitPhase::new(&self.policy);
        let mut decided = Decided::of(DecisionLabel::Allowed);
        if !enforced.asks.is_empty() {
            let admission = match self.ask_enforced(enforced.asks, &mut decided).await {
                Ok(admission) => admission,
                Err(_) => {
                    decided.refused = Some(phase.store_unavailable());
                    return decided;
                }
            };
            self.keep(&mut decided, Side::Enforced, &enforced, &admission);
            if let Err(refused) = phase.enforced(
                admission.verdict().map(|v| v.ruling),
                enforced.positions,
                admission.store_failed(),
            ) {
                decided.refused = Some(refused);
                return decided;
            }
        }
        // A shadow budget's store failure only means "no shadow verdict".
        if !shadow.asks.is_empty()
            && let Ok(admission) = self.ask(shadow.asks, &mut decided).await
        {
            self.keep(&mut decided, Side::Shadow, &shadow, &admission);
            phase.shadow(admission.verdict().map(|v| v.ruling), shadow.positions);
        }
        decided.headline = phase.headline();
        decided.label = phase.label();
        decided
    }

    /// What `who` would be told now on `route`, spending nothing, for every limit that applies
    /// to its tier (enforced, an override's in their place for an identity that has one; then
    /// shadow ones, with `shadow`): the one peek behind `/budgets` and the usage endpoint.
    /// Composite keys read `who.view` as the proxy reads a request; a limit whose client the
    /// caller does not name (an admin query that names only an address) has no figures, and
    /// the limits `per: endpoint` none either (no endpoint is chosen by a peek).
    pub async fn peek_route(
        &self,
        route: &RouteConfig,
        who: &Peek<'_>,
        shadow: bool,
    ) -> Result<Vec<Peeked>, crate::limiter::LimiterError> {
        let over = who
            .identity
            .and_then(|(kind, id)| self.override_of(&route.name, kind, id));
        let enforced = over.as_ref().map_or(&route.enforced, |o| &o.budget);
        let mut out = Vec::new();
        let budgets = [(enforced, false), (&route.shadow, true)];
        for (budget, is_shadow) in budgets.into_iter().take(1 + usize::from(shadow)) {
            let keys = match who.identity {
                Some(identity) => {
                    RequestKeys::of(budget, who.view, identity, who.ip.unwrap_or(&[]))
                }
                None => RequestKeys::default(),
            };
            let asks =
                crate::policy::asks_with(budget, who.tier, who.identity, who.ip, &keys, None);
            let positions = &asks.positions[..asks.asks.len()];
            let decisions = self.peek(&asks.asks).await?;
            for (position, limit) in budget.limits.iter().enumerate() {
                if !limit.applies_to(who.tier) {
                    continue;
                }
                let at = positions.iter().position(|&p| p == position);
                let figures = at
                    .and_then(|i| decisions.get(i))
                    .map(|d| (d.remaining_before(limit.limit.cost()), d.reset_after_us));
                let slice = match (limit.limit.is_global(), at) {
                    (true, Some(i)) => self.slice(&asks.asks[i]).await,
                    _ => None,
                };
                out.push(Peeked {
                    algorithm: limit.limit.algorithm().name(),
                    per: limit.per.as_str(),
                    limit: u64::from(limit.limit.algorithm().units()),
                    shadow: is_shadow,
                    global: limit.limit.is_global(),
                    figures,
                    slice,
                });
            }
        }
        Ok(out)
    }

    /// What `asks` would be told now, per limit asked, spending nothing.
    pub async fn peek(
        &self,
        asks: &[Ask<'_>],
    ) -> Result<Vec<crate::limiter::Decision>, crate::limiter::LimiterError> {
        if asks.is_empty() {
            return Ok(Vec::new());
        }
        let Some(global) = self
            .global
            .filter(|_| asks.iter().any(|a| a.limit.is_global()))
        else {
            return self.limiter.peek(asks).await;
        };
        // The region's limits in its store; each global one as its region sees it.
        let region: Vec<Ask<'_>> = asks
            .iter()
            .filter(|a| !a.limit.is_global())
            .copied()
            .collect();
        let mut region = match region.is_empty() {
            true => Vec::new(),
            false => self.limiter.peek(&region).await?,
        }
        .into_iter();
        let mut decisions = Vec::with_capacity(asks.len());
        for ask in asks {
            decisions.push(match ask.limit.is_global() {
                true => {
                    global
                        .peek(ask)
                        .await
                        .map_err(|e| {
                            crate::limiter::LimiterError::unavailable(
                                crate::limiter::Cause::from_error(e),
                            )
                        })?
                        .0
                }
                false => region.next().unwrap_or(crate::limiter::Decision::EMPTY),
            });
        }
        Ok(decisions)
    }

    /// What this region's slice of a `scope: global` limit's budget holds (`/budgets`):
    /// the region and its units, if global budgets are on.
    pub async fn slice(&self, ask: &Ask<'_>) -> Option<(String, u64)> {
        let global = self.global?;
        let (_, held) = global.peek(ask).await.ok()?;
        Some((global.region().to_string(), held))
    }

    /// Gives `ask`'s units back to its budget (the service's `is_negative_hits`).
    pub async fn give_back(&self, ask: &Ask<'_>) {
        self.limiter.give_back(ask).await;
    }

    /// The enforced asks' decision: [`Decider::ask`] for a budget without a `scope: global`
    /// limit; otherwise the region's limits first and, if they admit, each global one through
    /// its region's slice ([`crate::global::Global::spend`]), folded into one verdict in the
    /// order asked. (A global limit that refuses leaves the region limits' units spent: the
    /// under-grant is theirs, never an over-grant of the global budget.)
    async fn ask_enforced(
        &self,
        asks: &[Ask<'_>],
        decided: &mut Decided,
    ) -> Result<Admission, crate::limiter::LimiterError> {
        match self
            .global
            .filter(|_| asks.iter().any(|a| a.limit.is_global()))
        {
            None => self.ask(asks, decided).await,
            // Boxed: the global store's call would otherwise size every decision's future.
            Some(global) => Box::pin(self.ask_with_global(global, asks, decided)).await,
        }
    }

    /// [`Decider::ask_enforced`] for asks among which some are `scope: global`.
    async fn ask_with_global(
        &self,
        global: &crate::global::Global,
        asks: &[Ask<'_>],
        decided: &mut Decided,
    ) -> Result<Admission, crate::limiter::LimiterError> {
        let region: Vec<Ask<'_>> = asks
            .iter()
            .filter(|a| !a.limit.is_global())
            .copied()
            .collect();
        let region_at: Vec<usize> = (0..asks.len())
            .filter(|&i| !asks[i].limit.is_global())
            .collect();
        let (region_verdict, lease, source, round_trip) = if region.is_empty() {
            (
                None,
                crate::limiter::next_lease(),
                crate::limiter::Source::Store,
                false,
            )
        } else {
            match self.ask(&region, decided).await? {
                Admission::Limited {
                    verdict,
                    source,
                    lease,
                    round_trip,
                } => (Some(verdict), lease, source, round_trip),
                other => return Ok(other),
            }
        };
        let mut decisions = vec![crate::limiter::Decision::EMPTY; asks.len()];
        let mut now_us = crate::limiter::wall_clock_us();
        if let Some(verdict) = &region_verdict {
            now_us = verdict.now_us;
            // The region verdict names its headline and which limits denied; the others
            // allowed with at least the headline's figures.
            for (j, &i) in region_at.iter().enumerate() {
                decisions[i] = match (j == verdict.headline_index, verdict.denied_by(j)) {
                    (true, _) => verdict.headline,
                    (false, true) => crate::limiter::Decision::deny(
                        figures(&verdict.headline),
                        verdict.retry_after_us(),
                    ),
                    (false, false) => {
                        crate::limiter::Decision::allow(figures(&verdict.headline), 0)
                    }
                };
            }
            if !verdict.allowed() {
                return Ok(Admission::Limited {
                    verdict: remapped(verdict, &region_at),
                    source,
                    lease,
                    round_trip,
                });
            }
        }
        for (i, ask) in asks.iter().enumerate().filter(|(_, a)| a.limit.is_global()) {
            match global.spend(ask).await {
                Ok(decision) => decisions[i] = decision,
                Err(e) => {
                    tracing::debug!(error = %e, "global budget undecided");
                    match self.on_error {
                        crate::limiter::OnError::Allow => return Ok(Admission::FailedOpen),
                        // No local stand-in can keep a budget shared across regions: `local`
                        // refuses as `deny` does.
                        _ => {
                            return Err(crate::limiter::LimiterError::unavailable(
                                crate::limiter::Cause::from_error(e),
                            ));
                        }
                    }
                }
            }
            if !decisions[i].allowed() {
                break;
            }
        }
        // (`None` only for no asks at all, which never reach here.)
        let Some(verdict) = crate::limiter::Verdict::from_decisions(now_us, &decisions) else {
            return Ok(Admission::Unlimited);
        };
        Ok(Admission::Limited {
            verdict,
            source,
            lease,
            round_trip,
        })
    }

    /// One store decision, timed (a round trip is noted in `decided`). `Err` when the store
    /// failed and `on_error` is `deny`.
    async fn ask(
        &self,
        asks: &[Ask<'_>],
        decided: &mut Decided,
    ) -> Result<Admission, crate::limiter::LimiterError> {
        let started = self.metrics.map(|_| Instant::now());
        let admission = self.limiter.decide(asks, self.on_error).await;
        if let (Some(metrics), Some(started)) = (self.metrics, started) {
            let took = started.elapsed();
            metrics.observe_limiter(took.as_secs_f64());
            if let Ok(Admission::Limited {
                round_trip: true, ..
            }) = admission
            {
                decided.store_calls.push((started, took));
            }
        }
        admission
    }

    /// Keeps what `admission` of one budget's asks holds (leases, a reservation) and which of
    /// its limits denied.
    fn keep(
        &self,
        decided: &mut Decided,
        side: Side,
        budget: &BudgetAsks<'_>,
        admission: &Admission,
    ) {
        decided
            .leases
            .extend(self.limiter.hold(budget.asks, admission));
        if self.undoable {
            self.keep_spent(decided, side, budget, admission);
        }
        if let Some(reservation) = self.limiter.reserve(budget.asks, admission) {
            let positions = budget
                .asks
                .iter()
                .zip(budget.positions)
                .filter(|(ask, _)| ask.limit.is_settled())
                .map(|(_, &position)| position)
                .collect();
            decided.reservations.push(Reserved {
                reservation,
                side,
                positions,
            });
        }
        if let Some(verdict) = admission.verdict() {
            for (i, &position) in budget.positions.iter().enumerate() {
                if verdict.denied_by(i) && position < MAX_LIMITS {
                    decided.denied[side as usize] |= 1 << position;
                }
                if self.standings
                    && let Some(standing) = verdict.standings.get(i)
                {
                    decided.standings.get_or_insert_default()[side as usize]
                        .set(position, standing);
                }
            }
        }
    }
}

impl Decider<'_> {
    /// Keeps in `decided.spent` what `admission` spent of `budget`'s asks that a refund can
    /// reach (see [`Spent`]), if it admitted.
    fn keep_spent(
        &self,
        decided: &mut Decided,
        side: Side,
        budget: &BudgetAsks<'_>,
        admission: &Admission,
    ) {
        if !admission.verdict().is_some_and(|v| v.allowed()) {
            return;
        }
        // Only enforced limits are spent in the global store; without it (replay), and for
        // shadow limits, a global limit is decided in the region's store as any other.
        let global = self.global.filter(|_| side == Side::Enforced);
        let in_global = |ask: &Ask<'_>| global.is_some() && ask.limit.is_global();
        let spent = decided.spent.get_or_insert_default();
        spent
            .reservations
            .extend(self.limiter.reserve_where(budget.asks, admission, |ask| {
                !ask.limit.is_settled()
                    && ask.limit.algorithm().kind() != crate::limiter::AlgorithmKind::Concurrency
                    && !in_global(ask)
            }));
        if let Some(global) = global {
            let refunds = budget.asks.iter().filter(|a| a.limit.is_global());
            spent
                .global
                .extend(refunds.map(|ask| global.refund_of(ask)));
        }
    }
}

/// A decision's figures.
fn figures(d: &crate::limiter::Decision) -> crate::limiter::Figures {
    crate::limiter::Figures {
        limit: d.limit,
        remaining: d.remaining,
        reset_after_us: d.reset_after_us,
    }
}

/// `verdict` of the asks at `at` (their positions among all asked), in all the asks' terms.
fn remapped(verdict: &crate::limiter::Verdict, at: &[usize]) -> crate::limiter::Verdict {
    let mut denied = 0u16;
    let mut standings = crate::limiter::Standings::default();
    for (j, &i) in at.iter().enumerate() {
        if verdict.denied_by(j) && i < 16 {
            denied |= 1 << i;
        }
        if let Some(standing) = verdict.standings.get(j) {
            standings.set(i, standing);
        }
    }
    crate::limiter::Verdict {
        ruling: crate::limiter::Ruling {
            headline_index: at.get(verdict.headline_index).copied().unwrap_or(0),
            denied,
            ..verdict.ruling
        },
        standings,
    }
}

/// Per ask of `budget`, the limit costing what the request reserves, for a settled limit
/// (`None` for the others); nothing is allocated for a budget without one.
fn reserves(budget: &Budget, asks: &Asks<'_>, facts: &mut impl Facts) -> Vec<Option<Limit>> {
    if !budget.limits.iter().any(|l| l.settled.is_some()) {
        return Vec::new();
    }
    asks.asks
        .iter()
        .zip(&asks.positions)
        .map(|(ask, &position)| {
            let limit = budget.limits.get(position)?;
            limit.settled.as_ref()?;
            Some(ask.limit.costing(facts.reserve(limit)))
        })
        .collect()
}

/// `asks` with each settled limit costing its reserve (`costs`, from [`reserves`]); `None` when
/// no limit is settled (the asks stand as they are).
fn costed<'a>(asks: &Asks<'a>, costs: &'a [Option<Limit>]) -> Option<Vec<Ask<'a>>> {
    if costs.is_empty() {
        return None;
    }
    Some(
        asks.asks
            .iter()
            .zip(costs)
            .map(|(ask, cost)| match cost {
                Some(limit) => Ask {
                    limit,
                    key: ask.key,
                },
                None => *ask,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
