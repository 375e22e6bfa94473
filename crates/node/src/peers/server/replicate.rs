//! `Replicate`: keep the copies of an owner's buckets this node replicates (see
//! `crate::replicas` for the sending side). Copies go to the engine's copies, never to its
//! store: they decide nothing until this node owns them (promotion).

use super::PeerServer;
use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::{Frame, ReplicaBucket};

impl PeerServer {
    /// Keeps (or, for a `None` state, drops) the copies in `buckets`; answers how many.
    pub(super) fn replicate(&self, buckets: Vec<ReplicaBucket>) -> Frame {
        let now = self.here.now();
        let kept = buckets.len() as u64;
        let engine = self.here.engine();
        for b in buckets {
            engine.keep_copy(b.id, b.state.map(BucketState::from_wire), now);
        }
        Frame::ReplicateAck { kept }
    }
}
