//! `TopKeys`: this member's most denied (or checked) keys of a rule, for the admin API's
//! cluster-wide top keys (merged at the node that took the request); `Quota`: RLQS shares of
//! the buckets it owns (both asked of a member by operators' features).

use super::PeerServer;
use ringlimit_proto::peer::{Frame, QuotaAnswer, QuotaAsk, TopBy};

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

impl PeerServer {
    /// A member's RLQS streams' shares of buckets this node owns (RLQS off here: each ask
    /// refused).
    pub(super) fn quota(&self, caller: &super::Caller<'_>, asks: &[QuotaAsk]) -> Frame {
        let answers = match self.operators.as_ref().and_then(|o| o.quota.as_ref()) {
            Some(owner) => owner.answer(caller.peer, asks),
            None => asks
                .iter()
                .map(|_| QuotaAnswer::Error {
                    code: "unavailable".into(),
                    message: "this member keeps no RLQS shares".into(),
                })
                .collect(),
        };
        Frame::Quotas { answers }
    }
}
