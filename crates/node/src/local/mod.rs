//! Local state: what this node decides itself, by what it holds. [`Local`] is the coordinator's
//! "here" (`ringlimit_core::coordinator::Here`): a check the routing decides here goes from the
//! coordinator to [`Local`] to the store (or the global counters), and nowhere else.
//!
//! Each part holds one kind of state, with its own metrics:
//! - owned buckets (the store, its change feed, what settles made buckets owe);
//! - replica copies of other owners' buckets (standing in for an owner that does not answer,
//!   promotion when this node becomes their owner);
//! - leases (slices granted by this node as owner, slices held of other owners' buckets);
//! - reservations (costs estimated now and settled later, at the owner);
//! - global counters (`mode: global` rules, decided on every node: `crate::global`).
//!
//! What needs two parts at once is [`Local`]'s: an owned bucket not held yet starts from its
//! copy, a handover supersedes a copy, a promotion moves copies into the owned buckets, a
//! refund of a decision made standing in goes to the copy, leases and reservations take from
//! owned buckets. Followers of the change feed (the replica sender) and the tasks that talk to
//! peers (handing back, asking for leases) sit beside this layer, above the peers.
//!
//! # Layout
//! - this module — [`Local`]: the parts, the rules in force and the clock; deciding here
//!   ([`Placement`]: on a bucket or on its copy), and what crosses parts.
//! - [`owned`] — [`OwnedBuckets`]: the store and its feed, debts.
//! - [`copies`] — [`ReplicaCopies`]: copies kept as a replica, standing in, promotion.
//! - [`leases`] — [`Leases`]: slices granted and held.
//! - [`holds`] — [`holds::Holds`]: a client's ledger of what it may give back.
//! - [`reservations`] — [`Reservations`]: the owner's table, its sweep.

pub mod copies;
pub mod holds;
pub mod leases;
pub mod owned;
pub mod reservations;

pub use copies::ReplicaCopies;
pub use leases::Leases;
pub use owned::OwnedBuckets;
pub use reservations::Reservations;

use crate::cluster::View;
use crate::global::GlobalCounters;
use crate::rules::{InForce, Prepared, RuleSet};
use owned::taken;
use ringlimit_core::answer::{answer, given_back};
use ringlimit_core::check::Resolved;
use ringlimit_core::clock::Clock;
use ringlimit_core::coordinator;
use ringlimit_core::limiter::{BucketState, Decision, Rule};
use ringlimit_core::reservations::ReserveError;
use ringlimit_core::rule::{LeaseMode, Mode, PersistMode, RegionScope};
use ringlimit_core::store::Kind;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{LeaseGrant, Mark};
use std::sync::Arc;

/// Where an owner-mode check is decided here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// This node's bucket (it owns it, or a peer sent it here as the owner).
    Bucket,
    /// This node's copy, as the replica of an owner that does not answer.
    Copy,
}

/// What decides a `scope: regions` check on a node with regions (`crate::regions::Regions`):
/// on the allowance its region holds, never on the store.
pub trait AcrossRegions: Send + Sync {
    fn check(&self, p: &Prepared<'_>, now: u64) -> CheckAnswer;
}

/// Everything this node decides itself, and the rules and clock it decides under.
pub struct Local {
    rules: Arc<InForce>,
    clock: Arc<dyn Clock>,
    owned: Arc<OwnedBuckets>,
    copies: Arc<ReplicaCopies>,
    leases: Arc<Leases>,
    reservations: Arc<Reservations>,
    global: Arc<GlobalCounters>,
    /// `--persist-min-period` in ns while buckets are kept on disk (`--data-dir`); `None`:
    /// no bucket is durable.
    persist_min_ns: Option<u64>,
    blocks: Arc<crate::blocks::Blocklist>,
    max_keys: u64,
    /// Set on a node with regions: `scope: regions` checks are decided there.
    regions: std::sync::OnceLock<Arc<dyn AcrossRegions>>,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("owned", &self.owned)
            .field("copies", &self.copies)
            .finish_non_exhaustive()
    }
}

/// What a promotion pass did (see [`Local::promote`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Promoted {
    /// Copies that became this node's buckets.
    pub promoted: usize,
    /// Copies dropped: their owner is alive and this node no longer replicates them.
    pub dropped: usize,
}

impl Local {
    /// Local state deciding under `rules` on `clock`, at most `max_keys` buckets (and as many
    /// copies), global rules on `global`.
    pub fn new(
        rules: Arc<InForce>,
        clock: Arc<dyn Clock>,
        max_keys: u64,
        global: Arc<GlobalCounters>,
    ) -> Self {
        Self {
            rules,
            clock,
            owned: Arc::new(OwnedBuckets::new(max_keys)),
            copies: Arc::new(ReplicaCopies::new(max_keys)),
            leases: Arc::default(),
            reservations: Arc::default(),
            global,
            persist_min_ns: None,
            blocks: Arc::default(),
            max_keys,
            regions: std::sync::OnceLock::new(),
        }
    }

    /// `--max-keys`: the buckets held at most (and as many copies).
    pub fn max_keys(&self) -> u64 {
        self.max_keys
    }

    /// From now on `scope: regions` checks are decided by `regions` (a node with regions).
    pub fn share_across_regions(&self, regions: Arc<dyn AcrossRegions>) {
        let _ = self.regions.set(regions);
    }

    /// A global check, decided from the counters; a `scope: regions` rule's counts also go to
    /// the other regions (on a node with regions: see [`GlobalCounters::across_regions`]).
    #[inline]
    fn global_answer(&self, p: &Prepared<'_>, now: u64) -> CheckAnswer {
        let shared = p.resolved.scope == RegionScope::Regions;
        self.global
            .answer(p.id, &p.resolved.rule, shared, now, p.cost)
    }

    /// The one branch the owner's decide path takes for `scope: regions` rules: `Some` when
    /// the rule is one and this node has regions.
    #[inline]
    fn across_regions(&self, p: &Prepared<'_>, now: impl FnOnce() -> u64) -> Option<CheckAnswer> {
        if p.resolved.scope != RegionScope::Regions {
            return None;
        }
        Some(self.regions.get()?.check(p, now()))
    }

    /// Keeping blocks in `blocks` (bounded by `--max-blocks`, deciding as this node).
    pub fn with_blocks(mut self, blocks: Arc<crate::blocks::Blocklist>) -> Self {
        self.blocks = blocks;
        self
    }

    /// This node's blocks.
    pub fn blocks(&self) -> &Arc<crate::blocks::Blocklist> {
        &self.blocks
    }

    /// After a check decided on this node's bucket: a denial under a rule with a `block`
    /// policy counts towards blocking its key (this node is the key's owner).
    #[inline]
    fn after_owned(&self, p: &Prepared<'_>, a: &CheckAnswer, now: u64) {
        if a.allowed || p.resolved.shadow || p.resolved.mode != Mode::Owner {
            return;
        }
        if let crate::rules::RuleSpec::Named(name) = p.spec {
            self.denied(name, p, now);
        }
    }

    #[cold]
    fn denied(&self, name: &str, p: &Prepared<'_>, now: u64) {
        let rules = self.rules.rules();
        if let Some(policy) = rules.get(name).and_then(|r| r.block) {
            let now_ms = now / ringlimit_core::clock::NANOS_PER_MS;
            self.blocks.denied((p.id, p.key, name), &policy, now_ms);
        }
    }

    /// Local state with no cluster around it (benches, tests): global counters of its own.
    pub fn alone(rules: RuleSet, max_keys: u64, clock: Arc<dyn Clock>) -> Self {
        let global = GlobalCounters::new(
            crate::global::actor("alone", 0),
            crate::global::DEFAULT_MAX_WINDOWS,
        );
        Self::new(
            Arc::new(InForce::new(rules)),
            clock,
            max_keys,
            Arc::new(global),
        )
    }

    /// Letting reservations live at most `ms` (`--max-reservation-ttl-ms`).
    pub fn with_max_reservation_ttl_ms(mut self, ms: u64) -> Self {
        self.reservations = Arc::new(Reservations::new(ms));
        self
    }

    /// Keeping on disk the buckets of rules whose period is at least `min_ns`
    /// (`--persist-min-period`), or that say `persist: always` (see `crate::durable`).
    pub fn with_persistence(mut self, min_ns: u64) -> Self {
        self.persist_min_ns = Some(min_ns);
        self
    }

    /// `--persist-min-period` in ns while buckets are kept on disk.
    pub fn persist_min_ns(&self) -> Option<u64> {
        self.persist_min_ns
    }

    /// Whether buckets are kept on disk at all.
    pub fn persists(&self) -> bool {
        self.persist_min_ns.is_some()
    }

    /// The kind of a bucket of `rule`, which says `persist`: durable when the disk follower
    /// keeps it. Decided on every write under a rule: two compares, nothing else.
    #[inline]
    pub fn kind(&self, rule: &Rule, persist: PersistMode) -> Kind {
        let durable = match (self.persist_min_ns, persist) {
            (None, _) | (_, PersistMode::Never) => false,
            (Some(_), PersistMode::Always) => true,
            (Some(min), PersistMode::Auto) => rule.period_ns >= min,
        };
        if durable {
            Kind::Durable
        } else {
            Kind::Replicated
        }
    }

    /// The kind of a bucket that comes without its rule (handed over, recalled): durable
    /// whenever buckets are kept at all, since its rule may be worth keeping (the next write
    /// under its rule says for sure).
    pub fn kind_unknown(&self) -> Kind {
        if self.persists() {
            Kind::Durable
        } else {
            Kind::Replicated
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> &Arc<InForce> {
        &self.rules
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Now, on this node's clock.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    pub fn owned(&self) -> &Arc<OwnedBuckets> {
        &self.owned
    }

    pub fn copies(&self) -> &Arc<ReplicaCopies> {
        &self.copies
    }

    pub fn leases(&self) -> &Arc<Leases> {
        &self.leases
    }

    pub fn reservations(&self) -> &Arc<Reservations> {
        &self.reservations
    }

    pub fn global(&self) -> &Arc<GlobalCounters> {
        &self.global
    }

    /// The store's check of owned bucket `id`, the time read by `now`; a bucket not held yet
    /// starts from this node's copy of it (see [`ReplicaCopies::take_for_owner`]).
    #[inline]
    fn check_owned(
        &self,
        id: u64,
        (rule, kind): (&Rule, Kind),
        cost: u64,
        now: impl FnOnce() -> u64,
    ) -> Decision {
        let seed = || self.copies.take_for_owner(id);
        self.owned.check(kind, id, rule, cost, now, seed)
    }

    /// A check on the copy of bucket `id`, as its owner's replica; on the bucket when the copy
    /// became this node's (promoted, or started from by a check decided here as the owner's):
    /// the same history, decided there.
    fn check_copy(&self, id: u64, (rule, kind): (&Rule, Kind), cost: u64, now: u64) -> Decision {
        if self.copies.peek(id).is_none() && self.owned.holds(id) {
            return self.check_owned(id, (rule, kind), cost, || now);
        }
        self.copies.check(id, rule, cost, now)
    }

    /// Gives back `cost` to bucket `id`, taken at the admission marked `mark`, at `now`. A
    /// check decided on a copy (as its owner's replica) is refunded on that copy.
    fn refund_owned(&self, id: u64, rule: &Rule, cost: u64, mark: Mark, now: u64) {
        if self.copies.standing_in() && !self.owned.holds(id) && self.copies.stood_in_for(id) {
            self.copies.refund(id, rule, cost, mark, now);
            return;
        }
        self.owned.refund(id, rule, cost, mark, now);
    }

    /// Owned bucket `id` under `rule` at `now`, for what takes from it other than a check
    /// (a lease, a reservation, a settle) and for a read.
    pub fn bucket<'a>(&'a self, id: u64, rule: &'a Rule, now: u64) -> OwnedBucket<'a> {
        self.bucket_of(id, (rule, PersistMode::Auto), now)
    }

    /// [`Local::bucket`] of a rule that says `persist`.
    pub fn bucket_of<'a>(
        &'a self,
        id: u64,
        (rule, persist): (&'a Rule, PersistMode),
        now: u64,
    ) -> OwnedBucket<'a> {
        OwnedBucket {
            local: self,
            id,
            rule,
            kind: self.kind(rule, persist),
            now,
        }
    }

    /// [`coordinator::Here::hold_at`] on this node's bucket or, as the owner's replica, on its
    /// copy. Global counters cannot give back (their G-counters only grow), so a global check
    /// here takes its cost for good and is never marked.
    pub fn hold_on(
        &self,
        on: Placement,
        p: &Prepared<'_>,
        now: u64,
    ) -> (CheckAnswer, Option<Mark>) {
        let rule = &p.resolved.rule;
        let kind = self.kind(rule, p.resolved.persist);
        let d = match (p.resolved.mode, on) {
            (Mode::Global, _) => return (self.global_answer(p, now), None),
            (Mode::Owner, Placement::Bucket) => {
                // What an allowance admitted is not given back: fewer admissions only.
                if let Some(a) = self.across_regions(p, || now) {
                    return (a, None);
                }
                let d = self.check_owned(p.id, (rule, kind), p.cost, || now);
                let a = answer(&d, rule);
                self.after_owned(p, &a, now);
                return (a, taken(&d, p.cost, now));
            }
            (Mode::Owner, Placement::Copy) => self.check_copy(p.id, (rule, kind), p.cost, now),
        };
        (answer(&d, rule), taken(&d, p.cost, now))
    }

    /// Gives back at `now` what [`Local::hold_on`] took under `mark` (an owner giving back its
    /// own group does so at the instant it decided: exactly).
    fn refund_at(&self, p: &Prepared<'_>, mark: Mark, now: u64) {
        if p.resolved.mode == Mode::Owner {
            self.refund_owned(p.id, &p.resolved.rule, p.cost, mark, now);
        }
    }

    /// Decides one request's checks that belong here, all-or-nothing at `now`, check `i` where
    /// `on(i)` says: when any non-shadow check denies (or is `None`: invalid here), what the
    /// others took is given back before answering. Returns each answer with the mark of what
    /// it still holds.
    pub fn decide_all_on(
        &self,
        items: &[Option<&Prepared<'_>>],
        now: u64,
        on: impl Fn(usize) -> Placement,
    ) -> Vec<Option<(CheckAnswer, Option<Mark>)>> {
        let mut out: Vec<_> = items
            .iter()
            .enumerate()
            .map(|(i, p)| p.map(|p| self.hold_on(on(i), p, now)))
            .collect();
        let denied = items.iter().zip(&out).any(|(p, a)| match (p, a) {
            (Some(p), Some((a, _))) => !a.allowed && !p.resolved.shadow,
            _ => true,
        });
        if denied {
            for (p, a) in items.iter().zip(out.iter_mut()) {
                if let (Some(p), Some((answer, mark))) = (p, a)
                    && let Some(m) = mark.take()
                {
                    self.refund_at(p, m, now);
                    *answer = given_back(*answer, p.cost);
                }
            }
        }
        out
    }

    /// Answers `holder`'s ask for `want` tokens of bucket `id` (this node owns it) at `now`
    /// (see [`Leases::grant`]).
    pub fn lease(&self, id: u64, rule: &Rule, (holder, want): (&str, u64), now: u64) -> LeaseGrant {
        let kind = self.kind(rule, PersistMode::Auto);
        let check = |n| self.check_owned(id, (rule, kind), n, || now);
        self.leases.grant(id, rule, (holder, want), now, check)
    }

    /// Answers `holder`'s ask for `want` tokens of bucket `id` under `resolved` at `now`:
    /// the one owner-side path of leases, the peer port's and ringlimit.v1's. `owned`: this
    /// node's ring names it the bucket's owner; otherwise (or for a global rule, decided
    /// wherever checks land) the ask is `not_owner` (the asker's ring is behind or ahead: it
    /// asks again once they agree). A rule with `lease: off` keeps every check at the owner:
    /// refused with what the bucket says.
    pub fn lease_ask(
        &self,
        (resolved, key): (&Resolved, &str),
        id: u64,
        owned: bool,
        (holder, want): (&str, u64),
        now: u64,
    ) -> LeaseGrant {
        let rule = &resolved.rule;
        if resolved.mode == Mode::Global || !owned {
            return LeaseGrant::Error {
                code: "not_owner".to_owned(),
                message: "this node does not own the bucket".to_owned(),
            };
        }
        // A blocked key is not leased: the holder denies its checks itself until the block's
        // end, as it does for a bucket that denies (a shadow rule's checks are not held to
        // blocks).
        let now_ms = now / ringlimit_core::clock::NANOS_PER_MS;
        if !resolved.shadow
            && let Some(hit) = self.blocks().table.find(key, id, now_ms)
        {
            return LeaseGrant::Refused {
                answer: hit.answer(rule.limit, now_ms),
            };
        }
        // A bucket shared across regions is decided on its region's allowance, never on the
        // store: a slice of the store's bucket would be a limit of its own.
        let across_regions = resolved.scope == RegionScope::Regions && self.regions.get().is_some();
        if resolved.lease == LeaseMode::Off || across_regions {
            let peek = self.bucket(id, rule, now).decide(0);
            return LeaseGrant::Refused { answer: peek };
        }
        self.lease(id, rule, (holder, want), now)
    }

    /// Reserves `cost` of bucket `id` under `resolved` here, as its owner, at `now` for
    /// `ttl_ms` under `nonce` (see [`Reservations::reserve`]).
    pub fn reserve(
        &self,
        resolved: &Resolved,
        id: u64,
        (cost, ttl_ms, nonce): (u64, u64, u128),
        now: u64,
    ) -> Result<CheckAnswer, ReserveError> {
        // A shared bucket is decided on its region's allowance: a reservation on the store's
        // bucket would be a limit of its own.
        if resolved.scope == RegionScope::Regions && self.regions.get().is_some() {
            return Err(ReserveError::NotReservable("scope: regions"));
        }
        let mut bucket = self.bucket_of(id, (&resolved.rule, resolved.persist), now);
        self.reservations
            .reserve(&mut bucket, (id, resolved), (cost, ttl_ms, nonce), now)
    }

    /// Settles reservation `nonce` of bucket `id` here at its actual `cost` at `now`: the
    /// bucket's answer afterwards, or [`ReserveError::Unknown`]; what the bucket now owes is
    /// counted with the owned buckets' debts.
    pub fn settle(
        &self,
        resolved: &Resolved,
        id: u64,
        (nonce, cost): (u128, u64),
        now: u64,
    ) -> Result<CheckAnswer, ReserveError> {
        let mut bucket = self.bucket_of(id, (&resolved.rule, resolved.persist), now);
        let (answer, settled) =
            self.reservations
                .settle(&mut bucket, (id, resolved), (nonce, cost), now)?;
        self.owned.debts.count(&settled);
        Ok(answer)
    }

    /// Drops buckets `ids` (an admin reset, here or asked by a peer), their leases with them;
    /// returns how many were held.
    pub fn reset(&self, ids: &[u64]) -> u64 {
        self.leases.forget(ids);
        self.owned.remove(ids)
    }

    /// Merges bucket `id` handed over by its previous owner (or put back after a failed
    /// handover) at `now`: it supersedes this node's copy, and overlaps a bucket promoted from
    /// that copy or recalled (see [`ReplicaCopies::supersede`]); otherwise the two histories
    /// add.
    pub fn take_in(&self, id: u64, state: BucketState, now: u64) {
        let kind = self.kind_unknown();
        if self.copies.supersede(id) {
            self.owned.overlap_as(kind, id, state, now);
        } else {
            self.owned.absorb_as(kind, id, state, now);
        }
    }

    /// Merges bucket `id` as recalled from the member after this node on the ring (its
    /// previous owner or its replica) at `now`: another reading of the history a bucket
    /// decided here meanwhile started from, and that a handover may bring again.
    pub fn recall_in(&self, id: u64, state: BucketState, now: u64) {
        self.copies.recalled(id);
        self.owned.overlap_as(self.kind_unknown(), id, state, now);
    }

    /// Merges bucket `id` as restored from this node's disk at start (see `crate::durable`):
    /// another reading of its history, like a recalled one, so that a peer's handover or
    /// recall of it overlaps instead of adding; durable, as it was when written.
    pub fn restore_in(&self, id: u64, state: BucketState, now: u64) {
        self.copies.recalled(id);
        self.owned.overlap_as(Kind::Durable, id, state, now);
    }

    /// On a ring change: the copies of buckets this node owns under `view` become its buckets
    /// at `now` (merged with a bucket held there already: consumptions add, so the result
    /// spends at least as much as either), and copies it neither owns nor replicates (with
    /// `replicas` replicas) are dropped.
    pub fn promote(&self, view: &View, replicas: usize, now: u64) -> Promoted {
        let ring = &view.ring;
        let me = &*view.self_id;
        // A node that sees no ring (no quorum) owns nothing and drops nothing: it cannot tell.
        if ring.is_empty() {
            return Promoted::default();
        }
        let promoted = self.copies.promote(
            |id, _| ring.owner(id) == Some(me),
            |id, state| self.owned.absorb_as(self.kind_unknown(), id, state, now),
        );
        let dropped = self
            .copies
            .drop_if(|id, _| !ring.replicates(id, replicas, me));
        if promoted + dropped > 0 {
            tracing::info!(promoted, dropped, "replica copies promoted or dropped");
        }
        Promoted { promoted, dropped }
    }
}

/// Deciding here: owned buckets (or their copies, standing in) and global counters.
impl coordinator::Here<Prepared<'_>> for Local {
    /// Decides a prepared check now: an owner check reads the clock as late as it can (see
    /// `Store::check_now`); a global one from the counters (never forwarded, never degraded).
    #[inline]
    fn decide(&self, p: &Prepared<'_>) -> CheckAnswer {
        let rule = &p.resolved.rule;
        match p.resolved.mode {
            Mode::Global => self.global_answer(p, self.now()),
            Mode::Owner => {
                if let Some(a) = self.across_regions(p, || self.now()) {
                    return a;
                }
                let kind = self.kind(rule, p.resolved.persist);
                let a = answer(
                    &self.check_owned(p.id, (rule, kind), p.cost, || self.now()),
                    rule,
                );
                if !a.allowed {
                    self.after_owned(p, &a, self.now());
                }
                a
            }
        }
    }

    /// Decides a prepared check at `now`, a reading of this node's clock. Batches read the
    /// clock once for all their checks: on a VM a clock read (kvm-clock, serialising) nearly
    /// doubles a store check (measured: the docs' benchmarks page, "The store path against
    /// governor"), and one instant for a whole batch is what a batch means.
    #[inline]
    fn decide_at(&self, p: &Prepared<'_>, now: u64) -> CheckAnswer {
        let rule = &p.resolved.rule;
        match p.resolved.mode {
            Mode::Global => self.global_answer(p, now),
            Mode::Owner => {
                if let Some(a) = self.across_regions(p, || now) {
                    return a;
                }
                let kind = self.kind(rule, p.resolved.persist);
                let a = answer(&self.check_owned(p.id, (rule, kind), p.cost, || now), rule);
                self.after_owned(p, &a, now);
                a
            }
        }
    }

    fn hold_at(&self, p: &Prepared<'_>, now: u64) -> (CheckAnswer, Option<Mark>) {
        self.hold_on(Placement::Bucket, p, now)
    }

    fn refund(&self, p: &Prepared<'_>, mark: Mark) {
        self.refund_at(p, mark, self.now());
    }

    fn decide_all(
        &self,
        items: &[&Prepared<'_>],
        now: u64,
    ) -> Vec<Option<(CheckAnswer, Option<Mark>)>> {
        let items: Vec<_> = items.iter().map(|p| Some(*p)).collect();
        self.decide_all_on(&items, now, |_| Placement::Bucket)
    }

    fn peek(&self, p: &Prepared<'_>, now: u64) -> CheckAnswer {
        let d = self.global.peek(p.id, &p.resolved.rule, now, p.cost);
        answer(&d, &p.resolved.rule)
    }

    fn stand_in(&self, p: &Prepared<'_>, now: u64) -> (CheckAnswer, Option<Mark>) {
        self.hold_on(Placement::Copy, p, now)
    }
}

/// One of this node's buckets at one instant (see [`Local::bucket`]).
pub struct OwnedBucket<'a> {
    local: &'a Local,
    id: u64,
    rule: &'a Rule,
    /// Durable or not, as the rule says.
    kind: Kind,
    now: u64,
}

impl OwnedBucket<'_> {
    /// Decides a check of `cost` (0: a read).
    pub fn decide(&self, cost: u64) -> CheckAnswer {
        let d = self
            .local
            .check_owned(self.id, (self.rule, self.kind), cost, || self.now);
        answer(&d, self.rule)
    }

    /// Decides a check of `cost` that may have to give it back: the answer, and the mark of
    /// what it took (`None` when nothing was taken).
    pub fn hold(&self, cost: u64) -> (CheckAnswer, Option<Mark>) {
        let d = self
            .local
            .check_owned(self.id, (self.rule, self.kind), cost, || self.now);
        (answer(&d, self.rule), taken(&d, cost, self.now))
    }

    /// Gives back `cost` taken at the admission marked `mark`.
    pub fn refund(&self, cost: u64, mark: Mark) {
        let l = self.local;
        l.refund_owned(self.id, self.rule, cost, mark, self.now);
    }

    /// Decides a check of `cost` on this bucket's copy, as its owner's replica (see
    /// [`ReplicaCopies::check`]).
    pub fn stand_in(&self, cost: u64) -> CheckAnswer {
        let d = self
            .local
            .check_copy(self.id, (self.rule, self.kind), cost, self.now);
        answer(&d, self.rule)
    }
}

impl ringlimit_core::reservations::Bucket for OwnedBucket<'_> {
    fn decide(&mut self, cost: u64) -> Decision {
        self.local
            .check_owned(self.id, (self.rule, self.kind), cost, || self.now)
    }

    fn refund(&mut self, cost: u64, mark: Mark) {
        OwnedBucket::refund(self, cost, mark);
    }

    fn charge(&mut self, cost: u64) -> u64 {
        let l = self.local;
        let seed = || l.copies.take_for_owner(self.id);
        l.owned
            .charge(self.kind, self.id, self.rule, cost, self.now, seed)
    }
}

#[cfg(test)]
mod tests;
