//! Why a store could not decide, and what a request gets then (`storage.on_error`).

use std::time::Duration;

/// Why a store could not decide. The proxy answers these according to `storage.on_error`.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("limiter store timed out after {0:?}")]
    Timeout(Duration),
    #[error("limiter store unavailable: {0}")]
    Unavailable(String),
    #[error("limiter store answered something unexpected: {0}")]
    Protocol(String),
    /// The store is up but refused this request (an error reply for its keys, such as a script
    /// error on corrupt data). It says nothing about the store's health, so it does not count
    /// towards the circuit breaker.
    #[error("limiter store refused the request: {0}")]
    Refused(String),
}

/// What a request gets when the limiter store cannot decide (`storage.on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail open: forward the request.
    Allow,
    /// Fail closed: answer 503 `rate_limiter_unavailable`.
    Deny,
    /// Decide with the in-process limiter instead.
    Local,
}
