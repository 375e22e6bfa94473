//! The routing's counters as metrics, read at scrape time.

use super::Router;
use crate::metrics::{Kind, encode_family, encode_one, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::Arc;

/// [`super::RoutingStats`] and whether this node owns keys now.
pub struct RoutingCollector(pub Arc<Router>);

impl std::fmt::Debug for RoutingCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoutingCollector")
    }
}

impl Collector for RoutingCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let d = &self.0;
        let s = &d.stats;
        let counter =
            |e: &mut DescriptorEncoder, name, help, v| encode_one(e, Kind::Counter, name, help, v);
        counter(
            &mut e,
            "forwarded",
            "Checks forwarded to their owner.",
            load(&s.forwarded),
        )?;
        counter(
            &mut e,
            "fail_open",
            "Checks answered from the local fallback share because the owner could not answer.",
            load(&s.fail_open),
        )?;
        counter(
            &mut e,
            "fail_closed",
            "Checks denied because the owner could not answer and the rule is on_owner_unreachable: closed.",
            load(&s.fail_closed),
        )?;
        counter(
            &mut e,
            "minority_checks",
            "Owner-mode checks answered without an owner because this node saw fewer than a majority of the cluster.",
            load(&s.minority),
        )?;
        counter(
            &mut e,
            "replica_checks",
            "Checks whose owner did not answer, decided by the owner's replica on its copy.",
            load(&s.replica),
        )?;
        counter(
            &mut e,
            "relayed",
            "Checks from peers relayed to their owner because this node had handed their bucket over.",
            load(&s.relayed),
        )?;
        counter(
            &mut e,
            "refunded_requests",
            "All-or-nothing requests denied whose admitted checks gave their cost back.",
            load(&s.refunded_requests),
        )?;
        counter(
            &mut e,
            "refunds_lost",
            "Refunds of all-or-nothing requests that could not reach their owner (the cost stays taken).",
            load(&s.refunds_lost),
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "leased_checks",
            "Checks of buckets other members own decided here on a lease: admitted on a slice, or denied as the owner said the bucket denies until then.",
            "result",
            &[
                ("allowed", load(&s.leased)),
                ("denied", load(&s.leased_denied)),
            ],
        )?;
        encode_one(
            &mut e,
            Kind::Gauge,
            "hot_keys",
            "Buckets this node forwards most that are hot: promoted at 1,000 checks/s, demoted below 500 (counted one forwarded check in 8, with bounded memory).",
            load(&s.hot.hot),
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "hot_key_changes",
            "Forwarded buckets promoted to hot, and demoted.",
            "change",
            &[
                ("promoted", load(&s.hot.promoted)),
                ("demoted", load(&s.hot.demoted)),
            ],
        )?;
        encode_one(
            &mut e,
            Kind::Gauge,
            "quorate",
            "1 while this node sees a majority of the members it last knew (and owns keys), else 0.",
            u64::from(d.owns_keys(&d.view())),
        )
    }
}
