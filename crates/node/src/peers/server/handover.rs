//! `Handover`: merge the buckets a previous owner hands this node (see `crate::lifecycle`
//! for the sending side), so that a key that moves keeps its consumption.

use super::{Caller, PeerServer};
use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::{Frame, HandedBucket};
use std::sync::atomic::Ordering;

impl PeerServer {
    /// Merges `buckets` into the store at this node's now; answers how many. An empty frame
    /// ends a member's handover: this node recalls nothing more from it (see
    /// [`crate::peers::recall_on_join`]).
    pub(super) fn handover(&self, caller: &Caller<'_>, buckets: Vec<HandedBucket>) -> Frame {
        if buckets.is_empty()
            && let Some(cluster) = &self.cluster
        {
            cluster.recall.handed_over(caller.peer);
        }
        let now = self.local.now();
        let merged = buckets.len() as u64;
        for b in buckets {
            self.local
                .take_in(b.id, BucketState::from_wire(b.state), now);
        }
        self.stats.handed_over.fetch_add(merged, Ordering::Relaxed);
        Frame::HandoverAck { merged }
    }
}
