//! OpenTelemetry: one trace per request, exported over OTLP/HTTP (protobuf), and floodgate's
//! metrics exported to the same collector (`telemetry/metrics.rs`).
//!
//! Built on the `opentelemetry` API and SDK (the tracer, the W3C trace-context propagator, the
//! parent-based ratio sampler), sending through `opentelemetry-http`'s hyper client on
//! floodgate's own runtime. What floodgate adds is the path between them: a span that ends is
//! put on a bounded queue without waiting (a full queue drops it and counts it in
//! `floodgate_telemetry_dropped_total`), and one task takes batches off the queue, writes them
//! as OTLP protobuf (`telemetry/otlp.rs`, which says why not `opentelemetry-otlp`'s exporter)
//! and exports them, so a slow or dead collector costs no request any time and at most
//! [`QUEUE`] spans of memory. With telemetry off there is no tracer at all: the proxy's
//! `Option<Trace>` is `None` and no span is made.
//!
//! Spans, as the contract names them: a SERVER span per request (`{METHOD} {route}`, with
//! OpenTelemetry's HTTP attributes and floodgate's decision), a CLIENT child for a store round
//! trip the decision waited on (`db.system.name`), a CLIENT child for the forwarded request
//! (whose context the upstream receives in `traceparent`), and a SERVER span per
//! `ShouldRateLimit` call (`rpc.system: grpc`).

mod export;
mod metrics;
mod otlp;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use export::{Client, QueueProcessor, export_spans, http_client};
use http::{HeaderMap, Method, Version};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider,
};
use prometheus_client::metrics::counter::Counter;

use crate::config::TelemetryConfig;

/// The most ended spans waiting for export; past it a span is dropped (and counted).
pub const QUEUE: usize = 4096;
/// The most spans sent in one export.
const BATCH: usize = 512;
/// How long a partly filled batch waits for more spans.
const BATCH_WAIT: Duration = Duration::from_millis(500);
/// How long one export may take before it is given up (its spans counted as dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The process' telemetry: the tracer and the propagator, shared by every request.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    ids: PresetIds,
    /// `sample_ratio` as the SDK's ratio sampler compares it (see [`Telemetry::server_span`]).
    ratio_bound: u64,
    ratio: f64,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
    }
}

thread_local! {
    /// A root trace id already drawn (and sampled) by [`Telemetry::server_span`], for the
    /// SDK's next span on this thread.
    static NEXT_TRACE_ID: std::cell::Cell<Option<TraceId>> = const { std::cell::Cell::new(None) };
}

/// The SDK's random ids, except a root trace id drawn beforehand (see [`NEXT_TRACE_ID`]).
#[derive(Debug, Default)]
struct PresetIds(RandomIdGenerator);

impl IdGenerator for PresetIds {
    fn new_trace_id(&self) -> TraceId {
        NEXT_TRACE_ID
            .take()
            .unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        self.0.new_span_id()
    }
}

impl Telemetry {
    /// Starts exporting to `config.endpoint` (on the current tokio runtime): spans, and every
    /// `metrics_interval` the metrics `render` returns. `dropped` counts spans that could not
    /// be queued or exported.
    pub fn start(
        config: &TelemetryConfig,
        dropped: Counter,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> anyhow::Result<Telemetry> {
        let client = http_client(&config.endpoint)?;
        let base = config.endpoint.to_string();
        let base = base.trim_end_matches('/');
        let (queue, spans) = tokio::sync::mpsc::channel(QUEUE);
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        tokio::spawn(export_spans(
            spans,
            client.clone(),
            format!("{base}/v1/traces"),
            otlp::Resource::new(&resource),
            dropped.clone(),
        ));
        if let Some(interval) = config.metrics_interval {
            tokio::spawn(metrics::export(
                client,
                format!("{base}/v1/metrics"),
                resource.clone(),
                interval,
                render,
            ));
        }
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .with_id_generator(PresetIds::default())
            .with_span_processor(QueueProcessor { queue, dropped })
            .build();
        let tracer = provider.tracer("floodgate");
        Ok(Telemetry {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            ids: PresetIds::default(),
            ratio_bound: (config.sample_ratio.max(0.0) * (1u64 << 63) as f64) as u64,
            ratio: config.sample_ratio,
        })
    }

    /// The SERVER span of a request arriving with `headers` (its `traceparent` and
    /// `tracestate` continued), from `client()`. The sampler decides first; a span it drops
    /// gets no attributes (nothing is formatted for it), and `client()` is asked only for a
    /// sampled one.
    pub fn server_span(
        &self,
        method: &Method,
        path: &str,
        version: Version,
        headers: &HeaderMap,
        client: impl FnOnce() -> std::net::IpAddr,
    ) -> Trace {
        // A request with no trace of its own starts one here, and the ratio decides: the SDK's
        // `TraceIdRatioBased` rule, applied to a trace id drawn first, so that a dropped root
        // costs no SDK span at all (only its ids, for the upstream's `traceparent`), and a kept
        // one is started with that very id (the SDK's sampler then decides alike).
        let parent = match headers.contains_key(TRACEPARENT) {
            true => self.propagator.extract(&HeaderExtractor(headers)),
            false => Context::new(),
        };
        if !parent.has_active_span() {
            let trace_id = self.ids.new_trace_id();
            let low = u64::from_be_bytes(trace_id.to_bytes()[8..].try_into().unwrap_or([0; 8]));
            if self.ratio < 1.0 && low >> 1 >= self.ratio_bound {
                return Trace {
                    cx: None,
                    dropped: Some((trace_id, self.ids.new_span_id())),
                    tracer: self.tracer.clone(),
                    pending: None,
                };
            }
            // The SDK draws this id for the span it starts next on this thread.
            NEXT_TRACE_ID.set(Some(trace_id));
        }
        // (Built only now: a dropped root allocates no name and no builder.)
        let span = self
            .tracer
            .span_builder(method_name(method))
            .with_kind(SpanKind::Server)
            // Room for every attribute the span is given when it ends, so that the SDK's
            // vector is not grown three times on the way.
            .with_attributes(Vec::with_capacity(SERVER_ATTRIBUTES))
            .start_with_context(&self.tracer, &parent);
        NEXT_TRACE_ID.set(None);
        let pending = span.is_recording().then(|| {
            let version = match version {
                Version::HTTP_10 => "1.0",
                Version::HTTP_11 => "1.1",
                Version::HTTP_2 => "2",
                _ => "other",
            };
            let mut attributes = Vec::with_capacity(16);
            attributes.extend([
                KeyValue::new("http.request.method", method_name(method)),
                KeyValue::new("url.path", path.to_string()),
                KeyValue::new("network.protocol.version", version),
                KeyValue::new("client.address", client().to_string()),
            ]);
            Mutex::new(Pending {
                name: None,
                attributes,
            })
        });
        Trace {
            cx: Some(parent.with_span(span)),
            dropped: None,
            tracer: self.tracer.clone(),
            pending,
        }
    }

    /// The SERVER span of a gRPC call to `service`/`method` (the rate-limit service).
    pub fn rpc_span(&self, service: &str, method: &str, headers: &HeaderMap) -> Trace {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder(format!("{service}/{method}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service.to_string()),
                KeyValue::new("rpc.method", method.to_string()),
            ])
            .start_with_context(&self.tracer, &parent);
        let pending = span.is_recording().then(|| Mutex::new(Pending::default()));
        Trace {
            cx: Some(parent.with_span(span)),
            dropped: None,
            tracer: self.tracer.clone(),
            pending,
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// One request's trace: its SERVER span, and the means to make its children.
pub struct Trace {
    /// The SDK's span (sampled or not) in its context.
    cx: Option<Context>,
    /// A root the ratio dropped before any span was made: its trace and span ids.
    dropped: Option<(TraceId, SpanId)>,
    tracer: SdkTracer,
    /// A sampled span's new name and attributes, given to the SDK's span in one go when it
    /// ends (each call on the SDK's span in its context takes a lock and a dynamic call).
    pending: Option<Mutex<Pending>>,
}

/// What a sampled SERVER span is told before it ends.
#[derive(Default)]
struct Pending {
    name: Option<String>,
    attributes: Vec<KeyValue>,
}

impl Trace {
    /// True when the span is sampled (its attributes are recorded).
    pub fn is_recording(&self) -> bool {
        self.pending.is_some()
    }

    /// The context of a sampled span.
    fn recording(&self) -> Option<&Context> {
        self.pending.as_ref().and(self.cx.as_ref())
    }

    /// What is pending for a sampled span (a poisoned lock is taken as it is: it holds only
    /// names and attributes).
    fn pending(&self) -> Option<std::sync::MutexGuard<'_, Pending>> {
        let pending = self.pending.as_ref()?;
        Some(pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Renames the span (once its route is known), if it is sampled.
    pub fn rename(&self, name: impl FnOnce() -> String) {
        if let Some(mut pending) = self.pending() {
            pending.name = Some(name());
        }
    }

    /// Sets an attribute on the SERVER span, if it is sampled (`attribute` is not built
    /// otherwise).
    pub fn set(&self, attribute: impl FnOnce() -> KeyValue) {
        if let Some(mut pending) = self.pending() {
            pending.attributes.push(attribute());
        }
    }

    /// A CLIENT child for a store round trip that began at `started` and took `took`:
    /// `system` is `redis` or `postgresql`.
    pub fn store_call(&self, system: &'static str, started: Instant, took: Duration, failed: bool) {
        let Some(cx) = self.recording() else {
            return;
        };
        let start = SystemTime::now() - started.elapsed();
        let mut span = self
            .tracer
            .span_builder(format!("decide {system}"))
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .with_attributes([KeyValue::new("db.system.name", system)])
            .start_with_context(&self.tracer, cx);
        if failed {
            span.set_status(Status::error("the store failed"));
        }
        span.end_with_timestamp(start + took);
    }

    /// A CLIENT child for the forwarded request, whose context `headers` (the upstream
    /// request's) carry as `traceparent` (and `tracestate`): ended by [`Forwarded::end`]. An
    /// unsampled trace makes no span: the upstream hears the request's own context, flags `00`.
    pub fn forward(
        &self,
        method: &Method,
        upstream: &http::uri::Authority,
        headers: &mut HeaderMap,
    ) -> Forwarded {
        let Some(cx) = self.recording() else {
            match (&self.cx, self.dropped) {
                (Some(cx), _) => inject_context(cx, headers),
                (None, Some((trace_id, span_id))) => inject(
                    trace_id,
                    span_id,
                    TraceFlags::default(),
                    &TraceState::NONE,
                    headers,
                ),
                (None, None) => {}
            }
            return Forwarded { cx: None };
        };
        let span = self
            .tracer
            .span_builder(method_name(method))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("http.request.method", method_name(method)),
                // (The host is parsed out of the authority only for a sampled span: it is a
                // search of the string.)
                KeyValue::new("server.address", upstream.host().to_string()),
            ])
            .start_with_context(&self.tracer, cx);
        let cx = cx.with_span(span);
        inject_context(&cx, headers);
        Forwarded { cx: Some(cx) }
    }

    /// Ends the SERVER span with the answer's status (`error.type` for a 5xx).
    pub fn end(mut self, status: u16) {
        let attributes = self.take_pending();
        if let Some(cx) = &self.cx {
            end(cx, status, attributes);
        }
    }

    /// Renames the span as pending, and takes its pending attributes.
    fn take_pending(&mut self) -> Vec<KeyValue> {
        let Some(pending) = self.pending.take() else {
            return Vec::new();
        };
        let pending = pending.into_inner().unwrap_or_else(|e| e.into_inner());
        if let (Some(cx), Some(name)) = (&self.cx, pending.name) {
            cx.span().update_name(name);
        }
        pending.attributes
    }
}

impl Drop for Trace {
    /// A request dropped before its answer (the client went away) still gives its span what
    /// was set on it; the SDK's span ends as it is dropped.
    fn drop(&mut self) {
        let attributes = self.take_pending();
        if let Some(cx) = &self.cx
            && !attributes.is_empty()
        {
            cx.span().set_attributes(attributes);
        }
    }
}

/// The forwarded request's CLIENT span (none for an unsampled trace).
pub struct Forwarded {
    cx: Option<Context>,
}

impl Forwarded {
    /// Ends it with the upstream's status (or floodgate's, when the upstream failed).
    pub fn end(self, status: u16) {
        if let Some(cx) = &self.cx {
            end(cx, status, Vec::new());
        }
    }
}

/// [`inject`] of `cx`'s span.
fn inject_context(cx: &Context, headers: &mut HeaderMap) {
    let span = cx.span();
    let sc = span.span_context();
    inject(
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags(),
        sc.trace_state(),
        headers,
    );
}

/// Writes `cx`'s span context into `headers` as W3C `traceparent` (and `tracestate` when it
/// has one), as the SDK's `TraceContextPropagator` would, without its formatting machinery: the
/// 55 bytes written in place (this runs on every request a trace is on, sampled or not).
fn inject(
    trace_id: TraceId,
    span_id: SpanId,
    flags: TraceFlags,
    state: &TraceState,
    headers: &mut HeaderMap,
) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return;
    }
    let mut out = [0u8; 55];
    let mut at = 0;
    let mut put = |bytes: &[u8], hex: bool| {
        for &b in bytes {
            if hex {
                out[at] = HEX[usize::from(b >> 4)];
                out[at + 1] = HEX[usize::from(b & 0xf)];
                at += 2;
            } else {
                out[at] = b;
                at += 1;
            }
        }
    };
    put(b"00-", false);
    put(&trace_id.to_bytes(), true);
    put(b"-", false);
    put(&span_id.to_bytes(), true);
    put(b"-", false);
    put(&[flags.to_u8()], true);
    let at = 55;
    if let Ok(value) = http::HeaderValue::from_bytes(&out[..at]) {
        headers.insert(TRACEPARENT, value);
    }
    let state = state.header();
    if !state.is_empty()
        && let Ok(value) = http::HeaderValue::from_str(&state)
    {
        headers.insert(TRACESTATE, value);
    }
}

const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// Ends `cx`'s span with `attributes` and an HTTP status (`error.type` for a 5xx).
fn end(cx: &Context, status: u16, mut attributes: Vec<KeyValue>) {
    let span = cx.span();
    if span.is_recording() {
        attributes.push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            attributes.push(KeyValue::new("error.type", status.to_string()));
            span.set_status(Status::error(status.to_string()));
        }
        span.set_attributes(attributes);
    }
    span.end();
}

/// The most attributes a SERVER span is given (HTTP's, the route's, the decision's, the
/// answer's).
const SERVER_ATTRIBUTES: usize = 20;

/// A method's name: the standard ones without an allocation.
fn method_name(method: &Method) -> std::borrow::Cow<'static, str> {
    let name = match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => return std::borrow::Cow::Owned(method.as_str().to_string()),
    };
    std::borrow::Cow::Borrowed(name)
}

/// Shared by the proxy and the service: the process' telemetry, if it is on.
pub type Shared = Option<Arc<Telemetry>>;
