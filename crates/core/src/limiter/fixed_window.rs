//! Fixed window: at most `limit` per window of `period`, windows aligned to multiples of the
//! period since the Unix epoch (so every node numbers them alike).
//!
//! # A changed rule
//! A new limit applies to the count as it stands (a lower one denies what is over it until the
//! window ends). A new period moves the windows: the count of the window that was current at
//! the change — counting under the rule that wrote it — carries into the new rule's window that
//! contains now, so a used-up key stays used up until that window ends (no longer than the new
//! period) and admits its new limit from then on. The state holds no times of the requests, so
//! they all count in that window; a count whose window had already ended counts nothing, as it
//! did under the old rule.

use super::{Decision, Rule};

/// End of the window of `rule` that contains `now`.
fn window_end(rule: &Rule, now: u64) -> u64 {
    now - now % rule.period_ns + rule.period_ns
}

/// Makes the state (its window's `end`; the count stays as it is) valid under `rule` at `now`
/// (see the module's doc: a count of another rule's windows carries into this rule's window
/// containing `now`).
pub fn fit(end: &mut u64, rule: &Rule, now: u64) {
    carry(end, now, window_end(rule, now));
}

/// [`fit`] given the end of the window containing `now`.
fn carry(end: &mut u64, now: u64, window_end: u64) {
    // Still counting (`end > now`) but not one of this rule's windows: another period wrote it
    // (or a peer whose clock is ahead, or a hostile state far in the future).
    if *end > now && *end != window_end {
        *end = window_end;
    }
}

/// Decides against the window ending at `end` that has admitted `count`.
pub fn decide(end: &mut u64, count: &mut u32, rule: &Rule, now: u64, cost: u64) -> Decision {
    let window_end = window_end(rule, now);
    // Written even when denying: the carried count must not be carried again later, by then
    // into another window.
    carry(end, now, window_end);
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
