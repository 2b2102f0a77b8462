//! Active health checks (`health_check:`): from a task of its own, every `interval`, a GET of
//! `path` to every endpoint of every pool that asks for them, on a connection of its own
//! (`Connection: close`, the origin's `Host`); a 2xx status line within `timeout` passes. An
//! endpoint that fails `unhealthy_after` checks in a row is taken out until it passes
//! `healthy_after` in a row. Nothing here runs on a request's path. An `https://` endpoint is
//! checked by its TCP connection only (a TLS handshake per check is not made here).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Endpoint;
use super::pool::Pools;
use super::spec::HealthSpec;

/// One check of `endpoint`: true when it passed.
pub async fn check(endpoint: &Endpoint, spec: &HealthSpec) -> bool {
    let attempt = async {
        let addr = match endpoint.addr {
            Some(addr) => addr,
            None => tokio::net::lookup_host(endpoint.target.authority.as_str())
                .await
                .ok()?
                .next()?,
        };
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        if endpoint.origin.scheme == http::uri::Scheme::HTTPS {
            return Some(true);
        }
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: floodgate-health-check\r\nConnection: close\r\n\r\n",
            spec.path,
            endpoint.origin.host_header.to_str().unwrap_or_default()
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        // The status line is all that is read: `HTTP/1.1 200 …`.
        let mut head = [0u8; 16];
        let mut read = 0;
        while read < 12 {
            let n = stream.read(&mut head[read..]).await.ok()?;
            if n == 0 {
                break;
            }
            read += n;
        }
        let line = std::str::from_utf8(&head[..read]).ok()?;
        let status = line.split(' ').nth(1)?;
        Some(status.starts_with('2') && status.len() == 3)
    };
    matches!(
        tokio::time::timeout(spec.timeout, attempt).await,
        Ok(Some(true))
    )
}

/// Checks forever: each pool with `health_check:` at its `interval`; and every second, each
/// pool's state gauges (`floodgate_upstream_endpoints`).
pub async fn run(pools: Arc<Pools>) {
    let mut last: std::collections::HashMap<Arc<str>, Instant> = Default::default();
    let mut published = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if published.elapsed() >= Duration::from_secs(1) {
            published = Instant::now();
            for pool in pools.all() {
                pool.publish();
            }
        }
        for pool in pools.all() {
            let spec = pool.spec();
            let Some(health) = spec.health.clone() else {
                continue;
            };
            let due = last
                .get(&pool.route)
                .is_none_or(|at| at.elapsed() >= health.interval);
            if !due {
                continue;
            }
            last.insert(pool.route.clone(), Instant::now());
            for endpoint in pool.endpoints() {
                let (pool, health) = (pool.clone(), health.clone());
                tokio::spawn(async move {
                    let passed = check(&endpoint, &health).await;
                    if let Some(healthy) =
                        endpoint.checked(passed, health.healthy_after, health.unhealthy_after)
                    {
                        match healthy {
                            true => {
                                tracing::info!(route = &*pool.route, endpoint = %endpoint.name, "upstream endpoint passes its health checks again")
                            }
                            false => {
                                tracing::warn!(route = &*pool.route, endpoint = %endpoint.name, path = %health.path, "upstream endpoint failed its health checks: taken out")
                            }
                        }
                    }
                });
            }
        }
        last.retain(|route, _| pools.all().iter().any(|p| p.route == *route));
    }
}
