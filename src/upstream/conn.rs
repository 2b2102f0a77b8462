//! The connections to upstreams, keyed by what an endpoint dials (its scheme and address), so
//! that each endpoint has its own: HTTP/1.1 keep-alive connections ([`http1::Pool`]), HTTP/2
//! connections with many streams each ([`http2::Multiplex`]) read through a frame inspector
//! ([`frames`]) that refuses what h2 would let through, and the request body that can be sent
//! again when an HTTP/2 upstream did not process a stream ([`resend::Resend`]).
//!
//! They are generic over the body sent: the proxy's (`proxy::body::RequestBody`) on the request
//! path, anything in the tests.

mod frames;
pub mod http1;
pub mod http2;
pub mod resend;

pub use http1::{Connection, Io, Key, Pool, PoolError, PooledBody, dial};
pub use http2::{Multiplex, MultiplexBody, copy_head};
pub use resend::{RESEND_BYTES, Resend, ResendHandle, Superseded};

/// An error of any kind, sendable: what hyper's bodies and connectors fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body the connections can send: bytes, an error hyper can carry, movable across tasks.
pub trait Outgoing:
    hyper::body::Body<Data = bytes::Bytes, Error: Into<BoxError>> + Send + Unpin + 'static
{
}

impl<B> Outgoing for B where
    B: hyper::body::Body<Data = bytes::Bytes, Error: Into<BoxError>> + Send + Unpin + 'static
{
}

/// What a [`Resend`] body reads from: an [`Outgoing`] body whose error can also say that a
/// later attempt took over ([`Superseded`]).
pub trait Source:
    hyper::body::Body<Data = bytes::Bytes, Error: Into<BoxError> + From<Superseded>>
    + Send
    + Unpin
    + 'static
{
}

impl<B> Source for B where
    B: hyper::body::Body<Data = bytes::Bytes, Error: Into<BoxError> + From<Superseded>>
        + Send
        + Unpin
        + 'static
{
}
