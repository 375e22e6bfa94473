//! Local state across its parts, on a manual clock: the feed sees owned writes only, copies
//! decide nothing until promoted (or first touched, or stood in on), handovers and recalls are
//! readings of one history, and a debt denies everything until time repays it.

use super::*;
use crate::rules::RuleSpec;
use ringlimit_core::clock::ManualClock;
use ringlimit_core::limiter::test_support::T0;
use ringlimit_core::store::Cursor;
use std::sync::atomic::Ordering;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn local() -> (Local, Resolved) {
    let rules = RuleSet::from_yaml("rules:\n  - { name: gold, limit: 10, period: 1s }\n")
        .expect("valid rules");
    let l = Local::alone(rules, 1000, Arc::new(ManualClock::new(T0)));
    let (resolved, _) = l
        .rules()
        .prepare("k", RuleSpec::Named("gold"), 1)
        .expect("valid");
    (l, resolved)
}

fn changed(l: &Local, c: &mut Cursor) -> Vec<(u64, bool)> {
    let mut out = Vec::new();
    l.owned().changes(c, &mut out).expect("not lagged");
    out.iter().map(|ch| (ch.id, ch.state.is_some())).collect()
}

#[test]
fn owner_writes_enter_the_feed_and_share_writes_do_not() {
    let (l, resolved) = local();
    let rule = resolved.rule;
    let mut c = l.owned().follow().expect("the owned store has a feed");
    let (a, mark) = l.bucket(1, &rule, T0).hold(1);
    assert!(a.allowed);
    let mark = mark.expect("took its cost");
    assert_eq!(changed(&l, &mut c), vec![(1, true)]);
    l.bucket(1, &rule, T0).refund(1, mark);
    assert_eq!(changed(&l, &mut c), vec![(1, true)]);

    let (a, taken) = l.owned().share().hold(2, &rule, 1, 1, T0);
    let share_id = ringlimit_core::coordinator::share::fallback_id(2);
    assert!(a.allowed && l.owned().holds(share_id));
    l.owned().share().refund(&taken.expect("took its cost"), T0);
    assert_eq!(l.reset(&[share_id]), 1);
    assert_eq!(changed(&l, &mut c), vec![]);

    let out = l.owned().hand_out(|id, _| id == 1);
    assert_eq!(out.len(), 1);
    assert_eq!(changed(&l, &mut c), vec![(1, false)]);
    for (id, st) in out {
        l.take_in(id, st, T0);
    }
    assert_eq!(changed(&l, &mut c), vec![(1, true)]);
    assert_eq!(l.reset(&[1, 3]), 1);
    assert_eq!(changed(&l, &mut c), vec![(1, false)]);
    assert_eq!(l.owned().len(), 0);
    l.owned().unfollow(c);
}

#[test]
fn copies_decide_nothing_until_promoted_or_first_touched() {
    let (l, resolved) = local();
    let rule = resolved.rule;
    let mut c = l.owned().follow().expect("a feed");
    // A used-up bucket at its owner, copied here (twice: the owner's state replaces).
    let (used, spent) = (1, 2);
    let owner = Local::alone(RuleSet::builtin(), 100, Arc::new(ManualClock::new(T0)));
    for _ in 0..10 {
        owner.bucket(used, &rule, T0).decide(1);
        owner.bucket(spent, &rule, T0).decide(1);
    }
    let copies = l.copies();
    copies.keep(used, owner.owned().peek(used), T0);
    copies.keep(used, owner.owned().peek(used), T0);
    copies.keep(spent, owner.owned().peek(spent), T0);
    copies.keep(3, owner.owned().peek(3), T0);
    assert_eq!((copies.len(), l.owned().len()), (2, 0));
    assert_eq!(changed(&l, &mut c), vec![], "copies are not copied on");

    // A check before promotion starts from the copy, not from a full bucket.
    assert!(!l.bucket(used, &rule, T0).decide(1).allowed);
    assert_eq!((copies.len(), l.owned().len()), (1, 1));
    assert_eq!(
        changed(&l, &mut c),
        vec![(used, true)],
        "the new owner's bucket"
    );

    // Promotion merges with a bucket held already (one decided here while views
    // disagreed; here unspent): consumptions add.
    let promote = |pick: &dyn Fn(u64) -> bool| {
        copies.promote(|id, _| pick(id), |id, st| l.owned().absorb(id, st, T0))
    };
    l.owned()
        .absorb(spent, BucketState::Gcra { tat: T0, tag: 0 }, T0);
    copies.keep(4, owner.owned().peek(used), T0);
    assert_eq!(promote(&|id| id == spent), 1);
    assert!(!l.bucket(spent, &rule, T0).decide(1).allowed);
    assert_eq!(l.owned().peek(spent), owner.owned().peek(spent));
    // Its previous owner's handover, arriving after the promotion, is the same history:
    // it overlaps (the larger wins) instead of counting the copy twice.
    l.take_in(spent, owner.owned().peek(spent).expect("held"), T0);
    assert_eq!(l.owned().peek(spent), owner.owned().peek(spent));
    // A handover that comes first supersedes the copy: promoting later adds nothing.
    copies.keep(6, owner.owned().peek(used), T0);
    l.take_in(6, owner.owned().peek(used).expect("held"), T0);
    assert_eq!(promote(&|_| true), 1, "the copy of 4 only");
    assert_eq!(l.owned().peek(6), owner.owned().peek(used));
    l.take_in(4, BucketState::Gcra { tat: T0, tag: 0 }, T0);
    assert_eq!(l.owned().peek(4), owner.owned().peek(used), "overlapped");
    copies.keep(4, owner.owned().peek(used), T0);
    assert_eq!(copies.drop_if(|id, _| id == 4), 1);
    copies.keep(5, owner.owned().peek(used), T0);
    copies.keep(5, None, T0);
    assert_eq!(copies.len(), 0);
    l.owned().unfollow(c);
}

/// Standing in for an owner that does not answer: decisions on the copy, kept for the
/// owner (its later copies overlap instead of replacing them) until handed back; a copy
/// a check as the owner's started from (a peer whose ring already dropped the owner) is
/// still the one history a stand-in decides on.
#[test]
fn a_stand_in_decides_on_the_copy_and_keeps_it_for_the_owner() {
    let (l, resolved) = local();
    let rule = resolved.rule;
    let owner = Local::alone(RuleSet::builtin(), 100, Arc::new(ManualClock::new(T0)));
    for _ in 0..8 {
        owner.bucket(1, &rule, T0).decide(1);
    }
    let copies = l.copies();
    copies.keep(1, owner.owned().peek(1), T0);
    let a = l.bucket(1, &rule, T0).stand_in(1);
    assert!(a.allowed && a.remaining == 1, "{a:?}");
    // The owner's stale copy does not undo the stand-in's admission.
    copies.keep(1, owner.owned().peek(1), T0);
    assert_eq!(l.bucket(1, &rule, T0).stand_in(0).remaining, 1);
    let stood_in = copies.stood_in();
    assert_eq!(
        stood_in.iter().map(|s| (s.0, s.2)).collect::<Vec<_>>(),
        [(1, 1)]
    );
    // Handed back: a copy like any other again.
    copies.handed_back(1, 1);
    assert!(copies.stood_in().is_empty());
    copies.keep(1, owner.owned().peek(1), T0);
    assert_eq!(l.bucket(1, &rule, T0).stand_in(0).remaining, 2);

    // A check as the owner's started from the copy: the stand-in goes on from there.
    copies.keep(2, owner.owned().peek(1), T0);
    assert_eq!(l.bucket(2, &rule, T0).decide(1).remaining, 1);
    assert_eq!(copies.peek(2), None);
    assert!(l.bucket(2, &rule, T0).stand_in(1).allowed);
    assert!(
        !l.bucket(2, &rule, T0).stand_in(1).allowed,
        "not a fresh bucket"
    );
}

/// A recalled state and the handover of the same bucket are two readings of one history:
/// the handover overlaps what was recalled (and decided on since), it does not add to it;
/// a bucket the recall did not find is absorbed as before (the two histories add).
#[test]
fn a_recalled_bucket_overlaps_its_later_handover() {
    let (l, resolved) = local();
    let rule = resolved.rule;
    let (previous, _) = local();
    for _ in 0..6 {
        previous.bucket(1, &rule, T0).decide(1);
        previous.bucket(2, &rule, T0).decide(1);
    }
    let handed = |id| previous.owned().peek(id).expect("held");
    let remaining = |id, cost| l.bucket(id, &rule, T0).decide(cost).remaining;
    l.recall_in(1, handed(1), T0);
    assert_eq!(remaining(1, 1), 3, "6 recalled, 1 here");
    l.take_in(1, handed(1), T0);
    assert_eq!(remaining(1, 0), 3, "not 6 more");
    // Nothing recalled for 2: decided here from a full bucket, then the handover adds.
    assert_eq!(remaining(2, 1), 9);
    l.take_in(2, handed(2), T0);
    assert_eq!(remaining(2, 0), 3);
    // Forgotten once the window closed: a later handover adds again.
    l.recall_in(3, handed(1), T0);
    l.copies().forget_recalled();
    l.take_in(3, handed(1), T0);
    assert_eq!(remaining(3, 0), 0);
}

/// A reservation at the owner: given back, taken into debt; while a bucket owes, every
/// decision on it denies (checks, holds, lease grants, reserves) and takes nothing, until
/// its refill has repaid the debt; a reservation of 0 holds nothing; a reset forgets the
/// bucket, its debt with it.
#[test]
fn a_bucket_in_debt_denies_everything_until_time_repays_it() {
    let (l, resolved) = local();
    let rule = resolved.rule;
    let (id, ttl_ms) = (9, 60_000);
    let table = || l.reservations().table();
    let a = l.reserve(&resolved, id, (6, ttl_ms, 1), T0).expect("kept");
    assert_eq!((a.allowed, a.remaining), (true, 4));
    let settle = |nonce, cost, now| l.settle(&resolved, id, (nonce, cost), now);
    assert_eq!(settle(1, 2, T0).map(|a| a.remaining), Ok(8));
    assert_eq!(settle(1, 2, T0), Err(ReserveError::Unknown), "settled once");
    // 5 reserved (3 left), 10 used: 3 more taken now, 2 owed.
    l.reserve(&resolved, id, (5, ttl_ms, 2), T0).expect("kept");
    let a = settle(2, 10, T0).expect("live");
    assert_eq!((a.allowed, a.remaining), (false, 0));
    assert_eq!(
        a.retry_after_ms, 300,
        "2 owed, then 1 to take, at 10 a second"
    );
    assert_eq!(l.owned().debts.owed.load(Ordering::Relaxed), 2);
    assert!(!l.bucket(id, &rule, T0).decide(1).allowed);
    assert_eq!(l.bucket(id, &rule, T0).hold(1).1, None, "nothing taken");
    assert!(matches!(
        l.lease(id, &rule, ("n1", 5), T0),
        LeaseGrant::Refused { .. }
    ));
    let denied = l
        .reserve(&resolved, id, (1, ttl_ms, 3), T0)
        .expect("answered");
    assert!(!denied.allowed && table().is_empty());
    assert!(!l.bucket(id, &rule, T0 + 300 * MS - 1).decide(1).allowed);
    assert!(
        l.bucket(id, &rule, T0 + 300 * MS).decide(1).allowed,
        "repaid"
    );
    // A reservation of 0 takes nothing and is kept nowhere.
    let a = l
        .reserve(&resolved, id, (0, 1_000, 4), T0 + SEC)
        .expect("answered");
    assert!(a.allowed && table().is_empty());
    // Expired reservations are swept; a reset forgets the bucket, debt and all.
    l.reserve(&resolved, id, (1, 1_000, 5), T0 + SEC)
        .expect("kept");
    assert_eq!(l.reservations().sweep(T0 + 3 * SEC), 1);
    l.reserve(&resolved, id, (1, ttl_ms, 6), T0 + 3 * SEC)
        .expect("kept");
    assert!(!settle(6, 10, T0 + 3 * SEC).expect("live").allowed);
    l.reset(&[id]);
    assert!(l.bucket(id, &rule, T0 + 3 * SEC).decide(1).allowed);
}
