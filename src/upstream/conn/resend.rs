//! A request body that can be sent again (`Resend`): what an HTTP/2 upstream did not process
//! goes once more, on another stream or connection, with the frames the first attempt sent.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame};

/// A body's error when a later attempt of its request took over: the earlier attempt reads no
/// more.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("a retry of this request is sending its body")]
pub struct Superseded;

/// A request body that can be sent again: an HTTP/2 upstream may refuse a stream it never
/// processed (`REFUSED_STREAM`, or a GOAWAY naming a lower last stream), and then the request
/// goes once more on another connection. Every frame read from the client is kept (up to
/// [`RESEND_BYTES`]) so that the next attempt sends them again before it reads on; past that,
/// the request can no longer be retried ([`ResendHandle::again`] says `None`).
pub struct Resend<B> {
    shared: Arc<Mutex<Recording<B>>>,
    /// Which attempt this is: an older attempt's body reads nothing more once a newer one began.
    attempt: u32,
    /// The next recorded frame this attempt sends.
    next: usize,
}

/// The most bytes of a request body kept for a retry (Envoy buffers 64 KiB for its retries).
pub const RESEND_BYTES: usize = 64 * 1024;

struct Recording<B> {
    source: B,
    frames: Vec<Frame<Bytes>>,
    bytes: usize,
    /// False once more than [`RESEND_BYTES`] were read: a retry can no longer send them all.
    complete: bool,
    attempts: u32,
}

fn copy_frame(frame: &Frame<Bytes>) -> Frame<Bytes> {
    match frame.data_ref() {
        Some(data) => Frame::data(data.clone()),
        None => Frame::trailers(frame.trailers_ref().cloned().unwrap_or_default()),
    }
}

impl<B> Resend<B> {
    /// The first attempt's body.
    pub fn new(source: B) -> Self {
        Resend {
            shared: Arc::new(Mutex::new(Recording {
                source,
                frames: Vec::new(),
                bytes: 0,
                complete: true,
                attempts: 1,
            })),
            attempt: 1,
            next: 0,
        }
    }

    /// A handle that can start the next attempt once this one has failed.
    pub fn handle(&self) -> ResendHandle<B> {
        ResendHandle(self.shared.clone())
    }
}

/// Starts another attempt of a [`Resend`]'s request.
pub struct ResendHandle<B>(Arc<Mutex<Recording<B>>>);

impl<B> ResendHandle<B> {
    /// The next attempt's body, sending again what the earlier one sent; `None` when the body
    /// was too large to keep. The earlier attempt's body reads nothing more from the client.
    pub fn again(&self) -> Option<Resend<B>> {
        let mut shared = self.0.lock().ok()?;
        if !shared.complete {
            return None;
        }
        shared.attempts += 1;
        Some(Resend {
            shared: self.0.clone(),
            attempt: shared.attempts,
            next: 0,
        })
    }
}

impl<B> HttpBody for Resend<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: From<Superseded>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let Ok(mut shared) = this.shared.lock() else {
            return Poll::Ready(None);
        };
        if let Some(frame) = shared.frames.get(this.next) {
            this.next += 1;
            return Poll::Ready(Some(Ok(copy_frame(frame))));
        }
        if this.attempt != shared.attempts {
            return Poll::Ready(Some(Err(Superseded.into())));
        }
        let polled = Pin::new(&mut shared.source).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && shared.complete
        {
            shared.bytes += frame.data_ref().map_or(0, Bytes::len);
            if shared.bytes > RESEND_BYTES {
                shared.complete = false;
                shared.frames = Vec::new();
            } else {
                let copy = copy_frame(frame);
                shared.frames.push(copy);
                this.next += 1;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.shared
            .lock()
            .is_ok_and(|s| self.next >= s.frames.len() && s.source.is_end_stream())
    }
}
