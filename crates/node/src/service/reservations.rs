//! Reservations for costs known afterwards (`POST /v1/reserve`, `POST /v1/settle`): a check
//! of an estimated cost that is remembered at the bucket's owner, and settled later with the
//! actual cost (see `crate::local::reservations`). The id a client gets back names the bucket and
//! the owner's nonce, so any node can route its settle.

use super::{Check, CheckService, Edge, Outcome};
use crate::rules::RuleSpec;
use ringlimit_core::reservations::ReserveError;
use ringlimit_proto::RuleRef;
use ringlimit_proto::reservation::ReservationId;

/// A reservation taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    /// Its id, for the settle.
    pub id: String,
    /// The estimate taken.
    pub cost: u64,
    pub outcome: Outcome,
}

/// What a reserve came to: taken, or denied as a check is (nothing kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    Reserved(Reserved),
    Denied(Outcome),
}

/// A settled reservation: the bucket's answer afterwards, and its rule (for the headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub outcome: Outcome,
    pub rule: RuleRef,
}

impl CheckService {
    /// Reserves `c.cost` (the estimate) for `ttl_ms` (`None`: 60 s; at most this node's bound,
    /// `--max-reservation-ttl-ms`, which the owner checks again against its own) at the
    /// bucket's owner; counted as a check that arrived at `edge`.
    pub async fn reserve(
        &self,
        edge: Edge,
        c: &Check<'_>,
        ttl_ms: Option<u64>,
    ) -> Result<Reservation, ReserveError> {
        let ttl_ms = ringlimit_core::reservations::ttl_ms_within(
            ttl_ms,
            self.local.reservations().max_ttl_ms(),
        )?;
        let p = self.prepare(c, c.cost)?;
        ringlimit_core::reservations::reservable(&p.resolved)?;
        let nonce: u128 = rand::random();
        let answer = self.router.reserve(&p, ttl_ms, nonce).await?;
        let outcome = self.outcome(answer, &p, self.local.now());
        self.metrics.count_edge(edge, 1);
        if !answer.allowed {
            return Ok(Reservation::Denied(outcome));
        }
        let id = ReservationId {
            key: c.key.to_owned(),
            rule: c.rule.to_ref(),
            nonce,
        };
        Ok(Reservation::Reserved(Reserved {
            id: id.encode(),
            cost: c.cost,
            outcome,
        }))
    }

    /// Settles reservation `reservation` at its actual `cost`: the bucket's answer after the
    /// difference was given back or taken. An id that is not one is unknown, like an expired
    /// one.
    pub async fn settle(&self, reservation: &str, cost: u64) -> Result<Settled, ReserveError> {
        let id = ReservationId::decode(reservation).ok_or(ReserveError::Unknown)?;
        let check = Check {
            key: &id.key,
            rule: RuleSpec::of(&id.rule),
            cost,
            shadow: false,
        };
        let p = self.prepare(&check, cost)?;
        ringlimit_core::reservations::reservable(&p.resolved)?;
        let answer = self.router.settle(&p, id.nonce).await?;
        let outcome = Outcome::new(answer, &p.resolved, self.local.now());
        Ok(Settled {
            outcome,
            rule: id.rule,
        })
    }
}
