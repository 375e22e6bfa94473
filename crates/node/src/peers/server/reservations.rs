//! `Reserve` and `Settle`: a member (or an SDK) reserves an estimated cost of buckets this
//! node owns, and settles it later with the actual cost (see `crate::local::reservations`). A
//! reservation is kept where it was taken: a settle is answered from this node's table
//! whatever its ring says now (unknown when not here).

use super::PeerServer;
use crate::rules::RuleSpec;
use ringlimit_core::reservations::ReserveError;
use ringlimit_proto::peer::{Frame, PeerAnswer, PeerReserve, PeerSettle, SettleAnswer};

/// Most asks (or settles) answered from one frame.
const MOST_PER_FRAME: usize = 1_000;

impl PeerServer {
    /// Reserves each ask, in order: the check's answer, or its error (`not_owner` for a
    /// bucket this node's ring gives another member: the sender's ring is ahead or behind,
    /// and taking it here could admit more than the owner's bucket).
    pub(super) async fn reserve(&self, asks: Vec<PeerReserve>) -> Frame {
        let asks = &asks[..asks.len().min(MOST_PER_FRAME)];
        let rules = self.local.rules();
        let prepared: Vec<_> = asks
            .iter()
            .map(|a| rules.prepare(&a.key, RuleSpec::of(&a.rule), a.cost))
            .collect();
        // A bucket this node owns but does not hold yet is recalled first (see
        // `crate::peers::recall_on_join`): an estimate taken from a fresh bucket would over-admit.
        if let Some(cluster) = self.cluster.as_ref().filter(|r| r.recall.active()) {
            let ids = prepared.iter().flatten().map(|(_, id)| *id).collect();
            cluster.recall.before(ids).await;
        }
        let now = self.local.now();
        let answers = asks
            .iter()
            .zip(prepared)
            .map(|(ask, p)| {
                let (resolved, id) = match p {
                    Ok(p) => p,
                    Err(e) => return error(&ReserveError::Check(e)),
                };
                if !self.owns(id) {
                    return PeerAnswer::Error {
                        code: "not_owner".to_owned(),
                        message: "this node does not own the bucket".to_owned(),
                    };
                }
                match self
                    .local
                    .reserve(&resolved, id, (ask.cost, ask.ttl_ms, ask.nonce), now)
                {
                    Ok(answer) => PeerAnswer::Answer(answer),
                    Err(e) => error(&e),
                }
            })
            .collect();
        Frame::Reserved { answers }
    }

    /// Settles each, in order.
    pub(super) fn settle(&self, settles: Vec<PeerSettle>) -> Frame {
        let settles = &settles[..settles.len().min(MOST_PER_FRAME)];
        let now = self.local.now();
        let answers = settles
            .iter()
            .map(|s| {
                let settled = self
                    .local
                    .rules()
                    .prepare(&s.key, RuleSpec::of(&s.rule), s.cost)
                    .map_err(ReserveError::Check)
                    .and_then(|(resolved, id)| {
                        self.local.settle(&resolved, id, (s.nonce, s.cost), now)
                    });
                match settled {
                    Ok(answer) => SettleAnswer::Answer(answer),
                    Err(ReserveError::Unknown) => SettleAnswer::Unknown,
                    Err(e) => SettleAnswer::Error {
                        code: e.code().to_owned(),
                        message: e.to_string(),
                    },
                }
            })
            .collect();
        Frame::Settled { answers }
    }
}

fn error(e: &ReserveError) -> PeerAnswer {
    PeerAnswer::Error {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}
