//! The decider on the memory store at a manual clock: bans on routes with and without limits, an
//! override and its end, the search over endpoints (`per: endpoint`).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::*;
use crate::config::Config;
use crate::control::{Ban, Control, Override};
use crate::identity::Identity;
use crate::limiter::{ManualClock, MemoryStore, wall_clock_us};

/// Two routes on the memory store: `open` without limits, `api` with a bucket of 2 that does not
/// refill within a test, and `pool` with a bucket of 1 per endpoint beside one of 3 per client.
fn config() -> Config {
    Config::from_yaml(
        "listen: 127.0.0.1:0
routes:
  - name: open
    path_prefix: /open
    upstream: http://127.0.0.1:9
  - name: api
    path_prefix: /api
    upstream: http://127.0.0.1:9
    limits:
      - {algorithm: token_bucket, capacity: 2, refill_rate: 0.001}
  - name: pool
    path_prefix: /pool
    upstream: http://127.0.0.1:9
    limits:
      - {algorithm: fixed_window, limit: 1, window: 1h, per: endpoint}
      - {algorithm: fixed_window, limit: 3, window: 1h}
",
    )
    .expect("a valid config")
}

struct Fixture {
    config: Config,
    limiter: Limiter,
    control: Control,
}

impl Fixture {
    fn new() -> Fixture {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        Fixture {
            config: config(),
            limiter: Limiter::Memory(Arc::new(MemoryStore::new(clock, 10_000))),
            control: Control::default(),
        }
    }

    fn decider(&self) -> Decider<'_> {
        Decider {
            policy: Policy {
                identity: &self.config.identity,
                consumers: None,
                tiers: &self.config.tiers,
                shadow: false,
            },
            limiter: &self.limiter,
            on_error: OnError::Deny,
            metrics: None,
            control: Some(&self.control),
            alerts: None,
            global: None,
            report: false,
            undoable: false,
            penalizes: true,
        }
    }

    fn route(&self, name: &str) -> &RouteConfig {
        self.config
            .routes
            .iter()
            .find(|r| &*r.name == name)
            .unwrap()
    }

    /// Decides one request of the API key `key` on `route`.
    fn decide(&self, route: &str, key: &[u8]) -> Decided {
        self.decide_sent(route, key, None)
    }

    fn decide_sent(
        &self,
        route: &str,
        key: &[u8],
        endpoints: Option<&mut (dyn Endpoints + Send)>,
    ) -> Decided {
        let whose = Whose {
            identity: Identity::ApiKey(key),
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            tier: crate::identity::ANONYMOUS_TIER,
        };
        let decider = self.decider();
        let mut facts = NoFacts;
        let future = decider.decide(Question::Request {
            route: self.route(route),
            whose: &whose,
            facts: &mut facts,
            // (Its trait object's lifetime shortened to the question's.)
            endpoints: endpoints.map(|e| -> &mut (dyn Endpoints + Send) { e }),
        });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(future).poll(&mut cx) {
            std::task::Poll::Ready(decided) => decided,
            std::task::Poll::Pending => panic!("the memory store decides at once"),
        }
    }

    fn ban(&self, route: Option<&str>, key: &[u8]) {
        self.control.ban(Ban {
            id: self.control.new_id("ban"),
            route: route.map(str::to_string),
            kind: KeyKind::ApiKey,
            value: key.to_vec(),
            until_us: wall_clock_us() + 60_000_000,
            reason: "test".into(),
            by: "operator",
        });
    }
}

fn banned(decided: &Decided) -> bool {
    matches!(decided.refused, Some(Refused::Banned(wait)) if wait > 0)
}

fn rate_limited(decided: &Decided) -> bool {
    matches!(decided.refused, Some(Refused::RateLimited(..)))
}

#[test]
fn a_ban_refuses_on_a_route_without_limits_and_on_one_with_them() {
    let f = Fixture::new();
    assert!(f.decide("open", b"k").refused.is_none());
    assert_eq!(f.decide("open", b"k").label, DecisionLabel::Unlimited);
    f.ban(None, b"k");
    assert!(banned(&f.decide("open", b"k")));
    assert!(banned(&f.decide("api", b"k")));
    // Another identity is untouched.
    assert!(f.decide("open", b"other").refused.is_none());
    // A ban on one route covers only that route.
    f.ban(Some("api"), b"only-api");
    assert!(f.decide("open", b"only-api").refused.is_none());
    assert!(banned(&f.decide("api", b"only-api")));
}

#[test]
fn an_override_stands_in_for_the_routes_limits_until_it_ends() {
    let f = Fixture::new();
    let budget = crate::config::override_budget(
        "api",
        "api~ovr1",
        serde_json::json!([{"algorithm": "token_bucket", "capacity": 1, "refill_rate": 0.001}]),
        false,
    )
    .unwrap();
    let over = |until_us| {
        Arc::new(Override {
            id: f.control.new_id("ovr"),
            route: "api".into(),
            kind: KeyKind::ApiKey,
            value: b"vip".to_vec(),
            until_us,
            limits: serde_json::Value::Null,
            budget: budget.clone(),
        })
    };
    f.control.set_override(over(wall_clock_us() + 60_000_000));
    // The override's bucket of 1, not the route's 2.
    assert!(f.decide("api", b"vip").refused.is_none());
    assert!(rate_limited(&f.decide("api", b"vip")));
    // Ended, the route's own budget (untouched so far) applies again.
    f.control.set_override(over(1));
    assert!(f.decide("api", b"vip").refused.is_none());
    assert!(f.decide("api", b"vip").refused.is_none());
    assert!(rate_limited(&f.decide("api", b"vip")));
}

/// Offers `names` in order, counting what it offered.
struct Offer {
    names: Vec<&'static [u8]>,
    offered: usize,
}

impl Endpoints for Offer {
    fn next(&mut self) -> Option<&[u8]> {
        let name = *self.names.get(self.offered)?;
        self.offered += 1;
        Some(name)
    }
}

#[test]
fn a_spent_endpoint_is_passed_over_and_a_spent_client_ends_the_search() {
    let f = Fixture::new();
    let offer = || Offer {
        names: vec![b"10.0.0.2:80", b"10.0.0.3:80"],
        offered: 0,
    };
    // Each endpoint's budget of 1: the first request takes the first endpoint, the second
    // passes over it to the second.
    let mut first = offer();
    assert!(
        f.decide_sent("pool", b"a", Some(&mut first))
            .refused
            .is_none()
    );
    assert_eq!(first.offered, 1);
    let mut second = offer();
    assert!(
        f.decide_sent("pool", b"b", Some(&mut second))
            .refused
            .is_none()
    );
    assert_eq!(
        second.offered, 2,
        "the spent first endpoint was passed over"
    );
    // Both spent: refused, after both were tried, and nothing spent from the client's budget
    // (b has 2 of 3 left: it is admitted on a fresh endpoint below).
    let mut third = offer();
    let refused = f.decide_sent("pool", b"b", Some(&mut third));
    assert!(rate_limited(&refused));
    assert_eq!(third.offered, 2);
    // A client whose own budget is spent is refused at the first endpoint: no other one would
    // change that.
    for _ in 0..2 {
        let mut fresh = Offer {
            names: vec![b"10.0.0.9:80"],
            offered: 0,
        };
        let _ = f.decide_sent("pool", b"c", Some(&mut fresh));
    }
    let mut many = Offer {
        names: vec![
            b"10.0.0.10:80",
            b"10.0.0.11:80",
            b"10.0.0.12:80",
            b"10.0.0.13:80",
        ],
        offered: 0,
    };
    // c spent 1 of 3 (the second request found 10.0.0.9 spent and nothing else): 2 left.
    assert!(
        f.decide_sent("pool", b"c", Some(&mut many))
            .refused
            .is_none()
    );
    assert!(
        f.decide_sent("pool", b"c", Some(&mut many))
            .refused
            .is_none()
    );
    let mut rest = Offer {
        names: vec![b"10.0.0.20:80", b"10.0.0.21:80"],
        offered: 0,
    };
    assert!(rate_limited(&f.decide_sent("pool", b"c", Some(&mut rest))));
    assert_eq!(
        rest.offered, 1,
        "the client's own limit refused: no endpoint passed over"
    );
    // Without endpoints (replay, /budgets), the per-endpoint limit is left out.
    assert!(f.decide("pool", b"d").refused.is_none());
}

/// Polls `question`'s decision once: the memory store answers at once.
fn decide_now(decider: &Decider<'_>, question: Question<'_, '_, NoFacts>) -> Decided {
    decider
        .decide_now(question)
        .expect("the memory store decides at once")
}

/// An ask of a [`Question::Limits`].
fn taken<'a>(ask: Ask<'a>, side: Side, take: Take) -> Taken<'a> {
    Taken { ask, side, take }
}

/// What is left of `ask`'s budget, peeked.
fn left(decider: &Decider<'_>, ask: Ask<'_>) -> u64 {
    let peek = std::pin::pin!(decider.peek(std::slice::from_ref(&ask)));
    let std::task::Poll::Ready(Ok(left)) =
        peek.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    else {
        panic!("the memory store answers at once");
    };
    left[0].remaining_before(1)
}

/// A fixed window of `n` an hour (none ends within a test).
fn window(n: u32) -> Limit {
    let hour = std::time::Duration::from_secs(3600);
    Limit::of(crate::limiter::Algorithm::fixed_window(n, hour).unwrap())
}

/// An ask of `limit` from a budget of the rate-limit service's kind: values a caller chose.
fn ask<'a>(limit: &'a Limit, budget: &'static str, value: &'static [u8]) -> Ask<'a> {
    let key = crate::limiter::BudgetKey {
        budget,
        kind: KeyKind::Request,
        value,
    };
    Ask { limit, key }
}

#[test]
fn limits_without_a_client_are_decided_all_or_nothing_and_no_ban_applies() {
    let f = Fixture::new();
    let decider = f.decider();
    let (one, three) = (window(1), window(3));
    let a = ask(&three, "svc.a", b"tenant");
    let b = ask(&one, "svc.b", b"tenant");
    let shadow = ask(&one, "svc.s", b"tenant");
    // A ban on the bytes the asks carry: a question that names no client is not refused by it.
    f.ban(None, b"tenant");
    let question = [
        taken(a, Side::Enforced, Take::Spend),
        taken(b, Side::Enforced, Take::Spend),
        taken(shadow, Side::Shadow, Take::Spend),
    ];
    let first = decide_now(&decider, Question::limits(&question));
    assert!(first.refused.is_none());
    assert_eq!(first.label, DecisionLabel::Allowed);
    // The bucket of 1 is spent: refused by it alone, and the other's units are not spent
    // (all or nothing), so the 3 still has 2 left.
    let second = decide_now(&decider, Question::limits(&question));
    assert!(rate_limited(&second));
    assert!(second.denied_by(Side::Enforced, 1));
    assert!(!second.denied_by(Side::Enforced, 0));
    assert_eq!(left(&decider, a), 2);
    // The shadow limit denies from here on, and never refuses: only the enforced ones' first
    // ask, alone, is asked.
    let alone = [question[0], question[2]];
    let alone = decide_now(&decider, Question::limits(&alone));
    assert!(alone.refused.is_none());
    assert_eq!(alone.label, DecisionLabel::ShadowDenied);
}

#[test]
fn a_check_that_refuses_spends_nothing_and_a_give_back_stands_whatever_is_decided() {
    let f = Fixture::new();
    let decider = Decider {
        report: true,
        ..f.decider()
    };
    let (one, three) = (window(1), window(3));
    let spent = ask(&three, "svc.spent", b"t");
    let checked = ask(&one, "svc.checked", b"t");
    // A bucket: a give-back is dated by the wall clock, which a window on this fixture's
    // manual clock would not count in its own.
    let bucket = Limit::of(crate::limiter::Algorithm::token_bucket(3, 0.0001).unwrap());
    let given = ask(&bucket, "svc.given", b"t");
    // The checked budget has room: the spent ask is spent, the check is not.
    let question = [
        taken(spent, Side::Enforced, Take::Spend),
        taken(checked, Side::Enforced, Take::Check),
    ];
    let first = decide_now(&decider, Question::limits(&question));
    assert!(first.refused.is_none());
    let report = first.report.as_deref().expect("a report");
    assert!(report.spent);
    assert_eq!(report.checks.len(), 1);
    assert!(report.checks[0].allowed());
    assert_eq!((left(&decider, spent), left(&decider, checked)), (2, 1));
    // The checked budget is spent elsewhere: the check refuses, and the spent ask is not spent
    // (all or nothing across a checked and a spent ask), its refusal placed after the spent.
    let elsewhere = [taken(checked, Side::Enforced, Take::Spend)];
    assert!(
        decide_now(&decider, Question::limits(&elsewhere))
            .refused
            .is_none()
    );
    let over = decide_now(&decider, Question::limits(&question));
    assert!(rate_limited(&over));
    assert!(over.denied_by(Side::Enforced, 1));
    assert!(!over.report.as_deref().expect("a report").spent);
    assert_eq!(left(&decider, spent), 2, "nothing spent");
    // A shadow check that refuses refuses nothing.
    let shadow = [
        taken(spent, Side::Enforced, Take::Spend),
        taken(checked, Side::Shadow, Take::Check),
    ];
    assert!(
        decide_now(&decider, Question::limits(&shadow))
            .refused
            .is_none()
    );
    assert_eq!(left(&decider, spent), 1);
    // A give-back stands even when the rest is refused: the spent budget gets a unit back
    // while the check refuses the request.
    let spend_given = [taken(given, Side::Enforced, Take::Spend)];
    assert!(
        decide_now(&decider, Question::limits(&spend_given))
            .refused
            .is_none()
    );
    assert_eq!(left(&decider, given), 2);
    let with_give_back = [
        taken(given, Side::Enforced, Take::GiveBack),
        taken(checked, Side::Enforced, Take::Check),
    ];
    assert!(rate_limited(&decide_now(
        &decider,
        Question::limits(&with_give_back)
    )));
    assert_eq!(left(&decider, given), 3, "given back");
}
