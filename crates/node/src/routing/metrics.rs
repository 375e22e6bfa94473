//! The routing's counters as metrics, read at scrape time.

use super::Router;
use crate::metrics::{Family, load};

/// [`super::RoutingStats`] and whether this node owns keys now.
pub const METRICS: &[Family<Router>] = &[
    Family::counter("forwarded", "Checks forwarded to their owner.", |r| {
        load(&r.stats.forwarded)
    }),
    Family::counter(
        "fail_open",
        "Checks answered from the local fallback share because the owner could not answer.",
        |r| load(&r.stats.fail_open),
    ),
    Family::counter(
        "fail_closed",
        "Checks denied because the owner could not answer and the rule is on_owner_unreachable: closed.",
        |r| load(&r.stats.fail_closed),
    ),
    Family::counter(
        "minority_checks",
        "Owner-mode checks answered without an owner because this node saw fewer than a majority of the cluster.",
        |r| load(&r.stats.minority),
    ),
    Family::counter(
        "replica_checks",
        "Checks whose owner did not answer, decided by the owner's replica on its copy.",
        |r| load(&r.stats.replica),
    ),
    Family::counter(
        "relayed",
        "Checks from peers relayed to their owner because this node had handed their bucket over.",
        |r| load(&r.stats.relayed),
    ),
    Family::counter(
        "refunded_requests",
        "All-or-nothing requests denied whose admitted checks gave their cost back.",
        |r| load(&r.stats.refunded_requests),
    ),
    Family::counter(
        "refunds_lost",
        "Refunds of all-or-nothing requests that could not reach their owner (the cost stays taken).",
        |r| load(&r.stats.refunds_lost),
    ),
    Family::counter_by(
        "leased_checks",
        "Checks of buckets other members own decided here on a lease: admitted on a slice, or denied as the owner said the bucket denies until then.",
        "result",
        &[
            ("allowed", |r| load(&r.stats.leased)),
            ("denied", |r| load(&r.stats.leased_denied)),
        ],
    ),
    Family::gauge(
        "hot_keys",
        "Buckets this node forwards most that are hot: promoted at 1,000 checks/s, demoted below 500 (counted one forwarded check in 8, with bounded memory).",
        |r| load(&r.stats.hot.hot),
    ),
    Family::counter_by(
        "hot_key_changes",
        "Forwarded buckets promoted to hot, and demoted.",
        "change",
        &[
            ("promoted", |r| load(&r.stats.hot.promoted)),
            ("demoted", |r| load(&r.stats.hot.demoted)),
        ],
    ),
    Family::gauge(
        "quorate",
        "1 while this node sees a majority of the members it last knew (and owns keys), else 0.",
        |r| u64::from(r.owns_keys(&r.view())),
    ),
];
