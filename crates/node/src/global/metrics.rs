//! Global rules' counters as metrics, read at scrape time.

use super::GlobalCounters;
use crate::metrics::{Family, load};

/// [`super::counters::GlobalStats`] and the counters held.
pub const METRICS: &[Family<GlobalCounters>] = &[
    Family::gauge(
        "global_counters",
        "Global-rule window counters held by this node (own and merged).",
        |g| g.len() as u64,
    ),
    Family::gauge(
        "global_published",
        "Global-rule buckets this node publishes to its peers.",
        |g| load(&g.stats.published),
    ),
    Family::gauge(
        "global_backlog",
        "Changed global-rule buckets waiting for this node's share of --global-gossip-budget.",
        |g| load(&g.stats.backlog),
    ),
    Family::counter(
        "global_unpublished",
        "Publish rounds in which a global bucket with new hits was not published: per-node cap reached.",
        |g| load(&g.stats.unpublished),
    ),
    Family::counter(
        "global_evicted",
        "Global-rule window counters evicted to stay within the cap while they still mattered.",
        |g| load(&g.stats.evicted),
    ),
    Family::counter(
        "global_dropped_events",
        "Own global-rule updates not queued for a slow or unreachable peer (it is sent the full set later).",
        |g| load(&g.stats.dropped_events),
    ),
    Family::counter(
        "global_sent_frames",
        "GlobalCounts frames written to peers.",
        |g| load(&g.stats.push_frames),
    ),
    Family::counter(
        "global_sent_bytes",
        "Bytes of GlobalCounts frames written to peers (length prefixes included).",
        |g| load(&g.stats.push_bytes),
    ),
    Family::counter(
        "global_received_bytes",
        "Bytes of GlobalCounts frames received from peers (length prefixes included).",
        |g| load(&g.stats.received_bytes),
    ),
    Family::counter(
        "global_resyncs",
        "Full sets of this node's global counts queued for a peer (new connection, or a possible loss).",
        |g| load(&g.stats.resyncs),
    ),
    Family::counter(
        "global_unrelayed",
        "Buckets whose other nodes' global counts were left out of a full set (over --global-max-published).",
        |g| load(&g.stats.unrelayed),
    ),
    Family::counter(
        "global_push_failed",
        "Connections pushing global counts to a peer that failed (retried with a full set).",
        |g| load(&g.stats.push_failed),
    ),
    Family::counter(
        "global_region_merged",
        "Global counts of scope: regions buckets received from other regions and merged (this node is their link's entry).",
        |g| load(&g.stats.region_merged),
    ),
    Family::counter(
        "global_region_refused",
        "Global counts received from other regions and refused: malformed, or of a window this node does not hold (an offset gone wrong).",
        |g| load(&g.stats.region_refused),
    ),
    Family::counter(
        "global_malformed",
        "Global counts received from peers and refused (period or window out of range).",
        |g| load(&g.stats.malformed),
    ),
];
