//! A bucket whose rule changed (a reload, an admin API write) or that came from a peer: its
//! consumption is kept, but it never waits longer than the rule in force can need.

use super::*;

const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;

/// A state used up under `old` at `at` (its whole capacity, one request at a time).
fn used_up(old: &Rule, at: u64) -> BucketState {
    let mut s = BucketState::fresh(old);
    admit_n(&mut s, old, at, 1, old.capacity());
    assert!(!s.clone().decide(old, at, 1).allowed);
    s
}

/// Decides one request under `new` at `now` on `s` (kept, as the store keeps it), asserts it is
/// denied and that its retry_after is honoured exactly; returns the wait.
fn denied_then_retry(s: &mut BucketState, new: &Rule, now: u64) -> u64 {
    let d = s.decide(new, now, 1);
    assert!(
        !d.allowed,
        "{:?} admitted at once after the change: {d:?}",
        new.algorithm
    );
    assert_retry_exact(s, new, now, 1, &d);
    d.retry_after_ns
}

/// 3 per hour used up, the rule changed to 3 per minute. The bucket was empty and stays empty, but
/// empty under the new rule: one token in 20 s, not 59 minutes.
#[test]
fn a_faster_rate_waits_for_its_own_refill_not_the_old_one() {
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let hourly = rule(alg, 3, HOUR / MS, 3);
        let mut s = used_up(&hourly, T0);
        let per_minute = rule(alg, 3, MIN / MS, 3);
        let now = T0 + SEC;
        assert_eq!(
            denied_then_retry(&mut s, &per_minute, now),
            20 * SEC,
            "{alg}"
        );
        // And it refills at the new rate from there: full one minute later.
        assert_eq!(s.decide(&per_minute, now + MIN, 0).remaining, 3, "{alg}");
        admit_n(&mut s, &per_minute, now + MIN, 1, 3);
    }
}

/// A rule changed through the admin API: burst 100 -> 10 at 1 per second, 100 spent: one second to
/// the next token of the smaller bucket, not 91.
#[test]
fn a_smaller_burst_waits_at_most_its_own_refill() {
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let big = rule(alg, 1, 1000, 100);
        let mut s = used_up(&big, T0);
        let small = rule(alg, 1, 1000, 10);
        assert_eq!(denied_then_retry(&mut s, &small, T0), SEC, "{alg}");
    }
}

/// A bucket only partly spent under the old rule keeps that refill time while it fits the new
/// rule (the time a new rate rescales): 2 of 10 at 10 per minute is 12 s, which at 1 per
/// second is 12 tokens of a burst of 20 (8 left).
#[test]
fn a_refill_time_that_fits_the_new_rule_is_kept() {
    let old = rule(Algorithm::TokenBucket, 10, MIN / MS, 10);
    let mut s = BucketState::fresh(&old);
    admit_n(&mut s, &old, T0, 1, 2);
    let new = rule(Algorithm::TokenBucket, 1, 1000, 20);
    assert_eq!(s.decide(&new, T0, 0).remaining, 8);
}

/// Sliding window 5 per hour used up, the period changed to 2 hours: still used up (it was
/// 5 more at once). And to one minute: used up for that minute, not for the rest of the hour.
#[test]
fn a_sliding_window_keeps_its_count_when_its_period_changes() {
    let hourly = rule_for(Algorithm::SlidingWindow, 5, HOUR / MS);
    let start = window_start(T0, 2 * HOUR) + 2 * HOUR; // aligned to both periods
    for (at, change) in [
        (start + SEC, start + 2 * SEC),
        (start + HOUR + SEC, start + HOUR + 2 * SEC), // second half of a 2-hour window
        (start + 30 * MIN, start + 50 * MIN),
    ] {
        let two_hours = rule_for(Algorithm::SlidingWindow, 5, 2 * HOUR / MS);
        let mut s = used_up(&hourly, at);
        let wait = denied_then_retry(&mut s, &two_hours, change);
        // Counted as if just admitted under the new rule: past that window, by 2 h / 5 at most.
        let window_end = window_start(change, 2 * HOUR) + 2 * HOUR;
        assert!(change + wait <= window_end + 2 * HOUR / 5, "{wait}");

        let minute = rule_for(Algorithm::SlidingWindow, 5, MIN / MS);
        let mut s = used_up(&hourly, at);
        let wait = denied_then_retry(&mut s, &minute, change);
        assert!(
            wait <= MIN + MIN / 5,
            "locked out {wait} ns by a one-minute rule"
        );
    }
}

/// Fixed window: 2 h -> 1 min and 1 h -> 2 h keep a used-up key used up, until the end of the
/// new rule's window that contains the change (no longer), then admit the new limit.
#[test]
fn a_fixed_window_keeps_its_count_when_its_period_changes() {
    let start = window_start(T0, 2 * HOUR) + 2 * HOUR;
    let cases = [
        (2 * HOUR, MIN, start + 10 * MIN + 5 * SEC),
        (HOUR, 2 * HOUR, start + 10 * MIN),
        (HOUR, 2 * HOUR, start + HOUR + 10 * MIN), // window ends line up: kept before too
        (MIN, 2 * HOUR, start + 10 * MIN + 5 * SEC),
    ];
    for (old_p, new_p, at) in cases {
        let old = rule_for(Algorithm::FixedWindow, 5, old_p / MS);
        let new = rule_for(Algorithm::FixedWindow, 5, new_p / MS);
        let mut s = used_up(&old, at);
        let change = at + SEC;
        let wait = denied_then_retry(&mut s, &new, change);
        let new_end = window_start(change, new_p) + new_p;
        assert_eq!(change + wait, new_end, "{old_p} -> {new_p}");
        admit_n(&mut s, &new, new_end, 1, 5);
    }
    // A count whose window had ended before the change counts nothing, as under the old rule.
    let old = rule_for(Algorithm::FixedWindow, 5, MIN / MS);
    let mut s = used_up(&old, start + 10 * SEC);
    let new = rule_for(Algorithm::FixedWindow, 5, 2 * HOUR / MS);
    admit_n(&mut s, &new, start + 2 * MIN, 1, 5);
}

/// The windowed algorithms: a used-up key stays used up through a change of period, in
/// either direction, and waits no longer than the new rule (one window, plus `period/limit`
/// for the sliding counter's weight; a lower limit may add up to one more window, as the
/// requests over it weigh in the next one).
#[test]
fn every_window_algorithm_keeps_a_used_up_key_used_up_across_a_period_change() {
    let start = window_start(T0, 2 * HOUR) + 2 * HOUR + 7 * SEC + 3;
    let periods = [MIN, HOUR, 2 * HOUR, 90 * MIN];
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        for old_p in periods {
            for new_p in periods {
                for limit in [3, 5] {
                    let old = rule_for(alg, 5, old_p / MS);
                    let new = rule_for(alg, limit, new_p / MS);
                    let mut s = used_up(&old, start);
                    let change = start + SEC;
                    let wait = denied_then_retry(&mut s, &new, change);
                    let bound = if limit == 5 {
                        new_p + new_p / new.limit
                    } else {
                        2 * new_p
                    };
                    assert!(
                        wait <= bound,
                        "{alg} {old_p} -> {new_p}: locked out {wait} > {bound}"
                    );
                }
            }
        }
    }
}

/// A changed limit applies to the count as it stands, the period unchanged: a lower one denies
/// what is already over it, a higher one admits the difference.
#[test]
fn every_window_algorithm_keeps_its_count_under_a_new_limit() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let old = rule_for(alg, 5, HOUR / MS);
        let mut s = BucketState::fresh(&old);
        admit_n(&mut s, &old, T0, 1, 4);
        let lower = rule_for(alg, 3, HOUR / MS);
        assert!(!s.clone().decide(&lower, T0 + SEC, 1).allowed, "{alg}");
        let higher = rule_for(alg, 10, HOUR / MS);
        assert_eq!(s.decide(&higher, T0 + SEC, 0).remaining, 6, "{alg}");
    }
}

/// A sliding log is resized to its rule's limit, so the store weighs it by the rule in force.
#[test]
fn a_sliding_log_follows_its_new_limit_in_size() {
    let small = rule_for(Algorithm::SlidingLog, 5, 1000);
    let mut s = BucketState::fresh(&small);
    admit_n(&mut s, &small, T0, 1, 2);
    let big = rule_for(Algorithm::SlidingLog, 1000, 1000);
    admit_n(&mut s, &big, T0 + MS, 1, 1);
    assert_eq!(s.weight(), BucketState::fresh(&big).weight());
}

/// `fit_to_rule` gives any state, however hostile, a bounded meaning under the rule: never
/// a wait beyond what the rule itself can make a request wait, plus the most a bucket may owe
/// (a state from the wire is taken as written under the rule in force, debt and all).
#[test]
fn hostile_states_are_fitted_within_the_rule() {
    let now = T0;
    let p = SEC;
    let ahead = window_start(now, p) + 1_000 * p;
    let bound = 2 * SEC + MAX_DEBT_PERIODS * p;
    for alg in ALL {
        let r = rule_for(alg, 5, 1000);
        let hostile = match alg {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => vec![BucketState::Gcra {
                tat: u64::MAX,
                tag: 0,
            }],
            Algorithm::FixedWindow => vec![
                BucketState::Fixed {
                    end: u64::MAX,
                    count: u32::MAX,
                    period_tag: 0,
                },
                // A debt far beyond what a bucket may owe, on this rule's windows.
                BucketState::Fixed {
                    end: ahead,
                    count: u32::MAX,
                    period_tag: 0,
                },
            ],
            Algorithm::SlidingWindow => vec![
                BucketState::Sliding {
                    until: u64::MAX,
                    current: u32::MAX,
                    previous: u32::MAX,
                    period_tag: 0,
                },
                BucketState::Sliding {
                    until: ahead,
                    current: u32::MAX,
                    previous: u32::MAX,
                    period_tag: 0,
                },
            ],
            Algorithm::SlidingLog => {
                let mut entries: Vec<_> = (0..20).map(|i| (u64::MAX - i, u32::MAX)).collect();
                entries.push((0, u32::MAX));
                vec![BucketState::from_wire(
                    ringlimit_proto::peer::WireState::Log {
                        entries,
                        max_entries: 5,
                    },
                )]
            }
        };
        for hostile in hostile {
            let mut s = hostile.clone();
            s.fit_to_rule(&r, now);
            let d = s.clone().decide(&r, now, 1);
            assert!(!d.allowed, "{alg}");
            assert!(d.retry_after_ns <= bound, "{alg}: {d:?}");
            assert!(s.idle_at() <= now + bound, "{alg}: {s:?}");
            // Deciding fits the same way.
            let mut decided = hostile;
            assert_eq!(decided.decide(&r, now, 1), d, "{alg}");
        }
    }
}

/// A state of another algorithm becomes fresh.
#[test]
fn fitting_to_another_algorithm_starts_fresh() {
    let tb = rule_for(Algorithm::TokenBucket, 5, 1000);
    let mut s = used_up(&tb, T0);
    let fw = rule_for(Algorithm::FixedWindow, 5, 1000);
    s.fit_to_rule(&fw, T0);
    assert_eq!(s, BucketState::fresh(&fw));
}

/// Two random rules of one algorithm family (the window algorithms keep `burst == limit`).
fn arb_rule_pair() -> impl Strategy<Value = (Rule, Rule)> {
    (arb_rule(), arb_rule()).prop_map(|(a, b)| {
        let algorithm = a.algorithm;
        let burst = if algorithm.has_burst() {
            b.burst
        } else {
            b.limit
        };
        let b = Rule {
            algorithm,
            burst,
            ..b
        };
        (a, b)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// On any state its own rule wrote, fitting changes nothing that matters; and it is
    /// idempotent.
    #[test]
    fn fitting_a_state_to_the_rule_that_wrote_it_changes_nothing(
        r in arb_rule(),
        arrivals in arb_arrivals(40),
        offset in any::<u64>(),
        probe_gap in any::<u64>(),
    ) {
        let (s, now) = state_after(&r, start_time(offset, false, r.period_ns), &arrivals);
        let now = now + probe_gap % (2 * r.period_ns);
        let mut fitted = s.clone();
        fitted.fit_to_rule(&r, now);
        assert_same_meaning(&s, &fitted, &r, now);
        let mut again = fitted.clone();
        again.fit_to_rule(&r, now);
        prop_assert_eq!(again, fitted);
    }

    /// After any change of the numbers, every denial's retry_after is honoured exactly, and
    /// no request waits longer than the new rule can make it: one window and its weight (two
    /// periods) or, for a bucket, the refill of the request's cost.
    #[test]
    fn after_a_rule_change_no_wait_exceeds_the_new_rule(
        (old, new) in arb_rule_pair(),
        arrivals in arb_arrivals(40),
        offset in any::<u64>(),
        probe_gap in any::<u64>(),
    ) {
        let (mut s, now) = state_after(&old, start_time(offset, false, old.period_ns), &arrivals);
        let now = now + probe_gap % (old.period_ns / 2 + 1);
        for cost in 1..=new.capacity() {
            let d = s.decide(&new, now, cost);
            if d.allowed {
                break;
            }
            assert_retry_exact(&s, &new, now, cost, &d);
            let bound = (2 * new.period_ns)
                .max(token_bucket::emission_ns(&new) * cost);
            prop_assert!(d.retry_after_ns <= bound, "{:?} -> {:?}: {:?}", old, new, d);
        }
    }
}
