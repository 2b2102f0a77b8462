//! Replay on logs whose right answer is known by construction.

use std::net::IpAddr;

use http::Method;

use super::parse::{parse_json, parse_json_general};
use super::time::parse_time_local;
use super::*;

/// 2026-11-22T00:00:00Z, in µs.
const T0: u64 = 1_795_305_600_000_000;

fn config(limits: &str, extra: &str) -> Config {
    Config::from_yaml(&format!(
        "listen: 127.0.0.1:0
{extra}
routes:
  - name: api
    path_prefix: /api
    upstream: http://127.0.0.1:9000
    limits:
{limits}"
    ))
    .expect("config")
}

/// A floodgate JSON access-log line for a request decided at `at_us`.
fn json_line(at_us: u64, ip: &str, key_sha256: Option<&str>, decision: &str) -> String {
    let secs = at_us / 1_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // 2026-11-22 is day 20779 since the epoch; the tests stay within a few days of it.
    let day = 22 + (days - 20_779);
    let identity = match key_sha256 {
        Some(hash) => format!(r#""identity":"api_key","identity_hash":"{hash}","#),
        None => r#""identity":"ip","#.to_string(),
    };
    format!(
        r#"{{"timestamp":"2026-11-{day:02}T{:02}:{:02}:{:02}.{:06}Z","level":"INFO","fields":{{"message":"request done","route":"api","status":200}},"target":"floodgate::access","span":{{"client_ip":"{ip}","decision":"{decision}",{identity}"latency_ms":0.0,"method":"GET","path":"/api/x","route":"api","status":200,"name":"request"}}}}"#,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        at_us % 1_000_000
    )
}

/// An nginx combined line at whole second `secs` (UTC).
fn combined_line(secs: u64, ip: &str, path: &str) -> String {
    let rem = secs % 86_400;
    let day = 22 + (secs / 86_400 - 20_779);
    format!(
        r#"{ip} - - [{day:02}/Nov/2026:{:02}:{:02}:{:02} +0000] "GET {path}?q=1 HTTP/1.1" 200 612 "-" "curl/8.0""#,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn replay(config: Config, lines: &[String]) -> Report {
    let mut replay = Replay::new(config);
    replay
        .read("test.log", lines.join("\n").as_bytes())
        .expect("read");
    replay.finish()
}

const BUCKET_20_AT_10: &str = "      - {algorithm: token_bucket, capacity: 20, refill_rate: 10}\n";

/// 1000 requests from one IP over 10 s against a bucket of 20 refilled at 10/s admit 20 at once
/// and then one per refill: 20 + 10 × 10 = 120, give or take the one refill that lands exactly
/// on the last request's instant (the refills happen at 0.1 s, 0.2 s ... and the last request
/// is at 9.99 s, so here 20 + 99 = 119).
#[test]
fn a_known_answer_from_the_json_log() {
    let lines: Vec<String> = (0..1000)
        .map(|i| json_line(T0 + i * 10_000, "203.0.113.7", None, "allowed"))
        .collect();
    let report = replay(config(BUCKET_20_AT_10, ""), &lines);
    let r = &report.routes[0];
    assert_eq!(r.requests, 1000);
    assert!((119..=121).contains(&r.allowed), "{}", r.allowed);
    assert_eq!(r.allowed, 119);
    assert_eq!(r.denied, 1000 - r.allowed);
    assert_eq!(r.limits[0].denied, r.denied);
    assert_eq!(r.top_denied, vec![("ip:203.0.113.7".to_string(), r.denied)]);
    assert_eq!(report.malformed_total, 0);
}

/// The same traffic as nginx logs it: whole seconds, 100 lines each, spread evenly over their
/// second (10 ms apart), so the answer is the same.
#[test]
fn the_same_answer_from_an_nginx_combined_log() {
    let lines: Vec<String> = (0..1000)
        .map(|i| combined_line(T0 / 1_000_000 + i / 100, "203.0.113.7", "/api/x"))
        .collect();
    let report = replay(config(BUCKET_20_AT_10, ""), &lines);
    let r = &report.routes[0];
    assert_eq!(r.requests, 1000);
    assert_eq!(r.allowed, 119);
    assert_eq!(report.first_us, Some(T0));
    assert_eq!(report.last_us, Some(T0 + 9_990_000));
}

#[test]
fn malformed_lines_are_counted_and_named_and_the_rest_replayed() {
    let mut lines: Vec<String> = (0..30)
        .map(|i| json_line(T0 + i * 1000, "203.0.113.7", None, "allowed"))
        .collect();
    lines.insert(3, "this is not a log line".to_string());
    lines.insert(10, r#"{"timestamp":"yesterday","span":{}}"#.to_string());
    lines.insert(
        20,
        r#"203.0.113.9 - - [32/Nov/2026:00:00:00 +0000] "GET /api HTTP/1.1" 200 1 "-" "-""#
            .to_string(),
    );
    lines.insert(25, String::new());
    let report = replay(config(BUCKET_20_AT_10, ""), &lines);
    assert_eq!(report.malformed_total, 3);
    let numbers: Vec<u64> = report.malformed.iter().map(|m| m.line).collect();
    assert_eq!(numbers, vec![4, 11, 21]);
    assert_eq!(report.skipped, 1, "the blank line");
    assert_eq!(report.routes[0].requests, 30);
    assert_eq!(report.routes[0].allowed, 20);
}

#[test]
fn lines_out_of_order_within_the_window_are_sorted() {
    let mut lines: Vec<String> = (0..1000)
        .map(|i| json_line(T0 + i * 10_000, "203.0.113.7", None, "allowed"))
        .collect();
    // Swap neighbours in pairs: two workers writing one log.
    for pair in lines.chunks_mut(2) {
        pair.swap(0, 1);
    }
    let report = replay(config(BUCKET_20_AT_10, ""), &lines);
    assert_eq!(report.routes[0].allowed, 119, "the same answer as in order");
    assert_eq!(report.reordered, 500);
    assert_eq!(report.late, 0);
}

#[test]
fn a_line_older_than_the_window_is_decided_late_and_counted() {
    let mut lines: Vec<String> = (0..100)
        .map(|i| json_line(T0 + i * 1_000_000, "203.0.113.7", None, "allowed"))
        .collect();
    lines.push(json_line(T0, "203.0.113.8", None, "allowed"));
    let report = replay(config(BUCKET_20_AT_10, ""), &lines);
    assert_eq!(report.late, 1);
    assert_eq!(report.routes[0].requests, 101);
}

#[test]
fn consumers_and_tiers_are_replayed_from_key_digests() {
    let test = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let test2 = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";
    let unknown = "00000000000000000000000000000000000000000000000000000000000000aa";
    let consumers = format!(
        "consumers:
  unknown_key: reject
  entries:
    - {{name: acme, tier: pro, keys_sha256: [{test}, {test2}]}}"
    );
    let limits = "      - {algorithm: fixed_window, limit: 3, window: 1h, tiers: [pro]}\n";
    let mut lines = Vec::new();
    for i in 0..4 {
        lines.push(json_line(
            T0 + i * 1000,
            "198.51.100.1",
            Some(test),
            "allowed",
        ));
        lines.push(json_line(
            T0 + i * 1000 + 500,
            "198.51.100.2",
            Some(test2),
            "allowed",
        ));
    }
    lines.push(json_line(
        T0 + 9000,
        "198.51.100.3",
        Some(unknown),
        "allowed",
    ));
    let report = replay(config(limits, &consumers), &lines);
    let r = &report.routes[0];
    assert_eq!(r.allowed, 3, "acme's two keys share one window of 3");
    assert_eq!(r.denied, 5);
    assert_eq!(r.invalid_key, 1);
    assert_eq!(r.top_denied[0], ("consumer:acme".to_string(), 5));
}

#[test]
fn agreement_with_the_logged_decisions_is_counted() {
    let lines: Vec<String> = (0..30)
        .map(|i| {
            let decision = if i < 20 { "allowed" } else { "denied" };
            json_line(T0 + i * 1000, "203.0.113.7", None, decision)
        })
        .collect();
    let report = replay(config(BUCKET_20_AT_10, ""), &lines);
    assert_eq!(
        (report.routes[0].compared, report.routes[0].agreed),
        (30, 30)
    );
    let stricter = "      - {algorithm: token_bucket, capacity: 10, refill_rate: 10}\n";
    let report = replay(config(stricter, ""), &lines);
    assert_eq!(
        (report.routes[0].compared, report.routes[0].agreed),
        (30, 20)
    );
}

#[test]
fn memory_stays_bounded_by_the_budgets_alive_at_once() {
    // A million distinct clients, one request each, one per millisecond: a bucket that refills
    // in 2 s is full again 2 s after its only request, so the sweeps keep only ~2000 alive.
    let config = config(
        "      - {algorithm: token_bucket, capacity: 2, refill_rate: 1}\n",
        "",
    );
    let mut replay = Replay::new(config);
    for i in 0..200_000u64 {
        replay.push(Record {
            at_us: T0 + i * 1000,
            method: Method::GET,
            path: "/api/x".into(),
            host: None,
            client_ip: IpAddr::from((i as u32 + 1).to_be_bytes()),
            identity: RecordedIdentity::Ip,
            latency_us: None,
            recorded: None,
            whole_second: false,
            costs: Vec::new(),
            keys: Vec::new(),
            status: None,
        });
    }
    assert!(
        replay.store.len() < 20_000,
        "{} budgets live",
        replay.store.len()
    );
    let report = replay.finish();
    assert_eq!(report.routes[0].allowed, 200_000);
}

#[test]
fn timestamps_parse_in_both_formats() {
    assert_eq!(parse_rfc3339_us("1970-01-01T00:00:01.5Z"), Some(1_500_000));
    assert_eq!(
        parse_rfc3339_us("2026-11-22T01:00:00.000001+01:00"),
        Some(T0 + 1)
    );
    assert_eq!(parse_rfc3339_us("2026-13-22T01:00:00Z"), None);
    assert_eq!(parse_time_local("22/Nov/2026:00:00:00 +0000"), Some(T0));
    assert_eq!(
        parse_time_local("21/Nov/2026:19:00:00 -0500"),
        Some(T0),
        "an offset west of UTC"
    );
    assert_eq!(parse_time_local("22/Foo/2026:00:00:00 +0000"), None);
}

#[test]
fn the_fast_scanner_reads_what_the_general_parser_reads() {
    let key = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let mut lines = vec![
        json_line(T0, "203.0.113.7", None, "allowed"),
        json_line(T0 + 1, "2001:db8::1", Some(key), "denied"),
        json_line(T0 + 2, "203.0.113.7", Some(key), "shadow_denied"),
    ];
    // Layouts the scanner leaves to the general parser: an escape, keys in another order,
    // whitespace, a nested array, a line of another target, a span missing fields.
    lines.push(lines[0].replace("/api/x", "/api/x\\u0041"));
    lines.push(lines[1].replace(
        r#""method":"GET","path":"/api/x""#,
        r#""path":"/api/x", "method" : "GET""#,
    ));
    lines.push(lines[0].replace(r#""level":"INFO""#, r#""level":["INFO"]"#));
    lines.push(lines[0].replace("floodgate::access", "floodgate::server"));
    lines.push(r#"{"timestamp":"2026-11-22T00:00:00.000000Z","span":{"route":"api"}}"#.into());
    for line in &lines {
        let fast = parse_json(line.as_bytes());
        let general = parse_json_general(line.as_bytes());
        assert_eq!(fast.is_ok(), general.is_ok(), "{line}");
        if let (Ok(a), Ok(b)) = (&fast, &general) {
            assert_eq!(a, b, "{line}");
        }
    }
    assert_eq!(
        parse_json(lines[3].as_bytes()).unwrap().unwrap().path,
        "/api/xA",
        "the escaped line, read by the general parser"
    );
}

#[test]
fn ipv6_clients_of_one_prefix_share_a_budget_in_replay_as_in_the_proxy() {
    // Two addresses of one /64 (nginx logs whole addresses): one bucket of 2 between them.
    let lines = vec![
        combined_line(T0 / 1_000_000, "2001:db8:1:2::a", "/api/x"),
        combined_line(T0 / 1_000_000 + 1, "2001:db8:1:2::b", "/api/x"),
        combined_line(T0 / 1_000_000 + 2, "2001:db8:1:2::c", "/api/x"),
    ];
    let report = replay(
        config(
            "      - {algorithm: token_bucket, capacity: 2, refill_rate: 0.001}\n",
            "",
        ),
        &lines,
    );
    assert_eq!(report.routes[0].allowed, 2);
    assert_eq!(report.routes[0].top_denied[0].0, "ip:2001:db8:1:2::");
}

/// A settled cost (`cost: {reserve, actual}`) is replayed at what the log says the request
/// cost: a bucket of 1,000 tokens admits a call that used 900 and refuses the next, which used
/// 200, though each reserved only 500 (the default, what replay would spend without the field).
#[test]
fn settled_costs_are_replayed_at_what_the_log_says_they_cost() {
    let limits = "      - algorithm: token_bucket
        capacity: 1000
        refill_rate: 0.01
        cost: {reserve: {json: max_tokens, default: 500}, actual: {json: usage.total_tokens}}
";
    let with_cost = |at: u64, cost: &str| {
        json_line(at, "203.0.113.7", None, "allowed").replace(
            r#""latency_ms":0.0,"#,
            &format!(r#""latency_ms":0.0,"cost":"{cost}","#),
        )
    };
    let lines = [
        with_cost(T0, "0=500/900"),
        with_cost(T0 + 1000, "0=500/200"),
    ];
    let report = replay(config(limits, ""), &lines);
    assert_eq!((report.routes[0].allowed, report.routes[0].denied), (1, 1));
    // Without the field, each costs its reserve: both pass.
    let plain = [
        json_line(T0, "203.0.113.7", None, "allowed"),
        json_line(T0 + 1000, "203.0.113.7", None, "allowed"),
    ];
    let report = replay(config(limits, ""), &plain);
    assert_eq!(report.routes[0].allowed, 2);
    // The general parser reads the field as the fast one does.
    let line = with_cost(T0, "0=500/900");
    let general = parse_json_general(line.as_bytes()).unwrap().unwrap();
    assert_eq!(general.costs, vec![(0, 500, 900)]);
    assert_eq!(
        parse_json(line.as_bytes()).unwrap().unwrap().costs,
        vec![(0, 500, 900)]
    );
}

/// A proposed config that routes by host: each line goes to the route of the host it recorded
/// (a line without one, as nginx's, to a route without `hosts`), each route limited on its own.
#[test]
fn lines_are_routed_by_the_host_they_recorded() {
    let config = Config::from_yaml(
        "listen: 127.0.0.1:0
routes:
  - name: billing
    hosts: [billing.example.com]
    path_prefix: /
    upstream: http://127.0.0.1:9000
    limits:
      - {algorithm: fixed_window, limit: 3, window: 1h}
  - name: rest
    path_prefix: /
    upstream: http://127.0.0.1:9000
    limits:
      - {algorithm: fixed_window, limit: 5, window: 1h}
",
    )
    .expect("config");
    let with_host = |i: u64, host: &str| {
        json_line(T0 + i * 1000, "203.0.113.7", None, "allowed").replace(
            r#""path":"/api/x","#,
            &format!(r#""path":"/api/x","host":"{host}","#),
        )
    };
    let mut lines: Vec<String> = (0..10)
        .map(|i| with_host(i, "billing.example.com"))
        .collect();
    lines.extend((10..20).map(|i| with_host(i, "rides.example.com")));
    lines.extend((20..30).map(|i| json_line(T0 + i * 1000, "203.0.113.7", None, "allowed")));
    // Both of the line's readers see the host: the one-pass scanner, and serde_json.
    assert_eq!(
        parse_json(lines[0].as_bytes())
            .unwrap()
            .unwrap()
            .host
            .as_deref(),
        Some("billing.example.com")
    );
    assert_eq!(
        parse_json_general(lines[0].as_bytes())
            .unwrap()
            .unwrap()
            .host
            .as_deref(),
        Some("billing.example.com")
    );
    let report = replay(config, &lines);
    let by_name = |name: &str| report.routes.iter().find(|r| r.name == name).unwrap();
    let (billing, rest) = (by_name("billing"), by_name("rest"));
    assert_eq!((billing.requests, billing.allowed), (10, 3));
    assert_eq!((rest.requests, rest.allowed), (20, 5));
}

/// `refund_on` / `spend_on` in a proposed config read each line's logged status: a login limit
/// of 2 that counts only 401s lets every 200 through and refuses the third failure, as the
/// proxy would have; and nginx's combined lines carry their status too.
#[test]
fn status_dependent_limits_are_replayed_by_the_logged_status() {
    let limits = "      - {algorithm: fixed_window, limit: 2, window: 1h, spend_on: [401]}\n";
    let with_status = |at: u64, status: u16| {
        json_line(at, "203.0.113.7", None, "allowed").replace(
            r#""route":"api","status":200,"name""#,
            &format!(r#""route":"api","status":{status},"name""#),
        )
    };
    let mut lines: Vec<String> = (0..5).map(|i| with_status(T0 + i * 1000, 200)).collect();
    lines.extend((5..8).map(|i| with_status(T0 + i * 1000, 401)));
    assert_eq!(
        parse_json(lines[5].as_bytes()).unwrap().unwrap().status,
        Some(401)
    );
    let report = replay(config(limits, ""), &lines);
    assert_eq!((report.routes[0].allowed, report.routes[0].denied), (7, 1));
    // Without the statuses (an older log), each request keeps its unit: two pass.
    let plain: Vec<String> = (0..8)
        .map(|i| {
            json_line(T0 + i * 1000, "203.0.113.7", None, "allowed")
                .replace(r#","status":200,"name""#, r#","name""#)
        })
        .collect();
    assert_eq!(
        parse_json(plain[0].as_bytes()).unwrap().unwrap().status,
        None
    );
    let report = replay(config(limits, ""), &plain);
    assert_eq!((report.routes[0].allowed, report.routes[0].denied), (2, 6));
    // refund_on: 404s cost nothing, so a bucket of 2 admits every one of them.
    let refund = "      - {algorithm: fixed_window, limit: 2, window: 1h, refund_on: [404]}\n";
    let lines: Vec<String> = (0..6).map(|i| with_status(T0 + i * 1000, 404)).collect();
    let report = replay(config(refund, ""), &lines);
    assert_eq!(report.routes[0].allowed, 6);
    let combined = combined_line(T0 / 1_000_000, "203.0.113.9", "/api/x");
    assert_eq!(parse_line(&combined).unwrap().unwrap().status, Some(200));
}

/// A cached route (`cache: {ttl: 1s}`): 1000 GETs of one path over 10 s, 10 ms apart, each
/// answered in 0 ms as logged, reach the upstream once a second: 10 fetches; the rest are
/// answered from the cache (and spend no limit: the bucket of 20 would have refused most).
#[test]
fn a_cached_route_reports_what_would_have_reached_the_upstream() {
    let lines: Vec<String> = (0..1000)
        .map(|i| json_line(T0 + i * 10_000, "203.0.113.7", None, "allowed"))
        .collect();
    let cached = Config::from_yaml(
        "listen: 127.0.0.1:0
routes:
  - name: api
    path_prefix: /api
    upstream: http://127.0.0.1:9000
    cache: {ttl: 1s}
    limits:
      - {algorithm: token_bucket, capacity: 20, refill_rate: 10}
",
    )
    .expect("config");
    let report = replay(cached, &lines);
    let r = &report.routes[0];
    assert_eq!(r.requests, 1000);
    assert_eq!(r.upstream, 10);
    assert_eq!(r.cached, Some(990));
    assert_eq!(r.denied, 0);
    assert!(
        report
            .to_text()
            .contains("990 answered from the cache; 10 would reach the upstream")
    );
    // Without the cache, the bucket's 119 reach it (see a_known_answer_from_the_json_log).
    let uncached = replay(config(BUCKET_20_AT_10, ""), &lines);
    assert_eq!(uncached.routes[0].upstream, 119);
    assert_eq!(uncached.routes[0].cached, None);
}
