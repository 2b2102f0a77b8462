//! Batched decisions (`storage.batch`): the decisions bound for one Redis server leave together.
//!
//! One driver task per store sends one `FCALL` of `batch.lua` at a time. While it is in flight,
//! the decisions that arrive wait in a channel; when it returns, all of them (up to
//! [`MAX_BATCH`]) leave in the next call. An idle store therefore adds no wait (a lone decision
//! leaves at once, alone), and a busy one pays one script call, one `TIME` and one round trip for
//! many decisions. Each decision stays all-or-nothing over its own limits, and decisions in one
//! batch are taken in arrival order, so a later one sees what an earlier one spent: the same
//! answers as one call each, in that order.
//!
//! The caller's `storage.timeout` still bounds each decision (the guard drops its receiver when
//! it gives up); a decision whose caller has gone is left out of the next batch, and a late
//! batch's answers go to nobody. An error about one decision's keys fails that decision alone
//! (`batch.lua` runs each under `pcall`); an error about the call fails every decision in it.
//!
//! Redis Cluster is not batched yet: its decisions go one call each, to whichever node holds
//! their slot.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use super::{Caller, Connection, Entry, classify, read_reply};
use crate::limiter::LimiterError;
use crate::limiter::wire::Reply;

/// The most decisions one call carries. 64 decisions of up to 8 limits stay far below what
/// Redis takes in one command, and keep one call's time in Redis short (about 64 × 10 µs).
pub const MAX_BATCH: usize = 64;

/// One decision waiting for a batch.
pub struct Pending {
    /// Its limits' keys, in order.
    pub keys: Vec<String>,
    /// Its arguments as `batch.lua` reads them: lease token, number of limits, then 4 per limit.
    pub args: Vec<Vec<u8>>,
    /// How many limits it asks (to read its reply).
    pub limits: usize,
    pub reply: oneshot::Sender<Result<Reply, LimiterError>>,
}

/// Starts the driver for a store's `connection`; decisions sent on the returned channel are
/// decided in batches until the sender is dropped.
pub(super) fn start(
    connection: Arc<ArcSwapOption<Connection>>,
    caller: Arc<Caller>,
) -> mpsc::UnboundedSender<Pending> {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(drive(receiver, connection, caller));
    sender
}

async fn drive(
    mut receiver: mpsc::UnboundedReceiver<Pending>,
    connection: Arc<ArcSwapOption<Connection>>,
    caller: Arc<Caller>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // Callers that gave up (their timeout passed while they waited) are not decided for.
        batch.retain(|p: &Pending| !p.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let answers = match connection.load_full() {
            None => Err(LimiterError::Unavailable(
                "not connected to Redis yet".to_string(),
            )),
            Some(connection) => call(&caller, &connection, &batch).await,
        };
        match answers {
            Ok(answers) => {
                for (pending, answer) in batch.drain(..).zip(answers) {
                    let _ = pending.reply.send(answer);
                }
            }
            Err(e) => {
                let message = e.to_string();
                for pending in batch.drain(..) {
                    let _ = pending.reply.send(Err(same_kind(&e, message.clone())));
                }
            }
        }
    }
}

/// An error of `e`'s kind with `message`, for each decision of a failed call.
fn same_kind(e: &LimiterError, message: String) -> LimiterError {
    match e {
        LimiterError::Timeout(d) => LimiterError::Timeout(*d),
        LimiterError::Unavailable(_) => LimiterError::Unavailable(message),
        LimiterError::Protocol(_) => LimiterError::Protocol(message),
        LimiterError::Refused(_) => LimiterError::Refused(message),
    }
}

/// One `batch.lua` call for `batch`; per decision, its reply or its own error.
async fn call(
    caller: &Caller,
    connection: &Connection,
    batch: &[Pending],
) -> Result<Vec<Result<Reply, LimiterError>>, LimiterError> {
    let keys: Vec<String> = batch.iter().flat_map(|p| p.keys.iter().cloned()).collect();
    let mut args: Vec<Vec<u8>> =
        Vec::with_capacity(2 + batch.iter().map(|p| p.args.len()).sum::<usize>());
    args.push(b"-".to_vec());
    args.push(batch.len().to_string().into_bytes());
    for pending in batch {
        args.extend(pending.args.iter().cloned());
    }
    let reply = caller
        .call_entry(connection, Entry::Batch, &keys, &args)
        .await
        .map_err(classify)?;
    read_batch_reply(&reply, batch.iter().map(|p| p.limits))
}

/// Reads `batch.lua`'s reply: the time, then per decision its reply (an array) or `"error: ..."`.
fn read_batch_reply(
    reply: &[Value],
    limits: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Result<Reply, LimiterError>>, LimiterError> {
    if reply.len() != 1 + limits.len() {
        return Err(LimiterError::Protocol(format!(
            "a batch of {} decisions was answered with {} items",
            limits.len(),
            reply.len()
        )));
    }
    Ok(reply[1..]
        .iter()
        .zip(limits)
        .map(|(item, limits)| match item {
            Value::Array(items) => read_reply(items, limits),
            Value::BulkString(text) => Err(LimiterError::Refused(
                String::from_utf8_lossy(text).into_owned(),
            )),
            other => Err(LimiterError::Protocol(format!(
                "a batch's decision is {other:?}"
            ))),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: i64) -> Value {
        Value::Array(
            [allowed, 7, allowed, 10, 9, 100, 0, 0]
                .map(Value::Int)
                .to_vec(),
        )
    }

    #[test]
    fn each_decision_of_a_batch_gets_its_own_answer_and_an_error_stays_with_its_own() {
        let reply = [
            Value::Int(7),
            decision(1),
            Value::BulkString(b"error: WRONGTYPE Operation against a key".to_vec()),
            decision(0),
        ];
        let answers = read_batch_reply(&reply, [1, 1, 1].into_iter()).unwrap();
        assert!(answers[0].as_ref().unwrap().verdict.allowed);
        assert!(matches!(&answers[1], Err(LimiterError::Refused(m)) if m.contains("WRONGTYPE")));
        assert!(!answers[2].as_ref().unwrap().verdict.allowed);
    }

    #[test]
    fn a_batch_answered_with_the_wrong_number_of_decisions_is_a_protocol_error() {
        let reply = [Value::Int(7), decision(1)];
        assert!(matches!(
            read_batch_reply(&reply, [1, 1].into_iter()),
            Err(LimiterError::Protocol(_))
        ));
    }
}
