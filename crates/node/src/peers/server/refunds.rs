//! `Refunds`: give back what all-or-nothing checks held, because another check of their
//! request denied, and what lease slices had left. A client's connection gives back only what
//! its own holds took, once ([`super::holds`]).

use super::PeerServer;
use crate::local::holds::Holds;
use crate::rules::RuleSpec;
use ringlimit_core::coordinator::Here;
use ringlimit_proto::peer::{
    AnswerGroup, CheckGroup, LeaseAsk, LeaseGrant, PeerAnswer, RefundGroup,
};

impl PeerServer {
    /// Gives back what held checks took (see `coordinator::Here::refund`); with `holds`
    /// (a client's connection), at most what that ledger says each admission took.
    pub(super) fn refunds(
        &self,
        groups: Vec<RefundGroup>,
        mut holds: Option<&mut Holds>,
    ) -> Vec<AnswerGroup> {
        groups
            .into_iter()
            .map(|g| AnswerGroup {
                id: g.id,
                answers: g
                    .refunds
                    .iter()
                    .map(|r| {
                        // A client's refund is bounded by its ledger, not by the bucket's
                        // capacity: the bucket is named as by a check of 1.
                        let named = if holds.is_some() {
                            r.cost.min(1)
                        } else {
                            r.cost
                        };
                        match self
                            .local
                            .rules()
                            .prepare_check(&r.key, RuleSpec::of(&r.rule), named)
                        {
                            Ok(mut p) => {
                                p.cost = match holds.as_deref_mut() {
                                    None => r.cost,
                                    Some(h) => h.take(p.id, r.mark, r.cost),
                                };
                                if p.cost == 0 && r.cost > 0 {
                                    return not_held();
                                }
                                self.local.refund(&p, r.mark);
                                PeerAnswer::Refunded
                            }
                            Err(e) => e.to_peer_answer(),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// Remembers in `holds` what a client's checks held (all-or-nothing groups' admissions).
    pub(super) fn keep_holds(&self, holds: &mut Holds, groups: &[CheckGroup], out: &[AnswerGroup]) {
        for (g, answered) in groups.iter().zip(out) {
            for (c, answer) in g.checks.iter().zip(&answered.answers) {
                if let PeerAnswer::Held { mark, .. } = answer
                    && let Ok((_, id)) =
                        self.local
                            .rules()
                            .prepare(&c.key, RuleSpec::of(&c.rule), c.cost)
                {
                    holds.hold(id, *mark, c.cost);
                }
            }
        }
    }

    /// Remembers in `holds` the slices a client's lease asks were granted.
    pub(super) fn keep_grants(&self, holds: &mut Holds, asks: &[LeaseAsk], grants: &[LeaseGrant]) {
        for (ask, grant) in asks.iter().zip(grants) {
            if let LeaseGrant::Granted { tokens, mark, .. } = grant
                && let Ok((_, id)) =
                    self.local
                        .rules()
                        .prepare(&ask.key, RuleSpec::of(&ask.rule), 1)
            {
                holds.hold(id, *mark, *tokens);
            }
        }
    }
}

/// A client's refund of something its connection does not hold (any more).
fn not_held() -> PeerAnswer {
    PeerAnswer::Error {
        code: "invalid_request".into(),
        message: "nothing to give back: a client gives back only what its own connection's \
                  checks or leases took, once"
            .into(),
    }
}
