//! `GET /check`: forward auth for nginx's `auth_request`, Caddy's `forward_auth` and Traefik's
//! `forwardAuth`. The proxy in front sends floodgate the client's request headers (and, by
//! convention, the original method and URI in `X-Forwarded-Method` / `X-Forwarded-Uri` or
//! `X-Original-URI`); `service.forward_auth` says which descriptors of which domain to build
//! from them, and the request is then decided as a `ShouldRateLimit` call is.

use std::net::IpAddr;

use http::HeaderMap;

use super::rls::{DescriptorEntry, RateLimitDescriptor, RateLimitRequest};
use crate::config::{EntrySource, ForwardAuthConfig};
use crate::identity::IdentityConfig;

/// The `ShouldRateLimit` request `/check` decides for a request with `headers`, from `peer`
/// (the proxy in front), its query `query`. A descriptor one of whose values the request lacks
/// is not sent, as Envoy does.
pub fn request(
    config: &ForwardAuthConfig,
    identity: &IdentityConfig,
    headers: &HeaderMap,
    query: Option<&str>,
    peer: IpAddr,
) -> RateLimitRequest {
    let mut descriptors = Vec::with_capacity(config.descriptors.len());
    'descriptors: for descriptor in &config.descriptors {
        let mut entries = Vec::with_capacity(descriptor.len());
        for (key, source) in descriptor {
            let value = match source {
                EntrySource::ClientIp => identity.client_addr(headers, peer).to_string(),
                EntrySource::Header(name) => match headers.get(name).map(|v| v.to_str()) {
                    Some(Ok(v)) if !v.is_empty() => v.to_string(),
                    _ => continue 'descriptors,
                },
                EntrySource::Query(name) => match query_value(query, name) {
                    Some(v) => v,
                    None => continue 'descriptors,
                },
                EntrySource::Literal(text) => text.clone(),
            };
            entries.push(DescriptorEntry {
                key: key.clone(),
                value,
            });
        }
        descriptors.push(RateLimitDescriptor {
            entries,
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        });
    }
    RateLimitRequest {
        domain: config.domain.clone(),
        descriptors,
        hits_addend: 0,
    }
}

fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}
