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
//! Dependencies point one way: [`limiter`] and [`identity`] know nothing of the rest; [`config`]
//! builds on them; [`route`] on config; [`proxy`] on route; [`server`] on proxy; `main` on server.

#![forbid(unsafe_code)]

pub mod admin;
pub mod config;
pub mod identity;
pub mod limiter;
pub mod metrics;
pub mod proxy;
pub mod route;
pub mod server;
