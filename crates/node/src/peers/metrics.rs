//! The peers' counters as metrics, read at scrape time: what this node sent to peers (the
//! facade's) and what its peer server did (refused, handed over).

use super::Peers;
use super::recall_on_join::RecallStats;
use super::server::ServerStats;
use crate::metrics::{Kind, encode_family, encode_one, load};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The facade's stats, the peer server's, and the buckets this node handed over.
pub struct PeersCollector {
    pub peers: Arc<Peers>,
    pub server: Arc<ServerStats>,
    /// Buckets this node sent to their new owners after ring changes.
    pub handed_over: Arc<AtomicU64>,
    /// Buckets this node recalled after it joined.
    pub recall: Arc<RecallStats>,
}

impl std::fmt::Debug for PeersCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeersCollector")
    }
}

impl Collector for PeersCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sent = self.peers.stats();
        encode_one(
            &mut e,
            Kind::Counter,
            "peer_frames",
            "Check frames sent to peers.",
            load(&sent.frames),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "peer_checks",
            "Checks sent to peers (checks per frame is the batching factor).",
            load(&sent.checks),
        )?;
        let s = &self.server;
        encode_one(
            &mut e,
            Kind::Counter,
            "peer_connections_refused",
            "Peer connections refused (bad handshake, wrong cluster or secret, malformed frames, too many).",
            load(&s.refused),
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "buckets_handed_over",
            "Buckets handed over after ring changes: sent to their new owner, or received from their previous one and merged.",
            "direction",
            &[
                ("sent", load(&self.handed_over)),
                ("received", load(&s.handed_over)),
            ],
        )?;
        encode_family(
            &mut e,
            Kind::Counter,
            "buckets_recalled",
            "Buckets this node owns but did not hold, asked of the member after it on the ring before their first check in its first seconds after joining (asked), and those that member held (found, merged).",
            "result",
            &[
                ("asked", load(&self.recall.asked)),
                ("found", load(&self.recall.recalled)),
            ],
        )
    }
}
