//! One upstream fetch per key: the first request that misses a key leads its fill; the others
//! follow it, waiting for its answer's head (at most `coalesce_wait`) and then reading its body
//! as it arrives, chunk by chunk (never waiting for the end). The fetch's body is read by a
//! task of its own, so the leader's client leaving does not cut the followers off, and it is
//! stored when it ends whole.
//!
//! A fill ends one of four ways, and its followers go on accordingly:
//! - **streaming**: they are served from it (`collapsed`);
//! - **pass** (the answer may not be stored): they go upstream themselves, a few at a time
//!   ([`RELEASED_AT_ONCE`]), so an endpoint wrongly marked cacheable cannot be stampeded;
//! - **failed** (a 5xx, a timeout, no endpoint): they are served a stale copy if their route
//!   allows it, or go upstream a few at a time;
//! - **abandoned** (the leader was refused before it went upstream): they try again, one of
//!   them leading.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use super::body::{Following, Piece};

/// The most requests waiting on one key's fill.
pub const MAX_WAITING_PER_KEY: usize = 4096;
/// The most requests waiting on fills, all keys together.
pub const MAX_WAITING: usize = 65_536;
/// How many followers of a fill that could not be used go upstream at once.
pub const RELEASED_AT_ONCE: usize = 8;

/// The fills under way, by key.
#[derive(Default)]
pub struct Fills {
    map: Mutex<HashMap<Arc<[u8]>, Arc<Fill>>>,
    waiting: AtomicUsize,
}

/// One key's fetch under way.
pub struct Fill {
    state: Mutex<State>,
    /// Bumped at every change of `state`.
    changed: watch::Sender<u64>,
    waiting: AtomicUsize,
    released: Arc<Semaphore>,
}

enum State {
    Pending,
    Streaming(Box<Stream>),
    Pass,
    Failed,
    Abandoned,
}

/// A fetch whose head has arrived.
struct Stream {
    status: StatusCode,
    headers: HeaderMap,
    length: Option<u64>,
    /// What arrived so far, for followers that join late (cleared once the answer outgrows
    /// `max_entry`: no one joins then).
    chunks: Vec<Bytes>,
    subscribers: Vec<mpsc::UnboundedSender<Piece>>,
    /// How the body ended, once it has.
    end: Option<Piece>,
    joinable: bool,
}

/// What a request gets when it asks for a key's fill.
pub enum Claim {
    /// It leads: it goes upstream, and its answer is the fill.
    Lead(Leader),
    /// Another request leads: wait for it.
    Follow(Waiter),
    /// Too many wait already: it goes upstream on its own.
    Full,
}

impl Fills {
    /// Leads or follows `key`'s fill.
    pub fn claim(self: &Arc<Self>, key: &Arc<[u8]>) -> Claim {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fill) = map.get(key) {
            if fill.waiting.load(Ordering::Relaxed) >= MAX_WAITING_PER_KEY
                || self.waiting.load(Ordering::Relaxed) >= MAX_WAITING
            {
                return Claim::Full;
            }
            fill.waiting.fetch_add(1, Ordering::Relaxed);
            self.waiting.fetch_add(1, Ordering::Relaxed);
            return Claim::Follow(Waiter {
                fill: fill.clone(),
                fills: self.clone(),
            });
        }
        let fill = Arc::new(Fill {
            state: Mutex::new(State::Pending),
            changed: watch::channel(0).0,
            waiting: AtomicUsize::new(0),
            released: Arc::new(Semaphore::new(RELEASED_AT_ONCE)),
        });
        map.insert(key.clone(), fill.clone());
        Claim::Lead(Leader {
            fills: self.clone(),
            key: key.clone(),
            fill,
            settled: false,
        })
    }

    /// A fill no one can follow (a refresh, a request that goes upstream on its own): its
    /// answer is streamed and stored all the same.
    pub fn solo(self: &Arc<Self>) -> Leader {
        Leader {
            fills: self.clone(),
            key: Arc::from(Vec::new()),
            fill: Arc::new(Fill {
                state: Mutex::new(State::Pending),
                changed: watch::channel(0).0,
                waiting: AtomicUsize::new(0),
                released: Arc::new(Semaphore::new(RELEASED_AT_ONCE)),
            }),
            settled: false,
        }
    }

    /// Requests waiting on fills now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    fn remove(&self, key: &[u8], fill: &Arc<Fill>) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(key).is_some_and(|f| Arc::ptr_eq(f, fill)) {
            map.remove(key);
        }
    }
}

impl Fill {
    fn set(&self, state: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
        self.changed.send_modify(|v| *v += 1);
    }
}

/// The request that leads a key's fill. Dropped unsettled (refused before it went upstream,
/// or its client gone), the fill is abandoned and its followers try again.
pub struct Leader {
    fills: Arc<Fills>,
    key: Arc<[u8]>,
    fill: Arc<Fill>,
    settled: bool,
}

/// How a streamed fill ended, for the cache to store it: its chunks when it ended whole within
/// `max_entry`. Told once: when the body ends, or as soon as it outgrows `max_entry`.
pub type Ended = Box<dyn FnOnce(Result<Arc<[Bytes]>, Unkept>) + Send>;

/// Why a streamed fill is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unkept {
    /// It outgrew `max_entry` (told as it does, before its end: the key's next requests should
    /// not wait on a fetch that cannot be kept either).
    TooLarge,
    /// The upstream failed before the end.
    Failed,
}

impl Leader {
    /// The answer may not be stored: its followers go upstream themselves, a few at a time.
    pub fn pass(mut self) {
        self.settle(State::Pass);
    }

    /// The fetch failed: its followers use a stale copy, or go upstream a few at a time.
    pub fn fail(mut self) {
        self.settle(State::Failed);
    }

    fn settle(&mut self, state: State) {
        self.settled = true;
        self.fills.remove(&self.key, &self.fill);
        self.fill.set(state);
    }

    /// The answer is storable: its body is read by a task of its own and streamed to the
    /// leader (the body returned) and every follower; `ended` is told how it ended.
    pub fn stream<B>(
        mut self,
        status: StatusCode,
        headers: HeaderMap,
        body: B,
        max_entry: usize,
        ended: Ended,
    ) -> Following
    where
        B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    {
        self.settled = true;
        let length = body.size_hint().exact();
        let (tx, rx) = mpsc::unbounded_channel();
        self.fill.set(State::Streaming(Box::new(Stream {
            status,
            headers,
            length,
            chunks: Vec::new(),
            subscribers: vec![tx],
            end: None,
            joinable: true,
        })));
        let (fills, key, fill) = (self.fills.clone(), self.key.clone(), self.fill.clone());
        tokio::spawn(drive(fills, key, fill, body, max_entry, ended));
        Following::new(rx, length)
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if !self.settled {
            self.settle(State::Abandoned);
        }
    }
}

/// Reads a fill's body to its end, sending each chunk to every subscriber.
async fn drive<B>(
    fills: Arc<Fills>,
    key: Arc<[u8]>,
    fill: Arc<Fill>,
    mut body: B,
    max_entry: usize,
    ended: Ended,
) where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
{
    let mut ended = Some(ended);
    let mut size = 0usize;
    loop {
        let piece = match body.frame().await {
            None => Piece::End,
            Some(Err(_)) => Piece::Failed,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => Piece::Data(data),
                // Trailers are not kept: a cached answer has none.
                Err(_) => continue,
            },
        };
        if matches!(piece, Piece::End) {
            // Kept before any reader hears the end: a client that read the whole answer and
            // asks again at once finds the entry (the fill is still there until it is kept).
            keep(&fill, &mut ended);
        }
        let mut state = fill.state.lock().unwrap_or_else(|p| p.into_inner());
        let State::Streaming(stream) = &mut *state else {
            break;
        };
        stream.subscribers.retain(|s| s.send(piece.clone()).is_ok());
        match piece {
            Piece::Data(data) => {
                size += data.len();
                if stream.joinable && size > max_entry {
                    // Too large to keep: the followers already reading finish; no one joins.
                    stream.joinable = false;
                    stream.chunks = Vec::new();
                    drop(state);
                    if let Some(ended) = ended.take() {
                        ended(Err(Unkept::TooLarge));
                    }
                    fills.remove(&key, &fill);
                    continue;
                }
                if stream.joinable {
                    stream.chunks.push(data);
                }
            }
            end => {
                stream.end = Some(end);
                break;
            }
        }
    }
    fills.remove(&key, &fill);
    fill.changed.send_modify(|v| *v += 1);
    // Not kept at its end (cut, failed, or too large to keep, which said so already).
    if let Some(ended) = ended {
        ended(Err(Unkept::Failed));
    }
}

/// At a fill's end, the whole answer to `ended` (the cache's entry), if it may be kept.
fn keep(fill: &Fill, ended: &mut Option<Ended>) {
    let body = {
        let state = fill.state.lock().unwrap_or_else(|p| p.into_inner());
        match &*state {
            State::Streaming(stream) if stream.joinable => {
                Arc::<[Bytes]>::from(stream.chunks.clone())
            }
            _ => return,
        }
    };
    if let Some(ended) = ended.take() {
        ended(Ok(body));
    }
}

/// A request waiting on another's fill. Dropped (its client gone), it frees its place.
pub struct Waiter {
    fill: Arc<Fill>,
    fills: Arc<Fills>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.fill.waiting.fetch_sub(1, Ordering::Relaxed);
        self.fills.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a follower got of the fill it waited on.
pub enum Followed {
    /// The fill's answer, streaming.
    Served {
        status: StatusCode,
        headers: HeaderMap,
        body: Following,
    },
    /// The answer may not be stored: go upstream, holding this place among the few that go at
    /// once until the upstream answers.
    Released(OwnedSemaphorePermit),
    /// The fetch failed: a stale copy, or upstream as above.
    Failed(OwnedSemaphorePermit),
    /// The leader gave up, or the answer outgrew the cache: try again.
    Retry,
    /// No head within the wait: go upstream alone.
    TimedOut,
}

impl Waiter {
    /// Waits (at most `patience` for the head) and follows.
    pub async fn wait(self, patience: Duration) -> Followed {
        let deadline = tokio::time::Instant::now() + patience;
        let mut changed = self.fill.changed.subscribe();
        loop {
            let released = {
                let mut state = self.fill.state.lock().unwrap_or_else(|p| p.into_inner());
                match &mut *state {
                    State::Pending => None,
                    State::Streaming(stream) if !stream.joinable => return Followed::Retry,
                    State::Streaming(stream) => {
                        let (status, headers, body) = join(stream);
                        return Followed::Served {
                            status,
                            headers,
                            body,
                        };
                    }
                    State::Abandoned => return Followed::Retry,
                    State::Pass => Some(false),
                    State::Failed => Some(true),
                }
            };
            if let Some(failed) = released {
                let Ok(permit) = self.fill.released.clone().acquire_owned().await else {
                    return Followed::Retry;
                };
                return match failed {
                    true => Followed::Failed(permit),
                    false => Followed::Released(permit),
                };
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Followed::Retry,
                Err(_) => return Followed::TimedOut,
            }
        }
    }
}

/// A new subscriber of `stream`: what arrived so far, then the rest as it comes.
fn join(stream: &mut Stream) -> (StatusCode, HeaderMap, Following) {
    let (tx, rx) = mpsc::unbounded_channel();
    for chunk in &stream.chunks {
        let _ = tx.send(Piece::Data(chunk.clone()));
    }
    match &stream.end {
        Some(end) => {
            let _ = tx.send(end.clone());
        }
        None => stream.subscribers.push(tx),
    }
    (
        stream.status,
        stream.headers.clone(),
        Following::new(rx, stream.length),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn key() -> Arc<[u8]> {
        b"k".to_vec().into()
    }

    /// An upstream body the test feeds, piece by piece.
    fn upstream() -> (mpsc::UnboundedSender<Piece>, Following) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Following::new(rx, None))
    }

    fn lead(fills: &Arc<Fills>) -> Leader {
        match fills.claim(&key()) {
            Claim::Lead(leader) => leader,
            _ => panic!("the first claim leads"),
        }
    }

    fn follow(fills: &Arc<Fills>) -> Waiter {
        match fills.claim(&key()) {
            Claim::Follow(waiter) => waiter,
            _ => panic!("a later claim follows"),
        }
    }

    async fn next(body: &mut Following) -> Option<Result<Bytes, String>> {
        let frame = body.frame().await?;
        Some(
            frame
                .map(|f| f.into_data().unwrap())
                .map_err(|e| e.to_string()),
        )
    }

    #[tokio::test]
    async fn followers_read_the_body_as_it_arrives_and_the_whole_of_it_is_kept() {
        let fills = Arc::new(Fills::default());
        let leader = lead(&fills);
        let early = follow(&fills);
        let early = tokio::spawn(early.wait(Duration::from_secs(5)));
        let (feed, body) = upstream();
        let (kept_tx, kept_rx) = tokio::sync::oneshot::channel();
        let mut own = leader.stream(
            StatusCode::OK,
            HeaderMap::new(),
            body,
            1 << 20,
            Box::new(move |kept| {
                let _ = kept_tx.send(kept);
            }),
        );
        feed.send(Piece::Data(Bytes::from_static(b"one "))).unwrap();
        let Followed::Served { mut body, .. } = early.await.unwrap() else {
            panic!("served")
        };
        // The first chunk arrives before the body has ended.
        assert_eq!(next(&mut body).await, Some(Ok(Bytes::from_static(b"one "))));
        assert_eq!(next(&mut own).await, Some(Ok(Bytes::from_static(b"one "))));
        // A follower that joins late gets what came before.
        let late = follow(&fills);
        feed.send(Piece::Data(Bytes::from_static(b"two"))).unwrap();
        feed.send(Piece::End).unwrap();
        let Followed::Served { body: mut late, .. } = late.wait(Duration::from_secs(5)).await
        else {
            panic!("served")
        };
        let mut whole = Vec::new();
        while let Some(chunk) = next(&mut late).await {
            whole.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(whole, b"one two");
        assert_eq!(next(&mut body).await, Some(Ok(Bytes::from_static(b"two"))));
        assert_eq!(next(&mut body).await, None);
        let kept = kept_rx.await.unwrap().expect("kept whole");
        assert_eq!(kept.concat(), b"one two");
        // The fill is over: the next claim leads again.
        assert!(matches!(fills.claim(&key()), Claim::Lead(_)));
        assert_eq!(fills.waiting(), 0);
    }

    // Two workers: the fill's drive and its reader run side by side, as in the proxy.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_answer_is_kept_before_its_reader_hears_the_end() {
        let fills = Arc::new(Fills::default());
        let leader = lead(&fills);
        let (feed, body) = upstream();
        let kept = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let noted = kept.clone();
        let mut own = leader.stream(
            StatusCode::OK,
            HeaderMap::new(),
            body,
            1 << 20,
            Box::new(move |result| {
                // Keeping takes a while (the cache's lock, an eviction): a reader told of the
                // end before it would see no entry in that time.
                std::thread::sleep(Duration::from_millis(100));
                noted.store(result.is_ok(), Ordering::SeqCst);
            }),
        );
        feed.send(Piece::Data(Bytes::from_static(b"all"))).unwrap();
        feed.send(Piece::End).unwrap();
        assert_eq!(next(&mut own).await, Some(Ok(Bytes::from_static(b"all"))));
        assert_eq!(next(&mut own).await, None);
        // The client that read the whole answer may ask again at once: the entry is there.
        assert!(
            kept.load(Ordering::SeqCst),
            "kept by the time the end is heard"
        );
    }

    #[tokio::test]
    async fn a_fill_cut_mid_body_fails_every_follower_and_keeps_nothing() {
        let fills = Arc::new(Fills::default());
        let leader = lead(&fills);
        let waiter = tokio::spawn(follow(&fills).wait(Duration::from_secs(5)));
        let (feed, body) = upstream();
        let (kept_tx, kept_rx) = tokio::sync::oneshot::channel();
        let _own = leader.stream(
            StatusCode::OK,
            HeaderMap::new(),
            body,
            1 << 20,
            Box::new(move |kept| {
                let _ = kept_tx.send(kept);
            }),
        );
        feed.send(Piece::Data(Bytes::from_static(b"half"))).unwrap();
        feed.send(Piece::Failed).unwrap();
        let Followed::Served { mut body, .. } = waiter.await.unwrap() else {
            panic!("served")
        };
        assert_eq!(next(&mut body).await, Some(Ok(Bytes::from_static(b"half"))));
        assert!(matches!(next(&mut body).await, Some(Err(_))));
        assert_eq!(kept_rx.await.unwrap().unwrap_err(), Unkept::Failed);
    }

    #[tokio::test]
    async fn an_answer_past_max_entry_reaches_its_readers_whole_and_is_not_kept() {
        let fills = Arc::new(Fills::default());
        let leader = lead(&fills);
        let (feed, body) = upstream();
        let (kept_tx, kept_rx) = tokio::sync::oneshot::channel();
        let mut own = leader.stream(
            StatusCode::OK,
            HeaderMap::new(),
            body,
            4,
            Box::new(move |kept| {
                let _ = kept_tx.send(kept);
            }),
        );
        feed.send(Piece::Data(Bytes::from_static(b"abc"))).unwrap();
        feed.send(Piece::Data(Bytes::from_static(b"def"))).unwrap();
        assert_eq!(next(&mut own).await, Some(Ok(Bytes::from_static(b"abc"))));
        assert_eq!(next(&mut own).await, Some(Ok(Bytes::from_static(b"def"))));
        // Told at once, before the end: too large to keep.
        assert_eq!(kept_rx.await.unwrap().unwrap_err(), Unkept::TooLarge);
        // Past max_entry no one joins: the next request leads a fetch of its own.
        assert!(matches!(fills.claim(&key()), Claim::Lead(_)));
        feed.send(Piece::End).unwrap();
        assert_eq!(next(&mut own).await, None);
    }

    #[tokio::test]
    async fn followers_of_an_answer_that_cannot_be_stored_go_upstream_a_few_at_a_time() {
        let fills = Arc::new(Fills::default());
        let leader = lead(&fills);
        // Each follower, once released, "goes upstream" for 5 ms holding its place.
        let holding = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..3 * RELEASED_AT_ONCE)
            .map(|_| {
                let waiter = follow(&fills);
                let (holding, most) = (holding.clone(), most.clone());
                tokio::spawn(async move {
                    let Followed::Released(place) = waiter.wait(Duration::from_secs(5)).await
                    else {
                        panic!("released")
                    };
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    drop(place);
                })
            })
            .collect();
        tokio::task::yield_now().await;
        leader.pass();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), RELEASED_AT_ONCE);
        assert_eq!(fills.waiting(), 0);
    }

    #[tokio::test]
    async fn a_leader_that_gives_up_sends_its_followers_round_again() {
        let fills = Arc::new(Fills::default());
        let leader = lead(&fills);
        let waiter = tokio::spawn(follow(&fills).wait(Duration::from_secs(5)));
        tokio::task::yield_now().await;
        drop(leader);
        assert!(matches!(waiter.await.unwrap(), Followed::Retry));
        assert!(matches!(fills.claim(&key()), Claim::Lead(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_waits_for_the_head_no_longer_than_its_patience_and_frees_its_place() {
        let fills = Arc::new(Fills::default());
        let _leader = lead(&fills);
        let waiter = follow(&fills);
        assert_eq!(fills.waiting(), 1);
        assert!(matches!(
            waiter.wait(Duration::from_secs(2)).await,
            Followed::TimedOut
        ));
        assert_eq!(fills.waiting(), 0);
        // A waiter whose client left (its future dropped) frees its place too.
        let gone = tokio::spawn(follow(&fills).wait(Duration::from_secs(60)));
        tokio::task::yield_now().await;
        assert_eq!(fills.waiting(), 1);
        gone.abort();
        let _ = gone.await;
        assert_eq!(fills.waiting(), 0);
    }
}
