//! floodgate: an HTTP reverse proxy that rate-limits requests before they reach the API behind it.
//!
//! ```text
//!            ┌──────────────────── floodgate ──────────────────────────────────────────┐
//! client ──▶ │ accept ─▶ route ─▶ identify ─▶ limit ─▶ gate ─┬─▶ forward ─▶ respond ──│──▶ upstream
//!            │ (server)  (route)  (policy)    (policy,  (adaptive)  (proxy/     │       │  HTTP/1.1
//!            │                                limiter)      │    forward)     │       │  or HTTP/2
//!            │                                              └─▶ reject ───────┤       │
//!            │                                  429/503, or a gRPC status     ▼       │
//!            │                                            after the response: leases │
//!            └────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! The modules, in the order a request meets them:
//!
//! 1. [`server`]: accepts connections (TLS, HTTP/1.1 and HTTP/2; each must open within
//!    [`deadline`]'s first deadline), watches HTTP/2 abuse and idleness, hands each request to
//!    the proxy, drains on shutdown;
//! 2. [`proxy`]: `Proxy::handle`, the pipeline's phases in order over one per-request context:
//!    route, identify, limit, gate, forward, respond, and after the response (as far as they
//!    go without waiting in `Proxy::begin`, where floodgate's own answers are made; the rest in
//!    `Proxy::go_on`);
//! 3. [`route`]: the first route whose prefix and methods match (after [`path`] normalisation);
//! 4. [`policy`]: whose allowance the request spends, by the rules of [`identity`] (API key or
//!    consumer, user id, client IP) and the limits that apply to its tier, and the one limit
//!    phase that reads the store's answers; [`decider`]: the one decision, knowing no
//!    transport, that the proxy, `floodgate replay`, `/budgets` and the rate-limit service all
//!    call;
//! 5. [`limiter`]: the algorithms and the stores (memory, Redis, PostgreSQL) that decide
//!    all-or-nothing, with the guard that applies `on_error` when a store fails, batches and
//!    leases;
//! 6. [`adaptive`]: holds requests to an upstream at the limit it learned
//!    (`adaptive_concurrency`), by priority;
//! 7. [`proxy::forward`] and [`answer`]: the upstream call, over [`upstream::conn`]'s
//!    connections (HTTP/1.1 or HTTP/2, with trailers), and every status and header floodgate
//!    writes itself (in [`grpc`]'s words for a gRPC call);
//! 8. [`access_log`], [`metrics`], [`telemetry`], [`top`] and [`admin`]: what was decided, on
//!    the access log, `/metrics`, OpenTelemetry's traces, `/healthz`, `/readyz`, `/budgets`,
//!    `/top` and the dashboard; [`control`]: the bans and overrides the decider applies, which
//!    `/bans`, `/overrides` and `/reset` write; [`alerts`]: the webhooks the decider's
//!    admissions may set off; [`global`]: budgets shared across regions, whose slices the
//!    decider spends for `scope: global` limits.
//!
//! [`replay`] runs recorded traffic through the same decider, policy, limit phase and
//! algorithms, on the log's clock. [`service`] answers other proxies (Envoy's
//! `RateLimitService`, envoyproxy/ratelimit's `/json`, forward auth for nginx and Caddy) with the
//! same decider, on the same store. [`config`] turns the YAML file into the typed values all of these are built
//! from, and says what a reload changes ([`config::reload`]).
//!
//! # Words
//!
//! - A **limit** is one rule of a route: an algorithm with its numbers (`capacity`, `window`…),
//!   its `per:` (identity, ip, route), its `tiers:` and its cost ([`limiter::Limit`] and
//!   [`config::RouteLimit`]).
//! - A route's **budget** is its list of limits, enforced or shadow ([`config::Budget`]); a
//!   request asks every limit of a budget that applies to it, all-or-nothing.
//! - An **allowance** is what one client may still spend from one limit: the state a store keeps
//!   under a **key** ([`limiter::BudgetKey`]: the limit's id, the client's kind and value).
//! - An **ask** ([`limiter::Ask`]) is one limit asked about one request, naming the key it
//!   spends; a **decision** is one limit's answer, a **verdict** all of them together, and an
//!   **admission** what the limiter made of it (a store's verdict, or `on_error`'s answer).
//! - A **lease** is either a concurrency slot held while a request is in flight, or an exact
//!   lease of a shared allowance ([`limiter::lease`]): units debited in the store in advance and
//!   spent in process.
//! - A **reservation** is what an admitted request holds of its settled limits (`cost:
//!   {reserve, actual}`) until the response ends; its **settlement** gives back or takes the
//!   difference once the real cost is read ([`limiter::Settlement`], bounded by the limit), and
//!   is tried again if the store cannot take it.
//! - A **refusal** ([`answer::Rejection`]) is floodgate answering a request itself; its
//!   row of the refusal table (`answer/table.rs`) says how, in HTTP's and gRPC's words.
//!   The decider says why it refuses ([`policy::Refused`]: rate limited, banned, the store
//!   unavailable); why whose a request is could not be worked out is a
//!   [`policy::ResolveError`]; a store's failure a [`limiter::LimiterError`], which says whose
//!   fault it was.
//! - An **outcome** is a decision's ([`limiter::Outcome`]: allowed or denied); what the adaptive
//!   gate learns from an upstream's answer is a [`adaptive::Signal`]. **Replay** is only
//!   `floodgate replay`; a request body kept to be sent again on another HTTP/2 connection is a
//!   [`upstream::conn::Resend`].
//! - A **tier** picks which limits apply: a consumer's, or the one a verified token claims if
//!   the config names it (`default` if not), or `anonymous` ([`policy::Policy::resolve`]).
//!
//! Dependencies point one way: [`files`], [`logging`], [`tls`] (which reads through files),
//! [`path`], [`deadline`] and [`grpc`] know nothing of the rest; [`upstream`] (pools,
//! discovery, balancing, passive health, retry budgets, the connections) only metrics and tls; [`limiter`] only tls (a PostgreSQL URL's certificates); [`identity`], [`metrics`] and
//! [`adaptive`] only the limiter (its key kinds, decisions and clocks), and identity tls (a
//! JWKS fetched over HTTPS), [`top`] the limiter and identity; [`config`] builds on those
//! (and on upstream's pool specs); [`policy`] (whose allowance a request spends, and the
//! one limit phase; it names decisions by [`metrics`]' labels) and
//! [`route`] on config; [`access_log`] on identity, metrics and logging (its text format); [`decider`] on policy, control
//! and alerts;
//! [`cache`] on metrics and the limiter's store trait (`cache.shared` keeps entries and fill
//! claims in the store), knowing nothing of limits;
//! [`proxy`] and [`replay`] on the decider (the proxy on the cache too, and replay on [`top`]'s Space-Saving table);
//! [`admin`] on proxy (and what `/budgets` and `/top` read: config, decider, identity, limiter,
//! policy, top; and [`answer`]'s bodies); [`answer`] names [`upstream`] for its one `BoxError`; [`service`] on proxy and the decider (and grpc, metrics); [`control`] on the
//! limiter and config, [`alerts`] on control and metrics, [`global`] on the limiter and
//! metrics (and the decider and proxy on it), [`telemetry`] on config and tls; [`provider`]
//! (routes from containers' labels) on config and metrics, applying its routes through an
//! interface the server's reloader implements; [`server`] on admin, provider and proxy; `main`
//! on server.
//! `tests/layering.rs` fails, naming the file and line, when code breaks this.

#![forbid(unsafe_code)]

pub mod access_log;
pub mod acme;
pub mod adaptive;
pub mod admin;
pub mod alerts;
pub mod answer;
pub mod cache;
pub mod config;
pub mod control;
pub mod deadline;
pub mod decider;
pub mod files;
pub mod global;
pub mod grpc;
pub mod identity;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod path;
pub mod policy;
pub mod provider;
pub mod proxy;
pub mod replay;
pub mod room;
pub mod route;
pub mod server;
pub mod service;
pub mod telemetry;
pub mod tls;
pub mod top;
pub mod upstream;
