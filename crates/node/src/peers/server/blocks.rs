//! `Blocks`: keep the blocks a member announced (decided as a key's owner, or asked for
//! through its admin API; see `crate::blocks_sync` for the sending side).

use super::{Caller, PeerServer};
use crate::rules::RuleSpec;
use ringlimit_proto::peer::{BlockChange, Frame};

impl PeerServer {
    /// Puts `changes` in force here; answers how many changed something.
    pub(super) fn blocks(&self, caller: &Caller<'_>, changes: &[BlockChange]) -> Frame {
        let rules = self.local.rules();
        let id_of = |key: &str, rule: &str| {
            rules
                .prepare(key, RuleSpec::Named(rule), 0)
                .ok()
                .map(|(_, id)| id)
        };
        let now_ms = self.local.now() / ringlimit_core::clock::NANOS_PER_MS;
        let kept = self.local.blocks().apply(changes, id_of, now_ms);
        tracing::debug!(from = %caller.from, changes = changes.len(), kept, "blocks announced by a peer");
        Frame::BlocksAck { kept }
    }
}
