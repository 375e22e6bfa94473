//! Reservations at the bucket's owner (see `ringlimit_core::reserve`): a cost estimated now
//! (an LLM call's tokens) taken at once, settled later with the actual cost.
//!
//! Where each piece lives:
//! - the owner's table and debt ledger, in the [`Engine`] (`Engine::reserve`, `settle`,
//!   `repay`): every decision there looks at the ledger first, so a bucket in debt denies;
//! - this module: reserving and settling here as the owner, the same for a request that
//!   arrived here ([`crate::routing::Dispatcher::reserve`]) and for one a peer sent
//!   (`peers/server/reserve.rs`); the task that repays debts and sweeps expired reservations
//!   ([`upkeep`]); their metrics ([`ReservationCollector`]).
//!
//! A reservation lives where it was taken, never copied: an owner that dies loses its table,
//! and settles of its reservations are unknown (their estimates stay taken: never an
//! over-admission). Debts stay with the node that recorded them too.

use crate::engine::Engine;
use crate::metrics::{Kind, encode_family, encode_one, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use ringlimit_core::check::Resolved;
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_core::reserve::{self, Refused, ReserveError};
use ringlimit_proto::CheckAnswer;
use std::sync::Arc;
use std::time::Duration;

/// How often debts are repaid from what their buckets admit.
const REPAY_EVERY: Duration = Duration::from_millis(10);
/// Expired reservations are swept every this many repayment rounds (100 ms).
const SWEEP_EVERY: u32 = 10;

/// Reserves `cost` of bucket `id` under `resolved` here, as its owner, at `now` for `ttl_ms`
/// under `nonce`: the check's answer (denied: nothing kept).
pub fn reserve_here(
    engine: &Engine,
    resolved: &Resolved,
    id: u64,
    (cost, ttl_ms, nonce): (u64, u64, u128),
    now: u64,
) -> Result<CheckAnswer, ReserveError> {
    reserve::reservable(resolved)?;
    let ttl_ms = reserve::ttl_ms(Some(ttl_ms))?;
    let ttl_ns = ttl_ms.saturating_mul(NANOS_PER_MS);
    engine
        .reserve(id, &resolved.rule, cost, (nonce, ttl_ns), now)
        .map_err(|refused| match refused {
            Refused::Full(n) => ReserveError::TooMany(n),
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

/// Repays debts every [`REPAY_EVERY`] and sweeps expired reservations every 100 ms, until
/// dropped.
pub async fn upkeep(engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(REPAY_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round = 0u32;
    loop {
        tick.tick().await;
        let now = engine.clock().now();
        engine.repay(now);
        round = round.wrapping_add(1);
        if round.is_multiple_of(SWEEP_EVERY) && !engine.reservations().is_empty() {
            engine.sweep_reservations(now);
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
            Kind::Gauge,
            "reservation_debt_tokens",
            "Tokens this node's buckets owe now: settled above what they admitted, repaid from what they admit next (they deny until then).",
            self.0.debts().total(),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "reservation_debt_dropped_tokens",
            "Tokens of settles above what a bucket admitted that were not recorded as debt: the ledger held its most buckets in debt already (each may admit more than the rule).",
            load(&self.0.debts().dropped),
        )
    }
}
