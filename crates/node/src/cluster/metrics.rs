//! Membership as metrics, read at scrape time: the members of this node's view by state, and
//! this node's own pauses.

use super::pause::Pauses;
use super::{MemberState, View};
use crate::metrics::{Family, Series};
use arc_swap::ArcSwap;

/// The states members are counted by, and their `state` label.
const STATES: [(&str, MemberState); 5] = [
    ("joining", MemberState::Joining),
    ("alive", MemberState::Alive),
    ("leaving", MemberState::Leaving),
    ("dead", MemberState::Dead),
    ("unseen", MemberState::Unseen),
];

/// The current view's members by state (counted on one view, so that they add up).
pub const MEMBERS: &[Family<ArcSwap<View>>] = &[Family::gauge_each(
    "members",
    "Cluster members by state.",
    &["state"],
    |view| {
        let view = view.load();
        STATES
            .iter()
            .map(|&(label, state)| {
                let n = view.members.iter().filter(|m| m.state == state).count();
                Series::new([label], n as u64)
            })
            .collect()
    },
)];

/// This node's own pauses noticed (see [`super::pause`]).
pub const PAUSES: &[Family<Pauses>] = &[Family::counter(
    "pauses",
    "Pauses of this node noticed (it did not run for two gossip rounds: stopped, frozen \
     or starved); for ten rounds (at least 2 s) after each, members gossip declares dead \
     are still asked.",
    |p| p.noticed(),
)];
