//! The store's change feed: which buckets changed, in order, for a follower (a replica sender,
//! the disk follower) to copy them elsewhere.
//!
//! Cheap enough to leave on: a write appends an entry to its shard's bounded ring, under the
//! shard lock it holds anyway. A check's entry carries the state the check left (a few words,
//! copied while their cache line is hot; a sliding log's excepted), so that the follower need
//! not look the bucket up in a table of up to a million, a cache miss per changed bucket (the
//! largest share of the disk follower's cost under a flood of new keys). The other writes
//! (merges, puts, removals, evictions) append the id alone, and their state is read at the
//! drain. Either way the newest entry of a bucket wins: one written a thousand times between
//! two drains is read once (coalesced).
//!
//! A check's write starts taking the ring's next line for writing before its lookup
//! ([`Ring::prepare`]): that line was last read by the follower on another core, and the
//! shard's unlock would otherwise wait for it.
//!
//! A carried state may be older than the bucket's state when the follower reads it, but never
//! older than the bucket's last change the feed holds: every write that changes what a bucket
//! spent appends an entry. So a follower that copies the store whole (when it starts, or after
//! it lagged) and then reads entries written before its copy still ends on the copy's state or
//! a newer one.
//!
//! With no follower nothing is appended (one relaxed load of a counter that only changes when a
//! follower comes or goes), and a store built without a feed (the SDK's) never has one. While
//! every follower keeps durable buckets only (a disk follower, no replica sender), a decision
//! on a bucket that is not durable, and was not before it, appends nothing either, nor does its
//! eviction: a node that keeps its daily quotas on disk does not pay for its per-second limits.
//!
//! Sequences are per shard, not global: a global sequence would be an atomic increment on one
//! cache line shared by every core on every write, the very contention the shards are there to
//! avoid, while a shard's sequence is a plain counter under its lock. A follower's [`Cursor`]
//! is therefore one sequence per shard.
//!
//! Bounded: a ring holds at most its share of the feed's entries and overwrites its oldest; a
//! follower whose next entry was overwritten is told it [`Lagged`] and resyncs from the store
//! itself (`Store::for_each`). A follower never makes the store grow.
//!
//! Hot: when every follower has read a shard's ring to its end, the ring starts again at its
//! front, so a shard's writes and the next drain touch the few cache lines the last drain read.
//! Left to run round, the rings (then 512 KiB together) were walked once every few seconds,
//! and every write was a cache miss held under the shard lock, every read at the drain
//! another: a visible share of what `--replicas 1` cost the SDK path in `perf` (measured: the
//! docs' benchmarks page, "What `--replicas 1` costs", and `bench/notes/replica-cost.md`).
//! Each follower has a bit ([`Cursor`]), and a ring remembers which have read it to its end
//! since its last change, so two followers (the replica sender and the disk follower) keep it
//! hot too: it starts again once the slower of them has read it.

use crate::limiter::BucketState;
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a bucket id with one multiplication: ids are hashes already (xxh3 of rule and key),
/// and SipHash of each was a visible share of a long drain in `perf`. Multiplied, not taken
/// as it is: the ids of one shard share their top bits (they pick the shard), which the set
/// reads first.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64s are hashed here; anything else is folded in, never lost.
        for b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(*b));
        }
    }

    #[inline]
    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Whether a bucket's changes enter the feed, and whether a disk follower keeps it. Local or
/// not is chosen when the bucket is created, and kept; durable or not is said again by every
/// write under a rule (a rule's `persist` may change), and read by a follower with the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bucket a replica should copy (an owner's bucket): its changes enter the feed.
    Replicated,
    /// A [`Kind::Replicated`] bucket that a disk follower also keeps (its rule's period is
    /// long enough to matter after a restart): [`Change::durable`].
    Durable,
    /// A bucket of this node alone (a fail-open share, salted id): never in the feed.
    Local,
}

/// One changed bucket, coalesced: its state as its last change left it (carried from a check)
/// or when the feed was read (`None`: gone — removed, handed over or evicted), and the
/// sequence of its last change in its shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub seq: u64,
    pub id: u64,
    pub state: Option<BucketState>,
    /// Whether the bucket is [`Kind::Durable`] (read with its state; false when gone).
    pub durable: bool,
}

/// Where a follower is in the feed: the next sequence it has not read, per shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub(super) next: Box<[u64]>,
    /// This follower's bit among the store's followers.
    pub(super) bit: u64,
    /// Whether it reads every change, not only those of durable buckets.
    pub(super) wide: bool,
}

/// A follower read the feed too late: changes it had not read were overwritten. Its cursor has
/// moved to the present; it must copy the whole store again (`Store::for_each`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("change feed overrun: {shards} shard(s) dropped changes not yet read; resync")]
pub struct Lagged {
    pub shards: usize,
}

/// Why a store cannot be followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    #[error("this store was built without a change feed")]
    Off,
}

/// One entry of a ring: a changed bucket, and the state its write left when the write carried
/// it (else read from the table at the drain; see the module's text). Plain words, 32 bytes
/// and `Copy`, rather than an `Option<BucketState>` (40 bytes, and a drop on every overwrite):
/// it is written under the shard lock on every check while a follower exists.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    id: u64,
    a: u64,
    b: u32,
    c: u32,
    d: u32,
    /// Which state the words hold ([`Entry::ID`]: none), and [`Entry::DURABLE`].
    what: u8,
}

impl Entry {
    const ID: u8 = 0;
    const GCRA: u8 = 1;
    const FIXED: u8 = 2;
    const SLIDING: u8 = 3;
    const DURABLE: u8 = 0x80;

    /// A change whose state is read at the drain.
    #[inline]
    pub fn id(id: u64) -> Self {
        Self {
            id,
            a: 0,
            b: 0,
            c: 0,
            d: 0,
            what: Self::ID,
        }
    }

    /// A change that carries the state its write left (of a bucket of `kind`), unless that
    /// state is a sliding log's (boxed and long: read at the drain).
    #[inline]
    pub fn written(id: u64, state: &BucketState, kind: Kind) -> Self {
        let durable = if kind == Kind::Durable {
            Self::DURABLE
        } else {
            0
        };
        let (what, a, b, c, d) = match *state {
            BucketState::Gcra { tat, tag } => (Self::GCRA, tat, tag, 0, 0),
            BucketState::Fixed {
                end,
                count,
                period_tag,
            } => (Self::FIXED, end, count, period_tag, 0),
            BucketState::Sliding {
                until,
                current,
                previous,
                period_tag,
            } => (Self::SLIDING, until, current, previous, period_tag),
            BucketState::Log(_) => return Self::id(id),
        };
        Self {
            id,
            a,
            b,
            c,
            d,
            what: what | durable,
        }
    }

    /// The state carried, if any, and whether the bucket is durable.
    #[inline]
    fn state(&self) -> (Option<BucketState>, bool) {
        let (a, b, c, d) = (self.a, self.b, self.c, self.d);
        let state = match self.what & !Self::DURABLE {
            Self::GCRA => BucketState::Gcra { tat: a, tag: b },
            Self::FIXED => BucketState::Fixed {
                end: a,
                count: b,
                period_tag: c,
            },
            Self::SLIDING => BucketState::Sliding {
                until: a,
                current: b,
                previous: c,
                period_tag: d,
            },
            _ => return (None, false),
        };
        (Some(state), self.what & Self::DURABLE != 0)
    }
}

/// One shard's changes, oldest first, at most `cap` of them (the caller's bound).
#[derive(Debug, Default)]
pub(super) struct Ring {
    /// The entry of sequence `s` is at `(s - base) % cap` (`base`: the sequence at index 0 when
    /// the ring last started empty).
    entries: Vec<Entry>,
    base: u64,
    /// The sequence the next change gets.
    next: u64,
    /// Followers (their bits) that have read every change the ring holds.
    caught_up: u64,
}

impl Ring {
    /// Records a change.
    #[inline]
    pub fn push(&mut self, entry: Entry, cap: usize) {
        let i = self.next_index(cap);
        if i == self.entries.len() {
            self.entries.push(entry);
        } else {
            self.entries[i] = entry;
        }
        self.next += 1;
        self.caught_up = 0;
    }

    /// Where the next [`Ring::push`] writes: past the end while the ring is not full, else
    /// over its oldest entry.
    #[inline]
    fn next_index(&self, cap: usize) -> usize {
        if self.entries.len() < cap {
            self.entries.len()
        } else {
            Self::index(self.next - self.base, cap)
        }
    }

    /// Starts taking for writing the cache line the next [`Ring::push`] writes, for a writer
    /// with a lookup to do first. The line was most likely last read by the follower on
    /// another core: a store to it waits for that core's copy to be invalidated, and the
    /// shard's unlock (a locked instruction) waits for the store. Without this, entries that
    /// carry states cost the checking threads as much as they spared the follower (`perf`:
    /// `bench/notes/durable-store.md`); with it, the wait overlaps the lookup's miss and the
    /// carried states are a net saving. By hand (`asm!`): `prefetchw` is not among the target
    /// features stable Rust can enable, and a read prefetch fetches a copy without ownership.
    #[inline]
    pub fn prepare(&self, cap: usize) {
        let at = self.entries.as_ptr().wrapping_add(self.next_index(cap));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is only a hint: it never faults (even past the allocation) and
        // changes no memory. `prefetchw` is a no-op on x86 CPUs without it.
        unsafe {
            std::arch::asm!(
                "prefetchw [{0}]",
                in(reg) at,
                options(nostack, preserves_flags, readonly)
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at;
    }

    /// Follower `bit` has read every change the ring holds; returns the followers that have.
    pub fn caught_up(&mut self, bit: u64) -> u64 {
        self.caught_up |= bit;
        self.caught_up
    }

    /// Where sequence `base + offset` is: a division only once the ring has wrapped (rewound
    /// rings rarely do; a 64-bit division is tens of cycles on every write and read).
    #[inline]
    fn index(offset: u64, cap: usize) -> usize {
        let cap = cap as u64;
        (if offset < cap { offset } else { offset % cap }) as usize
    }

    /// Starts the ring again at its front, keeping its sequence and its allocation: for when
    /// every change it holds has been read by every follower. Writes then go to the same few
    /// cache lines the last drain read, instead of walking the whole ring (each write was a
    /// cache miss under the shard lock, and each read another; see `Store::changes`).
    pub fn rewind(&mut self) {
        self.entries.clear();
        self.base = self.next;
    }

    /// The sequence the next change gets.
    pub fn head(&self) -> u64 {
        self.next
    }

    /// Drops what the ring holds (its last follower left), keeping its sequence.
    pub fn clear(&mut self) {
        self.entries = Vec::new();
        self.base = self.next;
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The changes from sequence `from` on, coalesced (each id once, at its last sequence, in
    /// sequence order), with the states their entries carry (the caller reads the others:
    /// see `Store::changes`);
    /// `Err(Lagged)` when some of them were overwritten. Either way the follower's place
    /// becomes [`Ring::head`].
    pub fn read(&self, from: u64, cap: usize, out: &mut Vec<Change>) -> Result<(), Lagged> {
        let oldest = self.next - self.entries.len() as u64;
        if from < oldest {
            return Err(Lagged { shards: 1 });
        }
        let start = out.len();
        // A drain every few ms finds a change or two per shard: a scan of those beats hashing
        // (a set is built only for a long read).
        let long = self.next - from > 16;
        let mut seen = HashSet::<u64, BuildHasherDefault<IdHasher>>::with_capacity_and_hasher(
            if long { (self.next - from) as usize } else { 0 },
            BuildHasherDefault::default(),
        );
        // Newest first, so that an id is taken at its last change.
        for seq in (from..self.next).rev() {
            let entry = self.entries[Self::index(seq - self.base, cap)];
            let id = entry.id;
            let new = if long {
                seen.insert(id)
            } else {
                !out[start..].iter().any(|c| c.id == id)
            };
            if new {
                let (state, durable) = entry.state();
                out.push(Change {
                    seq,
                    id,
                    state,
                    durable,
                });
            }
        }
        out[start..].reverse();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::*;
    use crate::limiter::Rule;
    use crate::limiter::test_support::{MS, T0, rule};
    use crate::rule::bucket_id;
    use ringlimit_proto::Algorithm;
    use ringlimit_proto::peer::Mark;

    fn id(i: u64) -> u64 {
        bucket_id(0x5eed, &format!("user:{i}"))
    }

    /// 10 per second, burst 10.
    fn tb10() -> Rule {
        rule(Algorithm::TokenBucket, 10, 1000, 10)
    }

    /// A store of one shard (so one sequence) holding `max_keys`, its feed `entries` long.
    fn one_shard(max_keys: u64, entries: usize) -> Store {
        let s = Store::with_feed(max_keys, entries);
        assert_eq!(s.shard_count(), 1);
        s
    }

    fn drain(s: &Store, c: &mut Cursor) -> Vec<Change> {
        let mut out = Vec::new();
        s.changes(c, &mut out).expect("not lagged");
        out
    }

    /// The one change a write made: its id and whether the bucket is still there.
    fn one(s: &Store, c: &mut Cursor, seq: &mut u64) -> (u64, bool) {
        let changes = drain(s, c);
        assert_eq!(changes.len(), 1, "{changes:?}");
        let ch = &changes[0];
        assert_eq!(ch.seq, *seq);
        *seq += 1;
        assert_eq!(ch.state, s.peek(ch.id));
        (ch.id, ch.state.is_some())
    }

    #[test]
    fn every_kind_of_write_appears_once_with_increasing_sequence() {
        let s = one_shard(5, 64);
        let r = tb10();
        let now = T0;
        let mut marks = Vec::new();
        for i in [2, 4, 5] {
            let d = s.check(id(i), &r, now, 1);
            marks.push(Mark {
                reset_ns: d.reset_ns,
                at_ns: now,
            });
        }
        let mut c = s.follow().expect("a feed");
        let mut seq = 0;
        assert!(
            drain(&s, &mut c).is_empty(),
            "what came before is not in the feed"
        );

        assert!(s.check(id(1), &r, now, 1).allowed);
        assert_eq!(one(&s, &mut c, &mut seq), (id(1), true), "an admission");
        assert!(!s.check(id(1), &r, now, 10).allowed);
        assert!(s.check(id(9), &r, now, 0).allowed);
        s.peek(id(1));
        assert!(
            drain(&s, &mut c).is_empty(),
            "a denial, a peek, a cost of 0"
        );

        s.refund(id(2), &r, 1, marks[0], now);
        assert_eq!(one(&s, &mut c, &mut seq), (id(2), true), "a refund");
        s.absorb(
            id(3),
            BucketState::Gcra {
                tat: now + 100 * MS,
                tag: 0,
            },
            now,
        );
        assert_eq!(one(&s, &mut c, &mut seq), (id(3), true), "a handover in");
        assert_eq!(s.take_if(|k, _| k == id(4)).len(), 1);
        assert_eq!(one(&s, &mut c, &mut seq), (id(4), false), "a handover out");
        assert!(s.remove(id(5)));
        assert_eq!(one(&s, &mut c, &mut seq), (id(5), false), "a reset");
        assert!(!s.remove(id(5)));
        assert!(
            drain(&s, &mut c).is_empty(),
            "removing nothing changes nothing"
        );

        // Held: 1, 2, 3 and two more; a sixth evicts one of them.
        for i in [6, 7] {
            s.check(id(i), &r, now, 1);
            assert_eq!(one(&s, &mut c, &mut seq), (id(i), true));
        }
        s.check(id(8), &r, now, 1);
        let changes = drain(&s, &mut c);
        assert_eq!(changes.len(), 2, "{changes:?}");
        let (evicted, new) = (&changes[0], &changes[1]);
        assert_eq!((evicted.seq, new.seq), (seq, seq + 1));
        assert_eq!((evicted.state.as_ref(), new.id), (None, id(8)));
        assert!([1, 2, 3, 6, 7].map(id).contains(&evicted.id));
        assert_eq!(s.len(), 5);
    }

    #[test]
    fn a_bucket_changed_many_times_is_read_once_in_its_last_state() {
        let s = one_shard(100, 1000);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        for k in 0..5 {
            s.check(id(1), &r, T0 + k, 1);
            s.check(id(2), &r, T0 + k, 1);
        }
        s.check(id(1), &r, T0 + 5, 1);
        let changes = drain(&s, &mut c);
        // Sequence order of each bucket's last change: 2 (seq 9), then 1 (seq 10).
        let got: Vec<_> = changes.iter().map(|ch| (ch.seq, ch.id)).collect();
        assert_eq!(got, vec![(9, id(2)), (10, id(1))]);
        assert_eq!(changes[1].state, s.peek(id(1)));
        assert!(drain(&s, &mut c).is_empty());
    }

    #[test]
    fn a_follower_that_falls_behind_is_told_and_resyncs() {
        let s = one_shard(1000, 64);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        for i in 0..65 {
            s.check(id(i), &r, T0, 1);
        }
        let mut out = Vec::new();
        assert_eq!(s.changes(&mut c, &mut out), Err(Lagged { shards: 1 }));
        assert!(out.is_empty());
        // The resync: the store itself, then the feed from the present on.
        let mut copy = Vec::new();
        s.for_each(|id, st| copy.push((id, st.clone())));
        assert_eq!(copy.len(), 65);
        s.check(id(100), &r, T0, 1);
        let changes = drain(&s, &mut c);
        assert_eq!(changes.len(), 1);
        assert_eq!((changes[0].seq, changes[0].id), (65, id(100)));
    }

    #[test]
    fn local_buckets_stay_out_of_the_feed() {
        let s = one_shard(3, 64);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        let d = s.check_local(id(1), &r, T0, 1);
        assert!(d.allowed);
        // Once local, always local: whichever call writes it.
        s.check(id(1), &r, T0, 1);
        let mark = Mark {
            reset_ns: d.reset_ns,
            at_ns: T0,
        };
        s.refund(id(1), &r, 1, mark, T0);
        s.absorb(id(1), BucketState::Gcra { tat: T0, tag: 0 }, T0);
        assert!(drain(&s, &mut c).is_empty());
        assert!(s.remove(id(1)));
        s.check_local(id(1), &r, T0, 1);
        assert_eq!(s.take_if(|_, _| true).len(), 1);
        assert!(drain(&s, &mut c).is_empty());
        // Evicted by owner buckets (the shares first: full again soonest): only the owner
        // buckets' evictions are heard of.
        s.check_local(id(2), &r, T0, 1);
        s.check_local(id(3), &r, T0, 1);
        let later = T0 + 50 * MS;
        for i in 4..8 {
            s.check(id(i), &r, later, 1);
        }
        assert!(!s.contains(id(2)) && !s.contains(id(3)));
        let changes = drain(&s, &mut c);
        let ids: Vec<u64> = changes.iter().map(|ch| ch.id).collect();
        assert!(!ids.contains(&id(2)) && !ids.contains(&id(3)), "{ids:?}");
        // Nor does a resync copy them.
        s.check_local(id(9), &r, later, 1);
        let mut copied = Vec::new();
        s.for_each(|id, _| copied.push(id));
        assert!(!copied.contains(&id(9)) && !copied.is_empty(), "{copied:?}");
        assert_eq!(changes.iter().filter(|ch| ch.state.is_none()).count(), 1);
    }

    #[test]
    fn the_feed_stays_within_its_bound_and_costs_nothing_unfollowed() {
        let s = one_shard(1000, 64);
        let r = rule(Algorithm::TokenBucket, 1_000_000, 1000, 1_000_000);
        for i in 0..1000 {
            s.check(id(i), &r, T0, 1);
        }
        assert_eq!(s.feed_len(), 0, "nobody follows: nothing recorded");
        let c = s.follow().expect("a feed");
        for i in 0..10_000 {
            s.check(id(i % 1000), &r, T0, 1);
        }
        assert_eq!(s.feed_len(), 64);
        s.unfollow(c);
        assert_eq!(s.feed_len(), 0, "the last follower frees the feed");
        s.check(id(1), &r, T0, 1);
        assert_eq!(s.feed_len(), 0);
    }

    #[test]
    fn puts_takes_and_seeded_checks_enter_the_feed() {
        let s = one_shard(10, 64);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        let mut seq = 0;
        let used = BucketState::Gcra {
            tat: T0 + 1000 * MS,
            tag: 0,
        };
        s.put(id(1), used.clone(), T0);
        s.put(id(1), used.clone(), T0);
        assert_eq!(drain(&s, &mut c).len(), 1, "coalesced");
        seq += 2;
        assert_eq!(s.take(id(1)), Some(used.clone()));
        assert_eq!(one(&s, &mut c, &mut seq), (id(1), false));
        assert_eq!(s.take(id(1)), None);
        // A seeded bucket is kept even when the check is denied (it carries what was spent).
        let d = s.check_seeded(Kind::Replicated, id(2), &r, || T0, 1, || Some(used.clone()));
        assert!(!d.allowed);
        assert_eq!(one(&s, &mut c, &mut seq), (id(2), true));
        // The seed is asked only on a miss.
        s.check_seeded(
            Kind::Replicated,
            id(2),
            &r,
            || T0,
            1,
            || unreachable!("held"),
        );
    }

    #[test]
    fn a_drained_ring_starts_again_at_its_front_unless_another_follower_needs_it() {
        let s = one_shard(1000, 64);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        for round in 0..10 {
            for i in 0..40 {
                s.check(id(round * 40 + i), &r, T0, 1);
            }
            assert_eq!(s.feed_len(), 40);
            // 400 changes through a ring of 64 and never lagged: each drain rewound it.
            assert_eq!(drain(&s, &mut c).len(), 40, "round {round}");
            assert_eq!(s.feed_len(), 0, "read by its only follower: rewound");
        }
        let last = drain(&s, &mut c);
        assert!(last.is_empty());
        s.check(id(1), &r, T0, 1);
        assert_eq!(
            drain(&s, &mut c)[0].seq,
            400,
            "sequences go on across rewinds"
        );

        // With a second follower behind, a drain leaves the ring as it is.
        let mut c2 = s.follow().expect("a feed");
        for i in 0..40 {
            s.check(id(i), &r, T0, 1);
        }
        assert_eq!(drain(&s, &mut c).len(), 40);
        assert_eq!(s.feed_len(), 40, "the second follower has not read them");
        assert_eq!(drain(&s, &mut c).len(), 0);
        assert_eq!(
            s.feed_len(),
            40,
            "read twice by one follower is not read by both"
        );
        assert_eq!(drain(&s, &mut c2).len(), 40);
        assert_eq!(s.feed_len(), 0, "read by both: rewound");
        for round in 0..5 {
            for i in 0..40 {
                s.check(id(round * 40 + i), &r, T0, 1);
            }
            assert_eq!(drain(&s, &mut c2).len(), 40);
            assert_eq!(drain(&s, &mut c).len(), 40, "round {round}: never lagged");
            assert_eq!(s.feed_len(), 0);
        }
        s.unfollow(c2);
        for i in 0..40 {
            s.check(id(i), &r, T0, 1);
        }
        assert_eq!(drain(&s, &mut c).len(), 40);
        assert_eq!(s.feed_len(), 0, "alone again: rewound");
    }

    #[test]
    fn a_change_says_whether_its_bucket_is_durable_as_its_last_write_under_a_rule_said() {
        let s = one_shard(100, 64);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        s.check_as(Kind::Durable, id(1), &r, || T0, 1);
        s.check_as(Kind::Replicated, id(2), &r, || T0, 1);
        let durable = |changes: Vec<Change>| -> Vec<(u64, bool)> {
            changes.iter().map(|ch| (ch.id, ch.durable)).collect()
        };
        assert_eq!(
            durable(drain(&s, &mut c)),
            vec![(id(1), true), (id(2), false)]
        );
        // A rule's `persist` changed: the next write says so.
        s.check_as(Kind::Replicated, id(1), &r, || T0, 1);
        s.check_as(Kind::Durable, id(2), &r, || T0, 1);
        assert_eq!(
            durable(drain(&s, &mut c)),
            vec![(id(1), false), (id(2), true)]
        );
        // What comes without a rule is of the kind its caller says; a gone bucket is not.
        s.absorb_as(
            Kind::Durable,
            id(3),
            BucketState::Gcra { tat: T0, tag: 0 },
            T0,
        );
        assert!(s.remove(id(2)));
        assert_eq!(
            durable(drain(&s, &mut c)),
            vec![(id(3), true), (id(2), false)]
        );
    }

    #[test]
    fn a_follower_of_durable_buckets_alone_hears_of_those_and_of_those_that_stop_being_durable() {
        let s = one_shard(100, 64);
        let r = tb10();
        let seen = |changes: Vec<Change>| -> Vec<(u64, bool, bool)> {
            changes
                .iter()
                .map(|ch| (ch.id, ch.durable, ch.state.is_some()))
                .collect()
        };
        let mut disk = s.follow_durable().expect("a feed");
        s.check_as(Kind::Durable, id(1), &r, || T0, 1);
        s.check_as(Kind::Replicated, id(2), &r, || T0, 1);
        s.check_as(Kind::Replicated, id(2), &r, || T0, 1);
        s.charge_seeded(Kind::Replicated, id(3), &r, T0, 2, || None);
        assert_eq!(
            seen(drain(&s, &mut disk)),
            vec![(id(1), true, true)],
            "nothing of buckets that never were durable"
        );
        // A rule's `persist` changed: the bucket's next write, no longer durable, is heard once
        // (the disk follower deletes it), the next ones not; the other way round, at once.
        s.check_as(Kind::Replicated, id(1), &r, || T0, 1);
        s.check_as(Kind::Durable, id(2), &r, || T0, 1);
        assert_eq!(
            seen(drain(&s, &mut disk)),
            vec![(id(1), false, true), (id(2), true, true)]
        );
        s.check_as(Kind::Replicated, id(1), &r, || T0, 1);
        assert!(drain(&s, &mut disk).is_empty());
        // Removals come as they come to any follower.
        assert!(s.remove(id(3)));
        assert_eq!(seen(drain(&s, &mut disk)), vec![(id(3), false, false)]);

        // A follower of every change (a replica sender) beside it: both hear of everything.
        let mut all = s.follow().expect("a feed");
        s.check_as(Kind::Replicated, id(4), &r, || T0, 1);
        s.check_as(Kind::Durable, id(5), &r, || T0, 1);
        let want = vec![(id(4), false, true), (id(5), true, true)];
        assert_eq!(seen(drain(&s, &mut all)), want);
        assert_eq!(seen(drain(&s, &mut disk)), want);
        // Gone again: the disk follower alone, buckets that are not durable are quiet again.
        s.unfollow(all);
        s.check_as(Kind::Replicated, id(4), &r, || T0, 1);
        s.check_as(Kind::Durable, id(5), &r, || T0, 1);
        assert_eq!(seen(drain(&s, &mut disk)), vec![(id(5), true, true)]);
    }

    #[test]
    fn a_follower_of_durable_buckets_alone_hears_of_evicted_durable_buckets_only() {
        let s = one_shard(50, 4096);
        let r = tb10();
        let mut disk = s.follow_durable().expect("a feed");
        let durable: Vec<u64> = (0..10).map(id).collect();
        for &d in &durable {
            s.check_as(Kind::Durable, d, &r, || T0, 1);
        }
        assert_eq!(drain(&s, &mut disk).len(), 10);
        // A flood of buckets that are not kept evicts both kinds.
        for i in 100..400 {
            s.check_as(Kind::Replicated, id(i), &r, || T0, 1);
        }
        let gone: Vec<u64> = durable
            .iter()
            .copied()
            .filter(|&d| s.peek(d).is_none())
            .collect();
        assert!(!gone.is_empty(), "the flood evicted some durable buckets");
        let heard = drain(&s, &mut disk);
        assert!(
            heard.iter().all(|ch| ch.state.is_none() && !ch.durable),
            "{heard:?}"
        );
        let mut heard: Vec<u64> = heard.iter().map(|ch| ch.id).collect();
        heard.sort_unstable();
        let mut gone = gone;
        gone.sort_unstable();
        assert_eq!(heard, gone, "each evicted durable bucket, and nothing else");
    }

    #[test]
    fn a_checks_entry_carries_its_state_and_a_sliding_logs_is_read_at_the_drain() {
        assert!(
            std::mem::size_of::<Entry>() <= 32,
            "an entry is written under the shard lock on every check while followed"
        );
        let s = one_shard(100, 64);
        let mut c = s.follow().expect("a feed");
        let tb = tb10();
        let log = rule(Algorithm::SlidingLog, 5, 1000, 5);
        s.check_as(Kind::Durable, id(1), &tb, || T0, 1);
        s.check_as(Kind::Durable, id(2), &log, || T0, 1);
        s.charge_seeded(Kind::Replicated, id(3), &tb, T0, 3, || None);
        let fixed = rule(Algorithm::FixedWindow, 5, 1000, 5);
        let sliding = rule(Algorithm::SlidingWindow, 5, 1000, 5);
        s.check_as(Kind::Durable, id(4), &fixed, || T0, 2);
        s.check_as(Kind::Replicated, id(5), &sliding, || T0, 1);
        s.check_as(Kind::Replicated, id(5), &sliding, || T0 + 1000 * MS, 2);
        let changes = drain(&s, &mut c);
        assert_eq!(changes.len(), 5);
        for ch in &changes {
            assert_eq!(ch.state, s.peek(ch.id), "{ch:?}");
        }
        assert!(matches!(changes[1].state, Some(BucketState::Log(_))));
        assert!(matches!(
            changes[3].state,
            Some(BucketState::Fixed { count: 2, .. })
        ));
        assert!(matches!(
            changes[4].state,
            Some(BucketState::Sliding {
                current: 2,
                previous: 1,
                ..
            })
        ));
        let durable: Vec<bool> = changes.iter().map(|ch| ch.durable).collect();
        assert_eq!(durable, vec![true, true, false, true, false]);
    }

    #[test]
    fn a_copy_after_following_and_the_entries_before_it_end_on_the_copys_state() {
        let s = one_shard(100, 64);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        // Written before the copy: entries carrying the states after each write.
        for k in 0..3 {
            s.check(id(1), &r, T0 + k * MS, 1);
        }
        s.check(id(2), &r, T0, 1);
        let mut copy = std::collections::HashMap::new();
        s.for_each(|id, st| {
            copy.insert(id, st.clone());
        });
        // Applied after the copy, as a follower does: each bucket ends on the copy's state.
        for ch in drain(&s, &mut c) {
            copy.insert(ch.id, ch.state.expect("held"));
        }
        for i in [1, 2] {
            assert_eq!(copy.get(&id(i)), s.peek(id(i)).as_ref());
        }
        // A removal after a carried write: the id alone, read at the drain (gone).
        s.check(id(1), &r, T0 + 5 * MS, 1);
        assert!(s.remove(id(1)));
        let changes = drain(&s, &mut c);
        assert_eq!(changes.len(), 1);
        assert_eq!((changes[0].id, changes[0].state.as_ref()), (id(1), None));
    }

    #[test]
    fn a_store_without_a_feed_cannot_be_followed() {
        assert_eq!(Store::new(100).follow(), Err(FeedError::Off));
    }

    #[test]
    fn a_follower_reads_every_shard() {
        let s = Store::with_feed(1_000_000, 100_000);
        assert!(s.shard_count() > 64);
        let r = tb10();
        let mut c = s.follow().expect("a feed");
        for i in 0..1000 {
            s.check(id(i), &r, T0, 1);
        }
        let mut got: Vec<u64> = drain(&s, &mut c).iter().map(|ch| ch.id).collect();
        got.sort_unstable();
        let mut want: Vec<u64> = (0..1000).map(id).collect();
        want.sort_unstable();
        assert_eq!(got, want);
        // A second follower starts at the present; the first is not disturbed.
        let mut c2 = s.follow().expect("a feed");
        s.check(id(1), &r, T0, 1);
        assert_eq!(drain(&s, &mut c2).len(), 1);
        assert_eq!(drain(&s, &mut c).len(), 1);
    }
}
