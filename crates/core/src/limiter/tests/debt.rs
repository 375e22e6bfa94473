//! Debt: a reservation settled above what its bucket admits ([`BucketState::charge`]) owes the
//! rest in the bucket's own state. The bucket denies until time has repaid it, exactly as if
//! the debt had been admitted as soon as the rule allowed; every promise of a decision
//! (`remaining`, `retry_after`, `idle_at`, a denial changing nothing) holds in debt too; the
//! debt survives the wire and is bounded.

use super::*;

/// `start` aligned to a window of `p`, a little after T0.
fn aligned(p: u64) -> u64 {
    window_start(T0, p) + p
}

/// Uses up `r`'s capacity at `now` and charges 99 more: a key that settled 99 over what it had.
fn overspent_by_99(r: &Rule, now: u64) -> BucketState {
    let mut s = BucketState::fresh(r);
    admit_n(&mut s, r, now, 1, r.capacity());
    assert_eq!(s.charge(r, now, 99), 0);
    assert_eq!(s.owed(r, now), 99, "{:?}", r.algorithm);
    s
}

/// How many checks of cost 1 (of `tries`) `s` admits at `now`.
fn admits(s: &mut BucketState, r: &Rule, now: u64, tries: u64) -> u64 {
    (0..tries)
        .map(|_| u64::from(s.decide(r, now, 1).allowed))
        .sum()
}

/// For every algorithm: 100 per 5 s used up, then 99 owed. A fixed window admits what is left of
/// its next window's limit, 1; a bucket its refill of a period less the debt, 1; a log the room its
/// entries leave less the debt, 1. A sliding window's next window is full (the debt counts in it,
/// and the previous window's weight on top): it admits once that has slid away, from the window
/// after. Then the rule as before.
#[test]
fn every_algorithm_owes_what_it_could_not_admit_and_repays_it_with_time() {
    for algorithm in ALL {
        let r = rule_for(algorithm, 100, 5_000);
        let (start, p) = (aligned(r.period_ns), r.period_ns);
        let mut s = overspent_by_99(&r, start);
        let d = s.decide(&r, start, 1);
        assert!(!d.allowed && d.remaining == 0, "{algorithm}: {d:?}");
        assert_retry_exact(&s, &r, start, 1, &d);
        // Nothing is admitted before the debt is repaid.
        assert_eq!(admits(&mut s, &r, start + p - 1, 200), 0, "{algorithm}");
        if algorithm == Algorithm::SlidingWindow {
            assert_eq!(admits(&mut s, &r, start + p, 200), 0);
            assert_eq!(
                admits(&mut s, &r, start + 2 * p, 200),
                1,
                "99 weigh in full"
            );
        } else {
            assert_eq!(admits(&mut s, &r, start + p, 200), 1, "{algorithm}");
        }
        assert_eq!(s.owed(&r, start + 2 * p), 0, "{algorithm}");
        let after = start + 4 * p;
        assert_eq!(admits(&mut s, &r, after, 200), 100, "{algorithm}");
    }
}

/// A debt of more than a period: every window up to it is full (a sliding window's weighs on
/// the one after too).
#[test]
fn a_debt_of_several_periods_fills_that_many_windows() {
    for algorithm in ALL {
        let r = rule_for(algorithm, 10, 1_000);
        let start = aligned(r.period_ns);
        let mut s = BucketState::fresh(&r);
        assert_eq!(s.charge(&r, start, 35), 0, "{algorithm}");
        assert_eq!(s.owed(&r, start), 25, "{algorithm}");
        let want: &[u64] = match algorithm {
            // The 5 of the third period weigh on the fourth: 5 more at its start.
            Algorithm::SlidingWindow => &[0, 0, 0, 5],
            _ => &[0, 0, 5],
        };
        for (k, &want) in (1..).zip(want) {
            let at = start + k * SEC;
            assert_eq!(admits(&mut s, &r, at, 20), want, "{algorithm}, period {k}");
        }
    }
}

/// What a bucket may owe is bounded: a charge beyond it is forgiven, and said so.
#[test]
fn a_bucket_owes_at_most_its_limit_for_max_debt_periods() {
    for algorithm in ALL {
        let r = rule_for(algorithm, 10, 1_000);
        let start = aligned(r.period_ns);
        let mut s = BucketState::fresh(&r);
        let most = MAX_DEBT_PERIODS * 10;
        let forgiven = s.charge(&r, start, most + 10 + 7);
        assert_eq!(
            forgiven, 7,
            "{algorithm}: the current window, then {most} owed"
        );
        assert_eq!(s.owed(&r, start), most, "{algorithm}");
        assert_eq!(s.charge(&r, start, 1), 1, "{algorithm}");
        // The last window owed, and for a sliding window its weight after it.
        let free = start + (MAX_DEBT_PERIODS + 2) * SEC;
        assert!(s.idle_at() <= free, "{algorithm}: {s:?}");
        assert_eq!(admits(&mut s, &r, free, 20), 10, "{algorithm}");
    }
}

/// A debt travels: the state a replica or the next owner receives decides as the owner's does.
#[test]
fn a_debt_survives_the_wire() {
    for algorithm in ALL {
        let r = rule_for(algorithm, 100, 5_000);
        let start = aligned(r.period_ns);
        let s = overspent_by_99(&r, start);
        let received = BucketState::from_wire(s.to_wire());
        assert_eq!(received.owed(&r, start), 99, "{algorithm}");
        for dt in [
            0,
            1,
            SEC,
            5 * SEC - 1,
            5 * SEC,
            5 * SEC + 1,
            7 * SEC,
            10 * SEC,
        ] {
            for cost in [0, 1, 2, 100] {
                let (mut a, mut b) = (s.clone(), received.clone());
                assert_eq!(
                    a.decide(&r, start + dt, cost),
                    b.decide(&r, start + dt, cost),
                    "{algorithm} at +{dt} cost {cost}"
                );
            }
        }
    }
}

/// A handover adds the two sides' consumption, debts included; two readings of one history
/// keep the larger.
#[test]
fn merged_states_keep_their_debts() {
    for algorithm in ALL {
        let r = rule_for(algorithm, 100, 5_000);
        let start = aligned(r.period_ns);
        let owing = overspent_by_99(&r, start);
        let mut fresh = BucketState::fresh(&r);
        fresh.absorb(BucketState::from_wire(owing.to_wire()), start);
        assert!(fresh.owed(&r, start) >= 99, "{algorithm}: {fresh:?}");
        let mut other = BucketState::fresh(&r);
        other.decide(&r, start, 1);
        other.overlap(owing.clone());
        assert_eq!(other.owed(&r, start), 99, "{algorithm}");
        let mut mine = owing.clone();
        mine.overlap(BucketState::fresh(&r));
        assert_eq!(mine.owed(&r, start), 99, "{algorithm}");
    }
}

/// A changed rule: a bucket's debt is not kept under other numbers (a token bucket's refill
/// time is clamped to an empty bucket of the new rule; a window's debt is another period's
/// windows), as before debts existed; a window's debt is kept under a new limit (it is
/// windows, and the new limit fills them).
#[test]
fn a_changed_rule_keeps_no_debt_of_other_numbers() {
    for algorithm in ALL {
        let r = rule_for(algorithm, 100, 5_000);
        let start = aligned(r.period_ns);
        let s = overspent_by_99(&r, start);
        let faster = rule_for(algorithm, 100, 1_000);
        let owed = s.owed(&faster, start);
        match algorithm {
            Algorithm::SlidingLog => assert_eq!(owed, 99, "a log owes tokens"),
            _ => assert_eq!(owed, 0, "{algorithm}"),
        }
        if algorithm.has_burst() {
            continue;
        }
        let lower = rule_for(algorithm, 50, 5_000);
        let mut t = s.clone();
        assert!(!t.decide(&lower, start + 5 * SEC, 1).allowed, "{algorithm}");
    }
}

/// Fixed window against the ledger it replaces: a model that keeps the debt beside the window
/// and takes it from the window's room the moment there is some, denying everything while it
/// owes. They admit the same requests.
#[test]
fn a_fixed_windows_debt_admits_what_the_ledger_did() {
    let r = rule_for(Algorithm::FixedWindow, 10, 1_000);
    let start = aligned(r.period_ns);
    // (ms after start, cost, charge?)
    let steps: &[(u64, u64, bool)] = &[
        (0, 4, false),
        (10, 3, true),
        (20, 9, true),
        (500, 1, false),
        (1_000, 1, false),
        (1_400, 8, true),
        (2_000, 2, false),
        (2_100, 1, false),
        (3_000, 10, false),
        (3_500, 30, true),
        (4_000, 1, false),
        (6_999, 1, false),
        (7_000, 3, false),
    ];
    let mut s = BucketState::fresh(&r);
    let (mut window, mut count, mut ledger) = (u64::MAX, 0u64, 0u64);
    for &(ms, cost, charge) in steps {
        let now = start + ms * MS;
        let w = now / r.period_ns;
        // Each window that began since, the ledger repaid first.
        while window != w {
            window = if window == u64::MAX { w } else { window + 1 };
            count = ledger.min(r.limit);
            ledger -= count;
        }
        if charge {
            let room = r.limit - count;
            count += cost.min(room);
            ledger += cost - cost.min(room);
            s.charge(&r, now, cost);
        } else {
            let want = ledger == 0 && count + cost <= r.limit;
            if want {
                count += cost;
            }
            let d = s.decide(&r, now, cost);
            assert_eq!(d.allowed, want, "at +{ms} ms cost {cost}: {d:?}");
        }
        assert_eq!(s.owed(&r, now), ledger, "at +{ms} ms");
    }
}

/// A sliding log against the ledger it replaces, on whole milliseconds: the reference logs the
/// debt into the room of each millisecond as it comes free (with times on whole ms and a period
/// of whole ms, room only ever comes free on one), and denies everything while it owes. The
/// log keeps one number of debt and logs it lazily, at the instants the reference did.
fn log_matches_the_ledger(limit: u64, steps: &[(u64, u64, bool)]) -> Result<(), TestCaseError> {
    let r = rule_for(Algorithm::SlidingLog, limit, 100);
    let p_ms = 100;
    let start = aligned(r.period_ns);
    let mut s = BucketState::fresh(&r);
    // The reference: (ms, cost) entries and the debt.
    let mut log: Vec<(u64, u64)> = Vec::new();
    let mut debt = 0u64;
    let mut ms = 0;
    for &(gap, cost, charge) in steps {
        let target = ms + gap;
        // Every millisecond up to the step: expire, then repay into the room.
        while ms <= target {
            log.retain(|&(t, _)| t + p_ms > ms);
            let used: u64 = log.iter().map(|&(_, c)| c).sum();
            let take = debt.min(r.limit - used);
            if take > 0 {
                log.push((ms, take));
                debt -= take;
            }
            if ms == target {
                break;
            }
            ms += 1;
        }
        let now = start + ms * MS;
        let used: u64 = log.iter().map(|&(_, c)| c).sum();
        if charge {
            let take = cost.min(r.limit - used);
            if take > 0 {
                log.push((ms, take));
            }
            debt += cost - take;
            s.charge(&r, now, cost);
        } else {
            let want = debt == 0 && used + cost.max(1) <= r.limit;
            if want && cost > 0 {
                log.push((ms, cost));
            }
            let before = s.clone();
            let d = s.decide(&r, now, cost);
            prop_assert_eq!(d.allowed, want, "at {} ms cost {}: {:?}", ms, cost, d);
            if !d.allowed {
                assert_retry_exact(&before, &r, now, cost.max(1), &d);
            }
        }
        prop_assert_eq!(s.owed(&r, now), debt, "at {} ms", ms);
    }
    Ok(())
}

/// One arrival of a run in debt: a gap, a cost and whether it is a charge (a settle's
/// overshoot) or a check.
fn arb_debt_steps(limit: u64, max: usize) -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 1u64..30, 30u64..300],
            0..=limit,
            prop::bool::weighted(0.2),
        ),
        1..max,
    )
}

/// Random arrivals with charges in between, as [`super::run`] checks them: every decision's
/// promises hold in debt too, and the bound holds with the debt (the admitted total, charges
/// included, is at most what the rule allows over the run plus what is owed now, and what was
/// forgiven beyond the most a bucket may owe).
fn run_in_debt(r: &Rule, start: u64, steps: &[(Arrival, bool)]) -> Result<(), TestCaseError> {
    let p = r.period_ns;
    let mut s = BucketState::fresh(r);
    let mut now = start;
    let (mut admitted, mut forgiven) = (0u64, 0u64);
    for (a, charge) in steps {
        now += a.gap(p);
        if *charge {
            let cost = 1 + a.cost_raw % (2 * r.capacity());
            forgiven += s.charge(r, now, cost);
            admitted += cost;
        } else {
            let cost = if a.peek { 0 } else { a.cost(r) };
            let before = s.clone();
            let d = s.decide(r, now, cost);
            assert_remaining_exact(&s, r, now, d.remaining);
            if d.allowed && cost > 0 {
                admitted += cost;
            } else {
                assert_same_meaning(&before, &s, r, now);
                if !d.allowed {
                    prop_assert!(before.owed(r, now) == 0 || d.remaining == 0);
                    assert_retry_exact(&before, r, now, cost, &d);
                }
            }
        }
        let allowed = match r.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                r.burst + (now - start) / token_bucket::emission_ns(r)
            }
            _ => (now / p - start / p + 1) * r.limit,
        };
        let owed = s.owed(r, now);
        prop_assert!(
            owed <= MAX_DEBT_PERIODS * r.limit,
            "owes {} ({:?})",
            owed,
            r
        );
        prop_assert!(
            admitted - forgiven <= allowed + owed,
            "admitted {} (forgiven {}) > allowed {} + owed {} ({:?}, {:?})",
            admitted,
            forgiven,
            allowed,
            owed,
            r,
            s
        );
    }
    // At `idle_at` the state is as good as fresh: the debt is repaid by time alone.
    let at = s.idle_at().max(now);
    for cost in 0..=r.capacity() {
        prop_assert_eq!(
            s.clone().decide(r, at, cost),
            BucketState::fresh(r).decide(r, at, cost)
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_algorithm_in_debt_keeps_its_promises_and_the_bound(
        r in arb_rule(),
        arrivals in arb_arrivals(60),
        charges in prop::collection::vec(prop::bool::weighted(0.15), 60),
        offset in any::<u64>(),
    ) {
        let start = start_time(offset, false, r.period_ns);
        let steps: Vec<_> = arrivals.into_iter().zip(charges).collect();
        run_in_debt(&r, start, &steps)?;
    }

    #[test]
    fn every_algorithm_in_debt_decides_alike_after_the_wire(
        r in arb_rule(),
        arrivals in arb_arrivals(30),
        charges in prop::collection::vec(prop::bool::weighted(0.2), 30),
        offset in any::<u64>(),
        probe in any::<u64>(),
    ) {
        let p = r.period_ns;
        let mut s = BucketState::fresh(&r);
        let mut now = start_time(offset, false, p);
        for (a, charge) in arrivals.iter().zip(charges) {
            now += a.gap(p);
            if charge {
                s.charge(&r, now, a.cost(&r));
            } else {
                s.decide(&r, now, a.cost(&r));
            }
        }
        let received = BucketState::from_wire(s.to_wire());
        let later = now + probe % (3 * p);
        for cost in 0..=r.capacity() {
            prop_assert_eq!(
                s.clone().decide(&r, later, cost),
                received.clone().decide(&r, later, cost)
            );
        }
    }

    #[test]
    fn a_logs_debt_is_logged_when_the_ledger_would_have(
        limit in 1u64..12,
        steps in arb_debt_steps(12, 40),
    ) {
        let steps: Vec<_> = steps.into_iter().map(|(g, c, ch)| (g, c.min(limit), ch)).collect();
        log_matches_the_ledger(limit, &steps)?;
    }
}
