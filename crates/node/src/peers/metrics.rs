//! The peers' counters as metrics, read at scrape time: what this node sent to peers (the
//! facade's) and what its peer server did (refused, handed over).

use super::Peers;
use super::recall_on_join::RecallStats;
use super::server::ServerStats;
use crate::metrics::{Family, load};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// What the peers' metrics read: the facade's stats, the peer server's, and the buckets this
/// node handed over and recalled.
pub struct PeerCounts {
    pub peers: Arc<Peers>,
    pub server: Arc<ServerStats>,
    /// Buckets this node sent to their new owners after ring changes.
    pub handed_over: Arc<AtomicU64>,
    /// Buckets this node recalled after it joined.
    pub recall: Arc<RecallStats>,
}

/// [`PeerCounts`] as metrics.
pub const METRICS: &[Family<PeerCounts>] = &[
    Family::counter("peer_frames", "Check frames sent to peers.", |p| {
        load(&p.peers.stats().frames)
    }),
    Family::counter(
        "peer_checks",
        "Checks sent to peers (checks per frame is the batching factor).",
        |p| load(&p.peers.stats().checks),
    ),
    Family::counter(
        "peer_connections_refused",
        "Peer connections refused (bad handshake, wrong cluster or secret, malformed frames, too many).",
        |p| load(&p.server.refused),
    ),
    Family::counter_by(
        "buckets_handed_over",
        "Buckets handed over after ring changes: sent to their new owner, or received from their previous one and merged.",
        "direction",
        &[
            ("sent", |p| load(&p.handed_over)),
            ("received", |p| load(&p.server.handed_over)),
        ],
    ),
    Family::counter_by(
        "buckets_recalled",
        "Buckets this node owns but did not hold, asked of the member after it on the ring before their first check in its first seconds after joining (asked), and those that member held (found, merged).",
        "result",
        &[
            ("asked", |p| load(&p.recall.asked)),
            ("found", |p| load(&p.recall.recalled)),
        ],
    ),
];
