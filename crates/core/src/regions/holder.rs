//! The region's side: the shared buckets this node owns in its region, each decided on the
//! slices its home granted, with the demand the next report tells and the fallback bucket it
//! decides on when its allowance expired without renewal.

use super::{OnRegionUnreachable, RegionSettings, fallback_rule, windowed};
use crate::clock::NANOS_PER_MS;
use crate::limiter::{BucketState, Decision, Rule};
use parking_lot::Mutex;
use ringlimit_proto::RuleRef;
use ringlimit_proto::peer::Mark;
use ringlimit_proto::region::{
    AskAgain, AskTally, MAX_BACK_PER_ASK, RegionAsk, RegionGrant, SliceBack,
};
use std::collections::{HashMap, VecDeque};

/// Most slices of one bucket a region keeps (the newest and renewals that came early); older
/// ones go back.
const MOST_SLICES: usize = 3;
/// Most asks of one bucket remembered while their grants are on their way.
pub(super) const MOST_ASKS: usize = 4;
/// A window's first ask waits this fraction of an interval past its slices' end, for the
/// jitter of the way to the home.
const TURN_MARGIN: u64 = 50;

/// How a check of a shared bucket was decided here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// On the allowance (a slice or the advance before the first grant): admitted, with what
    /// is left of it, or denied until about `retry_after_ns`.
    Allowed {
        remaining: u64,
        limit: u64,
        reset_at_ms: u64,
    },
    Denied {
        limit: u64,
        reset_at_ms: u64,
        retry_after_ns: u64,
    },
    /// The allowance expired without renewal: decided on the fallback share (`degraded`).
    Fallback(Decision, Rule),
    /// The allowance expired without renewal and the rule says `open`: admitted (`degraded`).
    Open,
    /// The table is full: denied (never over the limit).
    Full,
}

impl Verdict {
    /// Whether the check was admitted.
    pub fn allowed(&self) -> bool {
        match self {
            Verdict::Allowed { .. } | Verdict::Open => true,
            Verdict::Fallback(d, _) => d.allowed,
            Verdict::Denied { .. } | Verdict::Full => false,
        }
    }

    /// Whether it was decided without an allowance (the region fell back).
    pub fn degraded(&self) -> bool {
        matches!(self, Verdict::Fallback(..) | Verdict::Open)
    }
}

/// A report due to a bucket's home: ask `seq` of bucket `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub id: u64,
    pub seq: u64,
    pub ask: RegionAsk,
}

#[derive(Debug, Clone, Copy)]
struct Slice {
    tokens: u64,
    until_ns: u64,
    mark: Mark,
}

#[derive(Debug)]
struct Entry {
    key: String,
    rule_ref: RuleRef,
    rule: Rule,
    fb_rule: Rule,
    policy: OnRegionUnreachable,
    slices: VecDeque<Slice>,
    /// Expired or superseded slices to give back with the next ask.
    back: Vec<SliceBack>,
    fallback: BucketState,
    /// The allowance's end (0: never granted).
    allowance_until: u64,
    first_ns: u64,
    last_check_ns: u64,
    /// Checks asked since `since_ns` (the demand the next report tells).
    asked: u64,
    /// Checks asked since the entry began (told with every report).
    asked_total: u64,
    /// Checks admitted on the fallback since the entry began (told with every report).
    fallback_total: u64,
    /// Where the home's clock offset places its window's end (0: not placed), and
    /// `asked_total` when that time came (told with every report).
    placed_turn_ns: u64,
    turn_counted_ns: u64,
    asked_at_turn: u64,
    since_ns: u64,
    /// The demand last told, per ns.
    rate: f64,
    /// Ahead of the first grant (and of a window's first, see [`Entry::expire`]): what may
    /// still be admitted, and what was (told with the next report).
    advance_left: u64,
    advance_spent: u64,
    /// Asks on their way.
    asks: VecDeque<Sent>,
    /// Asks given up (no grant within an interval): told to the home, which gives their
    /// grants back to the bucket (a grant coming later is dropped here).
    unanswered: Vec<u64>,
    /// What those asks gave back and told as advance, told again under their numbers (a
    /// home that never saw an ask applies it).
    again: Vec<AskAgain>,
    next_regular_ns: u64,
    /// When its window's slices end (0: none granted): the new window's first slice is asked
    /// for then, not at the next regular report, so that a region is not without tokens for
    /// the start of every window.
    turn_ns: u64,
    /// When the home's window turned at the latest, here (0: not known): the advance is
    /// armed then (see [`Entry::expire`]).
    advance_at: u64,
    /// The turn whose advance was armed.
    turn_armed: u64,
    early_wanted: bool,
    early_sent: u32,
    /// A check found no tokens since the last report: the region is short, so it keeps its
    /// older slices to spend rather than give them back.
    short: bool,
    last_granted: u64,
    limit: u64,
    reset_at_ms: u64,
}

/// An ask on its way: what it told, to be told again if it is lost.
#[derive(Debug)]
struct Sent {
    seq: u64,
    at: u64,
    advance: u64,
    back: Vec<SliceBack>,
}

impl Entry {
    /// At the home's window turn (as placed by its clock offset), notes the count of checks.
    fn count_turn(&mut self, now: u64) {
        if self.placed_turn_ns > 0
            && now >= self.placed_turn_ns
            && self.turn_counted_ns != self.placed_turn_ns
        {
            self.turn_counted_ns = self.placed_turn_ns;
            self.asked_at_turn = self.asked_total;
        }
    }

    /// Tells what the lost ask `sent` gave back and admitted ahead of its grants again with
    /// the next ask. Beyond what an ask may carry, the oldest's advance is told as the
    /// entry's own (charged even if the home saw it: fewer admissions, never more) and its
    /// returns are lost.
    fn told_again(&mut self, sent: Sent) {
        if sent.back.is_empty() && sent.advance == 0 {
            return;
        }
        self.again.push(AskAgain {
            seq: sent.seq,
            back: sent.back,
            advance: sent.advance,
        });
        while self.again.len() > MAX_BACK_PER_ASK {
            let oldest = self.again.remove(0);
            self.advance_spent = self.advance_spent.saturating_add(oldest.advance);
        }
    }

    fn tokens(&self) -> u64 {
        self.slices.iter().map(|s| s.tokens).sum()
    }

    fn expire(&mut self, now: u64, s: &RegionSettings) {
        while self.slices.front().is_some_and(|s| s.until_ns <= now) {
            if let Some(s) = self.slices.pop_front() {
                self.give_back(s);
            }
        }
        // Once its window's slices ended, the region may admit the advance a new key may
        // until the new window's first grant comes (a round trip after the turn): a region of
        // small demand would otherwise lose its checks of each window's first moments, and
        // its part of the window with them. It is charged in the new window with the next
        // report, as a new key's is.
        if self.advance_at > 0 && now >= self.advance_at && self.turn_armed != self.advance_at {
            self.turn_armed = self.advance_at;
            self.advance_left = advance(&self.rule, &self.fb_rule, s);
        }
    }

    fn give_back(&mut self, s: Slice) {
        if s.tokens > 0 {
            self.back.push(SliceBack {
                tokens: s.tokens,
                mark: s.mark,
            });
        }
    }

    fn in_fallback(&self, now: u64, allowance_ns: u64) -> bool {
        if self.allowance_until == 0 {
            now >= self.first_ns.saturating_add(allowance_ns)
        } else {
            now >= self.allowance_until
        }
    }
}

/// What a region may admit ahead of a grant (a new key's first, a window's first): one
/// interval's equal part of the limit, so that those checks are not denied for a round trip
/// to the home; what they took is charged there with the next report.
fn advance(rule: &Rule, fb_rule: &Rule, s: &RegionSettings) -> u64 {
    let pace = u128::from(rule.limit) * u128::from(s.interval_ns)
        / u128::from(rule.period_ns.max(1))
        / s.regions as u128;
    u64::try_from(pace)
        .unwrap_or(u64::MAX)
        .max(1)
        .min(fb_rule.limit)
}

/// Charges `cost` to a fallback bucket as far as it admits (no debt): it must count what the
/// region admitted on its slices, but those were paid for at the home, so they never make
/// the fallback owe beyond its own window.
fn charge(state: &mut BucketState, rule: &Rule, now: u64, cost: u64) {
    let left = state.decide(rule, now, 0).remaining;
    let n = cost.min(left);
    if n > 0 {
        state.decide(rule, now, n);
    }
}

/// The shared buckets a region's owner holds allowances of. Bounded: at most `max` buckets
/// (a check of a new one beyond is denied: never over the limit).
#[derive(Debug)]
pub struct Allowances {
    settings: RegionSettings,
    entries: Mutex<HashMap<u64, Entry>>,
    max: usize,
    seq: Mutex<u64>,
    /// Woken when a bucket wants an early report.
    pub wake: tokio::sync::Notify,
}

/// What the region holds and asks, summed over its buckets (for `/v1/cluster`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HeldTotals {
    pub buckets: u64,
    pub tokens: u64,
    pub fallback: u64,
}

impl Allowances {
    pub fn new(settings: RegionSettings, max: usize) -> Self {
        Self {
            settings,
            entries: Mutex::default(),
            max,
            seq: Mutex::new(0),
            wake: tokio::sync::Notify::new(),
        }
    }

    pub fn settings(&self) -> &RegionSettings {
        &self.settings
    }

    /// Buckets held here.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens held in slices, buckets held, and buckets deciding on their fallback.
    pub fn totals(&self, now: u64) -> HeldTotals {
        let a = self.settings.allowance_ns();
        let entries = self.entries.lock();
        HeldTotals {
            buckets: entries.len() as u64,
            tokens: entries.values().map(Entry::tokens).sum(),
            fallback: entries.values().filter(|e| e.in_fallback(now, a)).count() as u64,
        }
    }

    /// A check of `cost` of bucket `id` (rule `rule`, named by `key` in asks) at `now`.
    pub fn check(
        &self,
        id: u64,
        rule: &Rule,
        policy: OnRegionUnreachable,
        cost: u64,
        now: u64,
        key: impl FnOnce() -> (String, RuleRef),
    ) -> Verdict {
        let s = self.settings;
        let allowance_ns = s.allowance_ns();
        let mut entries = self.entries.lock();
        if !entries.contains_key(&id) {
            if entries.len() >= self.max {
                let idle = s.interval_ns.saturating_mul(s.idle_intervals);
                entries.retain(|_, e| {
                    now.saturating_sub(e.last_check_ns) < idle || !e.slices.is_empty()
                });
                if entries.len() >= self.max {
                    return Verdict::Full;
                }
            }
            let (k, r) = key();
            let fb_rule = fallback_rule(rule, s.regions);
            let advance = advance(rule, &fb_rule, &s);
            entries.insert(
                id,
                Entry {
                    key: k,
                    rule_ref: r,
                    rule: *rule,
                    fb_rule,
                    policy,
                    slices: VecDeque::new(),
                    back: Vec::new(),
                    fallback: BucketState::fresh(&fb_rule),
                    allowance_until: 0,
                    first_ns: now,
                    last_check_ns: now,
                    asked: 0,
                    asked_total: 0,
                    fallback_total: 0,
                    placed_turn_ns: 0,
                    turn_counted_ns: 0,
                    asked_at_turn: 0,
                    since_ns: now,
                    rate: 0.0,
                    advance_left: advance,
                    advance_spent: 0,
                    asks: VecDeque::new(),
                    unanswered: Vec::new(),
                    again: Vec::new(),
                    next_regular_ns: now,
                    turn_ns: 0,
                    advance_at: 0,
                    turn_armed: 0,
                    early_wanted: true,
                    early_sent: 0,
                    short: false,
                    last_granted: 0,
                    limit: rule.limit,
                    reset_at_ms: now / NANOS_PER_MS,
                },
            );
        }
        let Some(e) = entries.get_mut(&id) else {
            return Verdict::Full;
        };
        if e.rule != *rule {
            // The rule changed: the fallback follows it (its count is kept where it fits).
            e.rule = *rule;
            e.fb_rule = fallback_rule(rule, s.regions);
            e.limit = rule.limit;
        }
        e.policy = policy;
        e.last_check_ns = now;
        e.count_turn(now);
        e.asked = e.asked.saturating_add(cost);
        e.asked_total = e.asked_total.saturating_add(cost);
        e.expire(now, &s);
        let fb_rule = e.fb_rule;
        if let Some(slice) = e.slices.iter_mut().find(|sl| sl.tokens >= cost) {
            slice.tokens -= cost;
            charge(&mut e.fallback, &fb_rule, now, cost);
            let left = e.tokens();
            if left.saturating_mul(2) < e.last_granted {
                e.early_wanted = true;
            }
            return Verdict::Allowed {
                remaining: left,
                limit: e.limit,
                reset_at_ms: e.reset_at_ms,
            };
        }
        if e.in_fallback(now, allowance_ns) {
            let v = match e.policy {
                OnRegionUnreachable::Share => {
                    Verdict::Fallback(e.fallback.decide(&fb_rule, now, cost), fb_rule)
                }
                OnRegionUnreachable::Open => Verdict::Open,
            };
            if v.allowed() {
                e.fallback_total = e.fallback_total.saturating_add(cost);
            }
            return v;
        }
        if e.advance_left >= cost {
            e.advance_left -= cost;
            e.advance_spent = e.advance_spent.saturating_add(cost);
            charge(&mut e.fallback, &fb_rule, now, cost);
            return Verdict::Allowed {
                remaining: e.advance_left,
                limit: e.limit,
                reset_at_ms: e.reset_at_ms,
            };
        }
        e.short = e.short || cost > 0;
        let want_early = cost > 0 && !e.early_wanted;
        e.early_wanted = e.early_wanted || cost > 0;
        let retry = e.next_regular_ns.saturating_sub(now).max(NANOS_PER_MS);
        let v = Verdict::Denied {
            limit: e.limit,
            reset_at_ms: e.reset_at_ms,
            retry_after_ns: retry,
        };
        drop(entries);
        if want_early {
            self.wake.notify_one();
        }
        v
    }

    /// The reports due at `now`: every bucket's regular one each interval, early ones for
    /// buckets whose slices ran out (at most [`RegionSettings::early_per_interval`] an
    /// interval, none while one is on its way), and a last one for buckets gone idle (which
    /// are dropped).
    pub fn due(&self, now: u64) -> Vec<Due> {
        let s = self.settings;
        let idle = s.interval_ns.saturating_mul(s.idle_intervals);
        let mut out = Vec::new();
        let mut entries = self.entries.lock();
        let mut gone = Vec::new();
        for (&id, e) in entries.iter_mut() {
            e.count_turn(now);
            e.expire(now, &s);
            // An ask unanswered for an interval is lost: what it gave back is lost with it
            // (fewer admissions, never more); its grant, if it was the grant that was lost,
            // the home gives back when told.
            while let Some(sent) = e.asks.front() {
                if now.saturating_sub(sent.at) < s.interval_ns {
                    break;
                }
                let Some(sent) = e.asks.pop_front() else {
                    break;
                };
                e.unanswered.push(sent.seq);
                if e.unanswered.len() > MOST_ASKS {
                    e.unanswered.remove(0);
                }
                // What it gave back and admitted ahead of its grants is told again: lost
                // with the ask, the one would never return to the bucket and the other never
                // be charged (a home that saw the ask does not apply it twice).
                e.told_again(sent);
            }
            let regular = now >= e.next_regular_ns;
            if regular {
                e.early_sent = 0;
            }
            // The window turned at the home: a slice's end is the home's window end less the
            // ask's way there, so an ask sent a little after it arrives in the new window.
            if e.turn_ns > 0 && now >= e.turn_ns.saturating_add(s.interval_ns / TURN_MARGIN) {
                e.turn_ns = 0;
                if now.saturating_sub(e.last_check_ns) < s.interval_ns {
                    e.early_wanted = true;
                }
            }
            let leaving = now.saturating_sub(e.last_check_ns) >= idle && e.asks.is_empty();
            let early = e.early_wanted && e.asks.is_empty() && e.early_sent < s.early_per_interval;
            if !(regular || early || leaving) {
                continue;
            }
            // The demand over the last interval: an early report's few milliseconds are
            // completed with the rate last told, so that one check more or less does not
            // swing the region's share.
            let elapsed = now.saturating_sub(e.since_ns).max(1) as f64;
            let span = s.interval_ns as f64;
            let rate = if elapsed >= span {
                e.asked as f64 / elapsed
            } else {
                (e.asked as f64 + e.rate * (span - elapsed)) / span
            };
            e.rate = rate;
            let demand_milli = (rate * 1e12) as u64;
            e.asked = 0;
            e.since_ns = now;
            // At a regular report of a region that was never short, a window's older slices go
            // back but for what it spends until its next report (the newest is spent until the
            // grant comes; given back whole, a region of small demand went short at a window's
            // end): they were more than it needed. A region short of tokens keeps them, and an
            // early report is the region running low. A token bucket's are kept (a return loses
            // the refill since the grant) and told as `held`, which the home grants less by. A
            // window's are told too: the home's split counts what the region used, not what it
            // holds.
            let windowed = windowed(&e.rule);
            let keep = if leaving {
                0
            } else if regular && !e.short && windowed {
                1
            } else {
                MOST_SLICES
            };
            if regular {
                e.short = false;
            }
            if keep == 1 && e.slices.len() > 1 {
                let newest = e.slices.back().map_or(0, |sl| sl.tokens);
                let room = (rate * s.interval_ns as f64 * super::HEADROOM).ceil() as u64;
                let mut excess = e.tokens().saturating_sub(newest.max(room));
                while excess > 0 && e.slices.len() > 1 {
                    let Some(front) = e.slices.front_mut() else {
                        break;
                    };
                    let n = front.tokens.min(excess);
                    front.tokens -= n;
                    excess -= n;
                    let (mark, empty) = (front.mark, front.tokens == 0);
                    if empty {
                        e.slices.pop_front();
                    }
                    e.give_back(Slice {
                        tokens: n,
                        until_ns: 0,
                        mark,
                    });
                }
            } else {
                while e.slices.len() > keep {
                    if let Some(sl) = e.slices.pop_front() {
                        e.give_back(sl);
                    }
                }
            }
            let seq = {
                // Numbered by the clock (and never twice): a home that remembers the numbers of
                // a region's asks never takes a restarted node's for those it saw.
                let mut q = self.seq.lock();
                *q = (*q).max(now) + 1;
                *q
            };
            let advance = std::mem::take(&mut e.advance_spent);
            let back = std::mem::take(&mut e.back);
            e.asks.push_back(Sent {
                seq,
                at: now,
                advance,
                back: back.clone(),
            });
            while e.asks.len() > MOST_ASKS {
                if let Some(sent) = e.asks.pop_front() {
                    e.told_again(sent);
                }
            }
            if regular {
                e.next_regular_ns = now.saturating_add(s.interval_ns);
            } else if !leaving {
                e.early_sent += 1;
            }
            e.early_wanted = false;
            out.push(Due {
                id,
                seq,
                ask: RegionAsk {
                    key: e.key.clone(),
                    rule: e.rule_ref.clone(),
                    demand_milli: if leaving { 0 } else { demand_milli },
                    back,
                    advance,
                    early: !regular,
                    leaving,
                    held: e.tokens(),
                    unanswered: std::mem::take(&mut e.unanswered),
                    tally: Some(AskTally {
                        asked_total: e.asked_total,
                        fallback_total: e.fallback_total,
                        asked_at_turn: e.asked_at_turn,
                        again: std::mem::take(&mut e.again),
                    }),
                },
            });
            if leaving {
                gone.push(id);
            }
        }
        for id in gone {
            entries.remove(&id);
        }
        out
    }

    /// The home's answer to ask `seq` of bucket `id`, received at `now`. Returns a slice to
    /// give back at once (the bucket was dropped meanwhile, or the ask is unknown: a grant
    /// nobody will spend).
    pub fn answered(
        &self,
        id: u64,
        seq: u64,
        grant: RegionGrant,
        now: u64,
        home_ahead_ns: Option<i64>,
    ) -> Option<SliceBack> {
        let mut entries = self.entries.lock();
        let Some(e) = entries.get_mut(&id) else {
            return unspent(&grant);
        };
        let Some(pos) = e.asks.iter().position(|a| a.seq == seq) else {
            // Given up as lost already: the home gives it back when told (or was told).
            return None;
        };
        let asked_at = e.asks[pos].at;
        e.asks.remove(pos);
        if let RegionGrant::Granted {
            tokens,
            mark,
            valid_ns,
            allowance_ns,
            limit,
            reset_at_ms,
        } = grant
        {
            // From the ask, which left before the home took the slice: it ends here no later
            // than there, whatever the clocks' offsets.
            let mut until = asked_at.saturating_add(valid_ns);
            let ends_with_window =
                windowed(&e.rule) && valid_ns < allowance_ns.min(self.settings.allowance_ns());
            if ends_with_window {
                // The home's window ends between `until` (had the home granted as the ask
                // left) and `latest` (as the grant came). With the home's clock offset
                // measured, where it puts the end; without, the advance waits for `latest`.
                let latest = now.saturating_add(valid_ns);
                let placed = home_ahead_ns.map(|ahead| {
                    let wend = i64::try_from(reset_at_ms.saturating_mul(NANOS_PER_MS))
                        .unwrap_or(i64::MAX)
                        .saturating_sub(ahead);
                    u64::try_from(wend).unwrap_or(0).clamp(until, latest)
                });
                until = placed.unwrap_or(until);
                if let Some(p) = placed {
                    e.placed_turn_ns = e.placed_turn_ns.max(p);
                }
                e.turn_ns = e.turn_ns.max(until);
                e.advance_at = e.advance_at.max(placed.unwrap_or(latest));
            }
            if tokens > 0 && until > now {
                e.slices.push_back(Slice {
                    tokens,
                    until_ns: until,
                    mark,
                });
            } else if tokens > 0 {
                e.back.push(SliceBack { tokens, mark });
            }
            e.allowance_until = e
                .allowance_until
                .max(asked_at.saturating_add(allowance_ns.min(self.settings.allowance_ns())));
            // A grant of the window before, come after its end, does not end the advance.
            if !(ends_with_window && until <= now) {
                e.advance_left = 0;
            }
            e.last_granted = tokens;
            e.limit = limit;
            e.reset_at_ms = reset_at_ms;
            while e.slices.len() > MOST_SLICES {
                if let Some(sl) = e.slices.pop_front() {
                    e.give_back(sl);
                }
            }
        }
        None
    }

    /// Forgets bucket `id` (reset by an operator: nothing to give back).
    pub fn forget(&self, id: u64) {
        self.entries.lock().remove(&id);
    }

    /// Whether bucket `id` decides on its fallback now.
    pub fn in_fallback(&self, id: u64, now: u64) -> bool {
        let a = self.settings.allowance_ns();
        self.entries
            .lock()
            .get(&id)
            .is_some_and(|e| e.in_fallback(now, a))
    }

    /// When bucket `id`'s allowance ends (None: not held, or never granted).
    pub fn allowance_until(&self, id: u64) -> Option<u64> {
        self.entries
            .lock()
            .get(&id)
            .map(|e| e.allowance_until)
            .filter(|&u| u > 0)
    }
}

fn unspent(grant: &RegionGrant) -> Option<SliceBack> {
    match grant {
        RegionGrant::Granted { tokens, mark, .. } if *tokens > 0 => Some(SliceBack {
            tokens: *tokens,
            mark: *mark,
        }),
        _ => None,
    }
}
