//! An OpenAI-compatible `POST /v1/chat/completions`, for floodgate's token budgets
//! (`cost: {reserve, actual}`): plain, or streamed as server-sent events with the usage in the
//! last chunk when `stream_options.include_usage` asks, as OpenAI's API does.
//!
//! It generates no language, only what a client and a proxy can count: the prompt costs one
//! token per word of the messages' contents; the completion is `x-demo-completion-tokens`
//! words (default 16), cut to `max_tokens`; `usage` says both and their total. Deterministic,
//! so tests know what each call must settle at.
//!
//! Two knobs for tests of what a proxy reads from real APIs: `x-demo-content-encoding` (`gzip`,
//! `deflate`, `br` or `zstd`) compresses the answer as APIs do when the client accepts it (a
//! stream event by event, each flushed); `x-demo-cut-after: N` sends N events of a stream (the
//! first carrying an early usage of one token, as Anthropic's `message_start` does) and then
//! breaks the connection, as an upstream reset does.

use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

use crate::body::{BodyError, DemoBody, json_response};

/// The path.
pub const PATH: &str = "/v1/chat/completions";
/// The request header that says how many tokens the completion has (before `max_tokens`).
pub const COMPLETION_HEADER: &str = "x-demo-completion-tokens";
/// The request header naming the coding to compress the answer with.
pub const ENCODING_HEADER: &str = "x-demo-content-encoding";
/// The request header saying after how many events a stream breaks off.
pub const CUT_HEADER: &str = "x-demo-cut-after";
/// The completion's length when the header does not say.
const DEFAULT_COMPLETION: u64 = 16;

/// The answer to a chat completion request with `headers` and body `body`.
pub fn answer(headers: &hyper::HeaderMap, body: &[u8], id: u64) -> Response<DemoBody> {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return invalid("the body is not JSON");
    };
    let Some(model) = request["model"].as_str() else {
        return invalid("model is required");
    };
    let Some(messages) = request["messages"].as_array() else {
        return invalid("messages is required");
    };
    let prompt_tokens = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .map(|c| c.split_whitespace().count() as u64)
        .sum::<u64>()
        .max(1);
    let wanted = headers
        .get(COMPLETION_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or(DEFAULT_COMPLETION);
    let max_tokens = request["max_tokens"]
        .as_u64()
        .or_else(|| request["max_completion_tokens"].as_u64());
    let completion_tokens = max_tokens.map_or(wanted, |max| wanted.min(max));
    let finish_reason = if completion_tokens < wanted {
        "length"
    } else {
        "stop"
    };
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    let id = format!("chatcmpl-demo-{id}");
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let words = (0..completion_tokens).map(|i| format!("w{i}"));
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut encoder = header(ENCODING_HEADER).and_then(Encoder::new);
    if request["stream"].as_bool() != Some(true) {
        let content = words.collect::<Vec<_>>().join(" ");
        let answer = json!({
                "id": id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason,
                }],
                "usage": usage,
        });
        return match encoder {
            None => json_response(StatusCode::OK, answer),
            Some(encoder) => encoder.whole(&answer),
        };
    }
    let include_usage = request["stream_options"]["include_usage"].as_bool() == Some(true);
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let cut_after = header(CUT_HEADER).and_then(|v| v.parse::<usize>().ok());
    let mut first = chunk(json!({"role": "assistant", "content": ""}), None);
    if cut_after.is_some() {
        first["usage"] = json!({"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1});
    }
    let mut events = vec![first];
    events.extend(words.map(|w| chunk(json!({"content": format!("{w} ")}), None)));
    events.push(chunk(json!({}), Some(finish_reason)));
    if include_usage {
        events.push(json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }));
    }
    let mut frames: Vec<Bytes> = events
        .into_iter()
        .map(|e| Bytes::from(format!("data: {e}\n\n")))
        .collect();
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    if let Some(cut) = cut_after {
        frames.truncate(cut);
    }
    let coding = encoder.as_ref().map(Encoder::name);
    if let Some(mut encoder) = encoder.take() {
        let mut encoded: Vec<Bytes> = frames.iter().map(|f| encoder.flushed(f)).collect();
        if cut_after.is_none()
            && let Some(last) = encoded.last_mut()
        {
            let mut whole = last.to_vec();
            whole.extend_from_slice(&encoder.finish());
            *last = Bytes::from(whole);
        }
        frames = encoded;
    }
    let mut response = Response::new(
        Events {
            frames,
            next: 0,
            waited: false,
            cut: cut_after.is_some(),
        }
        .boxed_unsync(),
    );
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    if let Some(coding) = coding {
        response
            .headers_mut()
            .insert(CONTENT_ENCODING, HeaderValue::from_static(coding));
    }
    response
}

/// A compressor for one answer, by the coding's name.
enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Deflate(flate2::write::ZlibEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    fn new(name: &str) -> Option<Encoder> {
        let level = flate2::Compression::default();
        Some(match name {
            "gzip" => Encoder::Gzip(flate2::write::GzEncoder::new(Vec::new(), level)),
            "deflate" => Encoder::Deflate(flate2::write::ZlibEncoder::new(Vec::new(), level)),
            "br" => Encoder::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                5,
                22,
            ))),
            "zstd" => Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 3).ok()?),
            _ => return None,
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Encoder::Gzip(_) => "gzip",
            Encoder::Deflate(_) => "deflate",
            Encoder::Brotli(_) => "br",
            Encoder::Zstd(_) => "zstd",
        }
    }

    fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.get_mut(),
            Encoder::Deflate(e) => e.get_mut(),
            Encoder::Brotli(e) => e.get_mut(),
            Encoder::Zstd(e) => e.get_mut(),
        }
    }

    /// `bytes` compressed and flushed: what a streaming server sends for one event.
    fn flushed(&mut self, bytes: &[u8]) -> Bytes {
        let _ = match self {
            Encoder::Gzip(e) => e.write_all(bytes).and_then(|()| e.flush()),
            Encoder::Deflate(e) => e.write_all(bytes).and_then(|()| e.flush()),
            Encoder::Brotli(e) => e.write_all(bytes).and_then(|()| e.flush()),
            Encoder::Zstd(e) => e.write_all(bytes).and_then(|()| e.flush()),
        };
        Bytes::from(std::mem::take(self.output()))
    }

    /// The end of the compressed stream.
    fn finish(self) -> Vec<u8> {
        match self {
            Encoder::Gzip(e) => e.finish().unwrap_or_default(),
            Encoder::Deflate(e) => e.finish().unwrap_or_default(),
            Encoder::Brotli(e) => e.into_inner(),
            Encoder::Zstd(e) => e.finish().unwrap_or_default(),
        }
    }

    /// A 200 answering `answer` as JSON compressed, with its `Content-Encoding`.
    fn whole(mut self, answer: &Value) -> Response<DemoBody> {
        let name = self.name();
        let mut out = self.flushed(answer.to_string().as_bytes()).to_vec();
        out.extend_from_slice(&self.finish());
        let body = http_body_util::Full::new(Bytes::from(out))
            .map_err(|never| match never {})
            .boxed_unsync();
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(name));
        response
    }
}

/// A 400 as OpenAI words it.
fn invalid(message: &str) -> Response<DemoBody> {
    json_response(
        StatusCode::BAD_REQUEST,
        json!({"error": {"message": message, "type": "invalid_request_error"}}),
    )
}

/// An event stream sent one event per frame, yielding between them (so a proxy sees the
/// events arrive one by one, split across reads, as a real stream's do).
struct Events {
    frames: Vec<Bytes>,
    next: usize,
    waited: bool,
    /// Break off after the last frame instead of ending.
    cut: bool,
}

impl Body for Events {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        // Each frame waits a turn of the scheduler first: the connection writes what it has,
        // and the stream is not one write.
        if !this.waited {
            this.waited = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.waited = false;
        let Some(frame) = this.frames.get(this.next).cloned() else {
            if this.cut {
                return Poll::Ready(Some(Err("the stream was cut (x-demo-cut-after)".into())));
            }
            return Poll::Ready(None);
        };
        this.next += 1;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn text(response: Response<DemoBody>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_plain_completion_says_its_usage() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert(COMPLETION_HEADER, HeaderValue::from_static("40"));
        let body = br#"{"model": "m", "max_tokens": 25, "messages": [{"role": "user", "content": "one two three"}]}"#;
        let answer: Value = serde_json::from_str(&text(answer(&headers, body, 1)).await).unwrap();
        assert_eq!(answer["usage"]["prompt_tokens"], 3);
        assert_eq!(answer["usage"]["completion_tokens"], 25);
        assert_eq!(answer["usage"]["total_tokens"], 28);
        assert_eq!(answer["choices"][0]["finish_reason"], "length");
    }

    #[tokio::test]
    async fn a_stream_carries_its_usage_in_the_last_chunk_when_asked() {
        let body = br#"{"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "hi"}]}"#;
        let response = answer(&hyper::HeaderMap::new(), body, 2);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let text = text(response).await;
        let events: Vec<&str> = text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap())
            .collect();
        assert_eq!(events.last(), Some(&"[DONE]"));
        let last: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
        assert_eq!(last["usage"]["total_tokens"], 17);
        assert_eq!(last["choices"], json!([]));
        let without = br#"{"model": "m", "stream": true, "messages": []}"#;
        let text = super::tests::text(answer(&hyper::HeaderMap::new(), without, 3)).await;
        assert!(!text.contains("usage"));
    }
}
