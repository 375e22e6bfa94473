//! Sliding log: exact. Keeps the time of every admitted request in the last period, so any
//! half-open span of one period admits at most `limit`. Memory grows with the limit, which is
//! why rules cap it at [`super::MAX_SLIDING_LOG_LIMIT`] and the store weighs these buckets by it.
//!
//! # A changed rule
//! The log holds the time of each admission, so a new rule simply counts the admissions of its
//! own last period: a longer period keeps every entry the old one did (a used-up key stays used
//! up), a shorter one forgets those older than it, and a new limit applies to the entries as
//! they stand. [`SlidingLog::fit`] also resizes the log to the new limit (its memory weight)
//! and brings entries from the future (a peer's clock ahead, a hostile state) back to now.

use super::{Decision, Rule};
use std::collections::VecDeque;

/// The admitted requests of the last period: `(time, cost)` runs, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingLog {
    entries: VecDeque<(u64, u32)>,
    /// Sum of the costs in `entries`.
    total: u64,
    /// The most entries this log may hold (its rule's limit when created).
    max_entries: u64,
    /// When the newest entry expires.
    idle_at: u64,
}

impl SlidingLog {
    pub fn new(limit: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            total: 0,
            max_entries: limit,
            idle_at: 0,
        }
    }

    pub fn max_entries(&self) -> u64 {
        self.max_entries
    }

    pub fn idle_at(&self) -> u64 {
        self.idle_at
    }

    /// The `(time, cost)` entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries.iter().copied()
    }

    /// A log holding `entries` (any order; merged in time order).
    pub fn from_entries(max_entries: u64, entries: impl IntoIterator<Item = (u64, u32)>) -> Self {
        let mut v: Vec<(u64, u32)> = entries.into_iter().collect();
        v.sort_unstable();
        let total = v.iter().map(|&(_, c)| u64::from(c)).sum();
        let idle_at = v.last().map_or(0, |&(t, _)| t);
        Self {
            entries: v.into(),
            total,
            max_entries,
            // The period is not known here; the next decision recomputes it.
            idle_at,
        }
    }

    /// Gives back `cost` of the admission logged at `at` (see [`super::BucketState::refund`]).
    /// Admissions at one instant share an entry, so the cost comes off that entry.
    pub fn refund(&mut self, at: u64, cost: u64) {
        let Some(i) = self.entries.iter().rposition(|&(t, _)| t == at) else {
            return; // expired or never here: nothing is left to give back
        };
        let back = u32::try_from(cost)
            .unwrap_or(u32::MAX)
            .min(self.entries[i].1);
        self.entries[i].1 -= back;
        self.total -= u64::from(back);
        if self.entries[i].1 == 0 {
            self.entries.remove(i);
        }
        // `idle_at` may now be later than needed: only the eviction hint, and the next
        // decision recomputes it.
    }

    /// Makes the log valid under `rule` at `now` (see the module's doc): expired entries
    /// dropped, none later than `now`, at most `limit` entries (the newest: when more are held,
    /// they already cost more than the limit and the oldest decide nothing), sized for `limit`.
    pub fn fit(&mut self, rule: &Rule, now: u64) {
        self.expire(rule.period_ns, now);
        if self.entries.back().is_some_and(|&(t, _)| t > now) {
            // Still in time order: every entry after `now` becomes `now`.
            for e in self.entries.iter_mut().rev() {
                if e.0 <= now {
                    break;
                }
                e.0 = now;
            }
            self.idle_at = now.saturating_add(rule.period_ns);
        }
        let keep = usize::try_from(rule.limit).unwrap_or(usize::MAX);
        while self.entries.len() > keep {
            if let Some((_, c)) = self.entries.pop_front() {
                self.total -= u64::from(c);
            }
        }
        self.max_entries = rule.limit;
    }

    /// Drops the entries that no longer count at `now` under period `p`.
    fn expire(&mut self, p: u64, now: u64) {
        // An entry at `t` counts for the half-open span [t, t + p).
        while let Some(&(t, c)) = self.entries.front() {
            if t.saturating_add(p) > now {
                break;
            }
            self.entries.pop_front();
            self.total -= u64::from(c);
        }
        // Recomputed here because a merged log (see `from_entries`) does not know the period.
        if let Some(&(t, _)) = self.entries.back() {
            self.idle_at = t.saturating_add(p);
        }
    }

    /// Decides a check, appending it to the log when admitted.
    pub fn decide(&mut self, rule: &Rule, now: u64, cost: u64) -> Decision {
        let p = rule.period_ns;
        self.fit(rule, now);
        let fits = self.total + cost.max(1) <= rule.limit;
        if fits && cost > 0 {
            match self.entries.back_mut() {
                Some((t, c)) if *t == now => {
                    *c = c.saturating_add(u32::try_from(cost).unwrap_or(u32::MAX))
                }
                _ => self
                    .entries
                    .push_back((now, u32::try_from(cost).unwrap_or(u32::MAX))),
            }
            self.total += cost;
            self.idle_at = now.saturating_add(p);
            return Decision {
                allowed: true,
                remaining: rule.limit.saturating_sub(self.total),
                reset_ns: self.idle_at,
                retry_after_ns: 0,
            };
        }
        let retry_after_ns = if fits {
            0
        } else {
            // Walk the oldest entries until enough have expired for `cost` to fit.
            let mut left = self.total;
            let mut at = now;
            for &(t, c) in &self.entries {
                left -= u64::from(c);
                at = t.saturating_add(p);
                if left + cost <= rule.limit {
                    break;
                }
            }
            at - now
        };
        Decision {
            allowed: fits,
            remaining: rule.limit.saturating_sub(self.total),
            reset_ns: if self.total > 0 { self.idle_at } else { now },
            retry_after_ns,
        }
    }
}
