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
    /// `limit`: the caller's override of the limit. Read (so a malformed one is refused like
    /// any malformed field) and not applied: the limits are the service's config.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `hits_addend` as a `google.protobuf.UInt64Value`: set (0 included) overrides the
    /// request's.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// Gives `hits_addend` units back instead of spending them.
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
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
    /// [{"key", "value"}], "hitsAddend"?, "isNegativeHits"?, "limit"?}], "hitsAddend"?}`), or
    /// what is wrong with it. Read as proto3 JSON is: each field by its JSON name or its proto
    /// name, `null` as absent, and nothing else. A field of the wrong type or one the message
    /// does not have is an error naming it, so a typo never decides (`"isNegativeHits": "yes"`
    /// would spend where the caller meant to give back).
    pub fn from_json(value: &Value) -> Result<RateLimitRequest, String> {
        let object = fields(value, "the body", &["domain", "descriptors", "hitsAddend"])?;
        let domain = text(object.get("domain"), "domain")?;
        let hits_addend = count(object.get("hitsAddend"), "hitsAddend")?
            .map(|h| u32::try_from(h).map_err(|_| "hitsAddend is above 2^32-1".to_string()))
            .transpose()?
            .unwrap_or(0);
        let mut descriptors = Vec::new();
        let listed = match object.get("descriptors") {
            Some(Value::Array(list)) => list.as_slice(),
            None | Some(Value::Null) => &[],
            Some(_) => return Err("descriptors is not a list".into()),
        };
        for (i, d) in listed.iter().enumerate() {
            let at = format!("descriptors[{i}]");
            let d = fields(
                d,
                &at,
                &["entries", "limit", "hitsAddend", "isNegativeHits"],
            )?;
            let entries = match d.get("entries") {
                Some(Value::Array(list)) => list.as_slice(),
                None | Some(Value::Null) => &[],
                Some(_) => return Err(format!("{at}.entries is not a list")),
            };
            let mut out = Vec::with_capacity(entries.len());
            for (j, e) in entries.iter().enumerate() {
                let at = format!("{at}.entries[{j}]");
                let e = fields(e, &at, &["key", "value"])?;
                out.push(DescriptorEntry {
                    key: text(e.get("key"), &format!("{at}.key"))?,
                    value: text(e.get("value"), &format!("{at}.value"))?,
                });
            }
            let limit = match d.get("limit") {
                None | Some(Value::Null) => None,
                Some(l) => {
                    let at = format!("{at}.limit");
                    let l = fields(l, &at, &["requestsPerUnit", "unit"])?;
                    let requests_per_unit =
                        count(l.get("requestsPerUnit"), &format!("{at}.requestsPerUnit"))?
                            .map(|n| {
                                u32::try_from(n)
                                    .map_err(|_| format!("{at}.requestsPerUnit is above 2^32-1"))
                            })
                            .transpose()?
                            .unwrap_or(0);
                    let unit = match l.get("unit") {
                        None | Some(Value::Null) => 0,
                        Some(Value::String(name)) => super::rules::Unit::number_of(name)
                            .ok_or_else(|| format!("{at}.unit is not a unit"))?,
                        Some(Value::Number(n)) => n
                            .as_i64()
                            .and_then(|n| i32::try_from(n).ok())
                            .ok_or_else(|| format!("{at}.unit is not a unit"))?,
                        Some(_) => return Err(format!("{at}.unit is not a unit")),
                    };
                    Some(RateLimitOverride {
                        requests_per_unit,
                        unit,
                    })
                }
            };
            descriptors.push(RateLimitDescriptor {
                entries: out,
                limit,
                hits_addend: count(d.get("hitsAddend"), &format!("{at}.hitsAddend"))?
                    .map(|value| UInt64Value { value }),
                is_negative_hits: match d.get("isNegativeHits") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err(format!("{at}.isNegativeHits is not true or false")),
                },
            });
        }
        Ok(RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
    }
}

/// `value` as an object whose fields are among `known` (each by its JSON name, or its proto
/// name: `hitsAddend` or `hits_addend`), with every field under its JSON name.
fn fields(
    value: &Value,
    what: &str,
    known: &[&str],
) -> Result<serde_json::Map<String, Value>, String> {
    let Value::Object(object) = value else {
        return Err(format!("{what} is not a JSON object"));
    };
    let mut out = serde_json::Map::with_capacity(object.len());
    for (name, v) in object {
        let json_name = known
            .iter()
            .find(|k| **k == name || proto_name(k) == *name)
            .ok_or_else(|| format!("{what} has no field {name:?}"))?;
        if out.insert((*json_name).to_string(), v.clone()).is_some() {
            return Err(format!("{what} names {json_name} twice"));
        }
    }
    Ok(out)
}

/// A JSON name's proto field name: `hitsAddend` → `hits_addend`.
fn proto_name(json_name: &str) -> String {
    let mut out = String::with_capacity(json_name.len() + 2);
    for c in json_name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn text(value: Option<&Value>, what: &str) -> Result<String, String> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("{what} is not a string")),
    }
}

/// A whole, non-negative count: a JSON number or, as proto3 JSON writes 64-bit integers, a
/// string of digits.
fn count(value: Option<&Value>, what: &str) -> Result<Option<u64>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| format!("{what} is not a count")),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{what} is not a count")),
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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A length-delimited field `tag` holding `inner`.
    fn nested(tag: u32, inner: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, u64::from(tag << 3 | 2));
        varint(&mut out, inner.len() as u64);
        out.extend_from_slice(inner);
        out
    }

    #[test]
    fn a_truncated_varint_deep_inside_a_descriptors_limit_is_refused() {
        // limit { field 3 (varint): a varint cut short }
        let limit = [3 << 3, 0x80];
        let entry = nested(1, b"k"); // entry.key = "k"
        let mut descriptor = nested(1, &entry);
        descriptor.extend(nested(2, &limit));
        let mut request = nested(1, b"d");
        request.extend(nested(2, &descriptor));
        assert!(RateLimitRequest::decode(&request[..]).is_err());
        // The same request with the varint whole decodes.
        let limit = [3 << 3, 0x01];
        let mut descriptor = nested(1, &entry);
        descriptor.extend(nested(2, &limit));
        let mut request = nested(1, b"d");
        request.extend(nested(2, &descriptor));
        assert!(RateLimitRequest::decode(&request[..]).is_ok());
    }

    fn json(text: &str) -> Result<RateLimitRequest, String> {
        RateLimitRequest::from_json(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn every_mistyped_or_unknown_json_field_is_refused_by_name() {
        let base = r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}"#;
        assert!(json(base).is_ok());
        for (text, names) in [
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k"}], "isNegativeHits": "yes"}]}"#,
                "isNegativeHits",
            ),
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k"}], "is_negative_hits": 1}]}"#,
                "isNegativeHits",
            ),
            (r#"{"domain": 7, "descriptors": []}"#, "domain"),
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k"}], "hitsAddend": -1}]}"#,
                "hitsAddend",
            ),
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k"}], "hitsAddend": 1.5}]}"#,
                "hitsAddend",
            ),
            (
                r#"{"domain": "d", "hitsAddend": "many", "descriptors": []}"#,
                "hitsAddend",
            ),
            (
                r#"{"domain": "d", "descriptors": [{"entries": {"key": "k"}}]}"#,
                "entries",
            ),
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": 3}]}]}"#,
                "value",
            ),
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k", "vaule": "v"}]}]}"#,
                "vaule",
            ),
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k"}]}], "bogus": 1}"#,
                "bogus",
            ),
            (
                r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k"}], "limit": {"unit": "FORTNIGHT"}}]}"#,
                "unit",
            ),
            (
                r#"{"domain": "d", "descriptors": ["k=v"]}"#,
                "descriptors[0]",
            ),
            (
                r#"{"domain": "d", "hitsAddend": 1, "hits_addend": 2, "descriptors": []}"#,
                "hitsAddend",
            ),
        ] {
            let err = json(text).expect_err(text);
            assert!(err.contains(names), "{text}: {err}");
        }
    }

    #[test]
    fn proto_names_and_json_names_both_read() {
        let r = json(
            r#"{"domain": "d", "hits_addend": 2, "descriptors": [{"entries": [{"key": "k", "value": "v"}], "is_negative_hits": true, "hits_addend": "3"}]}"#,
        )
        .unwrap();
        assert_eq!(r.hits_addend, 2);
        assert!(r.descriptors[0].is_negative_hits);
        assert_eq!(r.descriptors[0].hits_addend, Some(UInt64Value { value: 3 }));
    }
}
