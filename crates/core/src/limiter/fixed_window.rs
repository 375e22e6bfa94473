//! Fixed window: at most `limit` per window of `period`, windows aligned to multiples of the
//! period since the Unix epoch (so every node numbers them alike), or, for a rule with a
//! calendar, to its days, weeks or months in its time zone ([`crate::calendar`]: windows of
//! unequal lengths). Everything below speaks of windows, never of their length, so it holds
//! for both; the ordinary path does no calendar work.
//!
//! # Debt
//! A settle above what the window has left ([`charge`]) fills it and carries the rest into the
//! windows after it: the state's window moves into the future (`end` one or more periods past
//! the current window's), and every window before it counts as full. So the next window admits
//! its limit less what was owed, the one after that what is still owed less, and so on; the
//! state stays one window and one count, and travels as any state does. A bucket owes at most
//! [`super::MAX_DEBT_PERIODS`] windows.
//!
//! # A changed rule
//! A new limit applies to the count as it stands (a lower one denies what is over it until the
//! window ends). A new period moves the windows: the count of the window that was current at
//! the change — counting under the rule that wrote it — carries into the new rule's window that
//! contains now, so a used-up key stays used up until that window ends (no longer than the new
//! period) and admits its new limit from then on. The state holds no times of the requests, so
//! they all count in that window; a count whose window had already ended counts nothing, as it
//! did under the old rule. A debt written under another period is not kept (its windows are not
//! this rule's): the state's [`super::period_tag`] tells the two apart.

use super::{Decision, MAX_DEBT_PERIODS, Rule, period_tag};
use crate::calendar;

/// End of the window of `rule` that contains `now`.
pub fn window_end(rule: &Rule, now: u64) -> u64 {
    match rule.calendar {
        None => now - now % rule.period_ns + rule.period_ns,
        Some(c) => calendar::end_containing(c, now),
    }
}

/// Start of the window of `rule` that ends at `end`.
fn window_start(rule: &Rule, end: u64) -> u64 {
    match rule.calendar {
        None => end - rule.period_ns,
        Some(c) => calendar::start_of(c, end),
    }
}

/// The end of the window `n` windows after the one ending at `end`.
fn advance(rule: &Rule, end: u64, n: u64) -> u64 {
    match rule.calendar {
        None => end.saturating_add(rule.period_ns.saturating_mul(n)),
        Some(c) => (0..n).fold(end, |e, _| calendar::end_containing(c, e)),
    }
}

/// Whether the window ending at `later` is a whole number of windows after the one ending at
/// `end` (`later > end`).
fn aligned(rule: &Rule, end: u64, later: u64) -> bool {
    match rule.calendar {
        None => (later - end).is_multiple_of(rule.period_ns),
        Some(c) => calendar::is_boundary(c, later),
    }
}

/// How many windows after the one ending at `end` the one ending at `later` is (`later >=
/// end`, both window ends, at most [`MAX_DEBT_PERIODS`] + 1 apart for a calendar).
pub(crate) fn windows_between(rule: &Rule, end: u64, later: u64) -> u64 {
    match rule.calendar {
        None => (later - end) / rule.period_ns,
        Some(c) => {
            let mut e = end;
            let mut n = 0;
            while e < later && n <= MAX_DEBT_PERIODS + 1 {
                e = calendar::end_containing(c, e);
                n += 1;
            }
            n
        }
    }
}

/// The end of the furthest window a debt may reach from the window ending at `window_end`.
fn furthest(rule: &Rule, window_end: u64) -> u64 {
    advance(rule, window_end, MAX_DEBT_PERIODS)
}

/// `end` (a later window of this rule), at most as far as a debt may reach.
fn bound_debt(rule: &Rule, window_end: u64, end: u64) -> u64 {
    // A calendar's windows are each longer than half their nominal length: a debt nearer than
    // that many of them is within bounds without walking the calendar.
    if let Some(c) = rule.calendar
        && end - window_end <= MAX_DEBT_PERIODS * (c.unit.nominal_ns() / 2)
    {
        return end;
    }
    end.min(furthest(rule, window_end))
}

/// Makes the state (its window's `end`; the count stays as it is) valid under `rule` at `now`
/// (see the module's doc: a count of another rule's windows carries into this rule's window
/// containing `now`; a debt of this rule stays).
pub fn fit(end: &mut u64, tag: &mut u32, rule: &Rule, now: u64) {
    carry(end, tag, rule, now, window_end(rule, now));
}

/// [`fit`] given the end of the window containing `now`.
fn carry(end: &mut u64, tag: &mut u32, rule: &Rule, now: u64, window_end: u64) {
    let ours = period_tag(rule);
    // Still counting (`end > now`) but not the current window: a debt of this rule (a later
    // window of its own, at most as far as a debt may reach), or another period's window (or a
    // peer's whose clock is ahead, or a hostile state far in the future).
    if *end > now && *end != window_end {
        let this_rule = *tag == ours || *tag == 0;
        if this_rule && *end > window_end && aligned(rule, window_end, *end) {
            *end = bound_debt(rule, window_end, *end);
        } else {
            *end = window_end;
        }
    }
    *tag = ours;
}

/// Decides against the window ending at `end` that has admitted `count`, as a state of
/// `rule` (the node's global counts, which are never in debt).
pub fn decide(end: &mut u64, count: &mut u32, rule: &Rule, now: u64, cost: u64) -> Decision {
    let mut tag = period_tag(rule);
    decide_tagged(end, count, &mut tag, rule, now, cost)
}

/// Decides against the window ending at `end` that has admitted `count`, written under the
/// period `tag` names (0: unknown).
pub fn decide_tagged(
    end: &mut u64,
    count: &mut u32,
    tag: &mut u32,
    rule: &Rule,
    now: u64,
    cost: u64,
) -> Decision {
    let window_end = window_end(rule, now);
    // Written even when denying: the carried count must not be carried again later, by then
    // into another window.
    carry(end, tag, rule, now, window_end);
    if *end > window_end {
        // In debt: full until the state's window, which has admitted `count`.
        let at = if u64::from(*count) + cost.max(1) <= rule.limit {
            window_start(rule, *end)
        } else {
            *end
        };
        return Decision {
            allowed: false,
            remaining: 0,
            reset_ns: *end,
            retry_after_ns: at - now,
        };
    }
    // A state from an earlier window counts nothing now.
    let used = if *end == window_end {
        u64::from(*count)
    } else {
        0
    };
    let fits = used + cost.max(1) <= rule.limit;
    if fits && cost > 0 {
        let new = used + cost;
        *end = window_end;
        // `limit <= MAX_LIMIT < u32::MAX`, so the count fits.
        *count = u32::try_from(new).unwrap_or(u32::MAX);
        Decision {
            allowed: true,
            remaining: rule.limit - new,
            reset_ns: window_end,
            retry_after_ns: 0,
        }
    } else {
        Decision {
            allowed: fits,
            remaining: rule.limit.saturating_sub(used),
            reset_ns: window_end,
            // The next window starts empty and `cost <= limit`.
            retry_after_ns: if fits { 0 } else { window_end - now },
        }
    }
}

/// Takes `cost` whatever the window has left (a settle above its estimate): what does not fit
/// fills the windows after it (see the module's doc). Returns the tokens forgiven because the
/// bucket would owe more than it may.
pub fn charge(
    end: &mut u64,
    count: &mut u32,
    tag: &mut u32,
    rule: &Rule,
    now: u64,
    cost: u64,
) -> u64 {
    let window_end = window_end(rule, now);
    carry(end, tag, rule, now, window_end);
    let limit = rule.limit.max(1);
    // The window the state counts in now (the current one, or a later one in debt).
    let (at, used) = if *end >= window_end {
        (*end, u64::from(*count))
    } else {
        (window_end, 0)
    };
    let total = used.saturating_add(cost);
    // Windows from `at` that `total` reaches into, and as far as a debt may.
    let reach = total.saturating_sub(1) / limit;
    let most = windows_between(rule, at, furthest(rule, window_end));
    let (windows, left, forgiven) = if reach <= most {
        (reach, total - reach * limit, 0)
    } else {
        (most, limit, total - (most + 1) * limit)
    };
    *end = advance(rule, at, windows);
    *count = u32::try_from(left).unwrap_or(u32::MAX);
    forgiven
}
