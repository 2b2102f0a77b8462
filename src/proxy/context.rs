//! One request's context: what each phase of the pipeline learns about the request, for the
//! phases after it (pingora's per-request `CTX`). It is made when the request arrives and ends
//! in the phase after the response ([`AfterResponse`]), which the response body runs when it
//! ends or is dropped.

use std::net::SocketAddr;
use std::time::Instant;

use http::Request;

use super::cost::CostMeter;
use super::response::Dialect;
use crate::access_log;
use crate::adaptive::Permit;
use crate::limiter::{HeldLeases, Verdict};
use crate::metrics::DecisionLabel;
use crate::policy::LimitRef;

/// What the limit phase decided for a request that goes on to the upstream.
pub(super) struct Admitted {
    /// The verdict whose figures go in the response headers, if any, and its limit.
    pub headline: Option<(Verdict, LimitRef)>,
    pub label: DecisionLabel,
    /// Concurrency leases the request holds until its response body ends.
    pub leases: Vec<HeldLeases>,
    /// What it reserved of settled costs, read and settled as the response goes by.
    pub costs: Vec<CostMeter>,
    /// The endpoint whose budget its limits `per: endpoint` spent: its first attempt goes there.
    pub endpoint: Option<std::sync::Arc<crate::upstream::Endpoint>>,
}

impl Admitted {
    /// A request no limit applies to.
    pub fn unlimited() -> Self {
        Admitted {
            headline: None,
            label: DecisionLabel::Unlimited,
            leases: Vec::new(),
            costs: Vec::new(),
            endpoint: None,
        }
    }
}

/// One request on its way through the phases.
pub(super) struct Context {
    /// When the request arrived.
    pub started: Instant,
    /// The access log's span, whose fields the phases record.
    pub span: tracing::Span,
    /// The TCP peer.
    pub peer: SocketAddr,
    /// HTTP's or gRPC's words for floodgate's own answers (set once routed).
    pub dialect: Dialect,
    /// Set by the limit phase when it lets the request through.
    pub admitted: Option<Admitted>,
    /// Set by the gate phase: the request's slot under its upstream's learned limit.
    pub permit: Option<Permit>,
    /// Set when a phase refused the request: the refusal's label, if it has one.
    refused: Option<Option<DecisionLabel>>,
    /// The request's OpenTelemetry trace, when telemetry is on.
    pub trace: Option<crate::telemetry::Trace>,
    /// What `balance: hash` hashes for this request (its identity), once known.
    pub balance_key: Option<u64>,
}

impl Context {
    /// The context of `req`, arriving from `peer`.
    pub fn new<B>(req: &Request<B>, peer: SocketAddr) -> Self {
        Context {
            started: Instant::now(),
            span: access_log::span(req.method(), req.uri().path()),
            peer,
            dialect: Dialect::of(req.headers(), Default::default()),
            admitted: None,
            permit: None,
            refused: None,
            trace: None,
            balance_key: None,
        }
    }

    /// A phase refused the request, labelled `label` (a refusal that is no limiting decision,
    /// such as a malformed request, has none).
    pub fn refuse(&mut self, label: Option<DecisionLabel>) {
        self.refused = Some(label);
    }

    /// The decision's label, derived here and nowhere else: a refusal's own, or what the limit
    /// phase admitted the request as. `None` before routing and for refusals that decided
    /// nothing.
    pub fn label(&self) -> Option<DecisionLabel> {
        match self.refused {
            Some(label) => label,
            None => self.admitted.as_ref().map(|a| a.label),
        }
    }

    /// What the phase after the response has to do, taken out of the context.
    pub fn after_response(&mut self) -> AfterResponse {
        let admitted = self.admitted.as_mut();
        let (leases, costs) = admitted
            .map(|a| (std::mem::take(&mut a.leases), std::mem::take(&mut a.costs)))
            .unwrap_or_default();
        AfterResponse {
            leases,
            costs,
            permit: self.permit.take(),
            log: None,
        }
    }
}

/// The access log line of a request whose line waits for the response to end (its settled
/// costs go in it).
pub(super) struct PendingLog {
    pub span: tracing::Span,
    pub started: Instant,
    pub route: std::sync::Arc<str>,
    pub status: u16,
    pub grpc_status: Option<u8>,
    pub label: Option<DecisionLabel>,
}

/// The phase after the response: run when the response body has ended (its last frame, its
/// trailers, or an error) or was dropped (the client went away). Concurrency leases are given
/// back here, so that a slot is held exactly as long as the response.
#[derive(Default)]
pub(super) struct AfterResponse {
    leases: Vec<HeldLeases>,
    /// Settled costs: read from the response as it goes by, settled when it ends.
    costs: Vec<CostMeter>,
    /// A gRPC call's slot under its upstream's learned limit, held until its trailers say how
    /// it ended (UNAVAILABLE or RESOURCE_EXHAUSTED: an overload signal).
    permit: Option<Permit>,
    /// The access log line, when it waits for the settled costs.
    pub log: Option<PendingLog>,
}

impl AfterResponse {
    /// True when there is nothing to do after the response (the body is then not wrapped).
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty() && self.costs.is_empty() && self.permit.is_none()
    }

    /// True when settled costs are read from this response.
    pub fn meters_costs(&self) -> bool {
        !self.costs.is_empty()
    }

    /// One frame of the response body going by.
    pub fn frame(&mut self, frame: &hyper::body::Frame<bytes::Bytes>) {
        if let (Some(permit), Some(trailers)) = (&mut self.permit, frame.trailers_ref())
            && crate::grpc::status_of(trailers).is_some_and(crate::grpc::is_overload)
        {
            permit.finish(crate::adaptive::Signal::Overloaded);
        }
        for meter in &mut self.costs {
            if let Some(data) = frame.data_ref() {
                meter.data(data);
            } else if let Some(trailers) = frame.trailers_ref() {
                meter.trailers(trailers);
            }
        }
    }

    /// Runs the phase (once: a second call finds nothing left). `complete`: the response's end
    /// was read (not cut short by an upstream reset, an error, or the client going away).
    pub fn run(&mut self, complete: bool) {
        // Dropping a held lease gives it back, and a permit.
        self.leases.clear();
        self.permit = None;
        let mut figures = Vec::new();
        for meter in self.costs.drain(..) {
            figures.extend(meter.finish(complete));
        }
        if let Some(log) = self.log.take() {
            let cost = (!figures.is_empty()).then(|| crate::access_log::cost_field(&figures));
            super::log_line(&log, cost.as_deref());
        }
    }
}

impl Drop for AfterResponse {
    /// Never run (no response went out, or the body was dropped): nothing was read to its end.
    fn drop(&mut self) {
        self.run(false);
    }
}
