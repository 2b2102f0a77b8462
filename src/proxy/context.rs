//! One request's context: what each phase of the pipeline learns about the request, for the
//! phases after it (pingora's per-request `CTX`). It is made when the request arrives and ends
//! in the phase after the response ([`AfterResponse`]), which the response body runs when it
//! ends or is dropped.

use std::net::SocketAddr;
use std::time::Instant;

use http::Request;

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
}

impl Admitted {
    /// A request no limit applies to.
    pub fn unlimited() -> Self {
        Admitted {
            headline: None,
            label: DecisionLabel::Unlimited,
            leases: Vec::new(),
        }
    }

    /// An exempt request (`exempt:`): forwarded, no limit asked.
    pub fn exempt() -> Self {
        Admitted {
            label: DecisionLabel::Exempt,
            ..Admitted::unlimited()
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
        AfterResponse {
            leases: self
                .admitted
                .as_mut()
                .map(|a| std::mem::take(&mut a.leases))
                .unwrap_or_default(),
        }
    }
}

/// The phase after the response: run when the response body has ended (its last frame, its
/// trailers, or an error) or was dropped (the client went away). Concurrency leases are given
/// back here, so that a slot is held exactly as long as the response.
#[derive(Default)]
pub(super) struct AfterResponse {
    leases: Vec<HeldLeases>,
}

impl AfterResponse {
    /// True when there is nothing to do after the response (the body is then not wrapped).
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Runs the phase (once: a second call finds nothing left).
    pub fn run(&mut self) {
        // Dropping a held lease gives it back.
        self.leases.clear();
    }
}

impl Drop for AfterResponse {
    fn drop(&mut self) {
        self.run();
    }
}
