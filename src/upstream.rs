//! Where a request goes: the upstream layer below the proxy (pingora's `upstream_peer` phase).
//! The proxy decides *whether* a request goes on; this decides *where*: a route's pool of
//! endpoints ([`RoutePool`]), each an address one of its origins resolved to, found by
//! [`discovery`] in the background, picked by [`balance`] among those passive health
//! ([`outlier`]) leaves in, retried on another within the route's [`budget`].
//!
//! ```text
//!   route ─ spec (origins, balance, outlier, retries)
//!     └─ RoutePool ─ endpoints ─ Endpoint (address, origin, weight, in flight, health)
//!                     ▲ discovery: names resolved every `resolver.refresh`
//!   proxy ─ pick ─ forward ─ outcome (health) ─ retry? (budget, endpoint not yet tried)
//! ```
//!
//! The connections themselves ([`conn`]: HTTP/1.1 pool, HTTP/2 multiplexer) are keyed by what
//! an endpoint dials, its address, so each endpoint has its own.

pub mod attempt;
pub mod balance;
pub mod budget;
pub mod conn;
pub mod discovery;
mod endpoint;
pub mod health;
mod origin;
pub mod outlier;
mod pool;
pub mod spec;

pub use attempt::Failed;
pub use endpoint::{Endpoint, InFlight};
pub use origin::{Origin, UpstreamProtocol};
pub use pool::{Attempted, Fallback, Held, MAX_ADDRESSES_PER_NAME, MAX_HELD, Pools, RoutePool};
pub use spec::{Balance, HashOn, HealthSpec, OutlierSpec, PoolSpec, RetryOn, RetrySpec};
