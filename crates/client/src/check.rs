//! What a service asks ([`Check`]) and the only ways that can go wrong for it ([`ClientError`]).

use ringlimit_proto::calendar::{Calendar, Unit, UnknownZone, Zone};
use ringlimit_proto::{Algorithm, InlineRule, RuleRef};
use std::time::Duration;

/// One check: may `key` spend `cost` under `rule` now?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The client identity (user id, IP, API key...), 1 to 512 bytes.
    pub key: String,
    /// A rule configured on the cluster, or one given inline.
    pub rule: RuleRef,
    /// Tokens to take (default 1); 0 reads the state without consuming.
    pub cost: u64,
}

impl Check {
    /// A check under a rule of the cluster's rules file.
    pub fn named(rule: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            rule: RuleRef::Named(rule.into()),
            cost: 1,
        }
    }

    /// A check under an inline token bucket of `limit` per `period` (change the algorithm
    /// with [`Check::algorithm`]). A period is whole milliseconds; finer parts are dropped.
    pub fn inline(key: impl Into<String>, limit: u64, period: Duration) -> Self {
        Self {
            key: key.into(),
            rule: RuleRef::Inline(InlineRule {
                limit,
                period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
                algorithm: Algorithm::TokenBucket,
                burst: None,
                calendar: None,
            }),
            cost: 1,
        }
    }

    /// A check under an inline fixed window of `limit` per calendar `unit` (a local day, a
    /// week from Monday, a month from the first) in the IANA time zone `timezone`.
    pub fn calendar(
        key: impl Into<String>,
        limit: u64,
        unit: Unit,
        timezone: &str,
    ) -> Result<Self, UnknownZone> {
        let zone = Zone::parse(timezone)?;
        Ok(Self {
            key: key.into(),
            rule: RuleRef::Inline(InlineRule {
                limit,
                period_ms: unit.nominal_ns() / 1_000_000,
                algorithm: Algorithm::FixedWindow,
                burst: None,
                calendar: Some(Calendar { unit, zone }),
            }),
            cost: 1,
        })
    }

    /// Tokens this check takes.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The algorithm of an inline rule (a named rule's algorithm is the cluster's).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        if let RuleRef::Inline(r) = &mut self.rule {
            r.algorithm = algorithm;
        }
        self
    }

    /// The capacity of an inline token or leaky bucket.
    pub fn burst(mut self, burst: u64) -> Self {
        if let RuleRef::Inline(r) = &mut self.rule {
            r.burst = Some(burst);
        }
        self
    }
}

/// Why a check has no answer: the nodes' own [`CheckError`](ringlimit_core::check::CheckError). Every variant but
/// [`ClientError::Unavailable`] is a mistake in the check itself; transport trouble becomes a
/// degraded answer, never an error, unless the client was built with
/// [`crate::FailMode::Closed`].
pub use ringlimit_core::check::CheckError as ClientError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_check_costs_one_and_keeps_its_rule_whatever_inline_options_say() {
        let c = Check::named("free-tier", "user:1");
        assert_eq!(c.rule, RuleRef::Named("free-tier".into()));
        assert_eq!((c.key.as_str(), c.cost), ("user:1", 1));
        // Algorithm and burst are an inline rule's: a named rule is the cluster's.
        let same = c.clone().algorithm(Algorithm::FixedWindow).burst(9).cost(0);
        assert_eq!(same.rule, c.rule);
        assert_eq!(same.cost, 0, "a cost of 0 reads without consuming");
    }

    #[test]
    fn an_inline_check_is_a_token_bucket_in_whole_milliseconds() {
        let c = Check::inline("ip:1", 5, Duration::from_micros(10_999_999));
        let RuleRef::Inline(r) = &c.rule else {
            panic!("{c:?}")
        };
        assert_eq!(
            (r.limit, r.period_ms, r.algorithm, r.burst),
            (5, 10_999, Algorithm::TokenBucket, None),
            "finer parts of the period are dropped"
        );
        let c = c.algorithm(Algorithm::LeakyBucket).burst(7).cost(3);
        let RuleRef::Inline(r) = &c.rule else {
            panic!("{c:?}")
        };
        assert_eq!(
            (r.algorithm, r.burst, c.cost),
            (Algorithm::LeakyBucket, Some(7), 3)
        );
        // A period beyond u64 milliseconds saturates rather than wrapping.
        let far = Check::inline("k", 1, Duration::MAX);
        assert!(matches!(far.rule, RuleRef::Inline(r) if r.period_ms == u64::MAX));
        let month = Check::calendar("acct", 10_000, Unit::Month, "Europe/Berlin").expect("zone");
        let RuleRef::Inline(r) = month.rule else {
            panic!("inline")
        };
        let resolved = ringlimit_core::check::Resolved::inline(&r).expect("valid");
        assert_eq!(resolved.rule.calendar, r.calendar);
        assert!(Check::calendar("acct", 1, Unit::Day, "Nowhere/Town").is_err());
    }
}
