//! The owner's bookkeeping on a manual clock: the table (bounded, settled once, expired kept,
//! shared fairly between rules), settles over every algorithm (into debt, in the bucket's
//! state), and the bound it keeps in any interleaving (a property test).

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

    fn charge(&mut self, cost: u64) -> u64 {
        self.state.charge(&self.rule, self.now, cost)
    }
}

fn reservation(id: u64, rule: Rule, estimate: u64, at: u64, deadline: u64) -> Reservation {
    Reservation {
        id,
        tenant: Tenant::Named(1),
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
    let t = Table::new(4);
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
        Err(Refused::Share(2)),
        "half of 4"
    );
    assert_eq!(t.refuses(Tenant::Named(1)), Some(Refused::Share(2)));
    assert_eq!(t.refuses(Tenant::Named(2)), None);
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
    let t = Table::new(20);
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

/// Each tenant holds at most half of what the others leave free: a named rule alone half the
/// table, the next a quarter, and so on; inline rules half of what the named leave, together,
/// and each half of what the other inline rules leave of that. Whatever floods, a newcomer
/// finds room; a tenant's share comes back as its reservations leave.
#[test]
fn the_table_is_shared_fairly_between_rules() {
    let r = rule(Algorithm::FixedWindow, 100, 1000, 100);
    let t = Table::new(100);
    let mut nonce = 0u128;
    let mut fill = |tenant: Tenant| {
        let mut kept = 0;
        loop {
            nonce += 1;
            let res = Reservation {
                tenant,
                ..reservation(7, r, 1, T0, T0 + SEC)
            };
            match t.insert(nonce, res) {
                Ok(()) => kept += 1,
                Err(refused) => {
                    assert_eq!(refused, Refused::Share(kept), "{tenant:?}");
                    return kept;
                }
            }
        }
    };
    assert_eq!(fill(Tenant::Named(1)), 50);
    assert_eq!(fill(Tenant::Named(2)), 25);
    // Inline rules: at most 12 together (half of the 25 free), each half of what the others
    // leave of those.
    assert_eq!(fill(Tenant::Inline(3)), 6);
    assert_eq!(fill(Tenant::Inline(4)), 3);
    assert_eq!(fill(Tenant::Named(5)), 8);
    assert_eq!(t.len(), 92);
    assert_eq!(t.held_by(Tenant::Named(1)), 50);
    // Settled or expired, reservations give their tenant's share back.
    assert_eq!(t.sweep(T0 + 2 * SEC), 92);
    assert!(t.is_empty());
    assert_eq!(t.held_by(Tenant::Named(1)), 0);
    assert_eq!(fill(Tenant::Inline(3)), 25, "alone, inline: half of half");
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
            tenant: Tenant::Named(1),
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
        let s = settle(&mut at, &res, 10);
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
        let s = settle(&mut at, &res, 150);
        assert_eq!((s.taken, s.owed, s.forgiven), (80, 60, 0), "{algorithm:?}");
        assert_eq!(at.decide(0).remaining, 0);
        assert_eq!(at.state.owed(&r, T0), 60, "{algorithm:?}");
        // Already in debt: all of an overshoot is owed.
        let s = settle(&mut at, &res, 15);
        assert_eq!((s.taken, s.owed), (0, 5));
        assert_eq!(at.state.owed(&r, T0), 65, "{algorithm:?}");
        assert!(!at.decide(1).allowed);
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
    Sweep,
}

fn steps(limit: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        (1..=limit / 4).prop_map(Step::Check),
        (0..=limit / 2, 1..3_000u64)
            .prop_map(|(estimate, ttl_ms)| Step::Reserve { estimate, ttl_ms }),
        (0..64usize, 0..=limit).prop_map(|(n, actual)| Step::Settle { n, actual }),
        (1..2_000u64).prop_map(Step::Advance),
        Just(Step::Sweep),
    ];
    proptest::collection::vec(step, 1..200)
}

/// The owner of one bucket, as the node runs it.
struct Owner {
    rule: Rule,
    state: BucketState,
    table: Table,
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
}

/// The most a rule allows from `start` to `end`: a full bucket and its refill, or the limit of
/// every window touched (a sliding window's weighted count never exceeds the fixed windows'; a
/// log's spans of one period neither).
fn allowance(rule: &Rule, start: u64, end: u64) -> u64 {
    match rule.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
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
    /// In any interleaving of checks, reservations (of 0 too), settles (above, below, twice,
    /// after expiry), time and sweeps: admitted ≤ allowance + what the bucket owes now, and
    /// what it owes ≤ the overshoots settled; nothing this small is forgiven.
    #[test]
    fn reservations_never_admit_more_than_the_rule_and_the_debt(
        algorithm in prop_oneof![
            Just(Algorithm::TokenBucket),
            Just(Algorithm::LeakyBucket),
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindow),
            Just(Algorithm::SlidingLog),
        ],
        run in steps(100),
    ) {
        let r = rule(algorithm, 100, 1_000, 100);
        let mut o = Owner {
            rule: r,
            state: BucketState::fresh(&r),
            table: Table::new(16),
            now: T0,
        };
        let mut admitted: u64 = 0;
        let mut overshoots: u64 = 0;
        let mut nonces: Vec<u128> = Vec::new();
        for step in run {
            match step {
                Step::Check(cost) => {
                    if o.at().decide(cost).allowed {
                        admitted += cost;
                    }
                }
                Step::Reserve { estimate, ttl_ms } => {
                    let tenant = Tenant::Named(1);
                    if estimate == 0 || o.table.refuses(tenant).is_some() {
                        // Nothing kept: a reservation of 0 is a read.
                        o.at().decide(0);
                        continue;
                    }
                    let d = o.at().decide(estimate);
                    if d.allowed {
                        admitted += estimate;
                        let nonce = nonces.len() as u128;
                        let mark = Some(Mark { reset_ns: d.reset_ns, at_ns: o.now });
                        let res = Reservation {
                            id: 1,
                            tenant,
                            rule: r,
                            estimate,
                            mark,
                            deadline: o.now + ttl_ms * MS,
                        };
                        o.table.insert(nonce, res).expect("room");
                        nonces.push(nonce);
                    }
                }
                Step::Settle { n, actual } => {
                    let Some(&nonce) = nonces.get(n) else { continue };
                    if let Found::Live(res) = o.table.take(nonce, 1, o.now) {
                        let s = settle(&mut o.at(), &res, actual);
                        // The actual cost counts, not the estimate.
                        admitted = admitted - res.estimate + actual;
                        overshoots += s.owed;
                        prop_assert_eq!(s.forgiven, 0);
                    }
                }
                Step::Advance(ms) => o.now += ms * MS,
                Step::Sweep => {
                    o.table.sweep(o.now);
                }
            }
            let debt = o.state.owed(&r, o.now);
            prop_assert!(debt <= overshoots, "debt {} > overshoots {}", debt, overshoots);
            let allowed = allowance(&r, T0, o.now);
            prop_assert!(
                admitted <= allowed + debt,
                "admitted {} > allowed {} + debt {}", admitted, allowed, debt
            );
        }
    }
}
