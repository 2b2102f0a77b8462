//! OpenTelemetry: one trace per request, exported over OTLP/HTTP (protobuf), and floodgate's
//! metrics exported to the same collector (`telemetry/metrics.rs`).
//!
//! Built on the `opentelemetry` API and SDK: the W3C trace-context propagator reads the
//! client's `traceparent`, the SDK's parent-based ratio sampler decides, the SDK's random id
//! generator names traces and spans, and an ended span is the SDK's `SpanData`, sent through
//! `opentelemetry-http`'s hyper client on floodgate's own runtime. What floodgate does itself
//! is keep a request's spans (`telemetry/trace.rs`): a span is a record of its ids, start,
//! name and attributes, filled in as the request goes and made into `SpanData` once as it
//! ends, rather than the SDK's `Tracer` span, which lives in a `Context` behind a mutex and a
//! dynamic call and is copied again as it ends (callgrind put the SDK's span machinery at
//! about 4,000 instructions of a sampled request; see docs/performance.md).
//!
//! The way out never waits: an ended span is put on a bounded queue (a full queue drops it
//! and counts it in `floodgate_telemetry_dropped_total`), and one task takes batches off the
//! queue, writes them as OTLP protobuf (`telemetry/otlp.rs`, which says why not
//! `opentelemetry-otlp`'s exporter) and exports them, so a slow or dead collector costs no
//! request any time and at most [`QUEUE`] spans of memory. With telemetry off there is no
//! telemetry at all: the proxy's `Option<Trace>` is `None`.
//!
//! Spans, as the contract names them: a SERVER span per request (`{METHOD} {route}`, with
//! OpenTelemetry's HTTP attributes and floodgate's decision), a CLIENT child for a store round
//! trip the decision waited on (`db.system.name`), a CLIENT child for the forwarded request
//! (whose context the upstream receives in `traceparent`), and a SERVER span per
//! `ShouldRateLimit` call (`rpc.system: grpc`).

mod export;
mod metrics;
mod otlp;
mod trace;

use std::sync::Arc;
use std::time::Duration;

use export::{Client, export_spans, http_client};
use http::{HeaderMap, Method, Version};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample, SpanData,
};
use prometheus_client::metrics::counter::Counter;

use crate::config::TelemetryConfig;
pub use trace::{Forwarded, Trace};
use trace::{Recording, TRACEPARENT, method_name};

/// The most ended spans waiting for export; past it a span is dropped (and counted).
pub const QUEUE: usize = 4096;
/// The most spans sent in one export.
const BATCH: usize = 512;
/// How long a partly filled batch waits for more spans.
const BATCH_WAIT: Duration = Duration::from_millis(500);
/// How long one export may take before it is given up (its spans counted as dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The process' telemetry: the sampler, the ids, the propagator and the queue to the exporter,
/// shared by every request.
pub struct Telemetry {
    sampler: Sampler,
    ids: RandomIdGenerator,
    propagator: TraceContextPropagator,
    /// The instrumentation scope every span is reported under (`floodgate`).
    scope: InstrumentationScope,
    /// `sample_ratio`, for a trace that starts here (see [`ratio_keeps`]).
    ratio: f64,
    queue: tokio::sync::mpsc::Sender<SpanData>,
    /// Told when a batch's worth of spans is queued (the exporter does not watch the queue).
    full: Arc<tokio::sync::Notify>,
    /// Asks the exporter to send everything queued now (at shutdown), and hears when it has.
    flushes: tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
    dropped: Counter,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
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
        let full = Arc::new(tokio::sync::Notify::new());
        let (flushes, flush_requests) = tokio::sync::mpsc::channel(1);
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        tokio::spawn(export_spans(
            spans,
            full.clone(),
            flush_requests,
            client.clone(),
            format!("{base}/v1/traces"),
            otlp::Resource::new(&resource),
            dropped.clone(),
        ));
        if let Some(interval) = config.metrics_interval {
            tokio::spawn(metrics::export(
                client,
                format!("{base}/v1/metrics"),
                resource,
                interval,
                render,
            ));
        }
        Ok(Telemetry {
            sampler: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))),
            ids: RandomIdGenerator::default(),
            propagator: TraceContextPropagator::new(),
            scope: InstrumentationScope::builder("floodgate").build(),
            ratio: config.sample_ratio,
            queue,
            full,
            flushes,
            dropped,
        })
    }

    /// The SERVER span of a request arriving with `headers` (its `traceparent` and
    /// `tracestate` continued), from `client()`. The sampler decides first; a span it drops
    /// gets no attributes (nothing is formatted for it), and `client()` is asked only for a
    /// sampled one.
    pub fn server_span(
        self: &Arc<Self>,
        method: &Method,
        path: &str,
        version: Version,
        headers: &HeaderMap,
        client: impl FnOnce() -> std::net::IpAddr,
    ) -> Trace {
        let name = method_name(method);
        let mut trace = self.begin(name.clone(), headers);
        if let Some(recording) = trace.recording_mut() {
            let version = crate::logging::protocol_version(version);
            recording.attributes.extend([
                KeyValue::new("http.request.method", name),
                KeyValue::new("url.path", path.to_string()),
                KeyValue::new("network.protocol.version", version),
                KeyValue::new("client.address", address_text(client())),
            ]);
        }
        trace
    }

    /// The SERVER span of a gRPC call to `service`/`method` (the rate-limit service).
    pub fn rpc_span(self: &Arc<Self>, service: &str, method: &str, headers: &HeaderMap) -> Trace {
        let mut trace = self.begin(format!("{service}/{method}").into(), headers);
        if let Some(recording) = trace.recording_mut() {
            recording.attributes.extend([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service.to_string()),
                KeyValue::new("rpc.method", method.to_string()),
            ]);
        }
        trace
    }

    /// A SERVER span named `name`, continuing the trace in `headers` or starting one, recorded
    /// if the sampler keeps it.
    fn begin(self: &Arc<Self>, name: std::borrow::Cow<'static, str>, headers: &HeaderMap) -> Trace {
        // Most requests carry no trace: one starts here, and the ratio decides. (The
        // propagator and the SDK's sampler are asked only when there is a parent to read.)
        // W3C Trace Context: a `traceparent` sent twice (two fields, or values joined with a
        // comma) is invalid, and an invalid parent starts a new trace; the SDK's extractor
        // would read the first.
        if !one_traceparent(headers) {
            let trace_id = self.ids.new_trace_id();
            let keep = ratio_keeps(self.ratio, trace_id);
            let context = SpanContext::new(
                trace_id,
                self.ids.new_span_id(),
                TraceFlags::default().with_sampled(keep),
                false,
                TraceState::NONE,
            );
            let recording = keep.then(|| {
                Recording::new(
                    self.clone(),
                    name,
                    SpanKind::Server,
                    (SpanId::INVALID, false),
                )
            });
            return Trace::new(context, recording);
        }
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let remote = parent.span().span_context().clone();
        let trace_id = match remote.is_valid() {
            true => remote.trace_id(),
            false => self.ids.new_trace_id(),
        };
        let sampled =
            self.sampler
                .should_sample(Some(&parent), trace_id, &name, &SpanKind::Server, &[], &[]);
        let keep = sampled.decision == SamplingDecision::RecordAndSample;
        let context = SpanContext::new(
            trace_id,
            self.ids.new_span_id(),
            remote.trace_flags().with_sampled(keep),
            false,
            sampled.trace_state,
        );
        let recording = keep.then(|| {
            Recording::new(
                self.clone(),
                name,
                SpanKind::Server,
                match remote.is_valid() {
                    true => (remote.span_id(), true),
                    false => (SpanId::INVALID, false),
                },
            )
        });
        Trace::new(context, recording)
    }

    /// Exports every span queued so far, and returns once that export is over (sent, refused
    /// or timed out). At shutdown, so that the last half second's spans are not lost; the
    /// caller bounds the wait.
    pub async fn flush(&self) {
        let (done, exported) = tokio::sync::oneshot::channel();
        if self.flushes.send(done).await.is_ok() {
            let _ = exported.await;
        }
    }

    /// A new span id (for a child span).
    fn new_span_id(&self) -> SpanId {
        self.ids.new_span_id()
    }

    /// Puts an ended span on the exporter's queue, or drops it (counted) when the queue is
    /// full: a request never waits for the exporter.
    fn emit(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            self.dropped.inc();
        } else if self.queue.capacity() <= QUEUE - BATCH {
            self.full.notify_one();
        }
    }
}

/// Shared by the proxy and the service: the process' telemetry, if it is on.
pub type Shared = Option<Arc<Telemetry>>;

/// Whether `ratio` keeps a trace that starts here with `trace_id`: the SDK's
/// `TraceIdRatioBased` rule (the id's low 63 bits below the ratio's share of them), without
/// its sampling result (a unit test holds the two to the same answers).
fn ratio_keeps(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let low = u64::from_be_bytes(trace_id.to_bytes()[8..].try_into().unwrap_or([0; 8]));
    low >> 1 < bound
}

/// An address as text: IPv4's four numbers written directly (`Display` goes through the
/// formatting machinery and grows its string, several hundred instructions), IPv6 by
/// `Display`.
fn address_text(ip: std::net::IpAddr) -> String {
    let std::net::IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut text = String::with_capacity(15);
    for (i, n) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if n >= 100 {
            text.push(char::from(b'0' + n / 100));
        }
        if n >= 10 {
            text.push(char::from(b'0' + n / 10 % 10));
        }
        text.push(char::from(b'0' + n % 10));
    }
    text
}

/// True when `headers` hold exactly one `traceparent`, one value (no comma-joined list).
fn one_traceparent(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(TRACEPARENT).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => !value.as_bytes().contains(&b','),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_sdk::trace::{RandomIdGenerator, Sampler, SamplingDecision, ShouldSample};

    use super::*;

    /// `ratio_keeps` answers as the SDK's ratio sampler does, for every ratio the config
    /// allows and ids from the SDK's generator (and the extremes).
    #[test]
    fn a_root_is_kept_as_the_sdks_ratio_sampler_keeps_it() {
        let ids = RandomIdGenerator::default();
        let mut trace_ids: Vec<TraceId> = (0..20_000).map(|_| ids.new_trace_id()).collect();
        trace_ids.extend([TraceId::from(0), TraceId::from(u128::MAX), TraceId::from(1)]);
        for ratio in [0.0, 0.001, 0.01, 0.25, 0.5, 0.999, 1.0] {
            let sampler = Sampler::TraceIdRatioBased(ratio);
            let mut kept = 0;
            for &id in &trace_ids {
                let theirs = sampler
                    .should_sample(None, id, "GET", &SpanKind::Server, &[], &[])
                    .decision
                    == SamplingDecision::RecordAndSample;
                assert_eq!(ratio_keeps(ratio, id), theirs, "ratio {ratio}, id {id}");
                kept += usize::from(theirs);
            }
            // (Not a constant answer: the ratio shows in what is kept.)
            let share = kept as f64 / trace_ids.len() as f64;
            assert!((share - ratio).abs() < 0.02, "ratio {ratio} kept {share}");
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for text in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.100.9",
            "1.20.3.40",
            "127.0.0.1",
            "192.168.10.200",
            "::1",
            "2001:db8::ff00:42:8329",
            "::ffff:1.2.3.4",
        ] {
            let ip: std::net::IpAddr = text.parse().unwrap();
            assert_eq!(address_text(ip), ip.to_string());
            assert_eq!(address_text(ip), text);
        }
    }
}
