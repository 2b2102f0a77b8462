//! Batched decisions on PostgreSQL (`storage.batch`; the driver is `limiter/batch.rs`): the
//! decisions that would wait for a pooled connection leave together in one call of
//! `floodgate_decide_batch` (`sql/batch.sql`), one round trip and one transaction for all of
//! them. As many batches are out at once as the pool has connections: PostgreSQL runs them side
//! by side (they lock only their own rows), so below that floodgate sends one decision per call,
//! as without batching.
//!
//! Each decision stays all-or-nothing over its own limits; the batch locks all its rows first,
//! in the key order single decisions lock in, so batches never deadlock with each other or with
//! single decisions. A decision naming an algorithm the database does not know fails alone; any
//! other error fails the batch (the table is typed: no row can hold what a decision cannot read).

use tokio::sync::mpsc;

use super::{Db, Leasing};
use crate::limiter::LimiterError;
use crate::limiter::batch::{self, Pending, answer};
use crate::limiter::wire::Reply;

/// One decision, as a batch call carries it: per limit, the arguments of `floodgate_decide_at`.
pub struct Job {
    pub keys: Vec<String>,
    pub algorithms: Vec<&'static str>,
    pub pa: Vec<i64>,
    pub pb: Vec<i64>,
    pub costs: Vec<i64>,
    pub lease: i64,
    pub leases: Leasing,
}

/// Starts the driver for `db`, with up to `in_flight` batches out at once.
pub(super) fn start(db: Db, in_flight: usize) -> mpsc::UnboundedSender<Pending<Job>> {
    batch::start(in_flight, move |batch| {
        let db = db.clone();
        async move {
            let answers = call(&db, &batch).await;
            answer(batch, answers);
        }
    })
}

/// One `floodgate_decide_batch` call for `batch`; per decision, its reply or its own error.
async fn call(
    db: &Db,
    batch: &[Pending<Job>],
) -> Result<Vec<Result<Reply, LimiterError>>, LimiterError> {
    let n: usize = batch.iter().map(|p| p.job.keys.len()).sum();
    let mut limits = Vec::with_capacity(batch.len());
    let mut leases = Vec::with_capacity(batch.len());
    let mut keys: Vec<&str> = Vec::with_capacity(n);
    let mut algorithms: Vec<&str> = Vec::with_capacity(n);
    let (mut pa, mut pb, mut costs): (Vec<i64>, Vec<i64>, Vec<i64>) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut leasing = Leasing::default();
    for Pending { job, .. } in batch {
        limits.push(job.keys.len() as i32);
        leases.push(job.lease);
        keys.extend(job.keys.iter().map(String::as_str));
        algorithms.extend(&job.algorithms);
        pa.extend(&job.pa);
        pb.extend(&job.pb);
        costs.extend(&job.costs);
        // A decision that leases nothing sends no lease arguments: 0s in its place.
        let limits = job.keys.len();
        let or_zeros = |v: &Vec<i64>| {
            if v.is_empty() {
                vec![0; limits]
            } else {
                v.clone()
            }
        };
        leasing.wants.extend(or_zeros(&job.leases.wants));
        leasing.backs.extend(or_zeros(&job.leases.backs));
        leasing.back_ats.extend(or_zeros(&job.leases.back_ats));
        leasing.lease_us.extend(or_zeros(&job.leases.lease_us));
        leasing.lents.extend(or_zeros(&job.leases.lents));
    }
    db.count_call();
    let items: Vec<i64> = db
        .query(
            &db.sql.decide_batch,
            &[
                &limits,
                &keys,
                &algorithms,
                &pa,
                &pb,
                &costs,
                &leases,
                &leasing.wants,
                &leasing.backs,
                &leasing.back_ats,
                &leasing.lease_us,
                &leasing.lents,
            ],
        )
        .await?;
    read_batch_reply(&items, batch.iter().map(|p| p.job.keys.len()))
}

/// Reads `floodgate_decide_batch`'s reply: per decision, 1, its length and its reply, or 0, 0.
fn read_batch_reply(
    items: &[i64],
    limits: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Result<Reply, LimiterError>>, LimiterError> {
    let decisions = limits.len();
    let mut at = 0;
    let mut answers = Vec::with_capacity(decisions);
    for limits in limits {
        let (Some(&ok), Some(&len)) = (items.get(at), items.get(at + 1)) else {
            return Err(LimiterError::protocol(format!(
                "a batch of {decisions} decisions was answered with {} items",
                items.len()
            )));
        };
        let start = at + 2;
        let end = start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
        let Some(reply) = items.get(start..end) else {
            return Err(LimiterError::protocol(format!(
                "a batch's decision of {len} items overruns the reply of {}",
                items.len()
            )));
        };
        answers.push(if ok == 1 {
            Reply::from_ints(reply, limits)
        } else {
            Err(LimiterError::refused(
                "PostgreSQL does not know an algorithm this decision names",
            ))
        });
        at = end;
    }
    if at != items.len() {
        return Err(LimiterError::protocol(format!(
            "a batch of {decisions} decisions left {} items unread",
            items.len() - at
        )));
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_decision_of_a_batch_gets_its_own_answer_and_an_unknown_algorithm_fails_alone() {
        let allowed = [1, 7, 1, 10, 9, 100, 0, 0, 0];
        let denied = [0, 7, 0, 10, 0, 100, 50, 0, 0];
        let mut items = vec![1, 9];
        items.extend(allowed);
        items.extend([0, 0, 1, 9]);
        items.extend(denied);
        let answers = read_batch_reply(&items, [1, 1, 1].into_iter()).unwrap();
        assert!(answers[0].as_ref().unwrap().verdict.allowed());
        assert!(matches!(&answers[1], Err(LimiterError::Refused(_))));
        assert!(!answers[2].as_ref().unwrap().verdict.allowed());
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_a_protocol_error() {
        let short = [1, 9, 1, 7, 1];
        assert!(matches!(
            read_batch_reply(&short, [1].into_iter()),
            Err(LimiterError::Protocol(_))
        ));
        let long = [0, 0, 0, 0];
        assert!(matches!(
            read_batch_reply(&long, [1].into_iter()),
            Err(LimiterError::Protocol(_))
        ));
        assert!(matches!(
            read_batch_reply(&[1, -3], [1].into_iter()),
            Err(LimiterError::Protocol(_))
        ));
    }
}
