//! Leaky bucket as a meter.
//!
//! A bucket of capacity `burst` leaks at `limit / period`; a check pours `cost` in and is admitted
//! if it does not overflow. The level at `now` is `max(0, empty_at − now) / T` with `T = period /
//! limit`, so the state is the time the bucket will be empty — which is exactly the GCRA
//! theoretical arrival time of [`super::token_bucket`]: the meter and the token bucket admit the
//! same sequences and differ only in how one speaks of them (level poured vs tokens left).
//! One arithmetic serves both so the two can never drift apart (debt included: a meter in debt
//! holds more than its capacity, and denies until it has drained below it); `reset_ns` here is
//! when the bucket has drained empty.

use super::{Decision, Rule, token_bucket};

/// Makes the meter's state valid under `rule` at `now`: never fuller than its capacity, plus
/// its debt (see [`token_bucket::fit`]).
pub fn fit(empty_at: &mut u64, tag: &mut u32, rule: &Rule, now: u64) {
    token_bucket::fit(empty_at, tag, rule, now)
}

/// Decides a check against the meter whose state is the time `empty_at` it drains empty.
pub fn decide(empty_at: &mut u64, tag: &mut u32, rule: &Rule, now: u64, cost: u64) -> Decision {
    token_bucket::decide(empty_at, tag, rule, now, cost)
}

/// Current level of the meter (requests in the bucket), rounded up.
pub fn level(empty_at: u64, rule: &Rule, now: u64) -> u64 {
    empty_at
        .saturating_sub(now)
        .div_ceil(token_bucket::emission_ns(rule))
}
