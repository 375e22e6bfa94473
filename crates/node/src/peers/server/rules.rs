//! `RuleChange`: an admin API change of a rule whose name this node owns, made through another
//! member (see [`crate::rules::change`]).

use super::{Caller, PeerServer};
use ringlimit_core::clock::NANOS_PER_MS;
use ringlimit_proto::peer::{Frame, RuleChange, RuleChanged};

impl PeerServer {
    /// Decides the change here, in the order changes of the name arrive.
    pub(super) fn rule_change(&self, caller: &Caller<'_>, change: RuleChange) -> Frame {
        let done = match &self.operators {
            Some(ops) => crate::rules::change::decide(
                &ops.book,
                &change,
                self.local.now() / NANOS_PER_MS,
                caller.peer,
            ),
            None => RuleChanged {
                entry_json: None,
                refused: Some((
                    "unavailable".into(),
                    "this member keeps no API rules".into(),
                )),
            },
        };
        Frame::RuleChanged(done)
    }
}
