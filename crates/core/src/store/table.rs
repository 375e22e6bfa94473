//! One shard of the store: an open-addressing table (linear probing) with each bucket's state
//! inline in its slot, bounded in weight, evicting by CLOCK.
//!
//! Written by hand, not taken from a crate, for a measured reason: a check is one lookup and
//! one update of a 24-byte state, and what it costs is the number of *dependent* cache misses
//! on the way there. `quick_cache` (used before) costs three (hashbrown control bytes → an
//! index → a slab entry), and with a clock read per check — whose `lfence` stops one check's
//! misses from overlapping the next one's — the store fell far behind governor's keyed
//! limiter. Here a hit is one miss: the home slot holds the id and the state together
//! (32 bytes, two per cache line), and `Store::check_now` prefetches it before reading the
//! clock, which brought the store level with governor (measured: the docs' benchmarks page,
//! "The store path against governor"). A CLOCK hand needs positional access to the table,
//! which hashbrown's `HashTable` does not offer.
//!
//! Tables start small and double as buckets arrive, up to the size that holds the shard's
//! bound at most 3/4 full, so that a store sized for a million keys but holding a hundred
//! thousand touches a table sized for those.

use super::feed::Kind;
use super::slots::Slots;
use crate::limiter::BucketState;

/// The id of an empty slot. A real id 0 is kept as 1: one more colliding pair among 2⁶⁴ ids.
const EMPTY: u64 = 0;
/// Unreferenced buckets compared for each eviction (see [`Table::evict_one`]).
const VICTIM_SAMPLE: usize = 4;
/// Slots a table starts with.
const MIN_SLOTS: usize = 16;
/// The fullest a table gets, as a fraction: linear probing's miss path (every new bucket takes
/// one) costs ~8.5 slots at 3/4 and ~32 at 7/8.
const MAX_LOAD_NUM: usize = 3;
const MAX_LOAD_DEN: usize = 4;

/// Bytes of a slot: two per cache line.
pub(super) const SLOT_BYTES: usize = std::mem::size_of::<Slot>();
const _: () = assert!(SLOT_BYTES == 32);

#[derive(Clone)]
struct Slot {
    id: u64,
    state: BucketState,
}

impl Slot {
    const VACANT: Slot = Slot {
        id: EMPTY,
        state: BucketState::Gcra { tat: 0, tag: 0 },
    };
}

/// Buckets one operation evicted to stay within the bound.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Evicted {
    pub count: u64,
    /// Of those, buckets not yet full again at the time of the eviction.
    pub limiting: u64,
}

impl Evicted {
    fn add(&mut self, state: &BucketState, now: u64) {
        self.count += 1;
        if state.idle_at() > now {
            self.limiting += 1;
        }
    }
}

/// Three bits per slot, for 64 slots: kept apart from the slots so a slot stays 32 bytes
/// (6 KiB per 16k slots; stays in L2), and side by side so that a hit, which sets its
/// referenced bit, has its kind's bits on the same cache line.
#[derive(Clone, Copy, Default)]
struct Flags {
    /// CLOCK's referenced bits: set by a hit, cleared by the passing hand.
    referenced: u64,
    /// Buckets of this node alone (fail-open shares): their changes stay out of the feed.
    local: u64,
    /// Buckets a disk follower keeps ([`Kind::Durable`]).
    durable: u64,
}

/// Slot `i`'s kind in `flags` (its local and durable bits).
fn kind_in(flags: &[Flags], i: usize) -> Kind {
    let bit = 1u64 << (i % 64);
    let f = &flags[i / 64];
    if f.local & bit != 0 {
        Kind::Local
    } else if f.durable & bit != 0 {
        Kind::Durable
    } else {
        Kind::Replicated
    }
}

/// A bucket an operation removed, and whether it was local.
pub(super) struct Removed {
    pub state: BucketState,
    pub kind: Kind,
}

impl Removed {
    /// Whether the bucket was this node's alone (never in the feed).
    pub fn local(&self) -> bool {
        self.kind == Kind::Local
    }
}

pub(super) struct Table {
    /// A power of two of slots, in a memory map of their own (see [`Slots`]).
    slots: Slots<Slot>,
    /// Each slot's [`Flags`] bits, 64 slots a word.
    flags: Box<[Flags]>,
    len: usize,
    weight: u64,
    capacity: u64,
    max_slots: usize,
    hand: usize,
}

/// Where a table's memory was (see [`Table::layout`]), for prefetches taken before its lock.
/// Only ever a hint: a stale layout prefetches wrong lines, nothing worse.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Layout {
    pub slots: usize,
    pub mask: usize,
    pub flags: usize,
}

/// Starts loading into the cache the home slot of `id` in a table laid out as `at`, and the
/// word of its flags, for a caller with other work to do before the lookup. The flags too:
/// every hit sets its referenced bit and every replacement clears it, and where buckets are
/// touched rarely (a replica's copies, one frame per flush interval) that word was a cache
/// miss of its own, most of what keeping a replica's copy cost in `perf`
/// (`bench/notes/replica-cost.md`).
#[inline]
pub(super) fn prefetch(at: Layout, id: u64) {
    let i = key(id) as usize & at.mask;
    hint(at.slots.wrapping_add(i * std::mem::size_of::<Slot>()));
    hint(at.flags.wrapping_add(i / 64 * std::mem::size_of::<Flags>()));
}

/// Starts loading the cache line at `addr` for reading: a hint the CPU may drop, safe on any
/// address (callers elsewhere in the workspace use it to keep their `unsafe` here).
#[inline]
pub fn hint(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults, even on an address no longer mapped,
    // and changes no memory.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// The stored form of an id (see [`EMPTY`]).
fn key(id: u64) -> u64 {
    if id == EMPTY { 1 } else { id }
}

/// Slots that hold `capacity` weight units (each bucket weighs at least 1) at most 3/4 full.
pub(super) fn slots_for(capacity: u64) -> usize {
    let entries = usize::try_from(capacity).unwrap_or(usize::MAX / 2);
    entries
        .saturating_mul(MAX_LOAD_DEN)
        .div_ceil(MAX_LOAD_NUM)
        .max(entries + 1)
        .next_power_of_two()
}

impl Table {
    /// An empty table bounded to `capacity` weight units.
    pub fn new(capacity: u64) -> Self {
        let max_slots = slots_for(capacity);
        Self::with_slots(capacity, max_slots, MIN_SLOTS.min(max_slots))
    }

    fn with_slots(capacity: u64, max_slots: usize, n: usize) -> Self {
        Self {
            slots: Slots::new(n, Slot::VACANT),
            flags: vec![Flags::default(); n.div_ceil(64)].into_boxed_slice(),
            len: 0,
            weight: 0,
            capacity,
            max_slots,
            hand: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Slots allocated now.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// `Ok(slot)` holding `id` (stored form), or `Err(slot)`: the empty slot ending its probe.
    #[inline]
    fn find(&self, id: u64) -> Result<usize, usize> {
        let mask = self.mask();
        // Ids are well-spread hashes (xxh3), so their low bits index the table directly; the
        // store picks the shard from the top bits.
        let mut i = id as usize & mask;
        loop {
            let here = self.slots[i].id;
            if here == id {
                return Ok(i);
            }
            if here == EMPTY {
                return Err(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Where the slots and flags are, and the index mask, for [`prefetch`].
    pub fn layout(&self) -> Layout {
        Layout {
            slots: self.slots.as_ptr() as usize,
            mask: self.mask(),
            flags: self.flags.as_ptr() as usize,
        }
    }

    fn set_referenced(&mut self, i: usize) {
        let bit = 1u64 << (i % 64);
        let word = &mut self.flags[i / 64].referenced;
        // Read first: a hot bucket's bit is set already, and a store would dirty the line.
        if *word & bit == 0 {
            *word |= bit;
        }
    }

    /// Clears slot `i`'s referenced bit, saying whether it was set.
    fn take_referenced(&mut self, i: usize) -> bool {
        let bit = 1u64 << (i % 64);
        let word = &mut self.flags[i / 64].referenced;
        let was = *word & bit != 0;
        *word &= !bit;
        was
    }

    fn is_local(&self, i: usize) -> bool {
        self.flags[i / 64].local & (1 << (i % 64)) != 0
    }

    /// Slot `i`'s kind (its local and durable bits).
    fn kind_at(&self, i: usize) -> Kind {
        kind_in(&self.flags, i)
    }

    fn set_kind(&mut self, i: usize, kind: Kind) {
        let bit = 1u64 << (i % 64);
        let f = &mut self.flags[i / 64];
        let set = |word: &mut u64, on: bool| {
            // Read first: a store of an unchanged word would dirty the line.
            if (*word & bit != 0) != on {
                *word ^= bit;
            }
        };
        set(&mut f.local, kind == Kind::Local);
        set(&mut f.durable, kind == Kind::Durable);
    }

    /// The state of `id` and its kind, recency untouched.
    pub fn peek_kind(&self, id: u64) -> Option<(&BucketState, Kind)> {
        self.find(key(id))
            .ok()
            .map(|i| (&self.slots[i].state, self.kind_at(i)))
    }

    pub fn contains(&self, id: u64) -> bool {
        self.find(key(id)).is_ok()
    }

    /// The state of `id`, recency untouched.
    pub fn peek(&self, id: u64) -> Option<&BucketState> {
        self.find(key(id)).ok().map(|i| &self.slots[i].state)
    }

    /// Runs `f` on the state of `id` (a use: marks it recently referenced); also says whether
    /// the bucket is local. If `f` changed the state's weight (a reloaded rule replaced a
    /// sliding log), the bound is restored by evicting, which `Evicted` reports and `gone`
    /// hears of (the id of each evicted bucket that is not local).
    #[inline]
    pub fn update<R>(
        &mut self,
        id: u64,
        now: u64,
        f: impl FnOnce(&mut BucketState) -> R,
        gone: impl FnMut(u64, Kind),
    ) -> Option<(R, bool, Evicted)> {
        self.update_as(id, now, None, f, gone)
            .map(|(r, was, e)| (r, was == Kind::Local, e))
    }

    /// [`Table::update`] that also makes a bucket that is not local of `kind` when given one
    /// ([`Kind::Replicated`] or [`Kind::Durable`]: a write under a rule says whether its bucket
    /// is kept on disk; a local bucket stays local). Gives the bucket's kind before the write
    /// (a feed that records durable buckets only must hear of one that stops being durable).
    #[inline]
    pub fn update_as<R>(
        &mut self,
        id: u64,
        now: u64,
        kind: Option<Kind>,
        f: impl FnOnce(&mut BucketState) -> R,
        gone: impl FnMut(u64, Kind),
    ) -> Option<(R, Kind, Evicted)> {
        let i = self.find(key(id)).ok()?;
        self.set_referenced(i);
        let was = self.kind_at(i);
        if let Some(kind) = kind
            && was != Kind::Local
            && kind != Kind::Local
        {
            self.set_kind(i, kind);
        }
        let state = &mut self.slots[i].state;
        let before = state.weight();
        let out = f(state);
        let after = state.weight();
        let mut evicted = Evicted::default();
        if after != before {
            self.weight = self.weight - before + after;
            self.make_room(0, now, &mut evicted, gone);
        }
        Some((out, was, evicted))
    }

    /// Adds a bucket (replacing one with the same id), `local` or not, evicting others as the
    /// bound requires (`gone` hears of those not local). A bucket heavier than the whole table
    /// is not kept (reported as evicted).
    pub fn insert(
        &mut self,
        id: u64,
        state: BucketState,
        kind: Kind,
        now: u64,
        gone: impl FnMut(u64, Kind),
    ) -> Evicted {
        let id = key(id);
        let mut evicted = Evicted::default();
        let w = state.weight();
        if let Ok(i) = self.find(id) {
            // Replaced where it lies when it grows no heavier (nothing to evict): a replica's
            // copies are replaced on every change their owner sends, and removing (a shift of
            // the probe run) then probing again cost as much as the lookup's cache miss.
            let old = self.slots[i].state.weight();
            if w <= old {
                self.slots[i].state = state;
                self.weight = self.weight - old + w;
                self.take_referenced(i);
                self.set_kind(i, kind);
                return evicted;
            }
            self.remove_at(i);
        }
        if w > self.capacity {
            evicted.add(&state, now);
            return evicted;
        }
        self.make_room(w, now, &mut evicted, gone);
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM
            && self.slots.len() < self.max_slots
        {
            self.grow();
        }
        // Removed above if present, so the probe ends at an empty slot.
        if let Err(i) = self.find(id) {
            self.slots[i] = Slot { id, state };
            self.set_kind(i, kind);
            self.len += 1;
            self.weight += w;
        }
        evicted
    }

    /// Evicts until `extra` more weight fits within the bound, telling `gone` the id of each
    /// evicted bucket that is not local.
    fn make_room(
        &mut self,
        extra: u64,
        now: u64,
        evicted: &mut Evicted,
        mut gone: impl FnMut(u64, Kind),
    ) {
        while self.len > 0 && self.weight + extra > self.capacity {
            let (id, out) = self.evict_one(now);
            evicted.add(&out.state, now);
            if !out.local() {
                gone(id, out.kind);
            }
        }
    }

    /// CLOCK: the hand passes over slots, sparing (once) those referenced since its last pass.
    /// A bucket that is full again is dropped whatever its bit: it equals a fresh one, so
    /// dropping it loses nothing. Otherwise, of the first [`VICTIM_SAMPLE`] unreferenced
    /// buckets the hand meets, the one soonest full again goes: the eviction that may admit the
    /// least over its rule: in a flood of new keys into a full store, taking the first candidate
    /// dropped a bucket still limiting far more often (measured: the docs' benchmarks
    /// page, "Key flood").
    /// Must not be called on an empty table.
    ///
    /// The hand visits the slots in a scattered order (an odd stride near 0.618 of the table
    /// covers every slot once per turn). Swept in address order, the slots just ahead of the
    /// hand would be the ones longest unswept and fill up into one long probe run, which made
    /// every check of a key flood walk it (measured: the docs' benchmarks page, "Key flood").
    fn evict_one(&mut self, now: u64) -> (u64, Removed) {
        let mask = self.mask();
        let stride = self.stride();
        // (slot, idle_at) of the best candidate so far, and candidates seen.
        let mut best: Option<(usize, u64)> = None;
        let mut seen = 0;
        // Each turn of the hand clears every bit it passes, so candidates keep coming.
        loop {
            let i = self.hand & mask;
            self.hand = (i + stride) & mask;
            let slot = &self.slots[i];
            if slot.id == EMPTY {
                continue;
            }
            let idle_at = slot.state.idle_at();
            if idle_at <= now {
                return (slot.id, self.remove_at(i));
            }
            if self.take_referenced(i) {
                continue;
            }
            let victim = match best {
                Some((b, b_idle_at)) if b_idle_at <= idle_at => b,
                _ => {
                    best = Some((i, idle_at));
                    i
                }
            };
            seen += 1;
            if seen == VICTIM_SAMPLE || seen == self.len {
                return (self.slots[victim].id, self.remove_at(victim));
            }
        }
    }

    /// The hand's step: odd, so that it reaches every slot of the power-of-two table.
    fn stride(&self) -> usize {
        // 0.618 of the table, as a fraction of 2^64 (the golden ratio's), times the size.
        ((self.slots.len() as u128 * 0x9e37_79b9_7f4a_7c15) >> 64) as usize | 1
    }

    pub fn remove(&mut self, id: u64) -> Option<Removed> {
        let i = self.find(key(id)).ok()?;
        Some(self.remove_at(i))
    }

    /// Empties slot `i` and shifts later buckets of its probe run back (no tombstones, so
    /// misses stay short however many buckets come and go).
    fn remove_at(&mut self, mut i: usize) -> Removed {
        let mask = self.mask();
        let out = std::mem::replace(&mut self.slots[i], Slot::VACANT);
        self.len -= 1;
        self.weight -= out.state.weight();
        self.take_referenced(i);
        let kind = self.kind_at(i);
        self.set_kind(i, Kind::Replicated);
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let id = self.slots[j].id;
            if id == EMPTY {
                return Removed {
                    state: out.state,
                    kind,
                };
            }
            let home = id as usize & mask;
            // The bucket at `j` may fill the hole at `i` if its home is not after the hole on
            // its way to `j`, cyclically.
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(i) & mask) {
                self.slots[i] = std::mem::replace(&mut self.slots[j], Slot::VACANT);
                if self.take_referenced(j) {
                    self.set_referenced(i);
                }
                let kind = self.kind_at(j);
                if kind != Kind::Replicated {
                    self.set_kind(j, Kind::Replicated);
                    self.set_kind(i, kind);
                }
                i = j;
            }
        }
    }

    /// Doubles the slots, rehashing every bucket (their flags go along).
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).min(self.max_slots);
        let mut bigger = Self::with_slots(self.capacity, self.max_slots, n);
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.id == EMPTY {
                continue;
            }
            let slot = std::mem::replace(slot, Slot::VACANT);
            let referenced = self.flags[i / 64].referenced & (1 << (i % 64)) != 0;
            let kind = kind_in(&self.flags, i);
            if let Err(j) = bigger.find(slot.id) {
                if referenced {
                    bigger.set_referenced(j);
                }
                bigger.set_kind(j, kind);
                bigger.slots[j] = slot;
            }
        }
        bigger.len = self.len;
        bigger.weight = self.weight;
        // The hand's place means nothing in the new layout; the next pass starts over.
        *self = bigger;
    }

    /// The longest run of occupied slots (cyclically): what a miss may have to probe.
    #[cfg(test)]
    fn longest_run(&self) -> usize {
        let n = self.slots.len();
        let Some(start) = (0..n).find(|&i| self.slots[i].id == EMPTY) else {
            return n;
        };
        let (mut longest, mut run) = (0, 0);
        for k in 1..=n {
            if self.slots[(start + k) % n].id == EMPTY {
                run = 0;
            } else {
                run += 1;
                longest = longest.max(run);
            }
        }
        longest
    }

    /// Calls `f` on every durable bucket.
    pub fn for_each_durable(&self, mut f: impl FnMut(u64, &BucketState)) {
        for (i, s) in self.slots.iter().enumerate() {
            if s.id != EMPTY && kind_in(&self.flags, i) == Kind::Durable {
                f(s.id, &s.state);
            }
        }
    }

    /// Calls `f` on every bucket that is not local.
    pub fn for_each_replicated(&self, mut f: impl FnMut(u64, &BucketState)) {
        for (i, s) in self.slots.iter().enumerate() {
            if s.id != EMPTY && !self.is_local(i) {
                f(s.id, &s.state);
            }
        }
    }

    /// Ids (stored form) whose state `pick` selects.
    pub fn ids_where(&self, mut pick: impl FnMut(u64, &BucketState) -> bool) -> Vec<u64> {
        self.slots
            .iter()
            .filter(|s| s.id != EMPTY && pick(s.id, &s.state))
            .map(|s| s.id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tat(t: u64) -> BucketState {
        BucketState::Gcra { tat: t, tag: 0 }
    }

    impl Table {
        /// [`Table::insert`] of a bucket that is not local, evictions unheard.
        fn put(&mut self, id: u64, state: BucketState, now: u64) -> Evicted {
            self.insert(id, state, Kind::Replicated, now, |_, _| ())
        }

        /// [`Table::update`], evictions unheard.
        fn touch<R>(
            &mut self,
            id: u64,
            now: u64,
            f: impl FnOnce(&mut BucketState) -> R,
        ) -> Option<(R, Evicted)> {
            self.update(id, now, f, |_, _| ()).map(|(r, _, e)| (r, e))
        }
    }

    /// Ids that all want slot 0 of a table of any size up to 2⁸ slots (same low byte).
    fn crowded(n: u64) -> impl Iterator<Item = u64> {
        (1..=n).map(|k| k << 8)
    }

    #[test]
    fn grows_up_to_the_bound_and_no_further() {
        let mut t = Table::new(1000);
        assert_eq!(t.slots(), MIN_SLOTS);
        for id in 1..=1000 {
            assert_eq!(t.put(id, tat(u64::MAX), 0), Evicted::default());
        }
        assert_eq!(t.len(), 1000);
        // 1000 at most 3/4 full: 2048 slots.
        assert_eq!(t.slots(), 2048);
        assert_eq!(slots_for(1000), 2048);
        for id in 1..=1000 {
            assert!(t.contains(id), "{id}");
        }
        let e = t.put(5000, tat(u64::MAX), 0);
        assert_eq!((e.count, e.limiting), (1, 1));
        assert_eq!((t.len(), t.slots()), (1000, 2048));
    }

    #[test]
    fn a_replaced_bucket_stays_in_its_slot_or_makes_room_as_it_grows() {
        let mut t = Table::new(10);
        let ids: Vec<u64> = crowded(10).collect();
        for (k, &id) in ids.iter().enumerate() {
            t.put(id, tat(u64::MAX - k as u64), 0);
        }
        // Same weight: replaced where it lies, every bucket of the probe run still found.
        assert_eq!(t.put(ids[3], tat(7), 0), Evicted::default());
        assert_eq!((t.len(), t.weight), (10, 10));
        assert_eq!(t.peek(ids[3]), Some(&tat(7)));
        for &id in &ids {
            assert!(t.contains(id), "{id}");
        }
        // Heavier (a sliding log of up to 16 entries weighs 5): room is made by evicting
        // others, never the bucket being replaced, and the bound holds.
        let heavy = BucketState::Log(Box::new(crate::limiter::SlidingLog::new(16)));
        let w = heavy.weight();
        assert_eq!(w, 5);
        let e = t.put(ids[5], heavy.clone(), 0);
        assert_eq!(e.count, w - 1);
        assert_eq!(t.peek(ids[5]), Some(&heavy));
        assert!(t.weight <= 10);
    }

    #[test]
    fn removal_keeps_every_other_bucket_of_a_probe_run_findable() {
        let mut t = Table::new(100);
        let ids: Vec<u64> = crowded(40).collect();
        for (k, &id) in ids.iter().enumerate() {
            t.put(id, tat(k as u64), 0);
        }
        // Remove from the middle, the start and the end of the run, checking all the rest.
        for (n, &gone) in [ids[20], ids[0], ids[39], ids[1]].iter().enumerate() {
            assert!(t.remove(gone).is_some());
            assert!(t.remove(gone).is_none());
            for (k, &id) in ids.iter().enumerate() {
                let kept = ![ids[20], ids[0], ids[39], ids[1]][..=n].contains(&id);
                assert_eq!(t.peek(id).cloned(), kept.then(|| tat(k as u64)), "{id}");
            }
        }
        assert_eq!(t.len(), 36);
    }

    #[test]
    fn runs_that_wrap_around_the_end_survive_removal() {
        let mut t = Table::new(10);
        assert_eq!(t.slots(), 16);
        // Homes 14 and 15, spilling into 0 and 1; then a bucket whose home is 0.
        let ids = [14, 14 + 16, 15, 15 + 16, 16 * 4];
        for &id in &ids {
            t.put(id, tat(id), 0);
        }
        t.remove(14);
        for &id in &ids[1..] {
            assert_eq!(t.peek(id), Some(&tat(id)), "{id}");
        }
    }

    #[test]
    fn eviction_under_a_flood_keeps_probe_runs_short() {
        // A full table taking ten times its size in new buckets: evicting in address order
        // would pile the buckets up ahead of the hand into one run thousands of slots long.
        let mut t = Table::new(12_000);
        let mut x = 0u64;
        for _ in 0..120_000 {
            // splitmix64: well-spread ids, as the store's are.
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            t.put(z ^ (z >> 31), tat(u64::MAX), 0);
        }
        assert_eq!((t.len(), t.slots()), (12_000, 16_384));
        let longest = t.longest_run();
        assert!(longest < 300, "longest probe run {longest}");
    }

    #[test]
    fn id_zero_is_a_bucket_like_any_other() {
        let mut t = Table::new(10);
        t.put(0, tat(7), 0);
        assert_eq!(t.peek(0), Some(&tat(7)));
        assert_eq!(t.ids_where(|_, _| true), vec![1]);
        assert_eq!(t.remove(0).map(|r| r.state), Some(tat(7)));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn clock_spares_referenced_buckets_and_drops_idle_ones_first() {
        let mut t = Table::new(100);
        for id in 1..=100 {
            t.put(id, tat(100), 0);
        }
        // The first half is used; ten new buckets push out ten unused ones.
        for id in 1..=50 {
            t.touch(id, 0, |_| ());
        }
        for id in 101..=110 {
            let e = t.put(id, tat(100), 0);
            assert_eq!((e.count, e.limiting), (1, 1));
        }
        assert!((1..=50).all(|id| t.contains(id)));
        assert_eq!((51..=110).filter(|&id| t.contains(id)).count(), 50);

        // All used, one of them full again (idle at 50 <= now): that one goes.
        let mut t = Table::new(4);
        for id in 1..=4 {
            t.put(id, tat(100), 0);
            t.touch(id, 0, |_| ());
        }
        t.touch(3, 0, |s| *s = tat(50));
        let e = t.put(5, tat(100), 60);
        assert_eq!((e.count, e.limiting), (1, 0));
        assert!(!t.contains(3));
    }

    #[test]
    fn of_the_unreferenced_the_bucket_soonest_full_again_goes() {
        // Four unreferenced buckets still limiting until 400, 100, 300, 200: the next insert
        // (at 50, none idle yet) evicts the one full again at 100.
        let mut t = Table::new(4);
        for (id, until) in [(1, 400), (2, 100), (3, 300), (4, 200)] {
            t.put(id, tat(until), 0);
        }
        let e = t.put(5, tat(500), 50);
        assert_eq!((e.count, e.limiting), (1, 1));
        assert!(!t.contains(2));
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn a_heavier_state_evicts_others() {
        use crate::limiter::test_support::rule;
        use ringlimit_proto::Algorithm;
        let log = rule(Algorithm::SlidingLog, 100, 1000, 100);
        let mut t = Table::new(30);
        for id in 1..=30 {
            t.put(id, tat(100), 0);
        }
        // Bucket 1 becomes a log of weight 26 holding one admission: 25 others must go.
        let (_, e) = t
            .touch(1, 0, |s| {
                *s = BucketState::fresh(&log);
                s.decide(&log, 0, 1)
            })
            .expect("present");
        assert_eq!(e.count, 25);
        assert_eq!(t.len(), 5);
        assert!(t.contains(1));
    }

    #[test]
    fn kinds_follow_their_buckets_through_removal_growth_and_eviction() {
        let mut t = Table::new(40);
        // A crowded run of 20, of every kind in turn.
        let ids: Vec<u64> = crowded(20).collect();
        let kind_of = |k: usize| match k % 3 {
            0 => Kind::Replicated,
            1 => Kind::Local,
            _ => Kind::Durable,
        };
        for (k, &id) in ids.iter().enumerate() {
            t.insert(id, tat(u64::MAX), kind_of(k), 0, |_, _| ());
        }
        let kind = |t: &Table, id: u64| t.peek_kind(id).map(|(_, k)| k);
        // Removing the head shifts every other bucket of the run back.
        assert!(!t.remove(ids[0]).expect("held").local());
        assert!(t.remove(ids[1]).expect("held").local());
        for (k, &id) in ids.iter().enumerate().skip(2) {
            assert_eq!(kind(&t, id), Some(kind_of(k)), "{id}");
        }
        // Filling past the first table's size grows it (the flags go along), then evicts:
        // only buckets that are not local are heard of.
        for id in 1000..1040 {
            t.insert(id, tat(u64::MAX), Kind::Replicated, 0, |_, _| ());
        }
        for (k, &id) in ids.iter().enumerate().skip(2) {
            if let Some(got) = kind(&t, id) {
                assert_eq!(got, kind_of(k), "{id}");
            }
        }
        let mut heard = Vec::new();
        for id in 2000..2040 {
            t.insert(id, tat(u64::MAX), Kind::Local, 0, |gone, _| {
                heard.push(gone)
            });
        }
        assert_eq!(t.len(), 40);
        assert!(!heard.is_empty());
        let was_local = |id: &u64| {
            (2000..2040).contains(id)
                || ids
                    .iter()
                    .enumerate()
                    .any(|(k, x)| x == id && kind_of(k) == Kind::Local)
        };
        assert!(!heard.iter().any(was_local), "{heard:?}");
    }

    #[test]
    fn a_write_under_a_rule_sets_whether_its_bucket_is_durable_but_never_unmakes_a_local_one() {
        let mut t = Table::new(10);
        t.insert(1, tat(5), Kind::Replicated, 0, |_, _| ());
        t.insert(2, tat(5), Kind::Local, 0, |_, _| ());
        for (id, to, want) in [
            (1, Kind::Durable, Kind::Durable),
            (1, Kind::Replicated, Kind::Replicated),
            (2, Kind::Durable, Kind::Local),
        ] {
            t.update_as(id, 0, Some(to), |_| (), |_, _| ());
            assert_eq!(t.peek_kind(id).map(|(_, k)| k), Some(want), "{id} {to:?}");
        }
        t.update(1, 0, |_| (), |_, _| ());
        assert_eq!(t.peek_kind(1).map(|(_, k)| k), Some(Kind::Replicated));
    }
}
