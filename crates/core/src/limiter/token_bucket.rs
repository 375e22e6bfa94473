//! Token bucket in its GCRA form.
//!
//! Instead of (tokens, last refill) the state is one number, the *theoretical arrival time*
//! `tat`: the bucket is full when `tat <= now`, and holds `(now + burst·T − tat) / T` tokens
//! otherwise, where `T = period / limit` is the time one token takes to refill. Refill is
//! continuous and fractional tokens are kept exactly (as nanoseconds), in 8 bytes of state.
//!
//! `T` is rounded **up** to a whole nanosecond, so the sustained rate is never above the rule's;
//! rules keep `T >= 1 µs` (see [`super::MIN_EMISSION_NS`]) so that the rounding is below 0.1%.
//!
//! A state written under another rule (a reload changed the rate or the burst) keeps its `tat`
//! — the time its consumption takes to refill, which the new rate turns into tokens — but never
//! beyond an empty bucket of the rule in force (see [`fit`]).

use super::{Decision, Rule};

/// Nanoseconds one token takes to refill.
pub fn emission_ns(rule: &Rule) -> u64 {
    rule.period_ns.div_ceil(rule.limit.max(1)).max(1)
}

/// Makes `tat` valid under `rule` at `now`: at most `now + burst·T`, an empty bucket of this
/// rule. A bucket emptied under a slower rate or a larger burst (3 per hour spent: `tat` an
/// hour ahead) would otherwise deny for the old rule's time (an hour instead of 20 s at 3 per
/// minute); a state that this rule wrote is never beyond it, so this changes nothing for it.
pub fn fit(tat: &mut u64, rule: &Rule, now: u64) {
    let t = u128::from(emission_ns(rule));
    clamp(tat, u128::from(now), t * u128::from(rule.burst));
}

fn clamp(tat: &mut u64, now: u128, capacity: u128) {
    *tat = (*tat).min(sat(now + capacity));
}

/// Decides a check against the GCRA state `tat`; updates it only when admitting a cost > 0
/// (or, once, to [`fit`] it to `rule`).
pub fn decide(tat: &mut u64, rule: &Rule, now: u64, cost: u64) -> Decision {
    let t = u128::from(emission_ns(rule));
    let capacity = t * u128::from(rule.burst);
    let now_w = u128::from(now);
    // Written even when denying: a later check must not clamp to its own later `now` again.
    clamp(tat, now_w, capacity);
    // The bucket never holds more than `burst`: an old `tat` counts as `now`.
    let base = u128::from(*tat).max(now_w);
    let tokens_ns = |from: u128| (now_w + capacity).saturating_sub(from);
    let need = t * u128::from(cost.max(1));
    let after = base + need;
    let fits = after - now_w <= capacity;

    if fits && cost > 0 {
        *tat = sat(after);
        Decision {
            allowed: true,
            remaining: sat(tokens_ns(after) / t),
            reset_ns: sat(after),
            retry_after_ns: 0,
        }
    } else {
        // Denied, or a peek (cost 0 answers whether one token is there): nothing changes.
        Decision {
            allowed: fits,
            remaining: sat(tokens_ns(base) / t),
            reset_ns: sat(base),
            retry_after_ns: if fits {
                0
            } else {
                sat(after - capacity - now_w)
            },
        }
    }
}

fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}
