//! `Replicate`: keep the copies of an owner's buckets this node replicates (see
//! `crate::replicas` for the sending side). Copies go to the engine's copies, never to its
//! store: they decide nothing until this node owns them (promotion).

use super::PeerServer;
use ringlimit_core::limiter::BucketState;
use ringlimit_proto::peer::{Frame, ReplicaBucket};

impl PeerServer {
    /// Keeps (or, for a `None` state, drops) the copies in `buckets`; answers how many.
    ///
    /// A copy of a bucket this node owns under its view is a replica's reading handed back
    /// (see `crate::replicas::handback`), or an owner's whose view lags: merged into the
    /// bucket as another reading of its history, never kept as a copy.
    pub(super) fn replicate(&self, buckets: Vec<ReplicaBucket>) -> Frame {
        let now = self.here.now();
        let kept = buckets.len() as u64;
        let engine = self.here.engine();
        let view = self.relay.as_ref().map(|r| r.view.load_full());
        let owns = |id| {
            view.as_ref()
                .is_some_and(|v| v.ring.owner(id) == Some(&*v.self_id))
        };
        for b in buckets {
            let state = b.state.map(BucketState::from_wire);
            match (state, owns(b.id)) {
                (Some(state), true) => engine.take_back(b.id, state, now),
                (None, true) => {}
                (state, false) => engine.keep_copy(b.id, state, now),
            }
        }
        Frame::ReplicateAck { kept }
    }
}
