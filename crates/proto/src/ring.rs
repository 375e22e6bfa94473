//! The consistent-hash ring that names each bucket's owner.
//!
//! Built on `hashring` with virtual nodes added by hand (one entry per `(node_id, replica)`),
//! hashed with xxh3 over explicit bytes so that every node and every SDK build agrees on the
//! owner of every bucket (std's `DefaultHasher` is not promised stable across Rust releases,
//! and hashing a `usize` would differ by platform).

use hashring::HashRing;
use std::hash::{Hash, Hasher};
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
        let mut ring = HashRing::with_hasher(xxhash_rust::xxh3::Xxh3Builder::new());
        ring.batch_add(
            ids.iter()
                .flat_map(|m| {
                    (0..VNODES_PER_MEMBER).map(move |replica| VNode {
                        member: m.clone(),
                        replica,
                    })
                })
                .collect(),
        );
        Self { ring, members: ids }
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

    const PINNED_OWNERS: [&str; 4] = ["ringlimit-1", "ringlimit-0", "ringlimit-1", "ringlimit-1"];
}
