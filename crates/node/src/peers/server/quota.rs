//! `Quota`: a member's RLQS streams ask this node for their shares of the buckets it owns (see
//! `crate::rlqs`).

use super::{Caller, PeerServer};
use ringlimit_proto::peer::{Frame, QuotaAnswer, QuotaAsk};

impl PeerServer {
    /// A member's RLQS streams' shares of buckets this node owns (RLQS off here: each ask
    /// refused).
    pub(super) fn quota(&self, caller: &Caller<'_>, asks: &[QuotaAsk]) -> Frame {
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
