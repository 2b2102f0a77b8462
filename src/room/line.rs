//! A waiting room's line, as one instance keeps it on the memory store (Redis keeps the same
//! thing in a script, `limiter/redis/room.rs`, and PostgreSQL in a function, `sql/room.sql`).
//! Pure: time comes in as an argument (ms).
//!
//! - **Active** clients (at most `active`) are admitted; an admission lasts `session` after the
//!   client's last request.
//! - Every other client takes a ticket at its first request and waits in ticket order (first
//!   come, first served: a client that changes its identity starts again at the back).
//! - Admissions are dealt from the front of the line while there is room, at most `admit_rate`
//!   a second (a bucket of one second's worth): a client admitted while it was not asking finds
//!   itself active at its next request, within `session`.
//! - A waiting client that stops asking for [`LINGER_MS`] leaves the line.

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use crate::limiter::{RoomBounds as Bounds, RoomEntered as Entered};

/// How long a waiting client may go without asking before it leaves the line: three of the
/// longest `Retry-After` it is sent (5 s).
pub const LINGER_MS: u64 = 15_000;

/// The most clients one line holds; past it, a new client is told its place at the back
/// without a ticket (and asks again).
pub const MAX_LINE: u64 = 1_000_000;

/// One room's line.
#[derive(Debug, Default)]
pub struct Line {
    /// Admitted clients: when each last asked, and the same by time (for expiry).
    active: HashMap<Vec<u8>, u64>,
    active_by_time: BTreeSet<(u64, Vec<u8>)>,
    /// Waiting clients by ticket; each one's ticket and last request; tickets by last request.
    line: BTreeMap<u64, Vec<u8>>,
    waiting: HashMap<Vec<u8>, (u64, u64)>,
    waiting_by_time: BTreeSet<(u64, Vec<u8>)>,
    next_ticket: u64,
    tokens: f64,
    tokens_at: Option<u64>,
    admitted_total: u64,
}

impl Line {
    /// `client` asks at `now_ms`.
    pub fn enter(&mut self, client: &[u8], now_ms: u64, bounds: Bounds) -> Entered {
        self.expire(now_ms, bounds);
        if let Some(last) = self.active.get_mut(client) {
            self.active_by_time.remove(&(*last, client.to_vec()));
            *last = now_ms;
            self.active_by_time.insert((now_ms, client.to_vec()));
            return self.answer(true, 0);
        }
        // A bucket of one second's admissions, refilled at `admit_rate`.
        let burst = bounds.admit_rate.max(1.0);
        let since = now_ms.saturating_sub(self.tokens_at.unwrap_or(now_ms));
        self.tokens = match self.tokens_at {
            None => burst,
            Some(_) => (self.tokens + since as f64 * bounds.admit_rate / 1000.0).min(burst),
        };
        self.tokens_at = Some(now_ms);
        match self.waiting.get_mut(client) {
            Some((ticket, last)) => {
                self.waiting_by_time.remove(&(*last, client.to_vec()));
                *last = now_ms;
                self.waiting_by_time.insert((now_ms, client.to_vec()));
                let _ = ticket;
            }
            None if self.line.len() as u64 >= bounds.max_line => {
                let waiting = self.line.len() as u64;
                return self.answer(false, waiting + 1);
            }
            None => {
                self.next_ticket += 1;
                let ticket = self.next_ticket;
                self.line.insert(ticket, client.to_vec());
                self.waiting.insert(client.to_vec(), (ticket, now_ms));
                self.waiting_by_time.insert((now_ms, client.to_vec()));
            }
        }
        while (self.active.len() as u64) < bounds.active && self.tokens >= 1.0 {
            let Some((_, head)) = self.line.pop_first() else {
                break;
            };
            if let Some((_, last)) = self.waiting.remove(&head) {
                self.waiting_by_time.remove(&(last, head.clone()));
            }
            self.active_by_time.insert((now_ms, head.clone()));
            self.active.insert(head, now_ms);
            self.tokens -= 1.0;
            self.admitted_total += 1;
        }
        if self.active.contains_key(client) {
            return self.answer(true, 0);
        }
        let ticket = self.waiting.get(client).map_or(0, |(t, _)| *t);
        let position = self.line.range(..ticket).count() as u64 + 1;
        self.answer(false, position)
    }

    fn answer(&self, admitted: bool, position: u64) -> Entered {
        Entered {
            admitted,
            position,
            active: self.active.len() as u64,
            waiting: self.line.len() as u64,
            admitted_total: self.admitted_total,
        }
    }

    /// Admissions past their session, and waiting clients that stopped asking, go.
    fn expire(&mut self, now_ms: u64, bounds: Bounds) {
        while let Some((last, _)) = self.active_by_time.first()
            && last + bounds.session_ms <= now_ms
        {
            if let Some((_, client)) = self.active_by_time.pop_first() {
                self.active.remove(&client);
            }
        }
        while let Some((last, _)) = self.waiting_by_time.first()
            && last + bounds.linger_ms <= now_ms
        {
            if let Some((_, client)) = self.waiting_by_time.pop_first()
                && let Some((ticket, _)) = self.waiting.remove(&client)
            {
                self.line.remove(&ticket);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOM: Bounds = Bounds {
        active: 2,
        admit_rate: 100.0,
        session_ms: 1_000,
        linger_ms: LINGER_MS,
        max_line: MAX_LINE,
    };

    #[test]
    fn at_most_active_are_admitted_and_the_rest_wait_in_order() {
        let mut line = Line::default();
        assert!(line.enter(b"a", 0, ROOM).admitted);
        assert!(line.enter(b"b", 1, ROOM).admitted);
        let c = line.enter(b"c", 2, ROOM);
        let d = line.enter(b"d", 3, ROOM);
        assert_eq!((c.admitted, c.position), (false, 1));
        assert_eq!(
            (d.admitted, d.position, d.active, d.waiting),
            (false, 2, 2, 2)
        );
        // Asking again keeps one's place; the active ones stay admitted.
        assert_eq!(line.enter(b"d", 10, ROOM).position, 2);
        assert!(line.enter(b"a", 10, ROOM).admitted);
    }

    #[test]
    fn an_idle_admission_is_handed_on_after_its_session() {
        let mut line = Line::default();
        line.enter(b"a", 0, ROOM);
        line.enter(b"b", 0, ROOM);
        line.enter(b"c", 0, ROOM);
        line.enter(b"d", 0, ROOM);
        // b keeps asking; a goes quiet: at 1 s its place goes to c, the first in line.
        line.enter(b"b", 900, ROOM);
        let c = line.enter(b"c", 1_000, ROOM);
        assert!(c.admitted);
        assert_eq!(line.enter(b"d", 1_000, ROOM).position, 1);
        assert!(
            !line.enter(b"a", 1_001, ROOM).admitted,
            "a starts again at the back"
        );
        assert_eq!(line.enter(b"a", 1_002, ROOM).position, 2);
    }

    #[test]
    fn admissions_are_dealt_at_most_admit_rate_a_second() {
        let room = Bounds {
            active: 1_000,
            admit_rate: 10.0,
            session_ms: 60_000,
            ..ROOM
        };
        let mut line = Line::default();
        let admitted = (0..100u32)
            .filter(|i| line.enter(&i.to_be_bytes(), 0, room).admitted)
            .count();
        assert_eq!(admitted, 10, "a second's worth at once");
        // 500 ms later, five more tokens: the first five in line (tickets 11 to 15) are in,
        // whoever asks.
        let asked = line.enter(&99u32.to_be_bytes(), 500, room);
        assert_eq!(
            (asked.admitted, asked.position, asked.active),
            (false, 85, 15)
        );
        assert!(line.enter(&14u32.to_be_bytes(), 501, room).admitted);
    }

    #[test]
    fn a_waiting_client_that_stops_asking_leaves_the_line() {
        let room = Bounds {
            session_ms: 60_000,
            ..ROOM
        };
        let mut line = Line::default();
        for c in [b"a", b"b", b"c", b"d"] {
            line.enter(c, 0, room);
        }
        // c stops asking; d keeps asking: past LINGER_MS, d is next.
        line.enter(b"d", LINGER_MS / 2, room);
        let d = line.enter(b"d", LINGER_MS, room);
        assert_eq!((d.position, d.waiting), (1, 1));
    }
}
