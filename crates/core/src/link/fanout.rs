//! Group by owner, once: checks are grouped by the member that owns them, each group goes to
//! its owner as one request (all owners at once), and the answers are scattered back to the
//! checks' places. And an owner's reply to one check, or its absence, turned into the caller's
//! result. Nodes forwarding a batch, nodes relaying, and the SDK all go through here.

use super::client::{ForwardError, PeerClient};
use crate::check::CheckError;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{PeerAnswer, PeerCheck};
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

/// Checks (by their index in the caller's list) grouped by owner, with the link (`L`: a
/// client, or what wraps one) that reaches each owner.
pub struct OwnerGroups<K, L = Arc<PeerClient>> {
    groups: HashMap<K, (L, Vec<usize>)>,
}

impl<K: Eq + Hash, L> Default for OwnerGroups<K, L> {
    fn default() -> Self {
        Self {
            groups: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash, L: Clone> OwnerGroups<K, L> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts check `index` in `owner`'s group.
    pub fn add(&mut self, owner: K, client: &L, index: usize) {
        self.groups
            .entry(owner)
            .or_insert_with(|| (client.clone(), Vec::new()))
            .1
            .push(index);
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The client each check was grouped under, by index (to follow up on an owner's answer,
    /// e.g. with a refund).
    pub fn clients(&self) -> HashMap<usize, L> {
        self.groups
            .values()
            .flat_map(|(client, idx)| idx.iter().map(|&i| (i, client.clone())))
            .collect()
    }

    /// Sends every group to its owner at once — `check(i)` is check `i` as it travels, `send`
    /// sends one group on its owner's client — and returns each check's reply by index. A
    /// group that failed gives its error to each of its checks; an owner that answered fewer
    /// checks than it was sent leaves the rest [`ForwardError::Mismatch`].
    pub async fn send<F, Fut>(
        self,
        check: impl Fn(usize) -> PeerCheck,
        send: F,
    ) -> Vec<(usize, Result<PeerAnswer, ForwardError>)>
    where
        F: Fn(L, Vec<PeerCheck>) -> Fut,
        Fut: Future<Output = Result<Vec<PeerAnswer>, ForwardError>>,
    {
        let sends = self.groups.into_values().map(|(client, idx)| {
            let checks = idx.iter().map(|&i| check(i)).collect();
            let sent = send(client, checks);
            async move { (idx, sent.await) }
        });
        let mut replies = Vec::new();
        for (idx, sent) in futures::future::join_all(sends).await {
            match sent {
                Ok(answers) => {
                    let mut answers = answers.into_iter();
                    for i in idx {
                        replies.push((i, answers.next().ok_or(ForwardError::Mismatch)));
                    }
                }
                Err(e) => replies.extend(idx.into_iter().map(|i| (i, Err(e)))),
            }
        }
        replies
    }
}

/// An owner's reply to one check as the caller's result: the owner's answer, its refusal as
/// [`CheckError::Rejected`], or — when the owner could not answer, or does not know the named
/// rule the caller resolved — what `fallback` makes of the failure.
pub fn settle(
    reply: Result<PeerAnswer, ForwardError>,
    fallback: impl FnOnce(ForwardError) -> Result<CheckAnswer, CheckError>,
) -> Result<CheckAnswer, CheckError> {
    match reply {
        Ok(
            PeerAnswer::Answer(a)
            | PeerAnswer::Held { answer: a, .. }
            | PeerAnswer::Blocked { answer: a, .. },
        ) => Ok(a),
        // The caller resolved the rule, so it exists: the owner has not learnt it yet (a rule
        // just written through the admin API). The owner cannot answer it for now.
        Ok(PeerAnswer::Error { code, .. }) if code == "unknown_rule" => {
            fallback(ForwardError::RuleUnknownAtOwner)
        }
        Ok(PeerAnswer::Error { code, message }) => Err(CheckError::Rejected { code, message }),
        // Not an answer to a check: the owner misunderstood the request.
        Ok(PeerAnswer::Refunded) => fallback(ForwardError::Mismatch),
        Err(e) => fallback(e),
    }
}
