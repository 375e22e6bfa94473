//! Checks that arrive from peers on the peer port (a member forwarding to this node as the
//! owner, an SDK sending to the owner it computed, either asking this node as an owner's
//! replica), routed by their group's kind:
//! - an owned group: decided here, but a check of a bucket this node no longer holds and no
//!   longer owns (it handed the bucket over, or it is leaving) is relayed once to its owner
//!   under this node's ring, marked so that it is decided there whatever that node's ring says:
//!   a check crosses at most two hops, and rings that disagree for a moment cannot make it
//!   loop; what a relay could not deliver is decided here after all;
//! - a relayed group: decided here;
//! - an all-or-nothing group: decided here all-or-nothing, never relayed (the sender refunds
//!   what it answers as held, and a refund must find the bucket that took);
//! - a replica group (all-or-nothing or not): decided on this node's copies, as the replica of
//!   an owner that did not answer.

use super::Router;
use crate::cluster::View;
use crate::local::Placement;
use crate::rules::Prepared;
use ringlimit_core::check::CheckError;
use ringlimit_core::coordinator::{Here, Item};
use ringlimit_core::link::PeerClient;
use ringlimit_core::link::fanout::OwnerGroups;
use ringlimit_core::rule::Mode;
use ringlimit_proto::peer::{GroupKind, PeerAnswer};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// One group of checks as it arrived: how it is to be decided, and its checks (made ready, or
/// why not).
#[derive(Debug)]
pub struct Arrived<'a> {
    pub kind: GroupKind,
    pub checks: Vec<Result<Prepared<'a>, CheckError>>,
}

impl Router {
    /// Decides the groups of one frame as they arrived (see the module doc): each group's
    /// answers, in its checks' order. At one instant for the whole frame (see
    /// `Here::decide_at`).
    pub async fn arrived(&self, groups: &[Arrived<'_>]) -> Vec<Vec<PeerAnswer>> {
        self.recall_arrived(groups).await;
        let view = self.view.load_full();
        let now = self.local.now();
        // Relayed checks: their group, their place in it, and the check.
        let mut relayed: Vec<(usize, usize, &Prepared<'_>)> = Vec::new();
        let mut by_owner = OwnerGroups::new();
        let mut out = Vec::with_capacity(groups.len());
        for (gi, g) in groups.iter().enumerate() {
            let may_relay = match g.kind {
                GroupKind::AllOrNothing | GroupKind::ReplicaAllOrNothing => {
                    out.push(self.all_here(&view, g, now));
                    continue;
                }
                GroupKind::Replica => {
                    out.push(self.as_replica(&view, g, now));
                    continue;
                }
                GroupKind::Relayed => false,
                GroupKind::Owned => true,
            };
            let mut answers = Vec::with_capacity(g.checks.len());
            for (ci, p) in g.checks.iter().enumerate() {
                let p = match p {
                    Ok(p) => p,
                    Err(e) => {
                        answers.push(e.to_peer_answer());
                        continue;
                    }
                };
                if may_relay && let Some((owner, link)) = self.relay_target(&view, p) {
                    by_owner.add(owner, &link, relayed.len());
                    relayed.push((gi, ci, p));
                    // Replaced below by the owner's answer, or by a local decision.
                    answers.push(PeerAnswer::Error {
                        code: String::new(),
                        message: String::new(),
                    });
                    continue;
                }
                answers.push(PeerAnswer::Answer(self.local.decide_at(p, now)));
            }
            out.push(answers);
        }
        if relayed.is_empty() {
            return out;
        }
        self.stats
            .relayed
            .fetch_add(relayed.len() as u64, Ordering::Relaxed);
        let replies = by_owner
            .send(
                |i| relayed[i].2.peer_check(),
                |client: Arc<PeerClient>, checks| async move { client.send_relayed(checks).await },
            )
            .await;
        for (i, reply) in replies {
            let (g, c, p) = relayed[i];
            out[g][c] = match reply {
                Ok(a) => a,
                // The owner did not answer: decide here, as before relaying existed; on this
                // node's copy when it keeps one (a sender whose ring already dropped the owner
                // sent the check here as the new owner while this ring still has it): one
                // history, the one a stand-in decides on and hands back.
                Err(_) => {
                    let on = self.standing_in(&view, p.id).unwrap_or(Placement::Bucket);
                    PeerAnswer::Answer(self.local.hold_on(on, p, now).0)
                }
            };
        }
        out
    }

    /// For a few seconds after this node joined: recalls the buckets of `groups` that it owns
    /// but does not hold from the member after it (see [`crate::peers::recall_on_join`]) before
    /// deciding them. Copies a replica group decides on are not this node's to recall.
    async fn recall_arrived(&self, groups: &[Arrived<'_>]) {
        let Some(recall) = self.recall.as_ref().filter(|r| r.active()) else {
            return;
        };
        let ids = groups
            .iter()
            .filter(|g| !matches!(g.kind, GroupKind::Replica | GroupKind::ReplicaAllOrNothing))
            .flat_map(|g| g.checks.iter().flatten())
            .filter(|p| p.resolved.mode == Mode::Owner)
            .map(|p| p.id)
            .collect();
        recall.before(ids).await;
    }

    /// Answers one request's checks at this node all-or-nothing, decided where they land; as
    /// the owner's replica ([`GroupKind::ReplicaAllOrNothing`]) on this node's copies.
    fn all_here(&self, view: &View, g: &Arrived<'_>, now: u64) -> Vec<PeerAnswer> {
        let replica = g.kind == GroupKind::ReplicaAllOrNothing;
        // Where each check is decided; as the owner's replica, a check this node cannot stand
        // in for is not decided (and so denies the group).
        let places: Vec<Option<Placement>> = g
            .checks
            .iter()
            .map(|p| match (p, replica) {
                (Ok(p), true) => self.place(view, p),
                (Ok(_), false) => Some(Placement::Bucket),
                (Err(_), _) => None,
            })
            .collect();
        let items: Vec<_> = g
            .checks
            .iter()
            .zip(&places)
            .map(|(p, on)| match (p, on) {
                (Ok(p), Some(_)) => Some(p),
                _ => None,
            })
            .collect();
        let decided = self
            .local
            .decide_all_on(&items, now, |i| places[i].unwrap_or(Placement::Bucket));
        decided
            .into_iter()
            .zip(&g.checks)
            .map(|(d, p)| match (d, p) {
                (Some((answer, Some(mark))), _) => PeerAnswer::Held { answer, mark },
                (Some((answer, None)), _) => PeerAnswer::Answer(answer),
                (None, Err(e)) => e.to_peer_answer(),
                (None, Ok(_)) if replica => not_replica(),
                (None, Ok(_)) => PeerAnswer::Error {
                    code: "invalid_request".into(),
                    message: "not decided".into(),
                },
            })
            .collect()
    }

    /// Answers a group sent here as its owner's replica: each check decided on this node's
    /// copy, or on its bucket where the ring now names this node the owner; a check this node
    /// keeps no copy of is answered `not_replica` (the sender falls back to its share).
    fn as_replica(&self, view: &View, g: &Arrived<'_>, now: u64) -> Vec<PeerAnswer> {
        g.checks
            .iter()
            .map(|p| match p {
                Err(e) => e.to_peer_answer(),
                Ok(p) => match self.place(view, p) {
                    Some(on) => PeerAnswer::Answer(self.local.hold_on(on, p, now).0),
                    None => not_replica(),
                },
            })
            .collect()
    }

    /// Where this node decides a check sent here as the owner's replica: a global rule's where
    /// it lands, an owner rule's where [`Router::standing_in`] says.
    fn place(&self, view: &View, p: &Prepared<'_>) -> Option<Placement> {
        match p.resolved.mode {
            Mode::Global => Some(Placement::Bucket),
            Mode::Owner => self.standing_in(view, p.id),
        }
    }

    /// Where this node decides bucket `id` for an owner that did not answer: on its bucket when
    /// its ring names it the owner now, on its copy when it keeps one or its ring names it a
    /// replica; `None`: neither (it cannot stand in).
    fn standing_in(&self, view: &View, id: u64) -> Option<Placement> {
        let me = &*view.self_id;
        if view.ring.owner(id) == Some(me) {
            return Some(Placement::Bucket);
        }
        let copy = self.local.copies().peek(id).is_some();
        (copy || view.ring.replicates(id, self.replicas, me)).then_some(Placement::Copy)
    }

    /// Where to relay an owner-mode check that a peer sent here: the bucket's owner under this
    /// node's ring, when that is another member and this node does not hold the bucket. A
    /// global rule (reached through the SDK, which sends every check to an owner) is decided
    /// here from the global counters like any global check.
    fn relay_target(&self, view: &View, p: &Prepared<'_>) -> Option<(Arc<str>, Arc<PeerClient>)> {
        if p.resolved.mode == Mode::Global {
            return None;
        }
        let target = self.pool.owner_client(view, p.id)?;
        (!self.local.owned().holds(p.id)).then_some(target)
    }
}

fn not_replica() -> PeerAnswer {
    PeerAnswer::Error {
        code: "not_replica".into(),
        message: "this node keeps no copy of the bucket".into(),
    }
}
