//! Reservations: costs known only afterwards (an LLM call's tokens). A reservation takes an
//! *estimate* from a bucket at once, like a check of that cost, and is remembered at the
//! bucket's owner until it is settled with the *actual* cost (the difference is given back, or
//! taken) or until its time to live runs out (the estimate stays taken).
//!
//! This module is the owner's bookkeeping, pure and clocked by its callers:
//! - [`Table`] — the live reservations, by nonce, bounded, and shared fairly between rules
//!   (see [`Table::insert`]); a reservation of cost 0 takes nothing and is not kept;
//! - [`settle`] — what one settle does to a bucket, over any [`Bucket`]: an actual cost above
//!   the estimate is taken whatever the bucket admits ([`Bucket::charge`]), and what the bucket
//!   could not admit is its *debt*, part of its state (see [`crate::limiter`], *Debt*): the
//!   bucket denies until time has repaid it, the debt travels with the bucket to its replicas
//!   and next owners, and it is bounded and evicted with the bucket.
//!
//! # The bound it keeps
//! Over any run, the cost a bucket admitted (checks, estimates of reservations live or
//! expired, actual costs of settled ones) is at most what its rule allows over the run plus the
//! debt still outstanding (and what was forgiven beyond the most a bucket may owe,
//! [`crate::limiter::MAX_DEBT_PERIODS`] periods of its limit). Giving back a token bucket's
//! cost is never more generous than that (see [`crate::limiter::BucketState::refund`]: it
//! loses the refill since the reservation).

use crate::check::{CheckError, Resolved};
use crate::limiter::{Decision, Rule};
use crate::rule::Mode;
use parking_lot::Mutex;
use ringlimit_proto::peer::Mark;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most live reservations a node keeps by default (about 100 bytes each).
pub const MOST_RESERVATIONS: usize = 100_000;

/// `ttl_ms` when a reservation does not say.
pub const DEFAULT_TTL_MS: u64 = 60_000;
/// The longest a node lets a reservation live unless told otherwise (ten minutes: an LLM
/// call's longest generations, with room to spare). A reservation holds a slot of its owner's
/// table until settled or expired.
pub const DEFAULT_MAX_TTL_MS: u64 = 600_000;
/// The longest a node may be told to let a reservation live (an hour), and what the SDK checks
/// before asking (the owner checks its own bound).
pub const MAX_TTL_MS: u64 = 3_600_000;

/// Why a reserve or a settle has no answer (a denial is an answer, not an error). Every
/// variant but the last three is a mistake in the request, and none changes a bucket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    #[error(transparent)]
    Check(#[from] CheckError),
    #[error("`ttl_ms` must be 1 to {max_ms} ms, got {ttl_ms}")]
    Ttl { ttl_ms: u64, max_ms: u64 },
    #[error("{0} rules cannot be reserved: only enforced owner-mode rules keep reservations")]
    NotReservable(&'static str),
    #[error(
        "no such reservation: it expired (its estimate stays taken), was settled already, held nothing (cost 0), or was never issued"
    )]
    Unknown,
    /// The owner's table has no room for this rule now (the sentence says why).
    #[error("{0}")]
    TooMany(String),
    #[error("reservations are unavailable now: {0}")]
    Unavailable(String),
}

impl ReserveError {
    /// The HTTP API's snake_case error code.
    pub fn code(&self) -> &'static str {
        match self {
            ReserveError::Check(e) => e.code(),
            ReserveError::Ttl { .. } | ReserveError::NotReservable(_) => "invalid_request",
            ReserveError::Unknown => "unknown_reservation",
            ReserveError::TooMany(_) => "too_many_reservations",
            ReserveError::Unavailable(_) => "unavailable",
        }
    }

    /// An owner's error answer (`code`, `message`) as this side's error: codes from the
    /// network are not trusted beyond those of checks and reservations.
    pub fn from_owner(code: &str, message: &str) -> Self {
        match code {
            "too_many_reservations" => ReserveError::TooMany(message.to_owned()),
            "unavailable" | "not_owner" => ReserveError::Unavailable(format!(
                "the key's owner could not take it ({message}); retry"
            )),
            _ => ReserveError::Check(CheckError::Rejected {
                code: code.to_owned(),
                message: message.to_owned(),
            }),
        }
    }
}

/// `ttl_ms` as given (`None`: the default), checked against the longest any node allows
/// (the SDK's check before it asks; the owner checks its own bound, [`ttl_ms_within`]).
pub fn ttl_ms(given: Option<u64>) -> Result<u64, ReserveError> {
    ttl_ms_within(given, MAX_TTL_MS)
}

/// `ttl_ms` as given (`None`: the default, or `max_ms` if that is shorter), checked: 1 to
/// `max_ms`.
pub fn ttl_ms_within(given: Option<u64>, max_ms: u64) -> Result<u64, ReserveError> {
    match given.unwrap_or(DEFAULT_TTL_MS.min(max_ms)) {
        t if (1..=max_ms).contains(&t) => Ok(t),
        t => Err(ReserveError::Ttl { ttl_ms: t, max_ms }),
    }
}

/// Whether reservations may be kept under `resolved`: an enforced rule decided at its owner.
/// A global rule's counters cannot give back, and a shadow rule's answers never deny, so a
/// reservation would mean nothing under either.
pub fn reservable(resolved: &Resolved) -> Result<(), ReserveError> {
    if resolved.mode == Mode::Global {
        return Err(ReserveError::NotReservable("global"));
    }
    if resolved.shadow {
        return Err(ReserveError::NotReservable("shadow"));
    }
    Ok(())
}

/// Whose reservation it is, for sharing the table fairly: the rule it was taken under, the
/// tenant that rule stands for. A named rule is the operator's; inline rules are anyone's (a
/// client can make up as many as it likes), so they share one part of the table between them,
/// and each inline rule its share of that part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tenant {
    /// A named rule, by its seed.
    Named(u64),
    /// An inline rule, by its seed (its numbers).
    Inline(u64),
}

impl Tenant {
    /// The tenant of a reservation under `resolved`. An inline rule's seed is its numbers'
    /// (see [`crate::rule::inline_seed`]); a named rule's is its name's, which equals that only
    /// by a 64-bit collision.
    pub fn of(resolved: &Resolved) -> Self {
        if resolved.seed == crate::rule::inline_seed(&resolved.rule) {
            Tenant::Inline(resolved.seed)
        } else {
            Tenant::Named(resolved.seed)
        }
    }
}

/// One live reservation, as its owner keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// The bucket's identity.
    pub id: u64,
    /// Whose share of the table it takes.
    pub tenant: Tenant,
    /// The rule the estimate was taken under.
    pub rule: Rule,
    /// What was taken.
    pub estimate: u64,
    /// Names the admission that took it, for giving back (`None`: nothing was taken).
    pub mark: Option<Mark>,
    /// Past this instant (ns) it has expired: its estimate stays taken.
    pub deadline: u64,
}

/// Why a reservation was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "this node keeps {0} live reservations of this rule, its share of the table (a rule may hold no more than are left free)"
    )]
    Share(usize),
    #[error("a reservation with this nonce is live already")]
    Duplicate,
}

/// What looking a reservation up for its settle found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Live: taken out of the table (settled exactly once).
    Live(Reservation),
    /// Its deadline has passed (dropped now, its estimate kept).
    Expired,
    /// No such reservation: settled already, dropped by a sweep, never issued, or another
    /// bucket's.
    Unknown,
}

/// What happened to reservations, for metrics.
#[derive(Debug, Default)]
pub struct ReserveStats {
    pub reserved: AtomicU64,
    pub denied: AtomicU64,
    pub settled: AtomicU64,
    pub expired: AtomicU64,
    pub unknown: AtomicU64,
}

impl ReserveStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The live reservations of one owner, by nonce; at most `max` of them, shared fairly between
/// tenants (see [`Table::insert`]).
#[derive(Debug)]
pub struct Table {
    max: usize,
    live: Mutex<Live>,
    pub stats: ReserveStats,
}

/// The table's contents: the reservations, and how many each tenant holds.
#[derive(Debug, Default)]
struct Live {
    by_nonce: HashMap<u128, Reservation>,
    held: HashMap<Tenant, usize>,
    /// Held by inline rules, all together.
    inline: usize,
}

impl Live {
    fn held(&self, tenant: Tenant) -> usize {
        self.held.get(&tenant).copied().unwrap_or(0)
    }

    /// Whether `tenant` may take one more of `max` slots: a tenant may hold at most half of
    /// what the others leave (so with `k` tenants flooding, a `1/(k+1)` part stays free for a
    /// newcomer, and the table is never full); inline rules hold at most that together, and
    /// each inline rule half of what the other inline rules leave of it.
    fn admits(&self, tenant: Tenant, max: usize) -> Result<(), Refused> {
        let total = self.by_nonce.len();
        let fits =
            |mine: usize, others: usize, of: usize| 2 * (mine + 1) <= of.saturating_sub(others);
        let mine = self.held(tenant);
        match tenant {
            Tenant::Named(_) => {
                if !fits(mine, total - mine, max) {
                    return Err(Refused::Share(mine));
                }
            }
            Tenant::Inline(_) => {
                let named = total - self.inline;
                let part = max.saturating_sub(named) / 2;
                if !fits(self.inline, named, max) || !fits(mine, self.inline - mine, part) {
                    return Err(Refused::Share(mine));
                }
            }
        }
        Ok(())
    }

    fn insert(&mut self, nonce: u128, r: Reservation, max: usize) -> Result<(), Refused> {
        if self.by_nonce.contains_key(&nonce) {
            return Err(Refused::Duplicate);
        }
        self.admits(r.tenant, max)?;
        self.by_nonce.insert(nonce, r);
        *self.held.entry(r.tenant).or_default() += 1;
        if matches!(r.tenant, Tenant::Inline(_)) {
            self.inline += 1;
        }
        Ok(())
    }

    /// Counts `r` out of its tenant's share (it has left the table).
    fn left(&mut self, r: &Reservation) {
        left(&mut self.held, &mut self.inline, r);
    }
}

/// Counts `r` out of `held` and `inline` (see [`Live`]).
fn left(held: &mut HashMap<Tenant, usize>, inline: &mut usize, r: &Reservation) {
    if let Entry::Occupied(mut e) = held.entry(r.tenant) {
        *e.get_mut() -= 1;
        if *e.get() == 0 {
            e.remove();
        }
    }
    if matches!(r.tenant, Tenant::Inline(_)) {
        *inline -= 1;
    }
}

impl Table {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            live: Mutex::new(Live::default()),
            stats: ReserveStats::default(),
        }
    }

    /// Live reservations (expired ones count until swept or looked up).
    pub fn len(&self) -> usize {
        self.live.lock().by_nonce.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether another reservation of `tenant` would be refused: asked before anything is
    /// taken.
    pub fn refuses(&self, tenant: Tenant) -> Option<Refused> {
        self.live.lock().admits(tenant, self.max).err()
    }

    /// The most reservations kept.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Live reservations of `tenant`.
    pub fn held_by(&self, tenant: Tenant) -> usize {
        self.live.lock().held(tenant)
    }

    /// Keeps `r` under `nonce`, unless `r`'s tenant holds its share: a
    /// tenant may hold at most half of what the other tenants leave free (inline rules
    /// together, and each of them within that; see [`Tenant`]). One rule flooding the table
    /// with reservations on throwaway keys thus holds at most half of it, and another rule's
    /// reservations still find room while fewer than about `max / 2` rules hold some.
    pub fn insert(&self, nonce: u128, r: Reservation) -> Result<(), Refused> {
        self.live.lock().insert(nonce, r, self.max)?;
        ReserveStats::add(&self.stats.reserved, 1);
        Ok(())
    }

    /// Takes reservation `nonce` of bucket `id` out at `now`, to settle it. A nonce of
    /// another bucket is left where it is (and is unknown to this settle).
    pub fn take(&self, nonce: u128, id: u64, now: u64) -> Found {
        let mut live = self.live.lock();
        let found = match live.by_nonce.entry(nonce) {
            Entry::Occupied(e) if e.get().id == id => {
                let r = e.remove();
                live.left(&r);
                if now > r.deadline {
                    Found::Expired
                } else {
                    Found::Live(r)
                }
            }
            _ => Found::Unknown,
        };
        drop(live);
        match found {
            Found::Live(_) => ReserveStats::add(&self.stats.settled, 1),
            Found::Expired => {
                ReserveStats::add(&self.stats.expired, 1);
                ReserveStats::add(&self.stats.unknown, 1);
            }
            Found::Unknown => ReserveStats::add(&self.stats.unknown, 1),
        }
        found
    }

    /// The reservations still live at `now`, by nonce (to keep them across a restart).
    pub fn live_at(&self, now: u64) -> Vec<(u128, Reservation)> {
        let live = self.live.lock();
        live.by_nonce
            .iter()
            .filter(|(_, r)| r.deadline >= now)
            .map(|(n, r)| (*n, *r))
            .collect()
    }

    /// Keeps `r` under `nonce` again after a restart: as [`Table::insert`], not counted as
    /// reserved anew.
    pub fn restore(&self, nonce: u128, r: Reservation) -> Result<(), Refused> {
        self.live.lock().insert(nonce, r, self.max)
    }

    /// A number that changes whenever the table does (a reservation kept, settled or
    /// expired): whoever copies the table elsewhere copies it again only when it moved.
    pub fn version(&self) -> u64 {
        let s = &self.stats;
        [&s.reserved, &s.settled, &s.expired]
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add)
    }

    /// Drops every reservation expired at `now` (their estimates stay taken); returns how many.
    pub fn sweep(&self, now: u64) -> u64 {
        let mut live = self.live.lock();
        let Live {
            by_nonce,
            held,
            inline,
        } = &mut *live;
        let before = by_nonce.len();
        by_nonce.retain(|_, r| {
            let keep = r.deadline >= now;
            if !keep {
                left(held, inline, r);
            }
            keep
        });
        let dropped = (before - by_nonce.len()) as u64;
        drop(live);
        ReserveStats::add(&self.stats.expired, dropped);
        dropped
    }
}

/// One bucket as a settle sees it, at the settle's instant.
pub trait Bucket {
    /// A check of `cost` (0: a read).
    fn decide(&mut self, cost: u64) -> Decision;
    /// Gives back `cost` taken by the admission `mark`.
    fn refund(&mut self, cost: u64, mark: Mark);
    /// Takes `cost` whatever the bucket admits: what it cannot admit now it owes (see
    /// [`crate::limiter::BucketState::charge`]). Returns the tokens forgiven because the
    /// bucket would owe more than it may.
    fn charge(&mut self, cost: u64) -> u64;
}

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settlement {
    /// Given back to the bucket (the estimate was higher).
    pub given_back: u64,
    /// Taken from what the bucket admitted now (the actual cost was higher).
    pub taken: u64,
    /// The rest of the overshoot, owed by the bucket (part of its state).
    pub owed: u64,
    /// Of `owed`, what the bucket could not owe: beyond the most a bucket may owe.
    pub forgiven: u64,
}

/// Settles reservation `r` at its `actual` cost on `bucket`: a lower cost gives the
/// difference back under the reservation's mark; a higher one takes the difference whatever
/// the bucket admits now, and what it could not admit is its debt.
pub fn settle(bucket: &mut impl Bucket, r: &Reservation, actual: u64) -> Settlement {
    if actual <= r.estimate {
        let back = r.estimate - actual;
        if back > 0
            && let Some(mark) = r.mark
        {
            bucket.refund(back, mark);
        }
        return Settlement {
            given_back: back,
            ..Settlement::default()
        };
    }
    let extra = actual - r.estimate;
    let room = bucket.decide(0).remaining;
    let forgiven = bucket.charge(extra);
    let taken = extra.min(room);
    Settlement {
        given_back: 0,
        taken,
        owed: extra - taken,
        forgiven,
    }
}

#[cfg(test)]
mod tests;
