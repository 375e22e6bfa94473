//! The replica sender's counters as metrics, read at scrape time (the copies kept here and
//! their promotions are `crate::local::copies`').

use crate::metrics::sharded::ShardedHistogram;
use crate::metrics::{Family, load};
use std::sync::atomic::AtomicU64;

/// Lag bounds, in seconds. The sender writes each member one frame per flush interval (8 ms by
/// default) and the lag runs from the previous drain, so at the default nearly every frame lands
/// between 5 and 10 ms: the bounds around 10 ms (the lag's p99 target) tell an interval's own wait
/// from a late tick; the long tail is a slow or failing replica.
const LAG_BUCKETS: [f64; 16] = [
    0.5e-3, 1e-3, 2.5e-3, 5e-3, 7.5e-3, 10e-3, 12.5e-3, 15e-3, 20e-3, 25e-3, 50e-3, 100e-3, 250e-3,
    500e-3, 1.0, 2.5,
];

/// What the sender counts.
#[derive(Debug)]
pub struct ReplicaStats {
    /// Per frame, how long its oldest change waited at most: from the previous drain of the
    /// change feed to the frame written (acknowledged, to a replica older than protocol 5).
    pub lag: ShardedHistogram,
    /// Bucket copies written to replicas.
    pub replicated: AtomicU64,
    /// Frames of copies written (`ReplicateOneWay`; `Replicate` to an older replica).
    pub frames: AtomicU64,
    /// Their bytes on the wire.
    pub bytes: AtomicU64,
}

impl Default for ReplicaStats {
    fn default() -> Self {
        Self {
            lag: ShardedHistogram::new(LAG_BUCKETS),
            replicated: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }
}

/// The sender's stats as metrics.
pub const METRICS: &[Family<ReplicaStats>] = &[
    Family::histogram(
        "replication_lag_seconds",
        "How long the oldest change in a frame of copies waited, at most: from the previous drain of the change feed (every change the frame carries was made after it) to the frame written to the replica's connection (acknowledged, for a replica older than protocol 5).",
        |s| &s.lag,
    ),
    Family::counter(
        "replicated_buckets",
        "Bucket copies sent to replicas and acknowledged.",
        |s| load(&s.replicated),
    ),
    Family::counter(
        "replication_frames",
        "Replicate frames sent to replicas and acknowledged.",
        |s| load(&s.frames),
    ),
    Family::counter(
        "replication_bytes",
        "Bytes of Replicate frames sent to replicas and acknowledged, length prefixes included.",
        |s| load(&s.bytes),
    ),
];
