//! Membership as metrics, read at scrape time: the members of this node's view by state.

use super::{MemberState, View};
use crate::metrics::{Kind, encode_family};
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
