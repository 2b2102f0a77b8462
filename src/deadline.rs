//! The first deadline every accepted connection meets, on the proxy and admin listeners alike.

use std::time::Duration;

/// A connection that must send its first [`OPENING_BYTES`] within a deadline. Until then nothing
/// else bounds a silent client: hyper's protocol detection (HTTP/1.1 or h2) waits for bytes, the
/// HTTP/1.1 header-read timeout starts only once it chose HTTP/1.1, and the h2 server waits for
/// the rest of a partial preface. After them the protocols' own timers take over (HTTP/1.1 header
/// read, HTTP/2 keep-alive pings).
pub struct FirstByteDeadline<S> {
    inner: S,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    received: usize,
}

/// The h2 connection preface's length; every HTTP/1.1 request head with a `Host` is longer.
pub const OPENING_BYTES: usize = 24;

impl<S> FirstByteDeadline<S> {
    pub fn new(inner: S, within: Duration) -> Self {
        FirstByteDeadline {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
            received: 0,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for FirstByteDeadline<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        let Some(deadline) = this.deadline.as_mut() else {
            return polled;
        };
        if polled.is_ready() {
            this.received += buf.filled().len() - before;
            if this.received >= OPENING_BYTES {
                this.deadline = None;
            }
        } else if polled.is_pending() && deadline.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no request within timeouts.header_read",
            )));
        }
        polled
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for FirstByteDeadline<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
