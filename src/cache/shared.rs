//! `cache.shared: true`: entries and fill claims in the store every instance shares, so that N
//! instances make one upstream fetch per key per freshness lifetime, as one instance does.
//!
//! Each instance keeps its own entries and fills as before; the store is a second tier behind
//! them. A request that leads its key's fill on one instance looks in the store first: an entry
//! another instance stored is copied into this one's memory and served (its followers go round
//! again and find it). Else the leader claims the key in the store (a claim that expires with
//! `coalesce_wait`): with the claim it fetches, and the answer, once whole, is written to the
//! store before the claim is given up; without it, another instance is fetching, and the
//! leader looks again at short intervals until the entry is there, the claim is free, or half of
//! `coalesce_wait` has passed (then it fetches itself). An answer that may not be stored is
//! written as a pass (Varnish's hit-for-miss) for the route's `ttl`, so the other instances
//! stop waiting at once.
//!
//! Freshness is counted on the store's clock (it stamps what it writes, and says how long ago
//! when it is read), so instances' clocks need not agree. When the store fails, the instance
//! stops asking it for a second ([`DOWN_FOR`]) and caches and coalesces on its own: never an
//! error, never a wait past the store's timeout.
//!
//! An entry's bytes: a version byte, a kind (an answer or a pass), its key (checked on read, so
//! a digest collision is a miss), its timings, status, `Vary` values, place, headers and body.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

use super::key::{Key, Place};
use super::store::NewEntry;
use crate::limiter::{CacheVariant, CacheWrite, Limiter, LimiterError, hex};

/// How long an instance caches on its own after the store failed it.
pub const DOWN_FOR: Duration = Duration::from_secs(1);

/// The first and the longest pause between looks for another instance's answer.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

const VERSION: u8 = 1;
const ANSWER: u8 = 0;
const PASS: u8 = 1;
/// The variant name of a pass (a variant's name is otherwise hex).
const PASS_VARIANT: &str = "pass";

/// What the store holds for a request.
pub enum Shelved {
    /// A fresh answer that matches the request: to be stored in this instance's memory.
    Answer(Box<NewEntry>),
    /// The key's last answer could not be stored: for this much longer.
    Pass(Duration),
}

/// The entry's name in the store: a digest of its key.
pub fn name(key: &Key) -> String {
    hex(&Sha256::digest(&key.bytes)[..16])
}

/// A variant's name: a digest of the request headers it varied on and their values.
fn variant_name(vary: &[(HeaderName, Option<HeaderValue>)]) -> String {
    let mut hash = Sha256::new();
    for (name, value) in vary {
        hash.update(name.as_str().as_bytes());
        match value {
            Some(v) => {
                hash.update([1]);
                hash.update(v.as_bytes());
            }
            None => hash.update([0]),
        }
        hash.update([0xff]);
    }
    hex(&hash.finalize()[..16])
}

/// Writes `bytes` with a `u32` length before them.
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn micros(d: Duration) -> [u8; 8] {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .to_le_bytes()
}

/// The bytes of `entry`, keyed `key`, as the store keeps them at `now`.
pub fn encode(key: &Key, entry: &NewEntry, now: Instant) -> Vec<u8> {
    let body_len: usize = entry.body.iter().map(Bytes::len).sum();
    let mut out = Vec::with_capacity(body_len + 512);
    out.extend_from_slice(&[VERSION, ANSWER]);
    put(&mut out, &key.bytes);
    // How old it was here when it was written: the store counts from then.
    out.extend_from_slice(&micros(now.saturating_duration_since(entry.stored)));
    for d in [entry.age, entry.fresh_for, entry.keep_for] {
        out.extend_from_slice(&micros(d));
    }
    out.extend_from_slice(&entry.status.as_u16().to_le_bytes());
    out.push(u8::from(entry.credentialed_ok));
    out.extend_from_slice(&(entry.vary.len() as u32).to_le_bytes());
    for (name, value) in &entry.vary {
        put(&mut out, name.as_str().as_bytes());
        match value {
            Some(v) => {
                out.push(1);
                put(&mut out, v.as_bytes());
            }
            None => out.push(0),
        }
    }
    put(&mut out, entry.place.host.as_bytes());
    put(&mut out, entry.place.path.as_bytes());
    match &entry.place.query {
        Some(q) => {
            out.push(1);
            put(&mut out, q.as_bytes());
        }
        None => out.push(0),
    }
    out.extend_from_slice(&(entry.headers.len() as u32).to_le_bytes());
    for (name, value) in &entry.headers {
        put(&mut out, name.as_str().as_bytes());
        put(&mut out, value.as_bytes());
    }
    // The body's length first: bytes cut short anywhere are unreadable, never half an answer.
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    for chunk in entry.body.iter() {
        out.extend_from_slice(chunk);
    }
    out
}

/// The bytes of a pass for `key`.
fn encode_pass(key: &Key, for_how_long: Duration) -> Vec<u8> {
    let mut out = vec![VERSION, PASS];
    put(&mut out, &key.bytes);
    out.extend_from_slice(&micros(for_how_long));
    out
}

/// Reads the store's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<usize> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
    }
    fn duration(&mut self) -> Option<Duration> {
        Some(Duration::from_micros(u64::from_le_bytes(
            self.take(8)?.try_into().ok()?,
        )))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()?;
        self.take(n)
    }
    fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
}

/// What `variant`'s bytes hold for `key`, read at `now` (`None`: another key's, unreadable,
/// or no longer of use: an answer no longer fresh, a pass that ended).
fn decode(variant: &CacheVariant, key: &Key, route: &Arc<str>, now: Instant) -> Option<Shelved> {
    let mut r = Reader(&variant.bytes);
    if r.byte()? != VERSION {
        return None;
    }
    let kind = r.byte()?;
    if r.bytes()? != key.bytes.as_slice() {
        return None;
    }
    let since_written = Duration::from_micros(variant.elapsed_us);
    if kind == PASS {
        let keep = r.duration()?;
        return (since_written < keep).then(|| Shelved::Pass(keep - since_written));
    }
    // Figures from the store, summed checked; an age older than this clock can tell (bytes
    // gone bad) leaves no instant to store it at, and the entry is unreadable.
    let old = r.duration()?.checked_add(since_written)?;
    let (age, fresh_for, keep_for) = (r.duration()?, r.duration()?, r.duration()?);
    if old >= fresh_for {
        return None;
    }
    let status = StatusCode::from_u16(u16::from_le_bytes(r.take(2)?.try_into().ok()?)).ok()?;
    let credentialed_ok = r.byte()? == 1;
    let mut vary = Vec::new();
    for _ in 0..r.u32()? {
        let name = HeaderName::from_bytes(r.bytes()?).ok()?;
        let value = match r.byte()? {
            1 => Some(HeaderValue::from_bytes(r.bytes()?).ok()?),
            _ => None,
        };
        vary.push((name, value));
    }
    let (host, path) = (r.text()?, r.text()?);
    let query = match r.byte()? {
        1 => Some(r.text()?),
        _ => None,
    };
    let count = r.u32()?;
    let mut headers = HeaderMap::with_capacity(count.min(128));
    for _ in 0..count {
        let name = HeaderName::from_bytes(r.bytes()?).ok()?;
        headers.append(name, HeaderValue::from_bytes(r.bytes()?).ok()?);
    }
    let body = r.bytes()?;
    if !r.0.is_empty() {
        return None;
    }
    let body: Arc<[Bytes]> = Arc::from(vec![Bytes::copy_from_slice(body)]);
    Some(Shelved::Answer(Box::new(NewEntry {
        status,
        headers,
        body,
        stored: now.checked_sub(old)?,
        age,
        fresh_for,
        keep_for,
        vary,
        credentialed_ok,
        place: Place {
            route: route.clone(),
            host: host.into(),
            path: path.into(),
            query: query.map(Into::into),
        },
    })))
}

/// True when a request with `headers` may be served `entry`.
fn serves(entry: &NewEntry, headers: &HeaderMap, credentialed: bool) -> bool {
    (!credentialed || entry.credentialed_ok)
        && entry
            .vary
            .iter()
            .all(|(name, value)| super::judge::joined(headers, name).as_ref() == value.as_ref())
}

/// One key of one route, in the store.
pub struct Shelf {
    limiter: Limiter,
    route: Arc<str>,
    name: String,
    key: Key,
}

/// What the store says of a key a request leads on this instance.
pub enum Through {
    /// It holds what the request needs (copied into this instance's memory).
    Found(Shelved),
    /// Nobody else fetches it: fetch it, and write the answer ([`Writer`]).
    Fetch(Writer),
    /// The store failed: cache on this instance alone.
    Failed(LimiterError),
}

impl Shelf {
    pub fn new(limiter: &Limiter, route: &Arc<str>, key: &Key) -> Shelf {
        Shelf {
            limiter: limiter.clone(),
            route: route.clone(),
            name: name(key),
            key: key.clone(),
        }
    }

    fn claim_name(&self) -> String {
        format!("cache:{}:{}", self.route, self.name)
    }

    /// What the store holds for a request with `headers`, at `now`.
    pub async fn look(
        &self,
        headers: &HeaderMap,
        credentialed: bool,
    ) -> Result<Option<Shelved>, LimiterError> {
        let variants = self.limiter.cache_read(&self.route, &self.name).await?;
        let now = Instant::now();
        let mut pass = None;
        for variant in &variants {
            match decode(variant, &self.key, &self.route, now) {
                Some(Shelved::Answer(entry)) if serves(&entry, headers, credentialed) => {
                    return Ok(Some(Shelved::Answer(entry)));
                }
                Some(Shelved::Pass(left)) => pass = Some(left),
                _ => {}
            }
        }
        Ok(pass.map(Shelved::Pass))
    }

    /// The key for a request that leads it on this instance: what the store holds, else a
    /// claim to fetch it; waits (at most half of `coalesce_wait`) while another instance
    /// fetches it.
    pub async fn lead(
        self,
        headers: &HeaderMap,
        credentialed: bool,
        coalesce_wait: Duration,
    ) -> Through {
        let deadline = Instant::now() + coalesce_wait / 2;
        let claim_us = u64::try_from(coalesce_wait.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut pause = FIRST_PAUSE;
        let mut claimed = false;
        loop {
            match self.look(headers, credentialed).await {
                Err(e) => return self.failed(claimed, e),
                Ok(Some(found)) => {
                    if claimed {
                        Writer::claimed(self).give_up();
                    }
                    return Through::Found(found);
                }
                // Claimed, and still not there: nobody wrote it before the claim was free.
                Ok(None) if claimed => return Through::Fetch(Writer::claimed(self)),
                Ok(None) => {}
            }
            match self.limiter.cache_claim(&self.claim_name(), claim_us).await {
                Err(e) => return self.failed(false, e),
                // Look once more: an instance that wrote it gave its claim up after.
                Ok(true) => claimed = true,
                Ok(false) if Instant::now() >= deadline => {
                    return Through::Fetch(Writer::unclaimed(self));
                }
                Ok(false) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                }
            }
        }
    }

    /// For a background refresh: what the store holds fresh, else a claim (`None`: another
    /// instance refreshes it).
    pub async fn refresh(self, headers: &HeaderMap, coalesce_wait: Duration) -> Option<Through> {
        match self.look(headers, false).await {
            Err(e) => return Some(Through::Failed(e)),
            Ok(Some(found)) => return Some(Through::Found(found)),
            Ok(None) => {}
        }
        let claim_us = u64::try_from(coalesce_wait.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        match self.limiter.cache_claim(&self.claim_name(), claim_us).await {
            Err(e) => Some(Through::Failed(e)),
            Ok(true) => Some(Through::Fetch(Writer::claimed(self))),
            Ok(false) => None,
        }
    }

    fn failed(self, claimed: bool, e: LimiterError) -> Through {
        if claimed {
            Writer::claimed(self).give_up();
        }
        Through::Failed(e)
    }
}

/// What a fetch under a shelf does with its answer: writes it to the store (and then gives up
/// the claim, if it holds one). Dropped unused (the fetch failed, the request was refused), it
/// gives the claim up, so another instance may fetch.
pub struct Writer {
    shelf: Option<Shelf>,
    claimed: bool,
}

impl Writer {
    fn claimed(shelf: Shelf) -> Writer {
        Writer {
            shelf: Some(shelf),
            claimed: true,
        }
    }

    fn unclaimed(shelf: Shelf) -> Writer {
        Writer {
            shelf: Some(shelf),
            claimed: false,
        }
    }

    /// Writes `entry` (its bytes made at `now`) in the background.
    pub fn answer(mut self, entry: &NewEntry, now: Instant) {
        let Some(shelf) = self.shelf.take() else {
            return;
        };
        // Kept while fresh: another instance takes only a fresh copy (its stale windows count
        // from its own).
        let keep = entry
            .fresh_for
            .saturating_sub(now.saturating_duration_since(entry.stored));
        if keep.is_zero() {
            self.spawn(shelf, None);
            return;
        }
        let write = Owned {
            variant: variant_name(&entry.vary),
            bytes: encode(&shelf.key, entry, now),
            place: Some(entry.place.clone()),
            keep,
        };
        self.spawn(shelf, Some(write));
    }

    /// Writes a pass for `for_how_long` in the background: the other instances fetch on their
    /// own (a few at a time each) instead of waiting.
    pub fn pass(mut self, for_how_long: Duration) {
        let Some(shelf) = self.shelf.take() else {
            return;
        };
        let write = Owned {
            variant: PASS_VARIANT.into(),
            bytes: encode_pass(&shelf.key, for_how_long),
            place: None,
            keep: for_how_long,
        };
        self.spawn(shelf, Some(write));
    }

    /// Writes nothing; gives the claim up.
    pub fn give_up(mut self) {
        if let Some(shelf) = self.shelf.take() {
            self.spawn(shelf, None);
        }
    }

    /// Writes `write` under `shelf` in the background, then gives up the claim (after the
    /// write, so that an instance that claims next finds what was written).
    fn spawn(&self, shelf: Shelf, write: Option<Owned>) {
        let claimed = self.claimed;
        if write.is_none() && !claimed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            if let Some(w) = write {
                let place = w.place.as_ref();
                let written = shelf
                    .limiter
                    .cache_write(CacheWrite {
                        route: &shelf.route,
                        key: &shelf.name,
                        variant: &w.variant,
                        host: place.map_or("", |p| &p.host),
                        path: place.map_or("", |p| &p.path),
                        query: place.and_then(|p| p.query.as_deref()),
                        bytes: &w.bytes,
                        keep_us: u64::try_from(w.keep.as_micros())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    })
                    .await;
                if let Err(e) = written {
                    tracing::debug!(route = %shelf.route, error = %e, "writing a shared cache entry failed");
                }
            }
            if claimed && let Err(e) = shelf.limiter.unclaim(&shelf.claim_name()).await {
                tracing::debug!(route = %shelf.route, error = %e, "giving up a shared cache claim failed");
            }
        });
    }
}

/// What a writer writes, owned by its task.
struct Owned {
    variant: String,
    bytes: Vec<u8>,
    place: Option<Place>,
    keep: Duration,
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(shelf) = self.shelf.take() {
            self.spawn(shelf, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> Key {
        Key {
            bytes: text.as_bytes().to_vec(),
        }
    }

    fn entry(now: Instant) -> NewEntry {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.append("x-two", HeaderValue::from_static("a"));
        headers.append("x-two", HeaderValue::from_static("b"));
        NewEntry {
            status: StatusCode::OK,
            headers,
            body: Arc::from(vec![Bytes::from_static(b"hel"), Bytes::from_static(b"lo")]),
            stored: now - Duration::from_millis(300),
            age: Duration::from_secs(2),
            fresh_for: Duration::from_secs(10),
            keep_for: Duration::from_secs(70),
            vary: vec![
                (
                    HeaderName::from_static("accept-encoding"),
                    Some(HeaderValue::from_static("gzip")),
                ),
                (HeaderName::from_static("accept-language"), None),
            ],
            credentialed_ok: true,
            place: Place {
                route: Arc::from("r"),
                host: "api.example".into(),
                path: "/c/x".into(),
                query: Some("a=1".into()),
            },
        }
    }

    #[test]
    fn an_entry_reads_back_as_written_aged_by_the_store_s_clock() {
        let now = Instant::now() + Duration::from_secs(100);
        let bytes = encode(&key("k"), &entry(now), now);
        let variant = CacheVariant {
            elapsed_us: 1_700_000,
            bytes,
        };
        let Some(Shelved::Answer(back)) = decode(&variant, &key("k"), &Arc::from("r"), now) else {
            panic!("not read back");
        };
        let original = entry(now);
        assert_eq!(back.status, original.status);
        assert_eq!(back.headers, original.headers);
        assert_eq!(&back.body[0][..], b"hello");
        assert_eq!(back.vary, original.vary);
        assert_eq!(back.place, original.place);
        assert_eq!(
            (back.age, back.fresh_for, back.keep_for),
            (original.age, original.fresh_for, original.keep_for)
        );
        assert!(back.credentialed_ok);
        // 300 ms old when written, 1.7 s since on the store's clock.
        assert_eq!(now - back.stored, Duration::from_millis(2_000));
        // Another key's bytes (a digest collision) are nobody's answer.
        assert!(decode(&variant, &key("other"), &Arc::from("r"), now).is_none());
        // Past its freshness it is of no use to another instance.
        let late = CacheVariant {
            elapsed_us: 9_700_000,
            ..variant.clone()
        };
        assert!(decode(&late, &key("k"), &Arc::from("r"), now).is_none());
        // An age older than any instant (a store's bytes gone bad) is unreadable, not a panic.
        let mut huge = variant.clone();
        let at = 2 + 4 + b"k".len();
        huge.bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge, &key("k"), &Arc::from("r"), now).is_none());
        // Cut short anywhere, it is unreadable, never half an answer.
        for cut in [1, 10, 60, variant.bytes.len() - 6] {
            let short = CacheVariant {
                bytes: variant.bytes[..cut].to_vec(),
                ..variant.clone()
            };
            assert!(
                decode(&short, &key("k"), &Arc::from("r"), now).is_none(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_pass_lasts_its_time_on_the_store_s_clock() {
        let now = Instant::now();
        let bytes = encode_pass(&key("k"), Duration::from_secs(1));
        let read = |elapsed_us| {
            decode(
                &CacheVariant {
                    elapsed_us,
                    bytes: bytes.clone(),
                },
                &key("k"),
                &Arc::from("r"),
                now,
            )
        };
        assert!(
            matches!(read(400_000), Some(Shelved::Pass(left)) if left == Duration::from_millis(600))
        );
        assert!(read(1_000_000).is_none());
    }

    #[test]
    fn variants_are_named_by_what_they_varied_on() {
        let now = Instant::now() + Duration::from_secs(100);
        let a = entry(now);
        let mut b = entry(now);
        b.vary[0].1 = Some(HeaderValue::from_static("br"));
        assert_ne!(variant_name(&a.vary), variant_name(&b.vary));
        assert_eq!(variant_name(&a.vary), variant_name(&entry(now).vary));
        let mut asked = HeaderMap::new();
        asked.insert("accept-encoding", HeaderValue::from_static("gzip"));
        assert!(serves(&a, &asked, true));
        assert!(!serves(&b, &asked, false));
        asked.insert("accept-language", HeaderValue::from_static("fr"));
        assert!(!serves(&a, &asked, false));
    }
}
