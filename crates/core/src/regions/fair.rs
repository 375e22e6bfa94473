//! How much of a shared bucket the home hands out for the next interval ([`budget`]), and how
//! it splits that among the regions ([`split`]); for a fixed window, each region's part of the
//! whole window ([`window_share`]).

use crate::limiter::Rule;
use ringlimit_proto::Algorithm;

/// A region is granted up to this much more than its demand of the last interval: demand
/// measured over one interval is a sample (Poisson arrivals), and a region whose demand grows
/// must not be starved until its next report. What it does not spend goes back at its next
/// report (exact), so the room is modest.
pub const HEADROOM: f64 = 1.1;

/// What the home may hand out for the next `interval_ns` of a bucket of `rule` whose pool
/// (what is left of it plus the live slices of this window held by the other regions) is
/// `pool`, its current window ending in `window_rest_ns` (ignored for a token bucket).
///
/// - **Fixed and sliding window**: what is left, spread evenly over the rest of the window
///   (`pool · interval / rest`), so that the window's limit lasts the window and a region
///   whose demand arrives late in it still finds its share; never less than the rule's
///   average pace (`limit · interval / period`): a window spent ahead of pace (advances,
///   returns that came late) is not starved for the whole of its rest, its denials only come
///   at its end. In the window's last interval, everything left.
/// - **Token bucket** (`pool`: what it holds now): its refill over the interval, plus what it
///   holds beyond three intervals' refill (its burst, when full): what the bucket itself would
///   admit to a burst of checks. Up to three intervals' refill is the bucket between asks
///   (regions ask at different times, each taking its share of the refill as it comes): were
///   it handed out, whichever region asks after a lull would get more than its share. The split caps each region at its demand, so a full bucket is not
///   emptied into regions that would not spend it. Regions ask at different times, so an
///   empty bucket holds only part of an interval's refill at any one ask: what a region is
///   short of its share is owed to it at its next ask (see `Allocator::ask`).
///
/// A window's budget is never more than `pool`. The windows' figure is fractional: the split rounds per region
/// and carries the fractions over.
pub fn budget(rule: &Rule, pool: u64, window_rest_ns: u64, interval_ns: u64) -> f64 {
    let pool_f = pool as f64;
    match rule.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            if window_rest_ns <= interval_ns {
                return pool_f;
            }
            let spread = pool_f * interval_ns as f64 / window_rest_ns as f64;
            let pace = rule.limit as f64 * interval_ns as f64 / rule.period_ns.max(1) as f64;
            spread.max(pace).min(pool_f)
        }
        _ => {
            let refill = rule.limit as f64 * interval_ns as f64 / rule.period_ns.max(1) as f64;
            refill + (pool_f - 3.0 * refill).max(0.0)
        }
    }
}

/// Splits `budget` max-min fair among regions that want `wants` (each region's demand for the
/// interval, with [`HEADROOM`]): a region wanting less than an equal part gets what it wants,
/// the rest is split evenly among the others, and so on. Unlike the RLQS split
/// (`crate::quota::shares`), what nobody wants is not handed out: it stays in the bucket,
/// where the next ask finds it (a slice handed out but unspent comes back only at the
/// region's next report, and a token bucket's return loses the refill meanwhile).
pub fn split(budget: f64, wants: &[f64]) -> Vec<f64> {
    let n = wants.len();
    let mut out = vec![0.0; n];
    if budget.is_nan() || budget <= 0.0 {
        return out;
    }
    let want = |i: usize| if wants[i] > 0.0 { wants[i] } else { 0.0 };
    let mut order: Vec<usize> = (0..n).filter(|&i| want(i) > 0.0).collect();
    order.sort_by(|&a, &b| want(a).total_cmp(&want(b)));
    let mut left = budget;
    let m = order.len();
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (m - k) as f64;
        let give = want(i).min(fair);
        out[i] = give;
        left -= give;
    }
    out
}

/// One region's place in a fixed window's split ([`window_share`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InWindow {
    /// Whether it takes part (it asks, and is neither away nor gone).
    pub takes_part: bool,
    /// Granted in this window so far, less what came back (another region's slice of the
    /// current interval left out: the pool counts it).
    pub granted: f64,
    /// Of `granted`, what it still holds unspent (told at its last ask).
    pub held: f64,
    /// Checks it was asked in this window so far (its reports' demand over time).
    pub asked: f64,
    /// Its demand per second, last told.
    pub demand_per_s: f64,
}

/// A fixed window's slice for region `region` at this ask: the whole window (what the regions
/// were granted in it plus `pool`, what is left) is split max-min by each region's demand
/// projected to the window's end (what it asked so far, or was granted when more, plus its
/// demand over the `rest_ns` to go), and the region is granted what it is still owed of its
/// part, spread evenly over the window's rest less one interval (so that the window's last
/// grants come while there is time to spend them). A region whose projected demand is met
/// gets at least `want` (its room), within what it is owed.
///
/// Splitting the window rather than each interval's budget keeps the regions' admissions even
/// over the window: an interval in which a region's reported demand dips no longer hands its
/// part to the others for good (`bench/notes/regions.md`).
pub fn window_share(
    seats: &[InWindow],
    region: usize,
    pool: f64,
    rest_ns: u64,
    interval_ns: u64,
    want: f64,
) -> WindowShare {
    let Some(me) = seats.get(region) else {
        return WindowShare::default();
    };
    let rest_s = rest_ns as f64 / 1e9;
    let projected: Vec<f64> = seats
        .iter()
        .map(|s| {
            if !s.takes_part {
                return 0.0;
            }
            let demand = if s.demand_per_s.is_finite() {
                s.demand_per_s.max(0.0)
            } else {
                0.0
            };
            s.asked.max(s.granted - s.held).max(0.0) + demand * rest_s
        })
        .collect();
    let whole = seats.iter().map(|s| s.granted.max(0.0)).sum::<f64>() + pool.max(0.0);
    let parts = split(whole, &projected);
    let owed = (parts[region] - me.granted.max(0.0)).max(0.0);
    let spread = rest_ns.saturating_sub(interval_ns);
    let paced = if spread > interval_ns {
        owed * interval_ns as f64 / spread as f64
    } else {
        owed
    };
    let share = if parts[region] >= projected[region] - 1e-9 {
        paced.max(want.min(owed))
    } else {
        paced
    };
    WindowShare { share, owed }
}

/// A region's slice at one ask of a fixed window ([`window_share`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowShare {
    /// What to grant now.
    pub share: f64,
    /// What it is still owed of its part of the window: no grant takes it beyond (its part's
    /// fraction carried over would otherwise round one region up at another's expense).
    pub owed: f64,
}

/// [`split`] of `budget` by the regions' `needs` (their demands for the interval), then each
/// region whose need is met gets its `wants` (its need with room to grow, see [`want`]):
/// the room is handed out on top of the budget, ahead of the window's pace, so that a region
/// of small demand does not take its room from the others' fair shares; what it does not
/// spend of it comes back at its next report.
pub fn split_with_room(budget: f64, needs: &[f64], wants: &[f64]) -> Vec<f64> {
    let mut shares = split(budget, needs);
    for (i, s) in shares.iter_mut().enumerate() {
        let (need, want) = (needs[i], wants.get(i).copied().unwrap_or(0.0));
        if need > 0.0 && *s >= need - 1e-9 && want > *s {
            *s = want;
        }
    }
    shares
}

/// A region's demand over the next `interval_ns`, from its demand per second.
pub fn need(demand_per_s: f64, interval_ns: u64) -> f64 {
    if demand_per_s.is_nan() || demand_per_s <= 0.0 {
        return 0.0;
    }
    demand_per_s * interval_ns as f64 / 1e9
}

/// What a region wants for the next interval from its demand per second: its demand over the
/// interval with [`HEADROOM`], and at least one check more (a region of small demand sees
/// its checks one at a time).
pub fn want(demand_per_s: f64, interval_ns: u64) -> f64 {
    if demand_per_s.is_nan() || demand_per_s <= 0.0 {
        return 0.0;
    }
    let d = demand_per_s * interval_ns as f64 / 1e9;
    (d * HEADROOM).max(d + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::test_support::{MS, SEC, rule};

    #[test]
    fn split_is_max_min_fair_and_never_beyond_the_wants() {
        let s = split(16.0, &[20.0, 10.0, 3.0]);
        assert!((s[2] - 3.0).abs() < 1e-9);
        assert!(
            (s[0] - 6.5).abs() < 1e-9 && (s[1] - 6.5).abs() < 1e-9,
            "{s:?}"
        );
        // Everyone satisfied: the rest stays in the bucket.
        let s = split(100.0, &[20.0, 10.0, 0.0]);
        assert_eq!(s, vec![20.0, 10.0, 0.0]);
        assert_eq!(split(0.0, &[1.0]), vec![0.0]);
        assert_eq!(split(f64::NAN, &[1.0]), vec![0.0]);
        assert_eq!(split(5.0, &[f64::NAN, -1.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn a_window_is_spread_over_its_rest_and_given_whole_at_its_end() {
        let r = rule(Algorithm::FixedWindow, 1_000, 60_000, 1_000);
        // A full window, 60 s to go: its pace, 1000/60 a second.
        let b = budget(&r, 1_000, 60 * SEC, SEC);
        assert!((b - 1_000.0 / 60.0).abs() < 1e-9, "{b}");
        // Half left with half to go: the same pace.
        let b = budget(&r, 500, 30 * SEC, SEC);
        assert!((b - 500.0 / 30.0).abs() < 1e-9, "{b}");
        // Spent ahead of pace: the average pace, not less.
        let b = budget(&r, 100, 30 * SEC, SEC);
        assert!((b - 1_000.0 / 60.0).abs() < 1e-9, "{b}");
        // Behind pace: faster, to spend the window.
        assert!(budget(&r, 900, 30 * SEC, SEC) > 29.0);
        // The last interval: all of it; never more than there is.
        assert_eq!(budget(&r, 40, 800 * MS, SEC), 40.0);
        assert_eq!(budget(&r, 5, 30 * SEC, SEC), 5.0);
    }

    #[test]
    fn a_token_bucket_gives_what_it_holds() {
        let r = rule(Algorithm::TokenBucket, 1_000, 60_000, 1_000);
        let refill = 1_000.0 / 60.0;
        let b = budget(&r, 1_000, 0, SEC);
        assert!((b - (1_000.0 - 2.0 * refill)).abs() < 1e-9, "{b}");
        // Empty, or what refilled between asks: an interval's refill.
        for pool in [0, 3, 17, 50] {
            let b = budget(&r, pool, 0, SEC);
            assert!((b - refill).abs() < 1e-9, "{pool}: {b}");
        }
    }

    #[test]
    fn room_comes_on_top_for_regions_whose_need_is_met() {
        let s = split_with_room(16.0, &[20.0, 10.0, 3.0], &[22.0, 11.0, 4.0]);
        assert_eq!(s, vec![6.5, 6.5, 4.0]);
        // Nobody met: nobody gets room.
        let s = split_with_room(3.0, &[20.0, 10.0], &[22.0, 11.0]);
        assert_eq!(s, vec![1.5, 1.5]);
    }

    fn seat(granted: f64, asked: f64, demand_per_s: f64) -> InWindow {
        InWindow {
            takes_part: true,
            granted,
            held: 0.0,
            asked,
            demand_per_s,
        }
    }

    #[test]
    fn a_window_is_split_by_demand_projected_to_its_end_and_paced_over_its_rest() {
        // 1,000 a minute, 30 s in: a and b asked beyond their parts, c a third of them.
        let seats = [
            seat(200.0, 600.0, 20.0),
            seat(200.0, 300.0, 10.0),
            seat(100.0, 100.0, 10.0 / 3.0),
        ];
        let pool = 500.0;
        // Parts: c its 200, a and b 400 each; a is owed 200 over the 29 s before the last
        // interval.
        let a = window_share(&seats, 0, pool, 30 * SEC, SEC, 22.0).share;
        assert!((a - 200.0 / 29.0).abs() < 1e-9, "{a}");
        // b was granted less than a: it is owed more, and catches up.
        let lagging = [seat(200.0, 600.0, 20.0), seat(150.0, 300.0, 10.0), seats[2]];
        let b = window_share(&lagging, 1, 550.0, 30 * SEC, SEC, 11.0).share;
        assert!((b - 250.0 / 29.0).abs() < 1e-9, "{b}");
        // c's demand is met: at least its room.
        let c = window_share(&seats, 2, pool, 30 * SEC, SEC, 4.4).share;
        assert!((c - 4.4).abs() < 1e-9, "{c}");
        // The last interval: whatever is owed. c's projection is 197 + 3.33 · 0.8, a and b
        // split the rest evenly, and a holds 390 of its part.
        let end = [
            seat(390.0, 1_190.0, 20.0),
            seat(390.0, 590.0, 10.0),
            seat(197.0, 197.0, 10.0 / 3.0),
        ];
        let a = window_share(&end, 0, 23.0, 800 * MS, SEC, 22.0).share;
        let c = 197.0 + 10.0 / 3.0 * 0.8;
        assert!((a - ((1_000.0 - c) / 2.0 - 390.0)).abs() < 1e-6, "{a}");
        // What a region holds unspent is not demand: c, granted 205 of which it holds 6, and
        // 199 asked, needs 2.7 more to the window's end, which its 6 cover: it is owed
        // nothing, and a and b split the rest (its projection counted the 6 as used before).
        let holding = [
            seat(390.0, 1_190.0, 20.0),
            seat(390.0, 590.0, 10.0),
            InWindow {
                held: 6.0,
                ..seat(205.0, 199.0, 10.0 / 3.0)
            },
        ];
        let need_c = 199.0 + 10.0 / 3.0 * 0.8;
        let c = window_share(&holding, 2, 15.0, 800 * MS, SEC, 4.0).share;
        assert_eq!(c, 0.0);
        let a = window_share(&holding, 0, 15.0, 800 * MS, SEC, 22.0).share;
        assert!((a - ((1_000.0 - need_c) / 2.0 - 390.0)).abs() < 1e-6, "{a}");
        // A dip in a region's told demand moves its part little: what it asked still counts.
        let dipped = [seats[0], seat(200.0, 300.0, 5.0), seats[2]];
        let b = window_share(&dipped, 1, pool, 30 * SEC, SEC, 6.0).share;
        assert!((b - 200.0 / 29.0).abs() < 1e-9, "{b}");
        // A region that does not take part gets nothing; nor does one out of range; bad
        // demand is none.
        let out = [seats[0], InWindow::default(), seats[2]];
        assert_eq!(window_share(&out, 1, pool, 30 * SEC, SEC, 6.0).share, 0.0);
        assert_eq!(window_share(&seats, 7, pool, 30 * SEC, SEC, 6.0).share, 0.0);
        let nan = [seat(0.0, 0.0, f64::NAN)];
        assert_eq!(window_share(&nan, 0, 100.0, 30 * SEC, SEC, 0.0).share, 0.0);
    }

    #[test]
    fn want_has_headroom_and_a_floor() {
        assert_eq!(want(0.0, SEC), 0.0);
        assert!((want(0.1, SEC) - 1.1).abs() < 1e-9);
        assert!((want(20.0, SEC) - 22.0).abs() < 1e-9);
    }
}
