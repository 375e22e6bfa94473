//! Reservations at one owner's local state, on a manual clock: debts are part of their buckets
//! (however many other buckets owe, a bucket's debt stays, and it travels with the bucket on
//! every path a state takes), and the table holds nothing for a reservation of cost 0, bounds
//! a reservation's life, and is shared fairly between rules.

use super::*;
use crate::local::Local;
use crate::rules::{RuleSet, RuleSpec};
use ringlimit_core::clock::ManualClock;
use ringlimit_core::limiter::BucketState;
use ringlimit_core::limiter::test_support::{MS, SEC, T0};
use ringlimit_proto::{Algorithm, InlineRule};

const RULES: &str =
    "rules:\n  - { name: gold, limit: 1000, period: 1h, algorithm: fixed_window }\n";

fn local(max_keys: u64) -> (Local, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let rules = RuleSet::from_yaml(RULES).expect("valid rules");
    (Local::alone(rules, max_keys, clock.clone()), clock)
}

fn inline(limit: u64, period_ms: u64, algorithm: Algorithm) -> InlineRule {
    InlineRule {
        limit,
        period_ms,
        algorithm,
        burst: None,
        calendar: None,
    }
}

/// One key under one rule at one node: reserve, check and settle as the owner does.
struct Key<'a> {
    local: &'a Local,
    resolved: Resolved,
    id: u64,
}

impl<'a> Key<'a> {
    fn new(local: &'a Local, key: &str, spec: RuleSpec<'_>) -> Self {
        let (resolved, id) = local.rules().prepare(key, spec, 0).expect("a valid check");
        Self {
            local,
            resolved,
            id,
        }
    }

    fn reserve(&self, cost: u64, ttl_ms: u64, nonce: u128) -> Result<CheckAnswer, ReserveError> {
        let now = self.local.now();
        self.local
            .reserve(&self.resolved, self.id, (cost, ttl_ms, nonce), now)
    }

    fn settle(&self, nonce: u128, cost: u64) -> Result<CheckAnswer, ReserveError> {
        let now = self.local.now();
        self.local
            .settle(&self.resolved, self.id, (nonce, cost), now)
    }

    fn check(&self, cost: u64) -> CheckAnswer {
        let now = self.local.now();
        self.local
            .bucket(self.id, &self.resolved.rule, now)
            .decide(cost)
    }

    /// How many checks of cost 1 (of `tries`) are admitted now.
    fn admits(&self, tries: u64) -> u64 {
        (0..tries).map(|_| u64::from(self.check(1).allowed)).sum()
    }

    /// Takes the whole window and settles a reservation 99 above what was left: the bucket
    /// owes 99.
    fn overspend_by_99(&self, nonce: u128) {
        let limit = self.resolved.rule.limit;
        let r = self.reserve(1, 60_000, nonce).expect("kept");
        assert!(r.allowed, "{r:?}");
        assert!(self.check(limit - 1).allowed);
        let after = self.settle(nonce, 100).expect("live");
        assert!(!after.allowed && after.remaining == 0, "{after:?}");
    }
}

/// 100,001 throwaway keys each owing a token, then a victim (100 per 5 s) that overspent by 99: its
/// next window admits 1, not 100, however many buckets owe.
#[test]
fn a_debt_stays_with_its_bucket_however_many_others_owe() {
    let (e, clock) = local(300_000);
    let throwaway = inline(2, 86_400_000, Algorithm::FixedWindow);
    for i in 0..100_001u128 {
        let k = Key::new(&e, &format!("junk:{i}"), RuleSpec::Inline(throwaway));
        assert!(k.reserve(1, 60_000, i).expect("kept").allowed);
        assert!(k.check(1).allowed);
        // 2 used of 2, settled at 2: one more than was left, owed.
        assert!(!k.settle(i, 2).expect("live").allowed);
    }
    let five_s = inline(100, 5_000, Algorithm::FixedWindow);
    let victim = Key::new(&e, "victim", RuleSpec::Inline(five_s));
    let start = T0 - T0 % (5 * SEC) + 5 * SEC;
    clock.set(start);
    victim.overspend_by_99(u128::MAX);
    clock.set(start + 5 * SEC);
    assert_eq!(
        victim.admits(200),
        1,
        "the next window admits what it owes less"
    );
    clock.set(start + 10 * SEC);
    assert_eq!(victim.admits(200), 100, "and then its limit again");
}

/// A bucket in debt keeps it through a handover (out of one owner, into the next) and a
/// recall, for a token bucket and a window alike: the next owner denies as the first would.
#[test]
fn a_bucket_in_debt_keeps_it_when_it_moves() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::TokenBucket] {
        let rule = inline(100, 5_000, algorithm);
        let (first, clock) = local(1_000);
        let start = T0 - T0 % (5 * SEC) + 5 * SEC;
        clock.set(start);
        let k = Key::new(&first, "moving", RuleSpec::Inline(rule));
        k.overspend_by_99(1);
        let out = first.owned().hand_out(|id, _| id == k.id);
        assert_eq!(out.len(), 1, "{algorithm}: a bucket in debt is not idle");
        for recalled in [false, true] {
            let (next, clock) = local(1_000);
            clock.set(start + 100 * MS);
            for (id, state) in out.iter().cloned() {
                let state = BucketState::from_wire(state.to_wire());
                if recalled {
                    next.recall_in(id, state, start + 100 * MS);
                } else {
                    next.take_in(id, state, start + 100 * MS);
                }
            }
            let moved = Key::new(&next, "moving", RuleSpec::Inline(rule));
            assert_eq!(moved.admits(10), 0, "{algorithm}, recalled {recalled}");
            // One period later the rule has given 100 again, of which 99 were owed.
            clock.set(start + 5 * SEC);
            assert_eq!(moved.admits(200), 1, "{algorithm}, recalled {recalled}");
        }
    }
}

/// A replica standing in for a stalled owner decides on its copy as the owner would: the
/// copy carries the debt.
#[test]
fn a_replicas_copy_carries_the_debt() {
    let rule = inline(100, 5_000, Algorithm::FixedWindow);
    let (owner, clock) = local(1_000);
    let start = T0 - T0 % (5 * SEC) + 5 * SEC;
    clock.set(start);
    let k = Key::new(&owner, "copied", RuleSpec::Inline(rule));
    k.overspend_by_99(1);
    let (replica, _) = local(1_000);
    let copy = owner
        .owned()
        .peek(k.id)
        .map(|s| BucketState::from_wire(s.to_wire()));
    replica.copies().keep(k.id, copy, start);
    let next = start + 5 * SEC;
    let admitted: u64 = (0..200)
        .map(|_| {
            let bucket = replica.bucket(k.id, &k.resolved.rule, next);
            u64::from(bucket.stand_in(1).allowed)
        })
        .sum();
    assert_eq!(admitted, 1, "as the owner would");
}

/// A reservation of cost 0 takes nothing, so it holds nothing: 100,001 of them leave the
/// table empty, and a real reservation is kept after them.
#[test]
fn reservations_of_cost_0_hold_no_room() {
    let (e, _) = local(1_000);
    let rule = inline(10, 3_600_000, Algorithm::TokenBucket);
    for i in 0..100_001u128 {
        let k = Key::new(&e, &format!("free:{}", i % 1_000), RuleSpec::Inline(rule));
        let a = k.reserve(0, 60_000, i).expect("answered");
        assert!(a.allowed, "{a:?}");
    }
    assert_eq!(e.reservations().table().len(), 0);
    let k = Key::new(&e, "real", RuleSpec::Inline(rule));
    assert!(k.reserve(1, 60_000, u128::MAX).expect("kept").allowed);
    assert_eq!(e.reservations().table().len(), 1);
}

/// A reservation's time to live is bounded by the node: beyond it, a clear 400.
#[test]
fn a_ttl_beyond_the_nodes_bound_is_refused_naming_the_bound() {
    let (e, _) = local(1_000);
    let k = Key::new(&e, "k", RuleSpec::Named("gold"));
    let e = k.reserve(1, 600_001, 1).expect_err("over the bound");
    assert_eq!(e.code(), "invalid_request");
    let message = e.to_string();
    assert!(
        message.contains("ttl_ms") && message.contains("600000"),
        "{message}"
    );
    assert!(k.reserve(1, 600_000, 2).expect("at the bound").allowed);
}

/// A flood of small real reservations on throwaway keys of one rule takes no more than its
/// share of the table: another rule's reservations are still kept, named or inline.
#[test]
fn one_rule_flooding_the_table_leaves_room_for_the_others() {
    let (e, _) = local(300_000);
    let flood = inline(1, 3_600_000, Algorithm::FixedWindow);
    let mut refused = None;
    for i in 0..100_001u128 {
        let k = Key::new(&e, &format!("flood:{i}"), RuleSpec::Inline(flood));
        match k.reserve(1, 60_000, i) {
            Ok(a) => assert!(a.allowed, "{a:?}"),
            Err(err) => {
                assert_eq!(err.code(), "too_many_reservations", "{err}");
                refused = Some(i);
                break;
            }
        }
    }
    let refused = refused.expect("the flooding rule is refused at its share");
    assert!(refused >= 10_000, "a rule alone may hold many: {refused}");
    let named = Key::new(&e, "tenant:1", RuleSpec::Named("gold"));
    assert!(named.reserve(1, 60_000, u128::MAX).expect("kept").allowed);
    let other = inline(5, 60_000, Algorithm::SlidingWindow);
    let other = Key::new(&e, "tenant:2", RuleSpec::Inline(other));
    assert!(
        other
            .reserve(1, 60_000, u128::MAX - 1)
            .expect("kept")
            .allowed
    );
}
