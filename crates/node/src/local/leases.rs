//! Leases (see `ringlimit_core::lease`): slices of this node's buckets granted to other members
//! and SDKs (the owner's side, `peers/server/lease.rs` asks), and the slices of other owners'
//! buckets held here (the holder's side: `crate::leases` asks owners for them); both tables,
//! and as metrics with the asking task's counters.

use crate::metrics::{Family, load};
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

/// What the leases' metrics read: both tables, and the asking task's counters.
pub struct LeaseCounts {
    pub leases: Arc<Leases>,
    /// What "not yet expired" is read on.
    pub clock: Arc<dyn Clock>,
    pub stats: Arc<LeaseStats>,
}

impl LeaseCounts {
    /// Slices granted by this node and not yet expired, and their tokens as granted.
    fn granted(&self) -> (usize, u64) {
        self.leases.out(self.clock.now())
    }
}

/// Both tables and the asking task's counters as metrics, read at scrape time.
pub const METRICS: &[Family<LeaseCounts>] = &[
    Family::gauge_by(
        "leases",
        "Leases of hot buckets: held here (buckets other members own whose checks this node decides on slices), and slices of this node's buckets granted to others and not yet expired.",
        "side",
        &[
            ("held", |l| l.leases.held().count() as u64),
            ("granted", |l| l.granted().0 as u64),
        ],
    ),
    Family::gauge_by(
        "leased_tokens",
        "Tokens out on lease: unspent in the slices held here, and granted by this node in slices not yet expired (as granted: holders may have spent them).",
        "side",
        &[
            ("held", |l| l.leases.held().tokens()),
            ("granted", |l| l.granted().1),
        ],
    ),
    Family::counter_by(
        "lease_revocations",
        "Leases held here dropped before they cooled: the bucket was reset (its unspent tokens are gone with it), or the ring changed (its owner may have; the unspent tokens go back).",
        "reason",
        &[
            ("reset", |l| l.leases.held().released(Release::Revoked)),
            ("ring", |l| l.leases.held().released(Release::Ring)),
        ],
    ),
    Family::counter_by(
        "lease_asks",
        "This node's asks for slices, by the owner's answer: granted, refused because the bucket denies (checks are denied here until then), refused otherwise (kept by the owner, not leasable, too many holders), or unanswered.",
        "result",
        &[
            ("granted", |l| load(&l.stats.granted)),
            ("denied", |l| load(&l.stats.denied)),
            ("refused", |l| load(&l.stats.refused)),
            ("unanswered", |l| load(&l.stats.unanswered)),
        ],
    ),
    Family::counter_by(
        "lease_tokens",
        "Tokens in slices granted to this node, given back unspent to their owners, and lost on the way back (they stay taken: under-admission only).",
        "what",
        &[
            ("granted", |l| load(&l.stats.tokens_granted)),
            ("returned", |l| load(&l.stats.tokens_returned)),
            ("lost", |l| load(&l.stats.tokens_lost)),
        ],
    ),
];
