//! Rate limiting without HTTP: the algorithms, their parameters, the decisions they make and the
//! stores that keep their state.
//!
//! The pieces are independent, as in `governor`: a [`Limit`] (algorithm × parameters × cost) says
//! what is allowed; [`algorithm::State`] holds one budget's state for one limit and decides as a
//! pure function of (state, now, parameters); a store keeps states per [`BudgetKey`]; a [`Clock`]
//! says what time it is. Nothing here knows about hyper or the config file.
//!
//! A request is decided by a list of [`Ask`]s, one per limit that applies to it, each naming the
//! budget that limit spends (the caller's identity, its IP, or the whole route). The stores
//! decide the list all-or-nothing: when one limit denies, nothing is spent from any of them.
//!
//! [`Algorithm`] and [`Limit`] cannot be built invalid: their fields are private and their
//! constructors check every bound the algorithms and the Redis scripts rely on (no zero
//! interval or window, no budget past 2^53 µs, no cost above what the budget holds).

pub mod algorithm;
pub mod batch;
pub mod calendar;
mod clock;
mod decision;
mod error;
mod front;
pub mod guard;
pub mod hold;
pub(crate) mod key;
pub mod lease;
mod lease_id;
mod limit;
pub mod memory;
mod owned_key;
pub mod postgres;
pub mod redis;
pub mod slices;
mod store;
pub mod wire;

pub use clock::{
    AnchoredClock, Clock, ClockOffset, LocalUs, ManualClock, MonotonicClock, StoreUs, SystemClock,
    wall_clock_us,
};
pub use decision::{
    Admission, Decision, Figures, Outcome, Ruling, Settlement, Source, Standing, Standings, Verdict,
};
pub use error::{Cause, Fault, LimiterError, OnError};
pub use front::{HeldLeases, Limiter, LimiterSpec, Reservation, StoreSpec};
pub use key::{Ask, BudgetKey, KeyKind, hex, push_hex};
pub use lease_id::{LeaseId, next_lease};
pub use limit::{Algorithm, AlgorithmKind, Limit, LimitError, LimitField, MAX_LIMITS, Parameters};
pub use memory::MemoryStore;
pub use store::{
    CacheScope, CacheVariant, CacheWrite, ControlChange, ControlList, RoomBounds, RoomEntered,
    Shared, Store, StoreCall,
};
