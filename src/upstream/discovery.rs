//! Discovery: every `http://` name of every pool resolved again every `resolver.refresh`, in a
//! task of its own, never on a request's path. Each address a name has is an endpoint; one that
//! leaves drains, one that arrives is picked from the next request on. A name that fails to
//! resolve (an error, a timeout, no address) keeps the addresses it last had, logged and
//! counted. The resolver is hickory's stub resolver, pointed at `resolver.servers` (Docker's
//! 127.0.0.11, a test's own server) or at `/etc/resolv.conf`'s nameservers, with `/etc/hosts`
//! read first; its cache is cleared at every round, so an answer's TTL (Docker's is 600 s) never
//! keeps a replica list stale beyond `refresh`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::{Resolver, TokioResolver};

use super::pool::Pools;

/// `resolver:` as the config gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverSpec {
    /// The DNS servers to ask; empty: the system's (`/etc/resolv.conf`).
    pub servers: Vec<SocketAddr>,
    /// How often every name is resolved again.
    pub refresh: Duration,
}

impl Default for ResolverSpec {
    fn default() -> Self {
        ResolverSpec {
            servers: Vec::new(),
            refresh: Duration::from_secs(5),
        }
    }
}

/// The stub resolver `spec` asks for.
pub fn resolver(spec: &ResolverSpec) -> Result<TokioResolver, String> {
    let mut builder = if spec.servers.is_empty() {
        Resolver::builder_tokio()
            .map_err(|e| format!("cannot read the system's DNS configuration: {e}"))?
    } else {
        let servers = spec
            .servers
            .iter()
            .map(|addr| {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
            })
            .collect();
        Resolver::builder_with_config(
            ResolverConfig::from_parts(None, Vec::new(), servers),
            TokioRuntimeProvider::default(),
        )
    };
    let options = builder.options_mut();
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    options.use_hosts_file = ResolveHosts::Always;
    // One round must end well before the next: a silent server costs at most this.
    options.timeout = spec.refresh.min(Duration::from_secs(2));
    options.attempts = 1;
    builder
        .build()
        .map_err(|e| format!("cannot build the DNS resolver: {e}"))
}

/// Resolves every pool's names once: what discovery does each round, and what start-up awaits
/// before the listener opens (so that the first requests find the endpoints).
pub async fn resolve_all(pools: &Pools, resolver: &TokioResolver, timeout: Duration) {
    resolver.clear_cache();
    let mut lookups = tokio::task::JoinSet::new();
    for pool in pools.all() {
        for (index, host, port) in pool.names() {
            let pool = pool.clone();
            let resolver = resolver.clone();
            lookups.spawn(async move {
                let looked_up =
                    tokio::time::timeout(timeout, resolver.lookup_ip(host.as_str())).await;
                match looked_up {
                    Ok(Ok(found)) => {
                        let addrs: Vec<SocketAddr> =
                            found.iter().map(|ip| SocketAddr::new(ip, port)).collect();
                        if addrs.is_empty() {
                            keep_last(&pool, &host, "no address");
                        } else {
                            pool.metrics.resolved("ok");
                            pool.resolved(index, addrs);
                        }
                    }
                    Ok(Err(e)) => keep_last(&pool, &host, &e.to_string()),
                    Err(_) => keep_last(&pool, &host, "timed out"),
                }
            });
        }
    }
    while lookups.join_next().await.is_some() {}
}

fn keep_last(pool: &super::RoutePool, host: &str, why: &str) {
    pool.metrics.resolved("error");
    tracing::warn!(
        route = &*pool.route,
        name = host,
        error = why,
        "an upstream name did not resolve; its last addresses are kept"
    );
}

/// How soon a round follows one that left a pool without any endpoint, at first: doubled each
/// round that still does, up to `refresh`.
const FIRST_RETRY: Duration = Duration::from_millis(250);

/// Discovery, forever: every pool's names every `spec.refresh` (and at once when a reload
/// brings a name not resolved yet). While a pool has no endpoint at all (its name has never
/// resolved: under compose, an upstream container still starting beside floodgate, whose name
/// Docker's DNS does not know yet), rounds come sooner: 250 ms (`FIRST_RETRY`), doubling up to
/// `refresh` (Envoy's `dns_failure_refresh_rate` does the same), so the first replica is used
/// within a fraction of a second of its name resolving, not a whole `refresh` later.
pub async fn run(pools: Arc<Pools>, resolver: TokioResolver, refresh: Duration) {
    let mut retry = FIRST_RETRY.min(refresh);
    let mut next = tokio::time::Instant::now() + after_round(&pools, refresh, &mut retry);
    loop {
        let woken = tokio::select! {
            () = tokio::time::sleep_until(next) => false,
            () = pools.wake.notified() => true,
        };
        if woken || tokio::time::Instant::now() >= next {
            resolve_all(&pools, &resolver, refresh.max(Duration::from_millis(500))).await;
            next = tokio::time::Instant::now() + after_round(&pools, refresh, &mut retry);
        }
    }
}

/// How long until the next round: `refresh`, or the growing `retry` while a pool is empty.
fn after_round(pools: &Pools, refresh: Duration, retry: &mut Duration) -> Duration {
    if pools.all().iter().any(|pool| pool.is_empty()) {
        let wait = *retry;
        *retry = (*retry * 2).min(refresh);
        wait
    } else {
        *retry = FIRST_RETRY.min(refresh);
        refresh
    }
}
