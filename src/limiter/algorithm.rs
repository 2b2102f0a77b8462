//! The seven algorithms (five rates, a calendar quota and concurrency) as pure functions of (state, now,
//! parameters).
//!
//! Every algorithm works in two steps, so that several limits on one route can be decided
//! all-or-nothing:
//!
//! 1. [`State::check`] normalises the state to `now` (a step that changes no outcome: refilling,
//!    rolling a window, dropping expired log entries) and says what *would* happen if the request
//!    were admitted;
//! 2. [`State::commit`] records the admission, and is called only when every limit allowed.
//!
//! Time is an integer count of microseconds since the Unix epoch. All arithmetic is on integers
//! except the sliding window counter's weighted estimate, which uses `f64` with exactly the
//! operations, in exactly the order, of `src/limiter/lua/sliding_window_counter.lua`, so the
//! in-process store and the Redis scripts reach the same decisions bit for bit.

use std::collections::VecDeque;

use super::{AlgorithmKind, Decision, Figures, Limit};

/// The state one limit keeps for one budget.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Token and leaky bucket (GCRA): the theoretical arrival time, the instant at which the
    /// bucket is full again (token bucket) or the queue is empty (leaky bucket).
    Gcra { tat: u64 },
    /// Fixed window: the start of the current aligned window and how much it has spent.
    Window { start: u64, count: u64 },
    /// Sliding window log: one timestamp per admitted unit of cost, oldest first.
    Log { entries: VecDeque<u64> },
    /// Sliding window counter: the current aligned window and the counts of it and the one before.
    Counter { start: u64, curr: u64, prev: u64 },
    /// Concurrency: one lease per unit in flight, as (end, token), ending soonest first.
    Leases { leases: VecDeque<(u64, u64)> },
    /// Quota: the end of the calendar period counted in (it names the period) and how much it
    /// has spent.
    Quota { end: u64, count: u64 },
}

impl State {
    /// The empty state for an algorithm: a full bucket, an unused window, an empty log.
    pub fn new(kind: AlgorithmKind) -> Self {
        match kind {
            AlgorithmKind::TokenBucket | AlgorithmKind::LeakyBucket => State::Gcra { tat: 0 },
            AlgorithmKind::FixedWindow => State::Window { start: 0, count: 0 },
            AlgorithmKind::SlidingWindowLog => State::Log {
                entries: VecDeque::new(),
            },
            AlgorithmKind::SlidingWindowCounter => State::Counter {
                start: 0,
                curr: 0,
                prev: 0,
            },
            AlgorithmKind::Concurrency => State::Leases {
                leases: VecDeque::new(),
            },
            AlgorithmKind::Quota => State::Quota { end: 0, count: 0 },
        }
    }

    /// True when this state belongs to `kind` (a reload may change a limit's algorithm under
    /// a live key; the stores then start it afresh).
    pub fn fits(&self, kind: AlgorithmKind) -> bool {
        matches!(
            (self, kind),
            (
                State::Gcra { .. },
                AlgorithmKind::TokenBucket | AlgorithmKind::LeakyBucket
            ) | (State::Window { .. }, AlgorithmKind::FixedWindow)
                | (State::Log { .. }, AlgorithmKind::SlidingWindowLog)
                | (State::Counter { .. }, AlgorithmKind::SlidingWindowCounter)
                | (State::Leases { .. }, AlgorithmKind::Concurrency)
                | (State::Quota { .. }, AlgorithmKind::Quota)
        )
    }

    /// Brings the state up to `now` and decides whether `limit` admits one more request.
    /// Does not record the request: call [`State::commit`] for that.
    pub fn check(&mut self, limit: &Limit, now: u64) -> Decision {
        let algorithm = limit.algorithm();
        let kind = algorithm.kind();
        if !self.fits(kind) {
            *self = State::new(kind);
        }
        // The scripts' two numbers: each state below reads them as its algorithm's own.
        let (units, span) = algorithm.wire_at(now);
        let cost = u64::from(limit.cost());
        match self {
            State::Gcra { tat } => {
                let d = gcra_check(tat, units, span, cost, now);
                if kind == AlgorithmKind::TokenBucket && d.allowed() {
                    Decision::allow(
                        Figures {
                            limit: d.limit,
                            remaining: d.remaining,
                            reset_after_us: d.reset_after_us,
                        },
                        0,
                    )
                } else {
                    d
                }
            }
            State::Window { start, count } => {
                fixed_window_check(start, count, units, span, cost, now)
            }
            State::Log { entries } => sliding_log_check(entries, units, span, cost, now),
            State::Counter { start, curr, prev } => {
                sliding_counter_check(start, curr, prev, units, span, cost, now)
            }
            State::Leases { leases } => concurrency_check(leases, units, span, cost, now),
            State::Quota { end, count } => quota_check(end, count, units, span, cost, now),
        }
    }

    /// Records an admitted request, whose concurrency leases (if any) are named `lease`. Must
    /// follow a [`State::check`] at the same `now` that allowed.
    pub fn commit(&mut self, limit: &Limit, now: u64, lease: u64) {
        let cost = u64::from(limit.cost());
        let span = limit.algorithm().span_us();
        match self {
            State::Gcra { tat } => *tat += cost * span,
            State::Window { count, .. }
            | State::Counter { curr: count, .. }
            | State::Quota { count, .. } => *count += cost,
            State::Log { entries } => entries.extend(std::iter::repeat_n(now, cost as usize)),
            State::Leases { leases } => {
                leases.extend(std::iter::repeat_n((now + span, lease), cost as usize))
            }
        }
    }

    /// Settles a reservation this budget's limit made at `at` (µs, the deciding store's clock):
    /// gives back `settle.refund` units (if they still count: the bucket has not refilled past
    /// them, the window or period they were counted in is the current one) or takes
    /// `settle.charge` more, into debt if need be (a bucket's `tat` beyond its capacity, a
    /// window's count beyond its limit: the next requests are refused until it has refilled or
    /// turned past it). Mirrors `settle.lua` and `floodgate_settle__V`; the algorithms
    /// [`Limit::is_settled`](super::Limit::is_settled) limits can have (token bucket, fixed
    /// window, sliding window counter, quota) and no other.
    pub fn settle(&mut self, limit: &Limit, now: u64, settle: &super::Settlement) {
        let kind = limit.algorithm().kind();
        if !self.fits(kind) {
            *self = State::new(kind);
        }
        let units = u64::from(limit.algorithm().units());
        let (refund, charge, at) = settle.bounded(units);
        let span = limit.algorithm().span_us();
        match self {
            State::Gcra { tat } if kind == AlgorithmKind::TokenBucket => {
                *tat = (*tat).saturating_sub(refund * span).max(now);
                *tat = debt_capped(*tat, charge * span, now + 2 * units * span);
            }
            State::Window { start, count } => {
                let current = now - now % span;
                if *start == current && at - at % span == current {
                    *count = count.saturating_sub(refund);
                }
                if charge > 0 {
                    if *start != current {
                        *start = current;
                        *count = 0;
                    }
                    *count = debt_capped(*count, charge, 2 * units);
                }
            }
            State::Counter { start, curr, prev } => {
                let current = roll_counter(start, curr, prev, span, now);
                let reserved_in = at - at % span;
                if reserved_in == current {
                    *curr = curr.saturating_sub(refund);
                } else if reserved_in + span == current {
                    *prev = prev.saturating_sub(refund);
                }
                *curr = debt_capped(*curr, charge, 2 * units);
            }
            State::Quota { end, count } => {
                let (_, period_end) = limit.algorithm().wire_at(now);
                let (_, reserved_end) = limit.algorithm().wire_at(at);
                if *end == reserved_end && reserved_end == period_end {
                    *count = count.saturating_sub(refund);
                }
                if charge > 0 {
                    if *end != period_end {
                        *end = period_end;
                        *count = 0;
                    }
                    *count = debt_capped(*count, charge, 2 * units);
                }
            }
            _ => {}
        }
    }

    /// Gives back the concurrency leases named `lease` (a no-op for other algorithms).
    pub fn release(&mut self, lease: u64) {
        if let State::Leases { leases } = self {
            leases.retain(|&(_, token)| token != lease);
        }
    }

    /// Moves the end of the concurrency leases named `lease` to `until` (a no-op for other
    /// algorithms, and for a lease that already ended): a connection that holds its slot for
    /// its life renews it before it ends.
    pub fn renew(&mut self, lease: u64, until: u64) {
        if let State::Leases { leases } = self {
            let before = leases.len();
            leases.retain(|&(_, token)| token != lease);
            for _ in leases.len()..before {
                let at = leases.partition_point(|&(end, _)| end <= until);
                leases.insert(at, (until, lease));
            }
        }
    }

    /// The instant (µs) after which this state says nothing a fresh state would not: the key
    /// can then be forgotten. This is the TTL the Redis scripts set too.
    pub fn expires_at(&self, limit: &Limit) -> u64 {
        let span = limit.algorithm().span_us();
        match self {
            State::Gcra { tat } => *tat,
            State::Window { start, .. } => start + span,
            State::Log { entries } => entries.back().map_or(0, |newest| newest + span),
            State::Counter { start, .. } => start + 2 * span,
            State::Leases { leases } => leases.back().map_or(0, |&(end, _)| end),
            State::Quota { end, .. } => *end,
        }
    }
}

/// `used` plus a settlement's `charge`, but never past `cap` (a budget's debt is at most one
/// limit: what is used never exceeds twice the limit) unless it was already there. Mirrored by
/// `settle.lua` and `floodgate_settle__V`.
fn debt_capped(used: u64, charge: u64, cap: u64) -> u64 {
    used.saturating_add(charge).min(cap.max(used))
}

/// Concurrency: leases that have ended no longer count; a request passes if its `cost` more
/// slots fit. A denial's `Retry-After` is one second (the contract's figure: slots free up as
/// requests finish, which no clock predicts).
fn concurrency_check(
    leases: &mut VecDeque<(u64, u64)>,
    limit: u64,
    lease: u64,
    cost: u64,
    now: u64,
) -> Decision {
    while leases.front().is_some_and(|&(end, _)| end <= now) {
        leases.pop_front();
    }
    let count = leases.len() as u64;
    if count + cost <= limit {
        Decision::allow(
            Figures {
                limit,
                remaining: limit - count - cost,
                reset_after_us: lease,
            },
            0,
        )
    } else {
        let newest = leases.back().map_or(now, |&(end, _)| end);
        Decision::deny(
            Figures {
                limit,
                remaining: limit.saturating_sub(count),
                reset_after_us: newest - now,
            },
            1_000_000,
        )
    }
}

/// Token bucket and leaky bucket share the generic cell rate algorithm: `tat` is when the bucket
/// will be full again (equivalently, when the leaky bucket's queue will have drained). One unit of
/// cost is worth `interval` microseconds; the bucket holds `capacity × interval` of them.
fn gcra_check(tat: &mut u64, capacity: u64, interval: u64, cost: u64, now: u64) -> Decision {
    *tat = (*tat).max(now);
    let burst = capacity * interval;
    let new_tat = *tat + cost * interval;
    if new_tat - now <= burst {
        Decision::allow(
            Figures {
                limit: capacity,
                remaining: (burst - (new_tat - now)) / interval,
                reset_after_us: new_tat - now,
            },
            *tat - now,
        )
    } else {
        Decision::deny(
            Figures {
                limit: capacity,
                remaining: burst.saturating_sub(*tat - now) / interval,
                reset_after_us: *tat - now,
            },
            new_tat - now - burst,
        )
    }
}

fn fixed_window_check(
    start: &mut u64,
    count: &mut u64,
    limit: u64,
    window: u64,
    cost: u64,
    now: u64,
) -> Decision {
    let current = now - now % window;
    if *start != current {
        *start = current;
        *count = 0;
    }
    counted_window(*count, limit, cost, current + window - now)
}

/// A counted window's decision (fixed window, quota): `count` spent of `limit`, the window
/// ending in `reset_after_us`, when a denied request may retry too.
fn counted_window(count: u64, limit: u64, cost: u64, reset_after_us: u64) -> Decision {
    if count + cost <= limit {
        Decision::allow(
            Figures {
                limit,
                remaining: limit - count - cost,
                reset_after_us,
            },
            0,
        )
    } else {
        Decision::deny(
            Figures {
                limit,
                // (A settled cost's debt can take the count past the limit.)
                remaining: limit.saturating_sub(count),
                reset_after_us,
            },
            reset_after_us,
        )
    }
}

/// A fixed window whose bounds are the calendar's: `period_end` (from
/// [`Algorithm::wire_at`](super::Algorithm::wire_at)) names the period, and the count starts
/// again when it changes. Mirrors `quota.lua` and `quota.sql`.
fn quota_check(
    end: &mut u64,
    count: &mut u64,
    limit: u64,
    period_end: u64,
    cost: u64,
    now: u64,
) -> Decision {
    if *end != period_end {
        *end = period_end;
        *count = 0;
    }
    counted_window(*count, limit, cost, period_end.saturating_sub(now).max(1))
}

fn sliding_log_check(
    entries: &mut VecDeque<u64>,
    limit: u64,
    window: u64,
    cost: u64,
    now: u64,
) -> Decision {
    // An entry stamped `ts` stops counting at `ts + window`.
    while entries.front().is_some_and(|&ts| ts + window <= now) {
        entries.pop_front();
    }
    let count = entries.len() as u64;
    if count + cost <= limit {
        Decision::allow(
            Figures {
                limit,
                remaining: limit - count - cost,
                reset_after_us: window,
            },
            0,
        )
    } else {
        // The retry passes once the oldest `count + cost - limit` entries have expired.
        let needed = (count + cost - limit) as usize;
        let freeing = entries.get(needed - 1).copied().unwrap_or(now);
        let newest = entries.back().copied().unwrap_or(now);
        Decision::deny(
            Figures {
                limit,
                remaining: limit.saturating_sub(count),
                reset_after_us: (newest + window).saturating_sub(now),
            },
            (freeing + window).saturating_sub(now).max(1),
        )
    }
}

/// Brings a sliding window counter's counts to the window holding `now` (the current count
/// becomes the previous one when its window is the one just before); returns that window's
/// start. Mirrors `counter_read` in `sliding_window_counter.lua`.
fn roll_counter(start: &mut u64, curr: &mut u64, prev: &mut u64, window: u64, now: u64) -> u64 {
    let current = now - now % window;
    if *start != current {
        *prev = if *start + window == current { *curr } else { 0 };
        *curr = 0;
        *start = current;
    }
    current
}

/// Cloudflare's approximation: the previous window's count weighted by the share of it that
/// still overlaps the sliding window, plus the current window's count. It assumes the previous
/// window's requests were spread evenly, so it may admit slightly more or fewer than an exact log.
fn sliding_counter_check(
    start: &mut u64,
    curr: &mut u64,
    prev: &mut u64,
    limit: u64,
    window: u64,
    cost: u64,
    now: u64,
) -> Decision {
    let current = roll_counter(start, curr, prev, window, now);
    let elapsed = now - current;
    let w = window as f64;
    let estimate = (*prev as f64) * ((window - elapsed) as f64) / w + (*curr as f64);
    let allowed = estimate + (cost as f64) <= limit as f64;
    let spent = if allowed {
        estimate + cost as f64
    } else {
        estimate
    };
    let reset_after_us = if *curr + if allowed { cost } else { 0 } > 0 {
        current + 2 * window - now
    } else if *prev > 0 {
        current + window - now
    } else {
        0
    };
    let retry_after_us = if allowed {
        0
    } else if *curr + cost <= limit {
        // Wait, in this window, until the previous window's weight has fallen far enough.
        let t = (w - ((limit - *curr - cost) as f64) * w / (*prev as f64)).ceil() as u64;
        t.saturating_sub(elapsed).max(1)
    } else {
        // Wait for the next window, where this window's count becomes the weighted one.
        let t = (w - ((limit - cost) as f64) * w / (*curr as f64))
            .ceil()
            .max(0.0) as u64;
        window - elapsed + t
    };
    let remaining = (limit as f64 - spent).floor().max(0.0) as u64;
    if allowed {
        Decision::allow(
            Figures {
                limit,
                remaining,
                reset_after_us,
            },
            0,
        )
    } else {
        Decision::deny(
            Figures {
                limit,
                remaining,
                reset_after_us,
            },
            retry_after_us,
        )
    }
}

#[cfg(test)]
pub(crate) mod strategies;
#[cfg(test)]
mod tests;
