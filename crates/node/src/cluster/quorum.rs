//! The majority rule. A node that sees fewer than a majority of the members it last knew may be on
//! the small side of a partition: if it took ownership of the keys of the members it no longer
//! sees, each side would grant those keys their whole limit (measured in a 2 | 1 split: the docs'
//! benchmarks page, "Network faults"). Such a node owns nothing; it answers every owner-mode check
//! from its fallback share of the last known cluster, degraded, until it sees a majority again.
//!
//! "Last known" follows the cluster while it has a majority: a member that leaves drops out of it
//! at once, one declared dead after [`DEAD_GRACE`] (the ring heals at once as before; the grace
//! only keeps the count). Without the grace, a node cut off from two peers that it declares dead a
//! moment apart would count the second as a majority of two, and its share of each limit would grow
//! with it (measured: the docs' benchmarks page, "Network faults"). On the small side it stays as
//! it was, except that members that left or that gossip forgot (chitchat drops dead members after
//! its grace period) leave it: a node alone for longer than that owns its keys again.

use super::member::{Member, MemberState};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a member declared dead still counts among those a majority is counted of.
pub const DEAD_GRACE: Duration = Duration::from_secs(10);

/// Which members this node counts a majority of, and whether it sees one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quorum {
    /// The members last seen while this node saw a majority, sorted.
    pub known: Vec<Arc<str>>,
    /// Whether the alive members include a strict majority of `known`.
    pub quorate: bool,
    /// When each member of `known` that is dead was first seen dead.
    pub dead_since: BTreeMap<Arc<str>, Instant>,
}

impl Quorum {
    /// A node alone, as it starts: it knows itself only.
    pub fn solo(self_id: &Arc<str>) -> Self {
        Self {
            known: vec![self_id.clone()],
            quorate: true,
            dead_since: BTreeMap::new(),
        }
    }

    /// A quorum that knows `known` and sees a majority of them.
    pub fn of(known: impl IntoIterator<Item = Arc<str>>) -> Self {
        Self {
            known: known.into_iter().collect(),
            quorate: true,
            dead_since: BTreeMap::new(),
        }
    }

    /// The quorum after membership became `members` (sorted by id), at `now`.
    pub fn next(&self, members: &[Member], now: Instant) -> Self {
        let state = |id: &str| members.iter().find(|m| *m.node_id == *id).map(|m| m.state);
        // Members that announced their leave, or that gossip no longer knows, are not waited for.
        let known: Vec<Arc<str>> = self
            .known
            .iter()
            .filter(|id| matches!(state(id), Some(MemberState::Alive | MemberState::Dead)))
            .cloned()
            .collect();
        let dead_since: BTreeMap<Arc<str>, Instant> = known
            .iter()
            .filter(|id| state(id) == Some(MemberState::Dead))
            .map(|id| (id.clone(), self.dead_since.get(id).copied().unwrap_or(now)))
            .collect();
        let seen = known.len() - dead_since.len();
        if !known.is_empty() && 2 * seen <= known.len() {
            return Self {
                known,
                quorate: false,
                dead_since,
            };
        }
        let dead_since: BTreeMap<Arc<str>, Instant> = dead_since
            .into_iter()
            .filter(|(_, since)| now.saturating_duration_since(*since) < DEAD_GRACE)
            .collect();
        let mut known: Vec<Arc<str>> = members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| Arc::from(m.node_id.as_str()))
            .chain(dead_since.keys().cloned())
            .collect();
        known.sort();
        known.dedup();
        Self {
            known,
            quorate: true,
            dead_since,
        }
    }

    /// How many members a limit is shared among when answered from a fallback share.
    pub fn share_members(&self) -> usize {
        self.known.len().max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemberState::{Alive, Dead, Leaving};

    fn members(states: &[(&str, MemberState)]) -> Vec<Member> {
        states
            .iter()
            .map(|(id, state)| Member {
                node_id: (*id).to_owned(),
                peer_addr: String::new(),
                http_addr: String::new(),
                grpc_addr: String::new(),
                state: *state,
                generation: 0,
            })
            .collect()
    }

    fn ids(q: &Quorum) -> Vec<&str> {
        q.known.iter().map(|s| &**s).collect()
    }

    fn abc() -> Quorum {
        Quorum::of(["a".into(), "b".into(), "c".into()])
    }

    #[test]
    fn a_cluster_grows_from_one_node() {
        let now = Instant::now();
        let q = Quorum::solo(&Arc::from("a"));
        let q = q.next(&members(&[("a", Alive), ("b", Alive)]), now);
        assert!(q.quorate);
        let q = q.next(&members(&[("a", Alive), ("b", Alive), ("c", Alive)]), now);
        assert_eq!((ids(&q), q.quorate), (vec!["a", "b", "c"], true));
    }

    #[test]
    fn the_side_of_two_keeps_ownership_and_the_lone_node_gives_it_up() {
        let now = Instant::now();
        let big = abc().next(&members(&[("a", Alive), ("b", Dead), ("c", Alive)]), now);
        assert_eq!((ids(&big), big.quorate), (vec!["a", "b", "c"], true));
        assert_eq!(big.share_members(), 3, "b still counted for the grace");
        let later = big.next(
            &members(&[("a", Alive), ("b", Dead), ("c", Alive)]),
            now + DEAD_GRACE,
        );
        assert_eq!((ids(&later), later.quorate), (vec!["a", "c"], true));
        let lone = abc().next(&members(&[("a", Dead), ("b", Alive), ("c", Dead)]), now);
        assert_eq!((ids(&lone), lone.quorate), (vec!["a", "b", "c"], false));
        assert_eq!(lone.share_members(), 3);
        // Still alone long after the grace: still without a majority.
        let lone = lone.next(
            &members(&[("a", Dead), ("b", Alive), ("c", Dead)]),
            now + DEAD_GRACE * 5,
        );
        assert!(!lone.quorate);
        // Healed: a majority is seen again.
        let healed = lone.next(&members(&[("a", Alive), ("b", Alive), ("c", Alive)]), now);
        assert!(healed.quorate);
    }

    /// Regression: a node cut off declared its two peers dead 0.3 s apart; after the first it
    /// saw two of three, a majority, and counted the second as one of two.
    #[test]
    fn peers_lost_one_after_the_other_leave_the_lone_node_without_a_majority() {
        let now = Instant::now();
        let q = abc().next(&members(&[("a", Dead), ("b", Alive), ("c", Alive)]), now);
        assert!(q.quorate);
        let q = q.next(
            &members(&[("a", Dead), ("b", Alive), ("c", Dead)]),
            now + Duration::from_millis(300),
        );
        assert_eq!((ids(&q), q.quorate), (vec!["a", "b", "c"], false));
    }

    #[test]
    fn nodes_that_join_the_small_side_do_not_make_it_a_majority() {
        let now = Instant::now();
        let lone = abc().next(&members(&[("a", Dead), ("b", Alive), ("c", Dead)]), now);
        let q = lone.next(
            &members(&[
                ("a", Dead),
                ("b", Alive),
                ("c", Dead),
                ("d", Alive),
                ("e", Alive),
            ]),
            now,
        );
        assert!(!q.quorate);
    }

    #[test]
    fn leaving_or_forgotten_members_are_not_waited_for() {
        let now = Instant::now();
        // Two leave gracefully: the last one owns everything.
        let q = abc().next(
            &members(&[("a", Leaving), ("b", Alive), ("c", Leaving)]),
            now,
        );
        assert_eq!((ids(&q), q.quorate), (vec!["b"], true));
        // Alone in a partition until gossip forgot the others.
        let lone = abc().next(&members(&[("a", Dead), ("b", Alive), ("c", Dead)]), now);
        assert!(!lone.quorate);
        let forgot = lone.next(&members(&[("b", Alive)]), now);
        assert_eq!((ids(&forgot), forgot.quorate), (vec!["b"], true));
    }

    #[test]
    fn one_of_two_is_not_a_majority() {
        let two = Quorum::of(["a".into(), "b".into()]);
        let q = two.next(&members(&[("a", Alive), ("b", Dead)]), Instant::now());
        assert!(!q.quorate);
    }
}
