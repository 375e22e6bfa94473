//! The coordinator's contract, run for both kinds of caller: a node (it decides some checks
//! here and keeps its share beside its buckets) and an SDK client (never here; a share of its
//! own). Owners are fakes with stores of their own; time stands still (instant 0).

use super::*;
use crate::check::Resolved;
use crate::limiter::Rule;
use crate::store::Store;
use ringlimit_proto::peer::{PeerAnswer, PeerCheck, PeerRefund};
use ringlimit_proto::{Algorithm, InlineRule, RuleRef};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const NOW: u64 = 0;

/// A check: its key says where it belongs (`a:`/`b:` at owner a or b, `here:` here when the
/// caller decides anything here, else at owner a).
struct Check {
    key: String,
    rule: InlineRule,
    cost: u64,
    resolved: Resolved,
    id: u64,
}

fn limit(n: u64) -> InlineRule {
    InlineRule {
        limit: n,
        period_ms: 60_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    }
}

fn item(key: &str, rule: InlineRule, cost: u64) -> Check {
    let resolved = Resolved::inline(&rule).expect("valid rule");
    let id = resolved.bucket(key, cost).expect("valid key");
    Check {
        key: key.to_owned(),
        rule,
        cost,
        resolved,
        id,
    }
}

/// A shadow check by the caller's own setting: the owner does not know it is one.
fn shadow(mut c: Check) -> Check {
    c.resolved.shadow = true;
    c
}

impl Item for Check {
    fn id(&self) -> u64 {
        self.id
    }
    fn cost(&self) -> u64 {
        self.cost
    }
    fn resolved(&self) -> Option<&Resolved> {
        Some(&self.resolved)
    }
    fn peer_check(&self) -> PeerCheck {
        PeerCheck {
            key: self.key.clone(),
            rule: RuleRef::Inline(self.rule),
            cost: self.cost,
        }
    }
    fn peer_refund(&self, mark: Mark) -> PeerRefund {
        PeerRefund {
            key: self.key.clone(),
            rule: RuleRef::Inline(self.rule),
            cost: self.cost,
            mark,
        }
    }
}

/// An owner: its buckets, and how its link fails.
struct Owner {
    store: Store,
    unreachable: AtomicBool,
    loses_refunds: AtomicBool,
    groups: AtomicU64,
}

impl Default for Owner {
    fn default() -> Self {
        Self {
            store: Store::new(1000),
            unreachable: AtomicBool::new(false),
            loses_refunds: AtomicBool::new(false),
            groups: AtomicU64::new(0),
        }
    }
}

impl Owner {
    fn bucket(c: &PeerCheck) -> (u64, Rule) {
        let RuleRef::Inline(rule) = &c.rule else {
            unreachable!("the suite checks inline rules")
        };
        let r = Resolved::inline(rule).expect("valid rule");
        (r.bucket(&c.key, c.cost).expect("valid key"), r.rule)
    }

    /// What a check's bucket has left.
    fn remaining(&self, c: &Check) -> u64 {
        self.store.check(c.id, &c.resolved.rule, NOW, 0).remaining
    }
}

fn answered(d: &crate::limiter::Decision, rule: &Rule) -> CheckAnswer {
    crate::answer::answer(d, rule)
}

#[derive(Clone)]
struct Link(&'static str, Arc<Owner>);

impl OwnerLink for Link {
    fn addr(&self) -> &str {
        self.0
    }

    async fn send(&self, checks: Vec<PeerCheck>) -> Result<Vec<PeerAnswer>, ForwardError> {
        if self.1.unreachable.load(Ordering::Relaxed) {
            return Err(ForwardError::Lost);
        }
        self.1.groups.fetch_add(1, Ordering::Relaxed);
        Ok(checks
            .iter()
            .map(|c| {
                let (id, rule) = Owner::bucket(c);
                PeerAnswer::Answer(answered(&self.1.store.check(id, &rule, NOW, c.cost), &rule))
            })
            .collect())
    }

    /// All-or-nothing as an owner does it: held when the group admits, given back otherwise.
    async fn send_all(&self, checks: Vec<PeerCheck>) -> Result<Vec<PeerAnswer>, ForwardError> {
        if self.1.unreachable.load(Ordering::Relaxed) {
            return Err(ForwardError::Lost);
        }
        self.1.groups.fetch_add(1, Ordering::Relaxed);
        let held: Vec<_> = checks
            .iter()
            .map(|c| {
                let (id, rule) = Owner::bucket(c);
                let d = self.1.store.check(id, &rule, NOW, c.cost);
                let mark = d.allowed.then_some(Mark {
                    reset_ns: d.reset_ns,
                    at_ns: NOW,
                });
                (id, rule, c.cost, answered(&d, &rule), mark)
            })
            .collect();
        let denied = held.iter().any(|h| !h.3.allowed);
        Ok(held
            .into_iter()
            .map(|(id, rule, cost, answer, mark)| match mark {
                Some(mark) if denied => {
                    self.1.store.refund(id, &rule, cost, mark, NOW);
                    PeerAnswer::Answer(crate::answer::given_back(answer, cost))
                }
                Some(mark) => PeerAnswer::Held { answer, mark },
                None => PeerAnswer::Answer(answer),
            })
            .collect())
    }

    /// A replica decides on its copies as an owner does on its buckets.
    async fn send_replica(
        &self,
        checks: Vec<PeerCheck>,
        all: bool,
    ) -> Result<Vec<PeerAnswer>, ForwardError> {
        match all {
            true => self.send_all(checks).await,
            false => self.send(checks).await,
        }
    }

    async fn refund(&self, refunds: Vec<PeerRefund>) -> Result<Vec<PeerAnswer>, ForwardError> {
        if self.1.loses_refunds.load(Ordering::Relaxed) {
            return Err(ForwardError::Lost);
        }
        Ok(refunds
            .iter()
            .map(|r| {
                let c = PeerCheck {
                    key: r.key.clone(),
                    rule: r.rule.clone(),
                    cost: r.cost,
                };
                let (id, rule) = Owner::bucket(&c);
                self.1.store.refund(id, &rule, r.cost, r.mark, NOW);
                PeerAnswer::Refunded
            })
            .collect())
    }
}

/// A node's own buckets.
struct Buckets(Store);

/// What a bucket decided here has left.
trait Remaining {
    fn remaining(&self, c: &Check) -> u64;
}

impl Remaining for &Buckets {
    fn remaining(&self, c: &Check) -> u64 {
        self.0.check(c.id, &c.resolved.rule, NOW, 0).remaining
    }
}

impl Remaining for Nowhere {
    fn remaining(&self, _: &Check) -> u64 {
        match *self {}
    }
}

impl Here<Check> for Buckets {
    fn decide(&self, c: &Check) -> CheckAnswer {
        self.decide_at(c, NOW)
    }
    fn decide_at(&self, c: &Check, now: u64) -> CheckAnswer {
        answered(
            &self.0.check(c.id, &c.resolved.rule, now, c.cost),
            &c.resolved.rule,
        )
    }
    fn hold_at(&self, c: &Check, now: u64) -> (CheckAnswer, Option<Mark>) {
        let d = self.0.check(c.id, &c.resolved.rule, now, c.cost);
        let mark = d.allowed.then_some(Mark {
            reset_ns: d.reset_ns,
            at_ns: now,
        });
        (answered(&d, &c.resolved.rule), mark)
    }
    fn refund(&self, c: &Check, mark: Mark) {
        self.0.refund(c.id, &c.resolved.rule, c.cost, mark, NOW);
    }
    fn decide_all(&self, items: &[&Check], now: u64) -> Vec<Option<(CheckAnswer, Option<Mark>)>> {
        let mut out: Vec<_> = items.iter().map(|c| self.hold_at(c, now)).collect();
        if out
            .iter()
            .zip(items)
            .any(|(a, c)| !a.0.allowed && !c.shadow())
        {
            for ((a, mark), c) in out.iter_mut().zip(items) {
                if let Some(m) = mark.take() {
                    self.refund(c, m);
                    *a = crate::answer::given_back(*a, c.cost);
                }
            }
        }
        out.into_iter().map(Some).collect()
    }
    fn peek(&self, c: &Check, now: u64) -> CheckAnswer {
        answered(
            &self.0.check(c.id, &c.resolved.rule, now, 0),
            &c.resolved.rule,
        )
    }
    /// This fake keeps its copies among its buckets.
    fn stand_in(&self, c: &Check, now: u64) -> (CheckAnswer, Option<Mark>) {
        self.hold_at(c, now)
    }
}

/// A caller: a node when `here` is some (its share beside its buckets), else an SDK client.
struct Caller<H> {
    here: Option<H>,
    share_store: Store,
    salted: bool,
    a: Arc<Owner>,
    b: Arc<Owner>,
    /// Sees no majority (a node) or no member (a client): every check falls back.
    alone: bool,
    alive: usize,
    /// Who stands in for owner a when it does not answer.
    standby: Standing,
    rescued: AtomicU64,
    forwarded: AtomicU64,
    fell_back: AtomicU64,
    gave_back: AtomicU64,
    lost: AtomicU64,
}

impl<H> Caller<H> {
    fn new(here: Option<H>, salted: bool) -> Self {
        Self {
            here,
            share_store: Store::new(1000),
            salted,
            a: Arc::default(),
            b: Arc::default(),
            alone: false,
            alive: 2,
            standby: Standing::Nobody,
            rescued: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            fell_back: AtomicU64::new(0),
            gave_back: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        }
    }

    fn share(&self) -> Share<'_> {
        if self.salted {
            Share::salted(&self.share_store)
        } else {
            Share::new(&self.share_store, FallbackShare::PerMember)
        }
    }
}

/// Who stands in for owner a.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Standing {
    Nobody,
    /// Owner b, on its copies (kept among its buckets here).
    B,
    /// The caller itself (a node).
    Here,
}

fn standby<H: Copy, X>(caller: &Caller<X>, c: &Check, here: Option<H>) -> Option<Standby<Link, H>> {
    if c.key.starts_with("b:") {
        return None;
    }
    match caller.standby {
        Standing::Nobody => None,
        Standing::B => Some(Standby::Member(Arc::from("b"), Link("b", caller.b.clone()))),
        Standing::Here => here.map(Standby::Here),
    }
}

impl<'h> Site<Check> for Caller<&'h Buckets> {
    type Link = Link;
    type Here = &'h Buckets;
    fn route(&self, c: &Check) -> Route<Link, &'h Buckets> {
        route(self, c, self.here)
    }
    fn now(&self) -> u64 {
        NOW
    }
    fn fall_back(
        &self,
        c: &Check,
        _: FallbackCause,
    ) -> Result<(CheckAnswer, Option<ShareTaken>), CheckError> {
        fall_back(self, c)
    }
    fn refund_share(&self, t: &ShareTaken) {
        self.share().refund(t, NOW);
    }
    fn replica(&self, c: &Check) -> Option<Standby<Link, &'h Buckets>> {
        standby(self, c, self.here)
    }
    fn replica_answered(&self) {
        self.rescued.fetch_add(1, Ordering::Relaxed);
    }
    fn forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }
    fn gave_back(&self, lost: u64) {
        self.gave_back.fetch_add(1, Ordering::Relaxed);
        self.lost.fetch_add(lost, Ordering::Relaxed);
    }
}

impl Site<Check> for Caller<Nowhere> {
    type Link = Link;
    type Here = Nowhere;
    fn route(&self, c: &Check) -> Route<Link, Nowhere> {
        route(self, c, None)
    }
    fn now(&self) -> u64 {
        NOW
    }
    fn fall_back(
        &self,
        c: &Check,
        _: FallbackCause,
    ) -> Result<(CheckAnswer, Option<ShareTaken>), CheckError> {
        fall_back(self, c)
    }
    fn refund_share(&self, t: &ShareTaken) {
        self.share().refund(t, NOW);
    }
    fn replica(&self, c: &Check) -> Option<Standby<Link, Nowhere>> {
        standby(self, c, None)
    }
    fn replica_answered(&self) {
        self.rescued.fetch_add(1, Ordering::Relaxed);
    }
    fn forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }
    fn gave_back(&self, lost: u64) {
        self.gave_back.fetch_add(1, Ordering::Relaxed);
        self.lost.fetch_add(lost, Ordering::Relaxed);
    }
}

fn route<H: Copy, X>(caller: &Caller<X>, c: &Check, here: Option<H>) -> Route<Link, H> {
    let mine = c.key.starts_with("here:");
    if caller.alone {
        return Route::Share {
            own: here.filter(|_| mine),
        };
    }
    match here {
        Some(h) if mine => Route::Here(h),
        _ if c.key.starts_with("b:") => Route::Owner(Arc::from("b"), Link("b", caller.b.clone())),
        _ => Route::Owner(Arc::from("a"), Link("a", caller.a.clone())),
    }
}

fn fall_back<X>(
    caller: &Caller<X>,
    c: &Check,
) -> Result<(CheckAnswer, Option<ShareTaken>), CheckError> {
    caller.fell_back.fetch_add(1, Ordering::Relaxed);
    let f = caller
        .share()
        .fall_back(c.id, c.resolved(), c.cost, caller.alive, NOW);
    Ok(f.held())
}

/// Runs a scenario for a node (deciding `here:` keys itself) and for an SDK client.
macro_rules! for_node_and_sdk {
    ($name:ident, |$caller:ident| $body:block) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn node() {
                let buckets = Buckets(Store::new(1000));
                let $caller = Caller::new(Some(&buckets), true);
                $body
            }

            #[tokio::test]
            async fn sdk() {
                let $caller = Caller::<Nowhere>::new(None, false);
                $body
            }
        }
    };
}

fn allowed(r: &Result<CheckAnswer, CheckError>) -> bool {
    r.as_ref().is_ok_and(|a| a.allowed)
}

for_node_and_sdk!(an_all_or_nothing_denial_gives_back_everywhere, |caller| {
    let roomy = item("a:roomy", limit(10), 3);
    let mine = item("here:mine", limit(10), 2);
    let tight = item("b:tight", limit(1), 1);
    assert!(allowed(
        &check(&caller, &item("b:tight", limit(1), 1)).await
    ));
    let answers = check_all(&caller, &[roomy, mine, tight]).await;
    assert!(allowed(&answers[0]) && allowed(&answers[1]) && !allowed(&answers[2]));
    let (roomy, mine) = (
        item("a:roomy", limit(10), 3),
        item("here:mine", limit(10), 2),
    );
    assert_eq!(caller.a.remaining(&roomy), 10, "the owner gave back");
    assert_eq!(answers[0].as_ref().map(|a| a.remaining), Ok(10));
    let where_mine = match &caller.here {
        Some(h) => h.remaining(&mine),
        None => caller.a.remaining(&mine),
    };
    assert_eq!(where_mine, 10, "given back here too");
    assert_eq!(caller.gave_back.load(Ordering::Relaxed), 1);
    assert_eq!(caller.lost.load(Ordering::Relaxed), 0);
});

for_node_and_sdk!(an_unreachable_owner_falls_back_to_the_share, |caller| {
    caller.a.unreachable.store(true, Ordering::Relaxed);
    let mut admitted = 0;
    for _ in 0..10 {
        let a = check(&caller, &item("a:k", limit(10), 1))
            .await
            .expect("answered");
        assert!(a.degraded && a.limit == 10);
        admitted += usize::from(a.allowed);
    }
    assert_eq!(admitted, 5, "10 shared among 2 alive members");
    assert_eq!(caller.fell_back.load(Ordering::Relaxed), 10);
    // All-or-nothing: the share's cost is given back when another owner denies.
    let tight = item("b:tight", limit(1), 1);
    assert!(allowed(&check(&caller, &tight).await));
    let other = item("a:other", limit(10), 2);
    let answers = check_all(&caller, &[other, tight]).await;
    assert!(
        answers[0]
            .as_ref()
            .is_ok_and(|a| a.degraded && a.remaining == 5)
    );
    let again = check(&caller, &item("a:other", limit(10), 0)).await;
    assert_eq!(again.map(|a| a.remaining), Ok(5), "the share took nothing");
});

for_node_and_sdk!(
    an_unreachable_owner_s_replica_decides_on_its_copy_before_any_share,
    |caller| {
        let mut caller = caller;
        caller.standby = Standing::B;
        caller.a.unreachable.store(true, Ordering::Relaxed);
        // The copy at b: 8 of 10 spent at a before it stopped answering.
        let k = item("a:k", limit(10), 1);
        caller.b.store.check(k.id, &k.resolved.rule, NOW, 8);
        let mut admitted = 0;
        for _ in 0..5 {
            let a = check(&caller, &item("a:k", limit(10), 1))
                .await
                .expect("answered");
            assert!(a.replica && !a.degraded, "decided by the replica");
            admitted += usize::from(a.allowed);
        }
        assert_eq!(admitted, 2, "what the copy had left, not a share");
        assert_eq!(caller.fell_back.load(Ordering::Relaxed), 0);
        assert_eq!(caller.rescued.load(Ordering::Relaxed), 5);
        // Many: the failed group goes to the replica in one group.
        let items = [item("a:m1", limit(10), 4), item("a:m2", limit(10), 3)];
        let mut many = Batch::new(2, NOW);
        many.add(&caller, &items[0]);
        many.add(&caller, &items[1]);
        let answers = many.finish(&caller, &items).await;
        assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|a| a.replica)));
        assert_eq!(caller.b.remaining(&items[0]), 6);
        // All-or-nothing: held at the replica, refunded there when another check denies.
        let tight = item("b:tight", limit(1), 1);
        assert!(allowed(&check(&caller, &tight).await));
        let answers = check_all(&caller, &[item("a:held", limit(10), 3), tight]).await;
        assert!(answers[0].as_ref().is_ok_and(|a| a.replica));
        assert!(!allowed(&answers[1]));
        assert_eq!(
            caller.b.remaining(&item("a:held", limit(10), 3)),
            10,
            "given back on the copy"
        );
        // No replica: the share, as before.
        caller.standby = Standing::Nobody;
        let a = check(&caller, &item("a:k", limit(10), 1)).await;
        assert!(a.is_ok_and(|a| a.degraded && !a.replica));
    }
);

#[tokio::test]
async fn a_node_that_is_the_replica_stands_in_itself() {
    let buckets = Buckets(Store::new(1000));
    let mut caller = Caller::new(Some(&buckets), true);
    caller.standby = Standing::Here;
    caller.a.unreachable.store(true, Ordering::Relaxed);
    let k = item("a:k", limit(3), 1);
    buckets.0.check(k.id, &k.resolved.rule, NOW, 2);
    let first = check(&caller, &k).await.expect("answered");
    assert!(first.allowed && first.replica && first.remaining == 0);
    assert!(!check(&caller, &k).await.expect("answered").allowed);
    // Held here on the copy, and given back here.
    let tight = item("b:tight", limit(1), 1);
    assert!(allowed(&check(&caller, &tight).await));
    let held = item("a:held", limit(10), 4);
    let answers = check_all(&caller, &[held, tight]).await;
    assert!(answers[0].as_ref().is_ok_and(|a| a.replica));
    let held = item("a:held", limit(10), 4);
    assert_eq!((&buckets).remaining(&held), 10, "given back on the copy");
    assert_eq!(caller.fell_back.load(Ordering::Relaxed), 0);
}

for_node_and_sdk!(a_lost_refund_is_counted, |caller| {
    let tight = item("b:tight", limit(1), 1);
    assert!(allowed(&check(&caller, &tight).await));
    caller.a.loses_refunds.store(true, Ordering::Relaxed);
    let one = item("a:one", limit(10), 1);
    let two = item("a:two", limit(10), 1);
    let answers = check_all(&caller, &[one, two, tight]).await;
    assert!(!allowed(&answers[2]));
    assert_eq!(
        caller.lost.load(Ordering::Relaxed),
        2,
        "both a's refunds were lost"
    );
    assert_eq!(
        caller.a.remaining(&item("a:one", limit(10), 1)),
        9,
        "its cost stays taken"
    );
});

for_node_and_sdk!(
    a_shadow_check_neither_denies_nor_gives_back_the_others,
    |caller| {
        let full = item("a:full", limit(1), 1);
        assert!(allowed(&check(&caller, &full).await));
        let enforced = item("a:enforced", limit(10), 1);
        let answers = check_all(&caller, &[enforced, shadow(full)]).await;
        assert!(allowed(&answers[0]));
        assert!(
            !allowed(&answers[1]),
            "the shadow check's own answer is reported"
        );
        assert_eq!(
            caller.a.remaining(&item("a:enforced", limit(10), 1)),
            9,
            "its own group: the owner did not give the enforced check back"
        );
        assert_eq!(caller.gave_back.load(Ordering::Relaxed), 0);
    }
);

for_node_and_sdk!(check_many_keeps_order_and_groups_per_owner, |caller| {
    caller.b.unreachable.store(true, Ordering::Relaxed);
    let items = [
        item("a:1", limit(10), 1),
        item("b:2", limit(10), 3),
        item("here:3", limit(10), 2),
        item("a:4", limit(10), 4),
    ];
    let mut many = Batch::new(items.len() + 1, NOW);
    many.add(&caller, &items[0]);
    many.add(&caller, &items[1]);
    many.add_error(CheckError::Unavailable("not ready"));
    many.add(&caller, &items[2]);
    many.add(&caller, &items[3]);
    let answers = many.finish(&caller, &items).await;
    let remaining: Vec<_> = answers
        .iter()
        .map(|r| r.clone().map(|a| a.remaining))
        .collect();
    assert_eq!(
        remaining,
        vec![
            Ok(9),
            Ok(2),
            Err(CheckError::Unavailable("not ready")),
            Ok(8),
            Ok(6)
        ],
        "b's share is 5 of 10"
    );
    assert!(answers[1].as_ref().is_ok_and(|a| a.degraded));
    let sent = caller.a.groups.load(Ordering::Relaxed);
    assert_eq!(sent, 1, "one group for owner a");
});

#[tokio::test]
async fn a_node_without_a_majority_admits_its_own_key_only_when_its_bucket_and_share_both_do() {
    let buckets = Buckets(Store::new(1000));
    let mut caller = Caller::new(Some(&buckets), true);
    let mine = item("here:mine", limit(10), 1);
    // Spent before the partition: 9 of 10 in the exact bucket.
    buckets.0.check(mine.id, &mine.resolved.rule, NOW, 9);
    caller.alone = true;
    let first = check(&caller, &mine).await.expect("answered");
    assert!(first.allowed && first.degraded && first.remaining == 0);
    let second = check(&caller, &mine).await.expect("answered");
    assert!(
        !second.allowed && second.degraded,
        "the exact bucket is spent"
    );
    // The share gave back what the denied check took from it: 4 of its 5 left.
    let share = Share::salted(&caller.share_store);
    assert_eq!(
        share
            .decide(mine.id, &mine.resolved.rule, 0, 2, NOW)
            .remaining,
        4
    );
    // All-or-nothing: held in both, given back in both.
    let other = item("here:other", limit(10), 2);
    let tight = item("here:tight", limit(1), 1);
    buckets.0.check(tight.id, &tight.resolved.rule, NOW, 1);
    let answers = check_all(&caller, &[other, tight]).await;
    assert!(!allowed(&answers[1]));
    let other = item("here:other", limit(10), 2);
    assert_eq!(
        buckets
            .0
            .check(other.id, &other.resolved.rule, NOW, 0)
            .remaining,
        10
    );
    assert_eq!(
        share
            .decide(other.id, &other.resolved.rule, 0, 2, NOW)
            .remaining,
        5
    );
}
