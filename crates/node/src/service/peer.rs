//! The checks of one frame that arrived on the peer port: an SDK's (a client's), or a member's
//! forwarded to this node as their owner or replica. Routed by the router's part for them
//! ([`crate::routing::arrived`]); a client's are counted, timed and put in the top keys here
//! like every edge's, a member's were counted where they arrived (the forwarding node's
//! service) and are not counted again.

use super::{CheckService, Edge};
use crate::metrics::seconds;
use crate::peers::server::PeerChecks;
use crate::routing::arrived::Arrived;
use crate::rules::RuleSpec;
use ringlimit_proto::peer::{AnswerGroup, CheckGroup, GroupKind, PeerAnswer};
use std::future::Future;
use std::pin::Pin;

impl CheckService {
    /// Decides one frame's groups as they arrived (see [`crate::routing::arrived`]), each
    /// group answered under its id. `client`: an SDK's frame (counted here), not a member's.
    pub async fn check_arrived(&self, groups: &[CheckGroup], client: bool) -> Vec<AnswerGroup> {
        let start = self.local.now();
        let rules = self.local.rules();
        // Blocked checks are answered here, before any routing. An all-or-nothing group with
        // a blocked enforced check is denied whole, nothing taken: its blocked checks answer
        // from their blocks, the others are read (cost 0) for what they would say, one by one.
        let mut blocked: Vec<Vec<Option<PeerAnswer>>> = Vec::with_capacity(groups.len());
        let arrived: Vec<Arrived<'_>> = groups
            .iter()
            .map(|g| {
                let whole = matches!(
                    g.kind,
                    GroupKind::AllOrNothing | GroupKind::ReplicaAllOrNothing
                );
                let prepared: Vec<_> = g
                    .checks
                    .iter()
                    .map(|c| rules.prepare_check(&c.key, RuleSpec::of(&c.rule), c.cost))
                    .collect();
                let hits: Vec<_> = prepared
                    .iter()
                    .map(|p| p.as_ref().ok().and_then(|p| self.block_of(p, start)))
                    .collect();
                let denied_whole = whole
                    && prepared
                        .iter()
                        .zip(&hits)
                        .any(|(p, h)| h.is_some() && p.as_ref().is_ok_and(|p| !p.resolved.shadow));
                let kind = match g.kind {
                    GroupKind::AllOrNothing if denied_whole => GroupKind::Owned,
                    GroupKind::ReplicaAllOrNothing if denied_whole => GroupKind::Replica,
                    kind => kind,
                };
                let mut answered = Vec::with_capacity(g.checks.len());
                let mut checks = Vec::with_capacity(g.checks.len());
                for (p, hit) in prepared.into_iter().zip(hits) {
                    match (p, hit) {
                        (Ok(p), Some(hit)) if !whole || denied_whole => {
                            let o = if client {
                                self.blocked_outcome(&p, hit, start)
                            } else {
                                // Counted as a check where it arrived; counted blocked here.
                                self.metrics
                                    .count_blocked(p.spec.name(), hit.source.as_str());
                                super::Outcome::blocked(&p, hit, start)
                            };
                            answered.push(Some(PeerAnswer::Blocked {
                                answer: o.answer,
                                source: hit.source,
                            }));
                        }
                        (mut p, _) => {
                            if denied_whole && let Ok(p) = &mut p {
                                p.cost = 0;
                            }
                            answered.push(None);
                            checks.push(p);
                        }
                    }
                }
                blocked.push(answered);
                Arrived { kind, checks }
            })
            .collect();
        let answers = self.router.arrived(&arrived).await;
        if client {
            let end = self.local.now();
            let mut answered = blocked.iter().flatten().filter(|b| b.is_some()).count() as u64;
            for (g, answers) in arrived.iter().zip(&answers) {
                for (p, a) in g.checks.iter().zip(answers) {
                    if let (Ok(p), PeerAnswer::Answer(a) | PeerAnswer::Held { answer: a, .. }) =
                        (p, a)
                    {
                        // The answer travels as decided (an SDK applies a shadow rule itself);
                        // it is counted as every edge counts it.
                        self.outcome(*a, p, end);
                        answered += 1;
                    }
                }
            }
            self.metrics.count_edge(Edge::Peer, answered);
            self.metrics.peer_duration.observe(seconds(start, end));
        }
        groups
            .iter()
            .zip(answers)
            .zip(blocked)
            .map(|((g, routed), blocked)| {
                let mut routed = routed.into_iter();
                let answers = blocked
                    .into_iter()
                    .map(|b| {
                        b.or_else(|| routed.next()).unwrap_or(PeerAnswer::Error {
                            code: "unavailable".into(),
                            message: "no answer was produced".into(),
                        })
                    })
                    .collect();
                AnswerGroup { id: g.id, answers }
            })
            .collect()
    }
}

impl PeerChecks for CheckService {
    fn checks<'a>(
        &'a self,
        groups: &'a [CheckGroup],
        client: bool,
    ) -> Pin<Box<dyn Future<Output = Vec<AnswerGroup>> + Send + 'a>> {
        Box::pin(self.check_arrived(groups, client))
    }
}
