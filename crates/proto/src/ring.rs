//! The consistent-hash ring that names each bucket's owner.
//!
//! Built on `hashring` with virtual nodes added by hand (one entry per `(node_id, replica)`),
//! hashed with xxh3 over explicit bytes so that every node and every SDK build agrees on the
//! owner of every bucket (std's `DefaultHasher` is not promised stable across Rust releases,
//! and hashing a `usize` would differ by platform).

use hashring::HashRing;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

/// Virtual nodes per member: enough for an even spread over a handful of members (the largest
/// share stays within ~10% of the mean at 3 members) while a rebuild stays microseconds.
pub const VNODES_PER_MEMBER: u32 = 160;

#[derive(Clone, Debug, PartialEq, Eq)]
struct VNode {
    member: Arc<str>,
    replica: u32,
}

impl Hash for VNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.member.as_bytes());
        state.write(&self.replica.to_le_bytes());
    }
}

/// A bucket identity as a ring key: its eight little-endian bytes.
struct IdKey(u64);

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.to_le_bytes());
    }
}

/// The ring over a set of member ids. Immutable: rebuild it when membership changes.
#[derive(Clone)]
pub struct Ring {
    ring: HashRing<VNode, xxhash_rust::xxh3::Xxh3Builder>,
    members: Vec<Arc<str>>,
    /// The same virtual nodes as `ring`, as (point, index into `members`) sorted by point: the
    /// clockwise walk behind [`Ring::replicas`]. `hashring` has no walk of its own (its
    /// `get_with_replicas` clones the whole ring per call and repeats members).
    points: Vec<(u64, u32)>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("members", &self.members)
            .finish()
    }
}

impl Ring {
    /// A ring over `members` (order and duplicates do not matter).
    pub fn new<I, S>(members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut ids: Vec<Arc<str>> = members.into_iter().map(|m| Arc::from(m.as_ref())).collect();
        ids.sort();
        ids.dedup();
        let hasher = xxhash_rust::xxh3::Xxh3Builder::new();
        let vnodes: Vec<VNode> = ids
            .iter()
            .flat_map(|m| {
                (0..VNODES_PER_MEMBER).map(move |replica| VNode {
                    member: m.clone(),
                    replica,
                })
            })
            .collect();
        // `hashring` places a vnode at `hash_one(vnode)` with the same hasher: the same points.
        let mut points: Vec<(u64, u32)> = vnodes
            .iter()
            .map(|v| {
                let at = ids.iter().position(|m| m == &v.member).unwrap_or(0);
                (hasher.hash_one(v), at as u32)
            })
            .collect();
        points.sort_unstable();
        let mut ring = HashRing::with_hasher(hasher);
        ring.batch_add(vnodes);
        Self {
            ring,
            members: ids,
            points,
        }
    }

    /// The replicas of bucket `id`: the next `n` distinct members clockwise after its owner
    /// (never the owner; fewer when the ring has fewer other members). Allocates: callers
    /// group many buckets per call site, off the check path (see [`Ring::place`]).
    pub fn replicas(&self, id: u64, n: usize) -> Vec<&str> {
        let mut placed = Vec::with_capacity(n + 1);
        self.place(id, n, &mut placed);
        placed
            .iter()
            .skip(1)
            .map(|&m| &*self.members[m as usize])
            .collect()
    }

    /// Whether member `me` is one of bucket `id`'s first `n` replicas (0: none is).
    pub fn replicates(&self, id: u64, n: usize, me: &str) -> bool {
        n > 0 && self.replicas(id, n).contains(&me)
    }

    /// Bucket `id`'s owner then its first `n` replicas (those of [`Ring::replicas`]), as
    /// indexes into [`Ring::members`], into `out` (cleared first; empty for an empty ring).
    /// One hash and one search, no allocation once `out` has room: for callers that place
    /// every changed bucket (the replica sender).
    pub fn place(&self, id: u64, n: usize, out: &mut Vec<u32>) {
        out.clear();
        match self.members.len() {
            0 => return,
            1 => return out.push(0),
            _ => {}
        }
        let want = 1 + n.min(self.members.len() - 1);
        let key = self.ring_hasher().hash_one(IdKey(id));
        // The owner is the first point at or after `key` (wrapping), as in `hashring::get`.
        let start = self.points.partition_point(|&(p, _)| p < key);
        // Walks the points from `start` round to it again; split rather than `% len` per step
        // (a division per point, a few per bucket, on every changed bucket).
        let (wrapped, from_start) = self.points.split_at(start);
        for &(_, m) in from_start.iter().chain(wrapped) {
            if !out.contains(&m) {
                out.push(m);
                if out.len() == want {
                    break;
                }
            }
        }
    }

    fn ring_hasher(&self) -> xxhash_rust::xxh3::Xxh3Builder {
        xxhash_rust::xxh3::Xxh3Builder::new()
    }

    /// The owner of bucket `id`, or `None` for an empty ring.
    pub fn owner(&self, id: u64) -> Option<&str> {
        // A ring of one owns every id: no hashing (a single node's every check asks).
        if let [only] = self.members.as_slice() {
            return Some(only);
        }
        self.ring.get(&IdKey(id)).map(|v| v.member.as_ref())
    }

    /// Member ids, sorted.
    pub fn members(&self) -> &[Arc<str>] {
        &self.members
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn owners_are_stable_and_spread() {
        let ring = Ring::new(["a", "b", "c"]);
        let same = Ring::new(["c", "a", "b", "a"]);
        let mut counts: HashMap<&str, u32> = HashMap::new();
        for id in 0..30_000u64 {
            let id = crate::identity::bucket_id(7, &id.to_string());
            let o = ring.owner(id).unwrap_or_default();
            assert_eq!(Some(o), same.owner(id));
            *counts.entry(o).or_default() += 1;
        }
        for (m, c) in &counts {
            assert!((8_000..12_000).contains(c), "{m} owns {c} of 30000");
        }
    }

    #[test]
    fn removing_a_member_moves_only_its_keys() {
        let three = Ring::new(["a", "b", "c"]);
        let two = Ring::new(["a", "b"]);
        for id in 0..10_000u64 {
            let id = crate::identity::bucket_id(1, &id.to_string());
            let before = three.owner(id);
            if before != Some("c") {
                assert_eq!(before, two.owner(id));
            }
        }
        assert_eq!(Ring::new(Vec::<String>::new()).owner(1), None);
    }

    #[test]
    fn owner_of_a_fixed_id_never_changes() {
        // Pinned: nodes and SDKs of every version must agree. A change here breaks mixed clusters.
        let ring = Ring::new(["ringlimit-0", "ringlimit-1", "ringlimit-2"]);
        let owners: Vec<_> = [1u64, 2, 3, 0xdead_beef]
            .iter()
            .map(|&id| ring.owner(id).unwrap_or_default().to_string())
            .collect();
        assert_eq!(owners, PINNED_OWNERS);
    }

    #[test]
    fn place_is_owner_then_replicas() {
        let mut out = Vec::new();
        for members in [&["a"][..], &["a", "b"], &["a", "b", "c", "d", "e"]] {
            let ring = Ring::new(members);
            for id in 0..5_000u64 {
                let id = crate::identity::bucket_id(3, &id.to_string());
                for n in [0, 1, 2, 9] {
                    ring.place(id, n, &mut out);
                    let named: Vec<&str> =
                        out.iter().map(|&i| &*ring.members()[i as usize]).collect();
                    assert_eq!(named[0], ring.owner(id).unwrap_or_default());
                    assert_eq!(named[1..], ring.replicas(id, n)[..]);
                }
            }
        }
        Ring::new(Vec::<String>::new()).place(1, 1, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn replicas_are_the_next_distinct_members_after_the_owner() {
        let five = Ring::new(["a", "b", "c", "d", "e"]);
        let same = Ring::new(["e", "d", "c", "b", "a"]);
        let mut firsts: HashMap<&str, u32> = HashMap::new();
        for i in 0..5_000u64 {
            let id = crate::identity::bucket_id(3, &i.to_string());
            let owner = five.owner(id).unwrap_or_default();
            let r = five.replicas(id, 2);
            assert_eq!(r.len(), 2);
            assert!(!r.contains(&owner), "{r:?} holds the owner {owner}");
            assert_ne!(r[0], r[1]);
            assert_eq!(r, same.replicas(id, 2), "stable");
            // The first replica is the owner once the owner is gone: the ring's successor.
            let without: Vec<&str> = ["a", "b", "c", "d", "e"]
                .into_iter()
                .filter(|m| *m != owner)
                .collect();
            assert_eq!(Ring::new(without).owner(id), Some(r[0]));
            *firsts.entry(r[0]).or_default() += 1;
            // Asking for more than there are: every other member, once.
            assert_eq!(five.replicas(id, 9).len(), 4);
            assert_eq!(five.replicas(id, 0), Vec::<&str>::new());
        }
        assert_eq!(firsts.len(), 5, "every member replicates some buckets");
        let two = Ring::new(["a", "b"]);
        let one = Ring::new(["a"]);
        for id in [1u64, 2, 3, u64::MAX] {
            let owner = two.owner(id).unwrap_or_default();
            let other = if owner == "a" { "b" } else { "a" };
            assert_eq!(two.replicas(id, 3), vec![other]);
            assert!(one.replicas(id, 1).is_empty());
        }
        assert!(Ring::new(Vec::<String>::new()).replicas(1, 1).is_empty());
    }

    const PINNED_OWNERS: [&str; 4] = ["ringlimit-1", "ringlimit-0", "ringlimit-1", "ringlimit-1"];
}
