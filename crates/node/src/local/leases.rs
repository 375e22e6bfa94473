//! Leases (see `ringlimit_core::lease`): slices of this node's buckets granted to other members
//! and SDKs (the owner's side, `peers/server/lease.rs` asks), and the slices of other owners'
//! buckets held here (the holder's side: `crate::leases` asks owners for them); both tables,
//! and as metrics with the asking task's counters.

use crate::metrics::{Kind, encode_family, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use ringlimit_core::answer::answer;
use ringlimit_core::clock::Clock;
use ringlimit_core::lease::asking::LeaseStats;
use ringlimit_core::lease::{self, Grants, Held, LeaseSettings, Release};
use ringlimit_core::limiter::{Decision, Rule};
use ringlimit_proto::peer::LeaseGrant;
use std::sync::Arc;

/// Most slices out on lease at once (a few bytes each, and a name).
const MOST_SLICES: usize = 16 * 1024;

/// Both sides' tables of leases.
#[derive(Debug)]
pub struct Leases {
    /// Slices of this node's buckets out on lease.
    grants: Grants,
    /// Slices of other owners' buckets held here: checks take from it in `crate::routing`
    /// (`Route::Leased`), hot keys are wanted and released by `routing::hot`'s tick.
    held: Arc<Held>,
}

impl Default for Leases {
    fn default() -> Self {
        Self {
            grants: Grants::new(MOST_SLICES),
            held: Arc::new(Held::new(LeaseSettings::default())),
        }
    }
}

impl Leases {
    /// Answers `holder`'s ask for `want` tokens of bucket `id` (this node owns it) under `rule`
    /// at `now`: a slice taken from the bucket at once through `check` (a check of that many
    /// tokens; 0: a read), sized among its holders and what is left (see [`lease::grant`]),
    /// or a refusal (an algorithm that is not leased; the bucket denies).
    pub fn grant(
        &self,
        id: u64,
        rule: &Rule,
        (holder, want): (&str, u64),
        now: u64,
        check: impl Fn(u64) -> Decision,
    ) -> LeaseGrant {
        if !lease::leasable(rule.algorithm) {
            return LeaseGrant::Refused {
                answer: answer(&check(0), rule),
            };
        }
        self.grants.grant(id, holder, now, |holders| {
            lease::grant(rule, want, holders, now, check(0), &check)
        })
    }

    /// The slices of other owners' buckets this node holds.
    pub fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// Slices out on lease at `now`, and their tokens as granted.
    pub fn out(&self, now: u64) -> (usize, u64) {
        self.grants.live(now)
    }

    /// Forgets buckets `ids` on both sides (a reset): their grants, and their held slices
    /// revoked (unspent tokens go with the bucket).
    pub fn forget(&self, ids: &[u64]) {
        self.grants.forget(ids);
        for &id in ids {
            self.held.release(id, Release::Revoked);
        }
    }
}

/// The leases' tables and the asking task's counters.
pub struct LeaseCollector {
    pub leases: Arc<Leases>,
    /// What "not yet expired" is read on.
    pub clock: Arc<dyn Clock>,
    pub stats: Arc<LeaseStats>,
}

impl std::fmt::Debug for LeaseCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseCollector")
    }
}

impl Collector for LeaseCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let held = self.leases.held();
        let (granted, granted_tokens) = self.leases.out(self.clock.now());
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
