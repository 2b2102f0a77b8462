//! The tokens that name one request's concurrency leases.

use std::sync::atomic::{AtomicU64, Ordering};

/// The token that names one request's concurrency leases, so it can release them. Unique within
/// a process; the stores combine it with nothing else, so tokens of different instances sharing
/// one Redis start from a random point (64 bits: collisions are negligible).
pub type LeaseId = u64;

/// A new lease token.
pub fn next_lease() -> LeaseId {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::OnceLock;
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(RandomState::new().hash_one(0u8) >> 1))
        .fetch_add(1, Ordering::Relaxed)
}
