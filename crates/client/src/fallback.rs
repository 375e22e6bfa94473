//! The local limiter a client answers from when the cluster cannot: the nodes' algorithms and
//! bounded store, over a share of each limit.

use crate::builder::FallbackShare;
use ringlimit_core::answer;
use ringlimit_core::clock::{Clock, NANOS_PER_MS, SystemClock};
use ringlimit_core::limiter::Rule;
use ringlimit_core::rule::share_of;
use ringlimit_core::store::Store;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;

/// What a fallback decision took: enough to give it back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    id: u64,
    share: Rule,
    cost: u64,
    mark: Mark,
}

impl Taken {
    /// The cost taken (a cost above the share's capacity took the whole share).
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

pub(crate) struct Fallback {
    store: Store,
    clock: SystemClock,
    share: FallbackShare,
}

impl Fallback {
    pub fn new(max_keys: u64, share: FallbackShare) -> Self {
        Self {
            store: Store::new(max_keys),
            clock: SystemClock::new(),
            share,
        }
    }

    /// Decides bucket `id` under this client's share of `rule` (the cluster has `alive`
    /// members); the answer reports the whole rule's limit and is marked degraded.
    #[cfg(test)]
    pub fn decide(&self, id: u64, rule: &Rule, cost: u64, alive: usize) -> CheckAnswer {
        self.hold(id, rule, cost, alive).0
    }

    /// [`Fallback::decide`], also saying what it took, for [`Fallback::refund`].
    pub fn hold(
        &self,
        id: u64,
        rule: &Rule,
        cost: u64,
        alive: usize,
    ) -> (CheckAnswer, Option<Taken>) {
        let share = match self.share {
            FallbackShare::PerMember => share_of(rule, alive),
            FallbackShare::Fraction(f) => fraction_of(rule, f),
        };
        let (a, taken) = answer::hold_share(&self.store, id, rule, &share, cost, self.clock.now());
        (
            a,
            taken.map(|(mark, cost)| Taken {
                id,
                share,
                cost,
                mark,
            }),
        )
    }

    /// Gives back what [`Fallback::hold`] took.
    pub fn refund(&self, t: &Taken) {
        self.store
            .refund(t.id, &t.share, t.cost, t.mark, self.clock.now());
    }

    /// A fail-closed rule's answer: denied, degraded.
    pub fn deny(&self, rule: &Rule) -> CheckAnswer {
        answer::closed_answer(rule, self.clock.now())
    }

    /// An answer for a rule the client has never been able to learn (no node reached yet):
    /// admitted, with no limit to report.
    pub fn unknown(&self) -> CheckAnswer {
        CheckAnswer {
            allowed: true,
            limit: 0,
            remaining: 0,
            reset_at_ms: self.clock.now().div_ceil(NANOS_PER_MS),
            retry_after_ms: 0,
            degraded: true,
        }
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.store.len()
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

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::rule;
    use ringlimit_proto::Algorithm;

    fn rule(limit: u64) -> Rule {
        rule::validate(Algorithm::TokenBucket, limit, 60_000 * NANOS_PER_MS, None)
            .expect("valid rule")
    }

    #[test]
    fn per_member_share_admits_the_limit_divided_by_members() {
        let f = Fallback::new(1000, FallbackShare::PerMember);
        let r = rule(10);
        let admitted = (0..20).filter(|_| f.decide(7, &r, 1, 3).allowed).count();
        assert_eq!(
            admitted, 3,
            "10 / 3 rounded down: the shares of 3 members add up to 9"
        );
        let a = f.decide(7, &r, 1, 3);
        assert!(a.degraded && !a.allowed);
        assert_eq!(a.limit, 10, "answers report the whole rule");
    }

    #[test]
    fn fraction_share_is_rounded_up_and_never_zero() {
        assert_eq!(fraction_of(&rule(10), 0.25).limit, 3);
        assert_eq!(fraction_of(&rule(3), 0.01).limit, 1);
        assert_eq!(fraction_of(&rule(10), 1.0).limit, 10);
        let f = Fallback::new(1000, FallbackShare::Fraction(0.5));
        let admitted = (0..20)
            .filter(|_| f.decide(1, &rule(10), 1, 3).allowed)
            .count();
        assert_eq!(admitted, 5);
    }

    #[test]
    fn a_cost_above_the_share_takes_the_whole_share() {
        let f = Fallback::new(1000, FallbackShare::PerMember);
        assert!(f.decide(9, &rule(10), 10, 3).allowed);
        assert!(!f.decide(9, &rule(10), 1, 3).allowed);
    }
}
