//! The bucket store: a sharded, bounded map from a bucket's 64-bit identity to its state.
//!
//! Each shard is a `quick_cache` unsync cache (CLOCK-PRO eviction) behind its own mutex, so
//! concurrent checks contend only when they land in the same shard, never on a global lock.
//! The bound is in *weight*: 1 per fixed-size bucket, more for a sliding log (see
//! [`BucketState::weight`]), so `--max-keys` bounds memory, not just entries.
//!
//! Keys are a 64-bit hash of (rule, key) rather than the strings: a bucket costs its state plus
//! ~30 bytes of cache bookkeeping instead of up to 512 bytes of key. Two identities collide
//! with probability ~n²/2⁶⁵ (3·10⁻⁸ for a million live buckets); a collision makes two clients
//! share one bucket, i.e. limits a little harder — never admits more — which is acceptable.

use crate::limiter::{BucketState, Decision, MAX_SLIDING_LOG_LIMIT, Rule, SlidingLog};
use parking_lot::Mutex;
use quick_cache::{Lifecycle, OptionsBuilder, Weighter};
use std::sync::atomic::{AtomicU64, Ordering};

type ShardCache = quick_cache::unsync::Cache<
    u64,
    BucketState,
    StateWeighter,
    nohash_hasher::BuildNoHashHasher<u64>,
    Evictions,
>;

/// Counters of what the store dropped to stay within its bound.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Buckets evicted to make room.
    pub evictions: AtomicU64,
    /// Of those, buckets that were still limiting (not yet full again): each such eviction may
    /// admit more than the rule allows, so operators want it near zero.
    pub evictions_limiting: AtomicU64,
}

/// A sharded bounded bucket store. Cheap to share behind an `Arc`.
pub struct Store {
    shards: Box<[Mutex<ShardCache>]>,
    shift: u32,
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

impl Store {
    /// A store holding at most `max_keys` weight units, in a power-of-two number of shards.
    pub fn new(max_keys: u64) -> Self {
        let max_keys = max_keys.max(1);
        // 64 shards keep two-core contention negligible and each shard's table large; fewer for
        // small stores, so that each shard holds at least two of the heaviest buckets (a sliding
        // log at the largest limit): the cache drops a value heavier than its shard's share at
        // once, and a bucket never kept never limits. Rounded down to a power of two, and the
        // shares rounded down, so the shards together never hold more than `max_keys`.
        let heaviest = BucketState::Log(Box::new(SlidingLog::new(MAX_SLIDING_LOG_LIMIT))).weight();
        let shards = 1usize << (max_keys / (2 * heaviest)).clamp(1, 64).ilog2();
        let per_shard = max_keys / shards as u64;
        let shards: Vec<_> = (0..shards)
            .map(|_| {
                let opts = OptionsBuilder::new()
                    .estimated_items_capacity(usize::try_from(per_shard).unwrap_or(usize::MAX))
                    .weight_capacity(per_shard)
                    // Ghost entries remember evicted keys to re-admit them hot; they cost a slab
                    // slot each, which we would rather spend on live buckets.
                    .ghost_allocation(0.0)
                    .build()
                    .map_err(|e| format!("{e:?}"));
                let opts = match opts {
                    Ok(o) => o,
                    // The values above are always valid; fall back to defaults rather than panic.
                    Err(_) => OptionsBuilder::new()
                        .estimated_items_capacity(1024)
                        .weight_capacity(per_shard)
                        .build()
                        .unwrap_or_else(|_| unreachable!("default options are valid")),
                };
                let mut cache = ShardCache::with_options(
                    opts,
                    StateWeighter,
                    nohash_hasher::BuildNoHashHasher::default(),
                    Evictions,
                );
                // Sized once: the slab would otherwise grow by doubling while filling, leaving
                // slack and copying (measured 61.0 → 58.7 heap bytes per bucket at 1M keys).
                cache.reserve(usize::try_from(per_shard).unwrap_or(0));
                Mutex::new(cache)
            })
            .collect();
        let shift = 64 - shards.len().trailing_zeros();
        Self {
            shards: shards.into_boxed_slice(),
            shift,
            stats: StoreStats::default(),
        }
    }

    fn shard(&self, id: u64) -> &Mutex<ShardCache> {
        // Top bits pick the shard; the cache's table uses the low bits.
        let idx = if self.shards.len() == 1 {
            0
        } else {
            (id >> self.shift) as usize
        };
        &self.shards[idx]
    }

    /// Decides a check of `cost` at `now` on the bucket `id`, creating it when needed.
    /// Buckets that a check leaves untouched (a denial, a peek) are not created.
    pub fn check(&self, id: u64, rule: &Rule, now: u64, cost: u64) -> Decision {
        let mut shard = self.shard(id).lock();
        if let Some(mut state) = shard.get_mut(&id) {
            return state.decide(rule, now, cost);
        }
        let mut state = BucketState::fresh(rule);
        let decision = state.decide(rule, now, cost);
        if decision.allowed && cost > 0 {
            self.insert(shard, id, state, now);
        }
        decision
    }

    /// Inserts a new bucket into its (locked) shard, counting what that evicts.
    fn insert(
        &self,
        mut shard: parking_lot::MutexGuard<'_, ShardCache>,
        id: u64,
        state: BucketState,
        now: u64,
    ) {
        let mut evicted = EvictedAt {
            now,
            ..EvictedAt::default()
        };
        shard.insert_with_lifecycle(id, state, &mut evicted);
        drop(shard);
        self.record(&evicted);
    }

    /// Whether bucket `id` is held here (recency untouched).
    pub fn contains(&self, id: u64) -> bool {
        self.shard(id).lock().contains_key(&id)
    }

    /// Reads a bucket's state without deciding or touching recency.
    pub fn peek(&self, id: u64) -> Option<BucketState> {
        self.shard(id).lock().peek(&id).cloned()
    }

    /// Removes and returns every bucket for which `take` says yes, one shard at a time (checks
    /// on other shards go on meanwhile).
    pub fn take_if(
        &self,
        mut take: impl FnMut(u64, &BucketState) -> bool,
    ) -> Vec<(u64, BucketState)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let ids: Vec<u64> = shard
                .iter()
                .filter(|(id, st)| take(**id, st))
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                if let Some(pair) = shard.remove(&id) {
                    out.push(pair);
                }
            }
        }
        out
    }

    /// Merges a bucket handed over by its previous owner (see [`BucketState::absorb`]).
    pub fn absorb(&self, id: u64, state: BucketState, now: u64) {
        let mut shard = self.shard(id).lock();
        if let Some(mut mine) = shard.get_mut(&id) {
            mine.absorb(state, now);
            return;
        }
        self.insert(shard, id, state, now);
    }

    /// Drops a bucket (admin reset).
    pub fn remove(&self, id: u64) -> bool {
        self.shard(id).lock().remove(&id).is_some()
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Eviction counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    fn record(&self, e: &EvictedAt) {
        if e.evicted > 0 {
            self.stats.evictions.fetch_add(e.evicted, Ordering::Relaxed);
            self.stats
                .evictions_limiting
                .fetch_add(e.limiting, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Copy, Default)]
struct StateWeighter;

impl Weighter<u64, BucketState> for StateWeighter {
    fn weight(&self, _id: &u64, state: &BucketState) -> u64 {
        state.weight()
    }
}

/// Counts evictions during one insert, telling idle buckets from ones still limiting.
#[derive(Clone, Copy, Default)]
struct Evictions;

#[derive(Default)]
struct EvictedAt {
    now: u64,
    evicted: u64,
    limiting: u64,
}

impl Lifecycle<u64, BucketState> for Evictions {
    type RequestState = EvictedAt;

    fn on_evict(&self, at: &mut EvictedAt, _id: u64, state: BucketState) {
        at.evicted += 1;
        if state.idle_at() > at.now {
            at.limiting += 1;
        }
    }
}

#[cfg(test)]
mod tests;
