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
//!
//! # Layout
//! - this module — [`Engine`]: rules in force, the clock, and [`Prepared`] checks.
//! - [`owned`] — this node's buckets: the store, its change feed, handover in and out.
//! - [`copies`] — other owners' buckets kept as their replica; standing in; [`promote`].
//! - [`leases`] — slices granted (owner) and held (holder), and their metrics.
//! - [`reservations`] — reservations and debts at the owner, their sweep and metrics.

use crate::rules::{NamedRule, RuleSet, RuleSpec};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::clock::Clock;
use ringlimit_core::lease::{Grants, Held, LeaseSettings};
use ringlimit_core::limiter::Decision;
use ringlimit_core::reserve::{self, Table};
use ringlimit_core::store::Store;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

pub mod copies;
pub mod leases;
pub mod owned;
pub mod promote;
pub mod reservations;

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
}

/// The mark of what an admission of `cost` at `now` took (`None`: it took nothing).
fn taken(d: &Decision, cost: u64, now: u64) -> Option<Mark> {
    (d.allowed && cost > 0).then_some(Mark {
        reset_ns: d.reset_ns,
        at_ns: now,
    })
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
    use ringlimit_core::limiter::{BucketState, Rule};
    use ringlimit_core::reserve::Tenant;
    use ringlimit_core::store::Cursor;
    use ringlimit_proto::peer::LeaseGrant;
    use std::sync::atomic::Ordering;

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
