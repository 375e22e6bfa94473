//! Handing back: what this node decided on its copies as the replica of an owner that did not
//! answer (see `crate::local::copies`) goes back to that owner once it answers again, so that
//! the owner does not admit those requests a second time.
//!
//! Every [`HAND_BACK_EVERY`] the copies decided on are grouped by their owner under the
//! current view and sent to it as a `HandBack` frame: the owner merges each into its bucket
//! as another reading of the same history (the larger consumption wins). A copy whose owner left the ring is not sent: this node owns
//! it now, or will hand it to whoever does (promotion, handover). Until handed back, the
//! owner's own copies merge into it the same way instead of replacing it.

use crate::cluster::View;
use crate::local::ReplicaCopies;
use crate::peers::{Peers, ReplicaLink};
use arc_swap::ArcSwap;
use ringlimit_proto::peer::ReplicaBucket;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How often copies decided on are offered back to their owners: an owner that answers again
/// lacks their decisions for at most this long plus a round trip.
pub const HAND_BACK_EVERY: Duration = Duration::from_millis(50);

/// What goes back to one owner: the copies, and each one's id with the admissions it had.
type Back = (Vec<ReplicaBucket>, Vec<(u64, u64)>);

/// What handing back needs.
pub struct HandBack {
    pub copies: Arc<ReplicaCopies>,
    pub peers: Arc<Peers>,
    pub view: Arc<ArcSwap<View>>,
}

impl HandBack {
    /// Runs until the task is dropped.
    pub async fn run(self) {
        let mut links: HashMap<Arc<str>, ReplicaLink> = HashMap::new();
        let mut tick = tokio::time::interval(HAND_BACK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let stood_in = self.copies.stood_in();
            if stood_in.is_empty() {
                continue;
            }
            let view = self.view.load_full();
            links.retain(|m, l| view.peer_addrs.get(m).is_some_and(|a| a == l.addr()));
            let mut by_owner: HashMap<Arc<str>, Back> = HashMap::new();
            for (id, state, admissions) in stood_in {
                let Some(owner) = view.ring.owner(id).filter(|o| *o != &*view.self_id) else {
                    continue;
                };
                let Some((member, addr)) = view.peer_addrs.get_key_value(owner) else {
                    continue;
                };
                links
                    .entry(member.clone())
                    .or_insert_with(|| self.peers.replica_link(addr));
                let (wire, sent) = by_owner.entry(member.clone()).or_default();
                wire.push(ReplicaBucket {
                    id,
                    state: Some(state.to_wire()),
                });
                sent.push((id, admissions));
            }
            // All owners at once: one that still does not answer holds up no other.
            let sends = links.iter_mut().filter_map(|(owner, link)| {
                let (wire, sent) = by_owner.remove(owner)?;
                Some(async move { (owner.clone(), sent, link.hand_back(wire).await) })
            });
            for (owner, sent, result) in futures::future::join_all(sends).await {
                match result {
                    Ok(_) => {
                        for &(id, admissions) in &sent {
                            self.copies.handed_back(id, admissions);
                        }
                        tracing::debug!(%owner, buckets = sent.len(), "handed decisions back to their owner");
                    }
                    Err(e) => {
                        tracing::debug!(%owner, error = %e, "owner still unreachable; handing back later");
                    }
                }
            }
        }
    }
}
