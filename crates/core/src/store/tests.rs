//! Store tests.

use super::*;
use crate::limiter::test_support::{MS, SEC, T0, rule};
use crate::rule::bucket_id;
use ringlimit_proto::Algorithm;
use std::sync::Arc;

/// A well-spread bucket identity for the `i`th key, as the node computes it.
fn id(i: u64) -> u64 {
    bucket_id(0x5eed, &format!("user:{i}"))
}

/// 10 per second, burst 10: one token every 100 ms.
fn tb10() -> Rule {
    rule(Algorithm::TokenBucket, 10, 1000, 10)
}

fn evictions(s: &Store) -> (u64, u64) {
    (
        s.stats().evictions.load(Ordering::Relaxed),
        s.stats().evictions_limiting.load(Ordering::Relaxed),
    )
}

#[test]
fn a_new_store_is_empty() {
    let s = Store::new(100);
    assert!(s.is_empty());
    assert_eq!(s.len(), 0);
    assert_eq!(s.peek(id(1)), None);
    assert_eq!(evictions(&s), (0, 0));
    assert!(format!("{s:?}").contains("Store"));
}

#[test]
fn an_admitted_check_creates_the_bucket() {
    let s = Store::new(100);
    let r = tb10();
    let d = s.check(id(1), &r, T0, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 9);
    assert_eq!(s.len(), 1);
    assert!(!s.is_empty());
    assert_eq!(
        s.peek(id(1)),
        Some(BucketState::Gcra {
            tat: T0 + 100 * MS,
            tag: crate::limiter::token_bucket::tag(&r)
        })
    );
    // The same id is the same bucket: its state carries on.
    let d = s.check(id(1), &r, T0, 9);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert!(!s.check(id(1), &r, T0, 1).allowed);
    assert_eq!(s.len(), 1);
    // Another id is another bucket.
    assert!(s.check(id(2), &r, T0, 10).allowed);
    assert_eq!(s.len(), 2);
}

#[test]
fn the_store_decides_like_the_algorithm() {
    for alg in Algorithm::ALL {
        let r = rule(alg, 3, 1000, 3);
        let s = Store::new(1000);
        let mut state = BucketState::fresh(&r);
        let mut t = T0;
        for i in 0..200u64 {
            t += (i * 7_919 % 13) * 50 * MS;
            let cost = i % 4;
            assert_eq!(
                s.check(id(7), &r, t, cost),
                state.decide(&r, t, cost),
                "{alg}"
            );
        }
    }
}

#[test]
fn a_peek_or_a_denial_on_an_unknown_bucket_creates_nothing() {
    for alg in Algorithm::ALL {
        let r = rule(alg, 5, 1000, 5);
        let s = Store::new(100);
        // A peek answers "full" without creating anything.
        let d = s.check(id(1), &r, T0, 0);
        assert!(d.allowed, "{alg}");
        assert_eq!(d.remaining, 5, "{alg}");
        assert_eq!(s.len(), 0, "{alg}: a peek created a bucket");
        // The only denial a fresh bucket gives: a cost above its capacity.
        let d = s.check(id(1), &r, T0, 6);
        assert!(!d.allowed, "{alg}");
        assert_eq!(s.len(), 0, "{alg}: a denial created a bucket");
        assert_eq!(s.peek(id(1)), None);
        assert_eq!(evictions(&s), (0, 0));
    }
}

#[test]
fn a_denial_or_a_peek_leaves_a_stored_bucket_as_it_was() {
    let s = Store::new(100);
    let r = tb10();
    for _ in 0..10 {
        assert!(s.check(id(1), &r, T0, 1).allowed);
    }
    let before = s.peek(id(1));
    assert!(!s.check(id(1), &r, T0 + MS, 1).allowed);
    assert!(!s.check(id(1), &r, T0 + MS, 0).allowed);
    assert_eq!(s.peek(id(1)), before);
    let d = s.check(id(1), &r, T0 + 200 * MS, 0);
    assert!(d.allowed);
    assert_eq!(d.remaining, 2);
    assert_eq!(s.peek(id(1)), before);
}

#[test]
fn remove_drops_a_bucket_and_it_starts_fresh() {
    let s = Store::new(100);
    let r = tb10();
    assert!(s.check(id(1), &r, T0, 10).allowed);
    assert!(s.check(id(2), &r, T0, 1).allowed);
    assert!(!s.check(id(1), &r, T0, 1).allowed);
    assert!(s.remove(id(1)));
    assert!(!s.remove(id(1)), "already gone");
    assert!(!s.remove(id(3)), "never there");
    assert_eq!(s.peek(id(1)), None);
    assert_eq!(s.len(), 1);
    assert!(s.peek(id(2)).is_some());
    // An admin reset: full again at once.
    let d = s.check(id(1), &r, T0, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 9);
    // A removal is not an eviction.
    assert_eq!(evictions(&s), (0, 0));
}

#[test]
fn a_changed_algorithm_starts_the_bucket_afresh() {
    let s = Store::new(100);
    let tb = tb10();
    assert!(s.check(id(1), &tb, T0, 10).allowed);
    assert!(!s.check(id(1), &tb, T0, 1).allowed);
    let fw = rule(Algorithm::FixedWindow, 4, 1000, 4);
    let d = s.check(id(1), &fw, T0, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 3);
    assert!(matches!(
        s.peek(id(1)),
        Some(BucketState::Fixed { count: 1, .. })
    ));
}

/// Floods a store of `max_keys` with 10× as many distinct ids (one admitted check each) and
/// checks the bound, returning the store.
fn flood(max_keys: u64, r: &Rule, now: impl Fn(u64) -> u64) -> Store {
    let s = Store::new(max_keys);
    let n = 10 * max_keys;
    let weight = BucketState::fresh(r).weight();
    for i in 0..n {
        assert!(s.check(id(i), r, now(i), 1).allowed);
        assert!(
            s.len() as u64 * weight <= max_keys.max(weight),
            "max_keys {max_keys}: {} buckets of weight {weight} after {} inserts",
            s.len(),
            i + 1
        );
    }
    // Every insert either stayed or pushed one out (or was itself dropped).
    let (evicted, _) = evictions(&s);
    assert_eq!(evicted, n - s.len() as u64, "max_keys {max_keys}");
    s
}

#[test]
fn the_store_stays_bounded_when_flooded() {
    let r = tb10();
    for max_keys in [1, 2, 7, 63, 64, 65, 100, 127, 128, 1000, 4097, 10_000] {
        let s = flood(max_keys, &r, |_| T0);
        let len = s.len() as u64;
        assert!(len <= max_keys, "max_keys {max_keys}: len {len}");
        // The bound is also used, not just respected: most of it holds live buckets.
        assert!(
            len * 4 >= max_keys * 3,
            "max_keys {max_keys}: only {len} buckets kept"
        );
    }
}

#[test]
fn a_zero_bound_still_holds_one_bucket() {
    let s = Store::new(0);
    let r = tb10();
    assert!(s.check(id(1), &r, T0, 1).allowed);
    assert!(s.check(id(2), &r, T0, 1).allowed);
    assert!(s.len() <= 1);
}

#[test]
fn sliding_logs_weigh_in_proportion_to_their_limit() {
    // limit 100: weight 1 + 100/4 = 26, so 10 000 units hold at most 384 such logs.
    let r = rule(Algorithm::SlidingLog, 100, 1000, 100);
    assert_eq!(BucketState::fresh(&r).weight(), 26);
    let s = flood(10_000, &r, |_| T0);
    let len = s.len() as u64;
    assert!(len * 26 <= 10_000, "{len} logs of weight 26");
    assert!(len >= 10_000 / 26 / 2, "only {len} logs kept");
}

#[test]
fn a_heavy_sliding_log_is_kept_and_limits() {
    // The heaviest logs must still fit in a store of a sensible size, or their buckets would be
    // dropped at once and every check on them admitted.
    for (max_keys, limit) in [(10_000, 1_000), (100_000, 10_000), (1_000_000, 10_000)] {
        let r = rule(Algorithm::SlidingLog, limit, 1000, limit);
        let s = Store::new(max_keys);
        for i in 0..limit {
            assert!(s.check(id(1), &r, T0 + i, 1).allowed);
        }
        assert_eq!(
            s.len(),
            1,
            "max_keys {max_keys}, limit {limit}: bucket not kept"
        );
        let d = s.check(id(1), &r, T0 + limit, 1);
        assert!(
            !d.allowed,
            "max_keys {max_keys}, limit {limit}: admitted over the limit"
        );
        assert_eq!(d.retry_after_ns, SEC - limit);
        assert_eq!(evictions(&s), (0, 0));
    }
}

#[test]
fn evicting_buckets_still_limiting_is_counted_apart() {
    // All checks at one instant: every bucket has just taken a token and is not full again
    // until 100 ms later, so every eviction drops a bucket that was still limiting.
    let s = flood(100, &tb10(), |_| T0);
    let (evicted, limiting) = evictions(&s);
    assert!(evicted >= 900);
    assert_eq!(limiting, evicted);

    // One check per second: a bucket is full again 100 ms after its check, so by the time it
    // is evicted it is idle.
    let s = flood(100, &tb10(), |i| T0 + i * SEC);
    let (evicted, limiting) = evictions(&s);
    assert!(evicted >= 900);
    assert_eq!(limiting, 0);

    // Windows count as limiting until their (sliding: next) window ends.
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ] {
        let r = rule(alg, 10, 1000, 10);
        let s = flood(100, &r, |_| T0);
        let (evicted, limiting) = evictions(&s);
        assert!(evicted > 0, "{alg}");
        assert_eq!(limiting, evicted, "{alg}");
        let s = flood(100, &r, |i| T0 + i * 3 * SEC);
        let (evicted, limiting) = evictions(&s);
        assert!(evicted > 0, "{alg}");
        assert_eq!(limiting, 0, "{alg}");
    }
}

#[test]
fn idle_and_limiting_evictions_mixed() {
    // Even ids are checked once and left; odd ids are emptied. At a time when the single-token
    // buckets are full again but the emptied ones are not, flood the store.
    let r = tb10();
    let s = Store::new(64);
    for i in 0..64u64 {
        let cost = if i % 2 == 0 { 1 } else { 10 };
        assert!(s.check(id(i), &r, T0, cost).allowed);
    }
    let before = s.len() as u64;
    // 500 ms later: cost-1 buckets are full (tat T0 + 100 ms), cost-10 ones not (T0 + 1 s).
    let later = T0 + 500 * MS;
    for i in 1000..1000 + 10 * 64u64 {
        s.check(id(i), &r, later, 1);
    }
    let (evicted, limiting) = evictions(&s);
    assert!(evicted >= before, "the old buckets were all pushed out");
    // Limiting: the emptied old buckets and the new ones (all still limiting at `later`);
    // the old buckets that were full again are evictions but not limiting ones.
    let still_old_idle = (0..64u64)
        .filter(|i| i % 2 == 0 && s.peek(id(*i)).is_some())
        .count() as u64;
    let old_idle_evicted = 32 - still_old_idle;
    assert_eq!(evicted - limiting, old_idle_evicted);
    assert!(old_idle_evicted > 0);
}

#[test]
fn concurrent_checks_on_one_bucket_admit_exactly_the_limit() {
    let s = Arc::new(Store::new(10_000));
    let r = rule(Algorithm::TokenBucket, 1000, 1000, 1000);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                (0..1000)
                    .filter(|_| s.check(id(42), &r, T0, 1).allowed)
                    .count()
            })
        })
        .collect();
    let admitted: usize = threads
        .into_iter()
        .map(|t| t.join().expect("thread panicked"))
        .sum();
    assert_eq!(admitted, 1000);
    assert_eq!(s.len(), 1);
    assert!(!s.check(id(42), &r, T0, 1).allowed);
}

#[test]
fn concurrent_checks_on_many_buckets_admit_each_limit() {
    let s = Arc::new(Store::new(100_000));
    let r = rule(Algorithm::FixedWindow, 10, 1000, 10);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut admitted = 0;
                for round in 0..15 {
                    // Every thread touches every id, in a different order.
                    for i in 0..500u64 {
                        let k = (i * 7 + t * 131 + round) % 500;
                        if s.check(id(k), &r, T0, 1).allowed {
                            admitted += 1;
                        }
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("thread panicked"))
        .sum();
    assert_eq!(admitted, 500 * 10);
    assert_eq!(s.len(), 500);
    assert_eq!(evictions(&s), (0, 0));
}

#[test]
fn shard_layout() {
    // (max_keys, shards): each shard holding two of the heaviest buckets (weight 2501), at
    // least 64 shards when that allows, and the shares never adding up to more than `max_keys`.
    for (max_keys, shards) in [
        (1, 1),
        (1000, 1),
        (10_000, 1),
        (20_008, 4),
        (100_000, 19),
        (320_128, 64),
        (400_000, 66),
        (1_000_000, 82),
        (10_000_000, 102),
    ] {
        let s = Store::new(max_keys);
        assert_eq!(s.shards.len(), shards, "max_keys {max_keys}");
        let capacity: u64 = s
            .shards
            .iter()
            .map(|c| c.locked.lock().table.capacity())
            .sum();
        assert!(capacity <= max_keys, "max_keys {max_keys}: {capacity}");
        let share = max_keys / shards as u64;
        assert!(share >= 2 * 2501 || shards == 1, "max_keys {max_keys}");
        if max_keys >= 400_000 {
            // The point of the count: each table, at the bound, is nearly 3/4 full (below
            // 640k keys the two-heaviest-per-shard rule may cap the count first).
            let load = share as f64 / table::slots_for(share) as f64;
            assert!(load > 0.7, "max_keys {max_keys}: load {load}");
        }
    }
    // A million keys: 82 shards of 12,195, each table at most 16,384 slots (3/4 full at the
    // bound), as the memory measurements assume.
    let s = Store::new(1_000_000);
    assert!(
        s.shards
            .iter()
            .all(|c| c.locked.lock().table.capacity() == 12_195)
    );
    assert_eq!(table::slots_for(12_195), 16_384);
}

#[test]
fn shards_fill_evenly() {
    // The multiply-shift pick spreads well-spread ids evenly over a shard count that is not a
    // power of two.
    let s = Store::new(1_000_000);
    let r = tb10();
    for i in 0..82_000 {
        s.check(id(i), &r, T0, 1);
    }
    let lens: Vec<usize> = s
        .shards
        .iter()
        .map(|c| c.locked.lock().table.len())
        .collect();
    let (min, max) = (lens.iter().min(), lens.iter().max());
    assert!(min >= Some(&800) && max <= Some(&1200), "{min:?}..{max:?}");
}
