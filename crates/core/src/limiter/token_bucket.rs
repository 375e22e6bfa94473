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
//! # Debt
//! A settle above what the bucket holds ([`charge`]) moves `tat` past an empty bucket
//! (`now + burst·T`): the bucket owes what lies beyond, and denies until its refill has covered
//! the debt and one token more. So the debt is repaid by the refill itself, exactly, and
//! travels wherever `tat` does. A bucket owes at most [`super::MAX_DEBT_PERIODS`] periods of
//! its limit.
//!
//! # A changed rule
//! A state written under another rule (a reload changed the rate or the burst) keeps its `tat`
//! — the time its consumption takes to refill, which the new rate turns into tokens — but never
//! beyond an empty bucket of the rule in force (see [`fit`]): the state's [`tag`] tells such a
//! state from one in debt under this rule, whose debt is kept.

use super::{Decision, MAX_DEBT_PERIODS, Rule};

/// Nanoseconds one token takes to refill.
pub fn emission_ns(rule: &Rule) -> u64 {
    rule.period_ns.div_ceil(rule.limit.max(1)).max(1)
}

/// A fingerprint of the numbers a GCRA state's meaning depends on (`T` and `burst`), kept in the
/// state: a `tat` beyond an empty bucket is a debt when this rule wrote it, and another rule's
/// consumption to clamp when not. Never 0, which stands for a state whose rule is unknown
/// (received over the wire: its sender decides under the same rules, so its debt is kept).
pub fn tag(rule: &Rule) -> u32 {
    let mixed = emission_ns(rule).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ rule.burst;
    let folded = (mixed ^ (mixed >> 32)) & u64::from(u32::MAX);
    u32::try_from(folded).unwrap_or(u32::MAX).max(1)
}

/// The most a bucket of `rule` may owe, as refill time.
fn most_debt_ns(rule: &Rule) -> u128 {
    u128::from(emission_ns(rule)) * u128::from(rule.limit) * u128::from(MAX_DEBT_PERIODS)
}

/// Makes `tat` valid under `rule` at `now`: at most `now + burst·T`, an empty bucket of this
/// rule, plus the most a bucket may owe when `tag` says this rule wrote it (or that its rule is
/// unknown). A bucket emptied under a slower rate or a larger burst (3 per hour spent: `tat` an
/// hour ahead) would otherwise deny for the old rule's time (an hour instead of 20 s at 3 per
/// minute); a state that this rule wrote is never beyond it, so this changes nothing for it.
pub fn fit(tat: &mut u64, tag: &mut u32, rule: &Rule, now: u64) {
    *tat = (*tat).min(sat(latest(*tag, rule, u128::from(now))));
    *tag = self::tag(rule);
}

/// The latest `tat` a state tagged `tag` may hold under `rule` at `now`.
fn latest(tag: u32, rule: &Rule, now: u128) -> u128 {
    let empty = now + u128::from(emission_ns(rule)) * u128::from(rule.burst);
    if tag == 0 || tag == self::tag(rule) {
        empty + most_debt_ns(rule)
    } else {
        empty
    }
}

/// Decides a check against the GCRA state `tat`; updates it only when admitting a cost > 0
/// (or, once, to [`fit`] it to `rule`).
pub fn decide(tat: &mut u64, tag: &mut u32, rule: &Rule, now: u64, cost: u64) -> Decision {
    // Written even when denying: a later check must not clamp to its own later `now` again.
    fit(tat, tag, rule, now);
    let t = u128::from(emission_ns(rule));
    let capacity = t * u128::from(rule.burst);
    let now_w = u128::from(now);
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
        // Denied, or a peek (cost 0 answers whether one token is there): nothing changes. In
        // debt, the wait covers the debt too (`after` is past it).
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

/// Takes `cost` from the bucket whatever it holds (a settle above its estimate): what the
/// bucket lacks is owed (see the module's doc). Returns the tokens forgiven because the bucket
/// would owe more than it may.
pub fn charge(tat: &mut u64, tag: &mut u32, rule: &Rule, now: u64, cost: u64) -> u64 {
    fit(tat, tag, rule, now);
    let t = u128::from(emission_ns(rule));
    let want = u128::from(*tat).max(u128::from(now)) + t * u128::from(cost);
    let most = latest(*tag, rule, u128::from(now));
    *tat = sat(want.min(most));
    sat(want.saturating_sub(most).div_ceil(t))
}

fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}
