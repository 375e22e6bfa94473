//! The bucket store: a sharded, bounded map from a bucket's 64-bit identity to its state.
//!
//! Each shard is a [`table::Table`] (open addressing, state inline, CLOCK eviction) behind its
//! own mutex, so concurrent checks contend only when they land in the same shard, never on a
//! global lock. The bound is in *weight*: 1 per fixed-size bucket, more for a sliding log (see
//! [`BucketState::weight`]), so `--max-keys` bounds memory, not just entries.
//!
//! Keys are a 64-bit hash of (rule, key) rather than the strings: a bucket costs a 32-byte slot
//! (at most 3/4 of slots used) instead of up to 512 bytes of key. Two identities collide
//! with probability ~n²/2⁶⁵ (3·10⁻⁸ for a million live buckets); a collision makes two clients
//! share one bucket, i.e. limits a little harder — never admits more — which is acceptable.

use crate::limiter::{BucketState, Decision, MAX_SLIDING_LOG_LIMIT, Rule, SlidingLog};
use parking_lot::Mutex;
use ringlimit_proto::peer::Mark;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use table::{Evicted, Table};

mod slots;
mod table;

/// Counters of what the store dropped to stay within its bound.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Buckets evicted to make room.
    pub evictions: AtomicU64,
    /// Of those, buckets that were still limiting (not yet full again): each such eviction may
    /// admit more than the rule allows, so operators want it near zero.
    pub evictions_limiting: AtomicU64,
}

/// A shard on cache lines of its own, so that two cores locking neighbouring shards do not
/// contend for one line (128: the pair of lines x86 prefetches together).
#[repr(align(128))]
struct Shard {
    table: Mutex<Table>,
    /// Where the table's slots are and its mask, for a prefetch before taking the lock. Only
    /// ever a hint: a stale value prefetches a wrong line, nothing worse.
    slots_at: AtomicUsize,
    mask: AtomicUsize,
}

impl Shard {
    fn new(table: Table) -> Self {
        let (at, mask) = table.layout();
        Self {
            table: Mutex::new(table),
            slots_at: AtomicUsize::new(at),
            mask: AtomicUsize::new(mask),
        }
    }

    #[inline]
    fn prefetch(&self, id: u64) {
        let at = self.slots_at.load(Ordering::Relaxed);
        let mask = self.mask.load(Ordering::Relaxed);
        table::prefetch(at, mask, id);
    }

    /// Inserts into this shard's (locked) `table`, refreshing the prefetch hint: an insert is
    /// what may grow the table.
    fn insert(&self, table: &mut Table, id: u64, state: BucketState, now: u64) -> Evicted {
        let evicted = table.insert(id, state, now);
        let (at, mask) = table.layout();
        self.slots_at.store(at, Ordering::Relaxed);
        self.mask.store(mask, Ordering::Relaxed);
        evicted
    }
}

/// A sharded bounded bucket store. Cheap to share behind an `Arc`.
pub struct Store {
    shards: Box<[Shard]>,
    stats: StoreStats,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .finish()
    }
}

/// Shards for a store of `max_keys` weight units.
///
/// Each shard must hold two of the heaviest buckets (a sliding log at the largest limit): a
/// bucket heavier than its shard's share is dropped at once, and a bucket never kept never
/// limits. Within that, at least 64 shards (contention between two cores stays negligible)
/// and as many more as make each shard's share fill its largest table close to the 3/4 load
/// a table grows at: tables are powers of two, so with a share just above 3/4 of one a shard's
/// table would end up twice as large as it needs (1M keys: 82 shards of 16,384 slots,
/// ~43 bytes per bucket, instead of 64 of 32,768, ~67).
fn shard_count(max_keys: u64) -> u64 {
    let heaviest = BucketState::Log(Box::new(SlidingLog::new(MAX_SLIDING_LOG_LIMIT))).weight();
    let most = (max_keys / (2 * heaviest)).max(1);
    if most <= 64 {
        return most;
    }
    // The largest table whose 3/4 is within a 64th of the keys, then shards enough that each
    // share fits it.
    let slots = 1u64 << (max_keys / 64 * 4 / 3).ilog2();
    max_keys.div_ceil(slots * 3 / 4).min(most)
}

impl Store {
    /// A store holding at most `max_keys` weight units.
    pub fn new(max_keys: u64) -> Self {
        let max_keys = max_keys.max(1);
        let shards = shard_count(max_keys);
        // Shares rounded down, so the shards together never hold more than `max_keys`.
        let per_shard = max_keys / shards;
        let shards: Vec<_> = (0..shards)
            .map(|_| Shard::new(Table::new(per_shard)))
            .collect();
        Self {
            shards: shards.into_boxed_slice(),
            stats: StoreStats::default(),
        }
    }

    #[inline]
    fn shard(&self, id: u64) -> &Shard {
        // The top 32 bits pick the shard (multiply-shift: any shard count, no division); the
        // table indexes with the low bits.
        let idx = ((id >> 32) * self.shards.len() as u64) >> 32;
        &self.shards[idx as usize]
    }

    /// Decides a check of `cost` at `now` on the bucket `id`, creating it when needed.
    /// Buckets that a check leaves untouched (a denial, a peek) are not created.
    #[inline]
    pub fn check(&self, id: u64, rule: &Rule, now: u64, cost: u64) -> Decision {
        self.check_now(id, rule, || now, cost)
    }

    /// Like [`Store::check`], reading the time with `now` after the bucket's slot has been asked
    /// for: a clock read serialises the CPU (`lfence; rdtsc` where the TSC is not invariant,
    /// as in most VMs), and the lookup's cache miss then overlaps it instead of following it.
    /// Measured with `cargo bench -p ringlimit-node --bench store`, 100k keys, one thread:
    /// 77 ns per check reading the clock first, 61 ns this way.
    #[inline]
    pub fn check_now(
        &self,
        id: u64,
        rule: &Rule,
        now: impl FnOnce() -> u64,
        cost: u64,
    ) -> Decision {
        let shard = self.shard(id);
        shard.prefetch(id);
        let now = now();
        let mut table = shard.table.lock();
        let (decision, evicted) = match table.update(id, now, |s| s.decide(rule, now, cost)) {
            Some(decided) => decided,
            None => {
                let mut state = BucketState::fresh(rule);
                let decision = state.decide(rule, now, cost);
                let evicted = if decision.allowed && cost > 0 {
                    shard.insert(&mut table, id, state, now)
                } else {
                    Evicted::default()
                };
                (decision, evicted)
            }
        };
        drop(table);
        self.record(evicted);
        decision
    }

    /// Whether bucket `id` is held here (recency untouched).
    pub fn contains(&self, id: u64) -> bool {
        self.shard(id).table.lock().contains(id)
    }

    /// Reads a bucket's state without deciding or touching recency.
    pub fn peek(&self, id: u64) -> Option<BucketState> {
        self.shard(id).table.lock().peek(id).cloned()
    }

    /// Removes and returns every bucket for which `take` says yes, one shard at a time (checks
    /// on other shards go on meanwhile).
    pub fn take_if(
        &self,
        mut take: impl FnMut(u64, &BucketState) -> bool,
    ) -> Vec<(u64, BucketState)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.table.lock();
            for id in shard.ids_where(&mut take) {
                if let Some(state) = shard.remove(id) {
                    out.push((id, state));
                }
            }
        }
        out
    }

    /// Merges a bucket handed over by its previous owner (see [`BucketState::absorb`]).
    pub fn absorb(&self, id: u64, state: BucketState, now: u64) {
        let shard = self.shard(id);
        let mut table = shard.table.lock();
        let mut state = Some(state);
        let merged = table.update(id, now, |mine| {
            if let Some(theirs) = state.take() {
                mine.absorb(theirs, now);
            }
        });
        let evicted = match (merged, state) {
            (Some((_, evicted)), _) => evicted,
            (None, Some(state)) => shard.insert(&mut table, id, state, now),
            (None, None) => Evicted::default(),
        };
        drop(table);
        self.record(evicted);
    }

    /// Gives back `cost` to bucket `id`, taken by the admission whose decision's `reset_ns`
    /// was `mark` (see [`BucketState::refund`]). A bucket no longer held has nothing to give
    /// back.
    pub fn refund(&self, id: u64, rule: &Rule, cost: u64, mark: Mark, now: u64) {
        let mut table = self.shard(id).table.lock();
        // A refund never changes a state's weight, so nothing is evicted.
        let _ = table.update(id, now, |s| s.refund(rule, cost, mark, now));
    }

    /// Drops a bucket (admin reset).
    pub fn remove(&self, id: u64) -> bool {
        self.shard(id).table.lock().remove(id).is_some()
    }

    /// Bytes of one slot of a shard's table.
    pub const SLOT_BYTES: usize = table::SLOT_BYTES;

    /// Slots allocated over all shards (each [`Store::SLOT_BYTES`] plus a referenced bit).
    pub fn slots(&self) -> usize {
        self.shards.iter().map(|s| s.table.lock().slots()).sum()
    }

    /// Shards the store is split into.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.table.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Eviction counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    fn record(&self, e: Evicted) {
        if e.count > 0 {
            self.stats.evictions.fetch_add(e.count, Ordering::Relaxed);
            self.stats
                .evictions_limiting
                .fetch_add(e.limiting, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
