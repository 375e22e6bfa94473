//! The owner's bookkeeping on a manual clock: the table (bounded, settled once, expired kept),
//! the ledger (bounded, repaid, forgotten), settles over every algorithm, and the bound it
//! keeps in any interleaving (a property test).

use super::*;
use crate::limiter::test_support::{MS, SEC, T0, rule};
use crate::limiter::{BucketState, Rule};
use proptest::prelude::*;
use ringlimit_proto::Algorithm;

/// One bucket's state at one instant: what a settle and a repayment decide on.
struct At<'a> {
    state: &'a mut BucketState,
    rule: Rule,
    now: u64,
}

impl Bucket for At<'_> {
    fn decide(&mut self, cost: u64) -> Decision {
        self.state.decide(&self.rule, self.now, cost)
    }

    fn refund(&mut self, cost: u64, mark: Mark) {
        self.state.refund(&self.rule, cost, mark, self.now);
    }
}

fn reservation(id: u64, rule: Rule, estimate: u64, at: u64, deadline: u64) -> Reservation {
    Reservation {
        id,
        rule,
        estimate,
        mark: Some(Mark {
            reset_ns: 0,
            at_ns: at,
        }),
        deadline,
    }
}

#[test]
fn a_reservation_is_settled_once_and_an_expired_one_is_unknown() {
    let r = rule(Algorithm::FixedWindow, 100, 1000, 100);
    let t = Table::new(2);
    t.insert(1, reservation(7, r, 10, T0, T0 + SEC))
        .expect("room");
    assert_eq!(
        t.insert(1, reservation(7, r, 10, T0, T0 + SEC)),
        Err(Refused::Duplicate)
    );
    t.insert(2, reservation(7, r, 10, T0, T0 + SEC))
        .expect("room");
    assert_eq!(
        t.insert(3, reservation(7, r, 10, T0, T0 + SEC)),
        Err(Refused::Full(2))
    );
    assert!(t.is_full());
    // Another bucket's nonce is not this settle's, and stays.
    assert_eq!(t.take(1, 8, T0), Found::Unknown);
    assert!(matches!(t.take(1, 7, T0 + SEC), Found::Live(_)));
    assert_eq!(t.take(1, 7, T0), Found::Unknown, "settled once");
    assert_eq!(t.take(2, 7, T0 + SEC + 1), Found::Expired);
    assert_eq!(t.take(2, 7, T0), Found::Unknown);
    assert!(t.is_empty());
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(
        (
            load(&t.stats.reserved),
            load(&t.stats.settled),
            load(&t.stats.expired),
            load(&t.stats.unknown)
        ),
        (2, 1, 1, 4)
    );
}

#[test]
fn a_sweep_drops_what_expired_and_nothing_else() {
    let r = rule(Algorithm::TokenBucket, 100, 1000, 100);
    let t = Table::new(10);
    for i in 0..6u64 {
        t.insert(u128::from(i), reservation(i, r, 1, T0, T0 + i * SEC))
            .expect("room");
    }
    assert_eq!(t.sweep(T0 + 2 * SEC), 2, "deadlines 0 and 1 s");
    assert_eq!(t.len(), 4);
    assert_eq!(t.sweep(T0 + 2 * SEC), 0);
    assert_eq!(t.sweep(T0 + 10 * SEC), 4);
    assert!(t.is_empty());
    assert_eq!(t.stats.expired.load(Ordering::Relaxed), 6);
}

#[test]
fn the_ledger_is_bounded_repaid_and_forgotten() {
    let r = rule(Algorithm::TokenBucket, 1000, 1000, 1000);
    let d = Debts::new(2);
    assert_eq!(d.owed(1), None);
    assert_eq!(d.add(1, r, 30), 0);
    assert_eq!(d.add(1, r, 20), 0, "a bucket in debt owes more");
    assert_eq!(d.add(2, r, 5), 0);
    assert_eq!(d.add(3, r, 9), 9, "full: not recorded");
    assert_eq!((d.owed(1), d.owed(2), d.owed(3)), (Some(50), Some(5), None));
    assert_eq!(d.total(), 55);
    // Each bucket admits 20 now: bucket 2 is repaid, bucket 1 owes 30 more.
    assert_eq!(d.repay(|_, _, owed| owed.min(20)), 25);
    assert_eq!((d.owed(1), d.owed(2)), (Some(30), None));
    d.forget(&[1]);
    assert_eq!(d.owed(1), None);
    assert!(d.is_empty());
    assert_eq!(d.repay(|_, _, _| panic!("nothing owed")), 0);
    assert_eq!(d.dropped.load(Ordering::Relaxed), 9);
}

#[test]
fn a_debt_denies_for_about_its_repayment_time() {
    let r = rule(Algorithm::TokenBucket, 1000, 60_000, 1000);
    let peek = BucketState::fresh(&r).decide(&r, T0, 0);
    let d = in_debt(peek, &r, 500, T0);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after_ns, 30 * SEC, "500 of 1000 a minute");
    assert_eq!(d.reset_ns, T0 + 30 * SEC);
    assert_eq!(wait_ns(&r, 0), MS, "at least a millisecond");
}

/// A lower actual cost gives the difference back exactly for every algorithm settled at the
/// reservation's instant; a higher one takes what the bucket admits and owes the rest.
#[test]
fn a_settle_gives_back_or_takes_on_every_algorithm() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let r = rule(algorithm, 100, 60_000, 100);
        let mut state = BucketState::fresh(&r);
        let d = state.decide(&r, T0, 40);
        assert!(d.allowed, "{algorithm:?}");
        let res = Reservation {
            id: 1,
            rule: r,
            estimate: 40,
            mark: Some(Mark {
                reset_ns: d.reset_ns,
                at_ns: T0,
            }),
            deadline: T0 + SEC,
        };
        let mut at = At {
            state: &mut state,
            rule: r,
            now: T0,
        };
        let s = settle(&mut at, &res, 10, false);
        assert_eq!(s.given_back, 30);
        assert_eq!(at.decide(0).remaining, 90, "{algorithm:?}: 10 kept");

        // 10 taken again, then settled at 150: 100 - 20 = 80 admitted now, 60 owed.
        let d = at.decide(10);
        let res = Reservation {
            estimate: 10,
            mark: Some(Mark {
                reset_ns: d.reset_ns,
                at_ns: T0,
            }),
            ..res
        };
        let s = settle(&mut at, &res, 150, false);
        assert_eq!((s.taken, s.owed), (80, 60), "{algorithm:?}");
        assert_eq!(at.decide(0).remaining, 0);
        // Already in debt: all of an overshoot is owed.
        let s = settle(&mut at, &res, 15, true);
        assert_eq!((s.taken, s.owed), (0, 5));
    }
}

/// What a run does, step by step.
#[derive(Debug, Clone)]
enum Step {
    Check(u64),
    Reserve {
        estimate: u64,
        ttl_ms: u64,
    },
    /// Settles the `n`th reservation made (live, expired or settled already) at `actual`.
    Settle {
        n: usize,
        actual: u64,
    },
    Advance(u64),
    Repay,
    Sweep,
}

fn steps(limit: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        (1..=limit / 4).prop_map(Step::Check),
        (0..=limit / 2, 1..3_000u64)
            .prop_map(|(estimate, ttl_ms)| Step::Reserve { estimate, ttl_ms }),
        (0..64usize, 0..=limit).prop_map(|(n, actual)| Step::Settle { n, actual }),
        (1..2_000u64).prop_map(Step::Advance),
        Just(Step::Repay),
        Just(Step::Sweep),
    ];
    proptest::collection::vec(step, 1..200)
}

/// The owner of one bucket, as the node runs it: checks deny while the bucket is in debt.
struct Owner {
    rule: Rule,
    state: BucketState,
    table: Table,
    debts: Debts,
    now: u64,
}

impl Owner {
    fn at(&mut self) -> At<'_> {
        At {
            state: &mut self.state,
            rule: self.rule,
            now: self.now,
        }
    }

    fn check(&mut self, cost: u64) -> Decision {
        match self.debts.owed(1) {
            Some(owed) => {
                let peek = self.at().decide(0);
                in_debt(peek, &self.rule, owed, self.now)
            }
            None => self.at().decide(cost),
        }
    }
}

/// The most a rule allows from `start` to `end`: a full bucket and its refill, or the limit of
/// every window touched (a sliding window's weighted count never exceeds the fixed windows').
fn allowance(rule: &Rule, start: u64, end: u64) -> u64 {
    match rule.algorithm {
        Algorithm::TokenBucket => {
            let t = crate::limiter::token_bucket::emission_ns(rule);
            rule.burst + (end - start) / t
        }
        _ => {
            let windows = end / rule.period_ns - start / rule.period_ns + 1;
            rule.limit * windows
        }
    }
}

proptest! {
    /// In any interleaving of checks, reservations, settles (above, below, twice, after
    /// expiry), time and repayments: admitted ≤ allowance + debt outstanding, and the debt
    /// outstanding ≤ the overshoots settled and not yet repaid.
    #[test]
    fn reservations_never_admit_more_than_the_rule_and_the_debt(
        algorithm in prop_oneof![
            Just(Algorithm::TokenBucket),
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindow),
        ],
        run in steps(100),
    ) {
        let r = rule(algorithm, 100, 1_000, 100);
        let mut o = Owner {
            rule: r,
            state: BucketState::fresh(&r),
            table: Table::new(16),
            debts: Debts::new(16),
            now: T0,
        };
        let mut admitted: u64 = 0;
        let mut overshoots: u64 = 0;
        let mut nonces: Vec<u128> = Vec::new();
        for step in run {
            match step {
                Step::Check(cost) => {
                    if o.check(cost).allowed {
                        admitted += cost;
                    }
                }
                Step::Reserve { estimate, ttl_ms } => {
                    if o.table.is_full() {
                        continue;
                    }
                    let d = o.check(estimate);
                    if d.allowed {
                        admitted += estimate;
                        let nonce = nonces.len() as u128;
                        let mark = (estimate > 0).then_some(Mark { reset_ns: d.reset_ns, at_ns: o.now });
                        let res = Reservation { id: 1, rule: r, estimate, mark, deadline: o.now + ttl_ms * MS };
                        o.table.insert(nonce, res).expect("room");
                        nonces.push(nonce);
                    }
                }
                Step::Settle { n, actual } => {
                    let Some(&nonce) = nonces.get(n) else { continue };
                    if let Found::Live(res) = o.table.take(nonce, 1, o.now) {
                        let indebted = o.debts.owed(1).is_some();
                        let s = settle(&mut o.at(), &res, actual, indebted);
                        // The actual cost counts, not the estimate.
                        admitted = admitted - res.estimate + actual;
                        overshoots += s.owed;
                        o.debts.add(1, r, s.owed);
                    }
                }
                Step::Advance(ms) => o.now += ms * MS,
                Step::Repay => {
                    let now = o.now;
                    let state = &mut o.state;
                    let repaid = o.debts.repay(|_, rule, owed| {
                        take_up_to(&mut At { state, rule: *rule, now }, owed)
                    });
                    overshoots -= repaid;
                }
                Step::Sweep => {
                    o.table.sweep(o.now);
                }
            }
            let debt = o.debts.total();
            prop_assert!(debt <= overshoots, "debt {} > unrepaid overshoots {}", debt, overshoots);
            let allowed = allowance(&r, T0, o.now);
            prop_assert!(
                admitted <= allowed + debt,
                "admitted {} > allowed {} + debt {}", admitted, allowed, debt
            );
        }
    }
}
