//! A route's own bodies for floodgate's refusals (`refusals:`), so that an API's clients read
//! its error format rather than floodgate's problem+json: one template per refusal name of the
//! answer table, with `{retry_after}`, `{limit}`, `{remaining}` and `{route}` filled in per
//! refusal. The status may be set; `Retry-After` and the rate-limit headers are written
//! whatever the template says, and a gRPC call keeps its gRPC status (templates are HTTP's).

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

/// The placeholders a template body may hold.
pub const PLACEHOLDERS: [&str; 4] = ["retry_after", "limit", "remaining", "route"];

/// Every refusal name `refusals:` may use, the answer table's (`answer/table.rs`) for refusals
/// that happen on a route: a request with no route, or refused before routing, has no template.
pub const NAMES: [&str; 13] = [
    "rate_limited",
    "banned",
    "overloaded",
    "waiting_room",
    "invalid_key",
    "invalid_token",
    "store_unavailable",
    "no_upstream",
    "upstream_unreachable",
    "upstream_timeout",
    "payload_too_large",
    "request_body_timeout",
    "bad_request",
];

/// A piece of a template's body.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    RetryAfter,
    Limit,
    Remaining,
    Route,
}

/// One refusal's template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    status: Option<StatusCode>,
    content_type: HeaderValue,
    body: Vec<Piece>,
}

/// What a template's placeholders are filled with.
pub struct Figures<'a> {
    /// `Retry-After`'s number (0 for a refusal without one).
    pub retry_after: u64,
    /// The headline limit's figures (0 for a refusal that no limit spoke for).
    pub limit: u64,
    pub remaining: u64,
    pub route: &'a str,
}

impl Template {
    /// A template from its parts: `Err` names the problem (an unknown placeholder, a status
    /// out of range, a content type that is not a header value).
    pub fn parse(status: Option<u16>, content_type: &str, body: &str) -> Result<Self, String> {
        let status = match status {
            None => None,
            Some(code @ 200..=599) => StatusCode::from_u16(code).ok(),
            Some(code) => return Err(format!("status {code} is not from 200 to 599")),
        };
        let content_type = HeaderValue::from_str(content_type)
            .map_err(|_| format!("content_type {content_type:?} is not a header value"))?;
        Ok(Template {
            status,
            content_type,
            body: pieces(body)?,
        })
    }

    /// The status, or the refusal's own.
    pub fn status(&self, own: StatusCode) -> StatusCode {
        self.status.unwrap_or(own)
    }

    pub fn content_type(&self) -> HeaderValue {
        self.content_type.clone()
    }

    /// The body with `figures` filled in.
    pub fn body(&self, figures: &Figures<'_>) -> Bytes {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(64);
        for piece in &self.body {
            // Writing to a String cannot fail.
            let _ = match piece {
                Piece::Text(text) => out.write_str(text),
                Piece::RetryAfter => write!(out, "{}", figures.retry_after),
                Piece::Limit => write!(out, "{}", figures.limit),
                Piece::Remaining => write!(out, "{}", figures.remaining),
                Piece::Route => out.write_str(figures.route),
            };
        }
        Bytes::from(out)
    }
}

/// A body split at its placeholders: `{name}` where `name` is lowercase letters and `_`; any
/// other brace (a JSON object's) is text. An unknown `{name}` is an error.
fn pieces(body: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut rest = body;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(after.len());
        if name_len == 0 || !after[name_len..].starts_with('}') {
            text.push_str(&rest[..=open]);
            rest = after;
            continue;
        }
        let piece = match &after[..name_len] {
            "retry_after" => Piece::RetryAfter,
            "limit" => Piece::Limit,
            "remaining" => Piece::Remaining,
            "route" => Piece::Route,
            other => {
                return Err(format!(
                    "{{{other}}} is not a placeholder (they are {})",
                    PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                ));
            }
        };
        text.push_str(&rest[..open]);
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut text)));
        }
        out.push(piece);
        rest = &after[name_len + 1..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// A route's templates, by refusal name, and the route's name for `{route}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Templates {
    pub route: std::sync::Arc<str>,
    pub by_name: Vec<(&'static str, Template)>,
}

impl Templates {
    /// The template for the refusal named `name`, if the route has one.
    pub fn get(&self, name: &str) -> Option<&Template> {
        self.by_name
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(t: &Template) -> String {
        let figures = Figures {
            retry_after: 7,
            limit: 100,
            remaining: 0,
            route: "api",
        };
        String::from_utf8(t.body(&figures).to_vec()).unwrap()
    }

    #[test]
    fn placeholders_are_filled_and_json_braces_are_text() {
        let t = Template::parse(
            Some(429),
            "application/json",
            r#"{"code": 42901, "retry_in": {retry_after}, "of": {limit}, "left": {remaining}, "route": "{route}"}"#,
        )
        .unwrap();
        assert_eq!(
            fill(&t),
            r#"{"code": 42901, "retry_in": 7, "of": 100, "left": 0, "route": "api"}"#
        );
        let plain = Template::parse(None, "text/plain", "slow down {}{ retry_after} {").unwrap();
        assert_eq!(fill(&plain), "slow down {}{ retry_after} {");
        assert_eq!(plain.status(StatusCode::TOO_MANY_REQUESTS), 429);
    }

    #[test]
    fn an_unknown_placeholder_or_status_is_refused_by_name() {
        let e = Template::parse(None, "text/plain", "wait {retry_in}").unwrap_err();
        assert!(
            e.contains("{retry_in}") && e.contains("{retry_after}"),
            "{e}"
        );
        let e = Template::parse(Some(99), "text/plain", "x").unwrap_err();
        assert!(e.contains("99"), "{e}");
        assert!(Template::parse(None, "text/plain\n", "x").is_err());
    }
}
