//! Leases: slices of a bucket that its owner takes from the bucket at once and hands to another
//! member (or an SDK), which then decides that bucket's checks itself until the slice is spent
//! or runs out of time (hot keys). Taken before they are spent, slices never admit more than
//! the bucket would; what they cost is false denies while tokens sit unused at a holder, so
//! slices are sized from each holder's demand, shrink as the bucket empties, and what is left
//! of them goes back to the owner.
//!
//! This module is both sides' arithmetic, shared by nodes and the SDK: the holder's table
//! ([`Held`]), the owner's sizing ([`slice`], [`grant`], [`valid_ns`]) and record
//! ([`Grants`]), and the holder's task that asks and gives back ([`asking`]); who owns what
//! comes from the node's view or the SDK's topology ([`asking::Owners`]).
//!
//! # What a slice is, per algorithm
//! - **Fixed and sliding window**: a count taken in the window current at the grant (counted
//!   there at once), spent only while that window lasts (the slice ends with it), and what is
//!   left given back under the grant's mark while it does (exact: a count). After the window
//!   there is nothing to give back: the window is over for the owner too.
//! - **Token bucket** (GCRA): tokens taken at the grant and spent within [`TOKEN_SLICE_NS`].
//!   The bucket never gives more tokens than its rate and burst allow, so over any run the
//!   admissions of the owner and all holders together stay within `burst + rate · time`. What
//!   a holder admits later than the grant shifts those tokens in time, so a short span may see a
//!   holder's slice spent beside the bucket's own refill: at most the tokens out on lease
//!   beyond `burst + rate · length`, and slices are a fraction of what is left. Unused tokens go
//!   back as a refund under the grant's mark, less the refill since the grant (the GCRA state
//!   cannot tell refill others used from refill in vain: see `BucketState::refund`).
//! - **Leaky bucket and sliding log** are not leased: the meter promises spacing and the log
//!   exact times, which a slice spent elsewhere would not keep ([`leasable`]).

pub mod asking;

use crate::answer::answer;
use crate::clock::NANOS_PER_MS;
use crate::limiter::{Decision, Rule};
use parking_lot::Mutex;
use ringlimit_proto::peer::{LeaseAsk, LeaseGrant, Mark, PeerRefund};
use ringlimit_proto::{Algorithm, CheckAnswer, RuleRef};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Longest a token bucket's slice may be spent after its grant.
pub const TOKEN_SLICE_NS: u64 = 500 * NANOS_PER_MS;
/// Shards of the holder's table (its lock is taken once per check of a leased bucket).
const SHARDS: usize = 16;
/// Most slices of one bucket a holder keeps (the current one and renewals that came early).
const MOST_GRANTS: usize = 3;

/// Whether buckets of `algorithm` may be leased (see the module's doc).
pub fn leasable(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::TokenBucket | Algorithm::FixedWindow | Algorithm::SlidingWindow
    )
}

/// The owner's size for a slice: what the holder wants, at most an equal part of what is left
/// among the `holders` (the asker included) and the owner itself, so that slices shrink as the
/// bucket empties; at least one token while any is left.
pub fn slice(want: u64, remaining: u64, holders: u64) -> u64 {
    if remaining == 0 {
        return 0;
    }
    let part = remaining / holders.saturating_add(1);
    want.min(part.max(1)).min(remaining)
}

/// The owner's answer to an ask for `want` tokens by one of `holders` (the asker included),
/// on a bucket of `rule` that answers `peek` (a check of cost 0) at `now`; `take(n)` takes
/// `n` tokens from it at `now` (a check of cost `n`). A bucket that would deny a check of
/// cost 1 is refused with that denial (the holder denies too until it ends).
pub fn grant(
    rule: &Rule,
    want: u64,
    holders: u64,
    now: u64,
    peek: Decision,
    take: impl FnOnce(u64) -> Decision,
) -> LeaseGrant {
    let n = slice(want, peek.remaining, holders);
    if n == 0 || !peek.allowed {
        return LeaseGrant::Refused {
            answer: answer(&peek, rule),
        };
    }
    let d = take(n);
    if !d.allowed {
        // Taken meanwhile by a check at the owner: what the bucket says now.
        return LeaseGrant::Refused {
            answer: answer(&d, rule),
        };
    }
    let mark = Mark {
        reset_ns: d.reset_ns,
        at_ns: now,
    };
    LeaseGrant::Granted {
        tokens: n,
        mark,
        valid_ns: valid_ns(rule.algorithm, rule.period_ns, mark, now),
        answer: answer(&d, rule),
    }
}

/// How long a slice granted at `now` may be spent, given the mark of its take under
/// `algorithm` with period `period_ns`: a window's slice ends with the window it was counted
/// in; a token bucket's after [`TOKEN_SLICE_NS`].
pub fn valid_ns(algorithm: Algorithm, period_ns: u64, mark: Mark, now: u64) -> u64 {
    match algorithm {
        Algorithm::FixedWindow => mark.reset_ns.saturating_sub(now),
        // The take's `reset_ns` is one period past the end of the window it counted in.
        Algorithm::SlidingWindow => mark.reset_ns.saturating_sub(period_ns).saturating_sub(now),
        _ => TOKEN_SLICE_NS,
    }
}

/// A holder's settings.
#[derive(Debug, Clone, Copy)]
pub struct LeaseSettings {
    /// A slice asked for is this much of the holder's demand.
    pub span_ns: u64,
    /// Most buckets leased here at once.
    pub max_leases: usize,
    /// Demand assumed before any was measured (a second): the hot keys' threshold.
    pub initial_demand_per_s: u64,
    /// After an owner keeps a bucket to itself (or the ask failed), how long before asking
    /// again.
    pub backoff_ns: u64,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            span_ns: 100 * NANOS_PER_MS,
            max_leases: 1024,
            initial_demand_per_s: 1_000,
            backoff_ns: 1_000 * NANOS_PER_MS,
        }
    }
}

/// Why a holder stopped leasing a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// It cooled (demoted from the hot keys).
    Cooled,
    /// The ring changed: its owner may have.
    Ring,
    /// Revoked: the bucket was reset (an operator's reset reaches every member).
    Revoked,
}

/// What a check found among the leases held here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Take {
    /// No slice covers it: decide at the owner.
    Forward,
    /// Admitted on a slice: the answer, and what it took (to give back, all-or-nothing).
    Leased(CheckAnswer, SliceTaken),
    /// Denied here: the owner said its bucket denies until then.
    Denied(CheckAnswer),
}

/// What an admission took from a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceTaken {
    pub id: u64,
    pub cost: u64,
    grant: u64,
}

/// An ask to send to a bucket's owner, asked at `at_ns` (the slice's time counts from then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub id: u64,
    pub ask: LeaseAsk,
    pub at_ns: u64,
}

/// Tokens of a slice going back to bucket `id`'s owner, as a refund under the grant's mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    pub id: u64,
    pub refund: PeerRefund,
}

#[derive(Debug)]
struct Grant {
    seq: u64,
    tokens: u64,
    mark: Mark,
    until_ns: u64,
    limit: u64,
    reset_at_ms: u64,
}

#[derive(Debug, Default)]
struct Entry {
    /// What an ask names; learnt from the first check of the bucket after it became hot.
    key: Option<(String, RuleRef)>,
    grants: VecDeque<Grant>,
    /// The owner's denial, and until when it holds.
    denied: Option<(CheckAnswer, u64)>,
    /// No ask before then (the owner kept the bucket, or an ask failed).
    quiet_until_ns: u64,
    /// An ask is due or on its way.
    asking: bool,
    /// The last slice's size: asks come when less than half of it is left.
    last_granted: u64,
    /// Spent since `since_ns`: the demand an ask reports.
    spent: u64,
    since_ns: u64,
}

impl Entry {
    fn tokens(&self) -> u64 {
        self.grants.iter().map(|g| g.tokens).sum()
    }

    /// Moves slices whose time is up into `returns` (their unused tokens).
    fn expire(&mut self, id: u64, now: u64, returns: &mut Vec<Return>) {
        while self.grants.front().is_some_and(|g| g.until_ns <= now) {
            if let Some(g) = self.grants.pop_front() {
                self.give_up(id, g, returns);
            }
        }
    }

    fn give_up(&self, id: u64, g: Grant, returns: &mut Vec<Return>) {
        if let (true, Some((key, rule))) = (g.tokens > 0, &self.key) {
            returns.push(Return {
                id,
                refund: PeerRefund {
                    key: key.clone(),
                    rule: rule.clone(),
                    cost: g.tokens,
                    mark: g.mark,
                },
            });
        }
    }
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<u64, Entry>,
    /// Buckets whose ask is due.
    due: Vec<u64>,
    /// Unused tokens to give back.
    returns: Vec<Return>,
}

/// The leases a member holds: which buckets are leased (those its hot keys named), their
/// slices, and what is due to their owners (asks, returns). Bounded: at most
/// `max_leases` buckets, [`MOST_GRANTS`] slices each.
#[derive(Debug)]
pub struct Held {
    shards: Box<[Mutex<Shard>]>,
    settings: LeaseSettings,
    seq: AtomicU64,
    count: AtomicUsize,
    /// Releases, by [`Release`] (in its order).
    released: [AtomicU64; 3],
    /// Woken when an ask becomes due.
    pub wake: tokio::sync::Notify,
}

impl Held {
    pub fn new(settings: LeaseSettings) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            settings,
            seq: AtomicU64::new(1),
            count: AtomicUsize::new(0),
            released: Default::default(),
            wake: tokio::sync::Notify::new(),
        }
    }

    fn shard(&self, id: u64) -> &Mutex<Shard> {
        // Ids are hashes already: their low bits spread.
        &self.shards[(id as usize) % SHARDS]
    }

    /// Buckets leased (or wanted) here.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Whether bucket `id` is leased (or wanted) here.
    pub fn holds(&self, id: u64) -> bool {
        self.shard(id).lock().entries.contains_key(&id)
    }

    /// Tokens held in slices now.
    pub fn tokens(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().entries.values().map(Entry::tokens).sum::<u64>())
            .sum()
    }

    /// Bucket `id` became hot here: lease it (asked at its next check, which names its key).
    /// Returns false when the table is full.
    pub fn want(&self, id: u64) -> bool {
        let mut shard = self.shard(id).lock();
        if shard.entries.contains_key(&id) {
            return true;
        }
        if self.count.load(Ordering::Relaxed) >= self.settings.max_leases {
            return false;
        }
        shard.entries.insert(id, Entry::default());
        self.count.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Releases so far for `why`.
    pub fn released(&self, why: Release) -> u64 {
        self.released[why as usize].load(Ordering::Relaxed)
    }

    /// Bucket `id` is no longer leased here (see [`Release`]): what is left of its slices
    /// goes back (but for a reset bucket: nothing to give back to). Returns whether it was
    /// leased.
    pub fn release(&self, id: u64, why: Release) -> bool {
        let mut shard = self.shard(id).lock();
        let Some(mut e) = shard.entries.remove(&id) else {
            return false;
        };
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.released[why as usize].fetch_add(1, Ordering::Relaxed);
        if why == Release::Revoked {
            return true;
        }
        let mut returns = std::mem::take(&mut shard.returns);
        for g in std::mem::take(&mut e.grants) {
            e.give_up(id, g, &mut returns);
        }
        let back = !returns.is_empty();
        shard.returns = returns;
        drop(shard);
        if back {
            self.wake.notify_one();
        }
        true
    }

    /// Releases every bucket (see [`Held::release`]).
    pub fn release_all(&self, why: Release) -> usize {
        let ids: Vec<u64> = self
            .shards
            .iter()
            .flat_map(|s| s.lock().entries.keys().copied().collect::<Vec<_>>())
            .collect();
        ids.into_iter().filter(|&id| self.release(id, why)).count()
    }

    /// A check of `cost` of bucket `id` at `now`: admitted on a slice, denied while the owner
    /// said so, or sent to the owner. `key` names the bucket for an ask (called once, at the
    /// first check after the bucket became hot).
    pub fn take(
        &self,
        id: u64,
        cost: u64,
        now: u64,
        key: impl FnOnce() -> (String, RuleRef),
    ) -> Take {
        self.take_with(id, cost, || now, key)
    }

    /// [`Held::take`], the time read only for a leased bucket (a clock read costs a forwarded
    /// check as much as the lookup).
    #[inline]
    pub fn take_with(
        &self,
        id: u64,
        cost: u64,
        now: impl FnOnce() -> u64,
        key: impl FnOnce() -> (String, RuleRef),
    ) -> Take {
        if self.count.load(Ordering::Relaxed) == 0 {
            return Take::Forward;
        }
        let mut guard = self.shard(id).lock();
        let shard = &mut *guard;
        let Some(e) = shard.entries.get_mut(&id) else {
            return Take::Forward;
        };
        let now = now();
        if e.key.is_none() {
            e.key = Some(key());
        }
        e.expire(id, now, &mut shard.returns);
        // What a slice still holds is spent first, denial or not: those tokens were taken
        // already, and left unspent they would be false denies.
        let found = e.grants.iter_mut().find(|g| g.tokens >= cost && cost > 0);
        let took = found.map(|g| {
            g.tokens -= cost;
            (g.seq, g.limit, g.reset_at_ms)
        });
        if took.is_none()
            && let Some((answer, until)) = e.denied
        {
            if now < until && cost > 0 {
                let wait = (until - now).div_ceil(NANOS_PER_MS);
                return Take::Denied(CheckAnswer {
                    retry_after_ms: wait.max(1),
                    leased: true,
                    ..answer
                });
            }
            e.denied = None;
        }
        let left = e.tokens();
        let low = left.saturating_mul(2) < e.last_granted.max(1);
        let due = !e.asking && now >= e.quiet_until_ns && (took.is_none() || low);
        if due {
            e.asking = true;
            shard.due.push(id);
        }
        let result = match took {
            Some((grant, limit, reset_at_ms)) => {
                e.spent = e.spent.saturating_add(cost);
                Take::Leased(
                    CheckAnswer {
                        allowed: true,
                        limit,
                        remaining: left,
                        reset_at_ms,
                        retry_after_ms: 0,
                        degraded: false,
                        replica: false,
                        leased: true,
                    },
                    SliceTaken { id, cost, grant },
                )
            }
            None => Take::Forward,
        };
        drop(guard);
        if due {
            self.wake.notify_one();
        }
        result
    }

    /// Gives back to its slice what [`Held::take`] took (an all-or-nothing request that
    /// another limit denied). A slice already gone keeps it: under-admission only.
    pub fn give_back(&self, taken: &SliceTaken) {
        let mut shard = self.shard(taken.id).lock();
        if let Some(e) = shard.entries.get_mut(&taken.id)
            && let Some(g) = e.grants.iter_mut().find(|g| g.seq == taken.grant)
        {
            g.tokens += taken.cost;
            e.spent = e.spent.saturating_sub(taken.cost);
        }
    }

    /// The asks due now, each marked as on its way.
    pub fn due(&self, now: u64) -> Vec<Due> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let mut shard = s.lock();
            let ids = std::mem::take(&mut shard.due);
            for id in ids {
                let Some(e) = shard.entries.get_mut(&id) else {
                    continue;
                };
                let Some((key, rule)) = e.key.clone() else {
                    e.asking = false;
                    continue;
                };
                let elapsed = now.saturating_sub(e.since_ns);
                let demand = if e.spent > 0 && elapsed > 0 && e.since_ns > 0 {
                    let per_s = u128::from(e.spent) * 1_000_000_000 / u128::from(elapsed);
                    u64::try_from(per_s).unwrap_or(u64::MAX)
                } else {
                    self.settings.initial_demand_per_s
                };
                let want = u128::from(demand) * u128::from(self.settings.span_ns) / 1_000_000_000;
                out.push(Due {
                    id,
                    ask: LeaseAsk {
                        key,
                        rule,
                        want: u64::try_from(want).unwrap_or(u64::MAX).max(1),
                        demand_per_s: demand,
                    },
                    at_ns: now,
                });
            }
        }
        out
    }

    /// The owner's answer to the ask `due`, received at `now`.
    pub fn answered(&self, due: &Due, grant: LeaseGrant, now: u64) {
        let (id, asked_ns) = (due.id, due.at_ns);
        let mut guard = self.shard(id).lock();
        let shard = &mut *guard;
        let Some(e) = shard.entries.get_mut(&id) else {
            // Released meanwhile: the slice goes straight back.
            if let LeaseGrant::Granted { tokens, mark, .. } = grant
                && tokens > 0
            {
                shard.returns.push(Return {
                    id,
                    refund: PeerRefund {
                        key: due.ask.key.clone(),
                        rule: due.ask.rule.clone(),
                        cost: tokens,
                        mark,
                    },
                });
            }
            return;
        };
        e.asking = false;
        match grant {
            LeaseGrant::Granted {
                tokens,
                mark,
                valid_ns,
                answer,
            } => {
                e.grants.push_back(Grant {
                    seq: self.seq.fetch_add(1, Ordering::Relaxed),
                    tokens,
                    mark,
                    // From the ask, which left before the owner decided: the slice ends here
                    // no later than at the owner.
                    until_ns: asked_ns.saturating_add(valid_ns),
                    limit: answer.limit,
                    reset_at_ms: answer.reset_at_ms,
                });
                e.last_granted = tokens;
                e.denied = None;
                e.spent = 0;
                e.since_ns = now;
                while e.grants.len() > MOST_GRANTS {
                    if let Some(g) = e.grants.pop_front() {
                        e.give_up(id, g, &mut shard.returns);
                    }
                }
            }
            LeaseGrant::Refused { answer } if !answer.allowed => {
                let wait = answer.retry_after_ms.saturating_mul(NANOS_PER_MS);
                e.denied = Some((answer, asked_ns.saturating_add(wait)));
            }
            LeaseGrant::Refused { .. } | LeaseGrant::Error { .. } => {
                e.quiet_until_ns = now.saturating_add(self.settings.backoff_ns);
            }
        }
    }

    /// The ask of bucket `id` got no answer: asked again after the backoff.
    pub fn unanswered(&self, id: u64, now: u64) {
        if let Some(e) = self.shard(id).lock().entries.get_mut(&id) {
            e.asking = false;
            e.quiet_until_ns = now.saturating_add(self.settings.backoff_ns / 10);
        }
    }

    /// What goes back to owners now: slices whose time is up (their unused tokens), released
    /// buckets' slices.
    pub fn returns(&self, now: u64) -> Vec<Return> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let mut guard = s.lock();
            let shard = &mut *guard;
            for (&id, e) in shard.entries.iter_mut() {
                e.expire(id, now, &mut shard.returns);
            }
            out.append(&mut shard.returns);
        }
        out
    }
}

/// Most members (and SDKs) holding slices of one bucket at once; an ask beyond is refused
/// (`lease_limit`) and its checks go to the owner.
pub const MOST_HOLDERS: usize = 64;

/// One slice out on lease.
#[derive(Debug)]
struct Out {
    holder: String,
    tokens: u64,
    until_ns: u64,
}

/// The owner's record of the slices it granted, per bucket: among how many holders a bucket's
/// slices are shared, and what is out on lease. Bounded: at most `max` slices (and
/// [`MOST_HOLDERS`] holders a bucket); a slice is forgotten when its time is up (what its holder
/// did not spend comes back as a refund, which needs no record).
#[derive(Debug)]
pub struct Grants {
    out: Mutex<HashMap<u64, Vec<Out>>>,
    max: usize,
    len: AtomicUsize,
}

impl Grants {
    pub fn new(max: usize) -> Self {
        Self {
            out: Mutex::default(),
            max,
            len: AtomicUsize::new(0),
        }
    }

    /// Answers `holder`'s ask for a slice of bucket `id` at `now` with `decide(holders)`, the
    /// holders of the bucket's live slices counting the asker ([`grant`] sizes by it), and
    /// records what it grants.
    pub fn grant(
        &self,
        id: u64,
        holder: &str,
        now: u64,
        decide: impl FnOnce(u64) -> LeaseGrant,
    ) -> LeaseGrant {
        let mut out = self.out.lock();
        if self.len.load(Ordering::Relaxed) >= self.max {
            self.forget_expired(&mut out, now);
        }
        let full = self.len.load(Ordering::Relaxed) >= self.max;
        let slices = out.entry(id).or_default();
        let before = slices.len();
        slices.retain(|o| o.until_ns > now);
        let mut holders: Vec<&str> = slices.iter().map(|o| o.holder.as_str()).collect();
        holders.sort_unstable();
        holders.dedup();
        let known = holders.binary_search(&holder).is_ok();
        let count = holders.len() as u64 + u64::from(!known);
        let g = if full || (!known && holders.len() >= MOST_HOLDERS) {
            LeaseGrant::Error {
                code: "lease_limit".to_owned(),
                message: "too many slices out on lease".to_owned(),
            }
        } else {
            decide(count)
        };
        if let LeaseGrant::Granted {
            tokens, valid_ns, ..
        } = &g
        {
            slices.push(Out {
                holder: holder.to_owned(),
                tokens: *tokens,
                until_ns: now.saturating_add(*valid_ns),
            });
        }
        let after = slices.len();
        if after == 0 {
            out.remove(&id);
        }
        self.len.fetch_add(after, Ordering::Relaxed);
        self.len.fetch_sub(before, Ordering::Relaxed);
        g
    }

    fn forget_expired(&self, out: &mut HashMap<u64, Vec<Out>>, now: u64) {
        out.retain(|_, slices| {
            let before = slices.len();
            slices.retain(|o| o.until_ns > now);
            self.len.fetch_sub(before - slices.len(), Ordering::Relaxed);
            !slices.is_empty()
        });
    }

    /// Slices out on lease at `now`, and their tokens as granted (what holders spent of them
    /// is not told: at most this much is out).
    pub fn live(&self, now: u64) -> (usize, u64) {
        let mut out = self.out.lock();
        self.forget_expired(&mut out, now);
        let tokens = out.values().flatten().map(|o| o.tokens).sum();
        (self.len.load(Ordering::Relaxed), tokens)
    }

    /// Forgets the slices of buckets `ids` (reset: their holders drop them too).
    pub fn forget(&self, ids: &[u64]) {
        let mut out = self.out.lock();
        for id in ids {
            if let Some(slices) = out.remove(id) {
                self.len.fetch_sub(slices.len(), Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests;
