//! `Reset`: drop the buckets an operator reset through another member's admin API (see
//! `crate::admin::keys` for the sending side).

use super::{Caller, PeerServer};
use ringlimit_proto::peer::Frame;

impl PeerServer {
    /// Drops `ids` from the store; answers how many were held.
    pub(super) fn reset(&self, caller: &Caller<'_>, ids: Vec<u64>) -> Frame {
        let removed = self.local.reset(&ids);
        // The node that took the admin request logs the reset; here it is detail.
        tracing::debug!(from = %caller.from, peer = %caller.peer, ids = ids.len(), removed,
            "buckets reset by a peer");
        Frame::ResetAck { removed }
    }
}
