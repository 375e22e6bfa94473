//! Both sides with a manual clock: allowances, fallback, reservations, lost grants.

use super::*;
use crate::limiter::BucketState;
use crate::limiter::test_support::{MS, SEC, T0, rule};
use ringlimit_proto::region::{AskAgain, AskTally, RegionAsk, RegionGrant, SliceBack};
use ringlimit_proto::{Algorithm, RuleRef};

const ID: u64 = 7;

fn key() -> (String, RuleRef) {
    ("k".to_owned(), RuleRef::Named("shared".to_owned()))
}

fn setup() -> (RegionSettings, Rule, Allowances, Allocator, BucketState) {
    let s = RegionSettings::new(SEC, 3);
    let r = rule(Algorithm::FixedWindow, 900, 60_000, 900);
    (
        s,
        r,
        Allowances::new(s, 10),
        Allocator::new(s, 10),
        BucketState::fresh(&r),
    )
}

/// Sends what `side` has due to the home at `now` and hands the grants back at `now`.
fn exchange(side: &Allowances, home: &mut Allocator, real: &mut BucketState, r: &Rule, now: u64) {
    exchange_ahead(side, home, real, r, now, None);
}

/// [`exchange`], the home's clock `ahead` of the region's as the region measured it.
fn exchange_ahead(
    side: &Allowances,
    home: &mut Allocator,
    real: &mut BucketState,
    r: &Rule,
    now: u64,
    ahead: Option<i64>,
) {
    for d in side.due(now) {
        let g = home.ask(
            d.id,
            r,
            1,
            d.seq,
            &d.ask,
            now,
            &mut Owned {
                state: real,
                rule: r,
            },
        );
        assert_eq!(side.answered(d.id, d.seq, g, now, ahead), None);
    }
}

/// The home's tick of bucket `ID` at `now`.
fn tick(home: &mut Allocator, real: &mut BucketState, r: &Rule, now: u64) {
    home.tick(
        ID,
        now,
        &mut Owned {
            state: real,
            rule: r,
        },
    );
}

#[test]
fn a_new_bucket_admits_its_advance_then_decides_on_its_slices() {
    let (_, r, side, mut home, mut real) = setup();
    let t = T0;
    // One interval's equal part (900/60/3 = 5) ahead of the first grant.
    for _ in 0..5 {
        assert!(
            side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key)
                .allowed()
        );
    }
    let v = side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key);
    assert!(matches!(v, Verdict::Denied { .. }), "{v:?}");
    exchange(&side, &mut home, &mut real, &r, t + MS);
    // The advance was charged at the home, and a slice came.
    let left = real.decide(&r, t + MS, 0).remaining;
    assert!(left < 900 - 5, "{left}");
    let v = side.check(ID, &r, OnRegionUnreachable::Share, 1, t + 2 * MS, key);
    assert!(v.allowed() && !v.degraded(), "{v:?}");
}

#[test]
fn a_region_falls_back_only_when_its_allowance_expires() {
    let (s, r, side, mut home, mut real) = setup();
    let t = T0;
    side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key);
    exchange(&side, &mut home, &mut real, &r, t);
    let until = side.allowance_until(ID).expect("granted");
    assert_eq!(until, t + s.allowance_ns());
    // No more grants: denied (not degraded) while the allowance lasts, then the fallback.
    let mut now = t + MS;
    while now < until {
        let v = side.check(ID, &r, OnRegionUnreachable::Share, 1, now, key);
        assert!(!v.degraded(), "degraded at {} ms", (now - t) / MS);
        side.due(now);
        now += 100 * MS;
    }
    let v = side.check(ID, &r, OnRegionUnreachable::Share, 1, until, key);
    assert!(v.degraded() && v.allowed(), "{v:?}");
    // The fallback is a third of the limit, less what the region admitted on its slices.
    let mut admitted = 0;
    while side
        .check(ID, &r, OnRegionUnreachable::Share, 1, until, key)
        .allowed()
    {
        admitted += 1;
        assert!(admitted <= 300);
    }
    assert!(admitted < 300, "{admitted}");
    // `open` admits.
    let v = side.check(ID, &r, OnRegionUnreachable::Open, 1, until, key);
    assert_eq!(v, Verdict::Open);
}

/// A region whose reports were lost long enough for the home to reserve its fallback share,
/// back before it admitted much on its fallback: once its count of what it admitted there is
/// final, the rest of the reservation goes back to the bucket (counted as granted to it
/// whole, its part of the window was spent on it: a region at its fair share was denied for
/// the rest of the window).
#[test]
fn a_reservation_a_returning_region_did_not_use_goes_back() {
    let (s, r, side, mut home, mut real) = setup();
    let t = T0 - T0 % (60 * SEC);
    let mut admitted = 0u64;
    let mut check = |now: u64| {
        if side
            .check(ID, &r, OnRegionUnreachable::Share, 1, now, key)
            .allowed()
        {
            admitted += 1;
        }
    };
    check(t);
    exchange(&side, &mut home, &mut real, &r, t);
    // Its reports are lost for a little over its allowance: the home reserves for it, and it
    // admits two checks on its fallback.
    let mut now = t;
    while now < t + s.allowance_ns() + 100 * MS {
        now += 100 * MS;
        tick(&mut home, &mut real, &r, now);
        side.due(now);
        if now.is_multiple_of(SEC) {
            check(now);
        }
    }
    check(now);
    check(now);
    assert_eq!(home.totals(now)[1].away, 1);
    // Back: a report, and the next one once its grant came.
    for _ in 0..2 {
        now += s.interval_ns;
        check(now);
        exchange(&side, &mut home, &mut real, &r, now);
    }
    let used = 900 - real.decide(&r, now, 0).remaining;
    let held = side.totals(now).tokens;
    assert!(
        used <= admitted + held + 2,
        "{used} taken for {admitted} admitted and {held} held"
    );
}

#[test]
fn the_home_reserves_a_fallback_share_for_a_region_that_stopped_renewing() {
    let (s, r, side, mut home, mut real) = setup();
    let t = T0 - T0 % (60 * SEC);
    side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key);
    exchange(&side, &mut home, &mut real, &r, t);
    let before = real.decide(&r, t, 0).remaining;
    // Half an interval before its allowance ends, the home takes its share less its grants.
    let at = t + s.allowance_ns() - s.interval_ns / 2;
    tick(&mut home, &mut real, &r, at - MS);
    assert_eq!(real.decide(&r, at, 0).remaining, before);
    tick(&mut home, &mut real, &r, at);
    let after = real.decide(&r, at, 0).remaining;
    // Its check ahead of the first grant (the advance) counts as granted to it in the window.
    let granted = home.moved(1) + 1;
    assert_eq!(before - after, 300 - granted);
    assert_eq!(home.totals(at)[1].away, 1);
    // Every new window, a whole share.
    let next = t + 60 * SEC;
    tick(&mut home, &mut real, &r, next);
    assert_eq!(real.decide(&r, next, 0).remaining, 600);
}

#[test]
fn a_lost_grant_is_given_back_when_the_region_says_so() {
    let (s, r, side, mut home, mut real) = setup();
    let t = T0;
    side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key);
    let due = side.due(t);
    let d = &due[0];
    let g = home.ask(
        d.id,
        &r,
        1,
        d.seq,
        &d.ask,
        t,
        &mut Owned {
            state: &mut real,
            rule: &r,
        },
    );
    let RegionGrant::Granted { tokens, .. } = g else {
        panic!("{g:?}");
    };
    assert!(tokens > 0);
    let left = real.decide(&r, t, 0).remaining;
    // The grant never arrives; a late copy is dropped once given up.
    let later = t + s.interval_ns;
    let next = side.due(later);
    assert_eq!(next[0].ask.unanswered, vec![d.seq]);
    assert_eq!(side.answered(ID, d.seq, g, later, None), None);
    let n = &next[0];
    home.ask(
        n.id,
        &r,
        1,
        n.seq,
        &n.ask,
        later,
        &mut Owned {
            state: &mut real,
            rule: &r,
        },
    );
    // Given back, then the new slice taken.
    let RegionGrant::Granted { .. } = home.ask(
        n.id,
        &r,
        1,
        n.seq + 100,
        &n.ask,
        later,
        &mut Owned {
            state: &mut real,
            rule: &r,
        },
    ) else {
        panic!("refused");
    };
    assert!(real.decide(&r, later, 0).remaining <= left + tokens);
}

#[test]
fn bad_asks_never_change_a_bucket() {
    let (_, r, _, mut home, mut real) = setup();
    let ask = ringlimit_proto::region::RegionAsk {
        key: "k".to_owned(),
        rule: RuleRef::Named("shared".to_owned()),
        demand_milli: u64::MAX,
        back: vec![],
        advance: 0,
        early: false,
        leaving: false,
        held: u64::MAX,
        unanswered: vec![1, 2, 3],
        tally: Some(ringlimit_proto::region::AskTally {
            asked_total: u64::MAX,
            fallback_total: 0,
            asked_at_turn: 0,
            again: vec![],
        }),
    };
    let g = home.ask(
        ID,
        &r,
        9,
        1,
        &ask,
        T0,
        &mut Owned {
            state: &mut real,
            rule: &r,
        },
    );
    assert!(matches!(g, RegionGrant::Error { .. }));
    assert_eq!(real.decide(&r, T0, 0).remaining, 900);
    // A huge demand gets at most the budget.
    let g = home.ask(
        ID,
        &r,
        1,
        1,
        &ask,
        T0,
        &mut Owned {
            state: &mut real,
            rule: &r,
        },
    );
    let RegionGrant::Granted { tokens, .. } = g else {
        panic!("{g:?}");
    };
    assert!(tokens <= 900);
}

/// A window's slices end with it: the region asks for the new window's first slice as soon
/// as the window has turned at the home, not at its next regular report.
#[test]
fn a_region_asks_for_the_new_windows_slice_when_its_window_turns() {
    let (s, r, side, mut home, mut real) = setup();
    // The window (a minute from the epoch) ends 2.5 s after the first check.
    let wend = (T0 / (60 * SEC) + 1) * 60 * SEC;
    let t = wend - 2_500 * MS;
    assert!(
        side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key)
            .allowed()
    );
    exchange(&side, &mut home, &mut real, &r, t);
    // Regular reports each interval, 10 checks between them; the last report before the
    // window's end at wend - 0.5 s.
    for k in 1..=2 {
        for i in 0..10 {
            let at = t + (k - 1) * SEC + 50 * MS + i * 90 * MS;
            side.check(ID, &r, OnRegionUnreachable::Share, 1, at, key);
        }
        exchange(&side, &mut home, &mut real, &r, t + k * SEC);
    }
    let next_regular = t + 3 * SEC;
    // Checks keep coming.
    assert!(
        side.check(ID, &r, OnRegionUnreachable::Share, 1, wend - 10 * MS, key)
            .allowed()
    );
    // At the window's end its slices are gone; a little after, the report goes, half an
    // interval before the regular one would.
    assert!(side.due(wend).is_empty());
    let margin = s.interval_ns / 50;
    let due = side.due(wend + margin);
    assert_eq!(due.len(), 1, "{due:?}");
    assert!(due[0].ask.early);
    assert!(wend + margin < next_regular);
    // Its grant is of the new window.
    let g = home.ask(
        ID,
        &r,
        1,
        due[0].seq,
        &due[0].ask,
        wend + margin,
        &mut Owned {
            state: &mut real,
            rule: &r,
        },
    );
    let RegionGrant::Granted { tokens, .. } = g else {
        panic!("{g:?}");
    };
    // A whole interval's share (7 here), not the part of the half interval since its last
    // grant that an early report gets (3).
    assert!(tokens >= 6, "{g:?}");
    assert_eq!(side.answered(ID, due[0].seq, g, wend + margin, None), None);
    assert!(
        side.check(ID, &r, OnRegionUnreachable::Share, 1, wend + margin, key)
            .allowed()
    );
}

/// The home's own link to a region may be down while the region still reaches it (a round
/// trip that timed out): a region that renews is not reserved for, and what it is granted in
/// the window is what it was granted.
#[test]
fn a_region_that_renews_is_not_reserved_for_while_the_homes_link_to_it_is_down() {
    let (s, r, side, mut home, mut real) = setup();
    let t = T0 - T0 % (60 * SEC);
    side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key);
    exchange(&side, &mut home, &mut real, &r, t);
    home.set_down(1, true);
    let mut now = t;
    let mut admitted = 1u64;
    for _ in 0..20 {
        now += s.interval_ns;
        tick(&mut home, &mut real, &r, now);
        for _ in 0..10 {
            if side
                .check(ID, &r, OnRegionUnreachable::Share, 1, now, key)
                .allowed()
            {
                admitted += 1;
            }
        }
        exchange(&side, &mut home, &mut real, &r, now);
    }
    assert_eq!(home.totals(now)[1].away, 0);
    // Alone, asking 10 a second of 900 a minute: the bucket is charged with its grants (a
    // few slices held), not with a reservation on top at every tick (512 taken for 193
    // admitted before).
    let used = 900 - real.decide(&r, now, 0).remaining;
    assert!(admitted >= 190, "{admitted}");
    assert!(
        used <= admitted + 30,
        "{used} taken for {admitted} admitted"
    );
}

/// What a region admitted ahead of its first grant is told with its report; when that report
/// is lost (no grant within an interval), the next one tells it again under the lost ask's
/// number, or the home would never charge it. A link of an older version carries it as an
/// advance of the next ask.
#[test]
fn a_lost_report_tells_its_advance_again() {
    let (s, r, side, _home, _real) = setup();
    let t = T0;
    for _ in 0..3 {
        assert!(
            side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key)
                .allowed()
        );
    }
    let first = side.due(t);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].ask.advance, 3);
    // Lost on the way: nothing answered within the interval.
    let again = side.due(t + s.interval_ns);
    assert_eq!(again.len(), 1);
    let ask = &again[0].ask;
    assert_eq!(ask.unanswered, vec![first[0].seq]);
    let tally = ask.tally.clone().unwrap_or_default();
    assert_eq!(tally.asked_total, 3);
    assert_eq!(tally.again.len(), 1, "{ask:?}");
    assert_eq!(
        (tally.again[0].seq, tally.again[0].advance),
        (first[0].seq, 3)
    );
    assert_eq!(ask.advance, 0);
    assert_eq!(ask.clone().untallied().advance, 3);
}

/// A home's grant `g`'s tokens and mark.
fn slice_of(g: &RegionGrant) -> (u64, ringlimit_proto::peer::Mark) {
    match g {
        RegionGrant::Granted { tokens, mark, .. } => (*tokens, *mark),
        RegionGrant::Error { message, .. } => panic!("{message}"),
    }
}

/// What a lost ask gave back is told again with the next: the home that never saw the ask
/// returns it to the bucket, the home that saw it (only its grant was lost) does not return it
/// twice, and an ask that comes twice is applied once.
#[test]
fn a_lost_asks_returns_are_applied_once() {
    for arrived in [false, true] {
        let (_, r, _, mut home, mut real) = setup();
        let now = T0 - T0 % (60 * SEC) + 10 * SEC;
        let ask = |seq: u64, back: Vec<SliceBack>, again: Vec<AskAgain>| RegionAsk {
            key: "k".to_owned(),
            rule: RuleRef::Named("shared".to_owned()),
            demand_milli: 10_000,
            back,
            advance: 0,
            early: false,
            leaving: false,
            held: 0,
            unanswered: vec![],
            tally: Some(AskTally {
                asked_total: seq * 10,
                fallback_total: 0,
                asked_at_turn: 0,
                again,
            }),
        };
        let ask_home = |home: &mut Allocator, real: &mut BucketState, seq, a: &RegionAsk| {
            let before = real.decide(&r, now, 0).remaining;
            let g = home.ask(
                ID,
                &r,
                1,
                seq,
                a,
                now,
                &mut Owned {
                    state: real,
                    rule: &r,
                },
            );
            let (tokens, mark) = slice_of(&g);
            let after = real.decide(&r, now, 0).remaining;
            (after + tokens - before, tokens, mark)
        };
        let (_, tokens, mark) = ask_home(&mut home, &mut real, 1, &ask(1, vec![], vec![]));
        assert!(tokens > 0);
        let back = vec![SliceBack { tokens, mark }];
        if arrived {
            let (returned, ..) = ask_home(&mut home, &mut real, 2, &ask(2, back.clone(), vec![]));
            assert_eq!(returned, tokens);
            // The same ask again (a relay's retry): applied once.
            let (returned, ..) = ask_home(&mut home, &mut real, 2, &ask(2, back.clone(), vec![]));
            assert_eq!(returned, 0);
        }
        let told = vec![AskAgain {
            seq: 2,
            back,
            advance: 0,
        }];
        let (returned, ..) = ask_home(&mut home, &mut real, 3, &ask(3, vec![], told));
        assert_eq!(
            returned,
            if arrived { 0 } else { tokens },
            "arrived: {arrived}"
        );
        if arrived {
            // A region holding the bucket anew (its count went back) whose ask bears a number
            // this home saw: its return is applied.
            let (_, tokens, mark) = ask_home(&mut home, &mut real, 4, &ask(4, vec![], vec![]));
            let mut anew = ask(2, vec![SliceBack { tokens, mark }], vec![]);
            anew.tally = Some(AskTally {
                asked_total: 1,
                fallback_total: 0,
                asked_at_turn: 0,
                again: vec![],
            });
            let (returned, ..) = ask_home(&mut home, &mut real, 2, &anew);
            assert_eq!(returned, tokens);
        }
    }
}

/// With the home's clock offset measured, a region notes its count of checks at the home's
/// window turn and tells it: the home counts the new window's checks exactly, not a share of
/// its report's by time.
#[test]
fn a_region_tells_its_count_at_the_windows_turn() {
    let (_, r, side, mut home, mut real) = setup();
    let wend = T0 - T0 % (60 * SEC) + 60 * SEC;
    let t = wend - 2 * SEC;
    side.check(ID, &r, OnRegionUnreachable::Share, 1, t, key);
    // The same clock: the home's window ends where the region's does.
    exchange_ahead(&side, &mut home, &mut real, &r, t, Some(0));
    for at in [wend - 300 * MS, wend - 100 * MS, wend + 100 * MS] {
        side.check(ID, &r, OnRegionUnreachable::Share, 1, at, key);
    }
    let due = side.due(wend + 200 * MS);
    let tally = due
        .iter()
        .find_map(|d| d.ask.tally.clone())
        .expect("a report");
    assert_eq!(
        (tally.asked_total, tally.asked_at_turn),
        (4, 3),
        "{tally:?}"
    );
}
