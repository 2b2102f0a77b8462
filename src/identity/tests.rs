//! Unit tests for identity: the contract's order (API key, user id from trusted peers, client
//! IP), and the `X-Forwarded-For` walk over a matrix of peers and headers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;
use proptest::prelude::*;

use super::*;

const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const OUTSIDER: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7));

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test IP")
}

/// An identity config with the default header names and these trusted ranges.
fn trusting(nets: &[&str]) -> IdentityConfig {
    IdentityConfig {
        api_key_header: HeaderName::from_static("x-api-key"),
        user_id_header: HeaderName::from_static("x-user-id"),
        trusted_proxies: nets
            .iter()
            .map(|n| n.parse::<IpNet>().expect("test CIDR"))
            .collect(),
        // Whole addresses, so the walk's answers are the addresses themselves.
        ipv6_prefix: 128,
        strip_untrusted_user_id: true,
        jwt: None,
        client_ip_header: None,
        forwarded: false,
        client_cert: false,
    }
}

/// A header map; a name given twice becomes two header lines.
fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).expect("test header"));
    }
    map
}

fn client_ip_of(config: &IdentityConfig, peer: IpAddr, xff: &[&str]) -> Identity<'static> {
    let pairs: Vec<_> = xff.iter().map(|v| ("x-forwarded-for", *v)).collect();
    // Only the IP variant is expected here, and it borrows nothing from the headers.
    match config.identify(&headers(&pairs), peer).expect("identify") {
        Identity::Ip(ip) => Identity::Ip(ip),
        other => panic!("expected an IP identity, got {other:?}"),
    }
}

#[test]
fn an_untrusted_peer_is_its_own_identity_whatever_it_forwards() {
    let config = trusting(&["10.0.0.0/8"]);
    assert_eq!(
        client_ip_of(&config, OUTSIDER, &["203.0.113.9"]),
        Identity::Ip(OUTSIDER)
    );
    assert_eq!(
        client_ip_of(&trusting(&[]), PEER, &["6.6.6.6, 203.0.113.9"]),
        Identity::Ip(PEER)
    );
}

#[test]
fn a_trusted_peer_is_replaced_by_the_rightmost_forwarded_entry() {
    let config = trusting(&["10.0.0.1/32"]);
    assert_eq!(
        client_ip_of(&config, PEER, &["6.6.6.6, 203.0.113.9"]),
        Identity::Ip(ip("203.0.113.9"))
    );
}

#[test]
fn trusted_entries_are_skipped_walking_right_to_left() {
    let config = trusting(&["10.0.0.0/8"]);
    assert_eq!(
        client_ip_of(&config, PEER, &["6.6.6.6, 203.0.113.9, 10.0.0.2"]),
        Identity::Ip(ip("203.0.113.9"))
    );
}

#[test]
fn forwarded_for_split_over_several_lines_is_one_list_in_order() {
    let config = trusting(&["10.0.0.0/8"]);
    assert_eq!(
        client_ip_of(&config, PEER, &["6.6.6.6, 203.0.113.9", "10.0.0.2"]),
        Identity::Ip(ip("203.0.113.9"))
    );
    assert_eq!(
        client_ip_of(&config, PEER, &["203.0.113.9", "10.0.0.3, 10.0.0.2"]),
        Identity::Ip(ip("203.0.113.9"))
    );
    // The last line holds the nearest hop: its untrusted entry wins over earlier lines.
    assert_eq!(
        client_ip_of(&config, PEER, &["6.6.6.6", "203.0.113.9"]),
        Identity::Ip(ip("203.0.113.9"))
    );
}

#[test]
fn when_every_entry_is_trusted_the_leftmost_is_the_client() {
    let config = trusting(&["10.0.0.0/8"]);
    assert_eq!(
        client_ip_of(&config, PEER, &["10.0.0.5, 10.0.0.4, 10.0.0.3"]),
        Identity::Ip(ip("10.0.0.5"))
    );
}

#[test]
fn a_trusted_peer_without_forwarded_for_is_the_client() {
    let config = trusting(&["10.0.0.0/8"]);
    assert_eq!(client_ip_of(&config, PEER, &[]), Identity::Ip(PEER));
}

#[test]
fn a_malformed_entry_on_the_walk_falls_back_to_the_peer() {
    let config = trusting(&["10.0.0.0/8"]);
    for xff in [
        "unknown",
        "1.2.3.4:5678",
        "garbage",
        "",
        "203.0.113.9,",
        "203.0.113.9, unknown",
        "203.0.113.9, 10.0.0.2, not-an-ip",
        "[2001:db8::1]",
        "203.0.113.9 10.0.0.2",
    ] {
        assert_eq!(
            client_ip_of(&config, PEER, &[xff]),
            Identity::Ip(PEER),
            "{xff:?}"
        );
    }
}

#[test]
fn the_walk_stops_at_the_first_untrusted_entry_before_any_malformed_one() {
    let config = trusting(&["10.0.0.0/8"]);
    assert_eq!(
        client_ip_of(&config, PEER, &["unknown, 203.0.113.9, 10.0.0.2"]),
        Identity::Ip(ip("203.0.113.9"))
    );
}

#[test]
fn entries_are_trimmed_of_whitespace() {
    let config = trusting(&["10.0.0.0/8"]);
    assert_eq!(
        client_ip_of(&config, PEER, &["  203.0.113.9  ,\t10.0.0.2 "]),
        Identity::Ip(ip("203.0.113.9"))
    );
}

#[test]
fn a_header_too_long_to_walk_is_not_believed() {
    let config = trusting(&["10.0.0.0/8"]);
    let all_trusted: Vec<String> = (0..40).map(|n| format!("10.0.1.{n}")).collect();
    let xff = all_trusted.join(", ");
    assert_eq!(client_ip_of(&config, PEER, &[&xff]), Identity::Ip(PEER));
}

#[test]
fn ipv6_peers_and_entries_are_walked_like_ipv4() {
    let config = trusting(&["fd00::/8"]);
    let peer = ip("fd00::1");
    assert_eq!(
        client_ip_of(&config, peer, &["2001:db8::1, fd00::2"]),
        Identity::Ip(ip("2001:db8::1"))
    );
    let untrusted_v6 = ip("2001:db8::99");
    assert_eq!(
        client_ip_of(&config, untrusted_v6, &["2001:db8::1"]),
        Identity::Ip(untrusted_v6)
    );
}

#[test]
fn ipv4_mapped_peers_count_as_their_ipv4_address() {
    // A dual-stack listener reports IPv4 clients as ::ffff:a.b.c.d.
    let config = trusting(&["10.0.0.0/8"]);
    let mapped_trusted = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
    assert_eq!(
        client_ip_of(&config, mapped_trusted, &["203.0.113.9"]),
        Identity::Ip(ip("203.0.113.9"))
    );
    let mapped_outsider = IpAddr::V6(Ipv4Addr::new(198, 51, 100, 7).to_ipv6_mapped());
    assert_eq!(
        client_ip_of(&config, mapped_outsider, &["203.0.113.9"]),
        Identity::Ip(OUTSIDER),
        "one client, one budget, whichever way its address is written"
    );
    // An IPv4-mapped entry in the header is its IPv4 address too.
    assert_eq!(
        client_ip_of(&config, PEER, &["::ffff:203.0.113.9"]),
        Identity::Ip(ip("203.0.113.9"))
    );
}

#[test]
fn the_api_key_wins_over_user_id_and_forwarded_for() {
    let config = trusting(&["10.0.0.0/8"]);
    let map = headers(&[
        ("x-api-key", "secret"),
        ("x-user-id", "alice"),
        ("x-forwarded-for", "203.0.113.9"),
    ]);
    assert_eq!(config.identify(&map, PEER), Ok(Identity::ApiKey(b"secret")));
    // An API key counts from any peer: it is not a claim about the network path.
    assert_eq!(
        config.identify(&map, OUTSIDER),
        Ok(Identity::ApiKey(b"secret"))
    );
}

#[test]
fn an_empty_or_blank_api_key_falls_through() {
    let config = trusting(&["10.0.0.0/8"]);
    for blank in ["", "   ", "\t"] {
        let map = headers(&[("x-api-key", blank), ("x-user-id", "alice")]);
        assert_eq!(
            config.identify(&map, PEER),
            Ok(Identity::UserId(b"alice")),
            "{blank:?}"
        );
        let map = headers(&[("x-api-key", blank)]);
        assert_eq!(config.identify(&map, OUTSIDER), Ok(Identity::Ip(OUTSIDER)));
    }
}

#[test]
fn the_api_key_is_trimmed() {
    let config = trusting(&[]);
    let map = headers(&[("x-api-key", "  secret ")]);
    assert_eq!(
        config.identify(&map, OUTSIDER),
        Ok(Identity::ApiKey(b"secret"))
    );
}

#[test]
fn the_user_id_is_believed_only_from_a_trusted_peer() {
    let config = trusting(&["10.0.0.0/8"]);
    let map = headers(&[("x-user-id", "alice"), ("x-forwarded-for", "203.0.113.9")]);
    assert_eq!(config.identify(&map, PEER), Ok(Identity::UserId(b"alice")));
    assert_eq!(config.identify(&map, OUTSIDER), Ok(Identity::Ip(OUTSIDER)));
    let blank = headers(&[("x-user-id", " "), ("x-forwarded-for", "203.0.113.9")]);
    assert_eq!(
        config.identify(&blank, PEER),
        Ok(Identity::Ip(ip("203.0.113.9")))
    );
}

#[test]
fn conflicting_repeated_identity_headers_are_an_error() {
    let config = trusting(&["10.0.0.0/8"]);
    let keys = headers(&[("x-api-key", "a"), ("x-api-key", "b")]);
    assert_eq!(
        config.identify(&keys, OUTSIDER),
        Err(IdentityError::Conflicting(HeaderName::from_static(
            "x-api-key"
        )))
    );
    let same = headers(&[("x-api-key", "a"), ("x-api-key", " a")]);
    assert_eq!(config.identify(&same, OUTSIDER), Ok(Identity::ApiKey(b"a")));

    let users = headers(&[("x-user-id", "alice"), ("x-user-id", "bob")]);
    assert!(config.identify(&users, PEER).is_err());
    // From an untrusted peer the user id is never read, so its conflict does not matter.
    assert_eq!(
        config.identify(&users, OUTSIDER),
        Ok(Identity::Ip(OUTSIDER))
    );
}

#[test]
fn custom_header_names_are_used() {
    let config = IdentityConfig {
        api_key_header: HeaderName::from_static("authorization"),
        user_id_header: HeaderName::from_static("x-account"),
        trusted_proxies: vec!["10.0.0.0/8".parse().expect("CIDR")],
        ipv6_prefix: 128,
        strip_untrusted_user_id: true,
        jwt: None,
        client_ip_header: None,
        forwarded: false,
        client_cert: false,
    };
    let map = headers(&[("x-api-key", "ignored"), ("x-account", "acct-1")]);
    assert_eq!(config.identify(&map, PEER), Ok(Identity::UserId(b"acct-1")));
}

#[test]
fn kinds_and_key_bytes_tell_identities_apart() {
    assert_eq!(Identity::ApiKey(b"k").kind().as_str(), "api_key");
    assert_eq!(Identity::UserId(b"u").kind().as_str(), "user_id");
    assert_eq!(Identity::Ip(PEER).kind().as_str(), "ip");

    let mut buf = [0u8; 16];
    assert_eq!(Identity::Ip(PEER).key_bytes(&mut buf), &[10, 0, 0, 1]);
    let v6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    assert_eq!(
        Identity::Ip(IpAddr::V6(v6)).key_bytes(&mut buf),
        &v6.octets()
    );
    assert_eq!(Identity::UserId(b"alice").key_bytes(&mut buf), b"alice");
}

proptest! {
    /// Nothing an untrusted client writes in `X-Forwarded-For` or the user id header moves it off
    /// its own address.
    #[test]
    fn untrusted_peers_cannot_choose_their_identity(
        xff in "[ -~]{0,60}",
        user in "[!-~]{1,20}",
        octets in any::<[u8; 4]>(),
    ) {
        let config = trusting(&["10.0.0.0/8"]);
        let peer = IpAddr::V4(Ipv4Addr::from(octets));
        prop_assume!(!config.is_trusted(peer));
        let map = headers(&[("x-forwarded-for", xff.as_str()), ("x-user-id", user.as_str())]);
        prop_assert_eq!(config.identify(&map, peer), Ok(Identity::Ip(peer)));
    }

    /// Behind trusted proxies, the client is the last untrusted entry however many trusted hops
    /// follow it.
    #[test]
    fn the_rightmost_untrusted_entry_is_the_client(
        clients in proptest::collection::vec(any::<[u8; 4]>(), 1..5),
        hops in proptest::collection::vec(any::<[u8; 3]>(), 0..5),
    ) {
        let config = trusting(&["10.0.0.0/8"]);
        let clients: Vec<IpAddr> = clients
            .into_iter()
            .map(|o| IpAddr::V4(Ipv4Addr::from(o)))
            .filter(|ip| !config.is_trusted(*ip))
            .collect();
        prop_assume!(!clients.is_empty());
        let mut entries: Vec<String> = clients.iter().map(ToString::to_string).collect();
        entries.extend(hops.iter().map(|[a, b, c]| format!("10.{a}.{b}.{c}")));
        let map = headers(&[("x-forwarded-for", entries.join(", ").as_str())]);
        prop_assert_eq!(
            config.identify(&map, PEER),
            Ok(Identity::Ip(*clients.last().expect("non-empty")))
        );
    }
}

#[test]
fn a_hundred_thousand_consumers_are_found_by_one_hash_lookup() {
    use sha2::Digest;
    let mut consumers = Consumers::new(UnknownKey::Reject);
    for n in 0..100_000 {
        let index = consumers.add(Consumer {
            name: format!("c{n}"),
            tier: DEFAULT_TIER.to_string(),
        });
        let digest: [u8; 32] = sha2::Sha256::digest(format!("key-{n}")).into();
        consumers.add_key(digest, index).unwrap();
    }
    assert_eq!(
        consumers.find(b"key-99999").map(|c| c.name.as_str()),
        Some("c99999")
    );
    assert_eq!(
        consumers.find(b"key-0").map(|c| c.name.as_str()),
        Some("c0")
    );
    assert!(consumers.find(b"key-100000").is_none());
    assert_eq!(
        consumers.resolve(Identity::ApiKey(b"nope")),
        Err(IdentityError::UnknownKey)
    );
    let anonymous = Consumers::new(UnknownKey::Anonymous);
    assert_eq!(anonymous.resolve(Identity::ApiKey(b"nope")), Ok(None));
}

#[test]
fn ipv6_clients_share_a_budget_per_prefix() {
    let mut config = trusting(&[]);
    config.ipv6_prefix = 64;
    let a = config.client_addr(&HeaderMap::new(), ip("2001:db8:1:2:aaaa::1"));
    let b = config.client_addr(&HeaderMap::new(), ip("2001:db8:1:2:bbbb::9"));
    let other = config.client_addr(&HeaderMap::new(), ip("2001:db8:1:3::1"));
    assert_eq!(a, ip("2001:db8:1:2::"));
    assert_eq!(a, b, "one /64, one budget");
    assert_ne!(a, other);
    // IPv4 (and IPv4-mapped IPv6) addresses are whole.
    assert_eq!(
        config.client_addr(&HeaderMap::new(), ip("::ffff:203.0.113.7")),
        ip("203.0.113.7")
    );
}

#[test]
fn a_client_ip_header_is_believed_from_a_trusted_peer_only_and_wins_over_forwarded() {
    let mut config = trusting(&["10.0.0.0/8"]);
    config.client_ip_header = Some(HeaderName::from_static("cf-connecting-ip"));
    config.forwarded = true;
    let trusted = ip("10.0.0.2");
    let map = headers(&[
        ("cf-connecting-ip", "198.51.100.4"),
        ("forwarded", "for=192.0.2.60"),
        ("x-forwarded-for", "192.0.2.99"),
    ]);
    assert_eq!(config.client_addr(&map, trusted), ip("198.51.100.4"));
    // From an untrusted peer, nothing it says is believed.
    assert_eq!(
        config.client_addr(&map, ip("203.0.113.9")),
        ip("203.0.113.9")
    );
    // Malformed, or two different values: the peer.
    let bad = headers(&[("cf-connecting-ip", "not-an-ip")]);
    assert_eq!(config.client_addr(&bad, trusted), trusted);
    let two = headers(&[
        ("cf-connecting-ip", "198.51.100.4"),
        ("cf-connecting-ip", "198.51.100.5"),
    ]);
    assert_eq!(config.client_addr(&two, trusted), trusted);
    // Without it, `Forwarded` is walked.
    let forwarded = headers(&[
        ("forwarded", "for=192.0.2.60"),
        ("x-forwarded-for", "192.0.2.99"),
    ]);
    assert_eq!(config.client_addr(&forwarded, trusted), ip("192.0.2.60"));
}

#[test]
fn forwarded_is_walked_right_to_left_past_trusted_proxies() {
    let mut config = trusting(&["10.0.0.0/8", "2001:db8:cafe::/48"]);
    config.forwarded = true;
    let trusted = ip("10.0.0.2");
    let map = headers(&[(
        "forwarded",
        "for=192.0.2.43;proto=https, For=\"[2001:db8:cafe::17]:4711\";by=10.0.0.1",
    )]);
    assert_eq!(config.client_addr(&map, trusted), ip("192.0.2.43"));
    let with_port = headers(&[("forwarded", "for=\"198.51.100.17:8080\", for=10.0.0.7")]);
    assert_eq!(config.client_addr(&with_port, trusted), ip("198.51.100.17"));
    // Two lines are one list, in order.
    let lines = headers(&[
        ("forwarded", "for=198.51.100.1"),
        ("forwarded", "for=10.0.0.9"),
    ]);
    assert_eq!(config.client_addr(&lines, trusted), ip("198.51.100.1"));
    // An element naming no address cannot be believed: the peer.
    let hidden = headers(&[("forwarded", "for=198.51.100.1, for=_hidden")]);
    assert_eq!(config.client_addr(&hidden, trusted), trusted);
    let unknown = headers(&[("forwarded", "for=unknown")]);
    assert_eq!(config.client_addr(&unknown, trusted), trusted);
    let no_for = headers(&[("forwarded", "proto=https")]);
    assert_eq!(config.client_addr(&no_for, trusted), trusted);
    // Off (the default), `Forwarded` is not read.
    config.forwarded = false;
    assert_eq!(config.client_addr(&map, trusted), trusted);
}
