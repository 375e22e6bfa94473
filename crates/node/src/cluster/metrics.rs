//! Membership as metrics, read at scrape time: the members of this node's view by state, and
//! this node's own pauses.

use super::pause::Pauses;
use super::{MemberState, View};
use crate::metrics::{Kind, encode_family, encode_one};
use arc_swap::ArcSwap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::Arc;

/// The current view's members by state.
#[derive(Debug)]
pub struct MembersCollector(pub Arc<ArcSwap<View>>);

impl Collector for MembersCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let view = self.0.load();
        let count = |st| view.members.iter().filter(|m| m.state == st).count() as u64;
        encode_family(
            &mut e,
            Kind::Gauge,
            "members",
            "Cluster members by state.",
            "state",
            &[
                ("joining", count(MemberState::Joining)),
                ("alive", count(MemberState::Alive)),
                ("leaving", count(MemberState::Leaving)),
                ("dead", count(MemberState::Dead)),
            ],
        )
    }
}

/// This node's own pauses noticed (see [`super::pause`]).
#[derive(Debug)]
pub struct PausesCollector(pub Arc<Pauses>);

impl Collector for PausesCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_one(
            &mut e,
            Kind::Counter,
            "pauses",
            "Pauses of this node noticed (it did not run for two gossip rounds: stopped, frozen \
             or starved); for ten rounds (at least 2 s) after each, members gossip declares dead \
             are still asked.",
            self.0.noticed(),
        )
    }
}
