//! Quota alerts (`alerts:`): a webhook is told when an admission leaves an identity's budget at
//! least a share spent (`at: [0.8, 1.0]`), once per crossing across every instance.
//!
//! Three parts, so that no request ever waits on an alert:
//!
//! 1. **On the request path** ([`Alerter::observe`], from the decider, for an admitted request's
//!    headline limit: the one with the least left): the share spent is compared with the
//!    configured shares. Each budget's highest share crossed is remembered in this process, as
//!    the share itself (a reload that adds shares beside it does not make it new again); only a
//!    change of it (a crossing, or the budget back below a share: a new window, a refill, a
//!    reset) is put on a bounded queue (`try_send`: a full queue drops it, counted as
//!    `floodgate_alerts_total{outcome="dropped"}`). With no `alerts:`, one atomic load;
//!    a budget below every share with nothing remembered costs no look-up either.
//! 2. **The sender task** ([`run`]) takes a crossing and *claims* it in the shared store
//!    (`Limiter::claim` of `alert:{budget digest}:{share}`: Redis `SET NX PX`, a PostgreSQL
//!    row) until the budget would be full again: the instance whose claim succeeds sends, the
//!    others do not. A budget back below a share gives the claim up, so the next crossing
//!    alerts again. When the store cannot be asked, the alert is sent all the same (a duplicate
//!    is better than silence). The memory store is one instance's: every claim succeeds.
//! 3. **Each delivery** is a task of its own (at most [`MAX_PENDING`] at once): a JSON POST,
//!    retried on failure after 1, 2, 4 … 32 s (seven attempts over 63 s), then counted as
//!    `failed`; a 2xx is `sent`.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;

use crate::config::{AlertSink, RouteLimit};
use crate::limiter::{BudgetKey, KeyKind, Limiter, Ruling, wall_clock_us};
use crate::metrics::Metrics;

/// Crossings waiting for the sender task.
const QUEUE: usize = 1024;
/// Deliveries in flight (retrying included) at most; more are dropped.
pub const MAX_PENDING: usize = 1000;
/// Budgets whose crossings are remembered at most (entries past their budget's full instant
/// make room).
const MAX_REMEMBERED: usize = 100_000;
const SHARDS: usize = 16;
/// How long one delivery attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// The pauses before each retry: seven attempts, the last 63 s after the first.
const BACKOFF_S: [u64; 6] = [1, 2, 4, 8, 16, 32];

/// A budget's highest share crossed (one of the configured shares, all above 0), until the
/// budget would be full again (µs since the epoch).
#[derive(Clone, Copy)]
struct Crossed {
    share: f64,
    until_us: u64,
}

/// What the sender task is told: a budget's highest share crossed went from `from` to `to` (0:
/// none; up: the shares between are crossings to claim and send; down: claims to give up).
struct Change {
    route: String,
    limit: String,
    budget: String,
    kind: KeyKind,
    value: Vec<u8>,
    from: f64,
    to: f64,
    remaining: u64,
    reset_unix: u64,
    /// Until the budget would be full again: how long a claim holds.
    full_in_us: u64,
}

/// Where alerts go, and every share any of them names (ascending).
#[derive(Default)]
struct Rules {
    sinks: Vec<AlertSink>,
    shares: Vec<f64>,
}

/// The alerts of this process.
pub struct Alerter {
    /// Some sink is configured: the one load a request pays when none is.
    on: AtomicBool,
    rules: ArcSwap<Rules>,
    crossed: Box<[Mutex<HashMap<u64, Crossed>>]>,
    remembered: AtomicUsize,
    hasher: RandomState,
    queue: tokio::sync::mpsc::Sender<Change>,
    receiver: Mutex<Option<tokio::sync::mpsc::Receiver<Change>>>,
    metrics: Arc<Metrics>,
}

impl Alerter {
    pub fn new(sinks: &[AlertSink], metrics: Arc<Metrics>) -> Alerter {
        let (queue, receiver) = tokio::sync::mpsc::channel(QUEUE);
        let alerter = Alerter {
            on: AtomicBool::new(false),
            rules: ArcSwap::default(),
            crossed: (0..SHARDS).map(|_| Mutex::default()).collect(),
            remembered: AtomicUsize::new(0),
            hasher: RandomState::new(),
            queue,
            receiver: Mutex::new(Some(receiver)),
            metrics,
        };
        alerter.configure(sinks);
        alerter
    }

    /// Applies `alerts:` (at start and on reload).
    pub fn configure(&self, sinks: &[AlertSink]) {
        let mut shares: Vec<f64> = sinks.iter().flat_map(|s| s.at.iter().copied()).collect();
        shares.sort_by(f64::total_cmp);
        shares.dedup();
        self.on.store(!shares.is_empty(), Ordering::Relaxed);
        self.rules.store(Arc::new(Rules {
            sinks: sinks.to_vec(),
            shares,
        }));
    }

    /// True when some sink is configured.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// An admission on `route` left `limit`'s budget `key` as `verdict`'s headline says: notes
    /// a crossing (or a return below a share) for the sender task. Never waits.
    pub fn observe(&self, route: &str, limit: &RouteLimit, key: BudgetKey<'_>, verdict: &Ruling) {
        if !self.is_on() {
            return;
        }
        let rules = self.rules.load();
        let figures = verdict.headline;
        if rules.shares.is_empty() || figures.limit == 0 {
            return;
        }
        let spent = figures.limit.saturating_sub(figures.remaining) as f64;
        let total = figures.limit as f64;
        // Shares compared in units (0.8 of 5 is 4 spent), with room for the float's rounding.
        let crossed = rules
            .shares
            .iter()
            .copied()
            .take_while(|&share| spent >= share * total - 1e-9)
            .last()
            .unwrap_or(0.0);
        if crossed == 0.0 && self.remembered.load(Ordering::Relaxed) == 0 {
            return;
        }
        let hash = key.hash_with(&self.hasher);
        let now = wall_clock_us();
        let from = {
            let mut shard = self.crossed[(hash >> 60) as usize % SHARDS]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let until_us = now.saturating_add(figures.reset_after_us);
            let from = match shard.get_mut(&hash) {
                Some(c) if c.until_us > now => {
                    if c.share == crossed {
                        // Still past the same share: it would be full again later now.
                        c.until_us = until_us;
                        return;
                    }
                    c.share
                }
                // Ended: the budget would be full again by now.
                Some(_) if crossed == 0.0 => {
                    shard.remove(&hash);
                    self.remembered.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
                None if crossed == 0.0 => return,
                _ => 0.0,
            };
            if crossed == 0.0 {
                if shard.remove(&hash).is_some() {
                    self.remembered.fetch_sub(1, Ordering::Relaxed);
                }
            } else {
                if shard.len() >= MAX_REMEMBERED / SHARDS && !shard.contains_key(&hash) {
                    let before = shard.len();
                    shard.retain(|_, c| c.until_us > now);
                    self.remembered
                        .fetch_sub(before - shard.len(), Ordering::Relaxed);
                    if shard.len() >= MAX_REMEMBERED / SHARDS {
                        return;
                    }
                }
                let entry = Crossed {
                    share: crossed,
                    until_us,
                };
                if shard.insert(hash, entry).is_none() {
                    self.remembered.fetch_add(1, Ordering::Relaxed);
                }
            }
            from
        };
        // A full queue drops the crossing (counted): known before its strings are copied.
        if self.queue.capacity() == 0 {
            self.metrics.alert("dropped");
            return;
        }
        let change = Change {
            route: route.to_string(),
            limit: limit.name().to_string(),
            budget: key.budget.to_string(),
            kind: key.kind,
            value: key.value.to_vec(),
            from,
            to: crossed,
            remaining: figures.remaining,
            reset_unix: verdict.reset_unix_secs(),
            full_in_us: figures.reset_after_us,
        };
        if self.queue.try_send(change).is_err() {
            self.metrics.alert("dropped");
        }
    }
}

/// The sender task: claims each crossing in the shared store and delivers the ones it claimed;
/// gives claims up when a budget is back below a share. Returns when called a second time.
pub async fn run(alerter: Arc<Alerter>, limiter: Limiter) {
    let Some(mut changes) = alerter
        .receiver
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    else {
        return;
    };
    let client = client();
    let pending = Arc::new(AtomicUsize::new(0));
    while let Some(change) = changes.recv().await {
        let rules = alerter.rules.load_full();
        let digest = {
            use sha2::Digest;
            let mut d = sha2::Sha256::new();
            d.update(change.budget.as_bytes());
            d.update([0xff, change.kind as u8]);
            d.update(&change.value);
            crate::limiter::hex(&d.finalize()[..12])
        };
        // A claim is named by its share (`0.8`, as written), not its place in the list: the
        // same in every instance, whatever shares a reload added beside it.
        let claim = |share: f64| format!("alert:{digest}:{share}");
        // The configured shares in (low, high]. (A share a reload removed is not given up
        // here: its claim lapses when the budget would be full again.)
        let between = |low: f64, high: f64| {
            let shares = rules.shares.iter().copied();
            shares.filter(move |&share| share > low && share <= high)
        };
        if change.to < change.from {
            for share in between(change.to, change.from) {
                if let Err(e) = limiter.unclaim(&claim(share)).await {
                    tracing::debug!(error = %e, "alerts: a claim could not be given up");
                }
            }
            continue;
        }
        for share in between(change.from, change.to) {
            let claimed = match limiter.claim(&claim(share), change.full_in_us.max(1)).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::debug!(error = %e, "alerts: the store could not be asked; sending");
                    true
                }
            };
            if !claimed {
                continue;
            }
            let body = serde_json::json!({
                "route": change.route,
                "limit": change.limit,
                "identity_kind": identity_kind(change.kind),
                "identity": crate::control::label(change.kind, &change.value),
                "consumer": (change.kind == KeyKind::Consumer)
                    .then(|| String::from_utf8_lossy(&change.value).into_owned()),
                "threshold": share,
                "remaining": change.remaining,
                "reset": change.reset_unix,
            })
            .to_string();
            for sink in rules.sinks.iter().filter(|s| s.at.contains(&share)) {
                if pending.load(Ordering::Relaxed) >= MAX_PENDING {
                    alerter.metrics.alert("dropped");
                    continue;
                }
                pending.fetch_add(1, Ordering::Relaxed);
                let (client, url, body) = (client.clone(), sink.url.clone(), body.clone());
                let (metrics, pending) = (alerter.metrics.clone(), pending.clone());
                tokio::spawn(async move {
                    let outcome = deliver(&client, &url, body).await;
                    metrics.alert(outcome);
                    pending.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
}

/// An identity's kind as the write endpoints and `/budgets` name it (`jwt_subject`, not the
/// store key's `jwt`).
fn identity_kind(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::Jwt => "jwt_subject",
        other => other.as_str(),
    }
}

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

fn client() -> Client {
    let connector = crate::tls::https_or_http("alert webhooks", Some(ATTEMPT_TIMEOUT));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector)
}

/// POSTs `body` to `url` until a 2xx answers or the retries run out: `sent` or `failed`.
async fn deliver(client: &Client, url: &http::Uri, body: String) -> &'static str {
    let body = Bytes::from(body);
    for (attempt, pause) in std::iter::once(0).chain(BACKOFF_S).enumerate() {
        tokio::time::sleep(Duration::from_secs(pause)).await;
        let request = http::Request::post(url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::USER_AGENT, "floodgate-alerts")
            .body(Full::new(body.clone()));
        let Ok(request) = request else {
            return "failed";
        };
        match tokio::time::timeout(ATTEMPT_TIMEOUT, client.request(request)).await {
            Ok(Ok(response)) if response.status().is_success() => return "sent",
            Ok(Ok(response)) => {
                tracing::debug!(%url, attempt, status = %response.status(), "alert refused; retrying")
            }
            Ok(Err(e)) => {
                tracing::debug!(%url, attempt, error = %e, "alert not delivered; retrying")
            }
            Err(_) => tracing::debug!(%url, attempt, "alert timed out; retrying"),
        }
    }
    tracing::warn!(%url, "an alert could not be delivered in a minute of retries; dropped");
    "failed"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Figures, Verdict};

    fn verdict(limit: u64, remaining: u64, reset_after_us: u64) -> Ruling {
        let figures = Figures {
            limit,
            remaining,
            reset_after_us,
        };
        Verdict::from_decisions(wall_clock_us(), &[Decision::allow(figures, 0)])
            .unwrap()
            .ruling
    }

    /// (from, to) of each change queued so far.
    fn changes(alerter: &Alerter) -> Vec<(f64, f64)> {
        let mut receiver = alerter.receiver.lock().unwrap();
        let receiver = receiver.as_mut().unwrap();
        std::iter::from_fn(|| receiver.try_recv().ok())
            .map(|c| (c.from, c.to))
            .collect()
    }

    /// One fixed window of 10 an hour, for the API key `k` ([`key_of`]).
    fn ten_an_hour() -> crate::config::Budget {
        crate::config::override_budget(
            "api",
            "api",
            serde_json::json!([{"algorithm": "fixed_window", "limit": 10, "window": "1h"}]),
            false,
        )
        .unwrap()
    }

    fn key_of(limit: &RouteLimit) -> BudgetKey<'_> {
        BudgetKey {
            budget: limit.budget_id(),
            kind: KeyKind::ApiKey,
            value: b"k",
        }
    }

    #[test]
    fn identities_are_named_as_the_write_endpoints_name_them() {
        assert_eq!(identity_kind(KeyKind::Jwt), "jwt_subject");
        assert_eq!(identity_kind(KeyKind::ApiKey), "api_key");
        assert_eq!(identity_kind(KeyKind::Consumer), "consumer");
        assert_eq!(identity_kind(KeyKind::Ip), "ip");
    }

    #[test]
    fn a_crossing_is_queued_once_while_the_budget_stays_past_it_and_again_after_a_return() {
        let sinks = [AlertSink {
            url: "http://127.0.0.1:9/hook".parse().unwrap(),
            at: vec![0.8, 1.0],
        }];
        let alerter = Alerter::new(&sinks, Arc::new(Metrics::new()));
        let budget = ten_an_hour();
        let limit = &budget.limits[0];
        let key = key_of(limit);
        let hour = 3_600_000_000;
        for remaining in [9, 5, 3] {
            alerter.observe("api", limit, key, &verdict(10, remaining, hour));
        }
        assert_eq!(changes(&alerter), []);
        // 8 of 10 spent: 0.8; staying there queues nothing more; 10 of 10: 1.0.
        for remaining in [2, 2, 1, 0] {
            alerter.observe("api", limit, key, &verdict(10, remaining, hour));
        }
        assert_eq!(changes(&alerter), [(0.0, 0.8), (0.8, 1.0)]);
        // A new window: back below every share (the claims go), then past 0.8 again.
        alerter.observe("api", limit, key, &verdict(10, 9, hour));
        alerter.observe("api", limit, key, &verdict(10, 2, hour));
        assert_eq!(changes(&alerter), [(1.0, 0.0), (0.0, 0.8)]);
        // Past a share and never back, but the budget would be full again by now: a new crossing.
        alerter.observe("api", limit, key, &verdict(10, 9, 0));
        alerter.observe("api", limit, key, &verdict(10, 1, 0));
        alerter.observe("api", limit, key, &verdict(10, 1, 0));
        assert_eq!(changes(&alerter), [(0.8, 0.0), (0.0, 0.8), (0.0, 0.8)]);
    }

    /// A reload that adds shares below and above the one a budget is past: nothing is queued
    /// again for the share already crossed (nor for the one below it, passed before it
    /// existed); the next crossing is the share above.
    #[test]
    fn a_reload_that_adds_shares_neither_repeats_a_crossing_nor_misses_the_next() {
        let sink = |at: Vec<f64>| AlertSink {
            url: "http://127.0.0.1:9/hook".parse().unwrap(),
            at,
        };
        let alerter = Alerter::new(&[sink(vec![0.8])], Arc::new(Metrics::new()));
        let budget = ten_an_hour();
        let limit = &budget.limits[0];
        let key = key_of(limit);
        let hour = 3_600_000_000;
        alerter.observe("api", limit, key, &verdict(10, 2, hour));
        assert_eq!(changes(&alerter), [(0.0, 0.8)]);
        alerter.configure(&[sink(vec![0.5, 0.8, 1.0])]);
        alerter.observe("api", limit, key, &verdict(10, 1, hour));
        assert_eq!(changes(&alerter), []);
        alerter.observe("api", limit, key, &verdict(10, 0, hour));
        assert_eq!(changes(&alerter), [(0.8, 1.0)]);
        // A reload that removes the share a budget is past: below it now, the next share down
        // is where the budget stands (a change down: nothing sent).
        alerter.configure(&[sink(vec![0.5])]);
        alerter.observe("api", limit, key, &verdict(10, 0, hour));
        assert_eq!(changes(&alerter), [(1.0, 0.5)]);
    }
}
