//! Fixed window: at most `limit` per window of `period`, windows aligned to multiples of the
//! period since the Unix epoch (so every node numbers them alike).

use super::{Decision, Rule};

/// Decides against the window ending at `end` that has admitted `count`.
pub fn decide(end: &mut u64, count: &mut u32, rule: &Rule, now: u64, cost: u64) -> Decision {
    let window_end = now - now % rule.period_ns + rule.period_ns;
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
