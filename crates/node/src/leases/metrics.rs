//! Leases as metrics, read at scrape time: both sides' tables (held here, granted by this node
//! as owner) and the asking task's counters.

use crate::engine::Engine;
use crate::metrics::{Kind, encode_family, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use ringlimit_core::lease::Release;
use ringlimit_core::lease::asking::LeaseStats;
use std::sync::Arc;

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
