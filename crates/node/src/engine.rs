//! The local decision path for owned buckets: resolve a check's rule, identify its bucket, let
//! the store decide, and phrase the answer.
//!
//! The engine is the store's one write path: decisions, holds and refunds, handover in and out,
//! resets and the fail-open share's buckets all go through its methods, and every change of an
//! owner's bucket enters the store's change feed ([`Engine::follow`]) for a replica to copy.
//! Shares are local buckets (`Kind::Local`): this node's alone, never replicated.
//!
//! Beside the store, the engine keeps the *copies*: other owners' buckets this node replicates
//! (see `crate::replicas`), in a store of their own bounded by the same `--max-keys`. Copies
//! never decide a check; they become this node's buckets when it becomes their owner
//! ([`Engine::promote`], and on a check's first touch: see [`Engine::decide`]), except while
//! their owner does not answer: then its replica decides on them ([`Engine::decide_copy`]) and
//! keeps those decisions for the owner until it hands them back.
//!
//! Slices of hot buckets leased to other members (see `ringlimit_core::lease`) are taken here
//! too ([`Engine::lease`]), and the engine keeps both sides' tables: what is out on lease, and
//! the slices of other owners' buckets this node holds ([`Engine::held`]).
//!
//! So are reservations (see `ringlimit_core::reserve`): this node's table of the reservations
//! of its buckets ([`Engine::reserve`], [`Engine::settle`]). A settle above the estimate takes
//! the rest into the bucket's own state ([`BucketState::charge`]): a bucket in debt denies
//! until time has repaid it, and its debt goes wherever its state goes (the change feed to its
//! replicas, handover, recall) and is evicted with it.

use crate::rules::{NamedRule, RuleSet, RuleSpec};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use ringlimit_core::answer::answer;
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::clock::Clock;
use ringlimit_core::coordinator::share::Share;
use ringlimit_core::lease::{self, Grants, Held, LeaseSettings, Release};
use ringlimit_core::limiter::{BucketState, Decision, Rule};
use ringlimit_core::reserve::{self, Found, Refused, Reservation, Table, Tenant};
use ringlimit_core::store::{Change, Cursor, FeedError, Kind, Lagged, Store, StoreStats};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{LeaseGrant, Mark};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Unread changes the store's feed keeps while a replica follows it (8 bytes each: 512 KiB at
/// most, allocated only while followed). A follower that falls further behind copies the store
/// again.
const FEED_ENTRIES: usize = 64 * 1024;
/// Most slices out on lease at once (a few bytes each, and a name).
const MOST_SLICES: usize = 16 * 1024;

/// One validated check, ready to decide or route (nothing consumed yet).
#[derive(Debug, Clone)]
pub struct Prepared<'a> {
    pub key: &'a str,
    pub spec: RuleSpec<'a>,
    pub cost: u64,
    pub resolved: Resolved,
    /// The bucket's identity.
    pub id: u64,
}

/// Rules, buckets and time: everything one node needs to decide checks it owns.
pub struct Engine {
    store: Store,
    /// Other owners' buckets this node replicates (no feed: copies are not copied on).
    copies: Store,
    /// Whether a copy was ever kept: until then a check's miss does not look for one.
    has_copies: AtomicBool,
    /// Buckets promoted from copies since the last promotion pass. Their previous owner may
    /// still hand them over (a graceful leave: its handover can arrive after this node saw
    /// the ring change and promoted its copy); the handed state is then another reading of
    /// the same history, and overlaps the promoted one instead of adding to it.
    promoted: Mutex<HashSet<u64>>,
    /// Buckets recalled from the member after this node on the ring (see
    /// `crate::peers::recall`): that member may still hand them over, and the handed state is
    /// then another reading of the history the recall read.
    recalled: Mutex<HashSet<u64>>,
    /// Copies decided on as their owner's replica (see [`Engine::decide_copy`]), by how many
    /// admissions changed them: the owner's own copies merge into them instead of replacing
    /// them, until they are handed back to it ([`Engine::handed_back`]).
    stood_in: Mutex<HashMap<u64, u64>>,
    /// Whether `stood_in` may hold anything: until then replication does not lock it.
    standing_in: AtomicBool,
    rules: ArcSwap<RuleSet>,
    clock: Arc<dyn Clock>,
    /// Slices of this node's buckets out on lease.
    grants: Grants,
    /// Slices of other owners' buckets held here.
    held: Arc<Held>,
    /// Reservations of this node's buckets, live.
    reservations: Table,
    /// The longest a reservation may live here (`--max-reservation-ttl-ms`).
    max_ttl_ms: u64,
    /// Tokens settled above what their buckets admitted (owed by them), and of those, what was
    /// beyond the most a bucket may owe (forgiven), since start.
    pub debt: DebtStats,
}

/// What settles above their estimates did to this node's buckets, since start.
#[derive(Debug, Default)]
pub struct DebtStats {
    pub owed: AtomicU64,
    pub forgiven: AtomicU64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Engine {
    pub fn new(rules: RuleSet, max_keys: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            store: Store::with_feed(max_keys, FEED_ENTRIES),
            copies: Store::new(max_keys),
            has_copies: AtomicBool::new(false),
            promoted: Mutex::new(HashSet::new()),
            recalled: Mutex::new(HashSet::new()),
            stood_in: Mutex::new(HashMap::new()),
            standing_in: AtomicBool::new(false),
            rules: ArcSwap::from_pointee(rules),
            clock,
            grants: Grants::new(MOST_SLICES),
            held: Arc::new(Held::new(LeaseSettings::default())),
            reservations: Table::new(reserve::MOST_RESERVATIONS),
            max_ttl_ms: reserve::DEFAULT_MAX_TTL_MS,
            debt: DebtStats::default(),
        }
    }

    /// This engine letting reservations live at most `ms` (`--max-reservation-ttl-ms`).
    pub fn with_max_reservation_ttl_ms(mut self, ms: u64) -> Self {
        self.max_ttl_ms = ms;
        self
    }

    /// The longest a reservation may live here, in ms.
    pub fn max_reservation_ttl_ms(&self) -> u64 {
        self.max_ttl_ms
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
    pub fn bucket_count(&self) -> usize {
        self.store.len()
    }

    /// What the store evicted to stay within its bound.
    pub fn store_stats(&self) -> &StoreStats {
        self.store.stats()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Puts new rules in force (checks in flight finish under the old ones).
    pub fn set_rules(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
    }

    /// Resolves and validates a check's rule.
    pub fn resolve(&self, spec: RuleSpec<'_>) -> Result<Resolved, CheckError> {
        match spec {
            RuleSpec::Named(name) => self
                .rules
                .load()
                .get(name)
                .map(|r| NamedRule::resolved(r))
                .ok_or_else(|| CheckError::UnknownRule(name.to_owned())),
            RuleSpec::Inline(inline) => Resolved::inline(&inline).map_err(CheckError::InvalidRule),
        }
    }

    /// Validates a whole check without deciding it; returns the rule and the bucket's identity.
    pub fn prepare(
        &self,
        key: &str,
        spec: RuleSpec<'_>,
        cost: u64,
    ) -> Result<(Resolved, u64), CheckError> {
        // The key first: a bad key is named whatever else is wrong.
        ringlimit_core::rule::validate_key(key).map_err(CheckError::InvalidKey)?;
        let resolved = self.resolve(spec)?;
        Ok((resolved, resolved.bucket(key, cost)?))
    }

    /// [`Engine::prepare`], keeping the check's parts together.
    pub fn prepare_check<'a>(
        &self,
        key: &'a str,
        spec: RuleSpec<'a>,
        cost: u64,
    ) -> Result<Prepared<'a>, CheckError> {
        let (resolved, id) = self.prepare(key, spec, cost)?;
        Ok(Prepared {
            key,
            spec,
            cost,
            resolved,
            id,
        })
    }

    /// Decides a check on this node.
    pub fn check(
        &self,
        key: &str,
        spec: RuleSpec<'_>,
        cost: u64,
    ) -> Result<CheckAnswer, CheckError> {
        let (resolved, id) = self.prepare(key, spec, cost)?;
        Ok(self.decide(id, &resolved.rule, cost))
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
    fn check_now(&self, id: u64, rule: &Rule, cost: u64, now: impl FnOnce() -> u64) -> Decision {
        let seed = || self.copy_of(id);
        self.store
            .check_seeded(Kind::Replicated, id, rule, now, cost, seed)
    }

    /// The copy of bucket `id`, taken out of the copies (see [`Engine::decide`]).
    #[inline]
    fn copy_of(&self, id: u64) -> Option<BucketState> {
        if !self.has_copies.load(Ordering::Relaxed) {
            return None;
        }
        let copy = self.copies.take(id)?;
        self.promoted.lock().insert(id);
        Some(copy)
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

    /// Answers `holder`'s ask for `want` tokens of bucket `id` (this node owns it) at `now`:
    /// a slice taken from the bucket at once, sized among its holders and what is left (see
    /// [`lease::grant`]), or a refusal (an algorithm that is not leased; the bucket denies).
    pub fn lease(&self, id: u64, rule: &Rule, holder: &str, want: u64, now: u64) -> LeaseGrant {
        let peek = || self.check_now(id, rule, 0, || now);
        if !lease::leasable(rule.algorithm) {
            return LeaseGrant::Refused {
                answer: answer(&peek(), rule),
            };
        }
        self.grants.grant(id, holder, now, |holders| {
            lease::grant(rule, want, holders, now, peek(), |n| {
                self.check_now(id, rule, n, || now)
            })
        })
    }

    /// Reserves `estimate` of bucket `id` (this node owns it) for `tenant` at `now` for
    /// `ttl_ns`, kept under `nonce`: the check's answer (denied: nothing kept), or why it was
    /// not kept (nothing taken then either). An estimate of 0 takes nothing, so nothing is
    /// kept: it is answered as a check of cost 0 (and its settle is unknown).
    pub fn reserve(
        &self,
        id: u64,
        (rule, tenant): (&Rule, Tenant),
        estimate: u64,
        (nonce, ttl_ns): (u128, u64),
        now: u64,
    ) -> Result<CheckAnswer, Refused> {
        if estimate == 0 {
            let answer = self.decide_at(id, rule, 0, now);
            self.count_denied(&answer);
            return Ok(answer);
        }
        if let Some(refused) = self.reservations.refuses(tenant) {
            return Err(refused);
        }
        let (answer, mark) = self.hold(id, rule, estimate, now);
        if !answer.allowed {
            self.count_denied(&answer);
            return Ok(answer);
        }
        let kept = Reservation {
            id,
            tenant,
            rule: *rule,
            estimate,
            mark,
            deadline: now.saturating_add(ttl_ns),
        };
        if let Err(refused) = self.reservations.insert(nonce, kept) {
            if let Some(mark) = mark {
                self.refund(id, rule, estimate, mark, now);
            }
            return Err(refused);
        }
        Ok(answer)
    }

    /// Counts a reservation the bucket denied (nothing kept).
    fn count_denied(&self, answer: &CheckAnswer) {
        if !answer.allowed {
            self.reservations
                .stats
                .denied
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Settles reservation `nonce` of bucket `id` at its `actual` cost at `now` (see
    /// [`reserve::settle`]): the bucket's answer afterwards (a read: in debt, it denies), or
    /// `None` when no such reservation is live here.
    ///
    /// A cost above the estimate is taken whatever the bucket admits: what it could not
    /// admit, it owes, in its own state.
    pub fn settle(
        &self,
        id: u64,
        rule: &Rule,
        nonce: u128,
        actual: u64,
        now: u64,
    ) -> Option<CheckAnswer> {
        let Found::Live(r) = self.reservations.take(nonce, id, now) else {
            return None;
        };
        let s = reserve::settle(&mut self.bucket(id, rule, now), &r, actual);
        if s.owed > 0 {
            self.debt.owed.fetch_add(s.owed, Ordering::Relaxed);
            self.debt.forgiven.fetch_add(s.forgiven, Ordering::Relaxed);
        }
        Some(self.decide_at(id, rule, 0, now))
    }

    /// Drops the reservations expired at `now` (their estimates stay taken); returns how
    /// many.
    pub fn sweep_reservations(&self, now: u64) -> u64 {
        self.reservations.sweep(now)
    }

    /// The live reservations of this node's buckets.
    pub fn reservations(&self) -> &Table {
        &self.reservations
    }

    /// Bucket `id` at `now`, as a settle decides on it.
    fn bucket<'a>(&'a self, id: u64, rule: &'a Rule, now: u64) -> Owned<'a> {
        Owned {
            engine: self,
            id,
            rule,
            now,
        }
    }

    /// The slices of other owners' buckets this node holds.
    pub fn held(&self) -> &Arc<Held> {
        &self.held
    }

    /// Slices out on lease now, and their tokens as granted.
    pub fn leases_out(&self) -> (usize, u64) {
        self.grants.live(self.clock.now())
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

/// Copies: other owners' buckets kept here as their replica.
impl Engine {
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

/// One of this node's buckets at one instant, for `ringlimit_core::reserve`.
struct Owned<'a> {
    engine: &'a Engine,
    id: u64,
    rule: &'a Rule,
    now: u64,
}

impl reserve::Bucket for Owned<'_> {
    fn decide(&mut self, cost: u64) -> Decision {
        self.engine.check_now(self.id, self.rule, cost, || self.now)
    }

    fn refund(&mut self, cost: u64, mark: Mark) {
        self.engine.refund(self.id, self.rule, cost, mark, self.now);
    }

    fn charge(&mut self, cost: u64) -> u64 {
        let e = self.engine;
        let seed = || e.copy_of(self.id);
        e.store
            .charge_seeded(Kind::Replicated, self.id, self.rule, self.now, cost, seed)
    }
}

/// The mark of what an admission of `cost` at `now` took (`None`: it took nothing).
fn taken(d: &Decision, cost: u64, now: u64) -> Option<Mark> {
    (d.allowed && cost > 0).then_some(Mark {
        reset_ns: d.reset_ns,
        at_ns: now,
    })
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

impl crate::rules::InForce for Engine {
    fn rules(&self) -> Arc<RuleSet> {
        Engine::rules(self)
    }

    fn set_rules(&self, rules: RuleSet) {
        Engine::set_rules(self, rules);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::clock::ManualClock;
    use ringlimit_core::limiter::test_support::T0;

    fn engine() -> (Engine, Rule) {
        let rules = RuleSet::from_yaml("rules:\n  - { name: gold, limit: 10, period: 1s }\n")
            .expect("valid rules");
        let e = Engine::new(rules, 1000, Arc::new(ManualClock::new(T0)));
        let (resolved, _) = e.prepare("k", RuleSpec::Named("gold"), 1).expect("valid");
        (e, resolved.rule)
    }

    fn changed(e: &Engine, c: &mut Cursor) -> Vec<(u64, bool)> {
        let mut out = Vec::new();
        e.changes(c, &mut out).expect("not lagged");
        out.iter().map(|ch| (ch.id, ch.state.is_some())).collect()
    }

    #[test]
    fn owner_writes_enter_the_feed_and_share_writes_do_not() {
        let (e, rule) = engine();
        let mut c = e.follow().expect("the engine's store has a feed");
        let (a, mark) = e.hold(1, &rule, 1, T0);
        assert!(a.allowed);
        let mark = mark.expect("took its cost");
        assert_eq!(changed(&e, &mut c), vec![(1, true)]);
        e.refund(1, &rule, 1, mark, T0);
        assert_eq!(changed(&e, &mut c), vec![(1, true)]);

        let (a, taken) = e.share().hold(2, &rule, 1, 1, T0);
        let share_id = ringlimit_core::coordinator::share::fallback_id(2);
        assert!(a.allowed && e.holds(share_id));
        e.share().refund(&taken.expect("took its cost"), T0);
        assert_eq!(e.reset(&[share_id]), 1);
        assert_eq!(changed(&e, &mut c), vec![]);

        let out = e.hand_out(|id, _| id == 1);
        assert_eq!(out.len(), 1);
        assert_eq!(changed(&e, &mut c), vec![(1, false)]);
        for (id, st) in out {
            e.take_in(id, st, T0);
        }
        assert_eq!(changed(&e, &mut c), vec![(1, true)]);
        assert_eq!(e.reset(&[1, 3]), 1);
        assert_eq!(changed(&e, &mut c), vec![(1, false)]);
        assert_eq!(e.bucket_count(), 0);
        e.unfollow(c);
    }

    #[test]
    fn copies_decide_nothing_until_promoted_or_first_touched() {
        let (e, rule) = engine();
        let mut c = e.follow().expect("a feed");
        // A used-up bucket at its owner, copied here (twice: the owner's state replaces).
        let (used, spent) = (1, 2);
        let owner = Engine::new(RuleSet::builtin(), 100, Arc::new(ManualClock::new(T0)));
        for _ in 0..10 {
            owner.decide_at(used, &rule, 1, T0);
            owner.decide_at(spent, &rule, 1, T0);
        }
        e.keep_copy(used, owner.peek(used), T0);
        e.keep_copy(used, owner.peek(used), T0);
        e.keep_copy(spent, owner.peek(spent), T0);
        e.keep_copy(3, owner.peek(3), T0);
        assert_eq!((e.copy_count(), e.bucket_count()), (2, 0));
        assert_eq!(changed(&e, &mut c), vec![], "copies are not copied on");

        // A check before promotion starts from the copy, not from a full bucket.
        assert!(!e.decide_at(used, &rule, 1, T0).allowed);
        assert_eq!((e.copy_count(), e.bucket_count()), (1, 1));
        assert_eq!(
            changed(&e, &mut c),
            vec![(used, true)],
            "the new owner's bucket"
        );

        // Promotion merges with a bucket held already (one decided here while views
        // disagreed; here unspent): consumptions add.
        e.store
            .absorb(spent, BucketState::Gcra { tat: T0, tag: 0 }, T0);
        e.keep_copy(4, owner.peek(used), T0);
        assert_eq!(e.promote(|id, _| id == spent, T0), 1);
        assert!(!e.decide_at(spent, &rule, 1, T0).allowed);
        assert_eq!(e.peek(spent), owner.peek(spent));
        // Its previous owner's handover, arriving after the promotion, is the same history:
        // it overlaps (the larger wins) instead of counting the copy twice.
        e.take_in(spent, owner.peek(spent).expect("held"), T0);
        assert_eq!(e.peek(spent), owner.peek(spent));
        // A handover that comes first supersedes the copy: promoting later adds nothing.
        e.keep_copy(6, owner.peek(used), T0);
        e.take_in(6, owner.peek(used).expect("held"), T0);
        assert_eq!(e.promote(|_, _| true, T0), 1, "the copy of 4 only");
        assert_eq!(e.peek(6), owner.peek(used));
        e.take_in(4, BucketState::Gcra { tat: T0, tag: 0 }, T0);
        assert_eq!(e.peek(4), owner.peek(used), "overlapped");
        e.keep_copy(4, owner.peek(used), T0);
        assert_eq!(e.drop_copies(|id, _| id == 4), 1);
        e.keep_copy(5, owner.peek(used), T0);
        e.keep_copy(5, None, T0);
        assert_eq!(e.copy_count(), 0);
        e.unfollow(c);
    }

    /// Standing in for an owner that does not answer: decisions on the copy, kept for the
    /// owner (its later copies overlap instead of replacing them) until handed back; a copy
    /// a check as the owner's started from (a peer whose ring already dropped the owner) is
    /// still the one history a stand-in decides on.
    #[test]
    fn a_stand_in_decides_on_the_copy_and_keeps_it_for_the_owner() {
        let (e, rule) = engine();
        let owner = Engine::new(RuleSet::builtin(), 100, Arc::new(ManualClock::new(T0)));
        for _ in 0..8 {
            owner.decide_at(1, &rule, 1, T0);
        }
        e.keep_copy(1, owner.peek(1), T0);
        let a = e.decide_copy(1, &rule, 1, T0);
        assert!(a.allowed && a.remaining == 1, "{a:?}");
        // The owner's stale copy does not undo the stand-in's admission.
        e.keep_copy(1, owner.peek(1), T0);
        assert_eq!(e.decide_copy(1, &rule, 0, T0).remaining, 1);
        let stood_in = e.stood_in();
        assert_eq!(
            stood_in.iter().map(|s| (s.0, s.2)).collect::<Vec<_>>(),
            [(1, 1)]
        );
        // Handed back: a copy like any other again.
        e.handed_back(1, 1);
        assert!(e.stood_in().is_empty());
        e.keep_copy(1, owner.peek(1), T0);
        assert_eq!(e.decide_copy(1, &rule, 0, T0).remaining, 2);

        // A check as the owner's started from the copy: the stand-in goes on from there.
        e.keep_copy(2, owner.peek(1), T0);
        assert_eq!(e.decide_at(2, &rule, 1, T0).remaining, 1);
        assert_eq!(e.peek_copy(2), None);
        assert!(e.decide_copy(2, &rule, 1, T0).allowed);
        assert!(
            !e.decide_copy(2, &rule, 1, T0).allowed,
            "not a fresh bucket"
        );
    }

    /// A recalled state and the handover of the same bucket are two readings of one history:
    /// the handover overlaps what was recalled (and decided on since), it does not add to it;
    /// a bucket the recall did not find is absorbed as before (the two histories add).
    #[test]
    fn a_recalled_bucket_overlaps_its_later_handover() {
        let (e, rule) = engine();
        let (previous, _) = engine();
        for _ in 0..6 {
            previous.decide_at(1, &rule, 1, T0);
            previous.decide_at(2, &rule, 1, T0);
        }
        let handed = |id| previous.peek(id).expect("held");
        e.recall_in(1, handed(1), T0);
        assert_eq!(
            e.decide_at(1, &rule, 1, T0).remaining,
            3,
            "6 recalled, 1 here"
        );
        e.take_in(1, handed(1), T0);
        assert_eq!(e.decide_at(1, &rule, 0, T0).remaining, 3, "not 6 more");
        // Nothing recalled for 2: decided here from a full bucket, then the handover adds.
        assert_eq!(e.decide_at(2, &rule, 1, T0).remaining, 9);
        e.take_in(2, handed(2), T0);
        assert_eq!(e.decide_at(2, &rule, 0, T0).remaining, 3);
        // Forgotten once the window closed: a later handover adds again.
        e.recall_in(3, handed(1), T0);
        e.forget_recalled();
        e.take_in(3, handed(1), T0);
        assert_eq!(e.decide_at(3, &rule, 0, T0).remaining, 0);
    }

    /// A reservation at the owner: given back, taken into debt; while a bucket owes, every
    /// decision on it denies (checks, holds, lease grants, reserves) and takes nothing, until
    /// its refill has repaid the debt; a reservation of 0 holds nothing; a reset forgets the
    /// bucket, its debt with it.
    #[test]
    fn a_bucket_in_debt_denies_everything_until_time_repays_it() {
        let (e, rule) = engine();
        let tenant = Tenant::Named(1);
        let (ms, sec) = (1_000_000, 1_000_000_000);
        let (id, ttl) = (9, 60 * sec);
        let a = e
            .reserve(id, (&rule, tenant), 6, (1, ttl), T0)
            .expect("kept");
        assert_eq!((a.allowed, a.remaining), (true, 4));
        assert_eq!(e.settle(id, &rule, 1, 2, T0).map(|a| a.remaining), Some(8));
        assert_eq!(e.settle(id, &rule, 1, 2, T0), None, "settled once");
        // 5 reserved (3 left), 10 used: 3 more taken now, 2 owed.
        e.reserve(id, (&rule, tenant), 5, (2, ttl), T0)
            .expect("kept");
        let a = e.settle(id, &rule, 2, 10, T0).expect("live");
        assert_eq!((a.allowed, a.remaining), (false, 0));
        assert_eq!(
            a.retry_after_ms, 300,
            "2 owed, then 1 to take, at 10 a second"
        );
        assert_eq!(e.debt.owed.load(Ordering::Relaxed), 2);
        assert!(!e.decide_at(id, &rule, 1, T0).allowed);
        assert_eq!(e.hold(id, &rule, 1, T0).1, None, "nothing taken");
        assert!(matches!(
            e.lease(id, &rule, "n1", 5, T0),
            LeaseGrant::Refused { .. }
        ));
        let denied = e
            .reserve(id, (&rule, tenant), 1, (3, ttl), T0)
            .expect("answered");
        assert!(!denied.allowed && e.reservations().is_empty());
        assert!(!e.decide_at(id, &rule, 1, T0 + 300 * ms - 1).allowed);
        assert!(e.decide_at(id, &rule, 1, T0 + 300 * ms).allowed, "repaid");
        // A reservation of 0 takes nothing and is kept nowhere.
        let a = e
            .reserve(id, (&rule, tenant), 0, (4, sec), T0 + sec)
            .expect("answered");
        assert!(a.allowed && e.reservations().is_empty());
        // Expired reservations are swept; a reset forgets the bucket, debt and all.
        e.reserve(id, (&rule, tenant), 1, (5, sec), T0 + sec)
            .expect("kept");
        assert_eq!(e.sweep_reservations(T0 + 3 * sec), 1);
        e.reserve(id, (&rule, tenant), 1, (6, ttl), T0 + 3 * sec)
            .expect("kept");
        assert!(
            !e.settle(id, &rule, 6, 10, T0 + 3 * sec)
                .expect("live")
                .allowed
        );
        e.reset(&[id]);
        assert!(e.decide_at(id, &rule, 1, T0 + 3 * sec).allowed);
    }
}
