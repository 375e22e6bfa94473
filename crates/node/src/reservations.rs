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

use crate::engine::Engine;
use crate::metrics::{Kind, encode_family, encode_one, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use ringlimit_core::check::Resolved;
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_core::reserve::{self, Refused, ReserveError, Tenant};
use ringlimit_proto::CheckAnswer;
use std::sync::Arc;
use std::time::Duration;

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
