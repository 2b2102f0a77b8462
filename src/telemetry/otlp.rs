//! Ended spans written as one OTLP `ExportTraceServiceRequest` (protobuf), straight from the
//! SDK's `SpanData` into one buffer.
//!
//! Why not `opentelemetry-otlp`'s exporter: it converts every span into `opentelemetry-proto`'s
//! owned message structs first (a `String` per attribute key and value, formatted through
//! `Display`, a `Vec` per id) and prost then measures each nested message again at every level
//! it is written; callgrind put that at about 21,000 instructions per proxied request with every
//! request sampled, two fifths of the whole request. Here each message's length is counted once
//! (`*_len`) and its bytes written once, with no allocation but the output. What is written is
//! the same message: the unit tests decode it with `opentelemetry-proto` and compare it with
//! that crate's own conversion of the same spans.
//!
//! The wire format: each field is a key (`field << 3 | wire type`) then its value; a varint is
//! 7 bits a byte, low first; a message, string or bytes field is its length (a varint) then
//! its bytes.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanId, SpanKind, Status, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SpanData;

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// `SpanFlags`: the span's context says whether its parent is remote, and whether it is.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The resource every span of this process shares (`service.name`, `service.version`), as
/// string attributes.
pub(super) struct Resource(Vec<(String, String)>);

impl Resource {
    pub(super) fn new(resource: &opentelemetry_sdk::Resource) -> Resource {
        Resource(
            resource
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_string()))
                .collect(),
        )
    }
}

/// `spans` as one export request's body: one `ResourceSpans`, one `ScopeSpans` per
/// instrumentation scope (in the order first seen).
pub(super) fn encode(resource: &Resource, spans: &[SpanData]) -> Vec<u8> {
    // Each span measured once: its length, and its trace state as the header writes it.
    let sized: Vec<Sized<'_>> = spans
        .iter()
        .map(|span| {
            let state = match span.span_context.trace_state() {
                s if *s == TraceState::NONE => String::new(),
                s => s.header(),
            };
            Sized {
                len: span_len(span, &state),
                state,
                span,
            }
        })
        .collect();
    let mut scopes: Vec<Scope<'_>> = Vec::new();
    for span in &sized {
        let scope = &span.span.instrumentation_scope;
        let at = match scopes.iter().position(|s| s.scope == scope) {
            Some(at) => at,
            None => {
                scopes.push(Scope {
                    scope,
                    len: field_len(1, scope_len(scope))
                        + string_field_len(3, scope.schema_url().unwrap_or_default()),
                    spans: Vec::new(),
                });
                scopes.len() - 1
            }
        };
        scopes[at].len += field_len(2, span.len);
        scopes[at].spans.push(span);
    }
    let resource_len: usize = resource
        .0
        .iter()
        .map(|(k, v)| field_len(1, string_kv_len(k, v)))
        .sum();
    let resource_spans_len =
        field_len(1, resource_len) + scopes.iter().map(|s| field_len(2, s.len)).sum::<usize>();

    let mut out = Vec::with_capacity(field_len(1, resource_spans_len));
    let w = &mut out;
    // ExportTraceServiceRequest.resource_spans = 1
    header(w, 1, resource_spans_len);
    // ResourceSpans.resource = 1: Resource.attributes = 1
    header(w, 1, resource_len);
    for (k, v) in &resource.0 {
        header(w, 1, string_kv_len(k, v));
        string_kv(w, k, v);
    }
    for group in &scopes {
        // ResourceSpans.scope_spans = 2: ScopeSpans.scope = 1, spans = 2, schema_url = 3
        header(w, 2, group.len);
        header(w, 1, scope_len(group.scope));
        write_scope(w, group.scope);
        for span in &group.spans {
            header(w, 2, span.len);
            write_span(w, span.span, &span.state);
        }
        string_field(w, 3, group.scope.schema_url().unwrap_or_default());
    }
    debug_assert_eq!(out.len(), field_len(1, resource_spans_len));
    out
}

/// A span, its encoded length and its trace state's header.
struct Sized<'s> {
    span: &'s SpanData,
    len: usize,
    state: String,
}

/// The spans of one instrumentation scope, and their `ScopeSpans` message's length.
struct Scope<'s> {
    scope: &'s InstrumentationScope,
    len: usize,
    spans: Vec<&'s Sized<'s>>,
}

// --- InstrumentationScope: name 1, version 2, attributes 3 ---

fn scope_len(scope: &InstrumentationScope) -> usize {
    string_field_len(1, scope.name())
        + string_field_len(2, scope.version().unwrap_or_default())
        + scope
            .attributes()
            .map(|kv| field_len(3, kv_len(kv)))
            .sum::<usize>()
}

fn write_scope(w: &mut Vec<u8>, scope: &InstrumentationScope) {
    string_field(w, 1, scope.name());
    string_field(w, 2, scope.version().unwrap_or_default());
    for kv in scope.attributes() {
        write_kv(w, 3, kv);
    }
}

// --- Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
// start 7, end 8, attributes 9, dropped_attributes_count 10, events 11, dropped_events 12,
// links 13, dropped_links 14, status 15, flags 16 ---

fn span_len(span: &SpanData, state: &str) -> usize {
    let parent = match span.parent_span_id {
        SpanId::INVALID => 0,
        _ => field_len(4, 8),
    };
    field_len(1, 16)
        + field_len(2, 8)
        + string_field_len(3, state)
        + parent
        + string_field_len(5, &span.name)
        + varint_field_len(6, kind(&span.span_kind))
        + 2 * (1 + 8)
        + span
            .attributes
            .iter()
            .map(|kv| field_len(9, kv_len(kv)))
            .sum::<usize>()
        + varint_field_len(10, u64::from(span.dropped_attributes_count))
        + span
            .events
            .iter()
            .map(|e| field_len(11, event_len(e)))
            .sum::<usize>()
        + varint_field_len(12, u64::from(span.events.dropped_count))
        + span
            .links
            .iter()
            .map(|l| field_len(13, link_len(l)))
            .sum::<usize>()
        + varint_field_len(14, u64::from(span.links.dropped_count))
        + field_len(15, status_len(&span.status))
        + 2
        + 4
}

fn write_span(w: &mut Vec<u8>, span: &SpanData, state: &str) {
    let cx = &span.span_context;
    bytes_field(w, 1, &cx.trace_id().to_bytes());
    bytes_field(w, 2, &cx.span_id().to_bytes());
    string_field(w, 3, state);
    if span.parent_span_id != SpanId::INVALID {
        bytes_field(w, 4, &span.parent_span_id.to_bytes());
    }
    string_field(w, 5, &span.name);
    varint_field(w, 6, kind(&span.span_kind));
    fixed64_field(w, 7, nanos(span.start_time));
    fixed64_field(w, 8, nanos(span.end_time));
    for kv in &span.attributes {
        write_kv(w, 9, kv);
    }
    varint_field(w, 10, u64::from(span.dropped_attributes_count));
    for event in span.events.iter() {
        header(w, 11, event_len(event));
        write_event(w, event);
    }
    varint_field(w, 12, u64::from(span.events.dropped_count));
    for link in span.links.iter() {
        header(w, 13, link_len(link));
        write_link(w, link);
    }
    varint_field(w, 14, u64::from(span.links.dropped_count));
    header(w, 15, status_len(&span.status));
    write_status(w, &span.status);
    // flags = 16, fixed32: its key takes two bytes.
    key(w, 16, FIXED32);
    w.extend_from_slice(&flags(cx.trace_flags().to_u8(), span.parent_span_is_remote).to_le_bytes());
}

fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn flags(trace_flags: u8, remote: bool) -> u32 {
    u32::from(trace_flags) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

// --- Status: message 2, code 3 (Unset 0, Ok 1, Error 2) ---

fn status_parts(status: &Status) -> (&str, u64) {
    match status {
        Status::Unset => ("", 0),
        Status::Ok => ("", 1),
        Status::Error { description } => (description, 2),
    }
}

fn status_len(status: &Status) -> usize {
    let (message, code) = status_parts(status);
    string_field_len(2, message) + varint_field_len(3, code)
}

fn write_status(w: &mut Vec<u8>, status: &Status) {
    let (message, code) = status_parts(status);
    string_field(w, 2, message);
    varint_field(w, 3, code);
}

// --- Event: time 1, name 2, attributes 3, dropped 4 ---

fn event_len(event: &opentelemetry::trace::Event) -> usize {
    (1 + 8)
        + string_field_len(2, &event.name)
        + event
            .attributes
            .iter()
            .map(|kv| field_len(3, kv_len(kv)))
            .sum::<usize>()
        + varint_field_len(4, u64::from(event.dropped_attributes_count))
}

fn write_event(w: &mut Vec<u8>, event: &opentelemetry::trace::Event) {
    fixed64_field(w, 1, nanos(event.timestamp));
    string_field(w, 2, &event.name);
    for kv in &event.attributes {
        write_kv(w, 3, kv);
    }
    varint_field(w, 4, u64::from(event.dropped_attributes_count));
}

// --- Link: trace_id 1, span_id 2, trace_state 3, attributes 4, dropped 5, flags 6 ---

fn link_len(link: &opentelemetry::trace::Link) -> usize {
    field_len(1, 16)
        + field_len(2, 8)
        + string_field_len(3, &link.span_context.trace_state().header())
        + link
            .attributes
            .iter()
            .map(|kv| field_len(4, kv_len(kv)))
            .sum::<usize>()
        + varint_field_len(5, u64::from(link.dropped_attributes_count))
        + (1 + 4)
}

fn write_link(w: &mut Vec<u8>, link: &opentelemetry::trace::Link) {
    let cx = &link.span_context;
    bytes_field(w, 1, &cx.trace_id().to_bytes());
    bytes_field(w, 2, &cx.span_id().to_bytes());
    string_field(w, 3, &cx.trace_state().header());
    for kv in &link.attributes {
        write_kv(w, 4, kv);
    }
    varint_field(w, 5, u64::from(link.dropped_attributes_count));
    key(w, 6, FIXED32);
    w.extend_from_slice(&flags(cx.trace_flags().to_u8(), cx.is_remote()).to_le_bytes());
}

// --- KeyValue: key 1, value 2; AnyValue: string 1, bool 2, int 3, double 4, array 5;
// ArrayValue: values 1 ---

#[inline]
fn kv_len(kv: &KeyValue) -> usize {
    match short_kv(kv) {
        Some(short) => short.len,
        None => string_field_len(1, kv.key.as_str()) + field_len(2, value_len(&kv.value)),
    }
}

/// `kv` as field `field` of its message: its length, then its key and value (the value
/// measured once for both).
#[inline]
fn write_kv(w: &mut Vec<u8>, field: u32, kv: &KeyValue) {
    if let Some(short) = short_kv(kv)
        && field < 16
    {
        // The common case, with every length one byte: the fixed bytes go in as two small
        // arrays around the key and the value, not a byte at a time.
        let key = kv.key.as_str();
        w.extend_from_slice(&[
            (field << 3) as u8 | LEN,
            short.len as u8,
            0x0a,
            key.len() as u8,
        ]);
        w.extend_from_slice(key.as_bytes());
        match short.value {
            Short::String(s) => {
                w.extend_from_slice(&[0x12, short.value_len as u8, 0x0a, s.len() as u8]);
                w.extend_from_slice(s.as_bytes());
            }
            Short::I64(v) => {
                w.extend_from_slice(&[0x12, short.value_len as u8, 3 << 3 | VARINT]);
                varint(w, v as u64);
            }
        }
        return;
    }
    let value = value_len(&kv.value);
    header(
        w,
        field,
        string_field_len(1, kv.key.as_str()) + field_len(2, value),
    );
    string_field(w, 1, kv.key.as_str());
    header(w, 2, value);
    write_value(w, &kv.value);
}

/// A string or integer attribute with a key, whose `KeyValue` message is under 128 bytes so
/// that each of its lengths takes one byte: most of a span's attributes.
struct ShortKv<'a> {
    /// The `KeyValue` message's length.
    len: usize,
    /// Its `AnyValue`'s length.
    value_len: usize,
    value: Short<'a>,
}

enum Short<'a> {
    String(&'a str),
    I64(i64),
}

#[inline]
fn short_kv(kv: &KeyValue) -> Option<ShortKv<'_>> {
    let key = kv.key.as_str().len();
    let (value, value_len) = match &kv.value {
        Value::String(s) => (Short::String(s.as_str()), 2 + s.as_str().len()),
        Value::I64(v) => (Short::I64(*v), 1 + varint_len(*v as u64)),
        _ => return None,
    };
    // the key (tag, length, bytes), then the value (tag, length, its AnyValue)
    let len = 2 + key + 2 + value_len;
    (key > 0 && len < 128).then_some(ShortKv {
        len,
        value_len,
        value,
    })
}

fn string_kv_len(k: &str, v: &str) -> usize {
    string_field_len(1, k) + field_len(2, field_len(1, v.len()))
}

fn string_kv(w: &mut Vec<u8>, k: &str, v: &str) {
    string_field(w, 1, k);
    header(w, 2, field_len(1, v.len()));
    header(w, 1, v.len());
    w.extend_from_slice(v.as_bytes());
}

/// An `AnyValue`'s one field is written even when it holds its type's default (a `false`,
/// a `0`, an empty string): which of the oneof's fields is present is the value's type.
#[inline]
fn value_len(value: &Value) -> usize {
    match value {
        Value::Bool(_) => 1 + 1,
        Value::I64(v) => 1 + varint_len(*v as u64),
        Value::F64(_) => 1 + 8,
        Value::String(s) => field_len(1, s.as_str().len()),
        Value::Array(array) => field_len(5, array_len(array)),
        _ => 0,
    }
}

#[inline]
fn write_value(w: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(v) => {
            key(w, 2, VARINT);
            varint(w, u64::from(*v));
        }
        Value::I64(v) => {
            key(w, 3, VARINT);
            varint(w, *v as u64);
        }
        Value::F64(v) => {
            key(w, 4, FIXED64);
            w.extend_from_slice(&v.to_le_bytes());
        }
        Value::String(s) => {
            header(w, 1, s.as_str().len());
            w.extend_from_slice(s.as_str().as_bytes());
        }
        Value::Array(array) => {
            header(w, 5, array_len(array));
            write_array(w, array);
        }
        _ => {}
    }
}

/// Each element of an array, as a `Value` of its own (cheap: numbers, or a string's
/// reference-counted or static text).
fn elements(array: &Array) -> Vec<Value> {
    match array {
        Array::Bool(v) => v.iter().map(|&b| Value::Bool(b)).collect(),
        Array::I64(v) => v.iter().map(|&i| Value::I64(i)).collect(),
        Array::F64(v) => v.iter().map(|&f| Value::F64(f)).collect(),
        Array::String(v) => v
            .iter()
            .map(|s: &StringValue| Value::String(s.clone()))
            .collect(),
        _ => Vec::new(),
    }
}

fn array_len(array: &Array) -> usize {
    elements(array)
        .iter()
        .map(|v| field_len(1, value_len(v)))
        .sum()
}

fn write_array(w: &mut Vec<u8>, array: &Array) {
    for v in elements(array) {
        header(w, 1, value_len(&v));
        write_value(w, &v);
    }
}

// --- the wire ---

#[inline]
fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

#[inline]
fn varint(w: &mut Vec<u8>, mut v: u64) {
    if v < 0x80 {
        // Most are: a key, a short string's length.
        w.push(v as u8);
        return;
    }
    while v >= 0x80 {
        w.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

#[inline]
fn key(w: &mut Vec<u8>, field: u32, wire: u8) {
    varint(w, u64::from(field) << 3 | u64::from(wire));
}

#[inline]
fn key_len(field: u32) -> usize {
    varint_len(u64::from(field) << 3)
}

/// A length-delimited field of `len` bytes, key and length included.
#[inline]
fn field_len(field: u32, len: usize) -> usize {
    key_len(field) + varint_len(len as u64) + len
}

/// The key and length of a length-delimited field whose `len` bytes follow.
#[inline]
fn header(w: &mut Vec<u8>, field: u32, len: usize) {
    key(w, field, LEN);
    varint(w, len as u64);
}

/// Proto3 leaves out a scalar field that holds its default (an empty string, a zero).
#[inline]
fn string_field_len(field: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        field_len(field, s.len())
    }
}

#[inline]
fn string_field(w: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        bytes_field(w, field, s.as_bytes());
    }
}

#[inline]
fn bytes_field(w: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    header(w, field, bytes.len());
    w.extend_from_slice(bytes);
}

#[inline]
fn varint_field_len(field: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(field) + varint_len(v)
    }
}

#[inline]
fn varint_field(w: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        key(w, field, VARINT);
        varint(w, v);
    }
}

#[inline]
fn fixed64_field(w: &mut Vec<u8>, field: u32, v: u64) {
    key(w, field, FIXED64);
    w.extend_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use opentelemetry::trace::{Event, Link, SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message;

    use super::*;

    fn span(
        name: &'static str,
        kind: SpanKind,
        parent: u64,
        scope: &InstrumentationScope,
    ) -> SpanData {
        let start = UNIX_EPOCH + Duration::from_nanos(1_764_288_000_123_456_789);
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(0x0af7651916cd43dd8448eb211c80319c_u128),
                SpanId::from(0xb7ad6b7169203331_u64 + parent),
                TraceFlags::SAMPLED,
                false,
                TraceState::from_key_value([("vendor", "v1")]).unwrap(),
            ),
            parent_span_id: SpanId::from(parent),
            parent_span_is_remote: parent == 7,
            span_kind: kind,
            name: Cow::Borrowed(name),
            start_time: start,
            end_time: start + Duration::from_micros(1234),
            attributes: vec![
                KeyValue::new("http.request.method", "GET"),
                KeyValue::new("http.response.status_code", 429_i64),
                KeyValue::new("negative", -3_i64),
                KeyValue::new("ratio", 0.25),
                KeyValue::new("flag", false),
                KeyValue::new("empty", ""),
                KeyValue::new(
                    "list",
                    Value::Array(Array::String(vec!["a".into(), "bc".into()])),
                ),
                KeyValue::new("numbers", Value::Array(Array::I64(vec![0, 1, 300]))),
                // Around the short attributes' bound: a KeyValue of 127 bytes, then 128.
                KeyValue::new("edge127", "y".repeat(114)),
                KeyValue::new("edge128", "z".repeat(115)),
                KeyValue::new("long", "x".repeat(300)),
                KeyValue::new("big", i64::MIN),
                KeyValue::new("", "no key"),
            ],
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: if parent == 0 {
                Status::error("upstream failed")
            } else {
                Status::Unset
            },
            instrumentation_scope: scope.clone(),
        }
    }

    /// What opentelemetry-proto's own conversion makes of `spans` (what opentelemetry-otlp
    /// would send).
    fn reference(
        resource: &opentelemetry_sdk::Resource,
        spans: Vec<SpanData>,
    ) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(resource),
            ),
        }
    }

    fn resource() -> opentelemetry_sdk::Resource {
        opentelemetry_sdk::Resource::builder_empty()
            .with_service_name("floodgate")
            .with_attribute(KeyValue::new("service.version", "1.2.3"))
            .build()
    }

    #[test]
    fn decodes_as_opentelemetry_protos_own_conversion() {
        let floodgate = InstrumentationScope::builder("floodgate").build();
        let other = InstrumentationScope::builder("other")
            .with_version("0.1")
            .with_attributes([KeyValue::new("scope.attr", 1_i64)])
            .build();
        let mut with_extras = span("GET /api", SpanKind::Server, 7, &floodgate);
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "retry",
            UNIX_EPOCH + Duration::from_secs(5),
            vec![KeyValue::new("attempt", 2_i64)],
            1,
        ));
        events.dropped_count = 3;
        with_extras.events = events;
        let mut links = SpanLinks::default();
        links.links.push(Link::new(
            SpanContext::new(
                TraceId::from(9_u128),
                SpanId::from(8_u64),
                TraceFlags::SAMPLED,
                true,
                TraceState::NONE,
            ),
            vec![KeyValue::new("why", "batch")],
            0,
        ));
        with_extras.links = links;
        with_extras.dropped_attributes_count = 2;
        let spans = vec![
            span("GET /api", SpanKind::Server, 0, &floodgate),
            span("decide redis", SpanKind::Client, 1, &floodgate),
            span("elsewhere", SpanKind::Internal, 2, &other),
            span("GET", SpanKind::Client, 1, &floodgate),
            with_extras,
        ];
        let resource = resource();
        let body = encode(&Resource::new(&resource), &spans);
        let decoded = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        assert_eq!(decoded, reference(&resource, spans));
    }

    #[test]
    fn an_empty_batch_is_one_resource_with_no_scopes() {
        let resource = resource();
        let body = encode(&Resource::new(&resource), &[]);
        let decoded = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        assert_eq!(decoded.resource_spans.len(), 1);
        assert!(decoded.resource_spans[0].scope_spans.is_empty());
    }

    #[test]
    fn varints_take_seven_bits_a_byte() {
        for v in [0_u64, 1, 127, 128, 300, 16_383, 16_384, u64::MAX] {
            let mut w = Vec::new();
            varint(&mut w, v);
            assert_eq!(w.len(), varint_len(v), "{v}");
            assert_eq!(
                prost::encoding::decode_varint(&mut w.as_slice()).unwrap(),
                v
            );
        }
    }
}
