//! Floodgate's own answers a route shapes: its refusal templates (`refusals:`, loaded in
//! `config/route/template.rs`) by refusal name, and its CORS preflights (`cors:`).

use http::{HeaderMap, Response, StatusCode};

use super::{Body, Rejection};
use crate::config::Cors;

impl Rejection {
    /// This refusal's name in `refusals:`, if a route's template may replace its body: one of
    /// [`crate::config::REFUSAL_NAMES`]. A request with no route, or refused before routing,
    /// has none.
    pub fn refusal_name(&self) -> Option<&'static str> {
        Some(match self {
            Rejection::RateLimited(..) => "rate_limited",
            Rejection::Banned(_) => "banned",
            Rejection::UpstreamOverloaded => "overloaded",
            Rejection::WaitingRoom { .. } => "waiting_room",
            Rejection::InvalidApiKey => "invalid_key",
            Rejection::InvalidToken => "invalid_token",
            Rejection::LimiterUnavailable => "store_unavailable",
            Rejection::NoUpstream => "no_upstream",
            Rejection::BadGateway(_) => "upstream_unreachable",
            Rejection::GatewayTimeout => "upstream_timeout",
            Rejection::PayloadTooLarge => "payload_too_large",
            Rejection::RequestTimeout => "request_body_timeout",
            Rejection::BadRequest(_) => "bad_request",
            Rejection::NoRoute
            | Rejection::InvalidArgument(_)
            | Rejection::TooManyStreams
            | Rejection::LoopDetected
            | Rejection::DeadlineExceeded => return None,
        })
    }
}

/// The answer to a CORS preflight on a route with `cors` (`req`: the preflight's headers):
/// 204, with what the route allows when the origin is allowed, no CORS header when not.
pub fn preflight(cors: &Cors, req: &HeaderMap) -> Response<Body> {
    let mut response = Response::new(super::full(bytes::Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    *response.headers_mut() = cors.preflight_headers(req);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_name_the_config_accepts_is_some_refusals_name() {
        let named: Vec<_> = [
            Rejection::Banned(1),
            Rejection::UpstreamOverloaded,
            Rejection::WaitingRoom {
                position: 1,
                eta_secs: 1,
            },
            Rejection::InvalidApiKey,
            Rejection::InvalidToken,
            Rejection::LimiterUnavailable,
            Rejection::NoUpstream,
            Rejection::BadGateway(String::new()),
            Rejection::GatewayTimeout,
            Rejection::PayloadTooLarge,
            Rejection::RequestTimeout,
            Rejection::BadRequest(String::new()),
        ]
        .iter()
        .filter_map(Rejection::refusal_name)
        .chain(["rate_limited"])
        .collect();
        for name in crate::config::REFUSAL_NAMES {
            assert!(named.contains(&name), "{name}");
        }
        assert_eq!(named.len(), crate::config::REFUSAL_NAMES.len());
    }
}
