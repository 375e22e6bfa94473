//! Leases: slices of this node's buckets granted to other members (the owner's side), and the
//! slices of other owners' buckets held here (the holder's side); both tables, and as metrics
//! with the asking task's counters.

use super::Engine;
use crate::metrics::{Kind, encode_family, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use ringlimit_core::answer::answer;
use ringlimit_core::lease::Release;
use ringlimit_core::lease::asking::LeaseStats;
use ringlimit_core::lease::{self, Held};
use ringlimit_core::limiter::Rule;
use ringlimit_proto::peer::LeaseGrant;
use std::sync::Arc;

impl Engine {
    /// Answers `holder`'s ask for `want` tokens of bucket `id` (this node owns it) at `now`:
    /// a slice taken from the bucket at once, sized among its holders and what is left (see
    /// [`lease::grant`]), or a refusal (an algorithm that is not leased; the bucket denies).
    pub fn lease(&self, id: u64, rule: &Rule, holder: &str, want: u64, now: u64) -> LeaseGrant {
        let peek = || self.check_now(id, rule, 0, || now);
        if !lease::leasable(rule.algorithm) {
            return LeaseGrant::Refused {
                answer: answer(&peek(), rule),
            };
        }
        self.grants.grant(id, holder, now, |holders| {
            lease::grant(rule, want, holders, now, peek(), |n| {
                self.check_now(id, rule, n, || now)
            })
        })
    }

    /// The slices of other owners' buckets this node holds.
    pub fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// Slices out on lease now, and their tokens as granted.
    pub fn leases_out(&self) -> (usize, u64) {
        self.grants.live(self.clock.now())
    }
}

/// The leases' tables and the asking task's counters.
#[derive(Debug)]
pub struct LeaseCollector {
    pub engine: Arc<Engine>,
    pub stats: Arc<LeaseStats>,
}

impl Collector for LeaseCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let held = self.engine.held();
        let (granted, granted_tokens) = self.engine.leases_out();
        let s = &self.stats;
        encode_family(
            &mut e,
            Kind::Gauge,
            "leases",
            "Leases of hot buckets: held here (buckets other members own whose checks this node decides on slices), and slices of this node's buckets granted to others and not yet expired.",
            "side",
            &[("held", held.count() as u64), ("granted", granted as u64)],
        )?;
        encode_family(
            &mut e,
            Kind::Gauge,
            "leased_tokens",
            "Tokens out on lease: unspent in the slices held here, and granted by this node in slices not yet expired (as granted: holders may have spent them).",
            "side",
            &[("held", held.tokens()), ("granted", granted_tokens)],
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "lease_revocations",
            "Leases held here dropped before they cooled: the bucket was reset (its unspent tokens are gone with it), or the ring changed (its owner may have; the unspent tokens go back).",
            "reason",
            &[
                ("reset", held.released(Release::Revoked)),
                ("ring", held.released(Release::Ring)),
            ],
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "lease_asks",
            "This node's asks for slices, by the owner's answer: granted, refused because the bucket denies (checks are denied here until then), refused otherwise (kept by the owner, not leasable, too many holders), or unanswered.",
            "result",
            &[
                ("granted", load(&s.granted)),
                ("denied", load(&s.denied)),
                ("refused", load(&s.refused)),
                ("unanswered", load(&s.unanswered)),
            ],
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "lease_tokens",
            "Tokens in slices granted to this node, given back unspent to their owners, and lost on the way back (they stay taken: under-admission only).",
            "what",
            &[
                ("granted", load(&s.tokens_granted)),
                ("returned", load(&s.tokens_returned)),
                ("lost", load(&s.tokens_lost)),
            ],
        )
    }
}
