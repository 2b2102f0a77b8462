//! Why a store could not decide, whose fault that was, and what a request gets then
//! (`storage.on_error`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// Why a store could not decide. The proxy answers these according to `storage.on_error`.
/// Each keeps its cause's source error ([`std::error::Error::source`]) and says whose fault it
/// was ([`LimiterError::fault`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    #[error("limiter store timed out after {0:?}")]
    Timeout(Duration),
    #[error("limiter store unavailable: {0}")]
    Unavailable(#[source] Cause),
    #[error("limiter store answered something unexpected: {0}")]
    Protocol(#[source] Cause),
    /// The store is up but refused this request (an error reply for its keys, such as a script
    /// error on corrupt data). It says nothing about the store's health, so it does not count
    /// towards the circuit breaker.
    #[error("limiter store refused the request: {0}")]
    Refused(#[source] Cause),
}

/// Whose fault a [`LimiterError`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The store's (down, slow, or answering in a way floodgate does not read): the breaker
    /// counts it.
    Store,
    /// The request's keys' (the store refused them, such as corrupt data under one key): the
    /// store is healthy, and the breaker leaves it alone.
    Keys,
}

impl LimiterError {
    pub fn unavailable(cause: impl Into<Cause>) -> LimiterError {
        LimiterError::Unavailable(cause.into())
    }

    pub fn protocol(cause: impl Into<Cause>) -> LimiterError {
        LimiterError::Protocol(cause.into())
    }

    pub fn refused(cause: impl Into<Cause>) -> LimiterError {
        LimiterError::Refused(cause.into())
    }

    /// Whose fault it was.
    pub fn fault(&self) -> Fault {
        match self {
            LimiterError::Refused(_) => Fault::Keys,
            LimiterError::Timeout(_) | LimiterError::Unavailable(_) | LimiterError::Protocol(_) => {
                Fault::Store
            }
        }
    }
}

/// What went wrong: a sentence, the error it came from, or both. Cheap to clone (a batch's one
/// failure answers every request in it).
#[derive(Debug, Clone)]
pub struct Cause {
    what: Cow<'static, str>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    /// The error `source`, said as it says itself.
    pub fn from_error(source: impl std::error::Error + Send + Sync + 'static) -> Cause {
        Cause {
            what: Cow::Borrowed(""),
            source: Some(Arc::new(source)),
        }
    }

    /// `what` went wrong, because of `source`.
    pub fn of(
        what: impl Into<Cow<'static, str>>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Cause {
        Cause {
            what: what.into(),
            source: Some(Arc::new(source)),
        }
    }
}

impl From<String> for Cause {
    fn from(what: String) -> Cause {
        Cause {
            what: Cow::Owned(what),
            source: None,
        }
    }
}

impl From<&'static str> for Cause {
    fn from(what: &'static str) -> Cause {
        Cause {
            what: Cow::Borrowed(what),
            source: None,
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&*self.what, &self.source) {
            (what, None) => f.write_str(what),
            ("", Some(source)) => write!(f, "{source}"),
            (what, Some(source)) => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// What a request gets when the limiter store cannot decide (`storage.on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail open: forward the request.
    Allow,
    /// Fail closed: answer 503 `rate_limiter_unavailable`.
    Deny,
    /// Decide with the in-process limiter instead.
    Local,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_keeps_its_source_and_says_whose_fault_it_was() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = LimiterError::unavailable(Cause::of("connecting to Redis", io));
        assert_eq!(
            e.to_string(),
            "limiter store unavailable: connecting to Redis: refused"
        );
        let cause = std::error::Error::source(&e).unwrap();
        let io = cause.source().unwrap();
        assert!(io.downcast_ref::<std::io::Error>().is_some());
        assert_eq!(e.fault(), Fault::Store);
        assert_eq!(LimiterError::refused("WRONGTYPE").fault(), Fault::Keys);
        assert_eq!(
            LimiterError::protocol(format!("{} items", 3)).to_string(),
            "limiter store answered something unexpected: 3 items"
        );
    }
}
