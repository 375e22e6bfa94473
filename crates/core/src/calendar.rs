//! Calendar windows' boundaries: the window of a [`Calendar`] that contains an instant.
//!
//! A fixed window with a calendar needs two things from here: the end of the window containing
//! now, and the start of the window ending at a given end; the end of the window after the one
//! ending at `E` is the end of the window containing `E`. Everything else (debts, a changed
//! rule's carried count, the answers' reset times) follows in [`crate::limiter::fixed_window`].
//!
//! Windows start at local midnight (the first instant of the local day, should midnight itself
//! not exist there), on Mondays for weeks, on the first for months; a day across a DST change
//! lasts 23 or 25 hours, a month 28 to 31 days.

use jiff::civil::Date;
use jiff::{Timestamp, ToSpan};
pub use ringlimit_proto::calendar::{Calendar, Unit, UnknownZone, Zone};

/// The start and end (ns since the epoch) of `cal`'s window containing `t`.
pub fn bounds(cal: Calendar, t: u64) -> (u64, u64) {
    compute(cal, t).unwrap_or_else(|| {
        // Outside the calendar's range (beyond the year 9999, which ns since 1970 in a u64
        // never reach): nominal windows from the epoch.
        let p = cal.unit.nominal_ns();
        let start = t - t % p;
        (start, start.saturating_add(p))
    })
}

fn compute(cal: Calendar, t: u64) -> Option<(u64, u64)> {
    let tz = cal.zone.tz();
    let ts = Timestamp::from_nanosecond(i128::from(t)).ok()?;
    let today = ts.to_zoned(tz.clone()).date();
    let first: Date = match cal.unit {
        Unit::Day => today,
        Unit::Week => today
            .checked_sub(i64::from(today.weekday().to_monday_zero_offset()).days())
            .ok()?,
        Unit::Month => today.first_of_month(),
    };
    let next = match cal.unit {
        Unit::Day => first.checked_add(1.day()).ok()?,
        Unit::Week => first.checked_add(7.days()).ok()?,
        Unit::Month => first.checked_add(1.month()).ok()?,
    };
    let at = |d: Date| -> Option<u64> {
        // The first instant of the local day (after the gap, if midnight falls into one).
        let z = d.to_zoned(tz.clone()).ok()?.start_of_day().ok()?;
        u64::try_from(z.timestamp().as_nanosecond()).ok()
    };
    Some((at(first)?, at(next)?))
}

/// The end of `cal`'s window containing `t`.
pub fn end_containing(cal: Calendar, t: u64) -> u64 {
    bounds(cal, t).1
}

/// The start of `cal`'s window that ends at `end` (a window boundary).
pub fn start_of(cal: Calendar, end: u64) -> u64 {
    bounds(cal, end.saturating_sub(1)).0
}

/// The number of `cal`'s window containing `t`: its first local date counted in `cal`'s units
/// from 1970-01-01 (days; weeks from Monday 1969-12-29; months from January 1970), the same in
/// every process, consecutive windows consecutive numbers. What global counters key a calendar
/// window by, where a window's start alone would need the zone to find the window before.
pub fn index(cal: Calendar, t: u64) -> u64 {
    let number = || -> Option<i64> {
        let ts = Timestamp::from_nanosecond(i128::from(t)).ok()?;
        let date = ts.to_zoned(cal.zone.tz()).date();
        Some(match cal.unit {
            Unit::Day => days_since_1970(date)?,
            Unit::Week => (days_since_1970(date)? + 3).div_euclid(7),
            Unit::Month => (i64::from(date.year()) - 1970) * 12 + i64::from(date.month()) - 1,
        })
    };
    // Before the first window of 1970 (a zone west of UTC on its first day): window 0.
    number().and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}

/// The start and end (ns since the epoch) of `cal`'s window number `n` (see [`index`]), or
/// `None` beyond what ns since 1970 in a u64 reach.
pub fn bounds_of_index(cal: Calendar, n: u64) -> Option<(u64, u64)> {
    let n = i64::try_from(n).ok()?;
    let epoch = jiff::civil::date(1970, 1, 1);
    // `try_days`, not `days()`: a number from a peer may be out of any span's range.
    let days = |d: i64| jiff::Span::new().try_days(d).ok();
    let first = match cal.unit {
        Unit::Day => epoch.checked_add(days(n)?).ok()?,
        Unit::Week => epoch
            .checked_add(days(n.checked_mul(7)?.checked_sub(3)?)?)
            .ok()?,
        Unit::Month => {
            let year = i16::try_from(1970 + n / 12).ok()?;
            Date::new(year, i8::try_from(n % 12 + 1).ok()?, 1).ok()?
        }
    };
    let z = first.to_zoned(cal.zone.tz()).ok()?.start_of_day().ok()?;
    let start = u64::try_from(z.timestamp().as_nanosecond()).ok()?;
    let (s, e) = compute(cal, start)?;
    (s == start).then_some((s, e))
}

fn days_since_1970(d: Date) -> Option<i64> {
    let span = jiff::civil::date(1970, 1, 1).until(d).ok()?;
    Some(i64::from(span.get_days()))
}

/// Whether `t` is a boundary of `cal`'s windows.
pub fn is_boundary(cal: Calendar, t: u64) -> bool {
    bounds(cal, t).0 == t
}

#[cfg(test)]
mod tests;
