//! The messages of Envoy's rate limit service (`envoy/service/ratelimit/v3/rls.proto` and
//! `envoy/extensions/common/ratelimit/v3/ratelimit.proto`), field for field, encoded and decoded
//! by `prost` (its derive: no code generation step, no `protoc`). Only the fields floodgate reads
//! or writes are declared; prost skips the others on decoding, as proto3 requires.
//!
//! Also their proto3 JSON form, for `POST /json` (envoyproxy/ratelimit's HTTP endpoint).

use serde_json::{Value, json};

/// `RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Units each descriptor spends (0, unset: 1), unless a descriptor says its own.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<DescriptorEntry>,
    /// `hits_addend` as a `google.protobuf.UInt64Value`: set (0 included) overrides the
    /// request's.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// Gives `hits_addend` units back instead of spending them.
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorEntry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// [`Code`]: never `UNKNOWN` (Envoy treats it as OK).
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
}

/// `RateLimitResponse.Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 1,
    OverLimit = 2,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

impl RateLimitRequest {
    /// The request in envoyproxy/ratelimit's JSON (`{"domain", "descriptors": [{"entries":
    /// [{"key", "value"}], "hitsAddend"?}], "hitsAddend"?}`), or what is wrong with it.
    pub fn from_json(value: &Value) -> Result<RateLimitRequest, String> {
        let object = value.as_object().ok_or("the body is not a JSON object")?;
        let domain = match object.get("domain") {
            Some(Value::String(d)) => d.clone(),
            None => String::new(),
            Some(_) => return Err("domain is not a string".into()),
        };
        let hits = |v: Option<&Value>, what: &str| -> Result<Option<u64>, String> {
            match v {
                None | Some(Value::Null) => Ok(None),
                // proto3 JSON writes 64-bit integers as strings; either is read.
                Some(Value::String(s)) => s
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("{what} is not a count")),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| format!("{what} is not a count")),
            }
        };
        let hits_addend = hits(
            object.get("hitsAddend").or(object.get("hits_addend")),
            "hitsAddend",
        )?
        .map(|h| u32::try_from(h).map_err(|_| "hitsAddend is above 2^32-1".to_string()))
        .transpose()?
        .unwrap_or(0);
        let mut descriptors = Vec::new();
        let listed = match object.get("descriptors") {
            Some(Value::Array(list)) => list.as_slice(),
            None => &[],
            Some(_) => return Err("descriptors is not a list".into()),
        };
        for (i, d) in listed.iter().enumerate() {
            let entries = d
                .get("entries")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("descriptors[{i}].entries is not a list"))?;
            let mut out = Vec::with_capacity(entries.len());
            for (j, e) in entries.iter().enumerate() {
                let text = |name: &str| match e.get(name) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    None => Ok(String::new()),
                    Some(_) => Err(format!(
                        "descriptors[{i}].entries[{j}].{name} is not a string"
                    )),
                };
                out.push(DescriptorEntry {
                    key: text("key")?,
                    value: text("value")?,
                });
            }
            descriptors.push(RateLimitDescriptor {
                entries: out,
                hits_addend: hits(
                    d.get("hitsAddend").or(d.get("hits_addend")),
                    &format!("descriptors[{i}].hitsAddend"),
                )?
                .map(|value| UInt64Value { value }),
                is_negative_hits: d
                    .get("isNegativeHits")
                    .or(d.get("is_negative_hits"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            });
        }
        Ok(RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
    }
}

impl RateLimitResponse {
    /// The answer in proto3 JSON, as envoyproxy/ratelimit's `/json` writes it.
    pub fn to_json(&self, units: impl Fn(i32) -> &'static str) -> Value {
        let code = |c: i32| match c {
            1 => "OK",
            2 => "OVER_LIMIT",
            _ => "UNKNOWN",
        };
        let statuses: Vec<Value> = self
            .statuses
            .iter()
            .map(|s| {
                let mut status = json!({ "code": code(s.code) });
                if let Some(limit) = &s.current_limit {
                    let mut current = json!({
                        "requestsPerUnit": limit.requests_per_unit,
                        "unit": units(limit.unit),
                    });
                    if !limit.name.is_empty() {
                        current["name"] = json!(limit.name);
                    }
                    status["currentLimit"] = current;
                }
                if s.limit_remaining != 0 {
                    status["limitRemaining"] = json!(s.limit_remaining);
                }
                if let Some(d) = &s.duration_until_reset {
                    status["durationUntilReset"] = json!(format!("{}s", d.seconds));
                }
                status
            })
            .collect();
        let headers: Vec<Value> = self
            .response_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
        let mut out = json!({ "overallCode": code(self.overall_code), "statuses": statuses });
        if !headers.is_empty() {
            out["responseHeadersToAdd"] = json!(headers);
        }
        out
    }
}
