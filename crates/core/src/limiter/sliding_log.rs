//! Sliding log: exact. Keeps the time of every admitted request in the last period, so any
//! half-open span of one period admits at most `limit`. Memory grows with the limit, which is
//! why rules cap it at [`super::MAX_SLIDING_LOG_LIMIT`] and the store weighs these buckets by it.
//!
//! # Debt
//! A settle above what the log has room for ([`SlidingLog::charge`]) logs what fits now and
//! owes the rest: the log keeps the debt (one number beside its entries) and takes it from the
//! room as its entries expire, logging each part at the instant its room came free, before
//! anything else is admitted. That is exactly what admitting the debt as soon as the rule
//! allows would have logged, so any span of one period admits at most `limit` plus what was
//! settled above it within the span, and the debt is repaid by time alone (no decision needs to
//! come: the next one logs the parts at their instants). Logging the overshoot at the settle's
//! time instead would be nearly free when the log was full (the usual case: that is why there
//! is a debt), as it would expire with the entries already there. A log owes at most
//! [`super::MAX_DEBT_PERIODS`] times its limit. On the wire the debt travels as an entry at time
//! 0, which no admission has and which a receiver that does not know of debts drops as long
//! expired.
//!
//! # A changed rule
//! The log holds the time of each admission, so a new rule simply counts the admissions of its
//! own last period: a longer period keeps every entry the old one did (a used-up key stays used
//! up), a shorter one forgets those older than it, and a new limit applies to the entries as
//! they stand. [`SlidingLog::fit`] also resizes the log to the new limit (its memory weight)
//! and brings entries from the future (a peer's clock ahead, a hostile state) back to now. A
//! debt is tokens, and is owed under the new rule as under the old one.

use super::{Decision, MAX_DEBT_PERIODS, Rule};
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
    /// Tokens owed: taken from the room as entries expire (see the module's doc).
    debt: u64,
    /// The period of the rule that last decided on the log (0: not yet known, from the wire).
    period_ns: u64,
}

impl SlidingLog {
    pub fn new(limit: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            total: 0,
            max_entries: limit,
            idle_at: 0,
            debt: 0,
            period_ns: 0,
        }
    }

    /// An empty log of `rule`.
    pub fn fresh(rule: &Rule) -> Self {
        Self {
            period_ns: rule.period_ns,
            ..Self::new(rule.limit)
        }
    }

    pub fn max_entries(&self) -> u64 {
        self.max_entries
    }

    /// From this time on the log is as good as empty: its newest entry has expired, and so
    /// has what its debt will log (at most one period per limit owed after that).
    pub fn idle_at(&self) -> u64 {
        if self.debt == 0 {
            return self.idle_at;
        }
        let periods = self.debt.div_ceil(self.max_entries.max(1));
        self.idle_at
            .saturating_add(periods.saturating_mul(self.period_ns))
    }

    /// Tokens owed.
    pub fn debt(&self) -> u64 {
        self.debt
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
            debt: 0,
            period_ns: 0,
        }
    }

    /// The log as it travels: its entries, and its debt as entries at time 0 first.
    pub fn to_wire_entries(&self) -> Vec<(u64, u32)> {
        let mut debt = self.debt;
        let mut out = Vec::with_capacity(self.entries.len() + 1);
        while debt > 0 {
            let part = u32::try_from(debt).unwrap_or(u32::MAX);
            out.push((0, part));
            debt -= u64::from(part);
        }
        out.extend(self.entries.iter().copied());
        out
    }

    /// A travelled log (see [`SlidingLog::to_wire_entries`]): entries at time 0 are its debt;
    /// of the others, the newest `max_entries` are kept.
    pub fn from_wire_entries(max_entries: u64, entries: Vec<(u64, u32)>) -> Self {
        let debt: u64 = entries
            .iter()
            .filter(|&&(t, _)| t == 0)
            .map(|&(_, c)| u64::from(c))
            .sum();
        let keep = usize::try_from(max_entries).unwrap_or(usize::MAX);
        let logged: Vec<_> = entries.into_iter().filter(|&(t, _)| t != 0).collect();
        let skip = logged.len().saturating_sub(keep);
        let mut log = Self::from_entries(max_entries, logged.into_iter().skip(skip));
        log.debt = debt.min(max_entries.saturating_mul(MAX_DEBT_PERIODS));
        log
    }

    /// Adds the debt of `other` (another history of the same bucket) to this log's.
    pub fn add_debt(&mut self, other: &SlidingLog) {
        self.debt = self.debt.saturating_add(other.debt);
        self.period_ns = self.period_ns.max(other.period_ns);
    }

    /// Gives back `cost` of the admission logged at `at` (see [`super::BucketState::refund`]).
    /// Admissions at one instant share an entry, so the cost comes off that entry. A debt takes
    /// the room given back at `now`.
    pub fn refund(&mut self, rule: &Rule, at: u64, cost: u64, now: u64) {
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
        self.repay(rule, now);
    }

    /// Makes the log valid under `rule` at `now` (see the module's doc): expired entries
    /// dropped (a debt taking their room at the instants it came free), none later than `now`,
    /// at most `limit` of cost (the newest: when more are held, the oldest decide nothing, as the
    /// room comes free only once they and as many more have expired), sized for `limit`, and
    /// the room left now taken by a debt.
    pub fn fit(&mut self, rule: &Rule, now: u64) {
        self.period_ns = rule.period_ns;
        self.debt = self.debt.min(rule.limit.saturating_mul(MAX_DEBT_PERIODS));
        self.expire(rule, now);
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
        let mut over = self.total.saturating_sub(rule.limit);
        while over > 0 {
            let Some(front) = self.entries.front_mut() else {
                break;
            };
            let cut = over.min(u64::from(front.1));
            front.1 -= u32::try_from(cut).unwrap_or(u32::MAX);
            self.total -= cut;
            over -= cut;
            if front.1 == 0 {
                self.entries.pop_front();
            }
        }
        self.max_entries = rule.limit;
        self.repay(rule, now);
    }

    /// Takes what the log has room for at `now` from its debt, logged now.
    fn repay(&mut self, rule: &Rule, now: u64) {
        let room = rule.limit.saturating_sub(self.total);
        let take = room.min(self.debt);
        if take > 0 {
            self.log(now, take, rule.period_ns);
            self.debt -= take;
        }
    }

    /// Logs `cost` at `now` (the newest instant of the log).
    fn log(&mut self, now: u64, cost: u64, p: u64) {
        let c = u32::try_from(cost).unwrap_or(u32::MAX);
        match self.entries.back_mut() {
            Some((t, n)) if *t == now => *n = n.saturating_add(c),
            _ => self.entries.push_back((now, c)),
        }
        self.total += cost;
        self.idle_at = now.saturating_add(p);
    }

    /// Drops the entries that no longer count at `now` under `rule`; while the log owes, each
    /// expired entry's room is taken by the debt at the instant it came free (logged then, and
    /// dropped in turn if that too has expired).
    fn expire(&mut self, rule: &Rule, now: u64) {
        let p = rule.period_ns;
        // An entry at `t` counts for the half-open span [t, t + p).
        let expired = |t: u64| t.saturating_add(p) <= now;
        while self.debt > 0 && self.entries.front().is_some_and(|&(t, _)| expired(t)) {
            // Whole periods at once: while the log is full and owes at least as much, every
            // entry's room goes to the debt, which logs the same entries one period later.
            if let Some(&(newest, _)) = self.entries.back()
                && self.total > 0
                && self.total >= rule.limit
                && self.debt >= self.total
                && expired(newest)
            {
                let by_time = (now - newest) / p;
                let periods = by_time.min(self.debt / self.total).max(1);
                let shift = periods.saturating_mul(p);
                for e in self.entries.iter_mut() {
                    e.0 = e.0.saturating_add(shift);
                }
                self.debt -= periods * self.total;
                continue;
            }
            // The expired entries, oldest first: the debt takes the room each left at the
            // instant it came free. Every entry still counting is older than those instants
            // (the log spans less than a period, and owing, it admits nothing new), so what the
            // debt logs goes at the end, in order.
            let mut moved = Vec::new();
            while let Some(&(t, c)) = self.entries.front() {
                if !expired(t) {
                    break;
                }
                self.entries.pop_front();
                self.total -= u64::from(c);
                let room = rule.limit.saturating_sub(self.total);
                let take = u64::from(c).min(self.debt).min(room);
                if take > 0 {
                    self.debt -= take;
                    self.total += take;
                    moved.push((t.saturating_add(p), u32::try_from(take).unwrap_or(u32::MAX)));
                }
            }
            let in_order = match (self.entries.back(), moved.first()) {
                (Some(last), Some(first)) => last <= first,
                _ => true,
            };
            self.entries.extend(moved);
            if !in_order {
                // A log spanning more than a period (merged, or from the wire).
                self.entries.make_contiguous().sort_unstable();
            }
        }
        while let Some(&(t, c)) = self.entries.front() {
            if !expired(t) {
                break;
            }
            self.entries.pop_front();
            self.total -= u64::from(c);
        }
        // Recomputed here because a merged log (see `from_entries`) does not know the period.
        match self.entries.back() {
            Some(&(t, _)) => self.idle_at = t.saturating_add(p),
            // Idle: however it got there (a debt's entries shifted or not), the same log.
            None if self.idle_at <= now => self.idle_at = 0,
            None => {}
        }
    }

    /// Decides a check, appending it to the log when admitted.
    pub fn decide(&mut self, rule: &Rule, now: u64, cost: u64) -> Decision {
        let p = rule.period_ns;
        self.fit(rule, now);
        let fits = self.debt == 0 && self.total + cost.max(1) <= rule.limit;
        if fits && cost > 0 {
            self.log(now, cost, p);
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
            self.free_at(rule, now, cost.max(1)) - now
        };
        Decision {
            allowed: fits,
            remaining: if self.debt > 0 {
                0
            } else {
                rule.limit.saturating_sub(self.total)
            },
            reset_ns: if self.total > 0 { self.idle_at() } else { now },
            retry_after_ns,
        }
    }

    /// When `cost` fits, with no other traffic: once the debt and then `cost` have found room.
    /// Room comes free as entries expire, oldest first; what the debt takes comes free again
    /// one period later, so the tokens coming free are the log's entries again and again, one
    /// period apart, and `cost` fits at the `(debt + cost − room)`th of them. Called on a fitted
    /// log that denies `cost` (so it holds entries, and owes only while full).
    fn free_at(&self, rule: &Rule, now: u64, cost: u64) -> u64 {
        let p = rule.period_ns;
        let room = rule.limit.saturating_sub(self.total);
        let n = self.debt.saturating_add(cost).saturating_sub(room).max(1);
        let per_period = self.total.max(1);
        let periods = (n - 1) / per_period;
        let nth = (n - 1) % per_period + 1;
        if self.entries.is_empty() {
            // Nothing expires: only a cost over the limit gets here, and never fits.
            return now;
        }
        let mut seen = 0;
        let mut at = now;
        for &(t, c) in &self.entries {
            seen += u64::from(c);
            at = t.saturating_add(p);
            if seen >= nth {
                break;
            }
        }
        at.saturating_add(periods.saturating_mul(p))
    }

    /// Takes `cost` whatever the log has room for (a settle above its estimate): what fits is
    /// logged now, the rest is owed (see the module's doc). Returns the tokens forgiven because
    /// the log would owe more than it may.
    pub fn charge(&mut self, rule: &Rule, now: u64, cost: u64) -> u64 {
        self.fit(rule, now);
        let room = if self.debt > 0 {
            0
        } else {
            rule.limit.saturating_sub(self.total)
        };
        let take = room.min(cost);
        if take > 0 {
            self.log(now, take, rule.period_ns);
        }
        let most = rule.limit.saturating_mul(MAX_DEBT_PERIODS);
        let owed = self.debt.saturating_add(cost - take);
        self.debt = owed.min(most);
        owed - self.debt
    }
}
