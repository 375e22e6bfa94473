//! `Replicate`: keep the copies of an owner's buckets this node replicates (see
//! `crate::replicas` for the sending side). Copies go to the local copies, never to the owned
//! buckets: they decide nothing until this node owns them (promotion). And `HandBack`: the
//! decisions a replica made for this node while it did not answer, merged into its buckets.

use super::PeerServer;
use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::{Frame, ReplicaBucket};

impl PeerServer {
    /// Keeps (or, for a `None` state, drops) the copies in `buckets`; answers how many.
    pub(super) fn replicate(&self, buckets: Vec<ReplicaBucket>) -> Frame {
        let now = self.local.now();
        let kept = buckets.len() as u64;
        let copies = self.local.copies();
        copies.prefetch(buckets.iter().map(|b| b.id));
        for b in buckets {
            copies.keep(b.id, b.state.map(BucketState::from_wire), now);
        }
        Frame::ReplicateAck { kept }
    }

    /// Merges into this node's buckets the copies a replica decided on while this node did not
    /// answer (see `crate::replicas::handback`), each as another reading of the bucket's
    /// history; a copy of a bucket this node no longer owns is dropped (its owner now got it
    /// by promotion or handover). Answers how many were merged.
    pub(super) fn hand_back(&self, buckets: Vec<ReplicaBucket>) -> Frame {
        let now = self.local.now();
        let owned = self.local.owned();
        let Some(cluster) = &self.cluster else {
            return Frame::ReplicateAck { kept: 0 };
        };
        let view = cluster.view.load();
        let mut kept = 0;
        for b in buckets {
            if let Some(state) = b.state
                && view.ring.owner(b.id) == Some(&*view.self_id)
            {
                let kind = self.local.kind_unknown();
                owned.overlap_as(kind, b.id, BucketState::from_wire(state), now);
                kept += 1;
            }
        }
        Frame::ReplicateAck { kept }
    }
}
