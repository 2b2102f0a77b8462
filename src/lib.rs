//! floodgate: an HTTP reverse proxy that rate-limits requests before they reach the API behind it.
//!
//! ```text
//!            ┌──────────── floodgate ─────────────────────────────────────┐
//! client ──▶ │ accept ─▶ route ─▶ identify ─▶ limit ─┬─▶ forward ─────────│──▶ upstream
//!            │ (server)  (route)  (identity)  (limiter)  (proxy/forward)  │
//!            │                                       └─▶ reject: 429/503  │
//!            └────────────────────────────────────────────────────────────┘
//! ```
//!
//! The modules, in the order a request meets them:
//!
//! 1. [`server`]: accepts connections (TLS, HTTP/1.1 and HTTP/2; each must open within
//!    [`deadline`]'s first deadline), hands each request to the proxy, drains on shutdown;
//! 2. [`proxy`]: the pipeline's phases, in order: route, identify, limit, forward or reject, log;
//! 3. [`route`]: the first route whose prefix and methods match;
//! 4. [`identity`]: whose budget a request spends (consumer or API key, user id, client IP);
//! 5. [`limiter`]: the algorithms and the stores (memory, Redis, PostgreSQL) that decide all-or-nothing,
//!    with the guard that applies `on_error` when a store fails;
//! 6. [`proxy::forward`] and [`proxy::response`]: the upstream call, and every status and header
//!    floodgate writes itself;
//! 7. [`metrics`] and [`admin`]: what was decided, on `/metrics`, `/healthz` and `/readyz`.
//!
//! [`config`] turns the YAML file into the typed values all of these are built from.
//!
//! Dependencies point one way: [`tls`] (building rustls configs from PEM files) knows nothing
//! of the rest; [`limiter`] only tls (a PostgreSQL URL's certificates); [`identity`] only the
//! limiter's key kinds; [`config`] builds on those; [`policy`] (whose allowance a request spends)
//! and [`route`] on config; [`access_log`] on identity and metrics; [`proxy`] and [`replay`] on
//! policy; [`admin`] on proxy; [`server`] on admin and proxy; `main` on server.

#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod config;
pub mod deadline;
pub mod identity;
pub mod limiter;
pub mod metrics;
pub mod path;
pub mod policy;
pub mod proxy;
pub mod replay;
pub mod route;
pub mod server;
pub mod tls;
