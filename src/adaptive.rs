//! Adaptive concurrency (`adaptive_concurrency:` on a route): learn how many requests in flight an
//! upstream can take from the latencies floodgate sees, and hold the rest back, by priority.
//!
//! # The controller
//!
//! Additive increase, multiplicative decrease on latency, against a baseline measured
//! passively. Every [`WINDOW`] (once it holds [`MIN_SAMPLES`] responses, or at once on an
//! overload signal) it looks at the window's mean latency `short` and at the **baseline**: the
//! lowest window mean of the last [`BASELINE_HORIZON`].
//!
//! - upstream errors (502, 503, 504) or timeouts in the window: `limit × BACKOFF`;
//! - `short > TOLERANCE × baseline` (requests queue in the upstream): `limit × BACKOFF`;
//! - else, if the limit bound in the window (a request found no room, or in flight reached
//!   [`BUSY`] of it): `limit + max(1, √limit / 2)`; if not, the limit stays.
//!
//! within `[min_limit, max_limit]`. Why this shape, against the anchors' known failure modes:
//!
//! - **No probing window.** Envoy re-measures its minimum latency by pinning concurrency to a
//!   low value for a while, and its users see 503s in those windows. Here the sawtooth is the
//!   probe: a decrease to [`BACKOFF`] of a limit that queued at most [`TOLERANCE`] × the
//!   baseline takes the requests in flight below what the upstream serves at once
//!   (0.7 × 1.3 < 1), so every cycle shows the unqueued latency again and the baseline stays
//!   true, with no window pinned low. Requests over the limit wait in floodgate (up to
//!   `queue_timeout`), not in the upstream's queue.
//! - **No creep.** Gradient2 compares with a long average of latency, which under constant
//!   saturation drifts up to the queued latency and lets the limit grow without end. A minimum
//!   over a horizon that always contains a trough does not drift.
//! - **No growth under timeouts** (concurrency-limits issue #137: Gradient2 grows when every
//!   request times out, since a timeout yields no latency sample). Errors and timeouts are
//!   overload signals: the limit only falls.
//! - **No growth while idle.** Demand below the limit says nothing about capacity.
//! - **A slower upstream becomes the norm within the horizon.** When the upstream itself slows
//!   (a cold cache, a deploy), latency stays high however far the limit falls; once the
//!   horizon holds only slow windows, the baseline is the new latency and the limit grows back
//!   to what the upstream now serves: the learned limit settles within [`BASELINE_HORIZON`]
//!   plus the climb.
//!
//! # The gate
//!
//! A [`Gate`] per upstream admits requests while fewer than the limit are in flight, by
//! priority: `high` may use the whole limit, `normal` [`NORMAL_SHARE`] of it and `low`
//! [`LOW_SHARE`], and a freed slot goes to the longest-waiting `high` request first, then
//! `normal`, then `low`. So a flood of low-priority traffic never holds more than its share, and
//! high-priority requests always find room. A request that finds no slot within
//! `queue_timeout` is refused ([`Gate::acquire`] returns `None`): the proxy answers 503
//! `upstream_overloaded` without touching the upstream.
//!
//! Within a priority, waiting requests are served first come, first served, or with
//! `fairness:` by flow ([`fair`]): fair queues dealt in turn, a full queue shedding at once, so
//! one flooding client cannot starve the others at its priority.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::sync::oneshot;

use crate::limiter::Clock;

/// How often the limit is reconsidered (at the latest; see [`MIN_SAMPLES`]).
pub const WINDOW: Duration = Duration::from_millis(100);
/// Responses a window needs before the limit moves on latency (errors move it at once).
pub const MIN_SAMPLES: u32 = 5;
/// How far back the baseline (the lowest window mean latency) looks.
pub const BASELINE_HORIZON: Duration = Duration::from_secs(5);
/// How much slower than the baseline a window may be before the limit falls.
pub const TOLERANCE: f64 = 1.3;
/// The factor a window of overload cuts the limit by.
pub const BACKOFF: f64 = 0.7;
/// The share of the limit in flight that makes a window busy enough to grow the limit.
pub const BUSY: f64 = 0.8;
/// The shares of the limit normal and low priority requests may hold.
pub const NORMAL_SHARE: f64 = 0.9;
pub const LOW_SHARE: f64 = 0.75;

/// How much of the upstream's capacity a request may take, and how soon it is shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    fn index(self) -> usize {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    /// The share of the limit requests of this priority may hold.
    fn share(self) -> f64 {
        match self {
            Priority::High => 1.0,
            Priority::Normal => NORMAL_SHARE,
            Priority::Low => LOW_SHARE,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// The bounds of a learned limit (`adaptive_concurrency:`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub min_limit: u32,
    pub max_limit: u32,
    pub queue_timeout: Duration,
    /// Fair queues for the waiting requests (`fairness:` other than `none`); `None`: first
    /// come, first served within a priority.
    pub fair: Option<FairBounds>,
}

/// The fair queues' shape: flows shuffle-sharded onto `queues` queues of at most
/// `queue_length` waiting requests each ([`fair`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairBounds {
    pub queues: u32,
    pub queue_length: u32,
}

/// What makes requests one flow for the fair queues (`fairness:`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Fairness {
    /// First come, first served within a priority.
    #[default]
    None,
    /// Whose the request is, as for limits.
    Identity,
    /// A request header's value.
    Header(http::HeaderName),
    /// A verified token's claim.
    Claim(String),
}

/// What became of a request the gate let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The upstream answered (not 502/503/504) after this long.
    Answered(Duration),
    /// The upstream failed, refused or timed out: an overload signal.
    Overloaded,
    /// The client went away, or the request never reached the upstream: no signal.
    Dropped,
}

/// The controller: the limit, the recent windows' latencies, and the window being measured.
/// Pure: time comes in as arguments (µs), so tests drive it on an injected clock.
#[derive(Debug, Clone)]
pub struct Controller {
    bounds: Bounds,
    limit: f64,
    /// (window end µs, mean latency µs) of the windows within the baseline's horizon.
    history: VecDeque<(u64, f64)>,
    window_start: u64,
    samples: u32,
    sum_us: f64,
    errors: u32,
    /// The most requests in flight seen in this window.
    peak: u32,
    /// A request found no room in this window (it waited, or was refused).
    bound: bool,
}

impl Controller {
    /// A controller starting at `min_limit` at time `now` (µs).
    pub fn new(bounds: Bounds, now: u64) -> Self {
        Controller {
            bounds,
            limit: f64::from(bounds.min_limit),
            history: VecDeque::new(),
            window_start: now,
            samples: 0,
            sum_us: 0.0,
            errors: 0,
            peak: 0,
            bound: false,
        }
    }

    /// The limit now (whole requests).
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// The baseline latency: the lowest window mean within the horizon, once measured.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline_us()
            .map(|us| Duration::from_micros(us as u64))
    }

    fn baseline_us(&self) -> Option<f64> {
        self.history.iter().map(|&(_, us)| us).reduce(f64::min)
    }

    /// Notes how many requests are in flight now (for the "busy" rule).
    pub fn in_flight(&mut self, n: u32) {
        self.peak = self.peak.max(n);
    }

    /// Notes that a request found no room under the limit (its priority's share of it): the
    /// limit binds, whatever the count in flight.
    pub fn bound(&mut self) {
        self.bound = true;
    }

    /// Records one outcome at `now`; returns the new limit when this closed a window that moved it.
    pub fn record(&mut self, outcome: Signal, now: u64) -> Option<u32> {
        match outcome {
            Signal::Answered(rtt) => {
                self.samples += 1;
                self.sum_us += rtt.as_micros() as f64;
            }
            Signal::Overloaded => self.errors += 1,
            Signal::Dropped => return None,
        }
        let elapsed = now.saturating_sub(self.window_start);
        let closes = self.errors > 0
            || (elapsed >= WINDOW.as_micros() as u64 && self.samples >= MIN_SAMPLES);
        if !closes {
            return None;
        }
        let before = self.limit();
        let (min, max) = (
            f64::from(self.bounds.min_limit),
            f64::from(self.bounds.max_limit),
        );
        let short = (self.samples > 0).then(|| self.sum_us / f64::from(self.samples));
        let horizon = BASELINE_HORIZON.as_micros() as u64;
        while self
            .history
            .front()
            .is_some_and(|&(end, _)| end + horizon < now)
        {
            self.history.pop_front();
        }
        let baseline = self.baseline_us();
        if let Some(short) = short
            && self.errors == 0
        {
            self.history.push_back((now, short));
        }
        let queued = matches!((short, baseline), (Some(s), Some(b)) if s > TOLERANCE * b);
        if self.errors > 0 || queued {
            self.limit = (self.limit * BACKOFF).max(min);
        } else if self.bound || f64::from(self.peak) >= BUSY * self.limit.floor() {
            self.limit = (self.limit + (self.limit.sqrt() / 2.0).max(1.0)).min(max);
        }
        self.window_start = now;
        self.samples = 0;
        self.sum_us = 0.0;
        self.errors = 0;
        self.peak = 0;
        self.bound = false;
        let after = self.limit();
        (after != before).then_some(after)
    }
}

/// The learned limits of one upstream's endpoints: a [`Gate`] per endpoint, made at its first
/// request, so that one slow replica's limit does not shrink the others' (each learns from its
/// own latencies). Routes to one upstream share it, and a reload that keeps the bounds keeps it.
pub struct EndpointGates {
    bounds: Bounds,
    /// `floodgate_adaptive_limit{upstream}`'s gauge for a label.
    gauge: Box<dyn Fn(&str) -> prometheus_client::metrics::gauge::Gauge + Send + Sync>,
    /// By endpoint name (`address:port`).
    gates: Mutex<std::collections::HashMap<String, Arc<Gate>>>,
}

impl EndpointGates {
    pub fn new(
        bounds: Bounds,
        gauge: impl Fn(&str) -> prometheus_client::metrics::gauge::Gauge + Send + Sync + 'static,
    ) -> EndpointGates {
        EndpointGates {
            bounds,
            gauge: Box::new(gauge),
            gates: Mutex::default(),
        }
    }

    /// The bounds every endpoint's gate has.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// The gate of the endpoint named `name`, made on first use with the gauge labelled
    /// `label()` (its `scheme://address:port`).
    pub fn of(&self, name: &str, label: impl FnOnce() -> String) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gate) = gates.get(name) {
            return gate.clone();
        }
        let label = label();
        let gate = Gate::new(
            label.as_str().into(),
            self.bounds,
            Arc::new(crate::limiter::MonotonicClock::default()),
            (self.gauge)(&label),
        );
        gates.insert(name.to_string(), gate.clone());
        gate
    }
}

/// Admits requests to one upstream while fewer than the learned limit are in flight.
pub struct Gate {
    name: Arc<str>,
    clock: Arc<dyn Clock>,
    state: Mutex<GateState>,
    /// The learned limit, for `floodgate_adaptive_limit{upstream}`.
    gauge: prometheus_client::metrics::gauge::Gauge,
}

struct GateState {
    controller: Controller,
    in_flight: u32,
    /// The waiting requests of each priority.
    waiting: [fair::FairQueues<oneshot::Sender<()>>; 3],
}

/// A slot in flight; gives it back when dropped, recording [`Permit::finish`]'s outcome.
pub struct Permit {
    gate: Arc<Gate>,
    outcome: Signal,
}

impl Permit {
    /// What became of the request (the default, if never called: [`Signal::Dropped`]).
    pub fn finish(&mut self, outcome: Signal) {
        self.outcome = outcome;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release(self.outcome);
    }
}

impl Gate {
    /// A gate for the upstream `name`, its limit reported on `gauge`.
    pub fn new(
        name: Arc<str>,
        bounds: Bounds,
        clock: Arc<dyn Clock>,
        gauge: prometheus_client::metrics::gauge::Gauge,
    ) -> Arc<Gate> {
        let now = clock.now_us();
        gauge.set(i64::from(bounds.min_limit));
        Arc::new(Gate {
            name,
            clock,
            state: Mutex::new(GateState {
                controller: Controller::new(bounds, now),
                in_flight: 0,
                waiting: std::array::from_fn(|_| match bounds.fair {
                    Some(fair) => {
                        fair::FairQueues::new(fair.queues as usize, fair.queue_length as usize)
                    }
                    None => fair::FairQueues::fifo(),
                }),
            }),
            gauge,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The learned limit now.
    pub fn limit(&self) -> u32 {
        self.lock().controller.limit()
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.lock().in_flight
    }

    /// The bounds this gate was made with.
    pub fn bounds(&self) -> Bounds {
        self.lock().controller.bounds
    }

    /// A slot for a request of `priority` (of `flow`, for fair queues), waiting up to the
    /// gate's `queue_timeout`; `None` when none freed in time, or its queue is full (the
    /// request must not reach the upstream).
    pub async fn acquire(
        self: &Arc<Self>,
        priority: Priority,
        flow: Option<u64>,
    ) -> Option<Permit> {
        let (queue, waiter) = {
            let mut state = self.lock();
            let queued_ahead = state.waiting[..=priority.index()]
                .iter()
                .any(|q| !q.is_empty());
            if !queued_ahead && state.has_room(priority) {
                state.admit();
                return Some(self.permit());
            }
            state.controller.bound();
            let (tx, rx) = oneshot::channel();
            // A full queue sheds at once: its flow is the one waiting most.
            let queue = state.waiting[priority.index()].push(flow, tx).ok()?;
            (queue, rx)
        };
        // From here the place is given up however the wait ends, the request's future dropped
        // (its client gone) included: see [`Queued`].
        let mut queued = Queued {
            gate: self,
            priority,
            queue,
            rx: waiter,
            armed: true,
        };
        let timeout = self.bounds().queue_timeout;
        if let Ok(Ok(())) = tokio::time::timeout(timeout, &mut queued.rx).await {
            // Granted: `dispatch` counted the slot in flight already.
            queued.armed = false;
            return Some(self.permit());
        }
        // Timed out. Closing the receiver makes any later grant fail (dispatch then frees the
        // slot); a grant that came in between is taken, or its slot would be lost.
        queued.rx.close();
        if queued.rx.try_recv().is_ok() {
            queued.armed = false;
            return Some(self.permit());
        }
        None
    }

    fn permit(self: &Arc<Self>) -> Permit {
        Permit {
            gate: self.clone(),
            outcome: Signal::Dropped,
        }
    }

    fn release(&self, outcome: Signal) {
        let now = self.clock.now_us();
        let mut state = self.lock();
        state.in_flight -= 1;
        if let Some(limit) = state.controller.record(outcome, now) {
            self.gauge.set(i64::from(limit));
            tracing::debug!(upstream = %self.name, limit, "adaptive concurrency limit changed");
        }
        state.dispatch();
    }
}

/// A request waiting at a gate: when the wait ends without a grant taken (a timeout, or the
/// request's future dropped while it waits), its place leaves the queue at once (a bounded fair
/// queue must not fill with requests nobody waits for), and a grant that came as it gave up is
/// handed back (its slot would be lost otherwise).
struct Queued<'a> {
    gate: &'a Arc<Gate>,
    priority: Priority,
    queue: usize,
    rx: oneshot::Receiver<()>,
    armed: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.rx.close();
        if self.rx.try_recv().is_ok() {
            // Granted as it gave up: the slot goes back through a permit's release.
            drop(self.gate.permit());
        }
        let mut state = self.gate.lock();
        state.waiting[self.priority.index()].retain(self.queue, |tx| !tx.is_closed());
    }
}

impl GateState {
    fn has_room(&self, priority: Priority) -> bool {
        let cap = (f64::from(self.controller.limit()) * priority.share())
            .floor()
            .max(1.0);
        f64::from(self.in_flight) < cap
    }

    fn admit(&mut self) {
        self.in_flight += 1;
        let n = self.in_flight;
        self.controller.in_flight(n);
    }

    /// Gives freed slots to the waiters, highest priority first.
    fn dispatch(&mut self) {
        for priority in [Priority::High, Priority::Normal, Priority::Low] {
            while self.has_room(priority) {
                let Some(tx) = self.waiting[priority.index()].pop() else {
                    break;
                };
                self.admit();
                if tx.send(()).is_err() {
                    // That waiter timed out meanwhile: the slot is free again.
                    self.in_flight -= 1;
                }
            }
            // A higher priority still waiting keeps lower ones out.
            if !self.waiting[priority.index()].is_empty() {
                break;
            }
        }
    }
}

pub mod fair;

#[cfg(test)]
mod tests;
