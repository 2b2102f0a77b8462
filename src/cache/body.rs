//! The bodies the cache answers with: a stored entry's chunks (shared with the entry, never
//! copied), and a follower's view of a fetch still streaming in.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// A body's error: the fetch it followed failed before its end.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A stored entry's body.
pub struct Stored {
    chunks: Arc<[Bytes]>,
    next: usize,
    left: u64,
}

impl Stored {
    pub fn new(chunks: Arc<[Bytes]>) -> Self {
        let left = chunks.iter().map(|c| c.len() as u64).sum();
        Stored {
            chunks,
            next: 0,
            left,
        }
    }
}

impl Body for Stored {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        while let Some(chunk) = this.chunks.get(this.next) {
            this.next += 1;
            if !chunk.is_empty() {
                this.left -= chunk.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(chunk.clone()))));
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// What a fetch sends the requests that follow it.
#[derive(Debug, Clone)]
pub enum Piece {
    Data(Bytes),
    /// The body ended whole.
    End,
    /// The upstream failed mid-body: the followers' answers must fail too, never look whole.
    Failed,
}

/// A fetch that failed before its end.
#[derive(Debug)]
pub struct Truncated;

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the upstream's answer ended before its end")
    }
}

impl std::error::Error for Truncated {}

/// A follower's body: the fetch's chunks as they arrive.
pub struct Following {
    rx: mpsc::UnboundedReceiver<Piece>,
    length: Option<u64>,
    done: bool,
}

impl Following {
    pub fn new(rx: mpsc::UnboundedReceiver<Piece>, length: Option<u64>) -> Self {
        Following {
            rx,
            length,
            done: length == Some(0),
        }
    }
}

impl Body for Following {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            return match self.rx.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Piece::Data(chunk))) if chunk.is_empty() => continue,
                Poll::Ready(Some(Piece::Data(chunk))) => {
                    if let Some(left) = &mut self.length {
                        *left = left.saturating_sub(chunk.len() as u64);
                    }
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Poll::Ready(Some(Piece::End)) => {
                    self.done = true;
                    Poll::Ready(None)
                }
                // The fetch failed, or its driver went away before the end.
                Poll::Ready(Some(Piece::Failed) | None) => {
                    self.done = true;
                    Poll::Ready(Some(Err(Box::new(Truncated))))
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}
