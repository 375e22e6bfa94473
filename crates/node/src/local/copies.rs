//! Copies: other owners' buckets this node keeps as their replica (the receiving end of
//! `crate::replicas`), in a store of their own bounded by the same `--max-keys`.
//!
//! A copy decides nothing while its owner answers. It becomes this node's bucket when this node
//! becomes its owner: on a ring change (promotion, `Local::promote`), and on a check's first
//! touch before that pass ran (an owned bucket not held starts from its copy: [`ReplicaCopies::
//! take_for_owner`]). While its owner does not answer, this node decides on the copy as the
//! owner's replica (standing in, [`ReplicaCopies::check`]) and keeps those decisions for the
//! owner until they are handed back (`crate::replicas::handback`).
//!
//! What a promoted bucket is charged: its copy, nothing more. The copy lacks only what the
//! owner admitted after its last frame written: what it admitted in one flush interval
//! (`--replica-flush-ms`, `crate::replicas::sender::FLUSH_EVERY` by default) plus a frame's way
//! to the replica, when the owner's link was healthy up to its death
//! (`ringlimit_replication_lag_seconds` says how long that is). Charging that window would have
//! to guess the owner's rate in it: the safe guess (all that was left could have gone in a
//! burst) denies every promoted key until it refills, a false deny for the whole cluster for
//! what is at most a few ms of one owner's admissions; and the owner's last rate is not sent.
//! So the window is forgiven, and bounded instead: bench/accuracy.sh measures admitted ÷ limit
//! after a SIGKILL, and CI fails past its bound. An owner that was unreachable before it died
//! is different: its checks were decided by this replica meanwhile (standing in), on the copy,
//! so nothing it could not decide is missing. A replica whose sends were failing (frames
//! unacknowledged) may miss more: the sender resends the whole store once it reaches the
//! replica again, but changes made while it could not are lost with the owner.
//!
//! A graceful leave sends both: the copy is promoted when this node sees the ring change, and
//! the leaving owner's handover may arrive before or after. Both are readings of one history,
//! so they are not added: a handover that arrives first supersedes the copy, one that arrives
//! after overlaps the promoted bucket (the larger consumption wins; see
//! [`ReplicaCopies::supersede`]). Recalled buckets (`crate::peers::recall_on_join`) are such readings
//! too.

use crate::metrics::{Family, load};
use parking_lot::Mutex;
use ringlimit_core::limiter::{BucketState, Decision, Rule};
use ringlimit_core::store::{Change, Cursor, FeedError, Lagged, Store};
use ringlimit_proto::peer::Mark;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Other owners' buckets kept here as their replica.
#[derive(Debug)]
pub struct ReplicaCopies {
    /// The copies (no feed: copies are not copied on).
    copies: Store,
    /// Whether a copy was ever kept: until then a check's miss does not look for one.
    has_copies: AtomicBool,
    /// Buckets promoted from copies since the last promotion pass. Their previous owner may
    /// still hand them over (a graceful leave: its handover can arrive after this node saw
    /// the ring change and promoted its copy); the handed state is then another reading of
    /// the same history, and overlaps the promoted one instead of adding to it.
    promoted: Mutex<HashSet<u64>>,
    /// Buckets recalled from the member after this node on the ring (see
    /// `crate::peers::recall_on_join`): that member may still hand them over, and the handed state is
    /// then another reading of the history the recall read.
    recalled: Mutex<HashSet<u64>>,
    /// Copies decided on as their owner's replica (see [`ReplicaCopies::check`]), by how many
    /// admissions changed them: the owner's own copies merge into them instead of replacing
    /// them, until they are handed back to it ([`ReplicaCopies::handed_back`]).
    stood_in: Mutex<HashMap<u64, u64>>,
    /// Whether `stood_in` may hold anything: until then replication does not lock it.
    standing_in: AtomicBool,
    /// Copies that became this node's buckets when it became their owner, since start.
    promotions: AtomicU64,
}

impl ReplicaCopies {
    /// At most `max_keys` copies (`--max-keys`).
    pub fn new(max_keys: u64) -> Self {
        Self {
            // A feed for the disk follower (`crate::durable`): nothing recorded unless followed.
            copies: Store::with_feed(max_keys, super::owned::FEED_ENTRIES),
            has_copies: AtomicBool::new(false),
            promoted: Mutex::new(HashSet::new()),
            recalled: Mutex::new(HashSet::new()),
            stood_in: Mutex::new(HashMap::new()),
            standing_in: AtomicBool::new(false),
            promotions: AtomicU64::new(0),
        }
    }

    /// The copy of bucket `id`, taken out of the copies for an owned bucket that is not held
    /// yet to start from (the ring names this node the owner as soon as the view changes, and
    /// the promotion pass may not have run yet: a check in between must not start the key from
    /// a full bucket). Looked for only on a miss (a bucket created), never on a hit.
    #[inline]
    pub fn take_for_owner(&self, id: u64) -> Option<BucketState> {
        if !self.has_copies.load(Ordering::Relaxed) {
            return None;
        }
        let copy = self.copies.take(id)?;
        self.promoted.lock().insert(id);
        Some(copy)
    }

    /// Keeps the copy of bucket `id` its owner sent (its state there; `None`: the owner no
    /// longer holds it, so neither does the copy).
    ///
    /// A copy this node decided on while the owner did not answer is not replaced: the owner's
    /// state lacks those decisions until they are handed back, so the two readings overlap
    /// (the larger consumption wins).
    pub fn keep(&self, id: u64, state: Option<BucketState>, now: u64) {
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

    /// Starts loading the copies of `ids` into the cache before [`ReplicaCopies::keep`] keeps
    /// them one by one (a frame's copies are spread over the table: one cache miss each,
    /// overlapped this way).
    pub fn prefetch(&self, ids: impl Iterator<Item = u64>) {
        for id in ids {
            self.copies.prefetch(id);
        }
    }

    /// Starts following the copies' change feed (the disk follower: see `crate::durable`).
    pub fn follow(&self) -> Result<Cursor, FeedError> {
        self.copies.follow()
    }

    /// The copies changed since `cursor` (see [`Store::changes`]).
    pub fn changes(&self, cursor: &mut Cursor, out: &mut Vec<Change>) -> Result<(), Lagged> {
        self.copies.changes(cursor, out)
    }

    /// Calls `f` on every copy held: what the disk follower writes again after it lagged.
    pub fn for_each(&self, f: impl FnMut(u64, &BucketState)) {
        self.copies.for_each(f);
    }

    /// The store's shards (see [`ReplicaCopies::for_each_in`]).
    pub fn shard_count(&self) -> usize {
        self.copies.shard_count()
    }

    /// [`ReplicaCopies::for_each`] of shard `k` alone: what a disk snapshot reads, one
    /// shard's lock at a time (see [`Store::for_each_in`]).
    pub fn for_each_in(&self, k: usize, f: impl FnMut(u64, &BucketState)) {
        self.copies.for_each_in(k, f);
    }

    /// Copies held.
    pub fn len(&self) -> usize {
        self.copies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }

    /// Bucket `id`'s copy, if held here.
    pub fn peek(&self, id: u64) -> Option<BucketState> {
        self.copies.peek(id)
    }

    /// Decides a check on the copy of bucket `id` at `now`, as the owner's replica while the
    /// owner does not answer (a copy not held starts full, like the owner's bucket it never
    /// sent). An admission is kept for the owner (see `stood_in`).
    pub fn check(&self, id: u64, rule: &Rule, cost: u64, now: u64) -> Decision {
        self.has_copies.store(true, Ordering::Relaxed);
        let mut stood_in = self.stood_in.lock();
        let d = self.copies.check(id, rule, now, cost);
        if d.allowed && cost > 0 {
            *stood_in.entry(id).or_default() += 1;
            self.standing_in.store(true, Ordering::Relaxed);
        }
        d
    }

    /// Whether this node may be standing in for some owner now (a read of one flag: what a
    /// refund looks at before anything else).
    #[inline]
    pub fn standing_in(&self) -> bool {
        self.standing_in.load(Ordering::Relaxed)
    }

    /// Whether the copy of bucket `id` was decided on as its owner's replica and not handed
    /// back yet.
    pub fn stood_in_for(&self, id: u64) -> bool {
        self.standing_in() && self.stood_in.lock().contains_key(&id)
    }

    /// Gives back `cost` to the copy of bucket `id`, taken as its owner's replica at the
    /// admission marked `mark`, at `now`.
    pub fn refund(&self, id: u64, rule: &Rule, cost: u64, mark: Mark, now: u64) {
        self.copies.refund(id, rule, cost, mark, now);
    }

    /// The copies decided on as their owner's replica, each with its state and how many
    /// admissions it has had: what to hand back to the owners. Copies gone since (promoted,
    /// dropped) are forgotten.
    pub fn stood_in(&self) -> Vec<(u64, BucketState, u64)> {
        if !self.standing_in() {
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

    /// Takes out the copies `pick` selects (those this node now owns) and gives each to
    /// `into` (the owned buckets, which merge it with a bucket held there already), remembering
    /// them as promoted until the next pass (a handover of one overlaps it: see
    /// [`ReplicaCopies::supersede`]). Returns how many moved.
    pub fn promote(
        &self,
        pick: impl FnMut(u64, &BucketState) -> bool,
        mut into: impl FnMut(u64, BucketState),
    ) -> usize {
        let promoted = self.copies.take_if(pick);
        let n = promoted.len();
        let mut set = self.promoted.lock();
        // A pass forgets the previous one's: a handover is sent at once on a ring change.
        set.clear();
        for (id, state) in promoted {
            into(id, state);
            set.insert(id);
        }
        self.promotions.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Drops the copies `pick` selects (those this node no longer replicates); returns how
    /// many.
    pub fn drop_if(&self, pick: impl FnMut(u64, &BucketState) -> bool) -> usize {
        self.copies.take_if(pick).len()
    }

    /// Bucket `id` was handed over to this node by its previous owner: its copy is an older
    /// reading of the same history, and goes. Returns whether the handed state is another
    /// reading of a bucket held already (promoted from the copy, or recalled), to overlap it
    /// rather than add to it.
    pub fn supersede(&self, id: u64) -> bool {
        if !self.has_copies.load(Ordering::Relaxed) {
            return false;
        }
        self.copies.take(id);
        self.promoted.lock().remove(&id) || self.recalled.lock().remove(&id)
    }

    /// Bucket `id` was recalled from the member after this node on the ring: a handover of it
    /// is another reading of the same history (see [`ReplicaCopies::supersede`]).
    pub fn recalled(&self, id: u64) {
        // Recalls come only with replicas on: a handover looks for them with the copies.
        self.has_copies.store(true, Ordering::Relaxed);
        self.recalled.lock().insert(id);
    }

    /// Forgets which buckets were recalled (their handovers have come by then).
    pub fn forget_recalled(&self) {
        self.recalled.lock().clear();
    }
}

/// The copies and their promotions as metrics, read at scrape time.
pub const METRICS: &[Family<ReplicaCopies>] = &[
    Family::gauge(
        "replica_buckets",
        "Copies of other owners' buckets kept by this node as their replica.",
        |c| c.len() as u64,
    ),
    Family::counter(
        "promoted_buckets",
        "Copies that became this node's buckets when it became their owner.",
        |c| load(&c.promotions),
    ),
];
