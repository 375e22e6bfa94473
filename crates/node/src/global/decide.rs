//! The global-mode decision: a pure function of the rule, the time, the cost and the
//! cluster-wide totals of the current and previous windows, reusing the window algorithms'
//! own arithmetic so that a global rule answers exactly as the same rule would on one node
//! that had seen every hit.

use ringlimit_core::limiter::{Decision, Rule, fixed_window, sliding_window};
use ringlimit_proto::Algorithm;

/// The rule a global check is decided under: `fixed_window` as it is; every other algorithm as
/// the sliding-window counter over `limit` per `period` (burst ignored), the only estimate that
/// two windowed counts can give (see the module docs of [`crate::global`]).
pub fn effective_rule(rule: &Rule) -> Rule {
    match rule.algorithm {
        Algorithm::FixedWindow => *rule,
        _ => Rule {
            algorithm: Algorithm::SlidingWindow,
            burst: rule.limit,
            ..*rule
        },
    }
}

/// Decides a check of `cost` at `now` (ns since the epoch) given the cluster-wide counts of the
/// window containing `now` (`current`) and of the window before it (`previous`). The caller
/// adds `cost` to its own count when the answer is allowed and `cost > 0`; cost 0 only peeks.
///
/// A cost over the limit can never be admitted (its check is refused when it is made ready, before it gets here).
pub fn decide(rule: &Rule, now: u64, cost: u64, current: u64, previous: u64) -> Decision {
    let rule = effective_rule(rule);
    let p = rule.period_ns;
    // The window's end: a calendar's, or the period's from the epoch.
    let end = fixed_window::window_end(&rule, now);
    if cost > rule.limit {
        return Decision {
            allowed: false,
            remaining: 0,
            reset_ns: end,
            retry_after_ns: u64::MAX,
        };
    }
    // The algorithms keep counts in u32 (limits are at most 10^9); a merged total above that is
    // far over any limit anyway.
    let sat = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    match rule.algorithm {
        Algorithm::FixedWindow => {
            let (mut e, mut count) = (end, sat(current));
            fixed_window::decide(&mut e, &mut count, &rule, now, cost)
        }
        _ => {
            let (mut until, mut cur, mut prev) = (end + p, sat(current), sat(previous));
            let mut tag = sliding_window::period_tag(&rule);
            sliding_window::decide(&mut until, &mut cur, &mut prev, &mut tag, &rule, now, cost)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::limiter::test_support::{MS, SEC, rule};

    /// A window start (aligned to 20 s).
    const W0: u64 = 1_700_000_000 * SEC;

    #[test]
    fn fixed_window_admits_up_to_the_limit_across_nodes() {
        let r = rule(Algorithm::FixedWindow, 300, 20_000, 300);
        let now = W0 + 5 * SEC;
        let d = decide(&r, now, 1, 299, 1_000);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_ns, W0 + 20 * SEC);
        let d = decide(&r, now, 1, 300, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, 15 * SEC);
        // The previous window does not matter for a fixed window.
        assert!(decide(&r, now, 10, 0, 300).allowed);
        // Over-admitted elsewhere: still a clean denial, remaining 0.
        let d = decide(&r, now, 1, 450, 0);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let r = rule(Algorithm::SlidingWindow, 100, 10_000, 100);
        // A quarter into the window: previous counts 75%.
        let now = W0 + 2_500 * MS;
        assert!(decide(&r, now, 1, 24, 100).allowed); // 75 + 24 + 1 = 100
        let d = decide(&r, now, 1, 25, 100);
        assert!(!d.allowed); // 75 + 25 + 1 > 100
        // Retry once the previous window's weight has dropped by one: at 0.26 in, 74 + 25 + 1.
        assert_eq!(d.retry_after_ns, 100 * MS);
        assert!(decide(&r, now + d.retry_after_ns, 1, 25, 100).allowed);
    }

    #[test]
    fn other_algorithms_are_the_sliding_window_over_limit_per_period() {
        let now = W0 + 5 * SEC;
        for alg in [
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
            Algorithm::SlidingLog,
        ] {
            // A burst of 500 is ignored: the limit is 100 per 10 s.
            let r = rule(alg, 100, 10_000, 500);
            let sliding = rule(Algorithm::SlidingWindow, 100, 10_000, 100);
            for (cur, prev) in [(0, 0), (40, 100), (50, 100), (99, 0), (100, 0)] {
                assert_eq!(
                    decide(&r, now, 1, cur, prev),
                    decide(&sliding, now, 1, cur, prev),
                    "{alg} {cur} {prev}"
                );
            }
        }
    }

    #[test]
    fn cost_zero_peeks_and_cost_over_the_limit_never_fits() {
        let r = rule(Algorithm::FixedWindow, 10, 1_000, 10);
        let now = W0;
        assert!(decide(&r, now, 0, 9, 0).allowed);
        let d = decide(&r, now, 0, 10, 0);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        let d = decide(&r, now, 11, 0, 0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, u64::MAX);
    }

    #[test]
    fn counts_beyond_u32_saturate() {
        let r = rule(Algorithm::SlidingWindow, 1_000, 1_000, 1_000);
        let d = decide(&r, W0 + 500 * MS, 1, u64::MAX, u64::MAX);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
    }
}
