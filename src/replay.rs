//! `floodgate replay`: what would this config have denied? Recorded requests are run through a
//! config's routes, identity rules, consumers, tiers and limits, in the log's time order and on
//! the log's own clock, by the same [`MemoryStore`] and algorithms the proxy uses. No store, no
//! upstream, no network.
//!
//! Inputs, one request per line, told apart line by line:
//! - floodgate's JSON access log (`--log-format json`, `RUST_LOG=floodgate::access=info`): the
//!   timestamp (µs), method, path, `client_ip`, `identity_hash` (the SHA-256 of the API key or
//!   user id, never the key) and `latency_ms` (how long a concurrency slot was held);
//! - nginx's `combined` format: the identity is the client IP; `$time_local` has one-second
//!   resolution, so the requests of one second are spread evenly over it.
//!
//! Streaming, with memory bounded by what is alive at once: lines are read one at a time; a
//! reorder window of [`REORDER_WINDOW_US`] of log time puts slightly out-of-order lines (several
//! workers writing one log) back in order; a line older than the window is decided at the
//! window's edge and counted as `late`. The store is swept as log time passes, so it holds only
//! the budgets alive at once, and the most-denied identities are kept in a fixed-size table
//! (Space-Saving: counts are exact for any identity whose count exceeds the smallest kept one).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::BufRead;
use std::sync::Arc;

use crate::config::{Budget, Config, RouteLimit};
use crate::decider::{Core, Facts, Question, Side};
use crate::identity::Identity;
use crate::limiter::{HeldLeases, KeyKind, Limiter, ManualClock, MemoryStore, OnError};
use crate::metrics::DecisionLabel;
use crate::policy::{Claim, Policy, RequestKeys};
use crate::route::RouteTable;

mod parse;
mod report;
mod time;
mod top;

use parse::parse_bytes;
pub use parse::{Malformed, Record, RecordedIdentity, parse_line};
pub use report::{LimitReport, Report, RouteReport};
pub use time::parse_rfc3339_us;
use top::TopK;

/// How far back in log time a line may be and still be put in order.
pub const REORDER_WINDOW_US: u64 = 10_000_000;
/// How often, in log time, the store drops full budgets.
const SWEEP_EVERY_US: u64 = 5_000_000;
/// How many most-denied identities are tracked per route.
const TOP_TRACKED: usize = 64;
/// How many are reported.
const TOP_REPORTED: usize = 10;
/// How many malformed lines are listed by number (all are counted).
const MALFORMED_LISTED: usize = 20;
/// The most budgets the replay store tracks (far above what one log keeps alive at once).
const MAX_KEYS: usize = 10_000_000;

/// Counts per route.
#[derive(Debug, Default, Clone)]
struct RouteStats {
    requests: u64,
    allowed: u64,
    denied: u64,
    /// Forwarded although a limit said no (`shadow: true`, or a shadow limit): counted in
    /// `allowed` too.
    shadow_denied: u64,
    invalid_key: u64,
    /// Per enforced limit (by position in the enforced list): requests it said no to.
    limit_denials: Vec<u64>,
    /// Per shadow limit: requests it would have said no to.
    shadow_denials: Vec<u64>,
    /// Requests whose live decision the log records, and how many of those replay agrees with.
    compared: u64,
    agreed: u64,
    top: TopK,
    /// A cached route: requests answered from the cache (a hit, or collapsed onto another's
    /// fetch), and when each key's last fetch came back (µs of log time).
    cached: u64,
    filled: std::collections::HashMap<String, u64>,
    /// Requests that would have reached the upstream.
    upstream: u64,
}

impl RouteStats {
    /// Counts one replayed request's decision: allowed or denied, by which limits, whether it
    /// agrees with the live decision the log recorded, and whose it was when refused.
    fn count(
        &mut self,
        record: &Record,
        decided: &crate::decider::Decided,
        identity: &Identity<'_>,
    ) {
        let forwarded = decided.refused.is_none();
        if let Some(live) = record.recorded {
            self.compared += 1;
            self.agreed += u64::from(live == forwarded);
        }
        for (side, counts) in [
            (Side::Enforced, &mut self.limit_denials),
            (Side::Shadow, &mut self.shadow_denials),
        ] {
            for (position, count) in counts.iter_mut().enumerate() {
                *count += u64::from(decided.denied_by(side, position));
            }
        }
        if decided.denied[Side::Enforced as usize] != 0 {
            self.top.add(label(identity));
        }
        if forwarded {
            self.allowed += 1;
            // A denial that was only logged, by `shadow: true` or by a shadow limit.
            self.shadow_denied += u64::from(decided.label == DecisionLabel::ShadowDenied);
        } else {
            self.denied += 1;
        }
    }
}

/// A request's key in replay's cache: its host and path (the log holds no query).
fn cache_key(record: &Record) -> String {
    [record.host.as_deref().unwrap_or(""), "\0", &record.path].concat()
}

impl RouteStats {
    /// The cache before the limits (as the proxy's order): a GET or HEAD within the route's
    /// `ttl` of its key's last fetch is answered from it, or collapsed onto the fetch still
    /// under way (true). The log holds no `Cache-Control`: the route's `ttl` is the freshness.
    /// An unsafe method answered 2xx or 3xx removes its key.
    fn answered_from_cache(
        &mut self,
        route: &crate::config::RouteConfig,
        record: &Record,
        now: u64,
    ) -> bool {
        let Some(rules) = &route.cache else {
            return false;
        };
        let key = cache_key(record);
        let reads = matches!(record.method, http::Method::GET | http::Method::HEAD);
        let ttl_us = rules.ttl.as_micros() as u64;
        if reads && self.filled.get(&key).is_some_and(|&at| now < at + ttl_us) {
            self.cached += 1;
            return true;
        }
        if !record.method.is_safe() && record.status.is_some_and(|s| (200..400).contains(&s)) {
            self.filled.remove(&key);
        }
        false
    }

    /// A request that reached the upstream; on a cached route a GET's fetch fills its key when
    /// it comes back (as logged; else at once).
    fn forwarded(&mut self, route: &crate::config::RouteConfig, record: &Record, now: u64) {
        self.upstream += 1;
        if route.cache.is_some() && record.method == http::Method::GET {
            let back = now + record.latency_us.unwrap_or(0);
            self.filled.insert(cache_key(record), back);
        }
    }
}

/// The concurrency leases one request holds until a log time.
struct PendingRelease {
    at_us: u64,
    seq: u64,
    leases: Vec<HeldLeases>,
}

/// What the decider reads of a logged request: each composite key's digest (the log holds no
/// header, query, claim or body values: a budget per digest here, as the proxy had one per key;
/// a line without them, an older floodgate's, spends the identity's budget, as a request lacking
/// the value does in the proxy), and what each settled limit reserved (the log's `cost`; the
/// limit's own reserve when the log does not say). What it then cost is settled right after
/// the decision ([`settled_cost`]), as the proxy settles when the response says.
struct LoggedFacts<'r>(&'r Record);

/// What a settled limit's request cost, as the log tells: the figure the log's `cost` settled
/// at, else, for `refund_on` / `spend_on`, nothing or the reserve by the logged status, else the
/// reserve (a cost the log does not say stays what was reserved, as in the proxy).
fn settled_cost(record: &Record, limit: &RouteLimit, reserved: u64) -> u64 {
    if let Some(&(_, _, settled)) = record.costs.iter().find(|(p, ..)| *p == limit.position()) {
        return settled;
    }
    match (&limit.settled, record.status) {
        (Some(settled), Some(status)) => match &settled.actual {
            crate::config::cost::Field::Status(statuses) if statuses.refunds(status) => 0,
            _ => reserved,
        },
        _ => reserved,
    }
}

impl Facts for LoggedFacts<'_> {
    fn keys(&mut self, budget: &Budget, _: (KeyKind, &[u8]), _: &[u8]) -> RequestKeys {
        RequestKeys::recorded(budget, &self.0.keys)
    }

    fn reserve(&mut self, limit: &RouteLimit) -> u32 {
        match self.0.costs.iter().find(|(p, ..)| *p == limit.position()) {
            Some(&(_, reserved, _)) => u32::try_from(reserved).unwrap_or(u32::MAX),
            None => limit.limit.cost(),
        }
    }
}

impl PartialEq for PendingRelease {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}
impl Eq for PendingRelease {}
impl PartialOrd for PendingRelease {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for PendingRelease {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_us, self.seq).cmp(&(other.at_us, other.seq))
    }
}

/// A replay in progress: feed it records in any order with [`Replay::push`], then
/// [`Replay::finish`].
pub struct Replay {
    proposal: Arc<Proposal>,
    store: Arc<MemoryStore>,
    /// The same store, as the decider asks it: replay's decider's owner.
    core: Core,
    clock: Arc<ManualClock>,
    stats: Vec<RouteStats>,
    /// Records waiting in the reorder window, in (time, arrival) order: a log in order only
    /// appends at the back; an out-of-order line is inserted where it belongs.
    window: VecDeque<(u64, u64, Record)>,
    releases: BinaryHeap<Reverse<PendingRelease>>,
    seq: u64,
    newest_seen: u64,
    last_decided: u64,
    last_sweep: u64,
    first_at: Option<u64>,
    requests: u64,
    no_route: u64,
    late: u64,
    reordered: u64,
    lines: u64,
    skipped: u64,
    malformed: Vec<Malformed>,
    malformed_total: u64,
}

/// The proposed config being replayed (with its route table), shared so a decision can borrow it
/// while it updates the counts.
struct Proposal {
    config: Config,
    table: RouteTable,
}

/// How the report names an identity: hashed for keys and user ids (the log holds digests).
fn label(identity: &Identity<'_>) -> String {
    match identity {
        Identity::Consumer(c) => format!("consumer:{}", c.name),
        Identity::ApiKey(d) | Identity::Jwt(d) | Identity::UserId(d) | Identity::ClientCert(d) => {
            identity.kind().short_label(d)
        }
        Identity::Ip(ip) => format!("ip:{ip}"),
    }
}

impl Replay {
    /// A replay of `config`'s routes and limits.
    pub fn new(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new(0));
        let store = Arc::new(MemoryStore::new(clock.clone(), MAX_KEYS));
        let stats = config
            .routes
            .iter()
            .map(|r| RouteStats {
                limit_denials: vec![0; r.enforced.limits.len()],
                shadow_denials: vec![0; r.shadow.limits.len()],
                ..RouteStats::default()
            })
            .collect();
        Replay {
            proposal: Arc::new(Proposal {
                table: RouteTable::new(config.routes.clone()),
                config,
            }),
            store: store.clone(),
            core: Core::new(Limiter::Memory(store)),
            clock,
            stats,
            window: VecDeque::new(),
            releases: BinaryHeap::new(),
            seq: 0,
            newest_seen: 0,
            last_decided: 0,
            last_sweep: 0,
            first_at: None,
            requests: 0,
            no_route: 0,
            late: 0,
            reordered: 0,
            lines: 0,
            skipped: 0,
            malformed: Vec::new(),
            malformed_total: 0,
        }
    }

    /// Reads every line of `input` (named `file` in reports).
    pub fn read(&mut self, file: &str, input: impl BufRead) -> std::io::Result<()> {
        let mut combined_second: Option<u64> = None;
        let mut same_second: Vec<Record> = Vec::new();
        let mut input = input;
        let mut buf = Vec::with_capacity(1024);
        let mut n: u64 = 0;
        loop {
            buf.clear();
            if input.read_until(b'\n', &mut buf)? == 0 {
                break;
            }
            n += 1;
            self.lines += 1;
            match parse_bytes(&buf) {
                Ok(None) => self.skipped += 1,
                Err(reason) => {
                    self.malformed_total += 1;
                    if self.malformed.len() < MALFORMED_LISTED {
                        self.malformed.push(Malformed {
                            file: file.to_string(),
                            line: n,
                            reason,
                        });
                    }
                }
                Ok(Some(record)) if record.whole_second => {
                    // nginx: whole seconds. Collect one second's lines, then spread them over it.
                    if combined_second != Some(record.at_us) {
                        self.spread(&mut same_second);
                        combined_second = Some(record.at_us);
                    }
                    same_second.push(record);
                }
                Ok(Some(record)) => self.push(record),
            }
        }
        self.spread(&mut same_second);
        Ok(())
    }

    /// The requests of one logged second, at evenly spaced instants across it.
    fn spread(&mut self, second: &mut Vec<Record>) {
        let n = second.len() as u64;
        for (i, mut record) in second.drain(..).enumerate() {
            record.at_us += i as u64 * 1_000_000 / n.max(1);
            self.push(record);
        }
    }

    /// Adds one record; decides every record that has left the reorder window.
    pub fn push(&mut self, record: Record) {
        let at = record.at_us;
        if at < self.newest_seen {
            self.reordered += 1;
        }
        self.newest_seen = self.newest_seen.max(at);
        self.seq += 1;
        // After every record of its time already waiting (arrival order breaks ties).
        let at_index = self.window.partition_point(|(t, _, _)| *t <= at);
        self.window.insert(at_index, (at, self.seq, record));
        while let Some((oldest, _, _)) = self.window.front() {
            if *oldest + REORDER_WINDOW_US > self.newest_seen {
                break;
            }
            if let Some((_, seq, record)) = self.window.pop_front() {
                self.decide(record, seq);
            }
        }
    }

    fn decide(&mut self, mut record: Record, seq: u64) {
        if record.at_us < self.last_decided {
            // Older than the reorder window allowed for: decided at the window's edge.
            self.late += 1;
            record.at_us = self.last_decided;
        }
        let now = record.at_us;
        self.last_decided = now;
        self.first_at.get_or_insert(now);
        self.clock.set(now);
        self.release_until(now);
        if now >= self.last_sweep + SWEEP_EVERY_US {
            self.store.sweep();
            self.last_sweep = now;
        }
        self.requests += 1;
        let proposal = Arc::clone(&self.proposal);
        // By method, path and the host the log recorded; routes with `headers` are passed over
        // (the log holds no headers).
        let headers = http::HeaderMap::new();
        let routed = proposal.table.find(&crate::route::Request {
            method: &record.method,
            host: record.host.as_deref(),
            headers: &headers,
            path: &record.path,
        });
        let Some(i) = routed else {
            self.no_route += 1;
            return;
        };
        let route = &proposal.config.routes[i];
        self.stats[i].requests += 1;
        if self.stats[i].answered_from_cache(route, &record, now) {
            return;
        }
        if !route.is_limited() {
            self.stats[i].allowed += 1;
            self.stats[i].forwarded(route, &record, now);
            return;
        }
        // Whose allowances: the proxy's rules (crate::policy), on the digests the log holds. The
        // address is the one a budget is kept for (an IPv6 client's /64): nginx logs whole
        // addresses; floodgate's own log already holds this one.
        let client = proposal.config.identity.budget_addr(record.client_ip);
        let claim = match &record.identity {
            RecordedIdentity::ApiKey(digest) => Claim::ApiKeyDigest(digest),
            RecordedIdentity::UserId(digest) => Claim::Keyless(Identity::UserId(&digest[..])),
            RecordedIdentity::ClientCert(digest) => {
                Claim::Keyless(Identity::ClientCert(&digest[..]))
            }
            // A subject's budget kept under its digest: replay's own store, consistent with
            // itself (the log never holds a token or a raw subject).
            RecordedIdentity::Jwt(digest, _) => Claim::Keyless(Identity::Jwt(&digest[..])),
            RecordedIdentity::Ip => Claim::Keyless(Identity::Ip(client)),
        };
        let policy = Policy {
            identity: &proposal.config.identity,
            consumers: proposal.config.consumers.as_deref(),
            tiers: &proposal.config.tiers,
            shadow: proposal.config.shadow,
        };
        // A key no consumer has, under `unknown_key: anonymous`: the log knows only the address.
        let tier = match &record.identity {
            RecordedIdentity::Jwt(_, tier) => tier.as_ref().map(|t| t.as_str()),
            _ => None,
        };
        let Ok(whose) = policy.resolve(claim, tier, || Ok(Identity::Ip(client)), || client) else {
            self.stats[i].invalid_key += 1;
            return;
        };
        // The one decider the proxy calls too (crate::decider), on replay's memory store at the
        // log's clock, which answers at once.
        let decider = self.core.decider(policy, OnError::Allow);
        let mut facts = LoggedFacts(&record);
        let Some(mut decided) = decider.decide_now(Question::Request {
            route,
            whose: &whose,
            facts: &mut facts,
            endpoints: None,
        }) else {
            debug_assert!(false, "the memory store decides without waiting");
            return;
        };
        settle_as_logged(&record, route, std::mem::take(&mut decided.reservations));
        self.stats[i].count(&record, &decided, &whose.identity);
        if decided.refused.is_none() {
            self.stats[i].forwarded(route, &record, now);
        }
        if !decided.leases.is_empty() {
            // The slots are held for as long as the request took (as logged; else they end at
            // once).
            self.releases.push(Reverse(PendingRelease {
                at_us: now + record.latency_us.unwrap_or(0),
                seq,
                leases: decided.leases,
            }));
        }
    }

    /// Gives back the concurrency leases of requests that had finished by `now`.
    fn release_until(&mut self, now: u64) {
        while self
            .releases
            .peek()
            .is_some_and(|Reverse(r)| r.at_us <= now)
        {
            if let Some(Reverse(release)) = self.releases.pop() {
                // Given back to the memory store at once.
                drop(release.leases);
            }
        }
    }

    /// Decides what is left in the window and reports.
    pub fn finish(mut self) -> Report {
        while let Some((_, seq, record)) = self.window.pop_front() {
            self.decide(record, seq);
        }
        let routes = self
            .proposal
            .config
            .routes
            .iter()
            .zip(&self.stats)
            .map(|(route, s)| RouteReport {
                name: route.name.to_string(),
                requests: s.requests,
                allowed: s.allowed,
                denied: s.denied,
                shadow_denied: s.shadow_denied,
                invalid_key: s.invalid_key,
                cached: route.cache.as_ref().map(|_| s.cached),
                upstream: s.upstream,
                compared: s.compared,
                agreed: s.agreed,
                limits: route
                    .enforced
                    .limits
                    .iter()
                    .zip(&s.limit_denials)
                    .map(|(l, &d)| (l, d, false))
                    .chain(
                        route
                            .shadow
                            .limits
                            .iter()
                            .zip(&s.shadow_denials)
                            .map(|(l, &d)| (l, d, true)),
                    )
                    .map(|(l, denied, shadow)| LimitReport {
                        position: l.position(),
                        algorithm: l.limit.algorithm().name(),
                        per: l.per.as_str(),
                        tiers: l.tiers.clone(),
                        shadow,
                        denied,
                    })
                    .collect(),
                top_denied: s
                    .top
                    .top()
                    .into_iter()
                    .map(|(id, n)| (id.to_string(), n))
                    .collect(),
            })
            .collect();
        Report {
            lines: self.lines,
            requests: self.requests,
            skipped: self.skipped,
            no_route: self.no_route,
            malformed_total: self.malformed_total,
            malformed: self.malformed,
            reordered: self.reordered,
            late: self.late,
            first_us: self.first_at,
            last_us: self.first_at.map(|_| self.last_decided),
            routes,
        }
    }
}

/// Settles a replayed decision's reservations at once, at the decision's (the log's) time:
/// what the log says each cost.
fn settle_as_logged(
    record: &Record,
    route: &crate::config::RouteConfig,
    reservations: Vec<crate::decider::Reserved>,
) {
    for reserved in reservations {
        let budget = match reserved.side {
            Side::Enforced => &route.enforced,
            Side::Shadow => &route.shadow,
        };
        let actual: Vec<u64> = reserved
            .reservation
            .reserved()
            .zip(&reserved.positions)
            .map(|(units, &position)| match budget.limits.get(position) {
                Some(limit) => settled_cost(record, limit, units),
                None => units,
            })
            .collect();
        reserved.reservation.settle(&actual);
    }
}

#[cfg(test)]
mod tests;
