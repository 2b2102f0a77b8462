//! The PROXY protocol (HAProxy's, v1 text and v2 binary) on the proxy's port: a layer-4 balancer
//! in `proxy_protocol.from` (AWS NLB, HAProxy `send-proxy`) opens each connection with a header
//! naming the client, and that address is the connection's peer from then on (the trusted-proxy
//! walk, `per: ip`, the access log). The header is read before TLS, bounded (at most
//! [`MAX_HEADER`] bytes) and timed (`timeouts.header_read`), with ppp parsing it. A peer in
//! `from` that sends no header or a malformed one, and any other peer that sends one, has its
//! connection closed unanswered: a header from an unlisted peer would let anyone name any
//! client.
//!
//! The header is found by peeking, and only its own bytes are then read off the socket, so what
//! follows (a TLS ClientHello, an HTTP request) reaches the server untouched.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use ppp::{HeaderResult, PartialResult};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The most bytes a PROXY header may take: v1's are at most 107; v2's 16 and the addresses
/// (216 for Unix sockets) and TLVs a balancer adds (AWS's VPC endpoint id, a few dozen).
pub(super) const MAX_HEADER: usize = 1024;

/// v2's signature, and v1's start.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
const V1_START: &[u8; 6] = b"PROXY ";
/// v1's longest header (its spec, §2.1).
const V1_MAX: usize = 107;

/// Why a connection is closed unanswered.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// A peer in `from` sent no PROXY header (or one that does not parse).
    Missing,
    Malformed(String),
    /// A peer not in `from` sent a PROXY header.
    Unlisted,
    /// Nothing conclusive within the timeout, or the connection ended first.
    Silent,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Missing => f.write_str("a peer in proxy_protocol.from sent no PROXY header"),
            Refused::Malformed(e) => write!(f, "a malformed PROXY header: {e}"),
            Refused::Unlisted => {
                f.write_str("a PROXY header from a peer not in proxy_protocol.from")
            }
            Refused::Silent => f.write_str("no PROXY header within timeouts.header_read"),
        }
    }
}

/// The connection's client as the PROXY protocol says it, for a connection from `peer` with
/// `from` the balancers that must send a header: the header's source address (the TCP peer for
/// a v2 `LOCAL` or a v1 `UNKNOWN`: a balancer's own health check), or the TCP peer when it is
/// not a balancer and sent none. Waits at most `timeout` for the bytes that decide it.
pub(super) async fn client(
    stream: &mut TcpStream,
    peer: SocketAddr,
    from: &[IpNet],
    timeout: Duration,
) -> Result<SocketAddr, Refused> {
    let listed = from
        .iter()
        .any(|net| net.contains(&peer.ip().to_canonical()));
    match tokio::time::timeout(timeout, read(stream, peer, listed)).await {
        Ok(result) => result,
        Err(_) => Err(Refused::Silent),
    }
}

async fn read(
    stream: &mut TcpStream,
    peer: SocketAddr,
    listed: bool,
) -> Result<SocketAddr, Refused> {
    let mut buf = [0u8; MAX_HEADER];
    let mut seen = 0;
    loop {
        let n = stream.peek(&mut buf).await.map_err(|_| Refused::Silent)?;
        if n == 0 {
            return Err(Refused::Silent);
        }
        match decide(&buf[..n], peer, listed) {
            Decided::Client(client, length) => {
                // Only the header's bytes come off the socket.
                let mut header = vec![0u8; length];
                stream
                    .read_exact(&mut header)
                    .await
                    .map_err(|_| Refused::Silent)?;
                return Ok(client);
            }
            Decided::Plain => return Ok(peer),
            Decided::Refused(why) => return Err(why),
            Decided::More if n == MAX_HEADER => {
                return Err(Refused::Malformed(format!(
                    "longer than {MAX_HEADER} bytes"
                )));
            }
            Decided::More => {
                // A peek returns what has arrived at once: with nothing new, wait a little
                // rather than spin (a header comes in one segment from every balancer known).
                if n == seen {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                seen = n;
            }
        }
    }
}

/// What the bytes a connection opened with say.
#[derive(Debug, PartialEq, Eq)]
enum Decided {
    /// A header naming this client, this many bytes long.
    Client(SocketAddr, usize),
    /// No header, from a peer that need not send one.
    Plain,
    Refused(Refused),
    /// Not enough bytes yet.
    More,
}

/// Decides on the bytes a connection from `peer` opened with (`listed`: a peer in `from`).
fn decide(bytes: &[u8], peer: SocketAddr, listed: bool) -> Decided {
    let starts = |signature: &[u8]| {
        let n = bytes.len().min(signature.len());
        bytes[..n] == signature[..n]
    };
    let maybe_header = starts(V2_SIGNATURE) || starts(V1_START);
    if !listed {
        return match maybe_header {
            // What could still be a header's start: wait for the bytes that say.
            true if bytes.len() < V1_START.len()
                || (starts(V2_SIGNATURE) && bytes.len() < V2_SIGNATURE.len()) =>
            {
                Decided::More
            }
            true => Decided::Refused(Refused::Unlisted),
            false => Decided::Plain,
        };
    }
    if !maybe_header {
        return Decided::Refused(Refused::Missing);
    }
    // v1 is one line of at most 107 bytes: complete at its CRLF (ppp calls a line that ends
    // early incomplete, which here it never becomes).
    let parsed = match bytes.starts_with(V1_START) {
        true => match bytes.windows(2).position(|w| w == b"\r\n") {
            Some(end) => HeaderResult::V1(ppp::v1::Header::try_from(&bytes[..end + 2])),
            None if bytes.len() >= V1_MAX => {
                return Decided::Refused(Refused::Malformed(format!(
                    "a v1 header with no CRLF within {V1_MAX} bytes"
                )));
            }
            None => return Decided::More,
        },
        false => HeaderResult::parse(bytes),
    };
    if let HeaderResult::V2(_) = &parsed
        && parsed.is_incomplete()
    {
        return Decided::More;
    }
    match parsed {
        HeaderResult::V1(Ok(header)) => {
            let client = match header.addresses {
                ppp::v1::Addresses::Tcp4(a) => {
                    SocketAddr::new(IpAddr::V4(a.source_address), a.source_port)
                }
                ppp::v1::Addresses::Tcp6(a) => {
                    SocketAddr::new(IpAddr::V6(a.source_address), a.source_port)
                }
                ppp::v1::Addresses::Unknown => peer,
            };
            Decided::Client(client, header.header.len())
        }
        HeaderResult::V2(Ok(header)) => {
            let client = match (header.command, header.addresses) {
                (ppp::v2::Command::Local, _) => peer,
                (_, ppp::v2::Addresses::IPv4(a)) => {
                    SocketAddr::new(IpAddr::V4(a.source_address), a.source_port)
                }
                (_, ppp::v2::Addresses::IPv6(a)) => {
                    SocketAddr::new(IpAddr::V6(a.source_address), a.source_port)
                }
                (_, ppp::v2::Addresses::Unspecified | ppp::v2::Addresses::Unix(_)) => peer,
            };
            Decided::Client(client, header.len())
        }
        HeaderResult::V1(Err(e)) => Decided::Refused(Refused::Malformed(e.to_string())),
        HeaderResult::V2(Err(e)) => Decided::Refused(Refused::Malformed(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "10.0.0.5:40000".parse().unwrap()
    }

    #[test]
    fn a_v1_header_names_the_client_and_its_length() {
        let header = b"PROXY TCP4 192.0.2.7 10.0.0.1 51000 443\r\nGET / HTTP/1.1\r\n";
        let length = b"PROXY TCP4 192.0.2.7 10.0.0.1 51000 443\r\n".len();
        assert_eq!(
            decide(header, peer(), true),
            Decided::Client("192.0.2.7:51000".parse().unwrap(), length)
        );
        let v6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 51000 443\r\n";
        assert_eq!(
            decide(v6, peer(), true),
            Decided::Client("[2001:db8::1]:51000".parse().unwrap(), v6.len())
        );
        // A balancer's own health check names no client: the balancer is the peer.
        let unknown = b"PROXY UNKNOWN\r\n";
        assert_eq!(
            decide(unknown, peer(), true),
            Decided::Client(peer(), unknown.len())
        );
        assert_eq!(decide(b"PROXY TCP4 192.0.2", peer(), true), Decided::More);
    }

    #[test]
    fn a_v2_header_names_the_client_and_local_is_the_balancer() {
        let addresses = ppp::v2::Addresses::IPv4(ppp::v2::IPv4::new(
            [192, 0, 2, 9],
            [10, 0, 0, 1],
            52000,
            443,
        ));
        let proxy = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Stream,
            addresses,
        )
        .build()
        .unwrap();
        let mut bytes = proxy.clone();
        bytes.extend_from_slice(b"\x16\x03\x01");
        assert_eq!(
            decide(&bytes, peer(), true),
            Decided::Client("192.0.2.9:52000".parse().unwrap(), proxy.len())
        );
        assert_eq!(decide(&proxy[..14], peer(), true), Decided::More);
        let local = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Local,
            ppp::v2::Protocol::Stream,
            addresses,
        )
        .build()
        .unwrap();
        assert_eq!(
            decide(&local, peer(), true),
            Decided::Client(peer(), local.len())
        );
    }

    #[test]
    fn a_listed_peer_must_send_one_and_another_may_not() {
        assert_eq!(
            decide(b"GET / HTTP/1.1\r\n", peer(), true),
            Decided::Refused(Refused::Missing)
        );
        assert!(matches!(
            decide(b"PROXY TCP4 nonsense here\r\n", peer(), true),
            Decided::Refused(Refused::Malformed(_))
        ));
        assert_eq!(decide(b"GET / HTTP/1.1\r\n", peer(), false), Decided::Plain);
        // HTTP/2's preface starts like nothing of PROXY's.
        assert_eq!(decide(b"PRI * HTTP/2.0\r\n", peer(), false), Decided::Plain);
        assert_eq!(
            decide(
                b"PROXY TCP4 192.0.2.7 10.0.0.1 51000 443\r\n",
                peer(),
                false
            ),
            Decided::Refused(Refused::Unlisted)
        );
        assert_eq!(decide(b"PRO", peer(), false), Decided::More);
        assert_eq!(
            decide(&V2_SIGNATURE[..12], peer(), false),
            Decided::Refused(Refused::Unlisted)
        );
    }
}
