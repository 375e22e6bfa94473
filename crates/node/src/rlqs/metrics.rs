//! RLQS as metrics, read at scrape time.

use super::Rlqs;
use crate::metrics::{Kind, encode_family, encode_one, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::Arc;

/// This node's streams, their buckets and what was pushed to them.
#[derive(Clone)]
pub struct RlqsCollector(pub Arc<Rlqs>);

impl std::fmt::Debug for RlqsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RlqsCollector")
    }
}

impl Collector for RlqsCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = &self.0;
        let s = &r.stats;
        encode_one(
            &mut e,
            Kind::Gauge,
            "rlqs_streams",
            "Envoy RLQS streams open at this node.",
            r.streams() as u64,
        )?;
        encode_one(
            &mut e,
            Kind::Gauge,
            "rlqs_buckets",
            "Buckets reported on the RLQS streams open at this node.",
            r.buckets() as u64,
        )?;
        encode_one(
            &mut e,
            Kind::Gauge,
            "rlqs_owned_buckets",
            "RLQS buckets whose shares this node splits, as their owner.",
            r.owner.buckets() as u64,
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "rlqs_assignments",
            "Quota assignments pushed to Envoys, by strategy: token_bucket (a share of a rule's rate), allow_all, deny_all.",
            "strategy",
            &[
                ("token_bucket", load(&s.assignments_token_bucket)),
                ("allow_all", load(&s.assignments_allow_all)),
                ("deny_all", load(&s.assignments_deny_all)),
            ],
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "rlqs_abandons",
            "Buckets abandoned: no entry of --rlqs-config matches them (or no longer does), or no request for a minute.",
            load(&s.abandons),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "rlqs_ended_assignments",
            "Assignments ended (TTL 0) as this node stopped, so that Envoys fall back and connect to another node.",
            load(&s.expired_on_stop),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "rlqs_owner_unreachable",
            "Rounds in which a bucket owner did not answer this node's ask for shares (assignments kept as they were).",
            load(&s.owner_unreachable),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "rlqs_dropped_streams",
            "RLQS streams closed because their Envoy read no assignments (its queue full).",
            load(&s.dropped_streams),
        )?;
        encode_one(
            &mut e,
            Kind::Gauge,
            "rlqs_bytes",
            "Accounted bytes held by the RLQS streams open at this node (streams, bucket ids and keys, abandons not read yet); bounded by the node's RLQS byte budget.",
            r.bytes() as u64,
        )?;
        encode_one(
            &mut e,
            Kind::Gauge,
            "rlqs_clients",
            "Clients (source addresses) with an RLQS stream open at this node: each may hold its fair share of the node's RLQS budget when it is full.",
            r.clients() as u64,
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "rlqs_refused_buckets",
            "New RLQS buckets refused, by reason: id_too_large (more pairs or bytes than a bucket id may have; not answered), stream_full (its stream holds its most buckets or bytes), client_share (the node is full and its client holds its fair share); the last two are abandoned.",
            "reason",
            &[
                ("id_too_large", load(&s.refused_id_too_large)),
                ("stream_full", load(&s.refused_stream_full)),
                ("client_share", load(&s.refused_client_share)),
            ],
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "rlqs_evicted",
            "What clients over their fair share gave way so that another client's bucket or stream could be admitted while the node's RLQS budget was full: buckets (abandoned) and streams (ended RESOURCE_EXHAUSTED).",
            "what",
            &[
                ("buckets", load(&s.evicted_buckets)),
                ("streams", load(&s.evicted_streams)),
            ],
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "rlqs_refused_streams",
            "RLQS streams refused (RESOURCE_EXHAUSTED) as they opened: the node's RLQS budget was full and their client held its fair share.",
            load(&s.refused_streams),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "rlqs_invalid_reports",
            "RLQS usage reports that ended their stream with INVALID_ARGUMENT: no domain or another one than the stream's, a usage without a bucket id, or more requests than an Envoy can count in one reporting interval.",
            load(&s.invalid_reports),
        )?;
        let rules: Vec<(String, super::RuleCounts)> = s
            .by_rule
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let mut m = e.encode_descriptor(
            "rlqs_reported_requests",
            "Requests Envoys reported on this node's streams, by rule and outcome (allowed, denied): compare the rate of allowed with ringlimit_rlqs_limit_per_second.",
            None,
            MetricType::Counter,
        )?;
        for (rule, c) in &rules {
            for (outcome, v) in [("allowed", c.allowed), ("denied", c.denied)] {
                ConstCounter::new(v)
                    .encode(m.encode_family(&[("rule", rule.as_str()), ("outcome", outcome)])?)?;
            }
        }
        let mut m = e.encode_descriptor(
            "rlqs_limit_per_second",
            "The rate an RLQS rule's buckets are split from (its limit over its period), by rule.",
            None,
            MetricType::Gauge,
        )?;
        for (rule, c) in &rules {
            ConstGauge::new(c.rate).encode(m.encode_family(&[("rule", rule.as_str())])?)?;
        }
        Ok(())
    }
}
