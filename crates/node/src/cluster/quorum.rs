//! The majority rule. A node that sees fewer than a majority of the members it last knew may be
//! on the small side of a partition: if it took ownership of the keys of the members it no
//! longer sees, each side would grant those keys their whole limit (measured: 100–122% over the
//! limits in a 2 | 1 split). Such a node owns nothing; it answers every owner-mode check from its
//! fallback share of the last known cluster, degraded, until it sees a majority again.
//!
//! "Last known" follows the cluster while it has a majority: a member declared dead or leaving
//! then drops out of it at once (the ring heals as before). On the small side it stays as it was,
//! except that members that left or that gossip forgot (chitchat drops dead members after its
//! grace period) leave it: a node alone for longer than that owns its keys again.

use super::membership::{Member, MemberState};
use std::sync::Arc;

/// Which members this node counts a majority of, and whether it sees one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quorum {
    /// The members last seen while this node saw a majority, sorted.
    pub known: Vec<Arc<str>>,
    /// Whether the alive members include a strict majority of `known`.
    pub quorate: bool,
}

impl Quorum {
    /// A node alone, as it starts: it knows itself only.
    pub fn solo(self_id: &Arc<str>) -> Self {
        Self {
            known: vec![self_id.clone()],
            quorate: true,
        }
    }

    /// The quorum after membership became `members` (sorted by id).
    pub fn next(&self, members: &[Member]) -> Self {
        let alive: Vec<Arc<str>> = members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| Arc::from(m.node_id.as_str()))
            .collect();
        let state = |id: &str| members.iter().find(|m| *m.node_id == *id).map(|m| m.state);
        // Members that announced their leave, or that gossip no longer knows, are not waited for.
        let known: Vec<Arc<str>> = self
            .known
            .iter()
            .filter(|id| matches!(state(id), Some(MemberState::Alive | MemberState::Dead)))
            .cloned()
            .collect();
        let seen = known
            .iter()
            .filter(|id| state(id) == Some(MemberState::Alive))
            .count();
        if known.is_empty() || 2 * seen > known.len() {
            Self {
                known: alive,
                quorate: true,
            }
        } else {
            Self {
                known,
                quorate: false,
            }
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

    fn members(states: &[(&str, MemberState)]) -> Vec<Member> {
        states
            .iter()
            .map(|(id, state)| Member {
                node_id: (*id).to_owned(),
                peer_addr: String::new(),
                http_addr: String::new(),
                state: *state,
                generation: 0,
            })
            .collect()
    }

    fn ids(q: &Quorum) -> Vec<&str> {
        q.known.iter().map(|s| &**s).collect()
    }

    use MemberState::{Alive, Dead, Leaving};

    #[test]
    fn a_cluster_grows_from_one_node() {
        let q = Quorum::solo(&Arc::from("a"));
        let q = q.next(&members(&[("a", Alive), ("b", Alive)]));
        assert!(q.quorate);
        let q = q.next(&members(&[("a", Alive), ("b", Alive), ("c", Alive)]));
        assert_eq!((ids(&q), q.quorate), (vec!["a", "b", "c"], true));
    }

    #[test]
    fn the_side_of_two_keeps_ownership_and_the_lone_node_gives_it_up() {
        let three = Quorum {
            known: vec!["a".into(), "b".into(), "c".into()],
            quorate: true,
        };
        let big = three.next(&members(&[("a", Alive), ("b", Dead), ("c", Alive)]));
        assert_eq!((ids(&big), big.quorate), (vec!["a", "c"], true));
        let lone = three.next(&members(&[("a", Dead), ("b", Alive), ("c", Dead)]));
        assert_eq!((ids(&lone), lone.quorate), (vec!["a", "b", "c"], false));
        assert_eq!(lone.share_members(), 3);
        // Healed: a majority is seen again.
        let healed = lone.next(&members(&[("a", Alive), ("b", Alive), ("c", Alive)]));
        assert!(healed.quorate);
    }

    #[test]
    fn nodes_that_join_the_small_side_do_not_make_it_a_majority() {
        let three = Quorum {
            known: vec!["a".into(), "b".into(), "c".into()],
            quorate: false,
        };
        let q = three.next(&members(&[
            ("a", Dead),
            ("b", Alive),
            ("c", Dead),
            ("d", Alive),
            ("e", Alive),
        ]));
        assert!(!q.quorate);
    }

    #[test]
    fn leaving_or_forgotten_members_are_not_waited_for() {
        let three = Quorum {
            known: vec!["a".into(), "b".into(), "c".into()],
            quorate: true,
        };
        // Two leave gracefully: the last one owns everything.
        let q = three.next(&members(&[("a", Leaving), ("b", Alive), ("c", Leaving)]));
        assert_eq!((ids(&q), q.quorate), (vec!["b"], true));
        // Alone in a partition until gossip forgot the others.
        let lone = three.next(&members(&[("a", Dead), ("b", Alive), ("c", Dead)]));
        assert!(!lone.quorate);
        let forgot = lone.next(&members(&[("b", Alive)]));
        assert_eq!((ids(&forgot), forgot.quorate), (vec!["b"], true));
    }

    #[test]
    fn one_of_two_is_not_a_majority() {
        let two = Quorum {
            known: vec!["a".into(), "b".into()],
            quorate: true,
        };
        assert!(!two.next(&members(&[("a", Alive), ("b", Dead)])).quorate);
    }
}
