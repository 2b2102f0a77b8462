//! One request's spans: the SERVER span's context and, when it is sampled, its record (name,
//! start, attributes), filled in as the request goes and made into the SDK's `SpanData` once
//! as it ends; the CLIENT children made from it; and the `traceparent` the upstream hears.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, Method};
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceState};
use opentelemetry_sdk::trace::SpanData;

use super::Telemetry;

/// The most attributes a SERVER span is given (HTTP's, the route's, the decision's, the
/// answer's): its vector is sized once.
const SERVER_ATTRIBUTES: usize = 20;

pub(super) const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// A sampled span, until it ends.
pub(super) struct Recording {
    telemetry: Arc<Telemetry>,
    name: Cow<'static, str>,
    kind: SpanKind,
    /// The parent's span id (`INVALID` for a root) and whether it came from the client.
    parent: (SpanId, bool),
    start: SystemTime,
    pub(super) attributes: Vec<KeyValue>,
}

impl Recording {
    /// A span starting now.
    pub(super) fn new(
        telemetry: Arc<Telemetry>,
        name: Cow<'static, str>,
        kind: SpanKind,
        parent: (SpanId, bool),
    ) -> Recording {
        Recording {
            telemetry,
            name,
            kind,
            parent,
            start: SystemTime::now(),
            attributes: Vec::with_capacity(SERVER_ATTRIBUTES),
        }
    }

    /// A child of `parent` (a span of this process) that started at `start`.
    fn child(
        &self,
        parent: &SpanContext,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: Vec<KeyValue>,
    ) -> (SpanContext, Recording) {
        let context = SpanContext::new(
            parent.trace_id(),
            self.telemetry.new_span_id(),
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        );
        let child = Recording {
            telemetry: self.telemetry.clone(),
            name,
            kind: SpanKind::Client,
            parent: (parent.span_id(), false),
            start,
            attributes,
        };
        (context, child)
    }

    /// Ends the span at `end` with `status` (a failed store call's error), or with the HTTP
    /// status code `http` (a 5xx also sets `error.type` and an error status). The span goes to
    /// the exporter's queue.
    fn end(mut self, context: SpanContext, end: SystemTime, http: Option<u16>, status: Status) {
        let mut status = status;
        if let Some(code) = http {
            self.attributes
                .push(KeyValue::new("http.response.status_code", i64::from(code)));
            if code >= 500 {
                self.attributes
                    .push(KeyValue::new("error.type", code.to_string()));
                status = Status::error(code.to_string());
            }
        }
        let span = SpanData {
            span_context: context,
            parent_span_id: self.parent.0,
            parent_span_is_remote: self.parent.1,
            span_kind: self.kind,
            name: self.name,
            start_time: self.start,
            end_time: end,
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status,
            instrumentation_scope: self.telemetry.scope.clone(),
        };
        self.telemetry.emit(span);
    }
}

/// One request's trace: its SERVER span, and the means to make its children.
pub struct Trace {
    /// The span's context, sampled or not: what children and the upstream hear of.
    context: SpanContext,
    /// A sampled span's record (the proxy's phases set attributes through a shared
    /// reference; the lock is never contended), boxed so that an unsampled trace is small.
    recording: Option<Box<Mutex<Recording>>>,
}

impl Trace {
    pub(super) fn new(context: SpanContext, recording: Option<Recording>) -> Trace {
        Trace {
            context,
            recording: recording.map(|r| Box::new(Mutex::new(r))),
        }
    }

    pub(super) fn recording_mut(&mut self) -> Option<&mut Recording> {
        let recording = self.recording.as_mut()?;
        Some(recording.get_mut().unwrap_or_else(|e| e.into_inner()))
    }

    /// A sampled span's record (a poisoned lock is taken as it is: it holds only names and
    /// attributes).
    fn recording(&self) -> Option<MutexGuard<'_, Recording>> {
        let recording = self.recording.as_ref()?;
        Some(recording.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// True when the span is sampled (its attributes are recorded).
    pub fn is_recording(&self) -> bool {
        self.recording.is_some()
    }

    /// Renames the span (once its route is known), if it is sampled.
    pub fn rename(&self, name: impl FnOnce() -> String) {
        if let Some(mut recording) = self.recording() {
            recording.name = Cow::Owned(name());
        }
    }

    /// Sets an attribute on the SERVER span, if it is sampled (`attribute` is not built
    /// otherwise).
    pub fn set(&self, attribute: impl FnOnce() -> KeyValue) {
        if let Some(mut recording) = self.recording() {
            recording.attributes.push(attribute());
        }
    }

    /// A CLIENT child for a store round trip that began at `started` and took `took`:
    /// `system` is `redis` or `postgresql`.
    pub fn store_call(&self, system: &'static str, started: Instant, took: Duration, failed: bool) {
        let Some(recording) = self.recording() else {
            return;
        };
        let start = SystemTime::now() - started.elapsed();
        let (context, child) = recording.child(
            &self.context,
            Cow::Owned(["decide ", system].concat()),
            start,
            vec![KeyValue::new("db.system.name", system)],
        );
        let status = match failed {
            true => Status::error("the store failed"),
            false => Status::Unset,
        };
        child.end(context, start + took, None, status);
    }

    /// A CLIENT child for the forwarded request to the host `upstream`, whose context
    /// `headers` (the upstream
    /// request's) carry as `traceparent` (and `tracestate`): ended by [`Forwarded::end`]. An
    /// unsampled trace makes no span: the upstream hears the request's own context, flags `00`.
    pub fn forward(
        &self,
        method: &Method,
        upstream: &Arc<str>,
        headers: &mut HeaderMap,
    ) -> Forwarded {
        let Some(recording) = self.recording() else {
            inject(&self.context, headers);
            return Forwarded { span: None };
        };
        let (context, child) = recording.child(
            &self.context,
            method_name(method),
            SystemTime::now(),
            vec![
                KeyValue::new("http.request.method", method_name(method)),
                KeyValue::new("server.address", upstream.clone()),
            ],
        );
        inject(&context, headers);
        Forwarded {
            span: Some((context, child)),
        }
    }

    /// Ends the SERVER span with the answer's status (`error.type` for a 5xx).
    pub fn end(mut self, status: u16) {
        self.finish(Some(status));
    }

    fn finish(&mut self, status: Option<u16>) {
        if let Some(recording) = self.recording.take() {
            let recording = recording.into_inner().unwrap_or_else(|e| e.into_inner());
            recording.end(
                self.context.clone(),
                SystemTime::now(),
                status,
                Status::Unset,
            );
        }
    }
}

impl Drop for Trace {
    /// A request dropped before its answer (the client went away) still reports its span,
    /// with what was set on it and no status.
    fn drop(&mut self) {
        self.finish(None);
    }
}

/// The forwarded request's CLIENT span (none for an unsampled trace).
pub struct Forwarded {
    span: Option<(SpanContext, Recording)>,
}

impl Forwarded {
    /// Names the endpoint the request went to (its last attempt's): `server.address` becomes
    /// its address (it was the origin's name) and `server.port` its port.
    pub fn endpoint(&mut self, addr: std::net::SocketAddr) {
        if let Some((_, span)) = &mut self.span {
            let address = match addr.ip() {
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => ip.to_string(),
            };
            for kv in span.attributes.iter_mut() {
                if kv.key.as_str() == "server.address" {
                    kv.value = address.clone().into();
                }
            }
            span.attributes
                .push(KeyValue::new("server.port", i64::from(addr.port())));
        }
    }

    /// Ends it with the upstream's status (or floodgate's, when the upstream failed).
    pub fn end(mut self, status: u16) {
        self.finish(Some(status));
    }

    fn finish(&mut self, status: Option<u16>) {
        if let Some((context, span)) = self.span.take() {
            span.end(context, SystemTime::now(), status, Status::Unset);
        }
    }
}

impl Drop for Forwarded {
    /// A forward abandoned before its answer (the client went away) is reported without one.
    fn drop(&mut self) {
        self.finish(None);
    }
}

/// Writes `context` into `headers` as W3C `traceparent` (and `tracestate` when it has one), as
/// the SDK's `TraceContextPropagator` would, without its formatting machinery: the 55 bytes
/// written in place (this runs on every request a trace is on, sampled or not).
fn inject(context: &SpanContext, headers: &mut HeaderMap) {
    if !context.is_valid() {
        return;
    }
    // 00-{trace id: 32 hex}-{span id: 16 hex}-{flags: 2 hex}
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
    hex(&mut out[3..35], &context.trace_id().to_bytes());
    hex(&mut out[36..52], &context.span_id().to_bytes());
    hex(&mut out[53..55], &[context.trace_flags().to_u8()]);
    if let Ok(value) = http::HeaderValue::from_bytes(&out) {
        headers.insert(TRACEPARENT, value);
    }
    if *context.trace_state() != TraceState::NONE
        && let Ok(value) = http::HeaderValue::from_str(&context.trace_state().header())
        && !value.is_empty()
    {
        headers.insert(TRACESTATE, value);
    }
}

/// `bytes` in lower-case hex into `out` (twice as long), a table look-up a byte.
fn hex(out: &mut [u8], bytes: &[u8]) {
    const PAIRS: [[u8; 2]; 256] = {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0; 2]; 256];
        let mut b = 0;
        while b < 256 {
            pairs[b] = [DIGITS[b >> 4], DIGITS[b & 0xf]];
            b += 1;
        }
        pairs
    };
    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(b)]);
    }
}

/// A method's name: the standard ones without an allocation.
pub(super) fn method_name(method: &Method) -> Cow<'static, str> {
    let name = match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => return Cow::Owned(method.as_str().to_string()),
    };
    Cow::Borrowed(name)
}

#[cfg(test)]
mod tests {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::{TraceContextExt, TraceFlags, TraceId};
    use opentelemetry_http::HeaderInjector;
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    use super::*;

    /// What `inject` writes is what the SDK's propagator writes for the same context, sampled
    /// or not, with a trace state or without.
    #[test]
    fn traceparent_is_written_as_the_sdks_propagator_writes_it() {
        let state = TraceState::from_key_value([("vendor", "a1"), ("other", "b2")]).unwrap();
        for (flags, state) in [
            (TraceFlags::SAMPLED, TraceState::NONE),
            (TraceFlags::default(), state),
        ] {
            let context = SpanContext::new(
                TraceId::from(0x0af7651916cd43dd8448eb211c80319c_u128),
                SpanId::from(0x00f067aa0ba902b7_u64),
                flags,
                false,
                state,
            );
            let mut ours = HeaderMap::new();
            inject(&context, &mut ours);
            let mut theirs = HeaderMap::new();
            let cx = opentelemetry::Context::new().with_remote_span_context(context);
            TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(&mut theirs));
            // (The SDK writes an empty `tracestate` too; an empty list says nothing, and is
            // left out.)
            if theirs.get(TRACESTATE).is_some_and(|v| v.is_empty()) {
                theirs.remove(TRACESTATE);
            }
            assert_eq!(ours, theirs);
        }
        let mut none = HeaderMap::new();
        inject(&SpanContext::empty_context(), &mut none);
        assert!(none.is_empty());
    }
}
