//! Calendar windows at fixed instants: DST changes both ways, zones with non-hour offsets,
//! weeks from Monday, month ends; and a fixed window's debt and changed rule across them.

use super::*;
use crate::limiter::{BucketState, Rule};
use crate::rule::{calendar_of, validate_calendar};
use ringlimit_proto::Algorithm;

const HOUR: u64 = 3_600_000_000_000;

/// The instant of a civil time in a zone, e.g. `2026-03-29T00:00[Europe/Berlin]`.
fn at(s: &str) -> u64 {
    let z: jiff::Zoned = s.parse().unwrap();
    u64::try_from(z.timestamp().as_nanosecond()).unwrap()
}

fn cal(unit: Unit, zone: &str) -> Calendar {
    Calendar {
        unit,
        zone: Zone::parse(zone).unwrap(),
    }
}

fn rule(limit: u64, c: Calendar) -> Rule {
    validate_calendar(Algorithm::FixedWindow, limit, 0, None, Some(c)).unwrap()
}

#[test]
fn berlin_days_across_dst_last_23_and_25_hours() {
    let c = cal(Unit::Day, "Europe/Berlin");
    let (s, e) = bounds(c, at("2026-03-29T12:00[Europe/Berlin]"));
    assert_eq!(s, at("2026-03-28T23:00Z[UTC]"));
    assert_eq!(e, at("2026-03-29T22:00Z[UTC]"));
    assert_eq!(e - s, 23 * HOUR);
    // The first and the last instant of that day.
    assert_eq!(bounds(c, s), (s, e));
    assert_eq!(bounds(c, e - 1), (s, e));
    assert_eq!(bounds(c, e).0, e);

    let (s, e) = bounds(c, at("2026-10-25T02:30+02:00[Europe/Berlin]"));
    assert_eq!(s, at("2026-10-24T22:00Z[UTC]"));
    assert_eq!(e, at("2026-10-25T23:00Z[UTC]"));
    assert_eq!(e - s, 25 * HOUR);
    // The repeated hour (02:30 once in summer time, once in winter time) is one day.
    assert_eq!(
        bounds(c, at("2026-10-25T02:30+01:00[Europe/Berlin]")),
        (s, e)
    );
}

#[test]
fn new_york_day_of_the_spring_change_lasts_23_hours() {
    let c = cal(Unit::Day, "America/New_York");
    let (s, e) = bounds(c, at("2026-03-08T15:00[America/New_York]"));
    assert_eq!(s, at("2026-03-08T05:00Z[UTC]"));
    assert_eq!(e, at("2026-03-09T04:00Z[UTC]"));
    let (s, e) = bounds(c, at("2026-11-01T15:00[America/New_York]"));
    assert_eq!(e - s, 25 * HOUR);
}

#[test]
fn kolkata_days_start_at_local_midnight_half_an_hour_off_the_hour() {
    let c = cal(Unit::Day, "Asia/Kolkata");
    // 20:00 UTC is 01:30 the next day in Kolkata.
    let (s, e) = bounds(c, at("2026-01-15T20:00Z[UTC]"));
    assert_eq!(s, at("2026-01-15T18:30Z[UTC]"));
    assert_eq!(e - s, 24 * HOUR);
}

#[test]
fn weeks_run_from_monday_local_midnight() {
    let c = cal(Unit::Week, "Europe/Berlin");
    // Sunday 2026-03-29 (the spring change) ends a week of 7 days less an hour.
    let (s, e) = bounds(c, at("2026-03-29T12:00[Europe/Berlin]"));
    assert_eq!(s, at("2026-03-23T00:00[Europe/Berlin]"));
    assert_eq!(e, at("2026-03-30T00:00[Europe/Berlin]"));
    assert_eq!(e - s, 7 * 24 * HOUR - HOUR);
    // Monday 00:00 starts the next one; Sunday 23:59 in Berlin is still this one although it
    // is Monday in Tokyo.
    assert_eq!(bounds(c, e).0, e);
    assert_eq!(bounds(c, at("2026-03-29T23:59[Europe/Berlin]")).1, e);
    let utc = cal(Unit::Week, "UTC");
    assert_eq!(
        bounds(utc, at("2026-01-01T00:00Z[UTC]")),
        (at("2025-12-29T00:00Z[UTC]"), at("2026-01-05T00:00Z[UTC]"))
    );
}

#[test]
fn months_run_from_the_first_and_last_28_to_31_days() {
    let c = cal(Unit::Month, "UTC");
    let day = 24 * HOUR;
    let (s, e) = bounds(c, at("2026-01-31T23:59:59Z[UTC]"));
    assert_eq!(
        (s, e),
        (at("2026-01-01T00:00Z[UTC]"), at("2026-02-01T00:00Z[UTC]"))
    );
    let (s, e) = bounds(c, e);
    assert_eq!(e - s, 28 * day);
    assert_eq!(e, at("2026-03-01T00:00Z[UTC]"));
    let (s, e) = bounds(c, at("2028-02-29T12:00Z[UTC]"));
    assert_eq!(e - s, 29 * day);
    // Berlin's March 2026 has the spring change: 31 days less an hour.
    let b = cal(Unit::Month, "Europe/Berlin");
    let (s, e) = bounds(b, at("2026-03-15T00:00[Europe/Berlin]"));
    assert_eq!(s, at("2026-02-28T23:00Z[UTC]"));
    assert_eq!(e, at("2026-03-31T22:00Z[UTC]"));
    assert_eq!(start_of(b, e), s);
    assert!(is_boundary(b, e) && !is_boundary(b, e - 1));
}

#[test]
fn a_calendar_window_admits_its_limit_and_resets_at_the_local_boundary() {
    let r = rule(3, cal(Unit::Day, "Europe/Berlin"));
    let mut s = BucketState::fresh(&r);
    let now = at("2026-03-29T10:00[Europe/Berlin]");
    let end = at("2026-03-30T00:00[Europe/Berlin]");
    for left in [2, 1, 0] {
        let d = s.decide(&r, now, 1);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_ns), (left, end));
    }
    let d = s.decide(&r, now, 1);
    assert!(!d.allowed);
    assert_eq!(d.reset_ns, end);
    assert_eq!(d.retry_after_ns, end - now);
    // Still denied at the day's last instant, admitted at local midnight.
    assert!(!s.decide(&r, end - 1, 1).allowed);
    let d = s.decide(&r, end, 1);
    assert!(d.allowed);
    assert_eq!(d.reset_ns, at("2026-03-31T00:00[Europe/Berlin]"));
}

#[test]
fn a_debt_crosses_month_ends_window_by_window() {
    let r = rule(10, cal(Unit::Month, "Europe/Berlin"));
    let mut s = BucketState::fresh(&r);
    let now = at("2026-01-20T12:00[Europe/Berlin]");
    // 25 taken in January: January full, February full, 5 owed into March.
    assert_eq!(s.charge(&r, now, 25), 0);
    assert_eq!(s.owed(&r, now), 15);
    let apr = at("2026-04-01T00:00[Europe/Berlin]");
    let mar = at("2026-03-01T00:00[Europe/Berlin]");
    let d = s.decide(&r, now, 1);
    assert!(!d.allowed);
    assert_eq!(d.reset_ns, apr);
    assert_eq!(d.retry_after_ns, mar - now);
    // February (28 days) is still owed whole; March admits the 5 left.
    assert!(
        !s.decide(&r, at("2026-02-28T23:59[Europe/Berlin]"), 1)
            .allowed
    );
    assert_eq!(s.owed(&r, at("2026-02-10T00:00[Europe/Berlin]")), 5);
    for _ in 0..5 {
        assert!(s.decide(&r, mar, 1).allowed);
    }
    assert!(!s.decide(&r, mar, 1).allowed);
    assert!(s.decide(&r, apr, 1).allowed);
}

#[test]
fn a_debt_reaches_at_most_its_bound_in_months() {
    let r = rule(1, cal(Unit::Month, "UTC"));
    let mut s = BucketState::fresh(&r);
    let now = at("2026-01-20T00:00Z[UTC]");
    let forgiven = s.charge(&r, now, 1000);
    assert_eq!(forgiven, 1000 - (crate::limiter::MAX_DEBT_PERIODS + 1));
    // January plus 64 months: paid off at the start of June 2031.
    assert_eq!(s.idle_at(), at("2031-06-01T00:00Z[UTC]"));
}

#[test]
fn a_rule_changed_from_calendar_days_to_months_carries_the_days_count() {
    let day = rule(10, cal(Unit::Day, "Europe/Berlin"));
    let month = rule(10, cal(Unit::Month, "Europe/Berlin"));
    let mut s = BucketState::fresh(&day);
    let now = at("2026-01-20T12:00[Europe/Berlin]");
    for _ in 0..7 {
        assert!(s.decide(&day, now, 1).allowed);
    }
    // The count carries into the month containing now: 3 left until February.
    let later = now + HOUR;
    for left in [2, 1, 0] {
        let d = s.decide(&month, later, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, left);
        assert_eq!(d.reset_ns, at("2026-02-01T00:00[Europe/Berlin]"));
    }
    assert!(!s.decide(&month, later, 1).allowed);
    // Next day the month is still used up (under the day rule it would not be).
    assert!(
        !s.decide(&month, at("2026-01-21T12:00[Europe/Berlin]"), 1)
            .allowed
    );
    assert!(
        s.decide(&month, at("2026-02-01T00:00[Europe/Berlin]"), 1)
            .allowed
    );
}

#[test]
fn calendar_fields_are_refused_where_they_make_no_sense() {
    let day = Unit::Day.nominal_ns();
    let err = |r: Result<Option<Calendar>, crate::rule::FieldError>| r.unwrap_err();
    let e = err(calendar_of(
        Algorithm::FixedWindow,
        Unit::Month.nominal_ns(),
        true,
        false,
        None,
    ));
    assert_eq!(e.field, "period");
    assert!(e.reason.contains("calendar: true"), "{e}");
    let e = err(calendar_of(Algorithm::TokenBucket, day, false, true, None));
    assert_eq!(e.field, "calendar");
    assert!(e.reason.contains("token_bucket"), "{e}");
    let e = err(calendar_of(
        Algorithm::FixedWindow,
        3_600_000_000_000,
        false,
        true,
        None,
    ));
    assert_eq!(e.field, "calendar");
    let e = err(calendar_of(
        Algorithm::FixedWindow,
        day,
        false,
        true,
        Some("Mars/Base"),
    ));
    assert_eq!(e.field, "timezone");
    assert!(e.reason.contains("Mars/Base"), "{e}");
    let e = err(calendar_of(
        Algorithm::FixedWindow,
        day,
        false,
        false,
        Some("UTC"),
    ));
    assert_eq!(e.field, "timezone");
    // A week without a calendar is seven days from the epoch, as a plain period.
    assert_eq!(
        calendar_of(
            Algorithm::FixedWindow,
            Unit::Week.nominal_ns(),
            false,
            false,
            None
        ),
        Ok(None)
    );
    assert_eq!(
        calendar_of(Algorithm::FixedWindow, day, false, true, None),
        Ok(Some(Calendar {
            unit: Unit::Day,
            zone: Zone::UTC
        }))
    );
}

#[test]
fn calendar_rules_have_their_own_identities_and_tags() {
    use crate::limiter::period_tag;
    use crate::rule::inline_seed;
    let plain = validate_calendar(
        Algorithm::FixedWindow,
        10,
        Unit::Day.nominal_ns(),
        None,
        None,
    )
    .unwrap();
    let utc = rule(10, cal(Unit::Day, "UTC"));
    let berlin = rule(10, cal(Unit::Day, "Europe/Berlin"));
    assert_eq!(plain.period_ns, utc.period_ns);
    let seeds = [inline_seed(&plain), inline_seed(&utc), inline_seed(&berlin)];
    assert!(seeds[0] != seeds[1] && seeds[1] != seeds[2] && seeds[0] != seeds[2]);
    let tags = [period_tag(&plain), period_tag(&utc), period_tag(&berlin)];
    assert!(tags[0] != tags[1] && tags[1] != tags[2] && tags[0] != tags[2]);
}

/// Window numbers: consecutive windows, consecutive numbers, each number's bounds those of the
/// window it numbers, across DST changes, month ends and a year's end, in zones both sides of UTC.
#[test]
fn windows_are_numbered_consecutively_and_numbers_give_their_bounds() {
    for zone in [
        "Europe/Berlin",
        "America/New_York",
        "Asia/Kolkata",
        "Pacific/Kiritimati",
        "UTC",
    ] {
        for unit in [Unit::Day, Unit::Week, Unit::Month] {
            let c = cal(unit, zone);
            let mut t = at("2025-12-20T12:00[UTC]");
            let first = index(c, t);
            for n in first..first + 40 {
                let (s, e) = bounds(c, t);
                assert_eq!(bounds_of_index(c, n), Some((s, e)), "{zone} {unit:?} {n}");
                assert_eq!(index(c, s), n);
                assert_eq!(index(c, e - 1), n);
                assert_eq!(index(c, e), n + 1, "{zone} {unit:?}");
                t = e;
            }
        }
    }
    // Day numbers are local dates since 1970-01-01; weeks from Monday 1969-12-29; months from
    // January 1970.
    assert_eq!(index(cal(Unit::Day, "UTC"), at("1970-01-02T00:00[UTC]")), 1);
    assert_eq!(
        index(cal(Unit::Week, "UTC"), at("1970-01-05T00:00[UTC]")),
        1
    );
    assert_eq!(
        index(cal(Unit::Week, "UTC"), at("1970-01-04T23:59[UTC]")),
        0
    );
    assert_eq!(
        index(
            cal(Unit::Month, "Europe/Berlin"),
            at("2026-03-01T00:00[Europe/Berlin]")
        ),
        674
    );
    assert_eq!(
        index(
            cal(Unit::Month, "Europe/Berlin"),
            at("2026-02-28T23:59[Europe/Berlin]")
        ),
        673
    );
    // Beyond u64 ns: no bounds.
    assert_eq!(bounds_of_index(cal(Unit::Day, "UTC"), 1_000_000), None);
    assert_eq!(bounds_of_index(cal(Unit::Month, "UTC"), u64::MAX), None);
}
