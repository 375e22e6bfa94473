//! This node's own buckets: the store (with its change feed), and the one write path every
//! decision, hold, refund, handover and reset of an owned bucket goes through.

use super::{Engine, taken};
use ringlimit_core::answer::answer;
use ringlimit_core::coordinator::share::Share;
use ringlimit_core::lease::Release;
use ringlimit_core::limiter::{BucketState, Decision, Rule};
use ringlimit_core::store::{Change, Cursor, FeedError, Kind, Lagged, StoreStats};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Engine {
    /// Whether bucket `id` is held here.
    pub fn holds(&self, id: u64) -> bool {
        self.store.contains(id)
    }

    /// Bucket `id`'s state, if held here.
    pub fn peek(&self, id: u64) -> Option<BucketState> {
        self.store.peek(id)
    }

    /// Buckets held here.
    pub fn bucket_count(&self) -> usize {
        self.store.len()
    }

    /// What the store evicted to stay within its bound.
    pub fn store_stats(&self) -> &StoreStats {
        self.store.stats()
    }

    /// Decides a prepared check (see [`Engine::prepare`]) now.
    ///
    /// A bucket not held here starts from this node's copy of it when it has one: the ring
    /// names this node the owner (checks come here) as soon as the view changes, and the
    /// promotion pass that follows ([`Engine::promote`]) may not have run yet; a check in
    /// between must not start the key from a full bucket. The copy is looked for only on a
    /// miss (a bucket created), never on a hit.
    pub fn decide(&self, id: u64, rule: &Rule, cost: u64) -> CheckAnswer {
        answer(&self.check_now(id, rule, cost, || self.clock.now()), rule)
    }

    /// The store's check, the time read by `now` (see `Store::check_now`), a miss starting
    /// from a copy (see [`Engine::decide`]).
    #[inline]
    pub(super) fn check_now(
        &self,
        id: u64,
        rule: &Rule,
        cost: u64,
        now: impl FnOnce() -> u64,
    ) -> Decision {
        let seed = || self.copy_of(id);
        self.store
            .check_seeded(Kind::Replicated, id, rule, now, cost, seed)
    }

    /// Decides a prepared check at `now`, a reading of this engine's clock. Batches read the
    /// clock once for all their checks: on this VM a clock read (kvm-clock, serialising) nearly
    /// doubles a store check (60 vs 33 ns in `cargo bench -p ringlimit-core --bench store`,
    /// 100k keys), and one instant for a whole batch is what a batch means.
    pub fn decide_at(&self, id: u64, rule: &Rule, cost: u64, now: u64) -> CheckAnswer {
        answer(&self.check_now(id, rule, cost, || now), rule)
    }

    /// Decides at `now` a check that may have to give back its cost (all-or-nothing): the
    /// answer, and the mark of what it took (`None` when nothing was taken), for
    /// [`Engine::refund`].
    pub fn hold(&self, id: u64, rule: &Rule, cost: u64, now: u64) -> (CheckAnswer, Option<Mark>) {
        let d = self.check_now(id, rule, cost, || now);
        (answer(&d, rule), taken(&d, cost, now))
    }

    /// Gives back `cost` to bucket `id`, taken at the admission marked `mark` (see
    /// [`Engine::hold`]), at `now`. A check decided on a copy (as its owner's replica) is
    /// refunded on that copy.
    pub fn refund(&self, id: u64, rule: &Rule, cost: u64, mark: Mark, now: u64) {
        if self.standing_in.load(Ordering::Relaxed)
            && !self.store.contains(id)
            && self.stood_in.lock().contains_key(&id)
        {
            self.copies.refund(id, rule, cost, mark, now);
            return;
        }
        self.store.refund(id, rule, cost, mark, now);
    }

    /// The fail-open shares of this node's buckets (salted ids, in this store): the
    /// coordinator's one share type. Shares are this node's alone: their buckets stay out of
    /// the change feed (`Store::check_local`).
    pub fn share(&self) -> Share<'_> {
        Share::salted(&self.store)
    }

    /// Drops buckets `ids` (an admin reset, here or asked by a peer); returns how many were
    /// held.
    pub fn reset(&self, ids: &[u64]) -> u64 {
        self.grants.forget(ids);
        for &id in ids {
            self.held.release(id, Release::Revoked);
        }
        ids.iter().filter(|&&id| self.store.remove(id)).count() as u64
    }

    /// Takes out every bucket `pick` selects, to hand it over to its new owner.
    pub fn hand_out(&self, pick: impl FnMut(u64, &BucketState) -> bool) -> Vec<(u64, BucketState)> {
        self.store.take_if(pick)
    }

    /// Merges bucket `id` handed over by its previous owner (or put back after a failed
    /// handover) at `now`.
    ///
    /// A handed bucket supersedes this node's copy of it (the copy is an older reading of the
    /// same history), and overlaps a bucket promoted from that copy (see `promoted`).
    pub fn take_in(&self, id: u64, state: BucketState, now: u64) {
        if self.has_copies.load(Ordering::Relaxed) {
            self.copies.take(id);
            if self.promoted.lock().remove(&id) || self.recalled.lock().remove(&id) {
                self.store.overlap(id, state, now);
                return;
            }
        }
        self.store.absorb(id, state, now);
    }

    /// Starts following the change feed of the owner's buckets (see [`Store::follow`]).
    pub fn follow(&self) -> Result<Cursor, FeedError> {
        self.store.follow()
    }

    /// The owner's buckets changed since `cursor` (see [`Store::changes`]).
    pub fn changes(&self, cursor: &mut Cursor, out: &mut Vec<Change>) -> Result<(), Lagged> {
        self.store.changes(cursor, out)
    }

    /// Stops following the change feed.
    pub fn unfollow(&self, cursor: Cursor) {
        self.store.unfollow(cursor);
    }

    /// Calls `f` on every owner bucket held (shares stay out): what a follower that lagged
    /// copies again.
    pub fn for_each_bucket(&self, f: impl FnMut(u64, &BucketState)) {
        self.store.for_each(f);
    }
}

/// The store's counters as metrics, read at scrape time.
pub struct EngineCollector(pub Arc<Engine>);

impl std::fmt::Debug for EngineCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineCollector")
    }
}

impl prometheus_client::collector::Collector for EngineCollector {
    fn encode(
        &self,
        mut e: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use crate::metrics::{Kind, encode_one, load};
        let s = self.0.store_stats();
        encode_one(
            &mut e,
            Kind::Gauge,
            "buckets",
            "Buckets held in this node's store.",
            self.0.bucket_count() as u64,
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "evictions",
            "Buckets evicted to stay within --max-keys.",
            load(&s.evictions),
        )?;
        encode_one(
            &mut e,
            Kind::Counter,
            "evictions_limiting",
            "Evicted buckets that were still limiting (each may admit more than the rule).",
            load(&s.evictions_limiting),
        )
    }
}
