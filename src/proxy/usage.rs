//! `GET {usage_path}` on the proxy listener: a client asks how much it has left (GitHub's
//! `/rate_limit`). The caller is identified as any request is (API key or consumer, verified
//! token, trusted user id, address), and gets its own budgets on every route with limits, as
//! `/budgets` computes them: the store's figures now, spending nothing. Never forwarded.
//!
//! The endpoint is limited per identity by a token bucket in this process ([`USAGE_CAPACITY`]
//! at once, [`USAGE_RATE`] a second), so that it cannot be used to load the store: past it, a
//! 429 with `Retry-After` like any other.

use std::sync::LazyLock;

use http::{HeaderValue, Request, Response};
use serde_json::{Value, json};

use super::body::ClientBody;
use super::context::Context;
use super::{Proxy, Snapshot};
use crate::answer::{self, Body, RateLimitHeaders, Rejection};
use crate::config::RequestView;
use crate::decider::{Decider, Peek, Question, Side, Take, Taken};
use crate::identity::ip_octets;
use crate::limiter::{Algorithm, Ask, BudgetKey, KeyKind, Limit, Limiter, wall_clock_us};

/// How many usage requests an identity may make at once.
pub const USAGE_CAPACITY: u32 = 10;
/// How many more it may make a second.
pub const USAGE_RATE: f64 = 1.0;

static USAGE_LIMIT: LazyLock<Option<Limit>> = LazyLock::new(|| {
    Algorithm::token_bucket(USAGE_CAPACITY, USAGE_RATE)
        .ok()
        .map(Limit::of)
});

impl Proxy {
    /// Answers `GET {usage_path}`.
    pub(super) async fn usage(
        &self,
        snapshot: &Snapshot,
        req: &Request<ClientBody>,
        ctx: &mut Context,
    ) -> Result<Response<Body>, Rejection> {
        let verified = Self::verify_token(snapshot, req).await?;
        let whose = Self::identify(
            snapshot,
            req,
            verified.as_ref(),
            ctx.peer,
            ctx.log.as_deref_mut(),
        )?;
        let (mut id_buf, mut ip_buf) = ([0u8; 16], [0u8; 16]);
        let id = whose.identity.key_bytes(&mut id_buf);
        let ip = ip_octets(whose.ip, &mut ip_buf);
        let kind = KeyKind::from(whose.identity.kind());
        // The endpoint's own limit, per identity, in this process: decided by the decider on
        // the in-process store (a poll of one's own budgets costs no store round trip).
        if let Some(limit) = USAGE_LIMIT.as_ref() {
            let ask = Ask {
                limit,
                key: BudgetKey {
                    budget: "usage_path",
                    kind,
                    value: id,
                },
            };
            let here = Limiter::Memory(self.core.limiter().memory().clone());
            let decider = Decider {
                limiter: &here,
                metrics: None,
                ..self.decider(snapshot)
            };
            let own = [Taken {
                ask,
                side: Side::Enforced,
                take: Take::Spend,
            }];
            if let Some(refused) = decider.decide(Question::limits(&own)).await.refused {
                return Err(refused.into());
            }
        }
        let decider = self.decider(snapshot);
        let now_us = wall_clock_us();
        // Composite keys read this request as the proxy reads one to the route: its headers,
        // query and token claims (no path segment past the route's prefix).
        let view = RequestView {
            headers: req.headers(),
            query: req.uri().query(),
            rest: "",
            claims: verified.as_ref().map(|v| &v.claims),
            json: None,
        };
        let who = Peek {
            tier: whose.tier,
            identity: Some((kind, id)),
            ip: Some(ip),
            view: &view,
        };
        let mut routes = Vec::new();
        for route in snapshot.routes.routes() {
            if route.enforced.is_empty() {
                continue;
            }
            let limits: Vec<Value> = decider
                .peek_route(route, &who, false)
                .await
                .map_err(|_| Rejection::LimiterUnavailable)?
                .into_iter()
                .filter_map(|peeked| {
                    let (remaining, reset_us) = peeked.figures?;
                    Some(json!({
                        "algorithm": peeked.algorithm,
                        "per": peeked.per,
                        "limit": peeked.limit,
                        "remaining": remaining,
                        "reset": (now_us + reset_us).div_ceil(1_000_000),
                    }))
                })
                .collect();
            routes.push(json!({ "route": &*route.name, "limits": limits }));
        }
        let body = json!({
            "identity_kind": whose.identity.kind().as_str(),
            "routes": routes,
        });
        let mut response = Response::new(answer::full(body.to_string()));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response.headers_mut().insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        Ok(response)
    }
}

/// The headers a refused usage request is answered with: none of a route's.
pub(super) fn headers() -> RateLimitHeaders {
    RateLimitHeaders::none()
}
