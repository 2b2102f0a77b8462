use super::*;
use crate::limiter::AlgorithmKind;

fn rules(yaml: &str) -> Rules {
    Rules::from_yaml("rl.yaml", yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn problems(yaml: &str) -> Vec<String> {
    match Rules::from_yaml("rl.yaml", yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs
        .iter()
        .map(|(k, v)| Entry {
            key: k.to_string(),
            value: v.to_string(),
        })
        .collect()
}

fn find<'r>(rules: &'r Rules, pairs: &[(&str, &str)]) -> Option<&'r RuleLimit> {
    rules.find("d", &entries(pairs))
}

const TREE: &str = r#"
domain: d
descriptors:
  - key: path
    value: /exact
    rate_limit: {unit: second, requests_per_unit: 1, name: exact}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2, name: wildcard}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 3, name: bare}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4, name: user}
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 5, name: gold}
      - key: plan
        value: free
  - key: host
    value: "*.example.com"
    rate_limit: {unit: day, requests_per_unit: 6, name: host-wildcard}
"#;

fn name(limit: Option<&RuleLimit>) -> Option<&str> {
    limit.and_then(|l| l.name.as_deref())
}

#[test]
fn an_entry_finds_the_exact_value_then_a_wildcard_then_the_bare_key() {
    let r = rules(TREE);
    assert_eq!(name(find(&r, &[("path", "/exact")])), Some("exact"));
    assert_eq!(name(find(&r, &[("path", "/api/users")])), Some("wildcard"));
    assert_eq!(name(find(&r, &[("path", "/other")])), Some("bare"));
    // `*` matches anywhere in the value, not only at its end.
    assert_eq!(
        name(find(&r, &[("host", "api.example.com")])),
        Some("host-wildcard")
    );
    assert_eq!(name(find(&r, &[("host", "example.org")])), None);
}

#[test]
fn a_limit_applies_at_the_descriptors_last_entry_only() {
    let r = rules(TREE);
    assert_eq!(name(find(&r, &[("user", "u1")])), Some("user"));
    assert_eq!(
        name(find(&r, &[("user", "u1"), ("plan", "gold")])),
        Some("gold")
    );
    // A node without a limit at the last entry: no limit, not its parent's.
    assert_eq!(name(find(&r, &[("user", "u1"), ("plan", "free")])), None);
    // An unknown second entry, or entries past a leaf: no limit.
    assert_eq!(name(find(&r, &[("user", "u1"), ("plan", "silver")])), None);
    assert_eq!(name(find(&r, &[("path", "/exact"), ("more", "x")])), None);
    // Unknown key, unknown domain.
    assert_eq!(name(find(&r, &[("nope", "x")])), None);
    assert!(r.find("other", &entries(&[("path", "/exact")])).is_none());
}

#[test]
fn units_are_envoyproxy_ratelimits_in_epoch_aligned_fixed_windows() {
    let r = rules(
        r#"
domain: d
descriptors:
  - {key: s, rate_limit: {unit: SECOND, requests_per_unit: 10}}
  - {key: m, rate_limit: {unit: Month, requests_per_unit: 100000}}
  - {key: yr, rate_limit: {unit: year, requests_per_unit: 5}}
  - {key: x, rate_limit: {unit: minute, requests_per_unit: 7, unit_multiplier: 5}}
"#,
    );
    let window = |key: &str| {
        let limit = find(&r, &[(key, "v")]).unwrap().limit.unwrap();
        assert_eq!(limit.algorithm().kind(), AlgorithmKind::FixedWindow);
        (
            limit.algorithm().units(),
            limit.algorithm().span_us() / 1_000_000,
        )
    };
    assert_eq!(window("s"), (10, 1));
    assert_eq!(window("m"), (100_000, 30 * 86_400));
    assert_eq!(window("yr"), (5, 365 * 86_400));
    assert_eq!(window("x"), (7, 300));
}

#[test]
fn unlimited_replaces_shadow_mode_and_floodgates_algorithms_load() {
    let r = rules(
        r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unlimited: true}
  - key: b
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1, name: b, replaces: [{name: c}]}
  - key: t
    rate_limit: {algorithm: token_bucket, capacity: 10, refill_rate: 5}
  - key: w
    rate_limit: {algorithm: sliding_window_log, unit: minute, requests_per_unit: 30}
"#,
    );
    let a = find(&r, &[("a", "1")]).unwrap();
    assert!(a.unlimited && a.limit.is_none());
    let b = find(&r, &[("b", "1")]).unwrap();
    assert!(b.shadow && b.detailed_metric);
    assert_eq!(b.replaces, vec!["c".to_string()]);
    let t = find(&r, &[("t", "1")]).unwrap().limit.unwrap();
    assert_eq!(t.algorithm().kind(), AlgorithmKind::TokenBucket);
    assert_eq!(t.algorithm().units(), 10);
    let w = find(&r, &[("w", "1")]).unwrap().limit.unwrap();
    assert_eq!(w.algorithm().kind(), AlgorithmKind::SlidingWindowLog);
    assert_eq!(w.algorithm().span_us(), 60_000_000);
}

#[test]
fn keys_floodgate_does_not_act_on_load_and_are_named() {
    let r = rules(
        r#"
domain: d
descriptors:
  - key: a
    quota_mode: true
    value_to_metric: true
    metadata: {team: x}
    rate_limit: {unit: second, requests_per_unit: 1}
"#,
    );
    assert_eq!(r.ignored.len(), 3, "{:?}", r.ignored);
    assert!(r.ignored[0].contains("descriptors[0].quota_mode"));
}

#[test]
fn problems_name_the_file_and_the_path() {
    let unknown = problems(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n",
    );
    assert!(
        unknown[0].starts_with("rl.yaml: descriptors[0].rate_limit"),
        "{unknown:?}"
    );
    assert!(unknown[0].contains("burst"), "{unknown:?}");
    let duplicate = problems(
        "domain: d\ndescriptors:\n  - {key: a, value: x}\n  - key: b\n    descriptors:\n      - {key: c}\n      - {key: c}\n",
    );
    assert!(
        duplicate
            .iter()
            .any(|p| p.starts_with("rl.yaml: descriptors[1].descriptors[1]")
                && p.contains("duplicate")),
        "{duplicate:?}"
    );
    let unit = problems(
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}\n",
    );
    assert!(
        unit[0].contains("descriptors[0].rate_limit.unit"),
        "{unit:?}"
    );
    let missing = problems("domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second}}\n");
    assert!(missing[0].contains("requests_per_unit"), "{missing:?}");
    let empty = problems("domain: ''\n");
    assert!(empty[0].contains("domain"), "{empty:?}");
    let algorithm = problems(
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {algorithm: magic, capacity: 1}}\n",
    );
    assert!(
        algorithm[0].contains("rate_limit.algorithm"),
        "{algorithm:?}"
    );
}

#[test]
fn a_changed_limit_has_a_new_budget_and_an_unchanged_one_keeps_it() {
    let one =
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    let changed =
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 2}}\n";
    let id = |r: &Rules| find(r, &[("a", "x")]).unwrap().budget_id.clone();
    assert_eq!(id(&rules(one)), id(&rules(one)));
    assert_ne!(id(&rules(one)), id(&rules(changed)));
}

#[test]
fn glob_matches_any_run_of_characters() {
    assert!(glob("/api/*", "/api/"));
    assert!(glob("/api/*", "/api/users/1"));
    assert!(glob("*.example.com", "a.example.com"));
    assert!(glob("a*b*c", "a-b-c"));
    assert!(glob("a*b*c", "abc"));
    assert!(!glob("a*b*c", "acb"));
    assert!(!glob("/api/*", "/apx/"));
    assert!(glob("*", ""));
}

/// envoyproxy/ratelimit joins a key and its value with `_` to look a node up, so a key `a_b`
/// shadows key `a` with value `b` and the limit below it goes unapplied. Here every separator a
/// key or value may hold leaves the two apart.
#[test]
fn a_key_holding_a_separator_never_shadows_another_key_and_value() {
    for sep in ["_", ":", "|", ".", "/", "=", "\u{1f}", "\u{1e}", "\n", "\0"] {
        let yaml = format!(
            r#"
domain: d
descriptors:
  - key: a
    value: b
    descriptors:
      - key: c
        rate_limit: {{unit: second, requests_per_unit: 1, name: nested}}
  - key: "a{sep}b"
    rate_limit: {{unit: second, requests_per_unit: 9, name: joined}}
"#,
            sep = yaml_escaped(sep)
        );
        let r = rules(&yaml);
        assert_eq!(
            name(find(&r, &[("a", "b"), ("c", "Z")])),
            Some("nested"),
            "separator {sep:?}"
        );
        let joined = format!("a{sep}b");
        assert_eq!(name(find(&r, &[(&joined, "x")])), Some("joined"));
        // Their budgets are apart too.
        let nested = find(&r, &[("a", "b"), ("c", "Z")]).unwrap();
        let other = find(&r, &[(&joined, "x")]).unwrap();
        assert_ne!(nested.budget_id, other.budget_id);
    }
}

#[test]
fn budget_ids_of_different_places_differ_whatever_the_keys_hold() {
    let r = rules(
        r#"
domain: d
descriptors:
  - key: a
    value: "b/c"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: b
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
"#,
    );
    // Joined as envoyproxy/ratelimit joins them, both places are `/a_b/c`.
    let one = find(&r, &[("a", "b/c")]).unwrap();
    let two = find(&r, &[("a", "b"), ("c", "x")]).unwrap();
    assert_ne!(one.budget_id, two.budget_id);
}

/// `text` as it stands inside a YAML double-quoted string.
fn yaml_escaped(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' | '\\' => format!("\\{c}"),
            c if c.is_control() => format!("\\u{:04x}", c as u32),
            c => c.to_string(),
        })
        .collect()
}
