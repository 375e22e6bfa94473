//! An owner's count of each key's denials under rules with a `block` policy, and the blocks
//! they earn. Kept beside the buckets: every check of a key is decided at its owner, so the
//! count is exact there.
//!
//! A key denied `after` times within `within` (a window that starts at its first denial) is
//! blocked for `for`; each further block doubles that, up to `max`. A key that stays out of
//! trouble for `max` after its last block ended starts again from `for` (fail2ban's
//! `bantime.increment`, forgiven after a while).

use parking_lot::Mutex;
use std::collections::HashMap;

/// A rule's `block` policy, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    pub after: u64,
    pub within_ms: u64,
    pub for_ms: u64,
    pub max_ms: u64,
}

impl Policy {
    /// How long the `strikes`-th block (0: the first) lasts.
    pub fn length(&self, strikes: u32) -> u64 {
        let doubled = self
            .for_ms
            .checked_shl(strikes.min(63))
            .filter(|d| d >> strikes.min(63) == self.for_ms)
            .unwrap_or(u64::MAX);
        doubled.min(self.max_ms).max(self.for_ms.min(self.max_ms))
    }
}

#[derive(Debug, Clone, Copy)]
struct Offense {
    window_start_ms: u64,
    denials: u64,
    strikes: u32,
    last_until_ms: u64,
    /// The longest a block of this key lasts (its policy's `max`): when it is forgotten.
    max_ms: u64,
    within_ms: u64,
}

impl Offense {
    /// Nothing left to remember at `now_ms`: its window is over and its strikes forgiven.
    fn stale(&self, now_ms: u64) -> bool {
        now_ms >= self.window_start_ms.saturating_add(self.within_ms)
            && now_ms >= self.last_until_ms.saturating_add(self.max_ms)
    }
}

/// The denial counts of keys under rules with a `block` policy, by bucket identity; at most
/// `max` keys (a full table forgets what is stale, then counts no new key until there is room).
#[derive(Debug)]
pub struct Offenders {
    max: usize,
    counts: Mutex<HashMap<u64, Offense>>,
}

impl Offenders {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            counts: Mutex::default(),
        }
    }

    /// Counts a denial of bucket `id` under `policy` at `now_ms`; returns the end (Unix ms)
    /// of the block it earns, if it earns one.
    pub fn denied(&self, id: u64, policy: &Policy, now_ms: u64) -> Option<u64> {
        let mut counts = self.counts.lock();
        if !counts.contains_key(&id) && counts.len() >= self.max {
            counts.retain(|_, o| !o.stale(now_ms));
            if counts.len() >= self.max {
                return None;
            }
        }
        let o = counts.entry(id).or_insert(Offense {
            window_start_ms: now_ms,
            denials: 0,
            strikes: 0,
            last_until_ms: 0,
            max_ms: policy.max_ms,
            within_ms: policy.within_ms,
        });
        (o.max_ms, o.within_ms) = (policy.max_ms, policy.within_ms);
        if now_ms >= o.window_start_ms.saturating_add(policy.within_ms) {
            o.window_start_ms = now_ms;
            o.denials = 0;
        }
        if o.strikes > 0 && now_ms >= o.last_until_ms.saturating_add(policy.max_ms) {
            o.strikes = 0;
        }
        o.denials += 1;
        if o.denials < policy.after {
            return None;
        }
        let until = now_ms.saturating_add(policy.length(o.strikes));
        o.strikes = o.strikes.saturating_add(1);
        o.denials = 0;
        o.window_start_ms = now_ms;
        o.last_until_ms = until;
        Some(until)
    }

    /// Keys counted now.
    pub fn len(&self) -> usize {
        self.counts.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets what is stale at `now_ms`.
    pub fn sweep(&self, now_ms: u64) {
        self.counts.lock().retain(|_, o| !o.stale(now_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        after: 3,
        within_ms: 1_000,
        for_ms: 10_000,
        max_ms: 35_000,
    };

    #[test]
    fn after_denials_within_the_window_a_key_is_blocked() {
        let o = Offenders::new(10);
        assert_eq!(o.denied(1, &POLICY, 0), None);
        assert_eq!(o.denied(1, &POLICY, 500), None);
        assert_eq!(o.denied(1, &POLICY, 999), Some(10_999));
    }

    #[test]
    fn denials_spread_wider_than_the_window_earn_nothing() {
        let o = Offenders::new(10);
        for t in [0, 600, 1_200, 1_800, 2_400, 3_000] {
            assert_eq!(o.denied(1, &POLICY, t), None, "at {t}");
        }
    }

    #[test]
    fn repeats_double_up_to_max_and_are_forgiven_after_max() {
        let o = Offenders::new(10);
        let mut now = 0;
        let mut lengths = Vec::new();
        for _ in 0..4 {
            o.denied(1, &POLICY, now);
            o.denied(1, &POLICY, now);
            let until = o.denied(1, &POLICY, now).expect("blocked");
            lengths.push(until - now);
            now = until;
        }
        assert_eq!(lengths, [10_000, 20_000, 35_000, 35_000]);
        now += 35_000;
        o.denied(1, &POLICY, now);
        o.denied(1, &POLICY, now);
        assert_eq!(o.denied(1, &POLICY, now), Some(now + 10_000), "forgiven");
    }

    #[test]
    fn no_max_means_no_growth() {
        let p = Policy {
            max_ms: POLICY.for_ms,
            ..POLICY
        };
        assert_eq!(p.length(0), 10_000);
        assert_eq!(p.length(5), 10_000);
        assert_eq!(POLICY.length(70), 35_000, "no overflow");
    }

    #[test]
    fn a_full_table_forgets_stale_keys_then_counts_no_new_one() {
        let o = Offenders::new(2);
        o.denied(1, &POLICY, 0);
        o.denied(2, &POLICY, 0);
        assert_eq!(o.denied(3, &POLICY, 10), None);
        assert_eq!(o.len(), 2, "no room for key 3");
        // Once 1 and 2 are stale, 3 is counted.
        o.denied(3, &POLICY, 50_000);
        assert_eq!(o.len(), 1);
    }
}
