//! The local limiter a client answers from when the cluster cannot: the nodes' algorithms and
//! bounded store, over a share of each limit (core's [`Share`]).

use crate::builder::FallbackShare;
use ringlimit_core::clock::{Clock, SystemClock};
use ringlimit_core::coordinator::Share;
use ringlimit_core::store::Store;

pub(crate) struct Fallback {
    store: Store,
    clock: SystemClock,
    policy: FallbackShare,
}

impl Fallback {
    pub fn new(max_keys: u64, policy: FallbackShare) -> Self {
        Self {
            store: Store::new(max_keys),
            clock: SystemClock::new(),
            policy,
        }
    }

    /// This client's share of every limit, over its own store.
    pub fn share(&self) -> Share<'_> {
        Share::new(&self.store, self.policy)
    }

    /// Now, on the fallback's clock.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.store.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::check::Resolved;
    use ringlimit_core::coordinator::Fallback as Decided;
    use ringlimit_proto::{Algorithm, InlineRule};

    fn inline(limit: u64) -> Resolved {
        Resolved::inline(&InlineRule {
            limit,
            period_ms: 3_600_000,
            algorithm: Algorithm::TokenBucket,
            burst: None,
            calendar: None,
        })
        .expect("valid")
    }

    /// Admissions of bucket `id` under `rule` among `alive` members, of 100 tries.
    fn admitted(f: &Fallback, id: u64, rule: &Resolved, alive: usize) -> usize {
        let now = f.now();
        (0..100)
            .filter(|_| {
                let (a, _) = f.share().fall_back(id, Some(rule), 1, alive, now).held();
                assert!(a.degraded, "{a:?}");
                assert_eq!(a.limit, rule.rule.limit, "answered with the whole limit");
                a.allowed
            })
            .count()
    }

    #[test]
    fn per_member_the_limit_is_divided_among_the_members_alive() {
        let f = Fallback::new(1_000, FallbackShare::PerMember);
        let rule = inline(12);
        assert_eq!(admitted(&f, 1, &rule, 1), 12);
        assert_eq!(admitted(&f, 2, &rule, 3), 4);
        assert_eq!(admitted(&f, 3, &rule, 100), 1, "never less than one");
    }

    #[test]
    fn a_fraction_is_that_fraction_of_the_limit_rounded_up() {
        let f = Fallback::new(1_000, FallbackShare::Fraction(0.25));
        let rule = inline(10);
        assert_eq!(admitted(&f, 1, &rule, 1), 3);
        // Whatever the members: the service said how many instances share a key.
        assert_eq!(admitted(&f, 2, &rule, 5), 3);
    }

    #[test]
    fn a_rule_never_learnt_is_admitted_and_a_closed_one_denied() {
        let f = Fallback::new(1_000, FallbackShare::PerMember);
        let unknown = f.share().fall_back(7, None, 1, 1, f.now());
        assert!(
            matches!(unknown, Decided::Unknown(a) if a.allowed && a.degraded && a.limit == 0),
            "{unknown:?}"
        );
        let mut closed = inline(10);
        closed.on_unreachable = ringlimit_core::rule::OnOwnerUnreachable::Closed;
        let decided = f.share().fall_back(7, Some(&closed), 1, 1, f.now());
        assert!(
            matches!(decided, Decided::Closed(a) if !a.allowed),
            "{decided:?}"
        );
        assert_eq!(f.len(), 0, "neither holds a bucket");
    }

    #[test]
    fn what_a_share_took_is_given_back_and_its_buckets_are_bounded() {
        let f = Fallback::new(2, FallbackShare::PerMember);
        let rule = inline(1);
        let (a, taken) = f.share().fall_back(1, Some(&rule), 1, 1, f.now()).held();
        assert!(a.allowed);
        let taken = taken.expect("the cost taken");
        assert_eq!(taken.cost(), 1);
        assert!(
            !f.share()
                .fall_back(1, Some(&rule), 1, 1, f.now())
                .held()
                .0
                .allowed
        );
        f.share().refund(&taken, f.now());
        assert!(
            f.share()
                .fall_back(1, Some(&rule), 1, 1, f.now())
                .held()
                .0
                .allowed
        );
        for id in 2..10 {
            f.share().fall_back(id, Some(&rule), 1, 1, f.now());
        }
        assert!(f.len() <= 2, "{} buckets held of at most 2", f.len());
    }
}
