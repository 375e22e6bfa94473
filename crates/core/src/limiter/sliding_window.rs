//! Sliding window counter: the weighted two-window estimate.
//!
//! The estimate at `now`, a fraction `f` into the current window, is
//! `previous · (1 − f) + current`; a check is admitted when the estimate plus its cost stays
//! within `limit`. Everything is computed in integers scaled by the period, so `retry_after` is
//! exact. Bound: each aligned window admits at most `limit`, and any span of one period at most
//! `limit · (1 + f)` < `2 · limit` (when the previous window's hits all came at its very end,
//! which the estimate assumes spread evenly).
//!
//! # Debt
//! A settle above what the estimate has room for ([`charge`]) adds to the current count: up to
//! the limit, the estimate stays above the limit until the previous window's weight has slid
//! away by as much; beyond it, the current window is full and the rest carries into the windows
//! after it, as the state's window moves into the future (`until` more than one period past the
//! current window's end: every window before the state's counts as full, its previous count
//! the limit). The next window then admits once the full previous window's weight has slid
//! below the limit less what was owed, as if the debt had been admitted at its start. A bucket
//! owes at most [`super::MAX_DEBT_PERIODS`] windows.
//!
//! # A changed rule
//! A new limit applies to the counts as they stand (a lower one denies what is over it). A new
//! period moves the windows: a state that still counts (`until > now`) but was written under
//! another period (its [`period_tag`] says so, or its windows are not the new rule's) carries
//! its two counts, added and capped at the limit, into the new rule's window that contains now,
//! as if those requests had just been admitted under the new rule. A used-up key stays used up
//! until the new rule admits again after such a window (its end, plus `period / limit` for one
//! request), then slides back as under the new rule. The state cannot tell how much of the
//! previous count the old period still weighed, so it counts in full: a change may deny a
//! little more than the old rule would have, never admit more. A debt of another period is not
//! kept.

use super::{Decision, MAX_DEBT_PERIODS, Rule};

pub use super::period_tag;

/// Makes the state valid under `rule` at `now` (see the module's doc).
pub fn fit(
    until: &mut u64,
    current: &mut u32,
    previous: &mut u32,
    tag: &mut u32,
    rule: &Rule,
    now: u64,
) {
    let end = now - now % rule.period_ns + rule.period_ns;
    carry(until, current, previous, tag, rule, now, end);
}

/// [`fit`] given the end of the window containing `now`.
fn carry(
    until: &mut u64,
    current: &mut u32,
    previous: &mut u32,
    tag: &mut u32,
    rule: &Rule,
    now: u64,
    end: u64,
) {
    let p = rule.period_ns;
    let ours = period_tag(rule);
    let limit = u32::try_from(rule.limit).unwrap_or(u32::MAX);
    let this_period = *tag == 0 || *tag == ours;
    if *until > now && this_period && *until > end + p && (*until - end).is_multiple_of(p) {
        // In debt: a later window of this rule's, at most as far as a debt may reach; the
        // windows before it are full, the one just before it too.
        *until = (*until).min(furthest(rule, end));
        *previous = (*previous).max(limit);
    } else if *until > now && (!this_period || (*until != end && *until != end + p)) {
        // This rule's states end one period after the current window (both counts matter) or
        // at its end (only the previous count does); one that ends anywhere else after `now`
        // was written with another period (or by a peer whose clock is ahead, or is hostile).
        // Capped: one window of this rule holds at most its limit, and more would lock the
        // key out past the window after it.
        *current = current.saturating_add(*previous).min(limit);
        *previous = 0;
        *until = end + p;
    }
    *tag = ours;
}

/// The latest `until` a debt may reach when the current window ends at `end`.
fn furthest(rule: &Rule, end: u64) -> u64 {
    let p = rule.period_ns;
    (end + p).saturating_add(p.saturating_mul(MAX_DEBT_PERIODS))
}

/// Decides against the state (`until` = current window end + one period, two counts, the
/// period's tag).
pub fn decide(
    until: &mut u64,
    current: &mut u32,
    previous: &mut u32,
    tag: &mut u32,
    rule: &Rule,
    now: u64,
    cost: u64,
) -> Decision {
    let p = rule.period_ns;
    let start = now - now % p;
    let end = start + p;
    // Written even when denying: counts carried now must not be carried again later.
    carry(until, current, previous, tag, rule, now, end);
    if *until > end + p {
        // In debt: full until the state's window, which starts `2p` before `until`.
        let (cur, prev) = (u64::from(*current), u64::from(*previous));
        let at = retry_at(*until - 2 * p, p, rule.limit, cur, prev, cost.max(1));
        return Decision {
            allowed: false,
            remaining: 0,
            reset_ns: *until,
            retry_after_ns: at - now,
        };
    }
    // Roll the stored state forward to the window containing `now` (in locals: a denial must
    // not write).
    let (cur, prev) = if *until == end + p {
        (u64::from(*current), u64::from(*previous))
    } else if *until == end {
        (0, u64::from(*current))
    } else {
        (0, 0)
    };
    let (p_w, limit_w) = (u128::from(p), u128::from(rule.limit));
    let elapsed = u128::from(now - start);
    let used = u128::from(prev) * (p_w - elapsed) + u128::from(cur) * p_w; // estimate · p
    let room = |used: u128| sat((limit_w * p_w).saturating_sub(used) / p_w);
    let fits = used + u128::from(cost.max(1)) * p_w <= limit_w * p_w;

    if fits && cost > 0 {
        let new = cur + cost;
        *until = end + p;
        *current = u32::try_from(new).unwrap_or(u32::MAX);
        *previous = u32::try_from(prev).unwrap_or(u32::MAX);
        return Decision {
            allowed: true,
            remaining: room(used + u128::from(cost) * p_w),
            reset_ns: end + p,
            retry_after_ns: 0,
        };
    }
    let reset_ns = if cur > 0 {
        end + p
    } else if prev > 0 {
        end
    } else {
        now
    };
    let retry_at = if fits {
        now
    } else {
        retry_at(start, p, rule.limit, cur, prev, cost.max(1))
    };
    Decision {
        allowed: fits,
        remaining: room(used),
        reset_ns,
        retry_after_ns: retry_at - now,
    }
}

/// Takes `cost` whatever the estimate has room for (a settle above its estimate): it counts in
/// the current window up to the limit, and what is beyond fills the windows after it (see the
/// module's doc). Returns the tokens forgiven because the bucket would owe more than it may.
pub fn charge(
    until: &mut u64,
    current: &mut u32,
    previous: &mut u32,
    tag: &mut u32,
    rule: &Rule,
    now: u64,
    cost: u64,
) -> u64 {
    let p = rule.period_ns;
    let end = now - now % p + p;
    carry(until, current, previous, tag, rule, now, end);
    // The state's window as it counts now (the current one, or a later one in debt).
    let (at, cur, prev) = if *until >= end + p {
        (*until, u64::from(*current), u64::from(*previous))
    } else if *until == end {
        (end + p, 0, u64::from(*current))
    } else {
        (end + p, 0, 0)
    };
    let limit = rule.limit.max(1);
    let total = cur.saturating_add(cost);
    let reach = total.saturating_sub(1) / limit;
    let most = (furthest(rule, end) - at) / p;
    let (windows, left, forgiven) = if reach <= most {
        (reach, total - reach * limit, 0)
    } else {
        (most, limit, total - (most + 1) * limit)
    };
    *until = at + windows * p;
    *current = u32::try_from(left).unwrap_or(u32::MAX);
    // A window moved past is full: it is the previous one of the state's window.
    let prev = if windows > 0 { limit } else { prev };
    *previous = u32::try_from(prev).unwrap_or(u32::MAX);
    forgiven
}

/// The first instant at which `cost` fits, assuming no other traffic.
fn retry_at(start: u64, p: u64, limit: u64, cur: u64, prev: u64, cost: u64) -> u64 {
    let end = start + p;
    if let Some(room) = limit.checked_sub(cur + cost) {
        if prev > 0 {
            // Need prev·(p − e) <= room·p, i.e. e >= p − floor(room·p / prev).
            return end - sat(u128::from(room) * u128::from(p) / u128::from(prev)).min(p);
        }
        return start; // unreachable when denied: prev = 0 and it fits
    }
    // Next window: the current count becomes the previous one, weighing `cur·(1 − f)`.
    if cur == 0 {
        return end;
    }
    let room = limit - cost; // cost <= limit is validated
    let wait = sat(u128::from(room) * u128::from(p) / u128::from(cur)).min(p);
    end + p - wait
}

fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}
