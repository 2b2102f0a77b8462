//! The entries each instance keeps: a map from key to the variants stored under it (one, unless
//! the answers `Vary`), bounded by `cache.memory` exactly. Eviction is CLOCK (second chance):
//! entries queue in the order stored; a hit marks its entry used; past the bound the oldest
//! unused entry goes (a used one has its mark cleared and goes round once more). A hit costs one
//! lock, one hash and one atomic store.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::key::Place;

/// One stored answer.
#[derive(Debug)]
pub struct Entry {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body as it arrived, chunk by chunk: shared with the requests it was streamed to.
    pub body: Arc<[Bytes]>,
    pub body_len: u64,
    /// When it was stored, and its age then.
    pub stored: Instant,
    pub age: Duration,
    /// How long it is fresh from `stored`.
    pub fresh_for: Duration,
    /// How long it is kept from `stored` (fresh, then stale for the route's longest stale
    /// window).
    pub keep_for: Duration,
    /// The request headers the answer varied on, and their values when it was asked.
    pub vary: Vec<(HeaderName, Option<HeaderValue>)>,
    /// Requests carrying credentials may be served from it.
    pub credentialed_ok: bool,
    pub place: Place,
    /// Bytes it holds: body, headers, key.
    pub size: usize,
    used: AtomicBool,
    id: u64,
}

/// What an entry is made of, before it is stored.
pub struct NewEntry {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Arc<[Bytes]>,
    pub stored: Instant,
    pub age: Duration,
    pub fresh_for: Duration,
    pub keep_for: Duration,
    pub vary: Vec<(HeaderName, Option<HeaderValue>)>,
    pub credentialed_ok: bool,
    pub place: Place,
}

/// What an entry costs beyond its body and headers (the map's and queue's share, its fields).
const OVERHEAD: usize = 256;

impl Entry {
    /// How long it has been stale at `now` (`None`: still fresh).
    pub fn stale_for(&self, now: Instant) -> Option<Duration> {
        now.saturating_duration_since(self.stored)
            .checked_sub(self.fresh_for)
    }

    /// Its `Age` at `now`, in whole seconds.
    pub fn age_at(&self, now: Instant) -> u64 {
        (self.age + now.saturating_duration_since(self.stored)).as_secs()
    }

    /// Seconds of freshness left at `now`, rounded up (0 once stale): a fresh entry says at
    /// least 1.
    pub fn ttl_at(&self, now: Instant) -> u64 {
        let left = (self.stored + self.fresh_for).saturating_duration_since(now);
        left.as_millis().div_ceil(1000) as u64
    }

    /// True when the request's headers match the ones the answer varied on.
    pub fn matches(&self, request: &HeaderMap) -> bool {
        self.vary
            .iter()
            .all(|(name, value)| super::judge::joined(request, name).as_ref() == value.as_ref())
    }

    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored) >= self.keep_for
    }
}

/// Entries and their bound.
pub struct Store {
    map: HashMap<Arc<[u8]>, Vec<Arc<Entry>>>,
    /// The eviction order: (key, entry id).
    queue: VecDeque<(Arc<[u8]>, u64)>,
    bytes: usize,
    entries: usize,
    memory: usize,
    next_id: u64,
    /// Keys whose last answer could not be stored, until when: their requests go upstream
    /// without waiting on each other (Varnish's hit-for-miss).
    passes: HashMap<Arc<[u8]>, Instant>,
    /// Entries removed to make room (for `/metrics`).
    pub evicted: u64,
}

/// The most keys remembered as not storable (past it they are forgotten at once).
const MAX_PASSES: usize = 10_000;

impl Store {
    pub fn new(memory: usize) -> Self {
        Store {
            map: HashMap::new(),
            queue: VecDeque::new(),
            bytes: 0,
            entries: 0,
            memory,
            next_id: 0,
            passes: HashMap::new(),
            evicted: 0,
        }
    }

    /// Bytes and entries held now.
    pub fn held(&self) -> (usize, usize) {
        (self.bytes, self.entries)
    }

    /// A new bound; entries past it are evicted at once.
    pub fn set_memory(&mut self, memory: usize) {
        self.memory = memory;
        self.make_room(0);
    }

    /// The entry under `key` that matches `request`'s varied headers (fresh or stale, while
    /// kept), marked used. An expired one is dropped on the way.
    pub fn get(&mut self, key: &[u8], request: &HeaderMap, now: Instant) -> Option<Arc<Entry>> {
        let variants = self.map.get_mut(key)?;
        let found = variants.iter().position(|e| e.matches(request))?;
        if variants[found].expired(now) {
            let gone = variants.swap_remove(found);
            if variants.is_empty() {
                self.map.remove(key);
            }
            self.forget(&gone);
            return None;
        }
        let entry = &variants[found];
        entry.used.store(true, Ordering::Relaxed);
        Some(entry.clone())
    }

    /// True when `key`'s last answer could not be stored and that is still remembered.
    pub fn passes(&mut self, key: &[u8], now: Instant) -> bool {
        match self.passes.get(key) {
            Some(until) if *until > now => true,
            Some(_) => {
                self.passes.remove(key);
                false
            }
            None => false,
        }
    }

    /// Remembers that `key`'s answer could not be stored, until `until`.
    pub fn pass(&mut self, key: Arc<[u8]>, until: Instant) {
        if self.passes.len() >= MAX_PASSES {
            self.passes.clear();
        }
        self.passes.insert(key, until);
    }

    /// Stores `new` under `key`, replacing the variant with the same varied values, evicting
    /// to stay within the bound. Returns false when it cannot fit at all.
    pub fn insert(&mut self, key: Arc<[u8]>, new: NewEntry) -> bool {
        let size = OVERHEAD
            + key.len()
            + new.body.iter().map(Bytes::len).sum::<usize>()
            + new
                .headers
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len() + 32)
                .sum::<usize>();
        if size > self.memory {
            return false;
        }
        self.passes.remove(&key);
        if let Some(variants) = self.map.get_mut(&key)
            && let Some(i) = variants.iter().position(|e| e.vary == new.vary)
        {
            let old = variants.swap_remove(i);
            if variants.is_empty() {
                self.map.remove(&key);
            }
            self.forget(&old);
        }
        self.make_room(size);
        self.next_id += 1;
        let entry = Arc::new(Entry {
            status: new.status,
            headers: new.headers,
            body_len: new.body.iter().map(|b| b.len() as u64).sum(),
            body: new.body,
            stored: new.stored,
            age: new.age,
            fresh_for: new.fresh_for,
            keep_for: new.keep_for,
            vary: new.vary,
            credentialed_ok: new.credentialed_ok,
            place: new.place,
            size,
            used: AtomicBool::new(false),
            id: self.next_id,
        });
        self.bytes += size;
        self.entries += 1;
        self.queue.push_back((key.clone(), entry.id));
        self.map.entry(key).or_default().push(entry);
        true
    }

    /// Removes every entry whose place `matches`; how many went.
    pub fn remove_where(&mut self, matches: impl Fn(&Place) -> bool) -> usize {
        let mut removed = Vec::new();
        self.map.retain(|_, variants| {
            variants.retain(|e| {
                let keep = !matches(&e.place);
                if !keep {
                    removed.push(e.clone());
                }
                keep
            });
            !variants.is_empty()
        });
        for entry in &removed {
            self.forget(entry);
        }
        removed.len()
    }

    /// Accounts for an entry gone from the map (its queue slot is skipped when reached).
    fn forget(&mut self, entry: &Entry) {
        self.bytes -= entry.size;
        self.entries -= 1;
    }

    /// Evicts until `size` more bytes fit.
    fn make_room(&mut self, size: usize) {
        // Each entry is passed over at most once (its mark cleared), so two rounds suffice.
        let mut chances = self.queue.len();
        while self.bytes + size > self.memory {
            let Some((key, id)) = self.queue.pop_front() else {
                break;
            };
            let Some(variants) = self.map.get_mut(&key) else {
                continue;
            };
            let Some(i) = variants.iter().position(|e| e.id == id) else {
                continue;
            };
            if chances > 0 && variants[i].used.swap(false, Ordering::Relaxed) {
                chances -= 1;
                self.queue.push_back((key, id));
                continue;
            }
            let gone = variants.swap_remove(i);
            if variants.is_empty() {
                self.map.remove(&key);
            }
            self.forget(&gone);
            self.evicted += 1;
        }
        // Slots of entries removed otherwise pile up in the queue: drop them now and then.
        if self.queue.len() > 2 * self.entries + 1024 {
            let map = &self.map;
            self.queue.retain(|(key, id)| {
                map.get(key)
                    .is_some_and(|variants| variants.iter().any(|e| e.id == *id))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(path: &str) -> Place {
        Place {
            route: "r".into(),
            host: "h".into(),
            path: path.into(),
            query: None,
        }
    }

    fn new(body: usize, path: &str) -> NewEntry {
        NewEntry {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: vec![Bytes::from(vec![0u8; body])].into(),
            stored: Instant::now(),
            age: Duration::ZERO,
            fresh_for: Duration::from_secs(60),
            keep_for: Duration::from_secs(60),
            vary: Vec::new(),
            credentialed_ok: false,
            place: place(path),
        }
    }

    fn key(n: usize) -> Arc<[u8]> {
        format!("k{n}").into_bytes().into()
    }

    #[test]
    fn the_entries_never_hold_more_than_the_bound() {
        let memory = 1 << 20;
        let mut store = Store::new(memory);
        for n in 0..1000 {
            assert!(store.insert(key(n), new(64 << 10, "/a")));
            assert!(store.held().0 <= memory, "{} after {n}", store.held().0);
        }
        // 1 MiB holds 15 entries of 64 KiB and their overheads.
        assert_eq!(store.held().1, 15);
        assert_eq!(store.evicted, 985);
        // Too big to fit at all: refused, nothing evicted for it.
        assert!(!store.insert(key(5000), new(memory, "/a")));
        assert_eq!(store.held().1, 15);
    }

    #[test]
    fn a_used_entry_gets_a_second_chance() {
        let mut store = Store::new(4 * (1024 + OVERHEAD + 8));
        for n in 0..4 {
            store.insert(key(n), new(1024, "/a"));
        }
        let now = Instant::now();
        assert!(store.get(&key(0), &HeaderMap::new(), now).is_some());
        store.insert(key(4), new(1024, "/a"));
        // k1, the oldest unused, went; k0, used, stayed.
        assert!(store.get(&key(0), &HeaderMap::new(), now).is_some());
        assert!(store.get(&key(1), &HeaderMap::new(), now).is_none());
    }

    #[test]
    fn an_expired_entry_is_not_served_and_its_bytes_are_given_back() {
        let mut store = Store::new(1 << 20);
        let mut e = new(100, "/a");
        e.stored = Instant::now() - Duration::from_secs(61);
        store.insert(key(0), e);
        assert!(
            store
                .get(&key(0), &HeaderMap::new(), Instant::now())
                .is_none()
        );
        assert_eq!(store.held(), (0, 0));
    }

    #[test]
    fn variants_live_side_by_side_and_replace_their_own() {
        let mut store = Store::new(1 << 20);
        let lang = HeaderName::from_static("accept-language");
        for (value, size) in [("en", 10), ("fr", 20), ("en", 30)] {
            let mut e = new(size, "/a");
            e.vary = vec![(lang.clone(), Some(HeaderValue::from_static(value)))];
            store.insert(key(0), e);
        }
        assert_eq!(store.held().1, 2);
        let mut en = HeaderMap::new();
        en.insert(&lang, "en".parse().unwrap());
        assert_eq!(
            store.get(&key(0), &en, Instant::now()).unwrap().body_len,
            30
        );
        assert!(
            store
                .get(&key(0), &HeaderMap::new(), Instant::now())
                .is_none()
        );
    }

    #[test]
    fn removal_by_place_counts_what_went() {
        let mut store = Store::new(1 << 20);
        store.insert(key(0), new(1, "/a"));
        store.insert(key(1), new(1, "/a"));
        store.insert(key(2), new(1, "/b"));
        assert_eq!(store.remove_where(|p| &*p.path == "/a"), 2);
        assert_eq!(store.held().1, 1);
    }
}
