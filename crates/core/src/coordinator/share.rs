//! The fallback share as one type: what a member (a node, or an SDK client) admits of a limit
//! alone when the limit's owner cannot answer, over a bucket store handed to it, and what a
//! share decision took ([`ShareTaken`]), enough to give it back.

use crate::answer::{answer, closed_answer, unknown_rule_answer};
use crate::check::Resolved;
use crate::limiter::Rule;
use crate::rule::{OnOwnerUnreachable, share_of};
use crate::store::Store;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;

/// Salt that keeps a key's fallback bucket apart from its owner-mode bucket on the same node.
const FALLBACK_SALT: u64 = 0x6661_6c6c_6261_636b; // "fallback"

/// The identity of the fail-open fallback bucket of bucket `id` (held by any node).
pub fn fallback_id(id: u64) -> u64 {
    id ^ FALLBACK_SALT
}

/// How much of a limit one member's fallback admits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum FallbackShare {
    /// The limit divided by the members last seen alive, as a node's own fallback does
    /// (default): the cluster as a whole stays near the limit when every client falls back.
    #[default]
    PerMember,
    /// A fixed fraction of the limit (`0 < f <= 1`), for services that know how many
    /// instances share a key.
    Fraction(f64),
}

impl FallbackShare {
    /// This policy's share of `rule` among `alive` members.
    pub fn of(self, rule: &Rule, alive: usize) -> Rule {
        match self {
            FallbackShare::PerMember => share_of(rule, alive),
            FallbackShare::Fraction(f) => fraction_of(rule, f),
        }
    }
}

/// `f` of a rule's limit and burst, rounded up (never zero).
fn fraction_of(rule: &Rule, f: f64) -> Rule {
    let scale = |n: u64| ((n as f64 * f).ceil() as u64).clamp(1, n);
    Rule {
        limit: scale(rule.limit),
        burst: scale(rule.burst),
        ..*rule
    }
}

/// What a share decision took: enough to give it back ([`Share::refund`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareTaken {
    /// The share's bucket (salted on a node).
    id: u64,
    share: Rule,
    cost: u64,
    mark: Mark,
}

impl ShareTaken {
    /// The cost taken (a cost above the share's capacity took the whole share).
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

/// A fallback decision, by what the rule asks for when its owner cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Decided from the share (fail-open); what it took, if anything.
    Open(CheckAnswer, Option<ShareTaken>),
    /// Denied: the rule fails closed.
    Closed(CheckAnswer),
    /// Admitted without a limit: the rule was never learnt (an SDK before any node answered).
    Unknown(CheckAnswer),
}

impl Fallback {
    /// The answer and what it took.
    pub fn held(self) -> (CheckAnswer, Option<ShareTaken>) {
        match self {
            Fallback::Open(a, taken) => (a, taken),
            Fallback::Closed(a) | Fallback::Unknown(a) => (a, None),
        }
    }
}

/// A member's fallback share of every limit, kept as buckets of `store`: a node's share
/// buckets live in its engine's store under salted ids, an SDK's in a store of its own.
#[derive(Debug, Clone, Copy)]
pub struct Share<'s> {
    store: &'s Store,
    policy: FallbackShare,
    salted: bool,
}

impl<'s> Share<'s> {
    /// A share over a store of its own (the SDK's): bucket ids as they are.
    pub fn new(store: &'s Store, policy: FallbackShare) -> Self {
        Self {
            store,
            policy,
            salted: false,
        }
    }

    /// A share beside the owner buckets of `store` (a node's): per member, under salted ids
    /// ([`fallback_id`]).
    pub fn salted(store: &'s Store) -> Self {
        Self {
            store,
            policy: FallbackShare::PerMember,
            salted: true,
        }
    }

    /// The fallback answer for bucket `id` of `resolved` (`None`: a rule never learnt) among
    /// `alive` members at `now`: denied for a rule that fails closed, else decided on the share.
    pub fn fall_back(
        &self,
        id: u64,
        resolved: Option<&Resolved>,
        cost: u64,
        alive: usize,
        now: u64,
    ) -> Fallback {
        let Some(resolved) = resolved else {
            return Fallback::Unknown(unknown_rule_answer(now));
        };
        if resolved.on_unreachable == OnOwnerUnreachable::Closed {
            return Fallback::Closed(closed_answer(&resolved.rule, now));
        }
        let (a, taken) = self.hold(id, &resolved.rule, cost, alive, now);
        Fallback::Open(a, taken)
    }

    /// Decides bucket `id` alone on this share of `rule` (a cost above the share's capacity
    /// takes the whole share), answered with the whole rule's limit and marked degraded; also
    /// what it took, for [`Share::refund`].
    pub fn hold(
        &self,
        id: u64,
        rule: &Rule,
        cost: u64,
        alive: usize,
        now: u64,
    ) -> (CheckAnswer, Option<ShareTaken>) {
        let id = if self.salted { fallback_id(id) } else { id };
        let share = self.policy.of(rule, alive);
        let cost = cost.min(share.capacity());
        let d = self.store.check_local(id, &share, now, cost);
        let taken = (d.allowed && cost > 0).then_some(ShareTaken {
            id,
            share,
            cost,
            mark: Mark {
                reset_ns: d.reset_ns,
                at_ns: now,
            },
        });
        let a = CheckAnswer {
            limit: rule.limit,
            degraded: true,
            ..answer(&d, &share)
        };
        (a, taken)
    }

    /// [`Share::hold`] without what it took.
    pub fn decide(&self, id: u64, rule: &Rule, cost: u64, alive: usize, now: u64) -> CheckAnswer {
        self.hold(id, rule, cost, alive, now).0
    }

    /// Gives back what [`Share::hold`] took.
    pub fn refund(&self, t: &ShareTaken, now: u64) {
        self.store.refund(t.id, &t.share, t.cost, t.mark, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NANOS_PER_MS;
    use crate::rule;
    use ringlimit_proto::Algorithm;

    fn rule(limit: u64) -> Rule {
        rule::validate(Algorithm::TokenBucket, limit, 60_000 * NANOS_PER_MS, None)
            .expect("valid rule")
    }

    #[test]
    fn per_member_share_admits_the_limit_divided_by_members() {
        let store = Store::new(1000);
        let s = Share::new(&store, FallbackShare::PerMember);
        let r = rule(10);
        let admitted = (0..20).filter(|_| s.decide(7, &r, 1, 3, 0).allowed).count();
        assert_eq!(
            admitted, 3,
            "10 / 3 rounded down: the shares of 3 members add up to 9"
        );
        let a = s.decide(7, &r, 1, 3, 0);
        assert!(a.degraded && !a.allowed);
        assert_eq!(a.limit, 10, "answers report the whole rule");
    }

    #[test]
    fn fraction_share_is_rounded_up_and_never_zero() {
        assert_eq!(fraction_of(&rule(10), 0.25).limit, 3);
        assert_eq!(fraction_of(&rule(3), 0.01).limit, 1);
        assert_eq!(fraction_of(&rule(10), 1.0).limit, 10);
        let store = Store::new(1000);
        let s = Share::new(&store, FallbackShare::Fraction(0.5));
        let admitted = (0..20)
            .filter(|_| s.decide(1, &rule(10), 1, 3, 0).allowed)
            .count();
        assert_eq!(admitted, 5);
    }

    #[test]
    fn a_cost_above_the_share_takes_the_whole_share() {
        let store = Store::new(1000);
        let s = Share::new(&store, FallbackShare::PerMember);
        assert!(s.decide(9, &rule(10), 10, 3, 0).allowed);
        assert!(!s.decide(9, &rule(10), 1, 3, 0).allowed);
    }

    #[test]
    fn a_salted_share_keeps_apart_from_the_owner_bucket_and_gives_back() {
        let store = Store::new(1000);
        let s = Share::salted(&store);
        let r = rule(10);
        let (a, taken) = s.hold(5, &r, 3, 1, 0);
        assert!(a.allowed && a.degraded);
        assert_eq!(a.remaining, 7);
        assert_eq!(
            store.check(5, &r, 0, 0).remaining,
            10,
            "owner bucket untouched"
        );
        s.refund(&taken.expect("took"), 0);
        assert_eq!(s.decide(5, &r, 0, 1, 0).remaining, 10);
    }
}
