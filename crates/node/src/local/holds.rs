//! What a client may give back: the holds its own checks and leases took.
//!
//! A refund names a bucket and an admission's mark, and the bucket gives back whatever it is
//! told: a token bucket takes any mark, and a window's mark is its reset time, which every
//! answer shows. So a client (an SDK, or anyone on a node without a secret) could refill any
//! bucket with refunds it made up. Each client therefore has a ledger of what was taken for
//! it — all-or-nothing holds ([`PeerAnswer::Held`](ringlimit_proto::peer::PeerAnswer::Held),
//! ringlimit.v1's `CheckResponse.hold`) and lease slices
//! ([`LeaseGrant::Granted`](ringlimit_proto::peer::LeaseGrant::Granted)) — and a refund gives
//! back at most what the ledger says that admission took, once. On the peer port a client is
//! its connection; on ringlimit.v1 (calls on any connection) its credential's name. Members
//! (who prove the cluster secret) are trusted with their refunds as with every other frame.
//!
//! A ledger is bounded: past its bound the oldest entry is forgotten, and a refund of it then
//! gives back nothing (the cost stays taken: a false deny at worst). An all-or-nothing
//! request's refunds follow its answers within a round trip; a lease's slices live a window
//! at most.

use ringlimit_proto::peer::Mark;
use std::collections::{HashMap, VecDeque};

/// Most holds one peer connection remembers (about 60 bytes each).
pub const MOST_HOLDS: usize = 4096;

/// One client's ledger of holds, by bucket and mark.
#[derive(Debug)]
pub struct Holds {
    left: HashMap<(u64, Mark), u64>,
    /// Insertion order, for forgetting the oldest; may name holds already given back (they
    /// are skipped), and is compacted when it grows past twice the bound.
    order: VecDeque<(u64, Mark)>,
    /// Most entries remembered.
    most: usize,
}

impl Default for Holds {
    /// A peer connection's ledger: [`MOST_HOLDS`] entries.
    fn default() -> Self {
        Self::bounded(MOST_HOLDS)
    }
}

impl Holds {
    /// A ledger that remembers at most `most` holds (at least 1).
    pub fn bounded(most: usize) -> Self {
        Self {
            left: HashMap::new(),
            order: VecDeque::new(),
            most: most.max(1),
        }
    }

    /// Remembers that the admission `mark` of bucket `id` took `cost` for this client.
    pub fn hold(&mut self, id: u64, mark: Mark, cost: u64) {
        if cost == 0 {
            return;
        }
        let left = self.left.entry((id, mark)).or_insert_with(|| {
            self.order.push_back((id, mark));
            0
        });
        *left = left.saturating_add(cost);
        while self.left.len() > self.most {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.left.remove(&oldest);
                }
                None => break,
            }
        }
        if self.order.len() > 2 * self.most {
            let left = &self.left;
            self.order.retain(|k| left.contains_key(k));
        }
    }

    /// Takes up to `want` of what admission `mark` of bucket `id` holds: what may be given
    /// back (0 when this client holds nothing under that mark, or gave it back already).
    pub fn take(&mut self, id: u64, mark: Mark, want: u64) -> u64 {
        let Some(left) = self.left.get_mut(&(id, mark)) else {
            return 0;
        };
        let give = want.min(*left);
        *left -= give;
        if *left == 0 {
            self.left.remove(&(id, mark));
        }
        give
    }

    /// Holds remembered.
    pub fn len(&self) -> usize {
        self.left.len()
    }

    pub fn is_empty(&self) -> bool {
        self.left.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(at_ns: u64) -> Mark {
        Mark {
            reset_ns: 1_000,
            at_ns,
        }
    }

    #[test]
    fn a_hold_gives_back_at_most_what_it_took_once() {
        let mut h = Holds::default();
        h.hold(7, mark(1), 10);
        assert_eq!(h.take(7, mark(1), 1_000), 10, "capped at the hold");
        assert_eq!(h.take(7, mark(1), 1), 0, "once");
        assert_eq!(h.take(8, mark(1), 1), 0, "another bucket");
        h.hold(7, mark(2), 5);
        assert_eq!(h.take(7, mark(3), 5), 0, "another mark");
        assert_eq!(h.take(7, mark(2), 2), 2, "part");
        assert_eq!(h.take(7, mark(2), 9), 3, "the rest");
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn the_ledger_forgets_its_oldest_past_its_bound_and_stays_bounded() {
        let mut h = Holds::default();
        for i in 0..(3 * MOST_HOLDS as u64) {
            h.hold(i, mark(i), 1);
            if i % 2 == 0 {
                assert_eq!(h.take(i, mark(i), 1), 1);
            }
        }
        assert!(h.len() <= MOST_HOLDS);
        assert!(h.order.len() <= 2 * MOST_HOLDS + 1);
        let last = 3 * MOST_HOLDS as u64 - 1;
        assert_eq!(h.take(last, mark(last), 1), 1, "the newest is kept");
        assert_eq!(h.take(1, mark(1), 1), 0, "the oldest was forgotten");
    }

    #[test]
    fn a_ledger_keeps_its_own_bound() {
        let mut h = Holds::bounded(3);
        for i in 0..10u64 {
            h.hold(i, mark(i), 2);
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.take(9, mark(9), 5), 2);
        assert_eq!(h.take(6, mark(6), 5), 0, "forgotten");
    }
}
