//! The response cache: micro-caching on the request path, so that a read surge is absorbed
//! instead of refused. The proxy calls it from one place (`proxy/cached.rs`), after identity and
//! bans and before limits: a fresh hit is answered from memory, without the upstream (and,
//! unless a limit asks for `cache_hit_cost`, without the limiter).
//!
//! - [`rules`]: what the config says (`cache:` and a route's `cache:`);
//! - [`key`]: which requests share an answer;
//! - [`judge`]: RFC 9111's rules for a shared cache: what may be stored, and how long it is
//!   fresh;
//! - [`store`]: the entries, bounded by `cache.memory` exactly (CLOCK eviction);
//! - [`fill`]: one upstream fetch per key, its body streamed to every request waiting on it;
//! - [`body`]: the bodies the cache answers with (shared with the entry, never copied);
//! - [`shared`]: `cache.shared`, entries and fill claims in the store every instance shares.
//!
//! The cache knows nothing of limits or upstreams: the proxy tells it what a request is and
//! what the upstream answered. Of the limiter it uses only the store (`cache.shared`).

pub mod body;
pub mod fill;
pub mod judge;
pub mod key;
pub mod rules;
pub mod shared;
pub mod store;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, Response, header};

pub use fill::{Claim, Followed, Leader};
pub use key::{Key, Place};
pub use rules::{KeyPart, Rules, Settings};
pub use store::{Entry, NewEntry};

use crate::metrics::CacheGauges;

/// `Cache-Status`.
pub const CACHE_STATUS: header::HeaderName = header::HeaderName::from_static("cache-status");

/// What the cache holds for a request.
pub enum Found {
    /// A fresh entry.
    Fresh(Arc<Entry>),
    /// An entry stale for this long (still within the route's longest stale window).
    Stale(Arc<Entry>, Duration),
    /// The key's last answer could not be stored: go upstream without waiting on others.
    Pass,
    Miss,
}

/// The cache every route shares: one per process, kept across reloads.
pub struct Cache {
    store: Mutex<store::Store>,
    fills: Arc<fill::Fills>,
    settings: Mutex<Settings>,
    /// `cache.shared`: until when the store is left alone after it failed.
    shared_down: Mutex<Option<Instant>>,
    gauges: CacheGauges,
}

impl Cache {
    pub fn new(settings: Settings, gauges: CacheGauges) -> Self {
        Cache {
            store: Mutex::new(store::Store::new(settings.memory)),
            fills: Arc::new(fill::Fills::default()),
            settings: Mutex::new(settings),
            shared_down: Mutex::new(None),
            gauges,
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, store::Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New bounds (a reload): entries past a smaller `memory` are evicted at once.
    pub fn configure(&self, settings: Settings) {
        *self.settings.lock().unwrap_or_else(|p| p.into_inner()) = settings;
        let mut store = self.store();
        store.set_memory(settings.memory);
        self.publish(&mut store);
    }

    /// The largest answer stored.
    pub fn max_entry(&self) -> usize {
        self.settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .max_entry
    }

    /// What the cache holds for `key` and a request with `headers`; `credentialed`: the
    /// request carries credentials, so only an entry that may serve those will do.
    pub fn look_up(
        &self,
        key: &Key,
        headers: &HeaderMap,
        credentialed: bool,
        rules: &Rules,
        now: Instant,
    ) -> Found {
        let mut store = self.store();
        let found = store.get(&key.bytes, headers, now);
        match found {
            Some(entry) if credentialed && !entry.credentialed_ok => Found::Miss,
            Some(entry) => match entry.stale_for(now) {
                None => Found::Fresh(entry),
                Some(stale) if stale < rules.longest_stale() => Found::Stale(entry, stale),
                Some(_) => Found::Miss,
            },
            None if store.passes(&key.bytes, now) => Found::Pass,
            None => Found::Miss,
        }
    }

    /// `cache.shared`, whether the store answers or not.
    pub fn is_shared(&self) -> bool {
        self.settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shared
    }

    /// True when entries and fills go through the store every instance shares: `cache.shared`,
    /// unless the store failed within [`shared::DOWN_FOR`].
    pub fn shares(&self) -> bool {
        let on = self
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shared;
        let mut down = self.shared_down.lock().unwrap_or_else(|p| p.into_inner());
        match *down {
            Some(until) if until > Instant::now() => false,
            Some(_) => {
                *down = None;
                on
            }
            None => on,
        }
    }

    /// The store failed a shared look: this instance caches on its own for a while.
    pub fn store_failed(&self, error: &crate::limiter::LimiterError) {
        let mut down = self.shared_down.lock().unwrap_or_else(|p| p.into_inner());
        if down.is_none() {
            tracing::warn!(error = %error, "the shared cache's store failed: caching on this instance alone for a second");
        }
        *down = Some(Instant::now() + shared::DOWN_FOR);
    }

    /// Leads or follows `key`'s fill.
    pub fn claim(&self, key: &Key) -> Claim {
        self.fills.claim(&Arc::from(key.bytes.as_slice()))
    }

    /// A fill of its own for a request no other follows.
    pub fn solo(&self) -> Leader {
        self.fills.solo()
    }

    /// Stores an answer.
    pub fn insert(&self, key: &Key, entry: NewEntry) {
        let mut store = self.store();
        store.insert(Arc::from(key.bytes.as_slice()), entry);
        self.publish(&mut store);
    }

    /// Remembers that `key`'s answer could not be stored, for `for_how_long`.
    pub fn pass(&self, key: &Key, for_how_long: Duration) {
        self.store().pass(
            Arc::from(key.bytes.as_slice()),
            Instant::now() + for_how_long,
        );
    }

    /// Removes every entry whose place `matches`: how many went.
    pub fn remove_where(&self, matches: impl Fn(&Place) -> bool) -> usize {
        let mut store = self.store();
        let removed = store.remove_where(matches);
        self.publish(&mut store);
        removed
    }

    /// Bytes and entries held now.
    pub fn held(&self) -> (usize, usize) {
        self.store().held()
    }

    fn publish(&self, store: &mut store::Store) {
        let (bytes, entries) = store.held();
        self.gauges.bytes.set(bytes as i64);
        self.gauges.entries.set(entries as i64);
        self.gauges
            .evictions
            .inc_by(std::mem::take(&mut store.evicted));
    }
}

/// The answer of an entry at `now`: its status and headers, `Age`, `Cache-Status`, and its body
/// (none for a HEAD).
pub fn answer(
    entry: &Entry,
    now: Instant,
    head: bool,
    status: HeaderValue,
) -> Response<body::Stored> {
    let mut response = Response::new(body::Stored::new(match head {
        true => Arc::from(Vec::new()),
        false => entry.body.clone(),
    }));
    *response.status_mut() = entry.status;
    // The entry's fields hold an `Age` and a `Cache-Status` already (see [`NewEntry`]): a hit
    // copies the map and rewrites two values, without growing it.
    let mut headers = entry.headers.clone();
    let age = status::age(entry.age_at(now));
    for (name, value) in [(header::AGE, age), (CACHE_STATUS, status)] {
        match headers.get_mut(&name) {
            Some(slot) => *slot = value,
            None => {
                headers.insert(name, value);
            }
        }
    }
    *response.headers_mut() = headers;
    response
}

/// `Cache-Status` values (RFC 9211), floodgate's words for what the cache did.
pub mod status {
    use std::cell::RefCell;
    use std::sync::OnceLock;
    use std::thread::LocalKey;

    use http::HeaderValue;

    /// The values for 0 to this many seconds are made once: every hit says its `Age` and ttl,
    /// and for a micro-cache they are small numbers.
    const MEMO: u64 = 300;

    /// The last large value a thread made, with its number.
    type Last = RefCell<Option<(u64, HeaderValue)>>;

    /// `make(n)`, from `table` when `n` is small; past it, the value this thread made last
    /// when that was for the same `n` (an entry kept for an hour has a ttl above the table's,
    /// and its hits within one second share it), else made and kept in its place.
    fn memo(
        table: &'static OnceLock<Vec<HeaderValue>>,
        last: &'static LocalKey<Last>,
        n: u64,
        make: fn(u64) -> HeaderValue,
    ) -> HeaderValue {
        if n <= MEMO {
            return table.get_or_init(|| (0..=MEMO).map(make).collect())[n as usize].clone();
        }
        last.with(|slot| {
            let mut slot = slot.borrow_mut();
            match &*slot {
                Some((made_for, value)) if *made_for == n => value.clone(),
                _ => {
                    let value = make(n);
                    *slot = Some((n, value.clone()));
                    value
                }
            }
        })
    }

    thread_local! {
        static LAST_AGE: Last = const { RefCell::new(None) };
        static LAST_HIT: Last = const { RefCell::new(None) };
    }

    /// `Age: n`.
    pub fn age(n: u64) -> HeaderValue {
        static AGES: OnceLock<Vec<HeaderValue>> = OnceLock::new();
        memo(&AGES, &LAST_AGE, n, HeaderValue::from)
    }

    /// A fresh hit with `ttl` seconds of freshness left.
    pub fn hit(ttl: u64) -> HeaderValue {
        static HITS: OnceLock<Vec<HeaderValue>> = OnceLock::new();
        memo(&HITS, &LAST_HIT, ttl, write_hit)
    }

    /// `floodgate; hit; ttl=N`, written without `format!`.
    fn write_hit(ttl: u64) -> HeaderValue {
        const PREFIX: &[u8] = b"floodgate; hit; ttl=";
        let mut text = [0u8; PREFIX.len() + 20];
        text[..PREFIX.len()].copy_from_slice(PREFIX);
        let mut digits = [0u8; 20];
        let mut n = ttl;
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let len = PREFIX.len() + digits.len() - at;
        text[PREFIX.len()..len].copy_from_slice(&digits[at..]);
        HeaderValue::from_bytes(&text[..len]).unwrap_or(HeaderValue::from_static("floodgate; hit"))
    }

    /// A stale copy, `stale` seconds past its freshness, served for `detail`.
    pub fn stale(stale: u64, detail: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("floodgate; hit; ttl=-{stale}; detail={detail}"))
            .unwrap_or(HeaderValue::from_static("floodgate; hit"))
    }

    pub const STORED: HeaderValue = HeaderValue::from_static("floodgate; fwd=uri-miss; stored");
    pub const COLLAPSED: HeaderValue =
        HeaderValue::from_static("floodgate; fwd=uri-miss; collapsed");
    pub const MISS: HeaderValue = HeaderValue::from_static("floodgate; fwd=uri-miss");
    pub const BYPASS: HeaderValue = HeaderValue::from_static("floodgate; fwd=bypass");
    /// A trusted client asked for a fresh answer (`no-cache`): fetched and stored.
    pub const REQUEST_STORED: HeaderValue =
        HeaderValue::from_static("floodgate; fwd=request; stored");
    pub const REQUEST: HeaderValue = HeaderValue::from_static("floodgate; fwd=request");

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_value_reads_as_its_number_whether_made_once_kept_last_or_made_anew() {
            for n in [0, 1, 299, 300, 301, 3600, 3600, 3599, 3600, u64::MAX] {
                assert_eq!(hit(n), format!("floodgate; hit; ttl={n}").as_str(), "{n}");
                assert_eq!(age(n), n.to_string().as_str(), "{n}");
            }
            // The kept value is for one number: the next asks for another and gets its own.
            assert_eq!(hit(5000), "floodgate; hit; ttl=5000");
            assert_eq!(hit(5001), "floodgate; hit; ttl=5001");
            assert_eq!(hit(5000), "floodgate; hit; ttl=5000");
        }
    }
}
