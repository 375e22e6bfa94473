//! Copies: other owners' buckets this node keeps as their replica, decided on only while
//! their owner does not answer (standing in), and made this node's buckets when it becomes
//! their owner (promotion; the pass itself is [`super::promote`]).

use super::{Engine, taken};
use ringlimit_core::answer::answer;
use ringlimit_core::limiter::{BucketState, Decision, Rule};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;
use std::sync::atomic::Ordering;

/// Copies: other owners' buckets kept here as their replica.
impl Engine {
    /// The copy of bucket `id`, taken out of the copies (see [`Engine::decide`]).
    #[inline]
    pub(super) fn copy_of(&self, id: u64) -> Option<BucketState> {
        if !self.has_copies.load(Ordering::Relaxed) {
            return None;
        }
        let copy = self.copies.take(id)?;
        self.promoted.lock().insert(id);
        Some(copy)
    }

    /// Merges bucket `id` as recalled from the member after this node on the ring (its
    /// previous owner or its replica) at `now`: another reading of the history a bucket
    /// decided here meanwhile started from, and that a handover may bring again.
    pub fn recall_in(&self, id: u64, state: BucketState, now: u64) {
        // Recalls come only with replicas on: take_in looks for them with the copies.
        self.has_copies.store(true, Ordering::Relaxed);
        self.recalled.lock().insert(id);
        self.store.overlap(id, state, now);
    }

    /// Forgets which buckets were recalled (their handovers have come by then).
    pub fn forget_recalled(&self) {
        self.recalled.lock().clear();
    }

    /// Keeps the copy of bucket `id` its owner sent (its state there; `None`: the owner no
    /// longer holds it, so neither does the copy).
    ///
    /// A copy this node decided on while the owner did not answer is not replaced: the owner's
    /// state lacks those decisions until they are handed back, so the two readings overlap
    /// (the larger consumption wins).
    pub fn keep_copy(&self, id: u64, state: Option<BucketState>, now: u64) {
        let stood_in =
            self.standing_in.load(Ordering::Relaxed) && self.stood_in.lock().contains_key(&id);
        match state {
            Some(state) if stood_in => self.copies.overlap(id, state, now),
            Some(state) => {
                // Read first: checks read the flag on every new bucket, and a store would take
                // their cache line away on every copy.
                if !self.has_copies.load(Ordering::Relaxed) {
                    self.has_copies.store(true, Ordering::Relaxed);
                }
                self.copies.put(id, state, now);
            }
            None if stood_in => {}
            None => {
                self.copies.take(id);
            }
        }
    }

    /// Starts loading the copies of `ids` into the cache before [`Engine::keep_copy`] keeps
    /// them one by one (a frame's copies are spread over the table: one cache miss each,
    /// overlapped this way).
    pub fn prefetch_copies(&self, ids: impl Iterator<Item = u64>) {
        for id in ids {
            self.copies.prefetch(id);
        }
    }

    /// Decides a check on this node's copy of bucket `id` at `now`, as the owner's replica
    /// while the owner does not answer (a copy not held starts full, like the owner's bucket
    /// it never sent). An admission is kept for the owner (see `stood_in`).
    pub fn decide_copy(&self, id: u64, rule: &Rule, cost: u64, now: u64) -> CheckAnswer {
        answer(&self.check_copy(id, rule, cost, now), rule)
    }

    /// [`Engine::decide_copy`] for a check that may have to give back its cost (see
    /// [`Engine::hold`]; [`Engine::refund`] finds the copy).
    pub fn hold_copy(
        &self,
        id: u64,
        rule: &Rule,
        cost: u64,
        now: u64,
    ) -> (CheckAnswer, Option<Mark>) {
        let d = self.check_copy(id, rule, cost, now);
        (answer(&d, rule), taken(&d, cost, now))
    }

    fn check_copy(&self, id: u64, rule: &Rule, cost: u64, now: u64) -> Decision {
        // The copy became this node's bucket (promoted, or started from by a check decided
        // here as the owner's): the same history, decided there.
        if self.copies.peek(id).is_none() && self.store.contains(id) {
            return self.check_now(id, rule, cost, || now);
        }
        self.has_copies.store(true, Ordering::Relaxed);
        let mut stood_in = self.stood_in.lock();
        let d = self.copies.check(id, rule, now, cost);
        if d.allowed && cost > 0 {
            *stood_in.entry(id).or_default() += 1;
            self.standing_in.store(true, Ordering::Relaxed);
        }
        d
    }

    /// The copies decided on as their owner's replica, each with its state and how many
    /// admissions it has had: what to hand back to the owners. Copies gone since (promoted,
    /// dropped) are forgotten.
    pub fn stood_in(&self) -> Vec<(u64, BucketState, u64)> {
        if !self.standing_in.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let mut stood_in = self.stood_in.lock();
        let mut out = Vec::with_capacity(stood_in.len());
        stood_in.retain(|&id, &mut n| match self.copies.peek(id) {
            Some(state) => {
                out.push((id, state, n));
                true
            }
            None => false,
        });
        self.standing_in
            .store(!stood_in.is_empty(), Ordering::Relaxed);
        out
    }

    /// Copy `id` reached its owner as it was after `admissions` admissions here: unless
    /// decided on since, it is a copy like any other again (the owner's state replaces it).
    pub fn handed_back(&self, id: u64, admissions: u64) {
        let mut stood_in = self.stood_in.lock();
        if stood_in.get(&id) == Some(&admissions) {
            stood_in.remove(&id);
        }
        self.standing_in
            .store(!stood_in.is_empty(), Ordering::Relaxed);
    }

    /// A replica's reading of bucket `id`, which this node owns, handed back after the replica
    /// decided on it while this node did not answer: merged as another reading of the same
    /// history (the larger consumption wins).
    pub fn take_back(&self, id: u64, state: BucketState, now: u64) {
        self.store.overlap(id, state, now);
    }

    /// Copies held.
    pub fn copy_count(&self) -> usize {
        self.copies.len()
    }

    /// Bucket `id`'s copy, if held here.
    pub fn peek_copy(&self, id: u64) -> Option<BucketState> {
        self.copies.peek(id)
    }

    /// Moves the copies `pick` selects (those this node now owns) into the store at `now`,
    /// merged with a bucket held there already (see `BucketState::absorb`: consumptions add,
    /// so the result spends at least as much as either). Returns how many moved.
    pub fn promote(&self, pick: impl FnMut(u64, &BucketState) -> bool, now: u64) -> usize {
        let promoted = self.copies.take_if(pick);
        let n = promoted.len();
        let mut set = self.promoted.lock();
        // A pass forgets the previous one's: a handover is sent at once on a ring change.
        set.clear();
        for (id, state) in promoted {
            self.store.absorb(id, state, now);
            set.insert(id);
        }
        n
    }

    /// Drops the copies `pick` selects (those this node no longer replicates); returns how
    /// many.
    pub fn drop_copies(&self, pick: impl FnMut(u64, &BucketState) -> bool) -> usize {
        self.copies.take_if(pick).len()
    }
}
