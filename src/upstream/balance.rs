//! Picking an endpoint: pure functions of the endpoints' weights and loads (and a key, or a
//! random draw), unit-tested without sockets. The pool ([`super::RoutePool`]) gives them the
//! endpoints that may be picked now and turns the index they return into an endpoint.

/// What a balancer sees of one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Its weight, 1-100.
    pub weight: u32,
    /// Requests it is serving now.
    pub in_flight: u64,
}

/// True when `a` is less loaded than `b` for its weight: `(a.in_flight + 1) / a.weight` below
/// `b`'s (compared without division).
fn lighter(a: Load, b: Load) -> std::cmp::Ordering {
    let a_score = u128::from(a.in_flight + 1) * u128::from(b.weight.max(1));
    let b_score = u128::from(b.in_flight + 1) * u128::from(a.weight.max(1));
    a_score.cmp(&b_score)
}

/// `least_request`: with at most three endpoints, the least loaded of all (ties broken at
/// random, so that idle endpoints share the work); with more, the less loaded of two picked at
/// random (the power of two choices). Envoy's docs warn that two random picks out of two return
/// the busier one a quarter of the time: hence the full comparison on small pools.
/// `random(n)` draws uniformly from `0..n`. `None` for no endpoint.
pub fn least_request(loads: &[Load], mut random: impl FnMut(usize) -> usize) -> Option<usize> {
    match loads.len() {
        0 => None,
        1 => Some(0),
        2 | 3 => {
            let mut best = 0;
            let mut ties = 1;
            for i in 1..loads.len() {
                match lighter(loads[i], loads[best]) {
                    std::cmp::Ordering::Less => {
                        best = i;
                        ties = 1;
                    }
                    std::cmp::Ordering::Equal => {
                        // Reservoir sampling: each tied endpoint is kept with equal chance.
                        ties += 1;
                        if random(ties) == 0 {
                            best = i;
                        }
                    }
                    std::cmp::Ordering::Greater => {}
                }
            }
            Some(best)
        }
        n => {
            let a = random(n);
            let mut b = random(n - 1);
            if b >= a {
                b += 1;
            }
            Some(match lighter(loads[b], loads[a]) {
                std::cmp::Ordering::Less => b,
                _ => a,
            })
        }
    }
}

/// Weighted round robin, smooth (nginx's): the order in which `weights` are served over one
/// cycle of `sum(weights)` picks, spread so that a heavy endpoint's turns are interleaved with
/// the others' rather than bunched. Built once per set of endpoints.
pub fn smooth_order(weights: &[u32]) -> Vec<u16> {
    let total: i64 = weights.iter().map(|&w| i64::from(w.max(1))).sum();
    let mut current = vec![0i64; weights.len()];
    let mut order = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, &w) in weights.iter().enumerate() {
            current[i] += i64::from(w.max(1));
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        order.push(best as u16);
    }
    order
}

/// Weighted rendezvous hashing: the endpoint whose score for `key` is highest, a score being a
/// deterministic hash of the key and the endpoint's `ids` entry, scaled by its weight. The same
/// key reaches the same endpoint on every instance while it is in `ids`; when an endpoint leaves
/// only its keys move (each to its next-highest score), and one that arrives takes only the keys
/// it now scores highest on.
pub fn rendezvous(key: u64, ids: &[u64], weights: &[u32]) -> Option<usize> {
    highest(
        ids.iter()
            .zip(weights)
            .enumerate()
            .map(|(i, (&id, &weight))| (i, rendezvous_score(key, id, weight))),
    )
}

/// The endpoint `id`'s rendezvous score for `key` at `weight`: a uniform draw in (0, 1) from
/// the hash, scaled as -w / ln(u), which orders endpoints as a weighted draw would
/// (Schindelhauer and Schomaker's weighted rendezvous).
pub fn rendezvous_score(key: u64, id: u64, weight: u32) -> f64 {
    let h = mix(key ^ mix(id));
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight.max(1)) / u.ln()
}

/// The index with the highest score (the first of equals).
pub fn highest(scores: impl Iterator<Item = (usize, f64)>) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, score) in scores {
        if best.is_none_or(|(_, s)| score > s) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// A deterministic 64-bit hash of `bytes` (FNV-1a), the same on every instance and build.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// splitmix64's finaliser: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(weight: u32, in_flight: u64) -> Load {
        Load { weight, in_flight }
    }

    /// A deterministic "random" source for the tests.
    fn rng(seed: u64) -> impl FnMut(usize) -> usize {
        let mut state = seed;
        move |n| {
            state = mix(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
            (state % n as u64) as usize
        }
    }

    #[test]
    fn least_request_on_a_small_pool_always_takes_the_least_loaded() {
        let mut r = rng(1);
        for _ in 0..1000 {
            assert_eq!(
                least_request(&[load(1, 3), load(1, 1), load(1, 2)], &mut r),
                Some(1)
            );
            assert_eq!(least_request(&[load(1, 5), load(1, 4)], &mut r), Some(1));
        }
        // Weighted: 4 in flight on weight 4 is lighter than 2 on weight 1.
        assert_eq!(least_request(&[load(1, 2), load(4, 4)], &mut r), Some(1));
    }

    #[test]
    fn least_request_shares_ties_evenly() {
        let mut r = rng(2);
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[least_request(&[load(1, 0); 3], &mut r).unwrap()] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn least_request_on_a_large_pool_never_picks_the_busiest_of_its_two() {
        let mut r = rng(3);
        let loads: Vec<Load> = (0..10).map(|i| load(1, i)).collect();
        let mut counts = [0u32; 10];
        for _ in 0..10_000 {
            counts[least_request(&loads, &mut r).unwrap()] += 1;
        }
        // The busiest endpoint (9) loses every comparison; the idlest (0) wins each it is in.
        assert_eq!(counts[9], 0, "{counts:?}");
        assert!(counts[0] > counts[5] && counts[5] > counts[8], "{counts:?}");
    }

    #[test]
    fn smooth_round_robin_serves_each_weight_and_interleaves() {
        assert_eq!(smooth_order(&[1, 1, 1]), [0, 1, 2]);
        let order = smooth_order(&[5, 1, 1]);
        assert_eq!(order.len(), 7);
        assert_eq!(order.iter().filter(|&&i| i == 0).count(), 5);
        // nginx's example: a a b a c a a, never five a's in a row.
        assert_eq!(order, [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn rendezvous_keeps_keys_and_moves_only_the_removed_endpoints() {
        let ids = [
            hash_bytes(b"10.0.0.1:80"),
            hash_bytes(b"10.0.0.2:80"),
            hash_bytes(b"10.0.0.3:80"),
        ];
        let weights = [1, 1, 1];
        let keys: Vec<u64> = (0..3000u32).map(|k| hash_bytes(&k.to_le_bytes())).collect();
        let before: Vec<usize> = keys
            .iter()
            .map(|&k| rendezvous(k, &ids, &weights).unwrap())
            .collect();
        let mut counts = [0u32; 3];
        for &b in &before {
            counts[b] += 1;
        }
        for c in counts {
            assert!((850..1150).contains(&c), "{counts:?}");
        }
        // Endpoint 1 leaves: its keys move, no other key does.
        let ids2 = [ids[0], ids[2]];
        for (k, &was) in keys.iter().zip(&before) {
            let now = rendezvous(*k, &ids2, &[1, 1]).unwrap();
            let now = if now == 0 { 0 } else { 2 };
            if was != 1 {
                assert_eq!(now, was, "a key of a remaining endpoint moved");
            }
        }
    }

    #[test]
    fn rendezvous_follows_the_weights() {
        let ids = [hash_bytes(b"a"), hash_bytes(b"b")];
        let mut counts = [0u32; 2];
        for k in 0..20_000u32 {
            counts[rendezvous(hash_bytes(&k.to_le_bytes()), &ids, &[3, 1]).unwrap()] += 1;
        }
        let share = f64::from(counts[0]) / 20_000.0;
        assert!((0.72..0.78).contains(&share), "{counts:?}");
    }
}
