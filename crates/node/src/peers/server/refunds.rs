//! `Refunds`: give back what all-or-nothing checks held, because another check of their
//! request denied.

use super::PeerServer;
use super::checks::error_answer;
use crate::rules::RuleSpec;
use ringlimit_proto::peer::{AnswerGroup, PeerAnswer, RefundGroup};

impl PeerServer {
    /// Gives back what held checks took (see [`crate::decide::Here::refund`]).
    pub(super) fn refunds(&self, groups: Vec<RefundGroup>) -> Vec<AnswerGroup> {
        groups
            .into_iter()
            .map(|g| AnswerGroup {
                id: g.id,
                answers: g
                    .refunds
                    .iter()
                    .map(|r| {
                        match self
                            .here
                            .engine()
                            .prepare(&r.key, RuleSpec::of(&r.rule), r.cost)
                        {
                            Ok((resolved, id)) => {
                                self.here.refund(id, &resolved, r.cost, r.mark);
                                PeerAnswer::Refunded
                            }
                            Err(e) => error_answer(&e),
                        }
                    })
                    .collect(),
            })
            .collect()
    }
}
