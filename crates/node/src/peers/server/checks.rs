//! `Checks` (and version 2's `FlaggedChecks`): the frame goes to the node's front door (the
//! check service, through [`super::PeerChecks`]), which routes each group as it arrived (decide
//! here, relay once, all-or-nothing, stand in: `crate::routing::arrived`) and counts a
//! client's checks as every edge's are counted.

use super::PeerServer;
use ringlimit_proto::peer::{AnswerGroup, CheckGroup, PeerAnswer};
use std::sync::atomic::Ordering;

impl PeerServer {
    /// Answers one `Checks` frame; `client`: a client's (the SDK's), counted by the service.
    pub(super) async fn checks(&self, groups: &[CheckGroup], client: bool) -> Vec<AnswerGroup> {
        let n: usize = groups.iter().map(|g| g.checks.len()).sum();
        self.stats.checks.fetch_add(n as u64, Ordering::Relaxed);
        match self.checks.get() {
            Some(front_door) => front_door.checks(groups, client).await,
            None => groups.iter().map(undecided).collect(),
        }
    }
}

/// A group's answers from a server that decides no checks.
fn undecided(g: &CheckGroup) -> AnswerGroup {
    let error = PeerAnswer::Error {
        code: "unavailable".into(),
        message: "this member decides no checks".into(),
    };
    AnswerGroup {
        id: g.id,
        answers: vec![error; g.checks.len()],
    }
}
