//! The dashboard: admin `GET /` serves one self-contained page (`dashboard.html`: its HTML, CSS
//! and JS built into the binary, nothing fetched from elsewhere, so it works offline), and
//! `GET /dashboard.json` the little it needs that no other endpoint says: the routes with their
//! limits, and the store. Everything live (requests per second by decision, the breaker, leases,
//! each route's upstream endpoints and their state, discovered containers, the certificates
//! served and their time left) the page reads from `/metrics`, `/top`, `/upstreams`,
//! `/discovered`, `/certificates` and `/budgets` itself. Read-only.

use serde_json::{Value, json};

use crate::limiter::Parameters;
use crate::proxy::Proxy;

/// The page.
pub const PAGE: &str = include_str!("dashboard.html");

/// `GET /dashboard.json`.
pub async fn state(proxy: &Proxy) -> Value {
    let snapshot = proxy.snapshot();
    let routes: Vec<Value> = snapshot
        .routes
        .routes()
        .iter()
        .map(|route| {
            let limits: Vec<Value> = route
                .enforced
                .limits
                .iter()
                .map(|l| (l, false))
                .chain(route.shadow.limits.iter().map(|l| (l, true)))
                .map(|(l, shadow)| {
                    let algorithm = l.limit.algorithm();
                    let span = match algorithm.parameters() {
                        Parameters::Bucket { interval_us, .. } => {
                            format!("{:.3}/s", 1e6 / interval_us as f64)
                        }
                        Parameters::Window { window_us, .. } => {
                            humantime::format_duration(std::time::Duration::from_micros(window_us))
                                .to_string()
                        }
                    };
                    json!({
                        "algorithm": algorithm.name(),
                        "limit": algorithm.units(),
                        "span": span,
                        "per": l.per.as_str(),
                        "shadow": shadow,
                        "tiers": l.tiers,
                    })
                })
                .collect();
            json!({
                "name": &*route.name,
                "path_prefix": route.path_prefix.as_str(),
                "limits": limits,
            })
        })
        .collect();
    json!({
        "routes": routes,
        "store": {
            "backend": proxy.core().limiter().backend_name(),
            "ready": proxy.core().limiter().is_ready().await,
        },
    })
}
