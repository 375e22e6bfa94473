//! Sliding window counter: the weighted two-window estimate.
//!
//! The estimate at `now`, a fraction `f` into the current window, is
//! `previous · (1 − f) + current`; a check is admitted when the estimate plus its cost stays
//! within `limit`. Everything is computed in integers scaled by the period, so `retry_after` is
//! exact. Bound: each aligned window admits at most `limit`, and any span of one period at most
//! `limit · (1 + f)` < `2 · limit` (when the previous window's hits all came at its very end,
//! which the estimate assumes spread evenly).
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
//! little more than the old rule would have, never admit more.

use super::{Decision, Rule};

/// A fingerprint of `rule`'s period, kept in the state. The windows of two periods may end at
/// the same instant (1 h and 2 h at every even hour), so the state's times alone cannot tell a
/// count of the other period's current window from one of this period's previous window.
/// Never 0, which stands for a state whose period is unknown (received over the wire).
pub fn period_tag(rule: &Rule) -> u32 {
    let p = rule.period_ns;
    // The high bits folded in: periods 2^32 ns (4.3 s) apart differ too.
    let folded = (p ^ (p >> 32)) & u64::from(u32::MAX);
    u32::try_from(folded).unwrap_or(u32::MAX).max(1)
}

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
    // This rule's states end one period after the current window (both counts matter) or at
    // its end (only the previous count does); one that ends anywhere else after `now` was
    // written with another period (or by a peer whose clock is ahead, or is hostile).
    let foreign = (*tag != 0 && *tag != ours) || (*until != end && *until != end + p);
    if *until > now && foreign {
        // Capped: one window of this rule holds at most its limit, and more would lock the
        // key out past the window after it.
        let limit = u32::try_from(rule.limit).unwrap_or(u32::MAX);
        *current = current.saturating_add(*previous).min(limit);
        *previous = 0;
        *until = end + p;
    }
    *tag = ours;
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
