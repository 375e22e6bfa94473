//! `Recall`: a member that joined lately asks this node, the member after it on the ring, for
//! buckets it owns but does not hold (see [`crate::peers::recall_on_join`] for the asking side).

use super::PeerServer;
use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::{Frame, HandedBucket};

/// Most buckets answered from one frame (the asking side sends no more).
const MOST_IDS: usize = 2_000;

impl PeerServer {
    /// The live states of buckets `ids` held here: this node's own bucket (it owned the key
    /// while the asker was away, and may still) or else its copy (it is the asker's replica).
    /// Read, not taken: a handover may still move them, and the asker merges by overlap.
    pub(super) fn recall(&self, ids: &[u64]) -> Frame {
        let (owned, copies) = (self.local.owned(), self.local.copies());
        let now = self.local.now();
        let buckets = ids
            .iter()
            .take(MOST_IDS)
            .filter_map(|&id| {
                let state = owned.peek(id).or_else(|| copies.peek(id))?;
                live(&state, now).then(|| HandedBucket {
                    id,
                    state: state.to_wire(),
                })
            })
            .collect();
        Frame::Recalled { buckets }
    }
}

/// Whether `state` still records consumption at `now` (an idle one is a full bucket anyway).
fn live(state: &BucketState, now: u64) -> bool {
    state.idle_at() > now
}
