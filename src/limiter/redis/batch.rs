//! Batched decisions on Redis (`storage.batch`; the driver is `limiter/batch.rs`): one `FCALL` of
//! `batch.lua` at a time per store, carrying every decision that waited for it.
//!
//! Each decision stays all-or-nothing over its own limits, and decisions in one batch are taken
//! in arrival order, so a later one sees what an earlier one spent: the same answers as one call
//! each, in that order. An error about one decision's keys fails that decision alone
//! (`batch.lua` runs each under `pcall`); an error about the call fails every decision in it.
//!
//! On Redis Cluster a script's keys must share one slot, so a round's decisions are grouped by
//! their keys' hash tag (a decision's keys share one, see `wire::key_name`) and each group is one
//! call to the node that holds it; the groups of a round are sent at once, and the next round
//! leaves when they have all returned.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use redis::Value;
use tokio::sync::mpsc;

use super::classify;
use super::connection::Connection;
use super::script::{Caller, Entry, read_reply};
use crate::limiter::LimiterError;
use crate::limiter::batch::{self, Pending, answer};
use crate::limiter::wire::Reply;

/// One decision, as a batch call carries it.
pub struct Job {
    /// Its limits' keys, in order.
    pub keys: Vec<String>,
    /// Its arguments as `batch.lua` reads them: lease token, number of limits, then 9 per limit.
    pub args: Vec<Vec<u8>>,
    /// How many limits it asks (to read its reply).
    pub limits: usize,
}

/// Starts the driver for a store's `connection`: one call in flight (Redis runs one at a time).
pub(super) fn start(
    connection: Arc<ArcSwapOption<Connection>>,
    caller: Arc<Caller>,
) -> mpsc::UnboundedSender<Pending<Job>> {
    batch::start(1, move |batch| {
        send(connection.clone(), caller.clone(), batch)
    })
}

/// Sends one round's decisions: one call, or on Redis Cluster one call per hash tag, at once.
async fn send(
    connection: Arc<ArcSwapOption<Connection>>,
    caller: Arc<Caller>,
    mut batch: Vec<Pending<Job>>,
) {
    let Some(connection) = connection.load_full() else {
        answer(
            batch,
            Err(LimiterError::unavailable("not connected to Redis yet")),
        );
        return;
    };
    if matches!(*connection, Connection::Single(_)) {
        let answers = call(&caller, &connection, &batch).await;
        answer(batch, answers);
        return;
    }
    let mut groups: Vec<(String, Vec<Pending<Job>>)> = Vec::new();
    for pending in batch.drain(..) {
        let tag = hash_tag(pending.job.keys.first().map_or("", String::as_str)).to_string();
        match groups.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, group)) => group.push(pending),
            None => groups.push((tag, vec![pending])),
        }
    }
    let mut calls = tokio::task::JoinSet::new();
    for (_, group) in groups {
        let (caller, connection) = (caller.clone(), connection.clone());
        calls.spawn(async move {
            let answers = call(&caller, &connection, &group).await;
            answer(group, answers);
        });
    }
    while calls.join_next().await.is_some() {}
}

/// What Redis Cluster hashes a key by: the text between its first `{` and the next `}` when
/// that is not empty, else the whole key. Keys with the same tag share a slot.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// One `batch.lua` call for `batch`; per decision, its reply or its own error.
async fn call(
    caller: &Caller,
    connection: &Connection,
    batch: &[Pending<Job>],
) -> Result<Vec<Result<Reply, LimiterError>>, LimiterError> {
    let keys: Vec<String> = batch
        .iter()
        .flat_map(|p| p.job.keys.iter().cloned())
        .collect();
    let mut args: Vec<Vec<u8>> =
        Vec::with_capacity(2 + batch.iter().map(|p| p.job.args.len()).sum::<usize>());
    args.push(b"-".to_vec());
    args.push(batch.len().to_string().into_bytes());
    for pending in batch {
        args.extend(pending.job.args.iter().cloned());
    }
    let reply = caller
        .call_entry(connection, Entry::Batch, &keys, &args)
        .await
        .map_err(classify)?;
    read_batch_reply(&reply, batch.iter().map(|p| p.job.limits))
}

/// Reads `batch.lua`'s reply: the time, then per decision its reply (an array) or `"error: ..."`.
fn read_batch_reply(
    reply: &[Value],
    limits: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Result<Reply, LimiterError>>, LimiterError> {
    if reply.len() != 1 + limits.len() {
        return Err(LimiterError::protocol(format!(
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
            Value::BulkString(text) => Err(LimiterError::refused(
                String::from_utf8_lossy(text).into_owned(),
            )),
            other => Err(LimiterError::protocol(format!(
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
            [allowed, 7, allowed, 10, 9, 100, 0, 0, 0]
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
        assert!(answers[0].as_ref().unwrap().verdict.allowed());
        assert!(
            matches!(&answers[1], Err(LimiterError::Refused(m)) if m.to_string().contains("WRONGTYPE"))
        );
        assert!(!answers[2].as_ref().unwrap().verdict.allowed());
    }

    #[test]
    fn the_hash_tag_is_what_redis_cluster_hashes() {
        assert_eq!(hash_tag("fg:r#0:api_key:{abc}:token_bucket"), "abc");
        assert_eq!(hash_tag("{a}{b}"), "a");
        assert_eq!(
            hash_tag("x{}{b}"),
            "x{}{b}",
            "an empty first tag: the whole key"
        );
        assert_eq!(hash_tag("no-tag"), "no-tag");
        assert_eq!(hash_tag("open{only"), "open{only");
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
