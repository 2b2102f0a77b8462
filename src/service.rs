//! floodgate's limiter as a service for other proxies: Envoy's `RateLimitService` over gRPC,
//! envoyproxy/ratelimit's `POST /json`, and `GET /check` for forward auth (nginx `auth_request`,
//! Caddy `forward_auth`, Traefik `forwardAuth`), all on `service.listen` (`service/server.rs`).
//!
//! A request names a domain and descriptors; each descriptor finds its limit in
//! envoyproxy/ratelimit's rules ([`rules`]), and the limits found are decided together, all or
//! nothing, by the one [`Decider`](crate::decider::Decider) the proxy calls too, on `storage:`
//! (batching, leases, the deny cache, the breaker, `on_error`): several floodgate instances on one
//! store share each budget exactly. A descriptor in `shadow_mode` is counted as a shadow limit
//! is: it never denies.
//!
//! What each descriptor spends is its `hits_addend`, else the request's (at least 1); `0` only
//! checks (would one more fit?), `is_negative_hits` gives the units back. A request that cannot
//! be decided as it is (an empty domain, no descriptors, an entry without a key, more than
//! [`MAX_LIMITS`] limited descriptors) is refused whole, before anything is spent.

pub mod forward_auth;
pub mod rls;
pub mod rules;
pub mod server;

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::decider::{Core, Decided, Question, Side, Take, Taken};
use crate::limiter::{Ask, BudgetKey, KeyKind, Limit, MAX_LIMITS};
use crate::policy::{LimitRef, Refused};
use crate::proxy::Proxy;
use rls::{Code, DescriptorStatus, HeaderValue, RateLimitRequest, RateLimitResponse};
use rules::{Entry, RuleLimit, Rules};

/// Why a request was not decided: a gRPC status (or an HTTP 400 / 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The request is malformed: gRPC `INVALID_ARGUMENT`, HTTP 400. Nothing was spent.
    #[error("{0}")]
    InvalidArgument(String),
    /// A message larger than the service reads: gRPC `RESOURCE_EXHAUSTED`, HTTP 413.
    #[error("the message is larger than the service reads")]
    TooLarge,
    /// The store failed and `on_error` is `deny`: gRPC `UNAVAILABLE`, HTTP 503.
    #[error("the rate limiter's store is unavailable")]
    Unavailable,
}

/// The service: its rules (swapped whole on reload), the decider's owner it shares with the
/// proxy, and the proxy (whose snapshot holds the identity and `on_error` every decision reads).
pub struct Service {
    core: Arc<Core>,
    proxy: Arc<Proxy>,
    rules: ArcSwap<Rules>,
    paths: Vec<PathBuf>,
}

/// The answer to one request, and what the HTTP front ends need of it.
pub struct Answer {
    pub response: RateLimitResponse,
    /// The tightest descriptor's figures: its limit, what is left, and seconds to its reset.
    pub headline: Option<Headline>,
    /// Seconds until a denied request may be tried again (`Retry-After`).
    pub retry_after_secs: Option<u64>,
}

/// The figures the rate-limit headers carry.
#[derive(Debug, Clone, Copy)]
pub struct Headline {
    pub limit: u64,
    pub remaining: u64,
    pub reset_secs: u64,
    /// The Unix second of the reset (`X-RateLimit-Reset`, as the proxy writes it).
    pub reset_unix: u64,
}

impl Answer {
    pub fn over_limit(&self) -> bool {
        self.response.overall_code == Code::OverLimit as i32
    }
}

/// What one descriptor of a request came to before the store is asked.
enum Plan<'r> {
    /// No limit applies (no match, or one that a matched limit `replaces`).
    Free,
    /// `unlimited: true`.
    Unlimited(&'r RuleLimit),
    /// Its units given back (`is_negative_hits`).
    GivenBack,
    /// More units than its limit holds: over the limit whatever was spent.
    TooMany,
    /// Checked without spending (`hits_addend: 0`).
    Checked(&'r RuleLimit),
    /// Asked of the store: its side, its place among that side's asks, and its cost.
    Asked(&'r RuleLimit, Side, usize, u64),
}

impl Service {
    /// The service on `proxy`'s decider and store, with the rules in `paths`.
    pub fn new(proxy: Arc<Proxy>, paths: Vec<PathBuf>, rules: Rules) -> Service {
        for ignored in &rules.ignored {
            tracing::warn!(key = %ignored, "floodgate reads this envoyproxy/ratelimit key but does not act on it");
        }
        Service {
            core: proxy.core().clone(),
            proxy,
            rules: ArcSwap::from_pointee(rules),
            paths,
        }
    }

    /// Reads `service.config` again (SIGHUP). On an error the rules in force stay.
    pub fn reload(&self) -> Result<(), crate::config::ConfigError> {
        let rules = Rules::load(&self.paths)?;
        for ignored in &rules.ignored {
            tracing::warn!(key = %ignored, "floodgate reads this envoyproxy/ratelimit key but does not act on it");
        }
        self.rules.store(Arc::new(rules));
        Ok(())
    }

    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Decides `request`: `ShouldRateLimit`.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<Answer, Failure> {
        let answer = self.decide_counted(request).await;
        let code = match &answer {
            Ok(a) if a.over_limit() => "over_limit",
            Ok(_) => "ok",
            Err(_) => "error",
        };
        // A domain no rule names is "other": the label's values are bounded by the config.
        let domain = match self.rules.load().has_domain(&request.domain) {
            true => request.domain.as_str(),
            false => "other",
        };
        self.proxy.metrics().service_decision(domain, code);
        answer
    }

    /// The decision, in steps: the descriptors checked ([`entries_of`]), each one's rule found,
    /// the store keys made ([`StoreKeys`]), what each comes to ([`plan`]), each ask taken as its
    /// plan says (spent, checked, given back) and all decided by the decider, all-or-nothing
    /// across checks and spends (`Question::Limits`), and the answer written ([`answer`]). What the proxy's decision adds for an identity (exemptions,
    /// bans, overrides, the penalty box, quota alerts) does not apply: a descriptor names no
    /// identity, only values a caller chose, and the caller's own proxy answers for its
    /// clients (docs/service.md, "What the service does not apply").
    async fn decide_counted(&self, request: &RateLimitRequest) -> Result<Answer, Failure> {
        let descriptors = entries_of(request)?;
        let rules = self.rules.load();
        // Each descriptor's limit; `replaces`: a limit found drops the limits it names.
        let found: Vec<Option<&RuleLimit>> = descriptors
            .iter()
            .map(|entries| rules.find(&request.domain, entries))
            .collect();
        let replaced: Vec<&str> = found
            .iter()
            .filter_map(|l| *l)
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        let keys = StoreKeys::of(&descriptors);
        let (plans, costed) = plan(request, &found, &replaced)?;
        let too_many = plans.iter().any(|p| matches!(p, Plan::TooMany));
        // Each limited descriptor's ask, taken as its plan says, and which descriptor it is; a
        // request with a descriptor over its limit whatever is spent spends nothing (its checks
        // and give-backs stand). Per side, which descriptor each spent ask's position is.
        let mut asks: Vec<Taken<'_>> = Vec::with_capacity(costed.len());
        let mut descriptor_of: Vec<usize> = Vec::with_capacity(costed.len());
        let mut asked: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        for (side, limit, i) in &costed {
            let Some(rule) = found[*i] else { continue };
            let take = match plans[*i] {
                Plan::GivenBack => Take::GiveBack,
                Plan::Checked(_) => Take::Check,
                Plan::Asked(..) if !too_many => Take::Spend,
                _ => continue,
            };
            if take == Take::Spend {
                asked[*side as usize].push(*i);
            }
            let key = BudgetKey {
                budget: rule.budget_id.as_str(),
                kind: KeyKind::Request,
                value: keys.get(*i),
            };
            let (ask, side) = (Ask { limit, key }, *side);
            asks.push(Taken { ask, side, take });
            descriptor_of.push(*i);
        }
        let snapshot = self.proxy.snapshot();
        let decider = crate::decider::Decider {
            // Each descriptor's status says where its limit stands.
            report: true,
            ..self.core.decider(snapshot.policy(), snapshot.on_error)
        };
        let decided = decider.decide(Question::limits(&asks)).await;
        if let Some(Refused::StoreUnavailable) = decided.refused {
            return Err(Failure::Unavailable);
        }
        let report = decided.report.as_deref();
        // What each check found, by descriptor.
        let found_checks = report.map_or(&[][..], |r| &r.checks[..]);
        let checks: Vec<(usize, Option<crate::limiter::Decision>)> = (asks.iter())
            .zip(&descriptor_of)
            .filter(|(taken, _)| taken.take == Take::Check)
            .zip(
                found_checks
                    .iter()
                    .copied()
                    .map(Some)
                    .chain(std::iter::repeat(None)),
            )
            .map(|((_, &i), decision)| (i, decision))
            .collect();
        // Nothing was spent (a descriptor over its limit, or a check that refused): the asked
        // descriptors report no decision.
        let spent = !too_many && report.is_some_and(|r| r.spent);
        Ok(answer(&plans, &checks, spent.then_some(&decided), &asked))
    }
}

/// Each descriptor's entries, checked: a request needs a domain and descriptors, each with
/// entries, each with a key.
fn entries_of(request: &RateLimitRequest) -> Result<Vec<Vec<Entry>>, Failure> {
    if request.domain.is_empty() {
        return Err(Failure::InvalidArgument("the domain is empty".into()));
    }
    if request.descriptors.is_empty() {
        return Err(Failure::InvalidArgument("there are no descriptors".into()));
    }
    let mut out = Vec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return Err(Failure::InvalidArgument(format!(
                "descriptors[{i}] has no entries"
            )));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return Err(Failure::InvalidArgument(format!(
                    "descriptors[{i}].entries[{j}] has no key"
                )));
            }
            entries.push(Entry {
                key: e.key.clone(),
                value: e.value.clone(),
            });
        }
        out.push(entries);
    }
    Ok(out)
}

/// The store's keys: per descriptor, its entries (each value its own budget), in one buffer;
/// each key and value with its length before it, so that no value (whatever bytes it holds)
/// spells another descriptor's key.
struct StoreKeys {
    buf: Vec<u8>,
    ranges: Vec<std::ops::Range<usize>>,
}

impl StoreKeys {
    fn of(descriptors: &[Vec<Entry>]) -> StoreKeys {
        let mut buf = Vec::new();
        let mut ranges = Vec::with_capacity(descriptors.len());
        for entries in descriptors {
            let start = buf.len();
            for e in entries {
                for part in [&e.key, &e.value] {
                    let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
                    buf.extend_from_slice(&len.to_le_bytes());
                    buf.extend_from_slice(part.as_bytes());
                }
            }
            ranges.push(start..buf.len());
        }
        StoreKeys { buf, ranges }
    }

    /// Descriptor `i`'s key.
    fn get(&self, i: usize) -> &[u8] {
        &self.buf[self.ranges[i].clone()]
    }
}

/// Per descriptor, what it comes to before the store is asked (its [`Plan`]), and the limits
/// to ask, each at its cost: per ask, its side, its limit and which descriptor it is.
#[allow(
    clippy::type_complexity,
    reason = "the plans and the costed asks, read once by decide_counted"
)]
fn plan<'r>(
    request: &RateLimitRequest,
    found: &[Option<&'r RuleLimit>],
    replaced: &[&str],
) -> Result<(Vec<Plan<'r>>, Vec<(Side, Limit, usize)>), Failure> {
    let mut plans = Vec::with_capacity(found.len());
    let mut costed: Vec<(Side, Limit, usize)> = Vec::new();
    let mut counts = [0usize; 2];
    for (i, (d, limit)) in request.descriptors.iter().zip(found).enumerate() {
        let Some(rule) = limit.filter(|l| {
            l.name
                .as_deref()
                .is_none_or(|name| !replaced.contains(&name))
        }) else {
            plans.push(Plan::Free);
            continue;
        };
        let Some(limit) = rule.limit.as_ref() else {
            plans.push(Plan::Unlimited(rule));
            continue;
        };
        let hits = match d.hits_addend {
            Some(h) => h.value,
            None => u64::from(request.hits_addend.max(1)),
        };
        let side = if rule.shadow {
            Side::Shadow
        } else {
            Side::Enforced
        };
        let plan = if d.is_negative_hits {
            costed.push((side, limit.costing(clamp(hits)), i));
            Plan::GivenBack
        } else if hits == 0 {
            costed.push((side, *limit, i));
            Plan::Checked(rule)
        } else if hits > u64::from(limit.algorithm().max_cost()) {
            Plan::TooMany
        } else {
            let at = counts[side as usize];
            if at == MAX_LIMITS {
                return Err(Failure::InvalidArgument(format!(
                    "more than {MAX_LIMITS} descriptors find a limit"
                )));
            }
            counts[side as usize] += 1;
            costed.push((side, limit.costing(clamp(hits)), i));
            Plan::Asked(rule, side, at, u64::from(clamp(hits)))
        };
        plans.push(plan);
    }
    Ok((plans, costed))
}

/// `hits` as a cost (at most `u32::MAX`, and a limit caps it further).
fn clamp(hits: u64) -> u32 {
    u32::try_from(hits).unwrap_or(u32::MAX)
}

/// The response: one status per descriptor, in order; the overall code; the headers.
///
/// Every descriptor that found a limit has `current_limit`, `limit_remaining` and
/// `duration_until_reset` in its status, as envoyproxy/ratelimit answers (the store reports
/// where each limit asked stands); the headers carry the tightest one's (the fewest remaining).
/// A denial the deny cache answered knows only the limit it remembers: the other descriptors of
/// that answer have their code only.
fn answer(
    plans: &[Plan<'_>],
    checks: &[(usize, Option<crate::limiter::Decision>)],
    decided: Option<&Decided>,
    asked: &[Vec<usize>; 2],
) -> Answer {
    // The tightest asked descriptor: its verdict, and which descriptor it is.
    let headline = decided.and_then(|d| match (d.refused, d.headline) {
        (Some(Refused::RateLimited(v, limit)), _) | (None, Some((v, limit))) => Some((v, limit)),
        _ => None,
    });
    let headline_at = headline.and_then(|(_, limit)| match limit {
        LimitRef::Enforced(p) => asked[0].get(p).copied(),
        LimitRef::Shadow(p) => asked[1].get(p).copied(),
    });
    let mut all = Overall::default();
    let statuses = plans
        .iter()
        .enumerate()
        .map(|(i, plan)| match *plan {
            Plan::Free | Plan::GivenBack => code_only(Code::Ok),
            Plan::Unlimited(rule) => DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(current_limit(rule)),
                limit_remaining: u32::MAX,
                duration_until_reset: None,
            },
            Plan::TooMany => {
                all.over = true;
                code_only(Code::OverLimit)
            }
            Plan::Checked(rule) => {
                let d = checks.iter().find(|(at, _)| *at == i).and_then(|(_, d)| *d);
                checked_status(rule, d, &mut all)
            }
            Plan::Asked(rule, side, at, cost) => {
                let asked = Asked {
                    rule,
                    side,
                    at,
                    cost,
                    headline: headline.filter(|_| headline_at == Some(i)).map(|(v, _)| v),
                    retry_us: headline.map(|(v, _)| v.retry_after_us()),
                };
                asked_status(&asked, decided, &mut all)
            }
        })
        .collect();
    let Overall {
        over,
        retry_after_us,
        figures,
    } = all;
    let mut headers = Vec::new();
    if let Some(h) = figures {
        headers.push(header("RateLimit-Limit", h.limit));
        headers.push(header("RateLimit-Remaining", h.remaining));
        headers.push(header("RateLimit-Reset", h.reset_secs));
    }
    let retry_after_secs = over.then(|| retry_after_us.div_ceil(1_000_000).max(1));
    if let Some(secs) = retry_after_secs {
        headers.push(header("Retry-After", secs));
    }
    let now_us = crate::limiter::wall_clock_us();
    Answer {
        response: RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
        },
        headline: figures.map(|h| Headline {
            reset_unix: (now_us + h.reset_secs * 1_000_000).div_ceil(1_000_000),
            ..h
        }),
        retry_after_secs,
    }
}

/// What the descriptors' statuses add up to: whether any is over its limit, the longest retry,
/// and the tightest figures (the fewest remaining) for the headers.
#[derive(Default)]
struct Overall {
    over: bool,
    retry_after_us: u64,
    figures: Option<Headline>,
}

impl Overall {
    fn tighter(&mut self, h: Headline) {
        if self.figures.is_none_or(|old| h.remaining < old.remaining) {
            self.figures = Some(h);
        }
    }
}

/// A checked descriptor's status (decided without spending: `d`, if its limit was found).
fn checked_status(
    rule: &RuleLimit,
    d: Option<crate::limiter::Decision>,
    all: &mut Overall,
) -> DescriptorStatus {
    let Some(d) = d else {
        return code_only(Code::Ok);
    };
    let allowed = d.allowed();
    all.over |= !allowed && !rule.shadow;
    if !allowed {
        all.retry_after_us = all.retry_after_us.max(d.retry_after_us());
    }
    let remaining = d.remaining_before(1);
    all.tighter(headline_of(rule, remaining, d.reset_after_us));
    let code = match allowed || rule.shadow {
        true => Code::Ok,
        false => Code::OverLimit,
    };
    status(rule, code, remaining, d.reset_after_us)
}

/// A descriptor asked of the decider: its rule, the side and position of its ask, its cost;
/// the headline's verdict when it is the tightest one, and the headline's retry.
struct Asked<'a> {
    rule: &'a RuleLimit,
    side: Side,
    at: usize,
    cost: u64,
    headline: Option<crate::limiter::Ruling>,
    retry_us: Option<u64>,
}

/// An asked descriptor's status, from the decision all asked descriptors shared.
fn asked_status(a: &Asked<'_>, decided: Option<&Decided>, all: &mut Overall) -> DescriptorStatus {
    let denied = decided.is_some_and(|d| d.denied_by(a.side, a.at));
    let enforced_denial = denied && a.side == Side::Enforced;
    all.over |= enforced_denial;
    let code = match enforced_denial {
        true => Code::OverLimit,
        false => Code::Ok,
    };
    if enforced_denial && let Some(retry) = a.retry_us {
        all.retry_after_us = all.retry_after_us.max(retry);
    }
    // Every limited descriptor's own figures, as the store left its budget; the headline's
    // from its verdict (the deny cache's answer knows no other).
    let standing = decided
        .and_then(|d| d.report.as_ref())
        .and_then(|r| r.standings[a.side as usize].get(a.at));
    let figures = match (a.headline, standing) {
        (Some(v), _) => Some((v.headline.remaining, v.headline.reset_after_us)),
        (_, Some(s)) => Some((u64::from(s.remaining), u64::from(s.reset_secs) * 1_000_000)),
        _ => None,
    };
    let Some((remaining, reset_us)) = figures else {
        return code_only(code);
    };
    // A limit that allowed a request another denied reports what it would have left after
    // spending; nothing was spent (all or nothing).
    let refused = decided.is_some_and(|d| d.refused.is_some());
    let remaining = match refused && !denied {
        true => (remaining + a.cost).min(headline_of(a.rule, 0, 0).limit),
        false => remaining,
    };
    all.tighter(headline_of(a.rule, remaining, reset_us));
    status(a.rule, code, remaining, reset_us)
}

fn code_only(code: Code) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        ..Default::default()
    }
}

fn header(key: &str, value: u64) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value: value.to_string(),
    }
}

fn current_limit(rule: &RuleLimit) -> rls::RateLimit {
    rls::RateLimit {
        requests_per_unit: rule.requests_per_unit,
        unit: rule.unit.number(),
        name: rule.name.clone().unwrap_or_default(),
    }
}

fn status(rule: &RuleLimit, code: Code, remaining: u64, reset_us: u64) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(current_limit(rule)),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(rls::Duration {
            seconds: i64::try_from(reset_us.div_ceil(1_000_000)).unwrap_or(i64::MAX),
            nanos: 0,
        }),
    }
}

fn headline_of(rule: &RuleLimit, remaining: u64, reset_us: u64) -> Headline {
    let limit = rule
        .limit
        .as_ref()
        .map_or(u64::from(rule.requests_per_unit), |l| {
            u64::from(l.algorithm().units())
        });
    Headline {
        limit,
        remaining,
        reset_secs: reset_us.div_ceil(1_000_000),
        reset_unix: 0,
    }
}
