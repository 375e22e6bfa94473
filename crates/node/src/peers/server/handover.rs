//! `Handover`: merge the buckets a previous owner hands this node (see [`crate::peers::handover`]
//! for the sending side), so that a key that moves keeps its consumption.

use super::PeerServer;
use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::{Frame, HandedBucket};
use std::sync::atomic::Ordering;

impl PeerServer {
    /// Merges `buckets` into the store at this node's now; answers how many.
    pub(super) fn handover(&self, buckets: Vec<HandedBucket>) -> Frame {
        let now = self.here.now();
        let merged = buckets.len() as u64;
        for b in buckets {
            self.here
                .engine()
                .take_in(b.id, BucketState::from_wire(b.state), now);
        }
        self.stats.handed_over.fetch_add(merged, Ordering::Relaxed);
        Frame::HandoverAck { merged }
    }
}
