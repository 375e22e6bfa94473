//! `Lease`: a member (or an SDK) asks this node, the owner, for slices of hot buckets (see
//! `ringlimit_core::lease`; the owner's side is `Local::lease_ask`, which ringlimit.v1's
//! `Lease` takes too). Slices are taken from the buckets at once; what a holder does not
//! spend comes back as an ordinary refund (`server/refunds.rs`).

use super::{Caller, PeerServer};
use crate::local::holds::Holds;
use crate::rules::RuleSpec;
use ringlimit_core::rule::Mode;
use ringlimit_proto::peer::{Frame, LeaseAsk, LeaseGrant};

/// Most asks answered from one frame.
const MOST_ASKS: usize = 1_000;

impl PeerServer {
    /// Grants (or refuses) each ask, in order; a client's grants are kept in its connection's
    /// `holds`, which bound what it may give back.
    pub(super) async fn lease(
        &self,
        caller: &Caller<'_>,
        asks: Vec<LeaseAsk>,
        holds: Option<&mut Holds>,
    ) -> Frame {
        let asks = &asks[..asks.len().min(MOST_ASKS)];
        let prepared: Vec<_> = asks
            .iter()
            .map(|a| self.local.rules().prepare(&a.key, RuleSpec::of(&a.rule), 1))
            .collect();
        // A bucket this node owns but does not hold yet is recalled before any slice of it is
        // taken (see `crate::peers::recall_on_join`): a slice of a fresh bucket would over-admit.
        if let Some(cluster) = self.cluster.as_ref().filter(|r| r.recall.active()) {
            let ids = prepared.iter().flatten();
            let owned = ids.filter(|(r, _)| r.mode == Mode::Owner);
            cluster
                .recall
                .before(owned.map(|(_, id)| *id).collect())
                .await;
        }
        let now = self.local.now();
        let grants = asks
            .iter()
            .zip(prepared)
            .map(|(ask, p)| {
                let (resolved, id) = match p {
                    Ok(p) => p,
                    Err(e) => {
                        return LeaseGrant::Error {
                            code: e.code().to_owned(),
                            message: e.to_string(),
                        };
                    }
                };
                self.local.lease_ask(
                    (&resolved, &ask.key),
                    id,
                    self.owns(id),
                    (caller.peer, ask.want),
                    now,
                )
            })
            .collect::<Vec<_>>();
        if let Some(holds) = holds {
            self.keep_grants(holds, asks, &grants);
        }
        Frame::Leased { grants }
    }

    /// Whether this node's ring names it the owner of bucket `id` (a node without a ring to
    /// follow, in tests, owns everything sent to it).
    pub(super) fn owns(&self, id: u64) -> bool {
        let Some(cluster) = self.cluster.as_ref() else {
            return true;
        };
        let view = cluster.view.load();
        view.ring.owner(id) == Some(&*view.self_id)
    }
}
