//! Whether this node reaches a majority of the cluster over the peer link, not only through gossip.
//! Gossip can be fooled by a one-way partition: a node whose packets to its peers are lost still
//! hears their gossip and keeps them alive, and so kept owning its keys for as long as the
//! partition lasted while its peers had declared it dead and owned them too (measured: the docs'
//! benchmarks page, "Network faults"). Every member's link is pinged (an empty group) each round; a
//! member whose pings failed [`FAILED_ROUNDS`] rounds in a row is not counted, and a node that then
//! counts fewer than a majority of the members it knows owns nothing, as the majority rule says
//! (`cluster::quorum`).
//!
//! Failed rounds, not time since the last answer: a node whose own runtime stalled (a starved
//! test host) found every link "silent" when it woke and gave up its keys for a round (seen in
//! the steady-load test); a stalled prober sends no pings, so it counts no failures. Nor does a
//! round across this node's own pause (see `cluster::pause`): pings in flight when it stopped
//! time out when it resumes, the peers' answers still unread; and no round starts while the
//! pause detector is overdue.

use super::Peers;
use crate::cluster::View;
use crate::cluster::pause::Pauses;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How often each link is pinged.
pub const PING_EVERY: Duration = Duration::from_millis(200);
/// Failed pings in a row after which a member is not counted (~1.6 s at one a round): several,
/// so that a busy host's late answer does not take ownership away.
pub const FAILED_ROUNDS: u32 = 8;

/// Per member: consecutive failed pings, and whether its link ever answered.
#[derive(Debug, Default)]
pub struct Failures(HashMap<Arc<str>, (u32, bool)>);

impl Failures {
    /// Records one round of pings: members not pinged (no client: not alive) are forgotten.
    pub fn record(&mut self, round: &[(Arc<str>, bool)]) {
        let before = std::mem::take(&mut self.0);
        for (id, ok) in round {
            let (failed, answered) = before.get(id).copied().unwrap_or((0, false));
            let next = if *ok {
                (0, true)
            } else {
                (failed.saturating_add(1), answered)
            };
            self.0.insert(id.clone(), next);
        }
    }

    /// Members of `view`'s quorum reached: this node, and every other alive in gossip whose link
    /// has not failed [`FAILED_ROUNDS`] pings in a row after it once answered. Only that is
    /// evidence of a partition: a member just joined (not pinged yet, its name not resolving
    /// yet, its port not open) counts, or a new node's keys were held degraded after it was
    /// ready (seen in the StatefulSet and leave-and-rejoin tests).
    pub fn reached(&self, view: &View) -> usize {
        view.quorum
            .known
            .iter()
            .filter(|id| {
                let failed = self
                    .0
                    .get(*id)
                    .is_some_and(|(failed, answered)| *answered && *failed >= FAILED_ROUNDS);
                ***id == *view.self_id || (view.peer_addrs.contains_key(*id) && !failed)
            })
            .count()
    }
}

/// Whether a node reaching `reached` of the `known` members is cut off: reaching no more than
/// half. Knowing nobody yet (a node whose view has not formed) is not being cut off: a single
/// node logged a partition at every start.
fn cut_off(reached: usize, known: usize) -> bool {
    known > 0 && 2 * reached <= known
}

/// Whether a round of pings that started with `pauses` at `before` (pauses noticed) says
/// anything of the links: not when this node was paused meanwhile, or is still.
fn round_counts(pauses: &Pauses, before: u64) -> bool {
    pauses.noticed() == before && !pauses.stalled(tokio::time::Instant::now())
}

/// Pings every member's link each round and sets the facade's `cut_off` flag: whether this node
/// reaches fewer than a majority of the members it knows. Rounds across this node's own
/// pauses (`pauses`) are not counted.
pub async fn probe(peers: Arc<Peers>, view: Arc<ArcSwap<View>>, pauses: Arc<Pauses>) {
    let mut tick = tokio::time::interval(PING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = Failures::default();
    loop {
        tick.tick().await;
        let before = pauses.noticed();
        if !round_counts(&pauses, before) {
            continue;
        }
        let round = peers.ping_all().await;
        if !round_counts(&pauses, before) {
            continue;
        }
        failures.record(&round);
        let view = view.load();
        let known = view.quorum.known.len();
        let cut_off = cut_off(failures.reached(&view), known);
        if peers.set_cut_off(cut_off) != cut_off {
            if cut_off {
                tracing::warn!(
                    known,
                    "the peer links of a majority fail: owning no keys, answering from fallback shares"
                );
            } else {
                tracing::info!("the peer links of a majority answer again: owning keys");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::View;
    use crate::cluster::quorum::Quorum;

    fn abc(self_id: &str) -> View {
        let mut v = View::solo(self_id, "", "");
        v.quorum = Quorum::of(["a".into(), "b".into(), "c".into()]);
        for id in ["a", "b", "c"] {
            v.peer_addrs.insert(Arc::from(id), String::new());
        }
        v
    }

    #[test]
    fn cut_off_means_no_more_than_half_of_those_known() {
        assert!(!cut_off(0, 0), "a view not formed yet");
        assert!(!cut_off(1, 1));
        assert!(cut_off(1, 2));
        assert!(!cut_off(2, 3));
        assert!(cut_off(2, 4));
    }

    #[test]
    fn a_majority_of_links_failing_round_after_round_cuts_the_node_off() {
        let view = abc("a");
        let mut f = Failures::default();
        let round = |b: bool, c: bool| vec![(Arc::from("b"), b), (Arc::from("c"), c)];
        for _ in 0..FAILED_ROUNDS * 2 {
            f.record(&round(false, false));
        }
        assert_eq!(
            f.reached(&view),
            3,
            "links that never answered yet are not a partition"
        );
        f.record(&round(true, true));
        for _ in 0..FAILED_ROUNDS - 1 {
            f.record(&round(false, false));
        }
        assert_eq!(
            f.reached(&view),
            3,
            "not yet: a few failed pings are a busy host"
        );
        f.record(&round(false, true));
        assert_eq!(
            f.reached(&view),
            2,
            "one link down of two: still a majority"
        );
        for _ in 0..FAILED_ROUNDS {
            f.record(&round(false, false));
        }
        assert_eq!(f.reached(&view), 1);
        f.record(&round(true, false));
        assert_eq!(f.reached(&view), 2, "one answer and the link counts again");
        // A member not pinged yet (just joined) counts; one not alive in gossip does not.
        let mut fresh = Failures::default();
        assert_eq!(fresh.reached(&view), 3);
        fresh.record(&[(Arc::from("b"), true)]);
        assert_eq!(fresh.reached(&view), 3);
        let mut without_c = view.clone();
        without_c.peer_addrs.remove("c");
        assert_eq!(f.reached(&without_c), 2);
    }
}
