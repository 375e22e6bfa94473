//! The home's side: for each shared bucket whose home is this region (and whose owner in it
//! is this node), the real bucket's allocator. Every ask of a region gives back its unspent
//! slices, reports its demand and is granted a new slice, taken from the real bucket at once
//! (so the sum of everything the regions admit never exceeds it); a region that stopped
//! asking gets a reservation of what its fallback may admit.

use super::fair::{InWindow, WindowShare, budget, need, split_with_room, want, window_share};
use super::{RegionSettings, fallback_rule, windowed};
use crate::clock::NANOS_PER_MS;
use crate::lease::valid_ns;
use crate::limiter::fixed_window::window_end;
use crate::limiter::{BucketState, Decision, Rule};
use ringlimit_proto::Algorithm;
use ringlimit_proto::peer::Mark;
use ringlimit_proto::region::{MAX_BACK_PER_ASK, RegionAsk, RegionGrant, SliceBack};
use std::collections::{HashMap, VecDeque};

/// The real bucket, as the home's store holds it: decided and refunded in place.
pub trait RealBucket {
    /// A check of `cost` at `now` (0: a look that changes nothing).
    fn decide(&mut self, now: u64, cost: u64) -> Decision;
    /// Gives back `cost` admitted under `mark`.
    fn refund(&mut self, cost: u64, mark: Mark, now: u64);
    /// Takes `cost` whatever the bucket admits (what it cannot is owed).
    fn charge(&mut self, now: u64, cost: u64);
    /// What the bucket owes at `now`.
    fn owed(&mut self, now: u64) -> u64;
}

/// A [`RealBucket`] over a state and its rule.
#[derive(Debug)]
pub struct Owned<'a> {
    pub state: &'a mut BucketState,
    pub rule: &'a Rule,
}

impl RealBucket for Owned<'_> {
    fn decide(&mut self, now: u64, cost: u64) -> Decision {
        self.state.decide(self.rule, now, cost)
    }
    fn refund(&mut self, cost: u64, mark: Mark, now: u64) {
        self.state.refund(self.rule, cost, mark, now);
    }
    fn charge(&mut self, now: u64, cost: u64) {
        self.state.charge(self.rule, now, cost);
    }
    fn owed(&mut self, now: u64) -> u64 {
        self.state.owed(self.rule, now)
    }
}

/// A region that stopped renewing: reserved for while it may be deciding on its fallback.
#[derive(Debug, Clone, Copy, Default)]
struct Away {
    /// The window (its `reset_ns`) last reserved for.
    window: u64,
    /// What was reserved for it in that window.
    reserved: u64,
    /// A token bucket's refill reserved up to then, and the fraction carried.
    refill_at: u64,
    carry: f64,
    /// The reservation's mark (a window's, to give back what the region did not admit).
    mark: Mark,
}

/// A reservation for a region that came back, held until its count of what it admitted on its
/// fallback (`AskTally::fallback_total`) comes with an ask made on its slices: what it admitted
/// is granted to it, the rest goes back to the bucket.
#[derive(Debug, Clone, Copy)]
struct Pending {
    window: u64,
    reserved: u64,
    /// Counted as granted to it already (what its count said at its return).
    counted: u64,
    mark: Mark,
    /// Its count at its last ask before it went away.
    fallback_before: u64,
}

/// One region's place at one bucket.
#[derive(Debug, Clone, Default)]
struct Seat {
    demand_per_s: f64,
    /// When its allowance was last renewed (home clock).
    granted_at: Option<u64>,
    early: bool,
    /// Its last slice: size, window (`reset_ns`) and end, for the pool.
    last_tokens: u64,
    last_reset: u64,
    last_until: u64,
    /// What it was granted in the window `window` closes.
    window: u64,
    window_granted: u64,
    /// A fixed window's checks asked of it in the window `asked_window` closes (its told
    /// demand over the time between its asks), and when it last asked.
    asked_window: u64,
    window_asked: f64,
    /// The time `window_asked` covers.
    window_asked_ns: u64,
    asked_at: Option<u64>,
    /// The count of checks its last ask told (`AskTally::asked_total`).
    asked_total: Option<u64>,
    /// The numbers of its asks applied here lately (a lost ask's returns told again are
    /// applied only if it never came).
    seen: VecDeque<u64>,
    /// Its count of checks admitted on its fallback, told at its last ask.
    fallback_total: Option<u64>,
    pending: Option<Pending>,
    carry: f64,
    away: Option<Away>,
    /// Said it stops holding the bucket: nothing to reserve.
    left: bool,
    /// What it held of its slices, told at its last ask.
    held: u64,
    /// Its last grants (ask's seq, tokens, mark): given back if it says the grant never came.
    recent: VecDeque<(u64, u64, Mark)>,
}

impl Seat {
    /// Counts `tokens` as granted to the region in the window `wend` closes (its count starts
    /// again at a new window).
    fn granted_in(&mut self, wend: u64, tokens: u64) {
        if self.window != wend {
            self.window = wend;
            self.window_granted = 0;
        }
        self.window_granted = self.window_granted.saturating_add(tokens);
    }
}

#[derive(Debug)]
struct Table {
    rule: Rule,
    seats: Vec<Seat>,
    touched_ns: u64,
}

/// What a region holds of the buckets allocated here (for `/v1/cluster`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SeatTotals {
    /// Tokens of its live slices (as granted).
    pub allowance: u64,
    /// Its reported demand, per second.
    pub demand_per_s: f64,
    /// Buckets it is reserved for (its allowance expired without renewal).
    pub away: u64,
}

/// The home's allocation tables, one per shared bucket homed here. Bounded: at most
/// `max_buckets` tables (an ask beyond is refused with `region_limit`); a table nobody asked
/// of for ten allowances is forgotten.
#[derive(Debug)]
pub struct Allocator {
    settings: RegionSettings,
    tables: HashMap<u64, Table>,
    /// The region links the node sees down: reserved for at every bucket, granted or not.
    down: Vec<bool>,
    max_buckets: usize,
    /// Tokens moved to regions (granted), per region, since start.
    moved: Vec<u64>,
    /// How long a region's ask takes to come here (half the link's round trip), per region.
    lag_ns: Vec<u64>,
}

impl Allocator {
    pub fn new(settings: RegionSettings, max_buckets: usize) -> Self {
        let n = settings.regions;
        Self {
            settings,
            tables: HashMap::new(),
            down: vec![false; n],
            max_buckets,
            moved: vec![0; n],
            lag_ns: vec![0; n],
        }
    }

    /// A region's asks take `ns` to come here: a window's split counts its checks over that
    /// time too (they are in neither what it told nor what is left of the window).
    pub fn set_lag(&mut self, region: usize, ns: u64) {
        if let Some(l) = self.lag_ns.get_mut(region) {
            *l = ns;
        }
    }

    pub fn settings(&self) -> &RegionSettings {
        &self.settings
    }

    /// Buckets allocated here.
    pub fn buckets(&self) -> usize {
        self.tables.len()
    }

    /// Ids of the buckets allocated here (to [`Allocator::tick`] each).
    pub fn ids(&self) -> Vec<u64> {
        self.tables.keys().copied().collect()
    }

    /// Tokens granted to `region` since start.
    pub fn moved(&self, region: usize) -> u64 {
        self.moved.get(region).copied().unwrap_or(0)
    }

    /// The link to `region` is down (or up again): while down, every bucket reserves for it.
    pub fn set_down(&mut self, region: usize, down: bool) {
        if let Some(d) = self.down.get_mut(region) {
            *d = down;
        }
    }

    /// Per region: what it holds of the buckets allocated here, its demand.
    pub fn totals(&self, now: u64) -> Vec<SeatTotals> {
        let mut out = vec![SeatTotals::default(); self.settings.regions];
        for t in self.tables.values() {
            for (i, s) in t.seats.iter().enumerate() {
                if s.last_until > now {
                    out[i].allowance += s.last_tokens;
                }
                if s.away.is_some() {
                    out[i].away += 1;
                } else if s.granted_at.is_some() && !s.left {
                    out[i].demand_per_s += s.demand_per_s;
                }
            }
        }
        out
    }

    /// Region `region`'s ask `seq` of bucket `id` under `rule` at `now`, against the real
    /// bucket: its returns, lost grants and advance are settled, reservations for regions that
    /// stopped renewing taken, then its slice granted.
    #[allow(clippy::too_many_arguments)]
    pub fn ask(
        &mut self,
        id: u64,
        rule: &Rule,
        region: usize,
        seq: u64,
        ask: &RegionAsk,
        now: u64,
        real: &mut impl RealBucket,
    ) -> RegionGrant {
        let n = self.settings.regions;
        if region >= n {
            return error("unknown_region", "the asking region is not configured here");
        }
        if !self.tables.contains_key(&id) {
            self.forget_idle(now);
            if self.tables.len() >= self.max_buckets {
                return error("region_limit", "too many shared buckets allocated here");
            }
        }
        let table = self.tables.entry(id).or_insert_with(|| Table {
            rule: *rule,
            seats: vec![Seat::default(); n],
            touched_ns: now,
        });
        table.rule = *rule;
        table.touched_ns = now;
        // What comes back of this window's slices no longer counts as granted in it (the
        // reservation for a region that goes away is its share less what it was granted).
        let wend = window_end(rule, now);
        let this_window = |m: &Mark| m.reset_ns == wend || m.reset_ns == wend + rule.period_ns;
        let Applied {
            back,
            advance,
            checks,
            after_turn,
        } = applied(&mut table.seats[region], seq, ask);
        let mut returned = 0u64;
        for b in &back {
            // A return larger than a whole bucket is not one this home granted.
            let tokens = b.tokens.min(rule.capacity());
            real.refund(tokens, b.mark, now);
            if this_window(&b.mark) {
                returned = returned.saturating_add(tokens);
            }
        }
        let advance = advance.min(rule.capacity());
        if advance > 0 {
            real.charge(now, advance);
        }
        let new_window = table.seats[region].window != wend;
        {
            let seat = &mut table.seats[region];
            // An advance is granted to the region in the window it was charged in.
            if advance > 0 && windowed(rule) {
                seat.granted_in(wend, advance);
            }
            // A grant lost while the region was reserved for is part of that reservation
            // (its fallback was charged with no slice of it): not given back.
            let reserved = seat.away.is_some();
            for lost in ask.unanswered.iter().filter(|_| !reserved) {
                if let Some(pos) = seat.recent.iter().position(|r| r.0 == *lost)
                    && let Some((_, tokens, mark)) = seat.recent.remove(pos)
                {
                    real.refund(tokens, mark, now);
                    if this_window(&mark) {
                        returned = returned.saturating_add(tokens);
                    }
                }
            }
            let fallback_total = ask.tally.as_ref().map(|t| t.fallback_total);
            // A reservation for a region that came back, once it is surely deciding on its
            // slices again (its last grant came): what it admitted on its fallback since its
            // count at the return is granted to it, the rest goes back to the bucket.
            if let Some(p) = seat.pending.take_if(|_| ask.unanswered.is_empty())
                && p.window == wend
                && let Some(after) = fallback_total
            {
                let used = after.saturating_sub(p.fallback_before).min(p.reserved);
                seat.granted_in(wend, used.saturating_sub(p.counted));
                let unused = p.reserved - used.max(p.counted);
                if unused > 0 {
                    real.refund(unused, p.mark, now);
                }
            }
            if seat.window == wend {
                seat.window_granted = seat.window_granted.saturating_sub(returned);
            }
            // What was reserved for it while away it may have admitted on its fallback: what
            // its count says it did counts as granted to it in the window (or the window's
            // split would hand it out again, and the regions that stayed would find their parts
            // spent), the rest stays taken until its count is final (it may still be deciding
            // on its fallback until this ask's grant comes). Without a count, all of it.
            if let Some(away) = seat.away.take()
                && away.window == wend
                && away.reserved > 0
            {
                match (seat.fallback_total, fallback_total) {
                    (Some(before), Some(now_total)) => {
                        let counted = now_total.saturating_sub(before).min(away.reserved);
                        seat.granted_in(wend, counted);
                        seat.pending = Some(Pending {
                            window: wend,
                            reserved: away.reserved,
                            counted,
                            mark: away.mark,
                            fallback_before: before,
                        });
                    }
                    _ => seat.granted_in(wend, away.reserved),
                }
            }
            if fallback_total.is_some() {
                seat.fallback_total = fallback_total;
            }
            seat.left = ask.leaving;
        }
        reserve(&self.settings, &self.down, table, now, real, Some(region));
        let settings = &self.settings;
        let seat_demand = ask.demand_milli as f64 / 1000.0;
        if ask.leaving {
            let seat = &mut table.seats[region];
            *seat = Seat {
                left: true,
                ..Seat::default()
            };
            let peek = real.decide(now, 0);
            return granted(settings, rule, 0, peek, now);
        }
        let peek = real.decide(now, 0);
        let mut pool = peek.remaining;
        let mut wants = vec![0.0; n];
        let mut needs = vec![0.0; n];
        // Each other region's slice of this interval, as the pool counts it.
        let mut in_pool = vec![0u64; n];
        let windowed = windowed(rule);
        // Windows are named by their end (a peek's `reset_ns` of a sliding window depends on
        // its counts).
        let rest = wend.saturating_sub(now);
        // A window's slice ends with it: in its last interval a region wants only what it can
        // spend before then, and what it could not stays for the regions that ask later.
        let horizon = if windowed {
            rest.min(settings.interval_ns)
        } else {
            settings.interval_ns
        };
        // A region keeping a token bucket's slices wants what it holds less: what it holds was
        // taken for it already. A window's holder gives back all but its newest slice, which it
        // spends until the grant comes: its holdings count in the window's split instead (what
        // it used of its grants).
        let held_off = |held: u64| if windowed { 0.0 } else { held as f64 };
        for (i, s) in table.seats.iter().enumerate() {
            if i == region {
                let held = held_off(ask.held.min(rule.capacity()));
                wants[i] = (want(seat_demand, horizon) - held).max(0.0);
                needs[i] = (need(seat_demand, horizon) - held).max(0.0);
                continue;
            }
            // A window's pool counts the other regions' slices of this interval, so that
            // every region's share is of the same figure whichever asks first. A token
            // bucket's is what it holds: its budget is its refill, taken as it comes.
            let recent = s
                .granted_at
                .is_some_and(|at| now.saturating_sub(at) < settings.interval_ns);
            if windowed && recent && s.last_reset == wend && s.away.is_none() && !s.left {
                in_pool[i] = s.last_tokens;
                pool = pool.saturating_add(s.last_tokens);
            }
            if s.away.is_none() && !s.left && s.granted_at.is_some() {
                let held = held_off(s.held);
                wants[i] = (want(s.demand_per_s, horizon) - held).max(0.0);
                needs[i] = (need(s.demand_per_s, horizon) - held).max(0.0);
            }
        }
        // A fixed window is split whole by projected demand; a sliding window's room at any
        // instant counts the window before, so it keeps the split of each interval's budget.
        let (region_share, owed) = if rule.algorithm == Algorithm::FixedWindow {
            let asked = WindowAsk {
                demand_per_s: seat_demand,
                checks,
                after_turn,
                held: ask.held.min(rule.capacity()),
                needs: &needs,
                wants: &wants,
                in_pool: &in_pool,
                lag_ns: &self.lag_ns,
            };
            let w = fixed_window_share(table, region, &asked, pool, wend, now, settings);
            (w.share, Some(w.owed))
        } else {
            let b = budget(rule, pool, rest, settings.interval_ns);
            (split_with_room(b, &needs, &wants)[region], None)
        };
        let seat = &mut table.seats[region];
        // A regular report after a regular one is granted a whole interval's share; an early
        // one (and the next after it) the share of the time since the last grant, so that
        // asking early moves a region's slices earlier, never makes them larger. A window's
        // first grant is whole: the region's slices of the window before ended with it.
        let first_of_window = windowed && new_window;
        // In a fixed window's last two intervals a region is granted what it is still owed
        // of its part, whole: there is no later grant to move it to.
        let last_of_window = owed.is_some() && rest <= 2 * settings.interval_ns;
        let factor = match seat.granted_at {
            Some(at) if (ask.early || seat.early) && !first_of_window && !last_of_window => {
                (now.saturating_sub(at) as f64 / settings.interval_ns.max(1) as f64).min(1.0)
            }
            _ => 1.0,
        };
        // What the bucket could not give now (it held less than the share) is owed at the
        // next ask, up to a share: a token bucket refills between asks.
        let share = region_share * factor;
        let exact = share + seat.carry;
        // Regions ask a token bucket at different times, so at any one ask it holds only
        // part of an interval's refill: a slice may borrow up to one interval's refill ahead
        // (the bucket owes it, and repays it by time), so that a region asking after another
        // is not short of its share. Over any span the regions then admit at most the
        // bucket's burst and refill plus one interval's refill.
        let ahead = if windowed {
            0
        } else {
            let refill = u128::from(rule.limit) * u128::from(settings.interval_ns)
                / u128::from(rule.period_ns.max(1));
            u64::try_from(refill)
                .unwrap_or(u64::MAX)
                .saturating_sub(real.owed(now))
        };
        let room = peek.remaining.saturating_add(ahead);
        let mut tokens = (exact.floor().max(0.0) as u64).min(room);
        if let Some(owed) = owed {
            tokens = tokens.min(owed.round().max(0.0) as u64);
        }
        seat.carry = (exact - tokens as f64).clamp(0.0, share.max(0.999));
        let mut d = peek;
        if tokens > peek.remaining {
            real.charge(now, tokens);
            d = real.decide(now, 0);
        } else if tokens > 0 {
            d = real.decide(now, tokens);
            if !d.allowed {
                tokens = 0;
                d = peek;
            }
        }
        seat.demand_per_s = seat_demand;
        seat.held = ask.held.min(rule.capacity());
        seat.granted_at = Some(now);
        seat.early = ask.early;
        let g = granted(settings, rule, tokens, d, now);
        if let RegionGrant::Granted { valid_ns, .. } = &g {
            seat.last_tokens = tokens;
            seat.last_reset = wend;
            seat.last_until = now.saturating_add(*valid_ns);
        }
        if tokens > 0 {
            seat.recent.push_back((seq, tokens, mark_of(d, now)));
            while seat.recent.len() > super::holder::MOST_ASKS {
                seat.recent.pop_front();
            }
        }
        seat.granted_in(wend, tokens);
        self.moved[region] = self.moved[region].saturating_add(tokens);
        g
    }

    /// Takes the reservations due at bucket `id` at `now` (regions whose allowance expired
    /// without renewal, a new window or a token bucket's refill for those away). Called every
    /// interval for every bucket, and at every ask.
    pub fn tick(&mut self, id: u64, now: u64, real: &mut impl RealBucket) {
        if let Some(t) = self.tables.get_mut(&id) {
            reserve(&self.settings, &self.down, t, now, real, None);
        }
    }

    /// The rule of bucket `id` as last asked (for a tick, which has no ask).
    pub fn rule(&self, id: u64) -> Option<Rule> {
        self.tables.get(&id).map(|t| t.rule)
    }

    /// Forgets bucket `id` (reset by an operator).
    pub fn forget(&mut self, id: u64) {
        self.tables.remove(&id);
    }

    fn forget_idle(&mut self, now: u64) {
        let idle = self.settings.allowance_ns().saturating_mul(10);
        self.tables
            .retain(|_, t| now.saturating_sub(t.touched_ns) < idle);
    }
}

/// Most ask numbers a seat remembers as applied.
const SEEN: usize = 32;

/// What an ask brings to apply: see [`applied`].
struct Applied {
    back: Vec<SliceBack>,
    advance: u64,
    checks: Option<u64>,
    /// Of those, the ones after the home's window last turned (when the region placed the
    /// turn between its asks).
    after_turn: Option<u64>,
}

/// What ask `seq` of a region gives back and admitted ahead of its grants, to apply: its own
/// (none if it was applied already: it came twice) and those of its lost asks told again that
/// never came here. An ask told again whose number this seat may have forgotten is taken to
/// have come: its advance is charged (fewer admissions, never more), its returns are not.
/// And the region's checks since its ask before, by its counts: a count that went back is a
/// region that holds the bucket anew (restarted, or back from idle), whose ask numbers are
/// not those remembered.
fn applied(seat: &mut Seat, seq: u64, ask: &RegionAsk) -> Applied {
    let total = ask.tally.as_ref().map(|t| t.asked_total);
    let checks = match (seat.asked_total, total) {
        (Some(before), Some(now)) if now >= before => Some(now - before),
        (Some(_), Some(_)) => {
            seat.seen.clear();
            None
        }
        _ => None,
    };
    let after_turn = match (seat.asked_total, ask.tally.as_ref()) {
        (Some(before), Some(t))
            if t.asked_at_turn > 0 && (before..=t.asked_total).contains(&t.asked_at_turn) =>
        {
            Some(t.asked_total - t.asked_at_turn)
        }
        _ => None,
    };
    seat.asked_total = total;
    let mut back = Vec::new();
    let mut advance = 0u64;
    let oldest = if seat.seen.len() >= SEEN {
        seat.seen.iter().min().copied()
    } else {
        None
    };
    let mark = |seat: &mut Seat, seq: u64| {
        seat.seen.push_back(seq);
        while seat.seen.len() > SEEN {
            seat.seen.pop_front();
        }
    };
    let again = ask.tally.as_ref().map_or(&[][..], |t| &t.again[..]);
    for a in again.iter().take(MAX_BACK_PER_ASK) {
        if seat.seen.contains(&a.seq) {
            continue;
        }
        if oldest.is_none_or(|o| a.seq >= o) {
            back.extend(a.back.iter().take(MAX_BACK_PER_ASK).copied());
        }
        advance = advance.saturating_add(a.advance);
        mark(seat, a.seq);
    }
    if !seat.seen.contains(&seq) {
        back.extend(ask.back.iter().take(MAX_BACK_PER_ASK).copied());
        advance = advance.saturating_add(ask.advance);
        mark(seat, seq);
    }
    Applied {
        back,
        advance,
        checks,
        after_turn,
    }
}

/// What an ask tells of the regions, for [`fixed_window_share`]: the asking region's demand
/// per second, every region's need and want this interval, and each other region's slice of
/// this interval that the pool counts.
struct WindowAsk<'a> {
    demand_per_s: f64,
    /// The asking region's checks since its ask before, by its counts (none from a link of
    /// an older version, or at its first ask here).
    checks: Option<u64>,
    /// Of those, the ones after the window turned, when the region placed the turn.
    after_turn: Option<u64>,
    /// What the asking region still holds of its slices.
    held: u64,
    needs: &'a [f64],
    wants: &'a [f64],
    in_pool: &'a [u64],
    /// Each region's asks' way here ([`Allocator::set_lag`]).
    lag_ns: &'a [u64],
}

/// Region `region`'s slice of fixed-window bucket `table` at its ask ([`window_share`]),
/// after counting what it asked since its last ask. A region takes part when it has a need or
/// a want this interval; what the pool counts of its slice of this interval is not counted
/// again as granted in the window.
fn fixed_window_share(
    table: &mut Table,
    region: usize,
    asked: &WindowAsk<'_>,
    pool: u64,
    wend: u64,
    now: u64,
    settings: &RegionSettings,
) -> WindowShare {
    let period_ns = table.rule.period_ns;
    {
        let seat = &mut table.seats[region];
        let first = seat.asked_window != wend;
        if first {
            seat.asked_window = wend;
            seat.window_asked = 0.0;
            seat.window_asked_ns = 0;
        }
        // Only the part of the time since its last ask that lies in this window counts: the
        // window's first ask would otherwise count the end of the window before.
        let begun = now.saturating_sub(wend.saturating_sub(period_ns));
        let since = seat
            .asked_at
            .map_or(settings.interval_ns, |at| {
                now.saturating_sub(at).min(settings.interval_ns)
            })
            .min(begun);
        // The checks since the ask before are the difference of the counts told (exact,
        // whatever the time between the reports, lost ones included), the part of them in this
        // window by time; a region new here (or restarted: its count went back) by its rate.
        let (counted, over) = match (asked.checks, seat.asked_at) {
            (Some(n), Some(at)) => {
                let span = now.saturating_sub(at);
                let n = n as f64;
                if let Some(after) = asked.after_turn.filter(|_| first && span > begun) {
                    (after as f64, begun)
                } else if span > begun {
                    (n * begun as f64 / span as f64, begun)
                } else {
                    (n, span)
                }
            }
            _ => (asked.demand_per_s.max(0.0) * since as f64 / 1e9, since),
        };
        seat.window_asked += counted;
        seat.window_asked_ns = seat.window_asked_ns.saturating_add(over);
        seat.asked_at = Some(now);
    }
    let seats: Vec<InWindow> = table
        .seats
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let told = if j == region {
                asked.demand_per_s
            } else {
                s.demand_per_s
            };
            let demand = steady(told, s, wend);
            let granted = if s.window == wend {
                s.window_granted.saturating_sub(asked.in_pool[j]) as f64
            } else {
                0.0
            };
            // Slices end with their window: what a region held at an ask of an earlier
            // window is not of this one.
            let held = match (s.window == wend, j == region) {
                (true, true) => asked.held,
                (true, false) => s.held,
                (false, _) => 0,
            };
            InWindow {
                takes_part: asked.needs[j] > 0.0 || asked.wants[j] > 0.0,
                granted,
                held: (held as f64).min(granted),
                // A region's checks since it sent its last ask are not told yet: its demand
                // over that time counts too (the projection is from now to the window's end).
                asked: if s.asked_window == wend {
                    let since = if j == region {
                        0
                    } else {
                        s.asked_at
                            .map_or(0, |at| now.saturating_sub(at).min(2 * settings.interval_ns))
                    };
                    let lag = asked
                        .lag_ns
                        .get(j)
                        .map_or(0, |&l| l.min(settings.interval_ns));
                    let untold = since.saturating_add(lag);
                    s.window_asked + demand * untold as f64 / 1e9
                } else {
                    0.0
                },
                demand_per_s: demand,
            }
        })
        .collect();
    window_share(
        &seats,
        region,
        pool as f64,
        wend.saturating_sub(now),
        settings.interval_ns,
        asked.wants[region],
    )
}

/// The demand per second to project a region's part of a fixed window by: its rate over the
/// window so far when its last told rate is near it (a report counts whole checks over one
/// interval: 3 or 4 a second for a region asking 3.3, which the window's end makes a check
/// short or over), its last told rate when its demand moved.
fn steady(told: f64, seat: &Seat, wend: u64) -> f64 {
    if seat.asked_window != wend || seat.window_asked_ns < 2_000 * NANOS_PER_MS {
        return told;
    }
    let mean = seat.window_asked * 1e9 / seat.window_asked_ns as f64;
    if told >= mean * 0.7 && told <= mean / 0.7 {
        mean
    } else {
        told
    }
}

fn error(code: &str, message: &str) -> RegionGrant {
    RegionGrant::Error {
        code: code.to_owned(),
        message: message.to_owned(),
    }
}

fn mark_of(d: Decision, now: u64) -> Mark {
    Mark {
        reset_ns: d.reset_ns,
        at_ns: now,
    }
}

fn granted(
    settings: &RegionSettings,
    rule: &Rule,
    tokens: u64,
    d: Decision,
    now: u64,
) -> RegionGrant {
    let mark = mark_of(d, now);
    let allowance_ns = settings.allowance_ns();
    let valid = match rule.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            valid_ns(rule.algorithm, rule.period_ns, mark, now).min(allowance_ns)
        }
        _ => allowance_ns,
    };
    RegionGrant::Granted {
        tokens,
        mark,
        valid_ns: valid,
        allowance_ns,
        limit: rule.limit,
        reset_at_ms: d.reset_ns / NANOS_PER_MS,
    }
}

/// Takes what `n` would have admitted from `real`, at most what it has left; what it took,
/// and under which mark.
fn take(real: &mut impl RealBucket, now: u64, n: u64) -> (u64, Mark) {
    let peek = real.decide(now, 0);
    let n = n.min(peek.remaining);
    let d = if n > 0 { real.decide(now, n) } else { peek };
    (n, mark_of(d, now))
}

/// The reservations of `table` due at `now`. A region is taken to be away (maybe deciding on
/// its fallback) once half an interval before its allowance, counted from the grant, runs
/// out: it counted it from its ask, earlier, so it never falls back before the home reserves
/// for it (but for a grant that came back later than half an interval), and a reservation
/// for a region still deciding on its slices only denies more.
fn reserve(
    settings: &RegionSettings,
    down: &[bool],
    table: &mut Table,
    now: u64,
    real: &mut impl RealBucket,
    asking: Option<usize>,
) {
    let rule = table.rule;
    let fb = fallback_rule(&rule, settings.regions);
    let expiry = settings
        .allowance_ns()
        .saturating_sub(settings.interval_ns / 2);
    for (i, seat) in table.seats.iter_mut().enumerate() {
        if Some(i) == asking || seat.left {
            continue;
        }
        let expired = seat
            .granted_at
            .is_some_and(|at| now >= at.saturating_add(expiry));
        // The link's state is this home's way to the region; a region that renews its
        // allowance reaches us whatever it says (reserved for at every tick while that link
        // was down, a renewing region found the reservation counted as granted to it at its
        // next ask, again and again: it was starved while the bucket's rest went unspent).
        let is_down = down.get(i).copied().unwrap_or(false) && seat.granted_at.is_none();
        if seat.away.is_none() && !(expired || is_down) {
            continue;
        }
        let wend = window_end(&rule, now);
        match seat.away.as_mut() {
            None => {
                // Its fallback bucket is charged with what it admitted on slices, so in this
                // window it may admit its share less what it was granted in it.
                let want = match rule.algorithm {
                    Algorithm::TokenBucket | Algorithm::LeakyBucket => fb.burst,
                    _ if seat.window == wend => fb.limit.saturating_sub(seat.window_granted),
                    _ => fb.limit,
                };
                let (reserved, mark) = take(real, now, want);
                seat.away = Some(Away {
                    window: wend,
                    reserved,
                    refill_at: now,
                    carry: 0.0,
                    mark,
                });
                seat.last_tokens = 0;
            }
            Some(away) => match rule.algorithm {
                Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                    let x = now.saturating_sub(away.refill_at) as f64 * fb.limit as f64
                        / fb.period_ns.max(1) as f64
                        + away.carry;
                    let n = x.floor().max(0.0) as u64;
                    away.carry = (x - n as f64).clamp(0.0, 0.999);
                    away.refill_at = now;
                    take(real, now, n);
                }
                _ if away.window != wend => {
                    (away.reserved, away.mark) = take(real, now, fb.limit);
                    away.window = wend;
                }
                _ => {}
            },
        }
    }
}
