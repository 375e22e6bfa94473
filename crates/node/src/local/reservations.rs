//! Reservations at the bucket's owner (see `ringlimit_core::reservations`): a cost estimated now
//! (an LLM call's tokens) taken at once, settled later with the actual cost.
//!
//! The owner's table, with the node's bound on a reservation's life, is [`Reservations`]; it
//! reserves and settles on one bucket (a `ringlimit_core::reservations::Bucket`: `Local::reserve` and
//! `Local::settle` hand it the owned bucket), the same for a request that arrived here
//! (`crate::routing::Router::reserve`) and for one a peer sent (`peers/server/reservations.rs`).
//! A settle above the estimate takes the rest into the bucket's state (its debt: see
//! `ringlimit_core::limiter`), so a bucket in debt denies wherever it is decided. Beside the
//! table: the task that sweeps expired reservations ([`upkeep`]) and their metrics
//! ([`METRICS`]).
//!
//! A reservation lives where it was taken, never copied: an owner that dies loses its table,
//! and settles of its reservations are unknown (their estimates stay taken: never an
//! over-admission). A debt is part of its bucket, so it goes to the bucket's replicas and next
//! owners with the bucket's state.

use super::owned::taken;
use crate::metrics::{Family, load};
use ringlimit_core::answer::answer;
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::clock::{Clock, NANOS_PER_MS};
use ringlimit_core::reservations::{
    Bucket, Found, Refused, Reservation, ReserveError, Settlement, Table, Tenant,
};
use ringlimit_proto::CheckAnswer;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often expired reservations are swept (their estimates stay taken; their slots free).
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// The live reservations of this node's buckets.
#[derive(Debug)]
pub struct Reservations {
    table: Table,
    /// The longest a reservation may live here (`--max-reservation-ttl-ms`).
    max_ttl_ms: u64,
}

impl Default for Reservations {
    fn default() -> Self {
        Self::new(ringlimit_core::reservations::DEFAULT_MAX_TTL_MS)
    }
}

impl Reservations {
    /// A table letting reservations live at most `max_ttl_ms` (`--max-reservation-ttl-ms`).
    pub fn new(max_ttl_ms: u64) -> Self {
        Self {
            table: Table::new(ringlimit_core::reservations::MOST_RESERVATIONS),
            max_ttl_ms,
        }
    }

    /// The longest a reservation may live here, in ms.
    pub fn max_ttl_ms(&self) -> u64 {
        self.max_ttl_ms
    }

    /// The live reservations.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Reserves `cost` of `bucket` (bucket `id` under `resolved`, which this node owns) at
    /// `now` for `ttl_ms` (at most the node's bound) under `nonce`: the check's answer
    /// (denied: nothing kept), or why it was not kept (nothing taken then either). The
    /// reservation takes a slot of the rule's share of the table (see `ringlimit_core::reservations::Table::insert`);
    /// one of cost 0 takes nothing and none: it is answered as a check of cost 0 (and its
    /// settle is unknown).
    pub fn reserve(
        &self,
        bucket: &mut impl Bucket,
        (id, resolved): (u64, &Resolved),
        (cost, ttl_ms, nonce): (u64, u64, u128),
        now: u64,
    ) -> Result<CheckAnswer, ReserveError> {
        ringlimit_core::reservations::reservable(resolved)?;
        let ttl_ms = ringlimit_core::reservations::ttl_ms_within(Some(ttl_ms), self.max_ttl_ms)?;
        let ttl_ns = ttl_ms.saturating_mul(NANOS_PER_MS);
        let (rule, tenant) = (&resolved.rule, Tenant::of(resolved));
        if cost == 0 {
            let answer = answer(&bucket.decide(0), rule);
            self.count_denied(&answer);
            return Ok(answer);
        }
        if let Some(refused) = self.table.refuses(tenant) {
            return Err(not_kept(refused));
        }
        let d = bucket.decide(cost);
        let (answer, mark) = (answer(&d, rule), taken(&d, cost, now));
        if !answer.allowed {
            self.count_denied(&answer);
            return Ok(answer);
        }
        let kept = Reservation {
            id,
            tenant,
            rule: *rule,
            estimate: cost,
            mark,
            deadline: now.saturating_add(ttl_ns),
        };
        if let Err(refused) = self.table.insert(nonce, kept) {
            if let Some(mark) = mark {
                bucket.refund(cost, mark);
            }
            return Err(not_kept(refused));
        }
        Ok(answer)
    }

    /// Counts a reservation the bucket denied (nothing kept).
    fn count_denied(&self, answer: &CheckAnswer) {
        if !answer.allowed {
            self.table.stats.denied.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Settles reservation `nonce` of `bucket` (bucket `id` under `resolved`) at its `actual`
    /// cost at `now` (see [`ringlimit_core::reservations::settle`]): the bucket's answer afterwards (a read: in
    /// debt, it denies) and what the settle did, or [`ReserveError::Unknown`] when no such
    /// reservation is live here.
    ///
    /// A cost above the estimate is taken whatever the bucket admits: what it could not
    /// admit, it owes, in its own state.
    pub fn settle(
        &self,
        bucket: &mut impl Bucket,
        (id, resolved): (u64, &Resolved),
        (nonce, actual): (u128, u64),
        now: u64,
    ) -> Result<(CheckAnswer, Settlement), ReserveError> {
        ringlimit_core::reservations::reservable(resolved)?;
        let Found::Live(r) = self.table.take(nonce, id, now) else {
            return Err(ReserveError::Unknown);
        };
        let s = ringlimit_core::reservations::settle(bucket, &r, actual);
        Ok((answer(&bucket.decide(0), &resolved.rule), s))
    }

    /// Drops the reservations expired at `now` (their estimates stay taken); returns how
    /// many.
    pub fn sweep(&self, now: u64) -> u64 {
        self.table.sweep(now)
    }
}

/// Why a reservation was not kept, as the client is told.
fn not_kept(refused: Refused) -> ReserveError {
    match refused {
        Refused::Share(_) => ReserveError::TooMany(format!(
            "the key's owner cannot keep another reservation now: {refused}; settle some, or retry when some expire"
        )),
        // A nonce is 128 random bits: only a client that reuses one gets here.
        Refused::Duplicate => ReserveError::Check(CheckError::Rejected {
            code: "invalid_request".into(),
            message: "a reservation with this nonce is live already".into(),
        }),
    }
}

/// Sweeps expired reservations every [`SWEEP_EVERY`], until dropped. (Debts need no task:
/// time repays them, in the buckets' states.)
pub async fn upkeep(reservations: Arc<Reservations>, clock: Arc<dyn Clock>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !reservations.table.is_empty() {
            reservations.sweep(clock.now());
        }
    }
}

/// Reservations as metrics, read at scrape time.
pub const METRICS: &[Family<Reservations>] = &[
    Family::gauge(
        "reservations",
        "Reservations of this node's buckets kept now (reserved, neither settled nor swept after expiring).",
        |r| r.table.len() as u64,
    ),
    Family::counter_by(
        "reservation_results",
        "What became of reservations at this node as owner: reserved, denied (the bucket denied the estimate: nothing kept), settled, expired (its estimate stays taken), and settles answered unknown (expired, settled already, or never issued).",
        "result",
        &[
            ("reserved", |r| load(&r.table.stats.reserved)),
            ("denied", |r| load(&r.table.stats.denied)),
            ("settled", |r| load(&r.table.stats.settled)),
            ("expired", |r| load(&r.table.stats.expired)),
            ("unknown", |r| load(&r.table.stats.unknown)),
        ],
    ),
];

#[cfg(test)]
mod tests;
