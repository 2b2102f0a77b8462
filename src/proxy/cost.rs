//! Costs known only after the response (`cost: {reserve, actual}`): what a request reserved is
//! held out of its budgets ([`Reservation`]) while the response streams; [`CostMeter`] reads
//! the real cost as the response goes by (a header or trailer, a JSON body's field, or the
//! usage an OpenAI-style event stream carries in its last `data:` event) and settles when the
//! response ends, in the phase after the response. A response that fails or is abandoned
//! settles at what is known: the reserve when nothing is.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

use crate::config::cost::{Field, Settled, lookup, units_of};
use crate::limiter::Reservation;
use crate::metrics::CostCounters;

/// The most of a JSON response body kept to read its cost from (a larger body settles at its
/// reserve).
const MAX_JSON_BODY: usize = 8 << 20;
/// The longest event-stream line kept (a longer one is skipped).
const MAX_EVENT_LINE: usize = 1 << 20;

/// One settled limit of an admitted request: where its cost is read, and its counters.
pub(super) struct Metered {
    pub settled: Arc<Settled>,
    pub counters: CostCounters,
    /// The limit's position in its route's `limits:` (the access log names it so).
    pub position: usize,
}

/// How the response body is read for costs.
enum BodyMode {
    /// No limit reads the body (or it is past its cap).
    Skip,
    /// A JSON document, kept whole until it ends.
    Json(Vec<u8>),
    /// `text/event-stream`: read line by line, each `data:` line's JSON looked at.
    Events(Vec<u8>),
}

/// The reading of one response's costs, and the reservation it settles.
pub(super) struct CostMeter {
    /// Taken by [`CostMeter::finish`]; still here when the request never reached a response
    /// (refused after its limits, by the upstream's learned limit): see `Drop`.
    reservation: Option<Reservation>,
    limits: Vec<Metered>,
    /// Per limit, the cost read so far (the last figure an event stream gave).
    found: Vec<Option<u64>>,
    body: BodyMode,
}

impl CostMeter {
    /// A meter for `reservation`, whose settled limits are `limits`, in the order reserved.
    pub fn new(reservation: Reservation, limits: Vec<Metered>) -> CostMeter {
        for (reserved, limit) in reservation.reserved().zip(&limits) {
            limit.counters.reserved.inc_by(reserved);
        }
        let found = vec![None; limits.len()];
        CostMeter {
            reservation: Some(reservation),
            limits,
            found,
            body: BodyMode::Skip,
        }
    }

    /// The response head: costs in headers, and how to read the body.
    pub fn head(&mut self, headers: &HeaderMap) {
        self.read_headers(headers);
        let reads_json = self
            .limits
            .iter()
            .any(|l| matches!(l.settled.actual, Field::Json(_)));
        if !reads_json {
            return;
        }
        let events = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
        self.body = if events {
            BodyMode::Events(Vec::new())
        } else {
            BodyMode::Json(Vec::new())
        };
    }

    /// A piece of the response body.
    pub fn data(&mut self, bytes: &Bytes) {
        match &mut self.body {
            BodyMode::Skip => {}
            BodyMode::Json(kept) => {
                if kept.len() + bytes.len() > MAX_JSON_BODY {
                    self.body = BodyMode::Skip;
                } else {
                    kept.extend_from_slice(bytes);
                }
            }
            BodyMode::Events(line) => {
                let mut rest = &bytes[..];
                while let Some(end) = memchr::memchr(b'\n', rest) {
                    if line.len() + end <= MAX_EVENT_LINE {
                        line.extend_from_slice(&rest[..end]);
                        let complete = std::mem::take(line);
                        Self::event_line(&self.limits, &mut self.found, &complete);
                    } else {
                        line.clear();
                    }
                    rest = &rest[end + 1..];
                }
                if line.len() + rest.len() <= MAX_EVENT_LINE {
                    line.extend_from_slice(rest);
                } else {
                    line.clear();
                }
            }
        }
    }

    /// The response's trailers: costs a trailer carries.
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        self.read_headers(trailers);
    }

    fn read_headers(&mut self, headers: &HeaderMap) {
        for (limit, found) in self.limits.iter().zip(&mut self.found) {
            if let Field::Header(name) = &limit.settled.actual
                && let Some(n) = headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
            {
                *found = Some(n);
            }
        }
    }

    /// One event-stream line: a `data:` line whose JSON has a limit's field sets its cost (a
    /// later one replaces it: the usage comes last).
    fn event_line(limits: &[Metered], found: &mut [Option<u64>], line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data.first() != Some(&b'{') {
            return; // `[DONE]`, or not JSON
        }
        let Ok(event) = serde_json::from_slice::<Map<String, Value>>(data) else {
            return;
        };
        Self::read_json(limits, found, &event);
    }

    fn read_json(limits: &[Metered], found: &mut [Option<u64>], document: &Map<String, Value>) {
        for (limit, found) in limits.iter().zip(found.iter_mut()) {
            if let Field::Json(path) = &limit.settled.actual
                && let Some(n) = lookup(document, path).and_then(units_of)
            {
                *found = Some(n);
            }
        }
    }

    /// The response ended (or was abandoned): each limit settles at the cost read, or at its
    /// reserve. Returns, per limit, its position, reserve and settled cost (for the access log).
    pub fn finish(mut self) -> Vec<(usize, u64, u64)> {
        match std::mem::replace(&mut self.body, BodyMode::Skip) {
            BodyMode::Json(kept) if !kept.is_empty() => {
                if let Ok(document) = serde_json::from_slice::<Map<String, Value>>(&kept) {
                    Self::read_json(&self.limits, &mut self.found, &document);
                }
            }
            BodyMode::Events(line) if !line.is_empty() => {
                Self::event_line(&self.limits, &mut self.found, &line);
            }
            _ => {}
        }
        let Some(reservation) = self.reservation.take() else {
            return Vec::new();
        };
        let reserved: Vec<u64> = reservation.reserved().collect();
        let actual: Vec<u64> = reserved
            .iter()
            .zip(&self.found)
            .map(|(&reserved, found)| found.unwrap_or(reserved))
            .collect();
        let mut figures = Vec::with_capacity(self.limits.len());
        for ((limit, &reserved), &actual) in self.limits.iter().zip(&reserved).zip(&actual) {
            limit.counters.settled.inc_by(actual);
            limit
                .counters
                .refunded
                .inc_by(reserved.saturating_sub(actual));
            limit
                .counters
                .charged
                .inc_by(actual.saturating_sub(reserved));
            figures.push((limit.position, reserved, actual));
        }
        reservation.settle(&actual);
        figures
    }
}

impl Drop for CostMeter {
    /// A request that never had a response (refused after its limits reserved) keeps its
    /// reserve, as one whose cost is unknown does: counted as settled at it.
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            for (reserved, limit) in reservation.reserved().zip(&self.limits) {
                limit.counters.settled.inc_by(reserved);
            }
        }
    }
}

/// What a request reserves in one budget's settled limits: each such ask's limit costing its
/// reserve. Empty (and nothing allocated) for a budget without one.
pub(super) struct Reserves {
    /// Per ask, in order: the settled limit's index in the budget and its costed limit.
    costed: Vec<Option<(usize, crate::limiter::Limit)>>,
    settled: Vec<Arc<Settled>>,
    positions: Vec<usize>,
}

impl Reserves {
    /// The reserves of `asks` (of `budget`) for a request with `headers` and JSON body `json`.
    pub fn of(
        budget: &crate::config::Budget,
        asks: &crate::policy::Asks<'_>,
        headers: &HeaderMap,
        json: Option<&Map<String, Value>>,
    ) -> Reserves {
        let mut out = Reserves {
            costed: Vec::new(),
            settled: Vec::new(),
            positions: Vec::new(),
        };
        if !budget.limits.iter().any(|l| l.settled.is_some()) {
            return out;
        }
        for (i, ask) in asks.asks.iter().enumerate() {
            let index = asks.positions[i];
            let costed = budget.limits.get(index).and_then(|limit| {
                let settled = limit.settled.as_ref()?;
                out.settled.push(settled.clone());
                out.positions.push(limit.position());
                Some((index, ask.limit.costing(settled.reserve.of(headers, json))))
            });
            out.costed.push(costed);
        }
        out
    }

    /// `asks` with each settled limit costing its reserve (`None`: none is settled).
    pub fn asks<'a>(
        &'a self,
        asks: &[crate::limiter::Ask<'a>],
    ) -> Option<Vec<crate::limiter::Ask<'a>>> {
        if self.settled.is_empty() {
            return None;
        }
        Some(
            asks.iter()
                .zip(&self.costed)
                .map(|(ask, costed)| match costed {
                    Some((_, limit)) => crate::limiter::Ask {
                        limit,
                        key: ask.key,
                    },
                    None => *ask,
                })
                .collect(),
        )
    }

    /// The settled limits, in the order asked (the order a [`Reservation`] holds them), with
    /// their counters from `costs` (by limit position).
    pub fn metered(&self, costs: &[Option<CostCounters>]) -> Vec<Metered> {
        self.settled
            .iter()
            .zip(&self.positions)
            .map(|(settled, &position)| Metered {
                settled: settled.clone(),
                counters: costs.get(position).cloned().flatten().unwrap_or_default(),
                position,
            })
            .collect()
    }
}
