//! Global rules' counters as metrics, read at scrape time.

use super::GlobalCounters;
use crate::metrics::{Kind, encode_one, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::Arc;

/// [`super::counters::GlobalStats`] and the counters held.
pub struct GlobalCollector(pub Arc<GlobalCounters>);

impl std::fmt::Debug for GlobalCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GlobalCollector")
    }
}

impl Collector for GlobalCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let g = &self.0;
        let s = &g.stats;
        let series: [(Kind, &str, &str, u64); 13] = [
            (
                Kind::Gauge,
                "global_counters",
                "Global-rule window counters held by this node (own and merged).",
                g.len() as u64,
            ),
            (
                Kind::Gauge,
                "global_published",
                "Global-rule buckets this node publishes to its peers.",
                load(&s.published),
            ),
            (
                Kind::Gauge,
                "global_backlog",
                "Changed global-rule buckets waiting for this node's share of --global-gossip-budget.",
                load(&s.backlog),
            ),
            (
                Kind::Counter,
                "global_unpublished",
                "Publish rounds in which a global bucket with new hits was not published: per-node cap reached.",
                load(&s.unpublished),
            ),
            (
                Kind::Counter,
                "global_evicted",
                "Global-rule window counters evicted to stay within the cap while they still mattered.",
                load(&s.evicted),
            ),
            (
                Kind::Counter,
                "global_dropped_events",
                "Own global-rule updates not queued for a slow or unreachable peer (it is sent the full set later).",
                load(&s.dropped_events),
            ),
            (
                Kind::Counter,
                "global_sent_frames",
                "GlobalCounts frames written to peers.",
                load(&s.push_frames),
            ),
            (
                Kind::Counter,
                "global_sent_bytes",
                "Bytes of GlobalCounts frames written to peers (length prefixes included).",
                load(&s.push_bytes),
            ),
            (
                Kind::Counter,
                "global_received_bytes",
                "Bytes of GlobalCounts frames received from peers (length prefixes included).",
                load(&s.received_bytes),
            ),
            (
                Kind::Counter,
                "global_resyncs",
                "Full sets of this node's global counts queued for a peer (new connection, or a possible loss).",
                load(&s.resyncs),
            ),
            (
                Kind::Counter,
                "global_unrelayed",
                "Buckets whose other nodes' global counts were left out of a full set (over --global-max-published).",
                load(&s.unrelayed),
            ),
            (
                Kind::Counter,
                "global_push_failed",
                "Connections pushing global counts to a peer that failed (retried with a full set).",
                load(&s.push_failed),
            ),
            (
                Kind::Counter,
                "global_malformed",
                "Global counts received from peers and refused (period or window out of range).",
                load(&s.malformed),
            ),
        ];
        for (kind, name, help, value) in series {
            encode_one(&mut e, kind, name, help, value)?;
        }
        Ok(())
    }
}
