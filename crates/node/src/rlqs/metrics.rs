//! RLQS as metrics, read at scrape time.

use super::Rlqs;
use crate::metrics::{Family, Series, load};

/// This node's streams, their buckets and what was pushed to them.
pub const METRICS: &[Family<Rlqs>] = &[
    Family::gauge(
        "rlqs_streams",
        "Envoy RLQS streams open at this node.",
        |r| r.streams() as u64,
    ),
    Family::gauge(
        "rlqs_buckets",
        "Buckets reported on the RLQS streams open at this node.",
        |r| r.buckets() as u64,
    ),
    Family::gauge(
        "rlqs_owned_buckets",
        "RLQS buckets whose shares this node splits, as their owner.",
        |r| r.owner.buckets() as u64,
    ),
    Family::counter_by(
        "rlqs_assignments",
        "Quota assignments pushed to Envoys, by strategy: token_bucket (a share of a rule's rate), allow_all, deny_all.",
        "strategy",
        &[
            ("token_bucket", |r| load(&r.stats.assignments_token_bucket)),
            ("allow_all", |r| load(&r.stats.assignments_allow_all)),
            ("deny_all", |r| load(&r.stats.assignments_deny_all)),
        ],
    ),
    Family::counter(
        "rlqs_abandons",
        "Buckets abandoned: no entry of --rlqs-config matches them (or no longer does), or no request for a minute.",
        |r| load(&r.stats.abandons),
    ),
    Family::counter(
        "rlqs_ended_assignments",
        "Assignments ended (TTL 0) as this node stopped, so that Envoys fall back and connect to another node.",
        |r| load(&r.stats.expired_on_stop),
    ),
    Family::counter(
        "rlqs_owner_unreachable",
        "Rounds in which a bucket owner did not answer this node's ask for shares (assignments kept as they were).",
        |r| load(&r.stats.owner_unreachable),
    ),
    Family::counter(
        "rlqs_dropped_streams",
        "RLQS streams closed because their Envoy read no assignments (its queue full).",
        |r| load(&r.stats.dropped_streams),
    ),
    Family::gauge(
        "rlqs_bytes",
        "Accounted bytes held by the RLQS streams open at this node (streams, bucket ids and keys, abandons not read yet); bounded by the node's RLQS byte budget.",
        |r| r.bytes() as u64,
    ),
    Family::gauge(
        "rlqs_clients",
        "Clients (source addresses) with an RLQS stream open at this node: each may hold its fair share of the node's RLQS budget when it is full.",
        |r| r.clients() as u64,
    ),
    Family::counter_by(
        "rlqs_refused_buckets",
        "New RLQS buckets refused, by reason: id_too_large (more pairs or bytes than a bucket id may have; not answered), stream_full (its stream holds its most buckets or bytes), client_share (the node is full and its client holds its fair share); the last two are abandoned.",
        "reason",
        &[
            ("id_too_large", |r| load(&r.stats.refused_id_too_large)),
            ("stream_full", |r| load(&r.stats.refused_stream_full)),
            ("client_share", |r| load(&r.stats.refused_client_share)),
        ],
    ),
    Family::counter_by(
        "rlqs_evicted",
        "What clients over their fair share gave way so that another client's bucket or stream could be admitted while the node's RLQS budget was full: buckets (abandoned) and streams (ended RESOURCE_EXHAUSTED).",
        "what",
        &[
            ("buckets", |r| load(&r.stats.evicted_buckets)),
            ("streams", |r| load(&r.stats.evicted_streams)),
        ],
    ),
    Family::counter(
        "rlqs_refused_streams",
        "RLQS streams refused (RESOURCE_EXHAUSTED) as they opened: the node's RLQS budget was full and their client held its fair share.",
        |r| load(&r.stats.refused_streams),
    ),
    Family::counter(
        "rlqs_invalid_reports",
        "RLQS usage reports that ended their stream with INVALID_ARGUMENT: no domain or another one than the stream's, a usage without a bucket id, or more requests than an Envoy can count in one reporting interval.",
        |r| load(&r.stats.invalid_reports),
    ),
    Family::counter_each(
        "rlqs_reported_requests",
        "Requests Envoys reported on this node's streams, by rule and outcome (allowed, denied): compare the rate of allowed with ringlimit_rlqs_limit_per_second.",
        &["rule", "outcome"],
        |r| {
            let by_rule = r.stats.by_rule.lock();
            by_rule
                .iter()
                .flat_map(|(rule, c)| {
                    [("allowed", c.allowed), ("denied", c.denied)]
                        .map(|(outcome, n)| Series::new([rule.as_str(), outcome], n))
                })
                .collect()
        },
    ),
    Family::gauge_each(
        "rlqs_limit_per_second",
        "The rate an RLQS rule's buckets are split from (its limit over its period), by rule.",
        &["rule"],
        |r| {
            let by_rule = r.stats.by_rule.lock();
            by_rule
                .iter()
                .map(|(rule, c)| Series::new([rule.as_str()], c.rate))
                .collect()
        },
    ),
];
