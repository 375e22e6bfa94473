//! Reservations at the bucket's owner (see `ringlimit_core::reserve`): a cost estimated now
//! (an LLM call's tokens) taken at once, settled later with the actual cost.
//!
//! Where each piece lives:
//! - the owner's table, in the [`Engine`] (`Engine::reserve`, `settle`); a settle above the
//!   estimate takes the rest into the bucket's state (its debt: see
//!   `ringlimit_core::limiter`), so a bucket in debt denies wherever it is decided;
//! - this module: reserving and settling here as the owner, the same for a request that
//!   arrived here ([`crate::routing::Dispatcher::reserve`]) and for one a peer sent
//!   (`peers/server/reserve.rs`), with the node's bound on a reservation's life; the task that
//!   sweeps expired reservations ([`upkeep`]); their metrics ([`ReservationCollector`]).
//!
//! A reservation lives where it was taken, never copied: an owner that dies loses its table,
//! and settles of its reservations are unknown (their estimates stay taken: never an
//! over-admission). A debt is part of its bucket, so it goes to the bucket's replicas and next
//! owners with the bucket's state.

use super::Engine;
use crate::metrics::{Kind, encode_family, encode_one, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use ringlimit_core::check::Resolved;
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_core::limiter::{Decision, Rule};
use ringlimit_core::reserve::{self, Refused, ReserveError, Table, Tenant};
use ringlimit_core::reserve::{Found, Reservation};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Engine {
    /// This engine letting reservations live at most `ms` (`--max-reservation-ttl-ms`).
    pub fn with_max_reservation_ttl_ms(mut self, ms: u64) -> Self {
        self.max_ttl_ms = ms;
        self
    }

    /// The longest a reservation may live here, in ms.
    pub fn max_reservation_ttl_ms(&self) -> u64 {
        self.max_ttl_ms
    }

    /// Reserves `estimate` of bucket `id` (this node owns it) for `tenant` at `now` for
    /// `ttl_ns`, kept under `nonce`: the check's answer (denied: nothing kept), or why it was
    /// not kept (nothing taken then either). An estimate of 0 takes nothing, so nothing is
    /// kept: it is answered as a check of cost 0 (and its settle is unknown).
    pub fn reserve(
        &self,
        id: u64,
        (rule, tenant): (&Rule, Tenant),
        estimate: u64,
        (nonce, ttl_ns): (u128, u64),
        now: u64,
    ) -> Result<CheckAnswer, Refused> {
        if estimate == 0 {
            let answer = self.decide_at(id, rule, 0, now);
            self.count_denied(&answer);
            return Ok(answer);
        }
        if let Some(refused) = self.reservations.refuses(tenant) {
            return Err(refused);
        }
        let (answer, mark) = self.hold(id, rule, estimate, now);
        if !answer.allowed {
            self.count_denied(&answer);
            return Ok(answer);
        }
        let kept = Reservation {
            id,
            tenant,
            rule: *rule,
            estimate,
            mark,
            deadline: now.saturating_add(ttl_ns),
        };
        if let Err(refused) = self.reservations.insert(nonce, kept) {
            if let Some(mark) = mark {
                self.refund(id, rule, estimate, mark, now);
            }
            return Err(refused);
        }
        Ok(answer)
    }

    /// Counts a reservation the bucket denied (nothing kept).
    fn count_denied(&self, answer: &CheckAnswer) {
        if !answer.allowed {
            self.reservations
                .stats
                .denied
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Settles reservation `nonce` of bucket `id` at its `actual` cost at `now` (see
    /// [`reserve::settle`]): the bucket's answer afterwards (a read: in debt, it denies), or
    /// `None` when no such reservation is live here.
    ///
    /// A cost above the estimate is taken whatever the bucket admits: what it could not
    /// admit, it owes, in its own state.
    pub fn settle(
        &self,
        id: u64,
        rule: &Rule,
        nonce: u128,
        actual: u64,
        now: u64,
    ) -> Option<CheckAnswer> {
        let Found::Live(r) = self.reservations.take(nonce, id, now) else {
            return None;
        };
        let s = reserve::settle(&mut self.bucket(id, rule, now), &r, actual);
        if s.owed > 0 {
            self.debt.owed.fetch_add(s.owed, Ordering::Relaxed);
            self.debt.forgiven.fetch_add(s.forgiven, Ordering::Relaxed);
        }
        Some(self.decide_at(id, rule, 0, now))
    }

    /// Drops the reservations expired at `now` (their estimates stay taken); returns how
    /// many.
    pub fn sweep_reservations(&self, now: u64) -> u64 {
        self.reservations.sweep(now)
    }

    /// The live reservations of this node's buckets.
    pub fn reservations(&self) -> &Table {
        &self.reservations
    }

    /// Bucket `id` at `now`, as a settle decides on it.
    fn bucket<'a>(&'a self, id: u64, rule: &'a Rule, now: u64) -> Owned<'a> {
        Owned {
            engine: self,
            id,
            rule,
            now,
        }
    }
}

/// One of this node's buckets at one instant, for `ringlimit_core::reserve`.
struct Owned<'a> {
    engine: &'a Engine,
    id: u64,
    rule: &'a Rule,
    now: u64,
}

impl reserve::Bucket for Owned<'_> {
    fn decide(&mut self, cost: u64) -> Decision {
        self.engine.check_now(self.id, self.rule, cost, || self.now)
    }

    fn refund(&mut self, cost: u64, mark: Mark) {
        self.engine.refund(self.id, self.rule, cost, mark, self.now);
    }

    fn charge(&mut self, cost: u64) -> u64 {
        let e = self.engine;
        let seed = || e.copy_of(self.id);
        e.store.charge_seeded(
            ringlimit_core::store::Kind::Replicated,
            self.id,
            self.rule,
            self.now,
            cost,
            seed,
        )
    }
}

/// How often expired reservations are swept (their estimates stay taken; their slots free).
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// Reserves `cost` of bucket `id` under `resolved` here, as its owner, at `now` for `ttl_ms`
/// (at most the node's bound) under `nonce`: the check's answer (denied: nothing kept). The
/// reservation takes a slot of the rule's share of the table (see `reserve::Table::insert`);
/// one of cost 0 takes nothing and none.
pub fn reserve_here(
    engine: &Engine,
    resolved: &Resolved,
    id: u64,
    (cost, ttl_ms, nonce): (u64, u64, u128),
    now: u64,
) -> Result<CheckAnswer, ReserveError> {
    reserve::reservable(resolved)?;
    let ttl_ms = reserve::ttl_ms_within(Some(ttl_ms), engine.max_reservation_ttl_ms())?;
    let ttl_ns = ttl_ms.saturating_mul(NANOS_PER_MS);
    let tenant = Tenant::of(resolved);
    engine
        .reserve(id, (&resolved.rule, tenant), cost, (nonce, ttl_ns), now)
        .map_err(|refused| match refused {
            Refused::Share(_) => ReserveError::TooMany(format!(
                "the key's owner cannot keep another reservation now: {refused}; settle some, or retry when some expire"
            )),
            // A nonce is 128 random bits: only a client that reuses one gets here.
            Refused::Duplicate => {
                ReserveError::Check(ringlimit_core::check::CheckError::Rejected {
                    code: "invalid_request".into(),
                    message: "a reservation with this nonce is live already".into(),
                })
            }
        })
}

/// Settles reservation `nonce` of bucket `id` here at its actual `cost` at `now`: the
/// bucket's answer afterwards, or [`ReserveError::Unknown`].
pub fn settle_here(
    engine: &Engine,
    resolved: &Resolved,
    id: u64,
    (nonce, cost): (u128, u64),
    now: u64,
) -> Result<CheckAnswer, ReserveError> {
    reserve::reservable(resolved)?;
    engine
        .settle(id, &resolved.rule, nonce, cost, now)
        .ok_or(ReserveError::Unknown)
}

/// Sweeps expired reservations every [`SWEEP_EVERY`], until dropped. (Debts need no task:
/// time repays them, in the buckets' states.)
pub async fn upkeep(engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !engine.reservations().is_empty() {
            engine.sweep_reservations(engine.clock().now());
        }
    }
}

/// Reservations and debts as metrics, read at scrape time.
#[derive(Debug)]
pub struct ReservationCollector(pub Arc<Engine>);

impl Collector for ReservationCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let table = self.0.reservations();
        let s = &table.stats;
        encode_one(
            &mut e,
            Kind::Gauge,
            "reservations",
            "Reservations of this node's buckets kept now (reserved, neither settled nor swept after expiring).",
            table.len() as u64,
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "reservation_results",
            "What became of reservations at this node as owner: reserved, denied (the bucket denied the estimate: nothing kept), settled, expired (its estimate stays taken), and settles answered unknown (expired, settled already, or never issued).",
            "result",
            &[
                ("reserved", load(&s.reserved)),
                ("denied", load(&s.denied)),
                ("settled", load(&s.settled)),
                ("expired", load(&s.expired)),
                ("unknown", load(&s.unknown)),
            ],
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "reservation_debt_owed_tokens",
            "Tokens settled above what their buckets admitted at this node as owner: owed by those buckets, in their state (they deny until time has repaid it; the debt goes to their replicas and next owners with them).",
            load(&self.0.debt.owed),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "reservation_debt_forgiven_tokens",
            "Of the tokens owed, those beyond the most a bucket may owe (64 periods of its rule's limit), not kept (each may admit more than the rule).",
            load(&self.0.debt.forgiven),
        )
    }
}

#[cfg(test)]
mod tests;
