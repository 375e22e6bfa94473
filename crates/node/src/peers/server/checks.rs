//! `Checks` (and version 2's `FlaggedChecks`): decide here what belongs here, relay once what
//! this node handed over, decide all-or-nothing groups where they land.

use super::PeerServer;
use crate::local::Placement;
use crate::peers::Peer;
use crate::rules::{Prepared, RuleSpec};
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::coordinator::Here;
use ringlimit_core::link::fanout::OwnerGroups;
use ringlimit_core::rule::Mode;
use ringlimit_core::top::Counted;
use ringlimit_proto::peer::{AnswerGroup, CheckGroup, GroupKind, PeerAnswer, PeerCheck};
use std::sync::atomic::Ordering;

impl PeerServer {
    /// Answers one `Checks` frame: decides here what belongs here, relays the rest (see
    /// [`super`]'s doc), and decides here whatever a relay could not deliver. A `client`'s
    /// (the SDK's) checks are counted into the top keys.
    pub(super) async fn checks(&self, groups: &[CheckGroup], client: bool) -> Vec<AnswerGroup> {
        let out = self.decide_groups(groups).await;
        if client {
            self.count_top(groups, &out);
        }
        out
    }

    /// Counts a client's decided checks into the top keys, as the HTTP and gRPC edges count
    /// theirs (a shadow rule's would-be denials as denials: the owner's answers are not
    /// shadowed yet).
    fn count_top(&self, groups: &[CheckGroup], out: &[AnswerGroup]) {
        let Some(top) = self.operators.as_ref().map(|o| &o.top) else {
            return;
        };
        let now = self.local.now();
        for (g, answered) in groups.iter().zip(out) {
            for (c, answer) in g.checks.iter().zip(&answered.answers) {
                let allowed = match answer {
                    PeerAnswer::Answer(a) | PeerAnswer::Held { answer: a, .. } => a.allowed,
                    PeerAnswer::Error { .. } | PeerAnswer::Refunded => continue,
                };
                let counted = Counted::of(!allowed);
                if counted.is_nothing() {
                    continue;
                }
                let Ok(p) = self.prepare(c) else {
                    continue;
                };
                let rule = p.spec.policy_name();
                top.count(&rule, p.id, &c.key, counted, now);
            }
        }
    }

    async fn decide_groups(&self, groups: &[CheckGroup]) -> Vec<AnswerGroup> {
        self.recall_before(groups).await;
        // One instant for the whole frame (see `Here::decide_at`).
        let now = self.local.now();
        // Relayed checks: their place in `out`, and what deciding them here takes.
        let mut relayed: Vec<(usize, usize, Prepared<'_>)> = Vec::new();
        let mut by_owner = OwnerGroups::new();
        let mut out: Vec<AnswerGroup> = Vec::with_capacity(groups.len());
        for (gi, g) in groups.iter().enumerate() {
            let may_relay = match g.kind {
                GroupKind::AllOrNothing | GroupKind::ReplicaAllOrNothing => {
                    out.push(self.answer_all(g, now));
                    continue;
                }
                GroupKind::Replica => {
                    out.push(self.answer_as_replica(g, now));
                    continue;
                }
                GroupKind::Relayed => false,
                GroupKind::Owned => true,
            };
            let mut answers = Vec::with_capacity(g.checks.len());
            for (ci, c) in g.checks.iter().enumerate() {
                self.stats.checks.fetch_add(1, Ordering::Relaxed);
                let p = match self.prepare(c) {
                    Ok(p) => p,
                    Err(e) => {
                        answers.push(error_answer(&e));
                        continue;
                    }
                };
                if may_relay && let Some(owner) = self.relay_target(&p.resolved, p.id) {
                    by_owner.add(owner.id, &owner.link, relayed.len());
                    relayed.push((gi, ci, p));
                    // Replaced below by the owner's answer, or by a local decision.
                    answers.push(PeerAnswer::Error {
                        code: String::new(),
                        message: String::new(),
                    });
                    continue;
                }
                answers.push(PeerAnswer::Answer(self.local.decide_at(&p, now)));
            }
            out.push(AnswerGroup { id: g.id, answers });
        }
        if relayed.is_empty() {
            return out;
        }
        self.stats
            .relayed
            .fetch_add(relayed.len() as u64, Ordering::Relaxed);
        let replies = by_owner
            .send(
                |i| {
                    let (g, c, _) = &relayed[i];
                    groups[*g].checks[*c].clone()
                },
                |client, checks| async move { client.send_relayed(checks).await },
            )
            .await;
        for (i, reply) in replies {
            let (g, c, p) = &relayed[i];
            out[*g].answers[*c] = match reply {
                Ok(a) => a,
                // The owner did not answer: decide here, as before relaying existed; on this
                // node's copy when it keeps one (a sender whose ring already dropped the owner
                // sent the check here as the new owner while this ring still has it): one
                // history, the one a stand-in decides on and hands back.
                Err(_) => {
                    let on = self.standing_in(p.id).unwrap_or(Placement::Bucket);
                    PeerAnswer::Answer(self.local.hold_on(on, p, now).0)
                }
            };
        }
        out
    }

    /// For a few seconds after this node joined: recalls the buckets of `groups` that it owns
    /// but does not hold from the member after it (see [`crate::peers::recall`]) before
    /// deciding them. Copies a replica group decides on are not this node's to recall.
    async fn recall_before(&self, groups: &[CheckGroup]) {
        let Some(relay) = self.relay.as_ref().filter(|r| r.recall.active()) else {
            return;
        };
        let ids = groups
            .iter()
            .filter(|g| !matches!(g.kind, GroupKind::Replica | GroupKind::ReplicaAllOrNothing))
            .flat_map(|g| &g.checks)
            .filter_map(|c| self.prepare(c).ok())
            .filter(|p| p.resolved.mode == Mode::Owner)
            .map(|p| p.id)
            .collect();
        relay.recall.before(ids).await;
    }

    /// Answers one request's checks at this node all-or-nothing (see
    /// [`GroupKind::AllOrNothing`]), decided where they land, never relayed (the sender refunds
    /// what this answers as held, and a refund must find the bucket that took); as the owner's
    /// replica ([`GroupKind::ReplicaAllOrNothing`]) on this node's copies.
    fn answer_all(&self, g: &CheckGroup, now: u64) -> AnswerGroup {
        self.stats
            .checks
            .fetch_add(g.checks.len() as u64, Ordering::Relaxed);
        let prepared: Vec<Result<Prepared<'_>, CheckError>> =
            g.checks.iter().map(|c| self.prepare(c)).collect();
        let replica = g.kind == GroupKind::ReplicaAllOrNothing;
        // Where each check is decided; as the owner's replica, a check this node cannot stand
        // in for is not decided (and so denies the group).
        let places: Vec<Option<Placement>> = prepared
            .iter()
            .map(|p| match (p, replica) {
                (Ok(p), true) => self.place(&p.resolved, p.id),
                (Ok(_), false) => Some(Placement::Bucket),
                (Err(_), _) => None,
            })
            .collect();
        let items: Vec<_> = prepared
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
        let answers = decided
            .into_iter()
            .zip(&prepared)
            .map(|(d, p)| match (d, p) {
                (Some((answer, Some(mark))), _) => PeerAnswer::Held { answer, mark },
                (Some((answer, None)), _) => PeerAnswer::Answer(answer),
                (None, Err(e)) => error_answer(e),
                (None, Ok(_)) if replica => not_replica(),
                (None, Ok(_)) => PeerAnswer::Error {
                    code: "invalid_request".into(),
                    message: "not decided".into(),
                },
            })
            .collect();
        AnswerGroup { id: g.id, answers }
    }

    /// Answers a group sent here as its owner's replica (see [`GroupKind::Replica`]): each
    /// check decided on this node's copy, or on its bucket where the ring now names this node
    /// the owner; a check this node keeps no copy of is answered `not_replica` (the sender
    /// falls back to its share).
    fn answer_as_replica(&self, g: &CheckGroup, now: u64) -> AnswerGroup {
        self.stats
            .checks
            .fetch_add(g.checks.len() as u64, Ordering::Relaxed);
        let answers = g
            .checks
            .iter()
            .map(|c| match self.prepare(c) {
                Err(e) => error_answer(&e),
                Ok(p) => match self.place(&p.resolved, p.id) {
                    Some(on) => PeerAnswer::Answer(self.local.hold_on(on, &p, now).0),
                    None => not_replica(),
                },
            })
            .collect();
        AnswerGroup { id: g.id, answers }
    }

    /// Where this node decides a check sent here as the owner's replica: a global rule's where
    /// it lands, an owner rule's where [`PeerServer::standing_in`] says.
    fn place(&self, resolved: &Resolved, id: u64) -> Option<Placement> {
        match resolved.mode {
            Mode::Global => Some(Placement::Bucket),
            Mode::Owner => self.standing_in(id),
        }
    }

    /// Where this node decides bucket `id` for an owner that did not answer: on its bucket when
    /// its ring names it the owner now, on its copy when it keeps one or its ring names it a
    /// replica; `None`: neither (it cannot stand in).
    fn standing_in(&self, id: u64) -> Option<Placement> {
        let relay = self.relay.as_ref()?;
        let view = relay.view.load();
        let me = &*view.self_id;
        if view.ring.owner(id) == Some(me) {
            return Some(Placement::Bucket);
        }
        let copies = self.local.copies();
        (copies.peek(id).is_some() || view.ring.replicates(id, relay.replicas, me))
            .then_some(Placement::Copy)
    }

    pub(super) fn prepare<'a>(&self, c: &'a PeerCheck) -> Result<Prepared<'a>, CheckError> {
        self.local
            .rules()
            .prepare_check(&c.key, RuleSpec::of(&c.rule), c.cost)
    }

    /// Where to relay an owner-mode check that a peer sent here: the bucket's owner under this
    /// node's ring, when that is another member and this node does not hold the bucket. A
    /// global rule (reached through the SDK, which sends every check to an owner) is decided
    /// here from the global counters like any global check.
    fn relay_target(&self, resolved: &Resolved, id: u64) -> Option<Peer> {
        if resolved.mode == Mode::Global {
            return None;
        }
        let relay = self.relay.as_ref()?;
        let target = relay.peers.owner(&relay.view.load(), id)?;
        (!self.local.owned().holds(id)).then_some(target)
    }
}

fn not_replica() -> PeerAnswer {
    PeerAnswer::Error {
        code: "not_replica".into(),
        message: "this node keeps no copy of the bucket".into(),
    }
}

pub(super) fn error_answer(e: &CheckError) -> PeerAnswer {
    PeerAnswer::Error {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}
