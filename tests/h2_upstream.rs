//! What an HTTP/2 upstream sends cannot pass as a success when it is malformed, and its stream
//! limit is obeyed: a raw HTTP/2 server written here (frames by hand, HPACK by
//! `loona-hpack`) answers with request pseudo-headers in a response head and pseudo-headers in
//! trailers (RFC 9113 §8.1.1, §8.3), which `h2` alone would drop and relay as a 200 and
//! `grpc-status: 0`; and a real `h2` server that allows one stream per connection takes 20
//! clients at once through floodgate with none refused.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::config::{Config, Route};
use common::{Floodgate, client, get, grpc_calls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HEADERS: u8 = 0x1;
const DATA: u8 = 0x0;
const SETTINGS: u8 = 0x4;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// What the raw upstream answers each request with: the fields of its head, its body, and the
/// fields of its trailers (none: the body ends the stream).
#[derive(Clone, Copy)]
struct Answer {
    head: &'static [(&'static str, &'static str)],
    body: &'static [u8],
    trailers: Option<&'static [(&'static str, &'static str)]>,
}

/// A raw HTTP/2 server on 127.0.0.1:0 that answers every request with `answer`, encoding its
/// header blocks itself (so nothing stops a malformed one).
async fn raw_upstream(answer: Answer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, answer));
        }
    });
    format!("http://{addr}")
}

async fn serve(mut stream: TcpStream, answer: Answer) {
    let mut preface = [0u8; 24];
    if stream.read_exact(&mut preface).await.is_err() {
        return;
    }
    let _ = stream.write_all(&frame(SETTINGS, 0, 0, &[])).await;
    let mut encoder = loona_hpack::Encoder::new();
    let encode = |encoder: &mut loona_hpack::Encoder, fields: &[(&str, &str)]| {
        encoder.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    };
    loop {
        let mut head = [0u8; 9];
        if stream.read_exact(&mut head).await.is_err() {
            return;
        }
        let length =
            (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; length];
        if stream.read_exact(&mut payload).await.is_err() {
            return;
        }
        let (kind, flags) = (head[3], head[4]);
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match kind {
            SETTINGS if flags & ACK == 0 => {
                let _ = stream.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
            }
            // A request's head: answered at once (its body, if any, is ignored).
            HEADERS => {
                let mut out = Vec::new();
                let ends_with_head = answer.body.is_empty() && answer.trailers.is_none();
                let flags = END_HEADERS | if ends_with_head { END_STREAM } else { 0 };
                out.extend(frame(
                    HEADERS,
                    flags,
                    id,
                    &encode(&mut encoder, answer.head),
                ));
                if !answer.body.is_empty() {
                    let end = if answer.trailers.is_none() {
                        END_STREAM
                    } else {
                        0
                    };
                    out.extend(frame(DATA, end, id, answer.body));
                }
                if let Some(trailers) = answer.trailers {
                    out.extend(frame(
                        HEADERS,
                        END_HEADERS | END_STREAM,
                        id,
                        &encode(&mut encoder, trailers),
                    ));
                }
                if stream.write_all(&out).await.is_err() {
                    return;
                }
            }
            _ => {}
        }
    }
}

fn floodgate(upstream: &str, prefix: &str) -> Floodgate {
    let route = Route::new("h2", prefix, upstream).with("upstream_protocol", "http2");
    Floodgate::start(&Config::new().route(route).yaml())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_with_a_request_pseudo_header_is_a_502() {
    // The control first: the same server, well-formed, is relayed.
    let good = raw_upstream(Answer {
        head: &[(":status", "200"), ("content-type", "text/plain")],
        body: b"fine",
        trailers: None,
    })
    .await;
    let fg = floodgate(&good, "/");
    let reply = get(&client(), &fg.url("/x"), &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "fine");

    for head in [
        &[
            (":status", "200"),
            (":path", "/elsewhere"),
            ("content-type", "text/plain"),
        ][..],
        &[(":status", "200"), (":method", "GET")][..],
        &[(":status", "200"), (":authority", "evil.example")][..],
    ] {
        let bad = raw_upstream(Answer {
            head,
            body: b"should not pass",
            trailers: None,
        })
        .await;
        let fg = floodgate(&bad, "/");
        let reply = get(&client(), &fg.url("/x"), &[]).await;
        assert_eq!(reply.status, 502, "{head:?}: {}", reply.body);
        assert!(!reply.body.contains("should not pass"));
    }
}

/// gRPC's status 0 in trailers that also hold a pseudo-header is no success: the call fails
/// (the stream is reset: grpcio reports INTERNAL), for `:path` and for `:status`; a malformed
/// head is floodgate's 502, which a gRPC client hears as UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_with_a_pseudo_header_never_end_a_call_as_a_success() {
    const HEAD: &[(&str, &str)] = &[(":status", "200"), ("content-type", "application/grpc")];
    // One gRPC message: uncompressed, 5 bytes.
    const MESSAGE: &[u8] = b"\x00\x00\x00\x00\x05hello";
    let control = raw_upstream(Answer {
        head: HEAD,
        body: MESSAGE,
        trailers: Some(&[("grpc-status", "0")]),
    })
    .await;
    let fg = floodgate(&control, "/floodgate.test.Echo/");
    let call = grpc_calls(&fg.addr().to_string(), &["unary"], &[]).remove(0);
    assert_eq!(call["code"], "OK", "the control: {call}");

    // A head with a request pseudo-header: floodgate's 502, in gRPC's words.
    let bad_head = raw_upstream(Answer {
        head: &[
            (":status", "200"),
            (":path", "/x"),
            ("content-type", "application/grpc"),
        ],
        body: MESSAGE,
        trailers: Some(&[("grpc-status", "0")]),
    })
    .await;
    let fg = floodgate(&bad_head, "/floodgate.test.Echo/");
    let call = grpc_calls(&fg.addr().to_string(), &["unary"], &[]).remove(0);
    assert_eq!(call["code"], "UNAVAILABLE", "{call}");

    for trailers in [
        &[("grpc-status", "0"), (":path", "/x")][..],
        &[(":status", "200"), ("grpc-status", "0")][..],
    ] {
        let bad = raw_upstream(Answer {
            head: HEAD,
            body: MESSAGE,
            trailers: Some(trailers),
        })
        .await;
        let fg = floodgate(&bad, "/floodgate.test.Echo/");
        let call = grpc_calls(&fg.addr().to_string(), &["unary"], &[]).remove(0);
        let code = call["code"].as_str().unwrap_or("?");
        assert!(
            ["INTERNAL", "UNAVAILABLE"].contains(&code),
            "{trailers:?}: {call}"
        );
    }
}

/// A real `h2` server that takes one stream per connection and answers after 200 ms: 20
/// clients at once through floodgate all get their answer (before: streams opened over the
/// limit were refused until the retries ran out, 6 of 20 got a 502).
///
/// That no stream goes out over the limit at all (none refused, none sent again) is checked
/// where the pool can count it, in `upstream/conn/http2.rs`'s tests; here, that clients beyond the
/// limit are queued.
///
/// Timing: 20 answers of 200 ms over at most 16 connections of one stream each take two
/// rounds, well within the 30 s upstream timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_allowing_one_stream_per_connection_is_queued_not_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::Builder::new()
                    .max_concurrent_streams(1)
                    .handshake::<_, Bytes>(tcp)
                    .await
                else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = conn.accept().await {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let response = http::Response::new(());
                        if let Ok(mut send) = respond.send_response(response, false) {
                            let _ = send.send_data(Bytes::from_static(b"answered"), true);
                        }
                    });
                }
            });
        }
    });
    let fg = floodgate(&format!("http://{addr}"), "/");
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let url = fg.url(&format!("/q{i}"));
            tokio::spawn(async move { get(&client(), &url, &[]).await })
        })
        .collect();
    for call in calls {
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body, "answered");
    }
}
