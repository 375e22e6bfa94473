//! `TopKeys`: this member's most denied (or checked) keys of a rule, for the admin API's
//! cluster-wide top keys (merged at the node that took the request).

use super::PeerServer;
use ringlimit_proto::peer::{Frame, TopBy};

impl PeerServer {
    /// The `n` keys of `rule` most counted `by` here (none on a server without operators).
    pub(super) fn top_keys(&self, rule: &str, by: TopBy, n: u32) -> Frame {
        let keys = match &self.operators {
            Some(ops) => ops.top.top(rule, by, n as usize, self.local.now()),
            None => Vec::new(),
        };
        Frame::TopKeysAre { keys }
    }
}
