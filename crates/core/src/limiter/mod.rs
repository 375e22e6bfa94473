//! The limiting algorithms: pure functions of (state, rule, now, cost).
//!
//! Every algorithm decides from the bucket's state, the rule, the current time in nanoseconds and
//! the cost, and returns a [`Decision`]. A denied check, or one of cost 0, never changes what the
//! state means (an algorithm may still tidy its representation, e.g. drop expired log entries).
//!
//! # A changed rule
//! A bucket outlives changes of its rule's numbers (a named rule's bucket is its name and the
//! key), so a state may have been written under other parameters, or received from a peer.
//! [`BucketState::fit_to_rule`] makes any state valid under the rule in force, and every
//! decision applies it first: consumption is kept, but never costs more than the new rule can
//! (a token or leaky bucket is at most empty under it; a window's count carries into the new
//! rule's current window). What each algorithm keeps is in its module's doc.
//!
//! # Debt
//! A reservation settled above what its bucket admits ([`BucketState::charge`]) takes the rest
//! into the bucket's own state, in each algorithm's terms: a token or leaky bucket's refill time
//! moves past an empty bucket, a window's count fills the windows after the current one, a log
//! owes what its expiring entries' room will pay. A bucket in debt denies until the debt is
//! repaid by time alone, exactly as if the debt had been admitted as soon as the rule allowed;
//! and the debt goes wherever the state goes (replicas, handover, recall) and is evicted with
//! it. A bucket owes at most [`MAX_DEBT_PERIODS`] periods of its limit (what a settle would add
//! beyond that is forgiven, and counted by the caller), which also bounds how long a state from
//! a peer can keep a key denied. A state records which rule wrote it (a tag of the numbers its
//! meaning depends on), so that a debt is kept under that rule and never mistaken for another
//! rule's consumption after a change; a state from the wire has no tag, and its debt is kept.
//!
//! # Layout
//! - [`token_bucket`] — GCRA form of a token bucket (one `u64` of state).
//! - [`leaky_bucket`] — the leaky bucket as a meter (the same GCRA arithmetic).
//! - [`fixed_window`] — a counter per aligned window.
//! - [`sliding_window`] — weighted two-window counter.
//! - [`sliding_log`] — exact log of admitted requests.
//!
//! # Adding an algorithm
//! 1. `ringlimit_proto::Algorithm`: the variant, its name, its stable code (bucket identities
//!    hash it) and whether it has a `burst`.
//! 2. A module here with its pure `decide`, and its [`BucketState`] variant: `fresh`, `fits`,
//!    `idle_at`, `absorb` (handover), `fit_to_rule` (a changed rule), `decide`, `refund`
//!    (all-or-nothing requests), `charge` (debt), and the wire form (`to_wire`/`from_wire`, a
//!    `ringlimit_proto::peer::WireState` variant appended at the end).
//! 3. The node's global mode (`global::decide::effective_rule`): how two windowed counts
//!    approximate it.
//!
//! Validation, identities, routing, fallback, the SDK and every edge take it from there; the
//! `every_algorithm_*` tests in `tests.rs` then hold it to the common contract.

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use ringlimit_proto::Algorithm;
use ringlimit_proto::peer::{Mark, WireState};

pub use sliding_log::SlidingLog;

/// Largest `limit` (and `burst`) a rule may have: counts must fit the compact `u32` state.
pub const MAX_LIMIT: u64 = 1_000_000_000;
/// Largest limit a sliding log may have: its memory grows with the limit.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 10_000;
/// Shortest time per token for the bucket algorithms: at most one token per microsecond, so the
/// whole-nanosecond emission interval is exact to 0.1%.
pub const MIN_EMISSION_NS: u64 = 1_000;
/// Longest period a rule may have (366 days).
pub const MAX_PERIOD_NS: u64 = 366 * 24 * 3600 * 1_000_000_000;
/// The most a bucket may owe, in periods of its rule (its limit this many times over): a debt
/// keeps a key denied at most this long, whatever was settled or received from a peer.
pub const MAX_DEBT_PERIODS: u64 = 64;

/// A fingerprint of `rule`'s period, kept in a window's state. The windows of two periods may
/// end at the same instant (1 h and 2 h at every even hour), so the state's times alone cannot
/// tell a count of the other period's current window from one of this period's previous window,
/// nor a debt of this rule (a later window of its own) from another period's window. Never 0,
/// which stands for a state whose period is unknown (received over the wire).
pub fn period_tag(rule: &Rule) -> u32 {
    if let Some(c) = rule.calendar {
        // The zone's and unit's fingerprint: the same in every process (a state may be kept on
        // disk), apart from the plain periods' in the top bit.
        let t = c.zone.tag().rotate_left(u32::from(c.unit.code()) * 8) | 1 << 31;
        return t;
    }
    let p = rule.period_ns;
    // The high bits folded in: periods 2^32 ns (4.3 s) apart differ too.
    let folded = (p ^ (p >> 32)) & u64::from(u32::MAX);
    u32::try_from(folded).unwrap_or(u32::MAX).max(1)
}

/// A validated rule as the algorithms see it. Build it through [`crate::rule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    pub algorithm: Algorithm,
    /// Requests per period.
    pub limit: u64,
    /// Period in nanoseconds (> 0).
    pub period_ns: u64,
    /// Bucket capacity; equals `limit` for the window algorithms.
    pub burst: u64,
    /// A fixed window's calendar (its day, week or month in a time zone; `period_ns` is then
    /// the unit's nominal length); `None` for windows counted from the epoch.
    pub calendar: Option<crate::calendar::Calendar>,
}

impl Rule {
    /// The most one check may cost: the capacity of the bucket or window.
    pub fn capacity(&self) -> u64 {
        if self.algorithm.has_burst() {
            self.burst
        } else {
            self.limit
        }
    }
}

/// What an algorithm decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Whole requests of cost 1 still admissible now.
    pub remaining: u64,
    /// When the bucket is full again (or its window resets), ns since the epoch.
    pub reset_ns: u64,
    /// 0 when allowed; else how long until the same check would be admitted, in ns.
    pub retry_after_ns: u64,
}

/// One bucket's state, as compact as the algorithm allows (the store keeps up to a million).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketState {
    /// Token bucket and leaky bucket: the theoretical arrival time, and the
    /// [`token_bucket::tag`] of the rule that wrote it (0: unknown, from the wire).
    Gcra { tat: u64, tag: u32 },
    /// Fixed window: end of the counted window and its count, and the [`period_tag`] of the
    /// period that wrote them (0: unknown, from the wire).
    Fixed {
        end: u64,
        count: u32,
        period_tag: u32,
    },
    /// Sliding window: `until` is the end of the current window plus one period (when the state
    /// stops mattering), with the current and previous windows' counts, and the
    /// [`period_tag`] of the period that wrote them (0: unknown, from the wire).
    Sliding {
        until: u64,
        current: u32,
        previous: u32,
        period_tag: u32,
    },
    /// Sliding log: boxed, since it grows with the limit.
    Log(Box<SlidingLog>),
}

impl BucketState {
    /// The state of a bucket nobody has used.
    pub fn fresh(rule: &Rule) -> Self {
        match rule.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => BucketState::Gcra {
                tat: 0,
                tag: token_bucket::tag(rule),
            },
            Algorithm::FixedWindow => BucketState::Fixed {
                end: 0,
                count: 0,
                period_tag: period_tag(rule),
            },
            Algorithm::SlidingWindow => BucketState::Sliding {
                until: 0,
                current: 0,
                previous: 0,
                period_tag: period_tag(rule),
            },
            Algorithm::SlidingLog => BucketState::Log(Box::new(SlidingLog::fresh(rule))),
        }
    }

    /// Whether this state can serve `rule` (a reloaded rule may have changed algorithm).
    fn fits(&self, rule: &Rule) -> bool {
        matches!(
            (self, rule.algorithm),
            (
                BucketState::Gcra { .. },
                Algorithm::TokenBucket | Algorithm::LeakyBucket
            ) | (BucketState::Fixed { .. }, Algorithm::FixedWindow)
                | (BucketState::Sliding { .. }, Algorithm::SlidingWindow)
                | (BucketState::Log(_), Algorithm::SlidingLog)
        )
    }

    /// From this time on the state is equivalent to a fresh one (the bucket is full again, its
    /// debt repaid). Used to tell idle evictions from evictions of buckets that were still
    /// limiting, and which buckets a handover or a recall carries.
    pub fn idle_at(&self) -> u64 {
        match self {
            BucketState::Gcra { tat, .. } => *tat,
            BucketState::Fixed { end, .. } => *end,
            BucketState::Sliding { until, .. } => *until,
            BucketState::Log(log) => log.idle_at(),
        }
    }

    /// Relative memory cost for the store's bound: 1 for the fixed-size states, more for a
    /// sliding log in proportion to the most entries it may hold (16 bytes each, 64-byte units).
    pub fn weight(&self) -> u64 {
        match self {
            BucketState::Log(log) => 1 + log.max_entries() / 4,
            _ => 1,
        }
    }

    /// Adds the consumption recorded in `other` (the same bucket, decided elsewhere — e.g. by a
    /// previous owner) to this state, so that neither side's admissions are forgotten. Where the
    /// two describe different windows, the later window wins.
    pub fn absorb(&mut self, other: BucketState, now: u64) {
        match (self, other) {
            (
                BucketState::Gcra { tat, tag },
                BucketState::Gcra {
                    tat: theirs,
                    tag: t2,
                },
            ) => {
                // Each side's consumption (debt included) is how far its tat runs ahead of now.
                let extra = theirs.saturating_sub(now);
                *tat = (*tat).max(now).saturating_add(extra);
                if *tag == 0 {
                    *tag = t2;
                }
            }
            (mine @ (BucketState::Fixed { .. } | BucketState::Sliding { .. }), theirs) => {
                mine.merge_windows(theirs, u32::saturating_add);
            }
            (BucketState::Log(mine), BucketState::Log(theirs)) => {
                let mut merged = SlidingLog::from_entries(
                    mine.max_entries().max(theirs.max_entries()),
                    mine.entries().chain(theirs.entries()),
                );
                merged.add_debt(mine);
                merged.add_debt(&theirs);
                **mine = merged;
            }
            // Different algorithms: the bucket was redefined; keep ours.
            _ => {}
        }
    }

    /// Merges `other`, another reading of the same history (a replica's copy of this bucket,
    /// and the state its owner handed over later): the larger consumption wins, since adding
    /// them would count what both saw twice. Where the two describe different windows, the
    /// later window wins; of two sliding logs, the one busy longer.
    pub fn overlap(&mut self, other: BucketState) {
        match (self, other) {
            (
                BucketState::Gcra { tat, tag },
                BucketState::Gcra {
                    tat: theirs,
                    tag: t2,
                },
            ) => {
                *tat = (*tat).max(theirs);
                if *tag == 0 {
                    *tag = t2;
                }
            }
            (mine @ (BucketState::Fixed { .. } | BucketState::Sliding { .. }), theirs) => {
                mine.merge_windows(theirs, u32::max);
            }
            (BucketState::Log(mine), BucketState::Log(theirs))
                if theirs.idle_at() > mine.idle_at() =>
            {
                *mine = theirs;
            }
            // Different algorithms (the bucket was redefined), or our log is the longer: ours.
            _ => {}
        }
    }

    /// The windowed states' merge, shared by [`BucketState::absorb`] (two histories: counts
    /// add) and [`BucketState::overlap`] (two readings of one history: the larger count):
    /// in the same window the counts `combine`, a later window wins, an earlier one is dropped.
    /// Anything but two fixed or two sliding windows is left as it is.
    fn merge_windows(&mut self, other: BucketState, combine: fn(u32, u32) -> u32) {
        match (self, other) {
            (
                BucketState::Fixed {
                    end,
                    count,
                    period_tag,
                },
                BucketState::Fixed {
                    end: e2,
                    count: c2,
                    period_tag: t2,
                },
            ) => {
                if *end == e2 {
                    *count = combine(*count, c2);
                    if *period_tag == 0 {
                        *period_tag = t2;
                    }
                } else if e2 > *end {
                    (*end, *count, *period_tag) = (e2, c2, t2);
                }
            }
            (
                BucketState::Sliding {
                    until,
                    current,
                    previous,
                    period_tag,
                },
                BucketState::Sliding {
                    until: u2,
                    current: c2,
                    previous: p2,
                    period_tag: t2,
                },
            ) => {
                if *until == u2 {
                    *current = combine(*current, c2);
                    *previous = combine(*previous, p2);
                    if *period_tag == 0 {
                        *period_tag = t2;
                    }
                } else if u2 > *until {
                    (*until, *current, *previous, *period_tag) = (u2, c2, p2, t2);
                }
            }
            _ => {}
        }
    }

    /// This state as it travels to a bucket's new owner ([`WireState`]).
    pub fn to_wire(&self) -> WireState {
        match self {
            // The rule's tags stay here: a receiver takes the state as written under the rule it
            // has (its debt kept, up to the most a bucket may owe), and fits it by its windows.
            BucketState::Gcra { tat, tag: _ } => WireState::Gcra { tat: *tat },
            BucketState::Fixed {
                end,
                count,
                period_tag: _,
            } => WireState::Fixed {
                end: *end,
                count: *count,
            },
            BucketState::Sliding {
                until,
                current,
                previous,
                period_tag: _,
            } => WireState::Sliding {
                until: *until,
                current: *current,
                previous: *previous,
            },
            BucketState::Log(log) => WireState::Log {
                entries: log.to_wire_entries(),
                max_entries: log.max_entries(),
            },
        }
    }

    /// A travelled state back into a bucket. Untrusted input: a log is capped at its stated
    /// size, itself capped at the largest limit a log may have; any debt at the most a bucket
    /// may owe (when the state is first fitted to its rule).
    pub fn from_wire(state: WireState) -> Self {
        match state {
            WireState::Gcra { tat } => BucketState::Gcra { tat, tag: 0 },
            WireState::Fixed { end, count } => BucketState::Fixed {
                end,
                count,
                period_tag: 0,
            },
            WireState::Sliding {
                until,
                current,
                previous,
            } => BucketState::Sliding {
                until,
                current,
                previous,
                period_tag: 0,
            },
            WireState::Log {
                entries,
                max_entries,
            } => {
                let max = max_entries.min(MAX_SLIDING_LOG_LIMIT);
                BucketState::Log(Box::new(SlidingLog::from_wire_entries(max, entries)))
            }
        }
    }

    /// Gives back `cost` taken by an admission under `rule` decided at `mark.at_ns` whose
    /// decision's `reset_ns` was `mark.reset_ns` (a request decided all-or-nothing that another
    /// limit denied), at `now`.
    ///
    /// Exact when nothing else touched the bucket in between: the state then decides every
    /// later check as if the admission had never happened. When other admissions came in
    /// between, never more generous than that: a refund may leave the bucket with less than
    /// it would have (a false deny, briefly), never with more (an over-admission). The windowed
    /// algorithms are counters, so giving back is exact either way; the GCRA state is one
    /// instant, which cannot tell the refill that others used from the refill a full bucket
    /// would have wasted, so a token or leaky bucket gets back its cost less the refill since
    /// the admission: exact when given back at the admission's instant (an owner refunding its
    /// own group) or when the bucket was full then; otherwise short by the refill of the time
    /// in between (a round trip: 0.2 ms at 100/s is 1/50 of a token).
    pub fn refund(&mut self, rule: &Rule, cost: u64, mark: Mark, now: u64) {
        let Mark {
            reset_ns: mark,
            at_ns: at,
        } = mark;
        if cost == 0 || !self.fits(rule) {
            return;
        }
        match self {
            BucketState::Gcra { tat, .. } => {
                let need = token_bucket::emission_ns(rule).saturating_mul(cost);
                // Had the admission not come, the bucket may have been full from its time on,
                // refilling in vain: that refill is not given back. (Nothing tells whether
                // others touched the bucket since: a refund of another admission and an
                // admission of the same cost leave it reading `mark` again.)
                let back = tat
                    .saturating_sub(need)
                    .saturating_add(now.saturating_sub(at));
                *tat = back.min(*tat);
            }
            BucketState::Fixed { end, count, .. } => {
                if *end == mark {
                    *count = count.saturating_sub(small(cost));
                }
            }
            BucketState::Sliding {
                until,
                current,
                previous,
                ..
            } => {
                // The admission counted in the window that `mark` closes (one period before
                // it): that window is still the current one, or has become the previous one.
                if *until == mark {
                    *current = current.saturating_sub(small(cost));
                } else if Some(*until) == mark.checked_add(rule.period_ns) {
                    *previous = previous.saturating_sub(small(cost));
                }
            }
            BucketState::Log(log) => {
                log.refund(rule, mark.saturating_sub(rule.period_ns), cost, now)
            }
        }
    }

    /// Makes this state valid under `rule` at `now`, whatever rule wrote it (a reload changed
    /// the rule's numbers) or wherever it came from (a peer's handover): the consumption it
    /// records is kept, but the state never needs more than `rule` can — a token or leaky
    /// bucket's refill time is at most `now + burst·T` (an empty bucket of this rule), a
    /// window's count carries into this rule's window containing `now`, a log holds entries no
    /// later than `now` and no more than `limit` — plus, for a state this rule wrote (or one
    /// from the wire), its debt, up to the most a bucket may owe. A state of another algorithm
    /// becomes fresh.
    ///
    /// Pure, idempotent, and a no-op (in meaning; a log may drop expired entries) on any state
    /// that `rule` itself wrote at or before `now`. [`BucketState::decide`] applies it first.
    pub fn fit_to_rule(&mut self, rule: &Rule, now: u64) {
        if !self.fits(rule) {
            *self = BucketState::fresh(rule);
            return;
        }
        match self {
            BucketState::Gcra { tat, tag } => token_bucket::fit(tat, tag, rule, now),
            BucketState::Fixed {
                end, period_tag, ..
            } => fixed_window::fit(end, period_tag, rule, now),
            BucketState::Sliding {
                until,
                current,
                previous,
                period_tag,
            } => sliding_window::fit(until, current, previous, period_tag, rule, now),
            BucketState::Log(log) => log.fit(rule, now),
        }
    }

    /// Decides a check of `cost` at `now` against this state, updating it when admitted. The
    /// state is first fitted to `rule` ([`BucketState::fit_to_rule`]; each algorithm does it
    /// within its decision, sharing the arithmetic), and that is kept even when denied: a
    /// later check must find it fitted already, not fit the old state again at its own time.
    pub fn decide(&mut self, rule: &Rule, now: u64, cost: u64) -> Decision {
        if !self.fits(rule) {
            *self = BucketState::fresh(rule);
        }
        match self {
            BucketState::Gcra { tat, tag } => match rule.algorithm {
                Algorithm::LeakyBucket => leaky_bucket::decide(tat, tag, rule, now, cost),
                _ => token_bucket::decide(tat, tag, rule, now, cost),
            },
            BucketState::Fixed {
                end,
                count,
                period_tag,
            } => fixed_window::decide_tagged(end, count, period_tag, rule, now, cost),
            BucketState::Sliding {
                until,
                current,
                previous,
                period_tag,
            } => sliding_window::decide(until, current, previous, period_tag, rule, now, cost),
            BucketState::Log(log) => log.decide(rule, now, cost),
        }
    }

    /// What the bucket owes at `now` under `rule` (0 when not in debt): what it has taken
    /// beyond all the rule could have admitted by now (see the module's doc, *Debt*).
    pub fn owed(&self, rule: &Rule, now: u64) -> u64 {
        let mut s = self.clone();
        s.fit_to_rule(rule, now);
        let p = rule.period_ns;
        let end = fixed_window::window_end(rule, now);
        match s {
            BucketState::Gcra { tat, .. } => {
                let t = token_bucket::emission_ns(rule);
                let empty = now.saturating_add(t.saturating_mul(rule.burst));
                tat.saturating_sub(empty).div_ceil(t)
            }
            // Windows after the current one up to the state's, full but the last.
            BucketState::Fixed { end: at, count, .. } if at > end => {
                (fixed_window::windows_between(rule, end, at) - 1) * rule.limit + u64::from(count)
            }
            BucketState::Sliding { until, current, .. } if until > end + p => {
                ((until - end - p) / p - 1) * rule.limit + u64::from(current)
            }
            BucketState::Log(log) => log.debt(),
            _ => 0,
        }
    }

    /// Takes `cost` at `now` whatever the bucket admits (a reservation settled above its
    /// estimate): what the bucket cannot admit now is owed, part of its state (see the
    /// module's doc, *Debt*). Fits the state first, like [`BucketState::decide`]. Returns the
    /// tokens forgiven because the bucket would owe more than [`MAX_DEBT_PERIODS`] allow.
    pub fn charge(&mut self, rule: &Rule, now: u64, cost: u64) -> u64 {
        if !self.fits(rule) {
            *self = BucketState::fresh(rule);
        }
        match self {
            BucketState::Gcra { tat, tag } => token_bucket::charge(tat, tag, rule, now, cost),
            BucketState::Fixed {
                end,
                count,
                period_tag,
            } => fixed_window::charge(end, count, period_tag, rule, now, cost),
            BucketState::Sliding {
                until,
                current,
                previous,
                period_tag,
            } => sliding_window::charge(until, current, previous, period_tag, rule, now, cost),
            BucketState::Log(log) => log.charge(rule, now, cost),
        }
    }
}

/// A count as the compact states hold it (`limit <= MAX_LIMIT < u32::MAX`).
fn small(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Times and rules for tests (here and in the crates built on this one).
#[doc(hidden)]
pub mod test_support {
    use super::*;

    /// A start time well after the epoch, aligned to nothing in particular.
    pub const T0: u64 = 1_700_000_000_123_456_789;
    pub const MS: u64 = 1_000_000;
    pub const SEC: u64 = 1_000_000_000;

    pub fn rule(algorithm: Algorithm, limit: u64, period_ms: u64, burst: u64) -> Rule {
        Rule {
            algorithm,
            limit,
            period_ns: period_ms * MS,
            burst,
            calendar: None,
        }
    }
}

#[cfg(test)]
mod tests;
