//! The limiter as Redis runs it: the Lua files joined into one function library (`FCALL`, Redis
//! 7) or scripts (`EVALSHA`, before 7), the caller that sends either, and the layout of their
//! arguments and replies.

use std::sync::atomic::Ordering;

use redis::{Script, Value};
use sha2::{Digest, Sha256};

use super::connection::{Connection, ErrorReply, query};
use crate::limiter::wire::Reply;
use crate::limiter::{Ask, LimiterError};

/// Everything before `main.lua`: helpers, the algorithms and a clock.
macro_rules! limiter_library {
    ($clock:literal) => {
        concat!(
            include_str!("../lua/prelude.lua"),
            include_str!("../lua/gcra.lua"),
            include_str!("../lua/leaky_bucket.lua"),
            include_str!("../lua/fixed_window.lua"),
            include_str!("../lua/sliding_window_log.lua"),
            include_str!("../lua/sliding_window_counter.lua"),
            include_str!("../lua/concurrency.lua"),
            include_str!($clock),
            include_str!("../lua/decide.lua"),
        )
    };
}

pub(super) const LIBRARY: &str = limiter_library!("../lua/clock_redis.lua");
pub(super) const TEST_LIBRARY: &str = limiter_library!("../lua/clock_test.lua");
pub(super) const MAIN: &str = include_str!("../lua/main.lua");
pub(super) const BATCH: &str = include_str!("../lua/batch.lua");

/// The limiter script, assembled from one file per algorithm, on Redis' clock.
pub const SCRIPT_SOURCE: &str = concat!(
    limiter_library!("../lua/clock_redis.lua"),
    include_str!("../lua/main.lua")
);
/// The same script on a clock the caller passes as `ARGV[1]`: for the differential tests only.
pub(super) const TEST_SCRIPT_SOURCE: &str = concat!(
    limiter_library!("../lua/clock_test.lua"),
    include_str!("../lua/main.lua")
);
/// The batch script (many decisions per call) for `EVALSHA`, before Redis 7.
pub(super) const BATCH_SCRIPT_SOURCE: &str = concat!(
    limiter_library!("../lua/clock_redis.lua"),
    include_str!("../lua/batch.lua")
);

/// The same Lua as a Redis 7 function library: the helpers and algorithms are built once when
/// the library loads, and each `FCALL` runs only `main.lua`, where an `EVALSHA` rebuilds every
/// table and closure of the script on each call. Its name carries a hash of its text, so two
/// floodgate versions sharing one Redis (a rolling upgrade) each call their own.
pub(super) struct FunctionLibrary {
    /// `FUNCTION LOAD REPLACE` text.
    pub(super) code: String,
    /// The decision function's name.
    pub(super) decide: String,
    /// The batch function's name (`batch.lua`).
    pub(super) batch: String,
}

impl FunctionLibrary {
    pub(super) fn new(body: &str) -> Self {
        let hash =
            super::super::hex(&Sha256::digest(format!("{body}{MAIN}{BATCH}").as_bytes())[..6]);
        let decide = format!("floodgate_decide_{hash}");
        let batch = format!("floodgate_batch_{hash}");
        let code = format!(
            "#!lua name=floodgate_{hash}\n{body}\nlocal function decide(KEYS, ARGV)\n{MAIN}\nend\n\
             local function batch(KEYS, ARGV)\n{BATCH}\nend\n\
             redis.register_function('{decide}', decide)\n\
             redis.register_function('{batch}', batch)\n"
        );
        FunctionLibrary {
            code,
            decide,
            batch,
        }
    }
}

/// Whether the server has the function library: not known yet, loaded, or not supported (Redis
/// before 7), when `EVALSHA` is used for good.
pub(super) const FUNCTIONS_UNKNOWN: u8 = 0;
pub(super) const FUNCTIONS_LOADED: u8 = 1;
pub(super) const FUNCTIONS_UNSUPPORTED: u8 = 2;

/// Settles reserved costs (`settle.lua`), on Redis' clock.
pub(super) const SETTLE_SOURCE: &str = concat!(
    limiter_library!("../lua/clock_redis.lua"),
    include_str!("../lua/settle.lua")
);
/// The same on the caller's clock: for the differential tests only.
pub(super) const TEST_SETTLE_SOURCE: &str = concat!(
    limiter_library!("../lua/clock_test.lua"),
    include_str!("../lua/settle.lua")
);

/// Gives back one request's concurrency leases.
pub(super) const RELEASE_SOURCE: &str = include_str!("../lua/release.lua");
pub(super) const RENEW_SOURCE: &str = include_str!("../lua/renew.lua");

/// The two scripts' entry points.
#[derive(Clone, Copy)]
pub(super) enum Entry {
    Decide,
    Batch,
}

/// What sends the scripts: the function library (or, before Redis 7, the scripts for `EVALSHA`),
/// shared by the store and its batch driver.
pub(super) struct Caller {
    pub(super) library: FunctionLibrary,
    /// `FUNCTIONS_*`: whether to `FCALL` or `EVALSHA`.
    pub(super) functions: std::sync::atomic::AtomicU8,
    pub(super) script: Script,
    pub(super) batch_script: Script,
    /// Round trips (`floodgate_store_calls_total`), once the guard hands its counter over.
    pub(super) calls: std::sync::OnceLock<prometheus_client::metrics::counter::Counter>,
}

impl Caller {
    /// `FUNCTION LOAD REPLACE`s the library; a server without functions (before Redis 7) sends
    /// this store to `EVALSHA` for good.
    pub(super) async fn load_library(&self, connection: &Connection) -> redis::RedisResult<()> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&self.library.code);
        match query::<String>(connection, &load).await {
            Ok(_) => {
                self.functions.store(FUNCTIONS_LOADED, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if ErrorReply::of(&e) == ErrorReply::UnknownCommand => {
                tracing::info!("Redis has no functions (before 7): using EVALSHA");
                self.functions
                    .store(FUNCTIONS_UNSUPPORTED, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// One decision's script call: `FCALL` of the function library when the server has it (it
    /// is loaded on first use, and again after `FUNCTION FLUSH` or a failover to a server
    /// without it), else `EVALSHA` (Redis 6).
    pub(super) async fn call(
        &self,
        connection: &Connection,
        keys: &[String],
        args: &[Vec<u8>],
    ) -> redis::RedisResult<Vec<Value>> {
        self.call_entry(connection, Entry::Decide, keys, args).await
    }

    /// [`Caller::call`] of either entry point: one decision (`main.lua`) or a batch (`batch.lua`).
    pub(super) async fn call_entry(
        &self,
        connection: &Connection,
        entry: Entry,
        keys: &[String],
        args: &[Vec<u8>],
    ) -> redis::RedisResult<Vec<Value>> {
        if let Some(calls) = self.calls.get() {
            calls.inc();
        }
        let (function, script) = match entry {
            Entry::Decide => (&self.library.decide, &self.script),
            Entry::Batch => (&self.library.batch, &self.batch_script),
        };
        if self.functions.load(Ordering::Relaxed) != FUNCTIONS_UNSUPPORTED {
            let fcall = || {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(function).arg(keys.len()).arg(keys).arg(args);
                cmd
            };
            match query(connection, &fcall()).await {
                Err(e) if ErrorReply::of(&e) == ErrorReply::FunctionNotFound => {
                    self.load_library(connection).await?;
                    if self.functions.load(Ordering::Relaxed) == FUNCTIONS_LOADED {
                        return query(connection, &fcall()).await;
                    }
                }
                Err(e) if ErrorReply::of(&e) == ErrorReply::UnknownCommand => {
                    tracing::info!("Redis has no FCALL (before 7): using EVALSHA");
                    self.functions
                        .store(FUNCTIONS_UNSUPPORTED, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for a in args {
            invocation.arg(a.as_slice());
        }
        match connection.clone() {
            Connection::Single(mut c) => invocation.invoke_async(&mut c).await,
            Connection::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        }
    }
}

/// Appends each limit's nine arguments (algorithm name, parameter a, parameter b, cost, and
/// from `wants`, 0s when it is shorter: the requests' worth to lease beyond this request, those
/// of an ended lease given back with the store time it was granted at, how long a lease lasts,
/// and the ended lease's size), as `decide.lua` reads them. A quota's parameter b is the end of
/// the calendar period `calendar_now` (µs since the epoch) falls in.
pub(super) fn push_limits(
    args: &mut Vec<Vec<u8>>,
    asks: &[Ask<'_>],
    wants: &[crate::limiter::lease::LeaseAsk],
    calendar_now: u64,
) {
    let number = |n: u64| n.to_string().into_bytes();
    for (i, ask) in asks.iter().enumerate() {
        let (a, b) = ask.limit.algorithm().wire_at(calendar_now);
        let lease = wants.get(i).copied().unwrap_or_default();
        args.push(ask.limit.algorithm().name().as_bytes().to_vec());
        args.push(number(a));
        args.push(number(b));
        args.push(number(u64::from(ask.limit.cost())));
        args.push(number(u64::from(lease.want)));
        args.push(number(lease.back));
        args.push(number(lease.back_at.0));
        args.push(number(lease.lease_us));
        args.push(number(lease.lent));
    }
}

/// Reads the script's reply (the layout of [`wire::Reply`], then one leased count per limit) for
/// a request of `limits` limits. An item that is not a non-negative number comes from the
/// state of this request's keys, not from the store's health: [`LimiterError::Refused`], which
/// the breaker does not count (a reply of the wrong shape is [`LimiterError::Protocol`]).
pub(super) fn read_reply(reply: &[Value], limits: usize) -> Result<Reply, LimiterError> {
    let number = |at: usize| match &reply[at] {
        Value::Int(n) if *n >= 0 => Ok(*n as u64),
        other => Err(LimiterError::refused(format!(
            "reply item {at} is {other:?}, expected a non-negative number"
        ))),
    };
    Reply::read_with_leases(reply.len(), limits, number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_with_a_value_that_is_not_a_number_is_about_its_keys() {
        let mut reply: Vec<Value> = [1, 7, 1, 10, 9, 100, 0, 0, 3].map(Value::Int).to_vec();
        assert!(read_reply(&reply, 1).is_ok());
        reply[4] = Value::Nil;
        assert!(matches!(
            read_reply(&reply, 1),
            Err(LimiterError::Refused(_))
        ));
        // What Redis answers for a Lua number past i64 (a state no settlement writes now).
        reply[4] = Value::Int(i64::MIN);
        assert!(matches!(
            read_reply(&reply, 1),
            Err(LimiterError::Refused(_))
        ));
        reply.pop();
        assert!(matches!(
            read_reply(&reply, 1),
            Err(LimiterError::Protocol(_))
        ));
    }
}
