//! Reservations for costs known afterwards (an LLM call's tokens): [`Client::reserve`] takes an
//! estimate at the bucket's owner before the work, [`Reservation::settle`] gives the actual
//! cost after it (the difference is given back, or taken: the bucket may go into debt, which
//! denies its next checks until repaid).
//!
//! ```no_run
//! # async fn example(client: ringlimit_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use ringlimit_client::{Reserve, RuleRef};
//! use std::time::Duration;
//!
//! let rule = RuleRef::Named("llm-tokens".into());
//! match client.reserve("team:42", rule, 4_000, Duration::from_secs(120)).await? {
//!     Reserve::Granted(reservation) => {
//!         let used = 2_712; // the model's reported usage
//!         let after = reservation.settle(used).await?;
//!         println!("{} tokens left this minute", after.remaining);
//!     }
//!     Reserve::Denied(answer) => println!("429: retry in {} ms", answer.retry_after_ms),
//! }
//! # Ok(()) }
//! ```
//!
//! Unlike checks, reservations never fall back: they live at the bucket's owner, so without an
//! owner (none known, none answering) they are [`ReserveError::Unavailable`]. A reservation
//! dropped without a settle keeps its estimate (as if it expired): nothing is sent.

use crate::check::Check;
use crate::client::Client;
use ringlimit_core::link::reservations as link;
use ringlimit_core::reservations::{reservable, ttl_ms};
use ringlimit_proto::peer::{PeerReserve, PeerSettle};
use ringlimit_proto::reservation::ReservationId;
use ringlimit_proto::{CheckAnswer, RuleRef};
use std::time::Duration;

pub use ringlimit_core::reservations::ReserveError;

/// What a reserve came to.
#[derive(Debug)]
pub enum Reserve {
    /// The estimate is taken: settle it once the actual cost is known.
    Granted(Reservation),
    /// Denied as a check of the estimate would be: nothing taken, nothing kept.
    Denied(CheckAnswer),
}

/// A reservation taken: settle it with the actual cost. Dropped unsettled, it keeps its
/// estimate until it expires at the owner (nothing to do: the owner sweeps it).
#[derive(Debug)]
#[must_use = "a reservation is settled with the actual cost; dropped, it keeps its estimate"]
pub struct Reservation {
    client: Client,
    id: String,
    /// The estimate taken.
    pub estimate: u64,
    /// The check's answer to the estimate.
    pub answer: CheckAnswer,
}

impl Reservation {
    /// Its id, as the HTTP API's `POST /v1/settle` takes it (any node, or
    /// [`Client::settle`], can settle it).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Settles at the `actual` cost: the bucket's answer afterwards (in debt, `allowed:
    /// false` until repaid).
    pub async fn settle(self, actual: u64) -> Result<CheckAnswer, ReserveError> {
        self.client.settle(&self.id, actual).await
    }
}

impl Client {
    /// Reserves `estimate` of `key`'s bucket under `rule` for `ttl` (whole milliseconds, from
    /// 1 ms to the owner's bound: 10 minutes unless its `--max-reservation-ttl-ms` says
    /// otherwise, never over an hour) at the bucket's owner. An estimate of 0 takes nothing and
    /// is kept nowhere: it answers whether one more would be admitted, and settling it is
    /// [`ReserveError::Unknown`].
    pub async fn reserve(
        &self,
        key: impl Into<String>,
        rule: RuleRef,
        estimate: u64,
        ttl: Duration,
    ) -> Result<Reserve, ReserveError> {
        let ttl_ms = ttl_ms(Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)))?;
        let check = Check {
            key: key.into(),
            rule,
            cost: estimate,
        };
        let addr = self.owner_addr(&check).await?;
        let nonce: u128 = rand::random();
        let ask = PeerReserve {
            key: check.key.clone(),
            rule: check.rule.clone(),
            cost: estimate,
            ttl_ms,
            nonce,
        };
        let answer = link::reserve(&self.inner.reservations, &addr, ask).await?;
        if !answer.allowed {
            return Ok(Reserve::Denied(answer));
        }
        let id = ReservationId {
            key: check.key,
            rule: check.rule,
            nonce,
        };
        Ok(Reserve::Granted(Reservation {
            client: self.clone(),
            id: id.encode(),
            estimate,
            answer,
        }))
    }

    /// Settles reservation `id` (taken through this client or any node) at its `actual`
    /// cost. An id that is not one is unknown, like an expired one.
    pub async fn settle(&self, id: &str, actual: u64) -> Result<CheckAnswer, ReserveError> {
        let id = ReservationId::decode(id).ok_or(ReserveError::Unknown)?;
        let check = Check {
            key: id.key,
            rule: id.rule,
            cost: actual,
        };
        let addr = self.owner_addr(&check).await?;
        let settle = PeerSettle {
            key: check.key,
            rule: check.rule,
            nonce: id.nonce,
            cost: actual,
        };
        link::settle(&self.inner.reservations, &addr, settle).await
    }

    /// The peer address of `check`'s bucket's owner (the check validated, its rule
    /// reservable).
    async fn owner_addr(&self, check: &Check) -> Result<String, ReserveError> {
        let topo = self.inner.topology.load_full();
        let (topo, p) = self.prepare(topo, check).await?;
        let Some(resolved) = p.known else {
            return Err(ReserveError::Unavailable(
                "no cluster member reached yet".into(),
            ));
        };
        reservable(&resolved)?;
        topo.ring
            .owner(p.id)
            .and_then(|owner| topo.peers.get(owner))
            .map(|m| m.peer_addr.clone())
            .ok_or_else(|| {
                self.inner.wake.notify_one();
                ReserveError::Unavailable("no cluster member alive".into())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::unreachable;
    use ringlimit_core::check::CheckError;
    use ringlimit_proto::{Algorithm, InlineRule};

    fn inline(limit: u64) -> RuleRef {
        RuleRef::Inline(InlineRule {
            limit,
            period_ms: 60_000,
            algorithm: Algorithm::TokenBucket,
            burst: None,
            calendar: None,
        })
    }

    #[tokio::test]
    async fn without_an_owner_nothing_is_reserved_and_the_reason_is_given() {
        let client = unreachable(Client::builder()).await;
        let minute = Duration::from_secs(60);
        let named = client
            .reserve("k", RuleRef::Named("llm".into()), 10, minute)
            .await;
        assert!(
            matches!(&named, Err(ReserveError::Unavailable(why)) if why == "no cluster member reached yet"),
            "{named:?}"
        );
        let inline_rule = client.reserve("k", inline(100), 10, minute).await;
        assert!(
            matches!(&inline_rule, Err(ReserveError::Unavailable(why)) if why == "no cluster member alive"),
            "{inline_rule:?}"
        );
        // Reservations never fall back: the fallback holds nothing.
        assert_eq!(client.stats().fallback_buckets, 0);
    }

    #[tokio::test]
    async fn what_cannot_be_reserved_is_refused_before_any_owner_is_asked() {
        let client = unreachable(Client::builder()).await;
        for ttl in [Duration::ZERO, Duration::from_secs(3_601)] {
            let r = client.reserve("k", inline(100), 10, ttl).await;
            assert!(matches!(r, Err(ReserveError::Ttl { .. })), "{ttl:?}: {r:?}");
        }
        let minute = Duration::from_secs(60);
        let r = client.reserve("", inline(100), 10, minute).await;
        assert!(
            matches!(r, Err(ReserveError::Check(CheckError::InvalidKey(0)))),
            "{r:?}"
        );
        let r = client.reserve("k", inline(100), 101, minute).await;
        assert!(
            matches!(
                r,
                Err(ReserveError::Check(CheckError::CostTooLarge {
                    cost: 101,
                    ..
                }))
            ),
            "{r:?}"
        );
        // A string that is not an id is unknown, like an expired one.
        for id in ["", "not-an-id", "%%%"] {
            assert!(
                matches!(client.settle(id, 1).await, Err(ReserveError::Unknown)),
                "{id:?}"
            );
        }
    }
}
