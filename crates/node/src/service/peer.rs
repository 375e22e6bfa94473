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
use ringlimit_proto::peer::{AnswerGroup, CheckGroup, PeerAnswer};
use std::future::Future;
use std::pin::Pin;

impl CheckService {
    /// Decides one frame's groups as they arrived (see [`crate::routing::arrived`]), each
    /// group answered under its id. `client`: an SDK's frame (counted here), not a member's.
    pub async fn check_arrived(&self, groups: &[CheckGroup], client: bool) -> Vec<AnswerGroup> {
        let start = self.local.now();
        let rules = self.local.rules();
        let arrived: Vec<Arrived<'_>> = groups
            .iter()
            .map(|g| Arrived {
                kind: g.kind,
                checks: g
                    .checks
                    .iter()
                    .map(|c| rules.prepare_check(&c.key, RuleSpec::of(&c.rule), c.cost))
                    .collect(),
            })
            .collect();
        let answers = self.router.arrived(&arrived).await;
        if client {
            let end = self.local.now();
            let mut answered = 0;
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
            .map(|(g, answers)| AnswerGroup { id: g.id, answers })
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
