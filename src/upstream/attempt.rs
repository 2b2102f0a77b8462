//! What one attempt at an upstream came to when it did not end in an answer to relay, and
//! whether another attempt, on another endpoint, may follow (pingora's `Error::retry`): the
//! retry loop reads this and nothing else.
//!
//! | failure | the request reached the upstream | retried when |
//! | --- | --- | --- |
//! | [`Failed::Connect`]: no connection (dial, TLS, handshake) | no | `retries.on: connect_failure` (any method) |
//! | [`Failed::Unprocessed`]: an HTTP/2 stream refused unprocessed | no | `refused_stream` (any method) |
//! | [`Failed::Broken`]: the connection failed once the request was sent | maybe | `reset`, an idempotent request without a body |
//! | [`Failed::Answered`]: the upstream answered 502, 503 or 504 | yes | that status listed, an idempotent request without a body |
//! | [`Failed::Final`]: the client's own body failed; an upgrade; nothing left to send | maybe | never |

use super::RetryOn;

/// A failed attempt: `E` is why (the connections' error), `R` an answer that counts as a
/// failure (a 502, 503 or 504 relayed unless another attempt is made).
#[derive(Debug)]
pub enum Failed<R, E> {
    Connect(E),
    Unprocessed(E),
    Broken(E),
    Answered(R, u16),
    Final(E),
}

impl<R, E> Failed<R, E> {
    /// Whether the request may have reached the upstream (been processed there).
    pub fn reached(&self) -> bool {
        !matches!(self, Failed::Connect(_) | Failed::Unprocessed(_))
    }

    /// Whether another attempt may help, as `on` says: `resendable` for a request that may be
    /// sent twice (an idempotent method, nothing to send beyond its head).
    pub fn retryable(&self, on: &RetryOn, resendable: bool) -> bool {
        match self {
            Failed::Connect(_) => on.connect_failure,
            Failed::Unprocessed(_) => on.refused_stream,
            Failed::Broken(_) => on.reset && resendable,
            Failed::Answered(_, status) => on.status(*status) && resendable,
            Failed::Final(_) => false,
        }
    }

    /// What the client is told when no attempt follows: the answer itself, or the error.
    pub fn into_result(self) -> Result<R, E> {
        match self {
            Failed::Answered(answer, _) => Ok(answer),
            Failed::Connect(e) | Failed::Unprocessed(e) | Failed::Broken(e) | Failed::Final(e) => {
                Err(e)
            }
        }
    }

    /// The same failure, never retried (the client's own body failed, say).
    pub fn into_final(self) -> Self {
        match self {
            Failed::Connect(e) | Failed::Unprocessed(e) | Failed::Broken(e) => Failed::Final(e),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type F = Failed<&'static str, &'static str>;

    fn every_kind() -> [F; 5] {
        [
            Failed::Connect("refused"),
            Failed::Unprocessed("REFUSED_STREAM"),
            Failed::Broken("reset"),
            Failed::Answered("503", 503),
            Failed::Final("client body"),
        ]
    }

    #[test]
    fn only_a_connect_failure_and_an_unprocessed_stream_never_reached_the_upstream() {
        let reached: Vec<bool> = every_kind().iter().map(F::reached).collect();
        assert_eq!(reached, [false, false, true, true, true]);
    }

    #[test]
    fn by_default_what_never_reached_the_upstream_is_retried_and_nothing_else() {
        let on = RetryOn::default();
        for resendable in [false, true] {
            let retried: Vec<bool> = every_kind()
                .iter()
                .map(|f| f.retryable(&on, resendable))
                .collect();
            assert_eq!(retried, [true, true, false, false, false], "{resendable}");
        }
    }

    #[test]
    fn a_reset_or_a_listed_status_is_retried_only_for_a_request_that_may_be_sent_twice() {
        let on = RetryOn {
            connect_failure: false,
            refused_stream: false,
            reset: true,
            statuses: 0b010, // 503
        };
        let retried = |resendable| -> Vec<bool> {
            every_kind()
                .iter()
                .map(|f| f.retryable(&on, resendable))
                .collect()
        };
        assert_eq!(retried(true), [false, false, true, true, false]);
        assert_eq!(retried(false), [false, false, false, false, false]);
        // 502 and 504 are not listed.
        for status in [502, 504] {
            assert!(!F::Answered("", status).retryable(&on, true), "{status}");
        }
    }

    #[test]
    fn a_failure_made_final_is_never_retried_and_an_answer_is_relayed() {
        let on = RetryOn {
            connect_failure: true,
            refused_stream: true,
            reset: true,
            statuses: 0b111,
        };
        let finals: Vec<bool> = every_kind()
            .into_iter()
            .map(|f| f.into_final().retryable(&on, true))
            .collect();
        // An answer stays an answer (it is relayed, or retried as its status says).
        assert_eq!(finals, [false, false, false, true, false]);
        assert_eq!(F::Answered("503", 503).into_result(), Ok("503"));
        assert_eq!(F::Broken("reset").into_result(), Err("reset"));
        assert_eq!(F::Final("body").into_result(), Err("body"));
    }
}
