//! Unit and property tests of the algorithms (manual time, no sleeps).
//!
//! The algorithms are pure functions of (state, rule, now, cost), so every test builds a
//! [`BucketState::fresh`] state and feeds it explicit `now` values.

use super::test_support::{MS, SEC, T0, rule};
use super::*;
use proptest::prelude::*;
use ringlimit_proto::Algorithm;
use ringlimit_proto::peer::Mark;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Start of the aligned window of `period` that contains `t`.
fn window_start(t: u64, period: u64) -> u64 {
    t - t % period
}

/// A rule as the rules module would build it: window algorithms have `burst == limit`.
fn rule_for(algorithm: Algorithm, limit: u64, period_ms: u64) -> Rule {
    rule(algorithm, limit, period_ms, limit)
}

/// Decides `n` checks of `cost` at `now`, asserting each is admitted.
fn admit_n(state: &mut BucketState, r: &Rule, now: u64, cost: u64, n: u64) -> Decision {
    let mut last = None;
    for i in 0..n {
        let d = state.decide(r, now, cost);
        assert!(
            d.allowed,
            "check {i} of {n} (cost {cost}) at {now} denied: {d:?}"
        );
        last = Some(d);
    }
    last.expect("n > 0")
}

/// Asserts the retry promise of a denial made at `now` on `before` (the state the denial saw):
/// the same check is admitted at `now + r` and still denied at `now + r - 1`.
fn assert_retry_exact(before: &BucketState, r: &Rule, now: u64, cost: u64, d: &Decision) {
    assert!(!d.allowed);
    let retry = d.retry_after_ns;
    assert!(retry > 0, "a denial must ask to wait: {d:?} at {now}");
    let mut at = before.clone();
    let later = at.decide(r, now + retry, cost);
    assert!(
        later.allowed,
        "{:?} cost {cost}: denied at {now} with retry {retry}, still denied at now+retry: {later:?}",
        r.algorithm
    );
    let mut early = before.clone();
    let sooner = early.decide(r, now + retry - 1, cost);
    assert!(
        !sooner.allowed,
        "{:?} cost {cost}: denied at {now} with retry {retry}, already admitted 1 ns earlier",
        r.algorithm
    );
}

/// Asserts that `after` means the same as `before` from `now` on. States are compared with `==`,
/// except that a sliding log may drop expired entries: its later decisions are compared instead.
fn assert_same_meaning(before: &BucketState, after: &BucketState, r: &Rule, now: u64) {
    match (before, after) {
        (BucketState::Log(_), BucketState::Log(_)) => {
            let p = r.period_ns;
            for dt in [0, 1, p / 3, p / 2, p - 1, p, p + 1, 2 * p] {
                for cost in 0..=r.capacity() {
                    let (mut a, mut b) = (before.clone(), after.clone());
                    assert_eq!(
                        a.decide(r, now + dt, cost),
                        b.decide(r, now + dt, cost),
                        "log decisions differ at now+{dt} cost {cost}"
                    );
                    assert_eq!(a.idle_at(), b.idle_at());
                }
            }
        }
        _ => assert_eq!(before, after, "state changed"),
    }
}

/// Asserts that `remaining` is exact: at the same instant, exactly that many checks of cost 1
/// are admitted on a copy of the state.
fn assert_remaining_exact(state: &BucketState, r: &Rule, now: u64, remaining: u64) {
    let mut s = state.clone();
    for i in 0..remaining {
        let d = s.decide(r, now, 1);
        assert!(d.allowed, "remaining said {remaining}, check {i} denied");
        assert_eq!(d.remaining, remaining - i - 1);
    }
    assert!(
        !s.decide(r, now, 1).allowed,
        "remaining said {remaining}, one more was admitted"
    );
}

const ALL: [Algorithm; 5] = Algorithm::ALL;

// ---------------------------------------------------------------------------------------------
// Behaviour common to every algorithm
// ---------------------------------------------------------------------------------------------

#[test]
fn every_algorithm_admits_on_a_fresh_bucket() {
    for alg in ALL {
        let r = rule_for(alg, 5, 1000);
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 1);
        assert!(d.allowed, "{alg}");
        assert_eq!(d.remaining, 4, "{alg}");
        assert_eq!(d.retry_after_ns, 0, "{alg}");
        assert!(d.reset_ns > T0, "{alg}");
    }
}

#[test]
fn every_algorithm_admits_its_capacity_at_once_then_denies() {
    for alg in ALL {
        let r = rule_for(alg, 7, 1000);
        let mut s = BucketState::fresh(&r);
        let d = admit_n(&mut s, &r, T0, 1, 7);
        assert_eq!(d.remaining, 0, "{alg}");
        let before = s.clone();
        let denied = s.decide(&r, T0, 1);
        assert!(!denied.allowed, "{alg}: admitted beyond its capacity");
        assert_eq!(denied.remaining, 0, "{alg}");
        assert!(denied.retry_after_ns > 0, "{alg}");
        assert_same_meaning(&before, &s, &r, T0);
        assert_retry_exact(&s, &r, T0, 1, &denied);
    }
}

#[test]
fn every_algorithm_recovers_fully_after_idle_at() {
    for alg in ALL {
        let r = rule_for(alg, 4, 1000);
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 4);
        let idle = s.idle_at();
        assert!(idle > T0, "{alg}: an exhausted bucket is limiting");
        // At `idle_at` the state decides exactly like a fresh one.
        let mut fresh = BucketState::fresh(&r);
        assert_eq!(
            s.clone().decide(&r, idle, 4),
            fresh.decide(&r, idle, 4),
            "{alg}"
        );
        admit_n(&mut s, &r, idle, 1, 4);
        assert!(!s.decide(&r, idle, 1).allowed, "{alg}");
    }
}

#[test]
fn a_cost_over_the_capacity_is_never_admitted_and_changes_nothing() {
    for alg in ALL {
        let r = rule_for(alg, 3, 1000);
        let mut s = BucketState::fresh(&r);
        let before = s.clone();
        let d = s.decide(&r, T0, 4);
        assert!(!d.allowed, "{alg}");
        assert_same_meaning(&before, &s, &r, T0);
    }
}

#[test]
fn a_peek_on_a_fresh_bucket_reports_full_and_changes_nothing() {
    for alg in ALL {
        let r = rule_for(alg, 5, 1000);
        let mut s = BucketState::fresh(&r);
        let before = s.clone();
        let d = s.decide(&r, T0, 0);
        assert!(d.allowed, "{alg}");
        assert_eq!(d.remaining, 5, "{alg}");
        assert_eq!(d.retry_after_ns, 0, "{alg}");
        assert_eq!(s, before, "{alg}: a peek changed a fresh state");
        // Peeking forever admits nothing: the full capacity is still there.
        for _ in 0..100 {
            s.decide(&r, T0, 0);
        }
        admit_n(&mut s, &r, T0, 5, 1);
    }
}

#[test]
fn a_state_of_another_algorithm_is_replaced_by_a_fresh_one() {
    // A reloaded rule may change algorithm; the old state must not leak into the new one.
    for old in ALL {
        let old_rule = rule_for(old, 2, 1000);
        let mut s = BucketState::fresh(&old_rule);
        admit_n(&mut s, &old_rule, T0, 1, 2);
        for new in ALL {
            let same_family = old.has_burst() && new.has_burst();
            if new == old || same_family {
                continue;
            }
            let r = rule_for(new, 3, 1000);
            let mut moved = s.clone();
            let d = moved.decide(&r, T0, 3);
            assert!(d.allowed, "{old} -> {new}: {d:?}");
            assert_eq!(moved, {
                let mut f = BucketState::fresh(&r);
                f.decide(&r, T0, 3);
                f
            });
        }
    }
}

#[test]
fn weight_is_one_except_for_sliding_logs() {
    for alg in ALL {
        let r = rule_for(alg, 1000, 1000);
        let expected = if alg == Algorithm::SlidingLog { 251 } else { 1 };
        assert_eq!(BucketState::fresh(&r).weight(), expected, "{alg}");
    }
    let r = rule_for(Algorithm::SlidingLog, 3, 1000);
    assert_eq!(BucketState::fresh(&r).weight(), 1);
    let r = rule_for(Algorithm::SlidingLog, MAX_SLIDING_LOG_LIMIT, 1000);
    assert_eq!(BucketState::fresh(&r).weight(), 2501);
}

#[test]
fn capacity_is_burst_for_buckets_and_limit_for_windows() {
    assert_eq!(rule(Algorithm::TokenBucket, 10, 1000, 3).capacity(), 3);
    assert_eq!(rule(Algorithm::LeakyBucket, 10, 1000, 30).capacity(), 30);
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        assert_eq!(rule_for(alg, 10, 1000).capacity(), 10);
    }
}

// ---------------------------------------------------------------------------------------------
// Token bucket
// ---------------------------------------------------------------------------------------------

mod token_bucket_tests {
    use super::*;

    /// 10 per second, burst 10: one token every 100 ms.
    fn r10() -> Rule {
        rule(Algorithm::TokenBucket, 10, 1000, 10)
    }

    #[test]
    fn emission_interval_is_rounded_up() {
        assert_eq!(token_bucket::emission_ns(&r10()), 100 * MS);
        // 1000 ms / 3 = 333 333 333.33 ns, rounded up so the rate is never above the rule's.
        let r = rule(Algorithm::TokenBucket, 3, 1000, 3);
        assert_eq!(token_bucket::emission_ns(&r), 333_333_334);
        let r = rule(Algorithm::TokenBucket, 1000, 1, 1000);
        assert_eq!(token_bucket::emission_ns(&r), MIN_EMISSION_NS);
    }

    #[test]
    fn fresh_bucket_is_full() {
        let r = r10();
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 1);
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 9,
                // Full again once the one token has refilled.
                reset_ns: T0 + 100 * MS,
                retry_after_ns: 0,
            }
        );
        assert_eq!(
            s,
            BucketState::Gcra {
                tat: T0 + 100 * MS,
                tag: token_bucket::tag(&r)
            }
        );
    }

    #[test]
    fn exhausted_bucket_denies_with_exact_retry() {
        let r = r10();
        let mut s = BucketState::fresh(&r);
        for i in 0..10 {
            let d = s.decide(&r, T0, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, 9 - i);
            assert_eq!(d.reset_ns, T0 + (i + 1) * 100 * MS);
        }
        let before = s.clone();
        let d = s.decide(&r, T0, 1);
        assert_eq!(
            d,
            Decision {
                allowed: false,
                remaining: 0,
                reset_ns: T0 + SEC,
                retry_after_ns: 100 * MS,
            }
        );
        assert_eq!(s, before, "a denial changed the state");
        // 1 ns short of the refill: still denied, and still one token away by 1 ns.
        let d = s.decide(&r, T0 + 100 * MS - 1, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 1);
        assert_eq!(s, before);
        assert!(s.decide(&r, T0 + 100 * MS, 1).allowed);
        assert!(!s.decide(&r, T0 + 100 * MS, 1).allowed);
    }

    #[test]
    fn refills_continuously_at_the_rate() {
        let r = r10();
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 10);
        // 350 ms later 3.5 tokens are back: 3 whole ones.
        let t = T0 + 350 * MS;
        assert_eq!(s.clone().decide(&r, t, 0).remaining, 3);
        admit_n(&mut s, &r, t, 1, 3);
        let d = s.decide(&r, t, 1);
        assert!(!d.allowed);
        // The half token already there counts: 50 ms to the next whole one.
        assert_eq!(d.retry_after_ns, 50 * MS);
        // Sustained: one every 100 ms, forever.
        let mut t = t + 50 * MS;
        for _ in 0..50 {
            assert!(s.decide(&r, t, 1).allowed);
            assert!(!s.decide(&r, t, 1).allowed);
            t += 100 * MS;
        }
    }

    #[test]
    fn never_holds_more_than_burst() {
        // 10 per second but a capacity of 4: an hour idle still gives only 4.
        let r = rule(Algorithm::TokenBucket, 10, 1000, 4);
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 4);
        assert!(!s.decide(&r, T0, 1).allowed);
        let t = T0 + 3600 * SEC;
        assert_eq!(s.clone().decide(&r, t, 0).remaining, 4);
        let d = admit_n(&mut s, &r, t, 1, 4);
        assert_eq!(d.remaining, 0);
        assert!(!s.decide(&r, t, 1).allowed);
    }

    #[test]
    fn burst_above_limit_allows_a_larger_first_burst() {
        let r = rule(Algorithm::TokenBucket, 10, 1000, 25);
        let mut s = BucketState::fresh(&r);
        let d = admit_n(&mut s, &r, T0, 1, 25);
        assert_eq!(d.reset_ns, T0 + 25 * 100 * MS);
        let d = s.decide(&r, T0, 1);
        assert!(!d.allowed);
        // The refill rate is still `limit / period`.
        assert_eq!(d.retry_after_ns, 100 * MS);
    }

    #[test]
    fn cost_above_one_takes_that_many_tokens() {
        let r = r10();
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 3);
        assert!(d.allowed);
        assert_eq!(d.remaining, 7);
        assert_eq!(d.reset_ns, T0 + 300 * MS);
        // 8 does not fit in 7: denied, 100 ms until the 8th token.
        let before = s.clone();
        let d = s.decide(&r, T0, 8);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 7);
        assert_eq!(d.retry_after_ns, 100 * MS);
        assert_eq!(s, before);
        assert_retry_exact(&s, &r, T0, 8, &d);
        // The whole capacity in one check, on a full bucket.
        let mut full = BucketState::fresh(&r);
        let d = full.decide(&r, T0, 10);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_ns, T0 + SEC);
    }

    #[test]
    fn peek_reports_without_taking() {
        let r = r10();
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 4);
        let before = s.clone();
        let d = s.decide(&r, T0 + 50 * MS, 0);
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 6,
                reset_ns: T0 + 400 * MS,
                retry_after_ns: 0,
            }
        );
        assert_eq!(s, before);
        // Empty: a peek answers whether one token is there, and when it will be.
        admit_n(&mut s, &r, T0, 1, 6);
        let before = s.clone();
        let d = s.decide(&r, T0 + 10 * MS, 0);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after_ns, 90 * MS);
        assert_eq!(s, before);
        assert_retry_exact(&s, &r, T0 + 10 * MS, 0, &d);
    }

    #[test]
    fn reset_is_when_the_bucket_is_full_again() {
        let r = r10();
        let mut s = BucketState::fresh(&r);
        let d = admit_n(&mut s, &r, T0, 1, 5);
        assert_eq!(d.reset_ns, T0 + 500 * MS);
        assert_eq!(s.idle_at(), d.reset_ns);
        // A peek on a full bucket: full now.
        let t = T0 + 10 * SEC;
        let d = s.decide(&r, t, 0);
        assert_eq!(d.reset_ns, t);
        assert_eq!(d.remaining, 10);
    }

    #[test]
    fn fractional_rate_never_admits_above_the_rule() {
        // 3 per second: emission 333 333 334 ns. Over 100 s at most burst + 300.
        let r = rule(Algorithm::TokenBucket, 3, 1000, 3);
        let mut s = BucketState::fresh(&r);
        let mut admitted = 0u64;
        let mut t = T0;
        while t <= T0 + 100 * SEC {
            if s.decide(&r, t, 1).allowed {
                admitted += 1;
            }
            t += MS;
        }
        assert!(admitted <= 3 + 300, "{admitted}");
        assert!(admitted >= 300, "{admitted}");
    }
}

// ---------------------------------------------------------------------------------------------
// Leaky bucket
// ---------------------------------------------------------------------------------------------

mod leaky_bucket_tests {
    use super::*;

    /// Capacity 5, leaking 10 per second (100 ms each).
    fn r() -> Rule {
        rule(Algorithm::LeakyBucket, 10, 1000, 5)
    }

    #[test]
    fn fresh_meter_is_empty_and_admits() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 4);
        // Drained empty again in 100 ms.
        assert_eq!(d.reset_ns, T0 + 100 * MS);
        let BucketState::Gcra { tat, .. } = s else {
            panic!("leaky bucket state is GCRA")
        };
        assert_eq!(leaky_bucket::level(tat, &r, T0), 1);
    }

    #[test]
    fn overflow_is_denied_and_drains_at_the_rate() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 5);
        let before = s.clone();
        let d = s.decide(&r, T0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 100 * MS);
        assert_eq!(d.reset_ns, T0 + 500 * MS);
        assert_eq!(s, before);
        assert_retry_exact(&s, &r, T0, 1, &d);
        let BucketState::Gcra { tat, .. } = s else {
            unreachable!()
        };
        assert_eq!(leaky_bucket::level(tat, &r, T0), 5);
        // Level rounds up: 150 ms drained 1.5 requests, 3.5 remain, reported as 4.
        assert_eq!(leaky_bucket::level(tat, &r, T0 + 150 * MS), 4);
        assert_eq!(leaky_bucket::level(tat, &r, T0 + 500 * MS), 0);
        assert_eq!(leaky_bucket::level(tat, &r, T0 + 600 * MS), 0);
        // After 250 ms, two whole requests fit.
        let t = T0 + 250 * MS;
        admit_n(&mut s, &r, t, 1, 2);
        let d = s.decide(&r, t, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 50 * MS);
    }

    #[test]
    fn never_holds_more_than_burst_and_cost_counts() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        let t = T0 + 7 * 24 * 3600 * SEC;
        let d = s.decide(&r, t, 5);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        let before = s.clone();
        let d = s.decide(&r, t + 150 * MS, 2);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(d.retry_after_ns, 50 * MS);
        assert_eq!(s, before);
        assert!(s.decide(&r, t + 200 * MS, 2).allowed);
    }

    #[test]
    fn peek_changes_nothing() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 5);
        let before = s.clone();
        let d = s.decide(&r, T0 + 30 * MS, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 70 * MS);
        assert_eq!(s, before);
    }

    #[test]
    fn meter_and_token_bucket_admit_the_same_sequences() {
        let leaky = rule(Algorithm::LeakyBucket, 7, 1300, 4);
        let token = rule(Algorithm::TokenBucket, 7, 1300, 4);
        let (mut a, mut b) = (BucketState::fresh(&leaky), BucketState::fresh(&token));
        let mut t = T0;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += x % (400 * MS);
            let cost = x % 5;
            assert_eq!(a.decide(&leaky, t, cost), b.decide(&token, t, cost));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed window
// ---------------------------------------------------------------------------------------------

mod fixed_window_tests {
    use super::*;

    fn r() -> Rule {
        rule_for(Algorithm::FixedWindow, 5, 1000)
    }

    #[test]
    fn fresh_window_admits_and_resets_at_the_aligned_end() {
        let r = r();
        let start = window_start(T0, SEC);
        assert_eq!(start, 1_700_000_000 * SEC);
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 1);
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 4,
                reset_ns: start + SEC,
                retry_after_ns: 0,
            }
        );
        assert_eq!(
            s,
            BucketState::Fixed {
                end: start + SEC,
                count: 1,
                period_tag: period_tag(&r),
            }
        );
    }

    #[test]
    fn exhausted_window_denies_until_the_next_window() {
        let r = r();
        let end = window_start(T0, SEC) + SEC;
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 5);
        let before = s.clone();
        let d = s.decide(&r, T0, 1);
        assert_eq!(
            d,
            Decision {
                allowed: false,
                remaining: 0,
                reset_ns: end,
                retry_after_ns: end - T0,
            }
        );
        assert_eq!(s, before);
        // The last nanosecond of the window is still in it.
        let d = s.decide(&r, end - 1, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 1);
        assert_eq!(s, before);
        // The next window starts empty: a full limit again.
        let d = admit_n(&mut s, &r, end, 1, 5);
        assert_eq!(d.reset_ns, end + SEC);
        assert!(!s.decide(&r, end, 1).allowed);
    }

    #[test]
    fn windows_are_aligned_to_the_epoch_not_to_the_first_request() {
        for period_ms in [250, 1000, 10_000, 60_000, 3_600_000, 86_400_000] {
            let r = rule_for(Algorithm::FixedWindow, 3, period_ms);
            let p = period_ms * MS;
            let mut s = BucketState::fresh(&r);
            let d = s.decide(&r, T0, 1);
            assert_eq!(d.reset_ns % p, 0, "{period_ms} ms");
            assert!(d.reset_ns > T0 && d.reset_ns - T0 <= p);
            assert_eq!(d.reset_ns, window_start(T0, p) + p);
        }
    }

    #[test]
    fn the_boundary_burst_is_two_limits_in_two_nanoseconds() {
        // The known weakness of fixed windows: a full window at its end, another at the start
        // of the next. Each aligned window still admits only `limit`.
        let r = r();
        let end = window_start(T0, SEC) + SEC;
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, end - 1, 1, 5);
        assert!(!s.decide(&r, end - 1, 1).allowed);
        admit_n(&mut s, &r, end, 1, 5);
        assert!(!s.decide(&r, end, 1).allowed);
    }

    #[test]
    fn an_old_window_counts_nothing() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 5);
        let t = T0 + 17 * SEC + 3;
        let d = s.clone().decide(&r, t, 0);
        assert_eq!(d.remaining, 5);
        assert_eq!(d.reset_ns, window_start(t, SEC) + SEC);
        admit_n(&mut s, &r, t, 1, 5);
    }

    #[test]
    fn cost_above_one() {
        let r = r();
        let end = window_start(T0, SEC) + SEC;
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 3);
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
        let before = s.clone();
        let d = s.decide(&r, T0, 3);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 2);
        assert_eq!(d.retry_after_ns, end - T0);
        assert_eq!(s, before);
        assert_retry_exact(&s, &r, T0, 3, &d);
        assert!(s.decide(&r, T0, 2).allowed);
        let mut full = BucketState::fresh(&r);
        assert_eq!(full.decide(&r, T0, 5).remaining, 0);
    }

    #[test]
    fn peek_changes_nothing() {
        let r = r();
        let end = window_start(T0, SEC) + SEC;
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 2);
        let before = s.clone();
        let d = s.decide(&r, T0 + MS, 0);
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 3,
                reset_ns: end,
                retry_after_ns: 0,
            }
        );
        assert_eq!(s, before);
        admit_n(&mut s, &r, T0, 1, 3);
        let before = s.clone();
        let d = s.decide(&r, T0 + MS, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, end - T0 - MS);
        assert_eq!(s, before);
        // A peek in a later window does not roll the stored state either.
        let d = s.decide(&r, end + 5, 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 5);
        assert_eq!(s, before);
    }
}

// ---------------------------------------------------------------------------------------------
// Sliding window
// ---------------------------------------------------------------------------------------------

mod sliding_window_tests {
    use super::*;

    /// 10 per second.
    fn r() -> Rule {
        rule_for(Algorithm::SlidingWindow, 10, 1000)
    }

    #[test]
    fn fresh_window_admits() {
        let r = r();
        let end = window_start(T0, SEC) + SEC;
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 1);
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 9,
                // The count matters until the window after this one ends.
                reset_ns: end + SEC,
                retry_after_ns: 0,
            }
        );
        assert_eq!(
            s,
            BucketState::Sliding {
                until: end + SEC,
                current: 1,
                previous: 0,
                period_tag: sliding_window::period_tag(&r),
            }
        );
    }

    #[test]
    fn full_current_window_denies_until_the_weight_has_slid_enough() {
        let r = r();
        let start = window_start(T0, SEC);
        let end = start + SEC;
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, start, 1, 10);
        let before = s.clone();
        let d = s.decide(&r, start + 300 * MS, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_ns, end + SEC);
        // Next window: 10·(1 − f) + 1 <= 10 once f >= 0.1, i.e. 100 ms into it.
        assert_eq!(d.retry_after_ns, end + 100 * MS - (start + 300 * MS));
        assert_eq!(s, before);
        assert_retry_exact(&s, &r, start + 300 * MS, 1, &d);
        assert!(!s.decide(&r, end, 1).allowed);
        assert!(!s.decide(&r, end + 100 * MS - 1, 1).allowed);
        assert_eq!(s, before);
        assert!(s.decide(&r, end + 100 * MS, 1).allowed);
    }

    #[test]
    fn previous_window_weighs_in_proportion_to_its_overlap() {
        let r = r();
        let start = window_start(T0, SEC);
        let next = start + SEC;
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, start, 1, 10);
        // Halfway into the next window the estimate is 10 · 0.5 = 5.
        let half = next + 500 * MS;
        assert_eq!(s.clone().decide(&r, half, 0).remaining, 5);
        admit_n(&mut s, &r, half, 1, 5);
        let d = s.decide(&r, half, 1);
        assert!(!d.allowed);
        // 10·(1 − f) + 5 + 1 <= 10 once f >= 0.6.
        assert_eq!(d.retry_after_ns, 100 * MS);
        assert_eq!(d.reset_ns, next + 2 * SEC);
        assert_retry_exact(&s, &r, half, 1, &d);
        // A quarter of the way in, the estimate was 7.5: 2 whole requests of room.
        let mut q = BucketState::fresh(&r);
        admit_n(&mut q, &r, start, 1, 10);
        let d = q.decide(&r, next + 250 * MS, 0);
        assert_eq!(d.remaining, 2);
        // Only the previous window counts: it has slid out entirely when this window ends.
        assert_eq!(d.reset_ns, next + SEC);
    }

    #[test]
    fn two_windows_later_everything_is_forgotten() {
        let r = r();
        let start = window_start(T0, SEC);
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, start + 999 * MS, 1, 10);
        assert_eq!(s.idle_at(), start + 2 * SEC);
        let t = start + 2 * SEC;
        let d = s.clone().decide(&r, t, 0);
        assert_eq!(d.remaining, 10);
        assert_eq!(d.reset_ns, t);
        admit_n(&mut s, &r, t, 1, 10);
        assert!(!s.decide(&r, t, 1).allowed);
    }

    #[test]
    fn the_previous_window_weighs_until_its_last_nanosecond() {
        let r = r();
        let start = window_start(T0, SEC);
        let mut s = BucketState::fresh(&r);
        // A full window, all at its very end.
        admit_n(&mut s, &r, start + SEC - 1, 1, 10);
        // At the start of the next window the previous weighs fully.
        let d = s.decide(&r, start + SEC, 1);
        assert!(!d.allowed);
        assert_retry_exact(&s, &r, start + SEC, 1, &d);
        // At its last nanosecond the previous weighs 10 · 1 ns / 1 s: room for 9, not 10.
        let t = start + 2 * SEC - 1;
        let d = admit_n(&mut s, &r, t, 1, 9);
        assert_eq!(d.remaining, 0);
        assert!(!s.decide(&r, t, 1).allowed);
        // So 19 were admitted within 1 s + 1 ns: the weighted counter's limit·(1 + f) bound,
        // yet each aligned window admitted at most 10. The next window sees those 9 in full.
        assert_eq!(s.clone().decide(&r, start + 2 * SEC, 0).remaining, 1);
        assert_eq!(s.decide(&r, start + 3 * SEC, 0).remaining, 10);
    }

    #[test]
    fn cost_above_one() {
        let r = r();
        let start = window_start(T0, SEC);
        let next = start + SEC;
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, start + 100 * MS, 4);
        assert!(d.allowed);
        assert_eq!(d.remaining, 6);
        admit_n(&mut s, &r, start + 200 * MS, 3, 2);
        let before = s.clone();
        let d = s.decide(&r, start + 300 * MS, 5);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(s, before);
        // Next window: 10·(1 − f) + 5 <= 10 once f >= 0.5.
        assert_eq!(d.retry_after_ns, next + 500 * MS - (start + 300 * MS));
        assert_retry_exact(&s, &r, start + 300 * MS, 5, &d);
    }

    #[test]
    fn peek_changes_nothing() {
        let r = r();
        let start = window_start(T0, SEC);
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, start + 100 * MS, 1, 6);
        let before = s.clone();
        for t in [start + 200 * MS, start + SEC + 1, start + 3 * SEC] {
            s.decide(&r, t, 0);
            assert_eq!(s, before, "peek at {t} changed the state");
        }
        admit_n(&mut s, &r, start + 100 * MS, 1, 4);
        let before = s.clone();
        let d = s.decide(&r, start + SEC + 50 * MS, 0);
        assert!(!d.allowed);
        // 10·(1 − f) + 1 <= 10 once f >= 0.1.
        assert_eq!(d.retry_after_ns, 50 * MS);
        assert_eq!(s, before);
        assert_retry_exact(&s, &r, start + SEC + 50 * MS, 0, &d);
    }

    #[test]
    fn a_denial_in_a_later_window_does_not_roll_the_state() {
        let r = r();
        let start = window_start(T0, SEC);
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, start, 1, 10);
        let before = s.clone();
        assert!(!s.decide(&r, start + SEC + 50 * MS, 1).allowed);
        assert_eq!(s, before);
    }
}

// ---------------------------------------------------------------------------------------------
// Sliding log
// ---------------------------------------------------------------------------------------------

mod sliding_log_tests {
    use super::*;

    /// 3 per second, exact.
    fn r() -> Rule {
        rule_for(Algorithm::SlidingLog, 3, 1000)
    }

    #[test]
    fn fresh_log_admits() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, T0, 1);
        assert_eq!(
            d,
            Decision {
                allowed: true,
                remaining: 2,
                reset_ns: T0 + SEC,
                retry_after_ns: 0,
            }
        );
        assert_eq!(s.idle_at(), T0 + SEC);
    }

    #[test]
    fn full_log_denies_until_the_oldest_entry_expires() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        for i in 0..3 {
            assert!(s.decide(&r, T0 + i * 100 * MS, 1).allowed);
        }
        let now = T0 + 300 * MS;
        let before = s.clone();
        let d = s.decide(&r, now, 1);
        assert_eq!(
            d,
            Decision {
                allowed: false,
                remaining: 0,
                reset_ns: T0 + 200 * MS + SEC,
                retry_after_ns: 700 * MS,
            }
        );
        assert_same_meaning(&before, &s, &r, now);
        assert_retry_exact(&s, &r, now, 1, &d);
        // An entry at t counts for [t, t + period): still counted at t + period − 1.
        assert!(!s.decide(&r, T0 + SEC - 1, 1).allowed);
        assert!(s.decide(&r, T0 + SEC, 1).allowed);
        let d = s.decide(&r, T0 + SEC, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 100 * MS);
    }

    #[test]
    fn cost_above_one_waits_for_enough_expiries() {
        let r = rule_for(Algorithm::SlidingLog, 5, 1000);
        let mut s = BucketState::fresh(&r);
        assert!(s.decide(&r, T0, 1).allowed);
        assert!(s.decide(&r, T0 + 100 * MS, 2).allowed);
        assert!(s.decide(&r, T0 + 200 * MS, 2).allowed);
        let now = T0 + 300 * MS;
        let d = s.decide(&r, now, 3);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        // Needs the first two entries (1 + 2) gone: at T0 + 100 ms + 1 s.
        assert_eq!(d.retry_after_ns, T0 + 100 * MS + SEC - now);
        assert_retry_exact(&s, &r, now, 3, &d);
        let d = s.decide(&r, now, 5);
        assert_eq!(d.retry_after_ns, T0 + 200 * MS + SEC - now);
        assert_retry_exact(&s, &r, now, 5, &d);
    }

    #[test]
    fn same_instant_requests_share_an_entry_and_expire_together() {
        let r = rule_for(Algorithm::SlidingLog, 100, 1000);
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 60);
        admit_n(&mut s, &r, T0 + 1, 2, 20);
        assert!(!s.decide(&r, T0 + 2, 1).allowed);
        let BucketState::Log(log) = &s else {
            panic!("sliding log state")
        };
        assert_eq!(log.max_entries(), 100);
        assert_eq!(log.idle_at(), T0 + 1 + SEC);
        // The 60 made at T0 expire together, one period later, and not a nanosecond before.
        assert!(!s.decide(&r, T0 + SEC - 1, 1).allowed);
        let d = s.decide(&r, T0 + SEC, 60);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert!(!s.decide(&r, T0 + SEC, 1).allowed);
        // Then the 40 made at T0 + 1.
        let d = admit_n(&mut s, &r, T0 + SEC + 1, 1, 40);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn peek_never_changes_what_the_log_decides() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        admit_n(&mut s, &r, T0, 1, 2);
        let before = s.clone();
        let d = s.decide(&r, T0 + 10 * MS, 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(d.reset_ns, T0 + SEC);
        assert_same_meaning(&before, &s, &r, T0 + 10 * MS);
        admit_n(&mut s, &r, T0 + 20 * MS, 1, 1);
        let before = s.clone();
        let d = s.decide(&r, T0 + 30 * MS, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, SEC - 30 * MS);
        assert_same_meaning(&before, &s, &r, T0 + 30 * MS);
        // A peek after everything expired prunes the log but still admits nothing.
        let t = T0 + 5 * SEC;
        let d = s.decide(&r, t, 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 3);
        assert_eq!(d.reset_ns, t);
        admit_n(&mut s, &r, t, 1, 3);
        assert!(!s.decide(&r, t, 1).allowed);
    }

    #[test]
    fn no_span_of_one_period_admits_more_than_limit() {
        let r = r();
        let mut s = BucketState::fresh(&r);
        // One request every 100 ms for 10 s: exactly 3 per second.
        let mut admitted = Vec::new();
        for i in 0..100 {
            let t = T0 + i * 100 * MS;
            if s.decide(&r, t, 1).allowed {
                admitted.push(t);
            }
        }
        assert_eq!(admitted.len(), 30);
        for (i, &t) in admitted.iter().enumerate() {
            let in_span = admitted[i..].iter().take_while(|&&u| u < t + SEC).count();
            assert!(in_span <= 3);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

/// A small random valid rule: any algorithm, limit 1..=8, period 1 ms..=2 s, burst 1..=12 for
/// the buckets (the window algorithms get `burst = limit`).
fn arb_rule() -> impl Strategy<Value = Rule> {
    (
        prop::sample::select(ALL.to_vec()),
        1u64..=8,
        prop_oneof![1u64..=20, 21u64..=2000, Just(1000u64), Just(250u64)],
        1u64..=12,
    )
        .prop_map(|(alg, limit, period_ms, burst)| {
            let burst = if alg.has_burst() { burst } else { limit };
            rule(alg, limit, period_ms, burst)
        })
}

/// One arrival: a time gap (0..2 periods, with extra weight on 0, tiny gaps and whole
/// milliseconds so boundaries are hit) and a cost seed (mapped to 1..=capacity, or 0 for peeks).
#[derive(Debug, Clone, Copy)]
struct Arrival {
    gap_kind: u8,
    gap_raw: u64,
    cost_raw: u64,
    peek: bool,
}

fn arb_arrivals(max: usize) -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (
            0u8..4,
            any::<u64>(),
            any::<u64>(),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(gap_kind, gap_raw, cost_raw, peek)| Arrival {
                gap_kind,
                gap_raw,
                cost_raw,
                peek,
            }),
        1..max,
    )
}

impl Arrival {
    fn gap(&self, p: u64) -> u64 {
        match self.gap_kind {
            0 => 0,
            1 => self.gap_raw % 1000,
            2 => (self.gap_raw % (2 * p / MS + 1)) * MS % (2 * p),
            _ => self.gap_raw % (2 * p),
        }
    }

    fn cost(&self, r: &Rule) -> u64 {
        1 + self.cost_raw % r.capacity()
    }
}

/// A start time: T0 shifted by up to a period, sometimes exactly onto a window boundary.
fn start_time(offset: u64, aligned: bool, p: u64) -> u64 {
    let base = window_start(T0, p) + p;
    if aligned { base } else { base + offset % p }
}

/// Runs the arrivals (peeks included) and returns the admitted `(time, cost)`s, checking on
/// every step the properties that hold for a single decision.
fn run(r: &Rule, start: u64, arrivals: &[Arrival]) -> Vec<(u64, u64)> {
    let p = r.period_ns;
    let mut s = BucketState::fresh(r);
    let mut now = start;
    let mut admitted = Vec::new();
    for a in arrivals {
        now += a.gap(p);
        let cost = if a.peek { 0 } else { a.cost(r) };
        let before = s.clone();
        let d = s.decide(r, now, cost);

        // remaining is exact, before and after.
        assert_remaining_exact(&s, r, now, d.remaining);
        assert!(d.remaining <= r.capacity());

        // reset_ns.
        if r.algorithm == Algorithm::FixedWindow {
            assert_eq!(d.reset_ns, window_start(now, p) + p);
        } else {
            assert_eq!(d.reset_ns, s.idle_at().max(now), "{d:?}");
        }

        if d.allowed && cost > 0 {
            assert_eq!(d.retry_after_ns, 0);
            assert_eq!(d.reset_ns, s.idle_at());
            admitted.push((now, cost));
        } else {
            // A denial or a peek changes nothing that matters.
            assert_same_meaning(&before, &s, r, now);
            if d.allowed {
                assert_eq!(d.retry_after_ns, 0);
            } else {
                assert_retry_exact(&before, r, now, cost, &d);
            }
        }
    }
    admitted
}

/// Admitted `(time, cost)`s in time order, with prefix sums for interval totals.
struct Admitted {
    times: Vec<u64>,
    /// `prefix[i]` = total cost of the first `i` admissions.
    prefix: Vec<u64>,
}

impl Admitted {
    fn new(admitted: &[(u64, u64)]) -> Self {
        let times: Vec<u64> = admitted.iter().map(|&(t, _)| t).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        let mut prefix = vec![0];
        for &(_, c) in admitted {
            prefix.push(prefix.last().copied().unwrap_or(0) + c);
        }
        Self { times, prefix }
    }

    /// Total cost admitted at times in `[from, to)`.
    fn half_open(&self, from: u64, to: u64) -> u64 {
        let lo = self.times.partition_point(|&t| t < from);
        let hi = self.times.partition_point(|&t| t < to);
        self.prefix[hi.max(lo)] - self.prefix[lo]
    }

    /// Total cost admitted at times in `[from, to]`.
    fn closed(&self, from: u64, to: u64) -> u64 {
        self.half_open(from, to.saturating_add(1))
    }

    /// The interesting starts of one-period spans: every admission time, and the start of the
    /// span that ends just after each admission.
    fn span_starts(&self, p: u64) -> impl Iterator<Item = u64> + '_ {
        self.times
            .iter()
            .copied()
            .chain(self.times.iter().map(move |&t| (t + 1).saturating_sub(p)))
    }
}

/// Per aligned window of `p`: the admitted total.
fn per_window(admitted: &[(u64, u64)], p: u64) -> std::collections::BTreeMap<u64, u64> {
    let mut m = std::collections::BTreeMap::new();
    for &(t, c) in admitted {
        *m.entry(t / p).or_insert(0) += c;
    }
    m
}

fn check_bounds(r: &Rule, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let p = r.period_ns;
    let a = Admitted::new(admitted);
    match r.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            // Over any closed interval [x, y]: at most burst + ceil((y − x) / T), T the emission
            // interval (rounded up, so the rate is rounded down and this holds). The interval
            // endpoints that matter are admission times.
            let t_ns = token_bucket::emission_ns(r);
            for (i, &x) in a.times.iter().enumerate() {
                for &y in &a.times[i..] {
                    let got = a.closed(x, y);
                    let bound = r.burst + (y - x).div_ceil(t_ns);
                    prop_assert!(
                        got <= bound,
                        "{} admitted in [{}, {}], bound {} ({:?})",
                        got,
                        x,
                        y,
                        bound,
                        r
                    );
                }
            }
        }
        Algorithm::FixedWindow => {
            for (w, n) in per_window(admitted, p) {
                prop_assert!(n <= r.limit, "window {} admitted {} ({:?})", w, n, r);
            }
        }
        Algorithm::SlidingWindow => {
            let windows = per_window(admitted, p);
            for (&w, &n) in &windows {
                prop_assert!(n <= r.limit, "window {} admitted {} ({:?})", w, n, r);
            }
            // Any half-open span of one period: at most 2·limit, since it meets two aligned
            // windows. The weighted counter's true bound is limit·(1 + f), f the fraction of the
            // span in the later window: the estimate assumes the earlier window's hits were
            // spread evenly, while they may all sit at its end. Precisely, for a span starting
            // x ns into window k, whose total is C_k: admitted · p <= limit · p + C_k · x.
            for from in a.span_starts(p) {
                let got = a.half_open(from, from + p);
                prop_assert!(got <= 2 * r.limit, "{} in [{}, +p) ({:?})", got, from, r);
                let c_k = windows.get(&(from / p)).copied().unwrap_or(0);
                let x = from % p;
                prop_assert!(
                    u128::from(got) * u128::from(p)
                        <= u128::from(r.limit) * u128::from(p) + u128::from(c_k) * u128::from(x),
                    "{} in [{}, +p): beyond limit·(1 + f) with C_k {}, x {} ({:?})",
                    got,
                    from,
                    c_k,
                    x,
                    r
                );
            }
        }
        Algorithm::SlidingLog => {
            for from in a.span_starts(p) {
                let got = a.half_open(from, from + p);
                prop_assert!(got <= r.limit, "{} in [{}, +p) ({:?})", got, from, r);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random arrivals never exceed each algorithm's bound over any interval.
    #[test]
    fn admitted_traffic_respects_the_bound(
        r in arb_rule(),
        arrivals in arb_arrivals(80),
        offset in any::<u64>(),
        aligned in prop::bool::weighted(0.2),
    ) {
        let start = start_time(offset, aligned, r.period_ns);
        let admitted = run(&r, start, &arrivals);
        check_bounds(&r, &admitted)?;
    }

    /// Saturating traffic (every gap tiny) still respects the bound, and admits something.
    #[test]
    fn saturating_traffic_respects_the_bound(
        r in arb_rule(),
        gaps in prop::collection::vec(0u64..50_000_000, 1..120),
        offset in any::<u64>(),
    ) {
        let start = start_time(offset, false, r.period_ns);
        let arrivals: Vec<_> = gaps
            .iter()
            .map(|&g| Arrival { gap_kind: 3, gap_raw: g, cost_raw: 0, peek: false })
            .collect();
        let admitted = run(&r, start, &arrivals);
        prop_assert!(!admitted.is_empty());
        check_bounds(&r, &admitted)?;
    }

    /// From any reachable state, a denial's retry_after is exact for every cost: admitted at
    /// now + r, denied at now + r − 1 (with no other traffic).
    #[test]
    fn retry_after_is_exact_from_random_states(
        r in arb_rule(),
        arrivals in arb_arrivals(40),
        offset in any::<u64>(),
        probe_gap in any::<u64>(),
    ) {
        let start = start_time(offset, false, r.period_ns);
        let mut s = BucketState::fresh(&r);
        let mut now = start;
        for a in &arrivals {
            now += a.gap(r.period_ns);
            s.decide(&r, now, a.cost(&r));
        }
        let now = now + probe_gap % (r.period_ns / 2 + 1);
        for cost in 0..=r.capacity() {
            let before = s.clone();
            let d = s.clone().decide(&r, now, cost);
            if d.allowed {
                prop_assert_eq!(d.retry_after_ns, 0);
            } else {
                assert_retry_exact(&before, &r, now, cost, &d);
            }
        }
    }

    /// From `idle_at()` on, a state decides exactly like a fresh one (what the store relies on to
    /// tell idle evictions from limiting ones).
    #[test]
    fn at_idle_at_a_state_is_as_good_as_fresh(
        r in arb_rule(),
        arrivals in arb_arrivals(40),
        offset in any::<u64>(),
        extra in 0u64..3,
    ) {
        let start = start_time(offset, false, r.period_ns);
        let mut s = BucketState::fresh(&r);
        let mut now = start;
        for a in &arrivals {
            now += a.gap(r.period_ns);
            s.decide(&r, now, a.cost(&r));
        }
        let at = s.idle_at().max(now) + extra * r.period_ns / 2;
        for cost in 0..=r.capacity() {
            let mut fresh = BucketState::fresh(&r);
            prop_assert_eq!(s.clone().decide(&r, at, cost), fresh.decide(&r, at, cost));
        }
    }
}

mod absorb {
    use super::super::test_support::{MS, SEC, T0, rule};
    use super::super::*;

    /// Admits `n` checks of cost 1 at `now` on `state`.
    fn spend(state: &mut BucketState, r: &Rule, now: u64, n: u64) {
        for _ in 0..n {
            assert!(state.decide(r, now, 1).allowed);
        }
    }

    #[test]
    fn merged_buckets_keep_both_sides_consumption() {
        for algo in Algorithm::ALL {
            let r = rule(algo, 10, 60_000, 10);
            let (mut a, mut b) = (BucketState::fresh(&r), BucketState::fresh(&r));
            spend(&mut a, &r, T0, 4);
            spend(&mut b, &r, T0 + MS, 3);
            a.absorb(b, T0 + 2 * MS);
            let d = a.decide(&r, T0 + 2 * MS, 0);
            assert_eq!(d.remaining, 3, "{algo}: 10 - 4 - 3");
        }
    }

    #[test]
    fn a_later_window_wins_over_an_older_one() {
        let r = rule(Algorithm::FixedWindow, 10, 1_000, 10);
        let (mut old, mut new) = (BucketState::fresh(&r), BucketState::fresh(&r));
        spend(&mut old, &r, T0, 9);
        spend(&mut new, &r, T0 + 2 * SEC, 2);
        old.absorb(new, T0 + 2 * SEC);
        assert_eq!(old.decide(&r, T0 + 2 * SEC, 0).remaining, 8);
    }

    #[test]
    fn two_readings_of_one_history_overlap_to_the_larger() {
        for algo in Algorithm::ALL {
            let r = rule(algo, 10, 60_000, 10);
            let mut copy = BucketState::fresh(&r);
            spend(&mut copy, &r, T0, 4);
            let mut later = copy.clone();
            spend(&mut later, &r, T0 + MS, 2);
            let mut a = copy.clone();
            a.overlap(later.clone());
            assert_eq!(a.decide(&r, T0 + 2 * MS, 0).remaining, 4, "{algo}: 10 - 6");
            later.overlap(copy);
            assert_eq!(later.decide(&r, T0 + 2 * MS, 0).remaining, 4, "{algo}");
        }
    }

    #[test]
    fn different_algorithms_are_not_mixed() {
        let tb = rule(Algorithm::TokenBucket, 10, 1_000, 10);
        let fw = rule(Algorithm::FixedWindow, 10, 1_000, 10);
        let mut a = BucketState::fresh(&tb);
        spend(&mut a, &tb, T0, 2);
        let before = a.clone();
        let mut b = BucketState::fresh(&fw);
        spend(&mut b, &fw, T0, 5);
        a.absorb(b, T0);
        assert_eq!(a, before);
    }
}

mod wire {
    use super::*;
    use ringlimit_proto::peer::WireState;

    #[test]
    fn states_survive_the_wire() {
        let log = SlidingLog::from_entries(10, [(5, 1), (3, 2)]);
        for st in [
            // The rule's tags do not travel: a received state is taken as written under the
            // receiver's rule, and fitted by its windows.
            BucketState::Gcra { tat: 42, tag: 0 },
            BucketState::Fixed {
                end: 9,
                count: 3,
                period_tag: 0,
            },
            BucketState::Sliding {
                until: 7,
                current: 1,
                previous: 2,
                period_tag: 0,
            },
            BucketState::Log(Box::new(log)),
        ] {
            assert_eq!(BucketState::from_wire(st.to_wire()), st);
        }
    }

    #[test]
    fn a_hostile_log_is_capped() {
        let entries: Vec<(u64, u32)> = (0..20_000).map(|t| (t, 1)).collect();
        let st = BucketState::from_wire(WireState::Log {
            entries,
            max_entries: u64::MAX,
        });
        let BucketState::Log(log) = st else {
            panic!("not a log")
        };
        assert_eq!(log.max_entries(), MAX_SLIDING_LOG_LIMIT);
        assert_eq!(log.entries().count() as u64, MAX_SLIDING_LOG_LIMIT);
    }
}

// ---------------------------------------------------------------------------------------------
// Refunds (all-or-nothing requests give back what they took when another limit denies)
// ---------------------------------------------------------------------------------------------

/// The mark of an admission decided at `at`.
fn mark(d: &Decision, at: u64) -> Mark {
    Mark {
        reset_ns: d.reset_ns,
        at_ns: at,
    }
}

/// The state after `arrivals` from `start`, and the time of the last one.
fn state_after(r: &Rule, start: u64, arrivals: &[Arrival]) -> (BucketState, u64) {
    let mut s = BucketState::fresh(r);
    let mut now = start;
    for a in arrivals {
        now += a.gap(r.period_ns);
        let cost = if a.peek { 0 } else { a.cost(r) };
        s.decide(r, now, cost);
    }
    (s, now)
}

/// Runs `arrivals` where an admission marked held is given back `delay` arrivals later (or at
/// the end), at that arrival's time, with other traffic in between: the admissions that stand.
fn run_with_refunds(r: &Rule, start: u64, arrivals: &[(Arrival, bool, u8)]) -> Vec<(u64, u64)> {
    let mut s = BucketState::fresh(r);
    let mut now = start;
    // (due at arrival index, admission time, cost, mark)
    let mut held: Vec<(usize, u64, u64, Mark)> = Vec::new();
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let give_back =
        |s: &mut BucketState, admitted: &mut Vec<(u64, u64)>, h: (usize, u64, u64, Mark), now| {
            s.refund(r, h.2, h.3, now);
            let at = admitted
                .iter()
                .position(|&a| a == (h.1, h.2))
                .expect("a held admission stands until given back");
            admitted.remove(at);
        };
    for (i, (a, hold, delay)) in arrivals.iter().enumerate() {
        now += a.gap(r.period_ns);
        while let Some(k) = held.iter().position(|h| h.0 <= i) {
            let h = held.remove(k);
            give_back(&mut s, &mut admitted, h, now);
        }
        let cost = if a.peek { 0 } else { a.cost(r) };
        let d = s.decide(r, now, cost);
        if d.allowed && cost > 0 {
            admitted.push((now, cost));
            if *hold {
                held.push((i + 1 + usize::from(*delay % 4), now, cost, mark(&d, now)));
            }
        }
    }
    for h in held {
        give_back(&mut s, &mut admitted, h, now);
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Alone, a refund is exact: after an admission given back, the state decides every later
    /// check exactly as the state that never saw it — for the windowed algorithms whenever it
    /// is given back, for the GCRA ones when given back at the admission's instant (as an
    /// owner does with its own group; later, they keep the refill in between).
    #[test]
    fn every_algorithm_refund_is_exact_when_alone(
        r in arb_rule(),
        history in arb_arrivals(30),
        offset in any::<u64>(),
        admit_gap in any::<u64>(),
        cost_raw in any::<u64>(),
        refund_gap in any::<u64>(),
        later in arb_arrivals(30),
    ) {
        let start = start_time(offset, false, r.period_ns);
        let (s0, last) = state_after(&r, start, &history);
        let t_r = last + admit_gap % (2 * r.period_ns);
        let cost = 1 + cost_raw % r.capacity();
        let mut s1 = s0.clone();
        let mut d = s1.decide(&r, t_r, cost);
        let mut cost = cost;
        if !d.allowed {
            // A smaller cost, else a full bucket: a refund needs an admission.
            cost = 1;
            d = s1.decide(&r, t_r, cost);
            if !d.allowed {
                return Ok(());
            }
        }
        let t_f = if r.algorithm.has_burst() {
            t_r
        } else {
            t_r + refund_gap % (2 * r.period_ns + 1)
        };
        s1.refund(&r, cost, mark(&d, t_r), t_f);
        let (mut never, mut refunded) = (s0, s1);
        let mut now = t_f;
        for a in &later {
            now += a.gap(r.period_ns);
            let cost = if a.peek { 0 } else { a.cost(&r) };
            prop_assert_eq!(
                refunded.decide(&r, now, cost),
                never.decide(&r, now, cost),
                "at {} cost {} ({:?})", now, cost, r
            );
        }
    }

    /// With other traffic between an admission and its refund, the admissions that stand
    /// still respect every algorithm's bound: a refund is never more generous than had the
    /// admission never come.
    #[test]
    fn every_algorithm_refund_never_over_admits_under_interleaving(
        r in arb_rule(),
        arrivals in prop::collection::vec(
            (arb_arrivals(2), prop::bool::weighted(0.4), any::<u8>()),
            1..80,
        ),
        offset in any::<u64>(),
    ) {
        let start = start_time(offset, false, r.period_ns);
        let arrivals: Vec<(Arrival, bool, u8)> =
            arrivals.into_iter().map(|(a, hold, delay)| (a[0], hold, delay)).collect();
        let standing = run_with_refunds(&r, start, &arrivals);
        check_bounds(&r, &standing)?;
    }
}

#[test]
fn refunds_give_back_exactly_what_was_taken() {
    let now = T0;
    // Token bucket: 3 of a burst of 5 taken and given back at once: 5 left again.
    let tb = rule(Algorithm::TokenBucket, 5, 1000, 5);
    let mut s = BucketState::fresh(&tb);
    let d = s.decide(&tb, now, 3);
    assert_eq!(d.remaining, 2);
    s.refund(&tb, 3, mark(&d, now), now);
    assert_eq!(s.decide(&tb, now, 0).remaining, 5);

    // Fixed window: a refund after the window rolled changes nothing.
    let fw = rule_for(Algorithm::FixedWindow, 4, 1000);
    let mut s = BucketState::fresh(&fw);
    let start = window_start(now, fw.period_ns);
    let d = s.decide(&fw, start, 2);
    s.refund(&fw, 2, mark(&d, start), start + 100 * MS);
    assert_eq!(
        s.decide(&fw, start + 500 * MS, 0).remaining,
        4,
        "same window: given back"
    );
    let mut s = BucketState::fresh(&fw);
    let d = s.decide(&fw, start, 2);
    s.decide(&fw, start + SEC, 1);
    let before = s.clone();
    s.refund(&fw, 2, mark(&d, start), start + SEC);
    assert_eq!(s, before, "the window it took from is over");

    // Sliding window: after one roll the cost comes off `previous`.
    let sw = rule_for(Algorithm::SlidingWindow, 4, 1000);
    let mut s = BucketState::fresh(&sw);
    let d = s.decide(&sw, start, 3);
    s.decide(&sw, start + SEC, 1);
    s.refund(&sw, 3, mark(&d, start), start + SEC);
    assert_eq!(
        s,
        BucketState::Sliding {
            until: start + 3 * SEC,
            current: 1,
            previous: 0,
            period_tag: sliding_window::period_tag(&sw),
        }
    );

    // Sliding log: two admissions at one instant share an entry; a refund takes only its cost.
    let sl = rule_for(Algorithm::SlidingLog, 5, 1000);
    let mut s = BucketState::fresh(&sl);
    let a = s.decide(&sl, now, 2);
    s.decide(&sl, now, 1);
    s.refund(&sl, 2, mark(&a, now), now);
    assert_eq!(s.decide(&sl, now, 0).remaining, 4);
    let BucketState::Log(log) = &s else {
        panic!("a sliding log")
    };
    assert_eq!(log.entries().collect::<Vec<_>>(), vec![(now, 1)]);

    // Cost 0, or a mark that names nothing, change nothing.
    for r in [tb, fw, sw, sl] {
        let mut s = BucketState::fresh(&r);
        let d = s.decide(&r, now, 1);
        let before = s.clone();
        s.refund(&r, 0, mark(&d, now), now);
        assert_eq!(s, before, "{r:?}");
        if r.algorithm != Algorithm::TokenBucket {
            s.refund(
                &r,
                1,
                Mark {
                    reset_ns: d.reset_ns + 7,
                    at_ns: now,
                },
                now,
            );
            assert_eq!(s, before, "{r:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Changed rules
// ---------------------------------------------------------------------------------------------

mod changed;
mod debt;
