//! This node's own buckets: the store, with the change feed that the replica sender (and any
//! other follower) reads, and what settles above their estimates made them owe (a debt is part
//! of its bucket's state; see `ringlimit_core::limiter`).
//!
//! Every write of an owned bucket enters the feed (`Kind::Replicated`): decisions, holds and
//! refunds, handover in and out, resets; while the disk follower alone follows it (no replica
//! sender), a decision, a hold or an eviction enters only for a durable bucket (see
//! `Store::follow_durable`). The fail-open share's buckets live in the same store under salted
//! ids (`Kind::Local`): this node's alone, never replicated.

use crate::metrics::{Family, load};
use ringlimit_core::coordinator::share::Share;
use ringlimit_core::limiter::{BucketState, Decision, Rule};
use ringlimit_core::reservations::Settlement;
use ringlimit_core::store::{self, Change, Cursor, FeedError, Lagged, Store};
use ringlimit_proto::peer::Mark;
use std::sync::atomic::{AtomicU64, Ordering};

/// Unread changes the store's feed keeps while a follower reads it (32 bytes each: 2 MiB at
/// most, allocated only while followed). A follower that falls further behind copies the store
/// again.
pub(crate) const FEED_ENTRIES: usize = 64 * 1024;

/// This node's buckets and their change feed.
#[derive(Debug)]
pub struct OwnedBuckets {
    store: Store,
    /// Tokens settled above what their buckets admitted (owed by them), and of those, what was
    /// beyond the most a bucket may owe (forgiven), since start.
    pub debts: DebtStats,
}

/// What settles above their estimates did to this node's buckets, since start.
#[derive(Debug, Default)]
pub struct DebtStats {
    pub owed: AtomicU64,
    pub forgiven: AtomicU64,
}

impl DebtStats {
    /// Counts what a settle left its bucket owing.
    pub fn count(&self, s: &Settlement) {
        if s.owed > 0 {
            self.owed.fetch_add(s.owed, Ordering::Relaxed);
            self.forgiven.fetch_add(s.forgiven, Ordering::Relaxed);
        }
    }
}

impl OwnedBuckets {
    /// At most `max_keys` buckets (`--max-keys`), shares included.
    pub fn new(max_keys: u64) -> Self {
        Self {
            store: Store::with_feed(max_keys, FEED_ENTRIES),
            debts: DebtStats::default(),
        }
    }

    /// Whether bucket `id` is held here.
    pub fn holds(&self, id: u64) -> bool {
        self.store.contains(id)
    }

    /// Bucket `id`'s state, if held here.
    pub fn peek(&self, id: u64) -> Option<BucketState> {
        self.store.peek(id)
    }

    /// Buckets held here.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// The store's check of bucket `id`, the time read by `now` (see `Store::check_now`); a
    /// bucket not held starts from `seed`'s state when it gives one.
    #[inline]
    pub fn check(
        &self,
        kind: store::Kind,
        id: u64,
        rule: &Rule,
        cost: u64,
        now: impl FnOnce() -> u64,
        seed: impl FnOnce() -> Option<BucketState>,
    ) -> Decision {
        self.store.check_seeded(kind, id, rule, now, cost, seed)
    }

    /// Takes `cost` from bucket `id` at `now` whatever it admits (see `Store::charge_seeded`);
    /// returns the tokens forgiven.
    pub fn charge(
        &self,
        kind: store::Kind,
        id: u64,
        rule: &Rule,
        cost: u64,
        now: u64,
        seed: impl FnOnce() -> Option<BucketState>,
    ) -> u64 {
        self.store.charge_seeded(kind, id, rule, now, cost, seed)
    }

    /// Gives back `cost` to bucket `id`, taken at the admission marked `mark`, at `now`.
    pub fn refund(&self, id: u64, rule: &Rule, cost: u64, mark: Mark, now: u64) {
        self.store.refund(id, rule, cost, mark, now);
    }

    /// The fail-open shares of this node's buckets (salted ids, in this store): the
    /// coordinator's one share type. Shares are this node's alone: their buckets stay out of
    /// the change feed (`Store::check_local`).
    pub fn share(&self) -> Share<'_> {
        Share::salted(&self.store)
    }

    /// Drops buckets `ids`; returns how many were held.
    pub fn remove(&self, ids: &[u64]) -> u64 {
        ids.iter().filter(|&&id| self.store.remove(id)).count() as u64
    }

    /// Takes out every bucket `pick` selects, to hand it over to its new owner.
    pub fn hand_out(&self, pick: impl FnMut(u64, &BucketState) -> bool) -> Vec<(u64, BucketState)> {
        self.store.take_if(pick)
    }

    /// Merges `state` into bucket `id` as another history (consumptions add: see
    /// `BucketState::absorb`).
    pub fn absorb(&self, id: u64, state: BucketState, now: u64) {
        self.store.absorb(id, state, now);
    }

    /// [`OwnedBuckets::absorb`], a bucket new here of `kind`.
    pub fn absorb_as(&self, kind: store::Kind, id: u64, state: BucketState, now: u64) {
        self.store.absorb_as(kind, id, state, now);
    }

    /// Merges `state` into bucket `id` as another reading of the same history (the larger
    /// consumption wins: see `Store::overlap`).
    pub fn overlap(&self, id: u64, state: BucketState, now: u64) {
        self.store.overlap(id, state, now);
    }

    /// [`OwnedBuckets::overlap`], a bucket new here of `kind`.
    pub fn overlap_as(&self, kind: store::Kind, id: u64, state: BucketState, now: u64) {
        self.store.overlap_as(kind, id, state, now);
    }

    /// Starts following the change feed of the owner's buckets (see [`Store::follow`]).
    pub fn follow(&self) -> Result<Cursor, FeedError> {
        self.store.follow()
    }

    /// Starts following the changes of the owner's durable buckets (see
    /// [`Store::follow_durable`]): the disk follower.
    pub fn follow_durable(&self) -> Result<Cursor, FeedError> {
        self.store.follow_durable()
    }

    /// The owner's buckets changed since `cursor` (see [`Store::changes`]).
    pub fn changes(&self, cursor: &mut Cursor, out: &mut Vec<Change>) -> Result<(), Lagged> {
        self.store.changes(cursor, out)
    }

    /// Stops following the change feed.
    pub fn unfollow(&self, cursor: Cursor) {
        self.store.unfollow(cursor);
    }

    /// Calls `f` on every durable bucket held (see [`Store::for_each_durable`]): what the disk
    /// follower writes again after it lagged.
    pub fn for_each_durable(&self, f: impl FnMut(u64, &BucketState)) {
        self.store.for_each_durable(f);
    }

    /// The store's shards (see [`OwnedBuckets::for_each_durable_in`]).
    pub fn shard_count(&self) -> usize {
        self.store.shard_count()
    }

    /// [`OwnedBuckets::for_each_durable`] of shard `k` alone: what a disk snapshot reads, one
    /// shard's lock at a time (see [`Store::for_each_durable_in`]).
    pub fn for_each_durable_in(&self, k: usize, f: impl FnMut(u64, &BucketState)) {
        self.store.for_each_durable_in(k, f);
    }

    /// Calls `f` on every owner bucket held (shares stay out): what a follower that lagged
    /// copies again.
    pub fn for_each(&self, f: impl FnMut(u64, &BucketState)) {
        self.store.for_each(f);
    }
}

/// The store's counters and the debts as metrics, read at scrape time.
pub const METRICS: &[Family<OwnedBuckets>] = &[
    Family::gauge("buckets", "Buckets held in this node's store.", |o| {
        o.len() as u64
    }),
    Family::counter(
        "evictions",
        "Buckets evicted to stay within --max-keys.",
        |o| load(&o.store.stats().evictions),
    ),
    Family::counter(
        "evictions_limiting",
        "Evicted buckets that were still limiting (each may admit more than the rule).",
        |o| load(&o.store.stats().evictions_limiting),
    ),
    Family::counter(
        "reservation_debt_owed_tokens",
        "Tokens settled above what their buckets admitted at this node as owner: owed by those buckets, in their state (they deny until time has repaid it; the debt goes to their replicas and next owners with them).",
        |o| load(&o.debts.owed),
    ),
    Family::counter(
        "reservation_debt_forgiven_tokens",
        "Of the tokens owed, those beyond the most a bucket may owe (64 periods of its rule's limit), not kept (each may admit more than the rule).",
        |o| load(&o.debts.forgiven),
    ),
];

/// The mark of what an admission of `cost` at `now` took (`None`: it took nothing).
pub fn taken(d: &Decision, cost: u64, now: u64) -> Option<Mark> {
    (d.allowed && cost > 0).then_some(Mark {
        reset_ns: d.reset_ns,
        at_ns: now,
    })
}
