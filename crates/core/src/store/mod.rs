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
//!
//! Every change of a [`Kind::Replicated`] bucket enters the store's change [`feed`] while a
//! follower reads it ([`Store::follow`], [`Store::changes`]).

use crate::limiter::{BucketState, Decision, MAX_SLIDING_LOG_LIMIT, Rule, SlidingLog};
use parking_lot::Mutex;
use ringlimit_proto::peer::Mark;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use table::{Evicted, Layout, Table};

pub mod feed;
mod slots;
mod table;

pub use feed::{Change, Cursor, FeedError, Kind, Lagged};
use feed::{Entry, Ring};
pub use table::hint;

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
    locked: Mutex<Locked>,
    /// Where the table's slots and flags are and its mask, for a prefetch before taking the
    /// lock. Only ever a hint: a stale value prefetches a wrong line, nothing worse.
    slots_at: AtomicUsize,
    mask: AtomicUsize,
    flags_at: AtomicUsize,
}

/// What a shard's lock guards: its buckets and its part of the change feed.
struct Locked {
    table: Table,
    feed: Ring,
}

impl Shard {
    fn new(table: Table) -> Self {
        let at = table.layout();
        Self {
            locked: Mutex::new(Locked {
                table,
                feed: Ring::default(),
            }),
            slots_at: AtomicUsize::new(at.slots),
            mask: AtomicUsize::new(at.mask),
            flags_at: AtomicUsize::new(at.flags),
        }
    }

    #[inline]
    fn prefetch(&self, id: u64) {
        let at = Layout {
            slots: self.slots_at.load(Ordering::Relaxed),
            mask: self.mask.load(Ordering::Relaxed),
            flags: self.flags_at.load(Ordering::Relaxed),
        };
        table::prefetch(at, id);
    }

    /// Inserts into this shard's (locked) `table`, refreshing the prefetch hint: an insert is
    /// what may grow the table. `gone` hears of evictions (see [`Table::insert`]).
    fn insert(
        &self,
        table: &mut Table,
        id: u64,
        state: BucketState,
        kind: Kind,
        now: u64,
        gone: impl FnMut(u64, Kind),
    ) -> Evicted {
        let evicted = table.insert(id, state, kind, now, gone);
        let at = table.layout();
        self.slots_at.store(at.slots, Ordering::Relaxed);
        self.mask.store(at.mask, Ordering::Relaxed);
        self.flags_at.store(at.flags, Ordering::Relaxed);
        evicted
    }
}

/// A sharded bounded bucket store. Cheap to share behind an `Arc`.
pub struct Store {
    shards: Box<[Shard]>,
    /// Followers of the change feed: changes are recorded only while there is one. Read on
    /// every write, written only when a follower comes or goes.
    followers: AtomicUsize,
    /// Of them, those that read every change ([`Store::follow`], a replica sender), not only
    /// those of durable buckets ([`Store::follow_durable`], a disk follower): while there is
    /// none, a write of a bucket that is not durable, and was not, records nothing.
    wide: AtomicUsize,
    /// One bit per follower (its [`Cursor`]'s): a shard's ring starts again at its front once
    /// every follower has read it to its end.
    follower_bits: AtomicU64,
    /// Changes each shard's feed holds at most; 0: the store has no feed.
    feed_per_shard: usize,
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

/// What a write does to the feed: records the changed buckets while someone follows.
struct Recorder<'a> {
    on: bool,
    /// Some follower reads every change, not only those of durable buckets.
    wide: bool,
    cap: usize,
    feed: &'a mut Ring,
}

impl Recorder<'_> {
    #[inline]
    fn changed(&mut self, id: u64) {
        if self.on {
            self.feed.push(Entry::id(id), self.cap);
        }
    }

    /// Records an evicted bucket (not local) of `kind`: a follower of durable buckets alone
    /// need not hear of one that was not durable (see [`Store::follow_durable`]).
    #[inline]
    fn evicted(&mut self, id: u64, kind: Kind) {
        if self.wide || kind == Kind::Durable {
            self.changed(id);
        }
    }

    /// Records a change with what its entry carries (made only while [`Recorder::on`]).
    #[inline]
    fn push(&mut self, entry: Entry) {
        self.feed.push(entry, self.cap);
    }
}

impl Store {
    /// A store holding at most `max_keys` weight units, without a change feed.
    pub fn new(max_keys: u64) -> Self {
        Self::with_feed(max_keys, 0)
    }

    /// A store holding at most `max_keys` weight units whose change feed holds up to
    /// `feed_entries` unread changes (32 bytes each, allocated as followers need them), split
    /// between the shards (each keeps at least 64). 0: no feed.
    pub fn with_feed(max_keys: u64, feed_entries: usize) -> Self {
        let max_keys = max_keys.max(1);
        let shards = shard_count(max_keys);
        // Shares rounded down, so the shards together never hold more than `max_keys`.
        let per_shard = max_keys / shards;
        let shards: Vec<_> = (0..shards)
            .map(|_| Shard::new(Table::new(per_shard)))
            .collect();
        let feed_per_shard = match feed_entries {
            0 => 0,
            n => n.div_ceil(shards.len()).max(64),
        };
        Self {
            shards: shards.into_boxed_slice(),
            followers: AtomicUsize::new(0),
            wide: AtomicUsize::new(0),
            follower_bits: AtomicU64::new(0),
            feed_per_shard,
            stats: StoreStats::default(),
        }
    }

    /// The feed's side of a write to a shard whose lock is held.
    #[inline]
    fn recorder<'a>(&self, feed: &'a mut Ring) -> Recorder<'a> {
        Recorder {
            // Relaxed: a follower counted before it read the shards' heads under their locks,
            // so every write after its reading (under the same lock) sees it.
            on: self.followers.load(Ordering::Relaxed) != 0,
            // Relaxed, as `on`: counted before the follower read the shards' heads.
            wide: self.wide.load(Ordering::Relaxed) != 0,
            cap: self.feed_per_shard,
            feed,
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
    /// as in most VMs), and the lookup's cache miss then overlaps it instead of following it
    /// (measured with `cargo bench -p ringlimit-core --bench store`: the docs' benchmarks page,
    /// "The store path against governor").
    #[inline]
    pub fn check_now(
        &self,
        id: u64,
        rule: &Rule,
        now: impl FnOnce() -> u64,
        cost: u64,
    ) -> Decision {
        self.check_as(Kind::Replicated, id, rule, now, cost)
    }

    /// [`Store::check`] of a [`Kind::Local`] bucket (a fail-open share): a bucket it creates
    /// stays out of the change feed for good.
    #[inline]
    pub fn check_local(&self, id: u64, rule: &Rule, now: u64, cost: u64) -> Decision {
        self.check_as(Kind::Local, id, rule, || now, cost)
    }

    /// [`Store::check_now`] creating, if it must, a bucket of `kind` (a bucket held already
    /// stays local or not as it was created, and becomes durable or not as `kind` says).
    ///
    /// An admission (the only decision that changes what a bucket has spent) enters the feed;
    /// a denial does not, though it may fit the state to `now` or to a reloaded rule: that is
    /// a function of the state, the rule and the time, which a follower's copy redoes itself
    /// when it decides.
    #[inline]
    pub fn check_as(
        &self,
        kind: Kind,
        id: u64,
        rule: &Rule,
        now: impl FnOnce() -> u64,
        cost: u64,
    ) -> Decision {
        self.check_seeded(kind, id, rule, now, cost, || None)
    }

    /// [`Store::check_as`] starting a bucket that is not held from `seed`'s state, when it has
    /// one, instead of a full bucket (a node's copy of a bucket whose owner it becomes: see the
    /// node's replicas). `seed` is called only when the bucket is not held, under its shard's
    /// lock; a seeded bucket is kept whatever the decision (it carries what was spent).
    #[inline]
    pub fn check_seeded(
        &self,
        kind: Kind,
        id: u64,
        rule: &Rule,
        now: impl FnOnce() -> u64,
        cost: u64,
        seed: impl FnOnce() -> Option<BucketState>,
    ) -> Decision {
        self.write_seeded(kind, id, rule, now, seed, |s, now| {
            let d = s.decide(rule, now, cost);
            let spent = d.allowed && cost > 0;
            (d, spent)
        })
    }

    /// Takes `cost` from bucket `id` at `now` whatever it admits (a reservation settled above
    /// its estimate: see [`BucketState::charge`]), creating it (from `seed`'s state, as
    /// [`Store::check_seeded`] does) when needed. Returns the tokens forgiven because the
    /// bucket would owe more than it may.
    pub fn charge_seeded(
        &self,
        kind: Kind,
        id: u64,
        rule: &Rule,
        now: u64,
        cost: u64,
        seed: impl FnOnce() -> Option<BucketState>,
    ) -> u64 {
        self.write_seeded(
            kind,
            id,
            rule,
            || now,
            seed,
            |s, now| (s.charge(rule, now, cost), cost > 0),
        )
    }

    /// Applies `op` at `now` to bucket `id` (a new one from `seed` or fresh under `rule`);
    /// `op` says whether it changed what the bucket spent: only then does a new bucket stay
    /// (unless seeded) and the change enter the feed.
    #[inline]
    fn write_seeded<R>(
        &self,
        kind: Kind,
        id: u64,
        rule: &Rule,
        now: impl FnOnce() -> u64,
        seed: impl FnOnce() -> Option<BucketState>,
        mut op: impl FnMut(&mut BucketState, u64) -> (R, bool),
    ) -> R {
        let shard = self.shard(id);
        shard.prefetch(id);
        let now = now();
        let mut locked = shard.locked.lock();
        let Locked { table, feed } = &mut *locked;
        let mut rec = self.recorder(feed);
        let on = rec.on;
        // With only followers of durable buckets, a bucket that is not durable enters the feed
        // only if it was (the disk follower then deletes it): it almost never does.
        let likely = on && (rec.wide || kind == Kind::Durable);
        if likely {
            // The ring's line is taken while the slot's lookup misses (see `Ring::prepare`).
            rec.feed.prepare(rec.cap);
        }
        let (out, evicted) = match table.update_as(
            id,
            now,
            Some(kind),
            |s| {
                let (out, spent) = op(s, now);
                // The state is copied while its cache line is hot (see `feed`). A bucket held
                // keeps its kind when the write's is local (read at the drain then).
                let entry = (spent && on).then(|| match kind {
                    Kind::Local => Entry::id(id),
                    kind => Entry::written(id, s, kind),
                });
                (out, entry)
            },
            |gone, kind| rec.evicted(gone, kind),
        ) {
            Some(((out, entry), was, evicted)) => {
                if let Some(entry) = entry
                    && was != Kind::Local
                    && (likely || was == Kind::Durable)
                {
                    rec.push(entry);
                }
                (out, evicted)
            }
            None => {
                let seeded = seed();
                let kept = seeded.is_some();
                let mut state = seeded.unwrap_or_else(|| BucketState::fresh(rule));
                let (out, spent) = op(&mut state, now);
                let evicted = if kept || spent {
                    let local = kind == Kind::Local;
                    let entry = (!local && likely).then(|| Entry::written(id, &state, kind));
                    let evicted = shard.insert(table, id, state, kind, now, |gone, was| {
                        rec.evicted(gone, was)
                    });
                    if let Some(entry) = entry {
                        rec.push(entry);
                    }
                    evicted
                } else {
                    Evicted::default()
                };
                (out, evicted)
            }
        };
        drop(locked);
        self.record(evicted);
        out
    }

    /// Starts loading bucket `id`'s slot into the cache, for a caller about to write many
    /// buckets (a replica's frame of copies): their cache misses then overlap.
    #[inline]
    pub fn prefetch(&self, id: u64) {
        self.shard(id).prefetch(id);
    }

    /// Whether bucket `id` is held here (recency untouched).
    pub fn contains(&self, id: u64) -> bool {
        self.shard(id).locked.lock().table.contains(id)
    }

    /// Reads a bucket's state without deciding or touching recency.
    pub fn peek(&self, id: u64) -> Option<BucketState> {
        self.shard(id).locked.lock().table.peek(id).cloned()
    }

    /// Calls `f` on every [`Kind::Replicated`] bucket held, one shard at a time (checks on
    /// other shards go on meanwhile): what a follower that [`Lagged`] copies again. Local
    /// buckets stay out, as they stay out of the feed.
    pub fn for_each(&self, mut f: impl FnMut(u64, &BucketState)) {
        for shard in self.shards.iter() {
            shard.locked.lock().table.for_each_replicated(&mut f);
        }
    }

    /// Calls `f` on every [`Kind::Durable`] bucket held, one shard at a time: what a disk
    /// follower that [`Lagged`] writes again.
    pub fn for_each_durable(&self, mut f: impl FnMut(u64, &BucketState)) {
        for shard in self.shards.iter() {
            shard.locked.lock().table.for_each_durable(&mut f);
        }
    }

    /// [`Store::for_each`] of shard `k` alone (nothing past [`Store::shard_count`]): a long
    /// reader (a disk snapshot) copies one shard at a time and works on its copy with no lock
    /// held.
    pub fn for_each_in(&self, k: usize, mut f: impl FnMut(u64, &BucketState)) {
        if let Some(shard) = self.shards.get(k) {
            shard.locked.lock().table.for_each_replicated(&mut f);
        }
    }

    /// [`Store::for_each_durable`] of shard `k` alone (see [`Store::for_each_in`]).
    pub fn for_each_durable_in(&self, k: usize, mut f: impl FnMut(u64, &BucketState)) {
        if let Some(shard) = self.shards.get(k) {
            shard.locked.lock().table.for_each_durable(&mut f);
        }
    }

    /// Removes and returns every bucket for which `take` says yes, one shard at a time (checks
    /// on other shards go on meanwhile).
    pub fn take_if(
        &self,
        mut take: impl FnMut(u64, &BucketState) -> bool,
    ) -> Vec<(u64, BucketState)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut locked = shard.locked.lock();
            let Locked { table, feed } = &mut *locked;
            let mut rec = self.recorder(feed);
            for id in table.ids_where(&mut take) {
                if let Some(removed) = table.remove(id) {
                    if !removed.local() {
                        rec.changed(id);
                    }
                    out.push((id, removed.state));
                }
            }
        }
        out
    }

    /// Merges a bucket handed over by its previous owner (see [`BucketState::absorb`]); a
    /// bucket new here is [`Kind::Replicated`].
    pub fn absorb(&self, id: u64, state: BucketState, now: u64) {
        self.absorb_as(Kind::Replicated, id, state, now);
    }

    /// [`Store::absorb`], a bucket new here of `kind` (not [`Kind::Local`]).
    pub fn absorb_as(&self, kind: Kind, id: u64, state: BucketState, now: u64) {
        self.merge(kind, id, state, now, |mine, theirs| {
            mine.absorb(theirs, now)
        });
    }

    /// Merges another reading of bucket `id`'s history (see [`BucketState::overlap`]); a bucket
    /// new here is [`Kind::Replicated`].
    pub fn overlap(&self, id: u64, state: BucketState, now: u64) {
        self.overlap_as(Kind::Replicated, id, state, now);
    }

    /// [`Store::overlap`], a bucket new here of `kind` (not [`Kind::Local`]).
    pub fn overlap_as(&self, kind: Kind, id: u64, state: BucketState, now: u64) {
        self.merge(kind, id, state, now, |mine, theirs| mine.overlap(theirs));
    }

    /// Merges `state` into bucket `id` with `merge`, or inserts it as `kind`.
    fn merge(
        &self,
        kind: Kind,
        id: u64,
        state: BucketState,
        now: u64,
        merge: impl FnOnce(&mut BucketState, BucketState),
    ) {
        // What comes without a rule never makes a bucket local.
        let kind = if kind == Kind::Local {
            Kind::Replicated
        } else {
            kind
        };
        let shard = self.shard(id);
        let mut locked = shard.locked.lock();
        let Locked { table, feed } = &mut *locked;
        let mut rec = self.recorder(feed);
        let mut state = Some(state);
        let merged = table.update(
            id,
            now,
            |mine| {
                if let Some(theirs) = state.take() {
                    merge(mine, theirs);
                }
            },
            |gone, kind| rec.evicted(gone, kind),
        );
        let (local, evicted) = match (merged, state) {
            (Some((_, local, evicted)), _) => (local, evicted),
            (None, Some(state)) => (
                false,
                shard.insert(table, id, state, kind, now, |gone, was| {
                    rec.evicted(gone, was)
                }),
            ),
            // Not reached: the state is taken only by a merge.
            (None, None) => (true, Evicted::default()),
        };
        if !local {
            rec.changed(id);
        }
        drop(locked);
        self.record(evicted);
    }

    /// Sets bucket `id` to `state`, replacing what was held (a replica's copy of its owner's
    /// bucket: the owner's state is the truth, merging would count twice). A bucket new here
    /// is [`Kind::Replicated`].
    pub fn put(&self, id: u64, state: BucketState, now: u64) {
        let shard = self.shard(id);
        let mut locked = shard.locked.lock();
        let Locked { table, feed } = &mut *locked;
        let mut rec = self.recorder(feed);
        let evicted = shard.insert(table, id, state, Kind::Replicated, now, |gone, kind| {
            rec.evicted(gone, kind)
        });
        rec.changed(id);
        drop(locked);
        self.record(evicted);
    }

    /// Removes bucket `id` and returns its state, if held.
    pub fn take(&self, id: u64) -> Option<BucketState> {
        let mut locked = self.shard(id).locked.lock();
        let Locked { table, feed } = &mut *locked;
        let mut rec = self.recorder(feed);
        let removed = table.remove(id)?;
        if !removed.local() {
            rec.changed(id);
        }
        Some(removed.state)
    }

    /// Gives back `cost` to bucket `id`, taken by the admission whose decision's `reset_ns`
    /// was `mark` (see [`BucketState::refund`]). A bucket no longer held has nothing to give
    /// back.
    pub fn refund(&self, id: u64, rule: &Rule, cost: u64, mark: Mark, now: u64) {
        let mut locked = self.shard(id).locked.lock();
        let Locked { table, feed } = &mut *locked;
        let mut rec = self.recorder(feed);
        // A refund never changes a state's weight, so nothing is evicted.
        let refunded = table.update(id, now, |s| s.refund(rule, cost, mark, now), |_, _| {});
        if let Some(((), false, _)) = refunded
            && cost > 0
        {
            rec.changed(id);
        }
    }

    /// Drops a bucket (admin reset).
    pub fn remove(&self, id: u64) -> bool {
        let mut locked = self.shard(id).locked.lock();
        let Locked { table, feed } = &mut *locked;
        let mut rec = self.recorder(feed);
        match table.remove(id) {
            Some(removed) => {
                if !removed.local() {
                    rec.changed(id);
                }
                true
            }
            None => false,
        }
    }

    /// Starts following the change feed: changes from now on are recorded until the follower
    /// [`Store::unfollow`]s. A new follower has not seen what the store holds already: it
    /// copies it with [`Store::for_each`] after this call (a change in between is then both
    /// in the copy and in the feed, which is harmless: a bucket's newest entry says its state
    /// at its last change or later, the copy's state; see `feed`).
    pub fn follow(&self) -> Result<Cursor, FeedError> {
        self.follow_as(true)
    }

    /// [`Store::follow`] for a follower that keeps only durable buckets (a disk follower): it
    /// reads every change of a [`Kind::Durable`] bucket, and of one that stops being durable;
    /// of the buckets that are not, only their removals and handovers (not their evictions:
    /// a key flood of buckets that are not kept fills no feed), unless another follower reads
    /// every change. It copies the store with [`Store::for_each_durable`].
    pub fn follow_durable(&self) -> Result<Cursor, FeedError> {
        self.follow_as(false)
    }

    fn follow_as(&self, wide: bool) -> Result<Cursor, FeedError> {
        if self.feed_per_shard == 0 {
            return Err(FeedError::Off);
        }
        // Counted before the heads are read, so that every write after a head is recorded.
        if wide {
            self.wide.fetch_add(1, Ordering::Relaxed);
        }
        self.followers.fetch_add(1, Ordering::Relaxed);
        // The lowest free bit (none past 64 followers: such a follower is never waited for,
        // and may be told it lagged).
        let bit =
            match self
                .follower_bits
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                    (bits != u64::MAX).then(|| bits | (!bits & bits.wrapping_add(1)))
                }) {
                Ok(before) => !before & before.wrapping_add(1),
                Err(_) => 0,
            };
        let next = self
            .shards
            .iter()
            .map(|s| s.locked.lock().feed.head())
            .collect();
        Ok(Cursor { next, bit, wide })
    }

    /// Stops following; the last follower to leave frees the feed's memory.
    pub fn unfollow(&self, cursor: Cursor) {
        self.follower_bits.fetch_and(!cursor.bit, Ordering::AcqRel);
        if cursor.wide {
            self.wide.fetch_sub(1, Ordering::Relaxed);
        }
        drop(cursor);
        if self.followers.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        for shard in self.shards.iter() {
            let mut locked = shard.locked.lock();
            // Under the lock: a follower that came meanwhile has been counted already.
            if self.followers.load(Ordering::Relaxed) == 0 {
                locked.feed.clear();
            }
        }
    }

    /// Appends to `out` the buckets changed since `cursor`, each once with its state (see
    /// [`Change`]), and moves `cursor` past them. `Err(Lagged)` when some changes were
    /// overwritten before this reading: the cursor has moved to the present anyway, and the
    /// follower must copy the store again ([`Store::for_each`]).
    pub fn changes(&self, cursor: &mut Cursor, out: &mut Vec<Change>) -> Result<(), Lagged> {
        let mut lagged = 0;
        // Two passes: the changed ids of every shard first, each one's slot prefetched, then
        // their states. Read in one pass, each state was a cache miss of its own (a drain finds
        // a change or two per shard, in tables of 100,000s), the largest share of the replica
        // sender's own CPU in `perf` (`bench/notes/replica-cost.md`); this way they overlap.
        let mut read = Vec::new();
        for (k, (shard, next)) in self.shards.iter().zip(cursor.next.iter_mut()).enumerate() {
            let mut locked = shard.locked.lock();
            let from = out.len();
            if locked.feed.read(*next, self.feed_per_shard, out).is_err() {
                lagged += 1;
            }
            *next = locked.feed.head();
            // Read to its end by every follower: nothing in it is needed any more (see `feed`,
            // "Hot"). Under the lock, a follower that came meanwhile has its bit already.
            let all = self.follower_bits.load(Ordering::Acquire);
            if locked.feed.caught_up(cursor.bit) == all {
                locked.feed.rewind();
            }
            // Only the changes whose entries carried no state are looked up.
            let mut unread = out[from..].iter().filter(|c| c.state.is_none()).peekable();
            if unread.peek().is_some() {
                let at = locked.table.layout();
                for c in unread {
                    table::prefetch(at, c.id);
                }
                read.push((k, from..out.len()));
            }
        }
        for (k, range) in read {
            let locked = self.shards[k].locked.lock();
            for c in out[range].iter_mut().filter(|c| c.state.is_none()) {
                if let Some((state, kind)) = locked.table.peek_kind(c.id) {
                    c.state = Some(state.clone());
                    c.durable = kind == Kind::Durable;
                }
            }
        }
        match lagged {
            0 => Ok(()),
            shards => Err(Lagged { shards }),
        }
    }

    /// Changes the feed holds now over all shards (at most the bound it was built with).
    pub fn feed_len(&self) -> usize {
        self.shards.iter().map(|s| s.locked.lock().feed.len()).sum()
    }

    /// Bytes of one slot of a shard's table.
    pub const SLOT_BYTES: usize = table::SLOT_BYTES;

    /// Slots allocated over all shards (each [`Store::SLOT_BYTES`] plus a referenced bit).
    pub fn slots(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.locked.lock().table.slots())
            .sum()
    }

    /// Shards the store is split into.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.locked.lock().table.len())
            .sum()
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
