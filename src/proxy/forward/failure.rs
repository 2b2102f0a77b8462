//! Why an upstream request failed, and whether it may be sent again: stale pooled connections,
//! TLS handshakes, idempotent methods; and the TLS trust for `https://` upstreams.

use std::sync::Arc;

use crate::config::UpstreamCa;
use crate::tls;
use crate::upstream::conn::PoolError;

/// Methods a request may be sent twice with (RFC 9110 §9.2.2).
pub(super) fn is_idempotent(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::OPTIONS
            | http::Method::PUT
            | http::Method::DELETE
            | http::Method::TRACE
    )
}

/// True when a request failed because a reused connection was already closed by the upstream
/// (closed before the response began, or reset), not because the upstream refused or timed out.
pub(super) fn is_stale_connection(e: &PoolError) -> bool {
    let error = match e {
        PoolError::Request {
            error,
            reused: true,
        } => error,
        PoolError::Closed { reused } => return *reused,
        _ => return false,
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = source {
        if let Some(hyper_err) = err.downcast_ref::<hyper::Error>()
            && (hyper_err.is_incomplete_message() || hyper_err.is_canceled())
        {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// The rustls client config for `https://` upstreams. Without `upstream_ca` it trusts the
/// system's roots; if there are none, it trusts nothing (every HTTPS upstream then fails with
/// 502) and says so once in the log.
pub(super) fn upstream_tls_config(upstream_ca: Option<&UpstreamCa>) -> rustls::ClientConfig {
    match upstream_ca {
        Some(ca) => tls::client_config(ca.roots()),
        None => tls::client_config(tls::system_roots("https:// upstreams without upstream_ca")),
    }
}

/// The rustls client config for a route with `upstream_tls`: its own roots (else
/// `upstream_ca`'s, else the system's), and its client certificate if it has one.
pub(super) fn route_tls_config(
    own: &crate::config::UpstreamTls,
    upstream_ca: Option<&UpstreamCa>,
) -> rustls::ClientConfig {
    let roots = match (&own.roots, upstream_ca) {
        (Some(roots), _) => roots.clone(),
        (None, Some(ca)) => ca.roots(),
        (None, None) => Arc::new(tls::system_roots("a route's upstream_tls without ca")),
    };
    let builder = tls::client_builder().with_root_certificates(roots);
    match &own.client {
        Some((chain, key)) => match builder.with_client_auth_cert(chain.clone(), key.clone_key()) {
            Ok(config) => config,
            Err(e) => {
                // Checked at load (the key matches the certificate): not expected. Trusting
                // nothing, every request of the route then fails closed (502).
                tracing::error!(error = %e, "upstream_tls: the client certificate cannot be used");
                tls::client_config(rustls::RootCertStore::empty())
            }
        },
        None => builder.with_no_client_auth(),
    }
}

/// True when a failed upstream request failed in the TLS handshake (an untrusted certificate,
/// a name mismatch, no common protocol version).
pub(super) fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<rustls::Error>() {
            return true;
        }
        next = match e.downcast_ref::<std::io::Error>() {
            // An io::Error's `source()` skips the error it wraps: look at that one itself.
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}
