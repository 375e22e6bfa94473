//! A check's rule resolved once, and the one error a check can end in: the same types serve a
//! node deciding a check and the SDK routing or falling back with it.

use crate::limiter::Rule;
use crate::rule::{
    self, FieldError, LeaseMode, Mode, OnOwnerUnreachable, OnRegionUnreachable, PersistMode,
    RegionScope,
};
use ringlimit_proto::InlineRule;
use ringlimit_proto::discovery::RuleInfo;

/// A check's rule, resolved and validated: what every path needs to identify, decide, route
/// and fall back with a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub rule: Rule,
    /// Seed of this rule's bucket identities (see [`rule::bucket_id`]).
    pub seed: u64,
    pub mode: Mode,
    pub on_unreachable: OnOwnerUnreachable,
    /// A shadow rule: decided and counted, but its denials are reported, never enforced.
    pub shadow: bool,
    /// Whether this rule's hot buckets may be leased (`lease: off` keeps every check at the
    /// owner).
    pub lease: LeaseMode,
    /// Whether this rule's buckets are kept on disk (where the node keeps buckets at all).
    pub persist: PersistMode,
    /// Whether its limit is shared by every region (on a node with regions).
    pub scope: RegionScope,
    /// A `scope: regions` rule's fallback when its region cannot renew its allowance.
    pub on_region_unreachable: OnRegionUnreachable,
}

impl Resolved {
    /// An inline rule from a request: validated, always owner mode, open and leasable.
    pub fn inline(r: &InlineRule) -> Result<Self, FieldError> {
        let rule = rule::validate_inline(r)?;
        Ok(Self {
            rule,
            seed: rule::inline_seed(&rule),
            mode: Mode::Owner,
            on_unreachable: OnOwnerUnreachable::Open,
            shadow: false,
            lease: LeaseMode::Auto,
            persist: PersistMode::Auto,
            scope: RegionScope::Region,
            on_region_unreachable: OnRegionUnreachable::Share,
        })
    }

    /// A named rule (its seed is its name and algorithm, see [`rule::named_seed`]), enforced
    /// and leasable.
    pub fn named(name: &str, rule: Rule, mode: Mode, on_unreachable: OnOwnerUnreachable) -> Self {
        Self {
            rule,
            seed: rule::named_seed(name, rule.algorithm),
            mode,
            on_unreachable,
            shadow: false,
            lease: LeaseMode::Auto,
            persist: PersistMode::Auto,
            scope: RegionScope::Region,
            on_region_unreachable: OnRegionUnreachable::Share,
        }
    }

    /// A rule as `GET /v1/rules` lists it (`None` if it does not validate here).
    pub fn from_info(info: &RuleInfo) -> Option<Self> {
        let period_ns = info.period_ms.checked_mul(crate::clock::NANOS_PER_MS)?;
        let burst = info.burst.filter(|_| info.algorithm.has_burst());
        let calendar = rule::calendar_of(
            info.algorithm,
            period_ns,
            info.period == crate::calendar::Unit::Month.period(),
            info.calendar,
            info.timezone.as_deref(),
        )
        .ok()?;
        let rule =
            rule::validate_calendar(info.algorithm, info.limit, period_ns, burst, calendar).ok()?;
        Some(Self {
            shadow: info.shadow,
            lease: info.lease,
            persist: info.persist,
            scope: info.scope,
            on_region_unreachable: info.on_region_unreachable,
            ..Self::named(&info.name, rule, info.mode, info.on_owner_unreachable)
        })
    }

    /// Validates `key` and `cost` under this rule (nothing is decided) and returns the bucket's
    /// identity.
    pub fn bucket(&self, key: &str, cost: u64) -> Result<u64, CheckError> {
        rule::validate_key(key).map_err(CheckError::InvalidKey)?;
        let capacity = rule::max_cost(&self.rule, self.mode);
        if cost > capacity {
            return Err(CheckError::CostTooLarge { cost, capacity });
        }
        Ok(rule::bucket_id(self.seed, key))
    }
}

/// Why a check has no answer. Every variant but [`CheckError::Unavailable`] is a mistake in the
/// check itself, and none touches a bucket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("`key` must be 1 to 512 bytes, got {0} bytes")]
    InvalidKey(usize),
    #[error("no rule named {0:?} is configured")]
    UnknownRule(String),
    #[error("invalid rule: {0}")]
    InvalidRule(FieldError),
    #[error(
        "`cost` {cost} exceeds the capacity {capacity} of this rule, so it could never be admitted"
    )]
    CostTooLarge { cost: u64, capacity: u64 },
    /// The key's owner refused the check (e.g. its rules differ from ours during a reload).
    #[error("the key's owner refused the check: {message}")]
    Rejected { code: String, message: String },
    /// The cluster could not answer in time and the caller is fail-closed (SDK only).
    #[error("no cluster member answered: {0}")]
    Unavailable(&'static str),
}

impl CheckError {
    /// The HTTP API's snake_case error code.
    pub fn code(&self) -> &'static str {
        match self {
            CheckError::InvalidKey(_) => "invalid_key",
            CheckError::UnknownRule(_) => "unknown_rule",
            CheckError::InvalidRule(e) => e.code(),
            CheckError::CostTooLarge { .. } => "invalid_cost",
            CheckError::Rejected { code, .. } => known_code(code),
            CheckError::Unavailable(_) => "unavailable",
        }
    }

    /// This error as a peer's answer to the check: its code and its message.
    pub fn to_peer_answer(&self) -> ringlimit_proto::peer::PeerAnswer {
        ringlimit_proto::peer::PeerAnswer::Error {
            code: self.code().to_owned(),
            message: self.to_string(),
        }
    }
}

/// `code` if it is one of ours (a code from the network is not trusted), else `invalid_request`.
fn known_code(code: &str) -> &'static str {
    const CODES: [&str; 8] = [
        "invalid_key",
        "unknown_rule",
        "invalid_limit",
        "invalid_period",
        "invalid_burst",
        "invalid_rule",
        "invalid_cost",
        "invalid_request",
    ];
    CODES
        .into_iter()
        .find(|c| *c == code)
        .unwrap_or("invalid_request")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_proto::Algorithm;

    #[test]
    fn a_resolved_rule_checks_key_and_cost_before_naming_the_bucket() {
        let r = Resolved::inline(&InlineRule {
            limit: 5,
            period_ms: 1000,
            algorithm: Algorithm::TokenBucket,
            burst: None,
            calendar: None,
        })
        .expect("valid");
        assert_eq!(r.bucket("", 1), Err(CheckError::InvalidKey(0)));
        assert_eq!(
            r.bucket("k", 6),
            Err(CheckError::CostTooLarge {
                cost: 6,
                capacity: 5
            })
        );
        assert_eq!(r.bucket("k", 5), Ok(rule::bucket_id(r.seed, "k")));
    }

    #[test]
    fn inline_rules_may_be_leased_and_a_listed_rule_says_whether() {
        // Inline rules include the Envoy configuration's limits, which have no such field.
        let inline = Resolved::inline(&InlineRule {
            limit: 5,
            period_ms: 1000,
            algorithm: Algorithm::TokenBucket,
            burst: None,
            calendar: None,
        })
        .expect("valid");
        assert_eq!(inline.lease, LeaseMode::Auto);
        let mut info = RuleInfo {
            name: "r".into(),
            limit: 5,
            period_ms: 1000,
            period: "1s".into(),
            algorithm: Algorithm::TokenBucket,
            burst: None,
            mode: Mode::Owner,
            on_owner_unreachable: OnOwnerUnreachable::Open,
            shadow: false,
            lease: LeaseMode::Off,
            persist: PersistMode::Auto,
            request_key: None,
            calendar: false,
            timezone: None,
            block: None,
            scope: RegionScope::Region,
            on_region_unreachable: OnRegionUnreachable::Share,
            scope_in_effect: None,
        };
        assert_eq!(
            Resolved::from_info(&info).map(|r| r.lease),
            Some(LeaseMode::Off)
        );
        info.lease = LeaseMode::Auto;
        assert_eq!(
            Resolved::from_info(&info).map(|r| r.lease),
            Some(LeaseMode::Auto)
        );
    }

    #[test]
    fn codes_from_the_network_are_not_trusted() {
        let e = |code: &str| CheckError::Rejected {
            code: code.into(),
            message: String::new(),
        };
        assert_eq!(e("unknown_rule").code(), "unknown_rule");
        assert_eq!(e("<script>").code(), "invalid_request");
    }
}
