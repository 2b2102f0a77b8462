//! The PROXY protocol end to end: HAProxy (Debian's) in front of floodgate in TCP mode, sending
//! `send-proxy-v2` on one port and `send-proxy` (v1) on another, clients connecting from
//! several 127.0.0.x addresses. Each original client keeps its own `per: ip` budget; a listed
//! peer that sends no header, and an unlisted one that sends one, are closed unanswered.

mod common;

use std::net::{IpAddr, SocketAddr};

use common::config::{Config, Limit, Route};
use common::{Floodgate, FrontProxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// floodgate trusting the PROXY protocol from 127.0.0.1 (HAProxy's source address), one route
/// with a bucket of two per client address.
fn behind_a_balancer(upstream: &Upstream) -> Floodgate {
    let yaml = Config::new()
        .with("proxy_protocol", "{from: [127.0.0.1/32]}")
        .route(
            Route::new("api", "/", &upstream.url()).limit(Limit::token_bucket(2, 0.001).per("ip")),
        )
        .yaml();
    Floodgate::start(&yaml)
}

/// HAProxy in TCP mode: `{PORT}` sends v2, the next port v1, both to floodgate at `to`.
fn haproxy(to: SocketAddr, v1_port: u16) -> FrontProxy {
    FrontProxy::haproxy(&format!(
        "frontend v2\n  mode tcp\n  bind 127.0.0.1:{{PORT}}\n  default_backend fg_v2\n\
         frontend v1\n  mode tcp\n  bind 127.0.0.1:{v1_port}\n  default_backend fg_v1\n\
         backend fg_v2\n  mode tcp\n  server fg {to} send-proxy-v2\n\
         backend fg_v1\n  mode tcp\n  server fg {to} send-proxy\n"
    ))
}

/// The statuses of `n` GETs to `url` from the source address `from`.
async fn statuses_from(from: [u8; 4], url: &str, n: usize) -> Vec<u16> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .local_address(IpAddr::from(from))
        .build()
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(client.get(url).send().await.unwrap().status().as_u16());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_behind_haproxy_keeps_its_own_budget_over_v1_and_v2() {
    let upstream = Upstream::start().await;
    let fg = behind_a_balancer(&upstream);
    let v1_port = common::free_port();
    let lb = haproxy(fg.addr(), v1_port);
    let v2 = lb.url("/");
    let v1 = format!("http://127.0.0.1:{v1_port}/");
    // Every connection reaches floodgate from 127.0.0.1: without the header they would share one
    // budget of two. With it, each original client has its own, whichever version carried it.
    assert_eq!(statuses_from([127, 0, 0, 2], &v2, 3).await, [200, 200, 429]);
    assert_eq!(statuses_from([127, 0, 0, 3], &v2, 2).await, [200, 200]);
    assert_eq!(statuses_from([127, 0, 0, 4], &v1, 3).await, [200, 200, 429]);
    // The same client through the other version spends the same budget.
    assert_eq!(statuses_from([127, 0, 0, 3], &v1, 1).await, [429]);
    // The upstream is told the original client too.
    let told: Vec<String> = upstream
        .seen()
        .iter()
        .filter_map(|s| s.header("x-forwarded-for").map(str::to_string))
        .collect();
    assert!(told.iter().any(|v| v.ends_with("127.0.0.2")), "{told:?}");
    assert!(told.iter().any(|v| v.ends_with("127.0.0.4")), "{told:?}");
    assert!(told.iter().all(|v| !v.ends_with("127.0.0.1")), "{told:?}");
}

/// What a connection from `from` to `to` that writes `bytes` reads back before it closes.
async fn exchange_from(from: [u8; 4], to: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    let mut stream = socket.connect(to).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    // Closed unanswered: the read ends with nothing (or a reset).
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut out),
    )
    .await
    .expect("floodgate neither answered nor closed");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_peer_without_a_header_and_an_unlisted_one_with_one_are_closed_unanswered() {
    let upstream = Upstream::start().await;
    let fg = behind_a_balancer(&upstream);
    let plain = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    // 127.0.0.1 is the balancer: a request without the header is not served.
    assert_eq!(exchange_from([127, 0, 0, 1], fg.addr(), plain).await, b"");
    // A malformed header from it neither.
    let malformed = [
        b"PROXY TCP4 not-an-address 10.0.0.1 1 2\r\n".as_slice(),
        plain,
    ]
    .concat();
    assert_eq!(
        exchange_from([127, 0, 0, 1], fg.addr(), &malformed).await,
        b""
    );
    // Anyone else naming a client of its choosing is refused.
    let forged = [
        b"PROXY TCP4 192.0.2.1 127.0.0.1 5000 80\r\n".as_slice(),
        plain,
    ]
    .concat();
    assert_eq!(exchange_from([127, 0, 0, 9], fg.addr(), &forged).await, b"");
    // ... but its plain requests are served, as its own address.
    let answer = String::from_utf8(exchange_from([127, 0, 0, 9], fg.addr(), plain).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // And the balancer's header is believed.
    let carried = [
        b"PROXY TCP4 192.0.2.1 127.0.0.1 5000 80\r\n".as_slice(),
        plain,
    ]
    .concat();
    let answer =
        String::from_utf8(exchange_from([127, 0, 0, 1], fg.addr(), &carried).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(upstream.count(), 2);
    let last = upstream.seen().pop().unwrap();
    assert!(
        last.header("x-forwarded-for")
            .unwrap()
            .ends_with("192.0.2.1"),
        "{:?}",
        last.headers
    );
}
