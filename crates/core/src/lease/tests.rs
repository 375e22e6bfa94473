use super::*;
use crate::limiter::BucketState;
use crate::limiter::test_support::{MS, SEC, T0, rule};
use proptest::prelude::*;

const ID: u64 = 0x5eed_0001;

fn key() -> (String, RuleRef) {
    ("tenant:hot".to_owned(), RuleRef::Named("api".to_owned()))
}

fn settings() -> LeaseSettings {
    LeaseSettings {
        span_ns: 100 * MS,
        max_leases: 4,
        initial_demand_per_s: 1_000,
        backoff_ns: SEC,
    }
}

fn granted(tokens: u64, valid_ns: u64) -> LeaseGrant {
    LeaseGrant::Granted {
        tokens,
        mark: Mark {
            reset_ns: T0 + SEC,
            at_ns: T0,
        },
        valid_ns,
        answer: CheckAnswer {
            allowed: true,
            limit: 1_000,
            remaining: 900,
            reset_at_ms: 42,
            retry_after_ms: 0,
            degraded: false,
            replica: false,
            leased: false,
        },
    }
}

/// A wanted bucket asks at its first check (naming its key), and the slice is spent here.
fn leased_with(held: &Held, tokens: u64, valid_ns: u64) -> Due {
    assert!(held.want(ID));
    assert_eq!(
        held.take(ID, 1, T0, key),
        Take::Forward,
        "nothing granted yet"
    );
    let due = held.due(T0);
    assert_eq!(due.len(), 1);
    held.answered(&due[0], granted(tokens, valid_ns), T0);
    due[0].clone()
}

#[test]
fn a_bucket_nobody_wanted_goes_to_its_owner() {
    let held = Held::new(settings());
    assert_eq!(held.take(ID, 1, T0, key), Take::Forward);
    assert!(held.due(T0).is_empty());
}

#[test]
fn a_hot_bucket_asks_for_its_demand_and_spends_its_slice_here() {
    let held = Held::new(settings());
    assert!(held.want(ID));
    assert_eq!(held.take(ID, 1, T0, key), Take::Forward);
    let due = held.due(T0);
    assert_eq!(due.len(), 1);
    let (k, r) = key();
    assert_eq!(
        due[0].ask,
        LeaseAsk {
            key: k,
            rule: r,
            // 1,000 a second assumed, for 100 ms.
            want: 100,
            demand_per_s: 1_000,
        }
    );
    assert!(held.due(T0).is_empty(), "one ask on its way at a time");
    held.answered(&due[0], granted(4, SEC), T0);
    assert_eq!(held.tokens(), 4);
    for left in (1..4).rev() {
        let Take::Leased(a, t) = held.take(ID, 1, T0 + MS, key) else {
            panic!("not leased");
        };
        assert!(a.allowed && a.leased && a.remaining == left && a.limit == 1_000);
        assert_eq!(t.cost, 1);
    }
    // Less than half of the slice left: the renewal was asked for, with the demand measured
    // (3 in 1 ms: 3,000 a second).
    let due = held.due(T0 + MS);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].ask.demand_per_s, 3_000);
    assert!(matches!(held.take(ID, 1, T0 + MS, key), Take::Leased(..)));
    assert_eq!(
        held.take(ID, 1, T0 + MS, key),
        Take::Forward,
        "spent: to the owner"
    );
    assert_eq!(
        held.take(ID, 2, T0 + MS, key),
        Take::Forward,
        "a cost the slice cannot cover goes to the owner"
    );
}

#[test]
fn what_a_slice_has_left_when_its_time_is_up_goes_back_under_its_mark() {
    let held = Held::new(settings());
    leased_with(&held, 10, 100 * MS);
    for _ in 0..3 {
        assert!(matches!(held.take(ID, 1, T0 + MS, key), Take::Leased(..)));
    }
    assert!(held.returns(T0 + 99 * MS).is_empty());
    assert_eq!(held.take(ID, 1, T0 + 100 * MS, key), Take::Forward);
    let back = held.returns(T0 + 100 * MS);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].refund.cost, 7);
    assert_eq!(back[0].refund.mark.reset_ns, T0 + SEC);
    assert_eq!(held.tokens(), 0);
}

#[test]
fn an_owners_denial_is_kept_here_until_it_ends() {
    let held = Held::new(settings());
    assert!(held.want(ID));
    assert_eq!(held.take(ID, 1, T0, key), Take::Forward);
    let due = held.due(T0);
    let denial = CheckAnswer {
        allowed: false,
        limit: 10,
        remaining: 0,
        reset_at_ms: 7,
        retry_after_ms: 50,
        degraded: false,
        replica: false,
        leased: false,
    };
    held.answered(&due[0], LeaseGrant::Refused { answer: denial }, T0 + MS);
    let Take::Denied(a) = held.take(ID, 1, T0 + 10 * MS, key) else {
        panic!("not denied here");
    };
    assert!(!a.allowed && a.leased && a.retry_after_ms == 40);
    // From the ask: the owner's 50 ms end no later here.
    assert_eq!(held.take(ID, 1, T0 + 50 * MS, key), Take::Forward);
    assert_eq!(held.due(T0 + 50 * MS).len(), 1, "asked again");
}

#[test]
fn what_a_slice_holds_is_spent_before_an_owners_denial_applies() {
    let held = Held::new(settings());
    let first = leased_with(&held, 4, SEC);
    for _ in 0..3 {
        assert!(matches!(held.take(ID, 1, T0, key), Take::Leased(..)));
    }
    let denial = CheckAnswer {
        allowed: false,
        limit: 10,
        remaining: 0,
        reset_at_ms: 7,
        retry_after_ms: 50,
        degraded: false,
        replica: false,
        leased: false,
    };
    // The renewal asked at low water is refused: the bucket denies.
    held.answered(&first, LeaseGrant::Refused { answer: denial }, T0);
    assert!(
        matches!(held.take(ID, 1, T0, key), Take::Leased(..)),
        "the last token of the slice is still spent"
    );
    assert!(matches!(held.take(ID, 1, T0, key), Take::Denied(_)));
}

#[test]
fn an_owner_that_keeps_its_bucket_is_not_asked_again_before_the_backoff() {
    let held = Held::new(settings());
    assert!(held.want(ID));
    held.take(ID, 1, T0, key);
    let due = held.due(T0);
    let kept = CheckAnswer {
        allowed: true,
        limit: 10,
        remaining: 3,
        reset_at_ms: 7,
        retry_after_ms: 0,
        degraded: false,
        replica: false,
        leased: false,
    };
    held.answered(&due[0], LeaseGrant::Refused { answer: kept }, T0);
    assert_eq!(held.take(ID, 1, T0 + 500 * MS, key), Take::Forward);
    assert!(held.due(T0 + 500 * MS).is_empty());
    held.take(ID, 1, T0 + SEC, key);
    assert_eq!(held.due(T0 + SEC).len(), 1);
}

#[test]
fn released_slices_and_slices_granted_after_release_go_back() {
    let held = Held::new(settings());
    let first = leased_with(&held, 10, SEC);
    assert!(matches!(held.take(ID, 2, T0, key), Take::Leased(..)));
    assert!(held.release(ID, Release::Cooled));
    assert_eq!(held.count(), 0);
    assert_eq!(held.take(ID, 1, T0, key), Take::Forward);
    held.answered(&first, granted(5, SEC), T0);
    let back: Vec<u64> = held.returns(T0).iter().map(|r| r.refund.cost).collect();
    assert_eq!(back, [8, 5]);
}

#[test]
fn a_taken_cost_given_back_is_spendable_again() {
    let held = Held::new(settings());
    leased_with(&held, 2, SEC);
    let Take::Leased(_, t) = held.take(ID, 2, T0, key) else {
        panic!("not leased");
    };
    assert_eq!(held.tokens(), 0);
    held.give_back(&t);
    assert_eq!(held.tokens(), 2);
}

#[test]
fn the_table_is_bounded() {
    let held = Held::new(settings());
    for id in 0..4 {
        assert!(held.want(id));
    }
    assert!(!held.want(99));
    assert!(held.want(3), "one held already");
    assert_eq!(held.release_all(Release::Ring), 4);
    assert_eq!(held.released(Release::Ring), 4);
    assert_eq!(held.count(), 0);
}

#[test]
fn slices_shrink_as_the_bucket_empties() {
    assert_eq!(slice(100, 1_000, 1), 100);
    assert_eq!(slice(1_000, 1_000, 1), 500);
    assert_eq!(slice(1_000, 1_000, 3), 250);
    assert_eq!(slice(1_000, 3, 3), 1, "one token while any is left");
    assert_eq!(slice(1_000, 0, 1), 0);
    assert_eq!(slice(0, 10, 1), 0);
}

#[test]
fn a_windows_slice_ends_with_its_window() {
    let fw = rule(Algorithm::FixedWindow, 100, 1_000, 100);
    let start = T0 - T0 % SEC;
    let mut s = BucketState::fresh(&fw);
    let now = start + 300 * MS;
    let peek = s.decide(&fw, now, 0);
    let g = grant(&fw, 10, 1, now, peek, |n| s.decide(&fw, now, n));
    let LeaseGrant::Granted {
        tokens, valid_ns, ..
    } = g
    else {
        panic!("not granted: {g:?}");
    };
    assert_eq!((tokens, valid_ns), (10, 700 * MS));
    assert_eq!(s.decide(&fw, now, 0).remaining, 90, "taken at once");

    let sw = rule(Algorithm::SlidingWindow, 100, 1_000, 100);
    let mut s = BucketState::fresh(&sw);
    let peek = s.decide(&sw, now, 0);
    let g = grant(&sw, 10, 1, now, peek, |n| s.decide(&sw, now, n));
    assert!(matches!(g, LeaseGrant::Granted { valid_ns, .. } if valid_ns == 700 * MS));

    let tb = rule(Algorithm::TokenBucket, 100, 1_000, 100);
    let mut s = BucketState::fresh(&tb);
    let peek = s.decide(&tb, now, 0);
    let g = grant(&tb, 10, 1, now, peek, |n| s.decide(&tb, now, n));
    assert!(matches!(g, LeaseGrant::Granted { valid_ns, .. } if valid_ns == TOKEN_SLICE_NS));
    assert!(!leasable(Algorithm::LeakyBucket) && !leasable(Algorithm::SlidingLog));
}

#[test]
fn an_empty_bucket_refuses_with_its_denial() {
    let fw = rule(Algorithm::FixedWindow, 2, 1_000, 2);
    let mut s = BucketState::fresh(&fw);
    s.decide(&fw, T0, 2);
    let peek = s.decide(&fw, T0, 0);
    let g = grant(&fw, 10, 1, T0, peek, |n| s.decide(&fw, T0, n));
    let LeaseGrant::Refused { answer } = g else {
        panic!("granted from an empty bucket");
    };
    assert!(!answer.allowed && answer.retry_after_ms > 0);
}

#[test]
fn the_owner_shares_a_bucket_among_its_holders_and_forgets_slices_whose_time_is_up() {
    let grants = Grants::new(3);
    let seen = |holder: &str, now: u64| {
        let mut n = 0;
        grants.grant(ID, holder, now, |h| {
            n = h;
            granted(5, 100 * MS)
        });
        n
    };
    assert_eq!(seen("a", T0), 1);
    assert_eq!(seen("a", T0), 1, "a renewal: still one holder");
    assert_eq!(seen("b", T0), 2);
    assert_eq!(grants.live(T0), (3, 15));
    // Full: refused.
    assert!(matches!(
        grants.grant(ID, "c", T0, |_| granted(1, SEC)),
        LeaseGrant::Error { code, .. } if code == "lease_limit"
    ));
    // Their time is up: forgotten.
    assert_eq!(seen("c", T0 + 100 * MS), 1);
    assert_eq!(grants.live(T0 + 100 * MS), (1, 5));
    grants.forget(&[ID]);
    assert_eq!(grants.live(T0), (0, 0));
}

// ---------------------------------------------------------------------------------------------
// Never over the limit, whatever the interleaving
// ---------------------------------------------------------------------------------------------

/// One step of a cluster of an owner and three holders of one bucket.
#[derive(Debug, Clone)]
enum Step {
    /// Time passes (ns).
    Wait(u64),
    /// A check of `cost` arrives at holder `h` (3: at the owner), given back at once when
    /// `undo` (an all-or-nothing request another limit denied).
    Check { h: usize, cost: u64, undo: bool },
    /// Holder `h` sends its due asks.
    Ask(usize),
    /// The owner answers the oldest ask on its way.
    Grant,
    /// Holder `h` sends back what is due (expired or released slices).
    Return(usize),
    /// Holder `h` stops leasing the bucket (it cooled).
    Release(usize),
    /// Holder `h` finds the bucket hot again.
    Want(usize),
}

fn arb_step(period: u64) -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..period / 4).prop_map(Step::Wait),
        8 => (0usize..4, 1u64..4, prop::bool::weighted(0.1))
            .prop_map(|(h, cost, undo)| Step::Check { h, cost, undo }),
        2 => (0usize..3).prop_map(Step::Ask),
        2 => Just(Step::Grant),
        1 => (0usize..3).prop_map(Step::Return),
        1 => (0usize..3).prop_map(Step::Release),
        1 => (0usize..3).prop_map(Step::Want),
    ]
}

fn arb_leased_rule() -> impl Strategy<Value = Rule> {
    (0usize..3, 1u64..40, 1u64..40).prop_map(|(a, limit, burst)| {
        let algorithm = [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ][a];
        let burst = if algorithm == Algorithm::TokenBucket {
            burst
        } else {
            limit
        };
        rule(algorithm, limit, 1_000, burst)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Three holders and the owner check one bucket in any interleaving of checks, asks,
    /// grants, returns, releases and time: what they admit together keeps the bucket's bound
    /// — a window's limit per aligned window; a token bucket's `burst + rate · time` over the
    /// run (see the module's doc) — and every slice's tokens are either spent, given back or
    /// still held.
    #[test]
    fn leases_never_admit_more_than_the_bucket(
        r in arb_leased_rule(),
        steps in prop::collection::vec(arb_step(SEC), 1..200),
    ) {
        let start = T0 - T0 % SEC;
        let mut now = start;
        let mut owner = BucketState::fresh(&r);
        let holders: Vec<Held> = (0..3)
            .map(|_| {
                let h = Held::new(LeaseSettings { backoff_ns: 10 * MS, ..settings() });
                h.want(ID);
                h
            })
            .collect();
        let mut asks: VecDeque<(usize, Due)> = VecDeque::new();
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for step in steps {
            match step {
                Step::Wait(ns) => now += ns,
                // An edge refuses a cost beyond the bucket's capacity.
                Step::Check { cost, .. } if cost > r.capacity() => {}
                Step::Check { h: 3, cost, .. } => {
                    if owner.decide(&r, now, cost).allowed {
                        admitted.push((now, cost));
                    }
                }
                Step::Check { h, cost, undo } => match holders[h].take(ID, cost, now, key) {
                    Take::Leased(_, t) if undo => holders[h].give_back(&t),
                    Take::Leased(..) => admitted.push((now, cost)),
                    Take::Denied(_) => {}
                    Take::Forward => {
                        if owner.decide(&r, now, cost).allowed {
                            admitted.push((now, cost));
                        }
                    }
                },
                Step::Ask(h) => asks.extend(holders[h].due(now).into_iter().map(|d| (h, d))),
                Step::Grant => {
                    if let Some((h, due)) = asks.pop_front() {
                        let peek = owner.decide(&r, now, 0);
                        let g = grant(&r, due.ask.want, 3, now, peek, |n| owner.decide(&r, now, n));
                        holders[h].answered(&due, g, now);
                    }
                }
                Step::Return(h) => {
                    for back in holders[h].returns(now) {
                        owner.refund(&r, back.refund.cost, back.refund.mark, now);
                    }
                }
                Step::Release(h) => {
                    holders[h].release(ID, Release::Cooled);
                }
                Step::Want(h) => {
                    holders[h].want(ID);
                }
            }
        }
        match r.algorithm {
            Algorithm::TokenBucket => {
                let t = crate::limiter::token_bucket::emission_ns(&r);
                let mut sum = 0;
                for &(at, cost) in &admitted {
                    sum += cost;
                    let bound = r.burst + (at - start).div_ceil(t);
                    prop_assert!(sum <= bound, "{} admitted by {}, bound {} ({:?})", sum, at, bound, r);
                }
            }
            _ => {
                let mut per: HashMap<u64, u64> = HashMap::new();
                for &(at, cost) in &admitted {
                    *per.entry(at / r.period_ns).or_default() += cost;
                }
                for (w, n) in per {
                    prop_assert!(n <= r.limit, "window {} admitted {} ({:?})", w, n, r);
                }
            }
        }
    }
}
