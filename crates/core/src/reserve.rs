//! Reservations: costs known only afterwards (an LLM call's tokens). A reservation takes an
//! *estimate* from a bucket at once, like a check of that cost, and is remembered at the
//! bucket's owner until it is settled with the *actual* cost (the difference is given back, or
//! taken) or until its time to live runs out (the estimate stays taken).
//!
//! This module is the owner's bookkeeping, pure and clocked by its callers:
//! - [`Table`] — the live reservations, by nonce, bounded;
//! - [`Debts`] — the ledger of buckets that went into debt: an overshoot the bucket could not
//!   admit when it was settled, repaid from what the bucket admits later (see [`Debts::repay`])
//!   and, until then, denying every check of the bucket ([`in_debt`]);
//! - [`settle`] — what one settle does to a bucket, over any [`Bucket`].
//!
//! # The bound it keeps
//! Over any run, the cost a bucket admitted (checks, estimates of reservations live or
//! expired, actual costs of settled ones) is at most what its rule allows over the run plus the
//! debt still outstanding; and the debt outstanding is at most the settled overshoots not yet
//! repaid. Giving back a token bucket's cost is never more generous than that (see
//! [`crate::limiter::BucketState::refund`]: it loses the refill since the reservation).

use crate::check::{CheckError, Resolved};
use crate::limiter::{Decision, Rule};
use crate::rule::Mode;
use parking_lot::{Mutex, RwLock};
use ringlimit_proto::peer::Mark;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most live reservations a node keeps by default (about 100 bytes each).
pub const MOST_RESERVATIONS: usize = 100_000;
/// Most buckets in debt a node keeps by default.
pub const MOST_DEBTS: usize = 100_000;

/// `ttl_ms` when a reservation does not say.
pub const DEFAULT_TTL_MS: u64 = 60_000;
/// The longest a reservation may live (an hour).
pub const MAX_TTL_MS: u64 = 3_600_000;

/// Why a reserve or a settle has no answer (a denial is an answer, not an error). Every
/// variant but the last three is a mistake in the request, and none changes a bucket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    #[error(transparent)]
    Check(#[from] CheckError),
    #[error("`ttl_ms` must be 1 to {MAX_TTL_MS} ms, got {0}")]
    Ttl(u64),
    #[error("{0} rules cannot be reserved: only enforced owner-mode rules keep reservations")]
    NotReservable(&'static str),
    #[error(
        "no such reservation: it expired (its estimate stays taken), was settled already, or was never issued"
    )]
    Unknown,
    #[error(
        "the key's owner keeps {0} live reservations already; settle some, or retry when some expire"
    )]
    TooMany(usize),
    #[error("reservations are unavailable now: {0}")]
    Unavailable(String),
}

impl ReserveError {
    /// The HTTP API's snake_case error code.
    pub fn code(&self) -> &'static str {
        match self {
            ReserveError::Check(e) => e.code(),
            ReserveError::Ttl(_) | ReserveError::NotReservable(_) => "invalid_request",
            ReserveError::Unknown => "unknown_reservation",
            ReserveError::TooMany(_) => "too_many_reservations",
            ReserveError::Unavailable(_) => "unavailable",
        }
    }

    /// An owner's error answer (`code`, `message`) as this side's error: codes from the
    /// network are not trusted beyond those of checks and reservations.
    pub fn from_owner(code: &str, message: &str) -> Self {
        match code {
            "too_many_reservations" => ReserveError::TooMany(MOST_RESERVATIONS),
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

/// `ttl_ms` as given (`None`: the default), checked.
pub fn ttl_ms(given: Option<u64>) -> Result<u64, ReserveError> {
    match given.unwrap_or(DEFAULT_TTL_MS) {
        t @ 1..=MAX_TTL_MS => Ok(t),
        t => Err(ReserveError::Ttl(t)),
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

/// One live reservation, as its owner keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// The bucket's identity.
    pub id: u64,
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
    #[error("this node keeps at most {0} live reservations")]
    Full(usize),
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

/// The live reservations of one owner, by nonce; at most `max` of them.
#[derive(Debug)]
pub struct Table {
    max: usize,
    live: Mutex<HashMap<u128, Reservation>>,
    pub stats: ReserveStats,
}

impl Table {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            live: Mutex::new(HashMap::new()),
            stats: ReserveStats::default(),
        }
    }

    /// Live reservations (expired ones count until swept or looked up).
    pub fn len(&self) -> usize {
        self.live.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether another reservation would be refused: asked before anything is taken.
    pub fn is_full(&self) -> bool {
        self.len() >= self.max
    }

    /// The most reservations kept.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Keeps `r` under `nonce`.
    pub fn insert(&self, nonce: u128, r: Reservation) -> Result<(), Refused> {
        let mut live = self.live.lock();
        if live.len() >= self.max {
            return Err(Refused::Full(self.max));
        }
        match live.entry(nonce) {
            Entry::Occupied(_) => Err(Refused::Duplicate),
            Entry::Vacant(v) => {
                v.insert(r);
                ReserveStats::add(&self.stats.reserved, 1);
                Ok(())
            }
        }
    }

    /// Takes reservation `nonce` of bucket `id` out at `now`, to settle it. A nonce of
    /// another bucket is left where it is (and is unknown to this settle).
    pub fn take(&self, nonce: u128, id: u64, now: u64) -> Found {
        let mut live = self.live.lock();
        let found = match live.entry(nonce) {
            Entry::Occupied(e) if e.get().id == id => {
                let r = e.remove();
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

    /// Drops every reservation expired at `now` (their estimates stay taken); returns how many.
    pub fn sweep(&self, now: u64) -> u64 {
        let mut live = self.live.lock();
        let before = live.len();
        live.retain(|_, r| r.deadline >= now);
        let dropped = (before - live.len()) as u64;
        drop(live);
        ReserveStats::add(&self.stats.expired, dropped);
        dropped
    }
}

/// Debt of one bucket: tokens owed, and the rule to take them under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Debt {
    rule: Rule,
    tokens: u64,
}

/// The buckets in debt, at most `max`. Every check of a bucket looks here first, so that a
/// bucket in debt denies: [`Debts::owed`] costs one relaxed load while no bucket is, and a
/// shared read lock while any is (checks of other buckets do not wait for each other; only
/// the repayments and settles above their estimates write).
#[derive(Debug)]
pub struct Debts {
    max: usize,
    /// Whether `owed` may hold anything.
    any: AtomicBool,
    owed: RwLock<HashMap<u64, Debt>>,
    /// Tokens owed since start, repaid since start, and left unrecorded (the ledger full).
    pub incurred: AtomicU64,
    pub repaid: AtomicU64,
    pub dropped: AtomicU64,
}

impl Debts {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            any: AtomicBool::new(false),
            owed: RwLock::new(HashMap::new()),
            incurred: AtomicU64::new(0),
            repaid: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// What bucket `id` owes, if anything.
    #[inline]
    pub fn owed(&self, id: u64) -> Option<u64> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.owed.read().get(&id).map(|d| d.tokens)
    }

    /// Bucket `id` owes `tokens` more, to be taken under `rule`. A bucket not in debt yet
    /// when the ledger is full cannot be recorded: its tokens are dropped and counted (the
    /// one way an overshoot goes unpaid); returns how many were.
    pub fn add(&self, id: u64, rule: Rule, tokens: u64) -> u64 {
        if tokens == 0 {
            return 0;
        }
        let mut owed = self.owed.write();
        let full = owed.len() >= self.max;
        match owed.entry(id) {
            Entry::Occupied(mut e) => {
                let d = e.get_mut();
                d.tokens = d.tokens.saturating_add(tokens);
                d.rule = rule;
            }
            Entry::Vacant(_) if full => {
                self.dropped.fetch_add(tokens, Ordering::Relaxed);
                return tokens;
            }
            Entry::Vacant(v) => {
                v.insert(Debt { rule, tokens });
            }
        }
        self.any.store(true, Ordering::Relaxed);
        self.incurred.fetch_add(tokens, Ordering::Relaxed);
        0
    }

    /// Repays debts: `take(id, rule, owed)` takes from bucket `id` as much of `owed` as it
    /// admits now and returns how much it took. Returns the tokens repaid.
    pub fn repay(&self, mut take: impl FnMut(u64, &Rule, u64) -> u64) -> u64 {
        if !self.any.load(Ordering::Relaxed) {
            return 0;
        }
        let mut owed = self.owed.write();
        let mut repaid = 0;
        owed.retain(|&id, d| {
            let took = take(id, &d.rule, d.tokens).min(d.tokens);
            d.tokens -= took;
            repaid += took;
            d.tokens > 0
        });
        self.any.store(!owed.is_empty(), Ordering::Relaxed);
        self.repaid.fetch_add(repaid, Ordering::Relaxed);
        repaid
    }

    /// Forgets the debts of buckets `ids` (an operator reset them).
    pub fn forget(&self, ids: &[u64]) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut owed = self.owed.write();
        for id in ids {
            owed.remove(id);
        }
        self.any.store(!owed.is_empty(), Ordering::Relaxed);
    }

    /// Tokens owed now, all buckets together.
    pub fn total(&self) -> u64 {
        self.owed.read().values().map(|d| d.tokens).sum()
    }

    /// Buckets in debt now.
    pub fn len(&self) -> usize {
        self.owed.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long a debt of `tokens` under `rule` takes to repay at the rule's rate (ns, at least
/// one ms): what a bucket in debt asks its callers to wait.
pub fn wait_ns(rule: &Rule, tokens: u64) -> u64 {
    let ns = u128::from(tokens) * u128::from(rule.period_ns) / u128::from(rule.limit.max(1));
    u64::try_from(ns)
        .unwrap_or(u64::MAX)
        .max(crate::clock::NANOS_PER_MS)
}

/// The decision for a bucket that owes `owed` tokens at `now`, from a read of its state
/// (`peek`, a check of cost 0): denied with nothing remaining until the debt is repaid.
pub fn in_debt(peek: Decision, rule: &Rule, owed: u64, now: u64) -> Decision {
    let wait = wait_ns(rule, owed);
    Decision {
        allowed: false,
        remaining: 0,
        reset_ns: peek.reset_ns.max(now.saturating_add(wait)),
        retry_after_ns: peek.retry_after_ns.max(wait),
    }
}

/// One bucket as a settle sees it, at the settle's instant; debt is the caller's to look at
/// (these decide on the bucket's state alone).
pub trait Bucket {
    /// A check of `cost` (0: a read).
    fn decide(&mut self, cost: u64) -> Decision;
    /// Gives back `cost` taken by the admission `mark`.
    fn refund(&mut self, cost: u64, mark: Mark);
}

/// Takes from `bucket` as much of `want` as it admits now; returns how much it took.
pub fn take_up_to(bucket: &mut impl Bucket, want: u64) -> u64 {
    if want == 0 {
        return 0;
    }
    let n = want.min(bucket.decide(0).remaining);
    if n > 0 && bucket.decide(n).allowed {
        n
    } else {
        0
    }
}

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settlement {
    /// Given back to the bucket (the estimate was higher).
    pub given_back: u64,
    /// Taken from the bucket now (the actual cost was higher and the bucket admitted it).
    pub taken: u64,
    /// The rest of the overshoot, owed: the caller adds it to its [`Debts`].
    pub owed: u64,
}

/// Settles reservation `r` at its `actual` cost on `bucket`: a lower cost gives the
/// difference back under the reservation's mark; a higher one takes what the bucket admits
/// now — nothing while it is `indebted` already, since debts are repaid first — and the rest
/// is owed.
pub fn settle(
    bucket: &mut impl Bucket,
    r: &Reservation,
    actual: u64,
    indebted: bool,
) -> Settlement {
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
    let taken = if indebted {
        0
    } else {
        take_up_to(bucket, extra)
    };
    Settlement {
        given_back: 0,
        taken,
        owed: extra - taken,
    }
}

#[cfg(test)]
mod tests;
