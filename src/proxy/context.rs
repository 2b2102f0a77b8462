//! One request's context: what each phase of the pipeline learns about the request, for the
//! phases after it (pingora's per-request `CTX`). It is made when the request arrives and ends
//! in the phase after the response ([`AfterResponse`]), which the response body runs when it
//! ends or is dropped.

use std::net::SocketAddr;
use std::time::Instant;

use http::Request;

use super::cost::CostMeter;
use crate::access_log;
use crate::adaptive::Permit;
use crate::answer::{Body, BoxError, Dialect};
use crate::limiter::{HeldLeases, Ruling};
use crate::metrics::DecisionLabel;
use crate::policy::LimitRef;
use bytes::Bytes;
use http_body_util::BodyExt;

/// What the limit phase decided for a request that goes on to the upstream.
pub(super) struct Admitted {
    /// The verdict whose figures go in the response headers, if any, and its limit.
    pub headline: Option<(Ruling, LimitRef)>,
    pub label: DecisionLabel,
    /// Concurrency leases the request holds until its response body ends.
    pub leases: Vec<HeldLeases>,
    /// What it reserved of settled costs, read and settled as the response goes by.
    pub costs: Vec<CostMeter>,
    /// The endpoint whose budget its limits `per: endpoint` spent: its first attempt goes there.
    pub endpoint: Option<std::sync::Arc<crate::upstream::Endpoint>>,
    /// What it spent, to give back if its client leaves before it is forwarded (kept only
    /// where the front end can tell: [`Context::left`]).
    pub spent: Option<Box<crate::decider::Spent>>,
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
            spent: None,
        }
    }
}

/// One request on its way through the phases.
pub(super) struct Context {
    /// When the request arrived.
    pub started: Instant,
    /// The access log's line, whose fields the phases fill in (`None`: the access log is off).
    pub log: Option<Box<access_log::Line>>,
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
    /// The variables of the route's header values, when they hold any (set once whose the
    /// request is is known).
    pub vars: Option<Box<crate::config::Vars>>,
    /// On a cached route: what the cache phase left for the upstream's answer.
    pub cache: Option<Box<super::cached::pending::Pending>>,
    /// How to tell that the client has left, where its front end can ([`ClientLeft`]).
    pub left: Option<super::body::ClientLeft>,
}

impl Context {
    /// The context of `req`, arriving from `peer`.
    pub fn new<B>(req: &Request<B>, peer: SocketAddr) -> Self {
        Context {
            started: Instant::now(),
            log: access_log::Line::start(req.method(), req.uri().path(), req.version()),
            peer,
            dialect: Dialect::of(req.headers(), Default::default()),
            cache: None,
            admitted: None,
            permit: None,
            refused: None,
            trace: None,
            balance_key: None,
            vars: None,
            left: req.extensions().get::<super::body::ClientLeft>().cloned(),
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
    pub line: Box<access_log::Line>,
    pub started: Instant,
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
            log.write(cost);
        }
    }
}

impl Drop for AfterResponse {
    /// Never run (no response went out, or the body was dropped): nothing was read to its end.
    fn drop(&mut self) {
        self.run(false);
    }
}

impl PendingLog {
    /// The request's outcome into its access log line, then the line written; `cost`,
    /// its settled costs (`cost.rs`).
    pub fn write(mut self, cost: Option<String>) {
        let line = &mut *self.line;
        line.decision = self.label;
        line.status = Some(self.status);
        line.grpc_status = self.grpc_status;
        line.latency_ms = Some(self.started.elapsed().as_secs_f64() * 1000.0);
        line.cost = cost.map(Into::into);
        line.write();
    }
}

/// `body`, which runs `after` (the phase after the response) when it ends (its last frame or an
/// error is read) or is dropped (the client went away).
pub(super) fn with_after_response(body: Body, after: AfterResponse) -> Body {
    Ending { inner: body, after }.boxed_unsync()
}

struct Ending {
    inner: Body,
    after: AfterResponse,
}

impl hyper::body::Body for Ending {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                this.after.frame(frame);
                // Trailers are a body's last frame: it is complete. (An HTTP/1.1 server stops
                // polling there and drops the body, whose `is_end_stream` may not say so yet: a
                // cost read from an HTTP/1.1 chunked trailer was settled at the reserve.)
                if frame.is_trailers() {
                    this.after.run(true);
                }
            }
            std::task::Poll::Ready(None) => this.after.run(true),
            std::task::Poll::Ready(Some(Err(_))) => this.after.run(false),
            std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Ending {
    /// Dropped before its end was polled: complete if the body says it has ended (hyper stops
    /// polling a body whose last frame it has), cut short otherwise (the client went away).
    fn drop(&mut self) {
        let complete = hyper::body::Body::is_end_stream(&self.inner);
        self.after.run(complete);
    }
}
