//! Rule parameters as the algorithms take them: validation, bucket identities, fallback shares.
//! How answers are worded is [`crate::answer`]'s.
//!
//! One validation serves every way a rule arrives (a node's rules file, a request's inline rule,
//! the SDK), so a rule one of them refuses is refused by all with the same words.

use crate::calendar::{Calendar, Unit, Zone};
use crate::clock::NANOS_PER_MS;
use crate::limiter::{self, Rule};
use ringlimit_proto::identity;
use ringlimit_proto::{Algorithm, CheckAnswer, InlineRule};

/// Who decides a rule's checks, what is answered when a key's owner cannot be reached, and
/// whether its hot buckets may be leased: the types `GET /v1/rules` lists them in, under the
/// names the rules file and the node use.
pub use ringlimit_proto::discovery::{
    LeaseMode, OnRegionUnreachable, PersistMode, RegionScope, RuleMode as Mode,
    UnreachablePolicy as OnOwnerUnreachable,
};

/// Why a rule is invalid: which field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {reason}")]
pub struct FieldError {
    pub field: &'static str,
    pub reason: String,
}

impl FieldError {
    /// The HTTP API's error code for an invalid rule with this error.
    pub fn code(&self) -> &'static str {
        match self.field {
            "limit" => "invalid_limit",
            "period" | "period_ms" => "invalid_period",
            "burst" => "invalid_burst",
            _ => "invalid_rule",
        }
    }
}

/// A [`FieldError`] for `field`.
pub fn field_err(field: &'static str, reason: impl Into<String>) -> FieldError {
    FieldError {
        field,
        reason: reason.into(),
    }
}

/// Validates rule parameters into the algorithms' [`Rule`].
pub fn validate(
    algorithm: Algorithm,
    limit: u64,
    period_ns: u64,
    burst: Option<u64>,
) -> Result<Rule, FieldError> {
    if !(1..=limiter::MAX_LIMIT).contains(&limit) {
        return Err(field_err(
            "limit",
            format!("must be between 1 and {}, got {limit}", limiter::MAX_LIMIT),
        ));
    }
    if !(NANOS_PER_MS..=limiter::MAX_PERIOD_NS).contains(&period_ns) {
        return Err(field_err(
            "period",
            "must be between 1 ms and 366 days".to_string(),
        ));
    }
    if algorithm == Algorithm::SlidingLog && limit > limiter::MAX_SLIDING_LOG_LIMIT {
        return Err(field_err(
            "limit",
            format!(
                "is {limit}, but sliding_log keeps one entry per request and allows at most {}; use sliding_window for large limits",
                limiter::MAX_SLIDING_LOG_LIMIT
            ),
        ));
    }
    let burst = match burst {
        None => limit,
        Some(_) if !algorithm.has_burst() => {
            return Err(field_err(
                "burst",
                format!("applies only to token_bucket and leaky_bucket, not {algorithm}"),
            ));
        }
        Some(b) if b == 0 || b > limiter::MAX_LIMIT => {
            return Err(field_err(
                "burst",
                format!("must be between 1 and {}, got {b}", limiter::MAX_LIMIT),
            ));
        }
        Some(b) => b,
    };
    if algorithm.has_burst() && period_ns / limit < limiter::MIN_EMISSION_NS {
        return Err(field_err(
            "limit",
            format!(
                "{limit} per {} ms is over one request per microsecond, the finest rate {algorithm} supports",
                period_ns / NANOS_PER_MS
            ),
        ));
    }
    Ok(Rule {
        algorithm,
        limit,
        period_ns,
        burst,
        calendar: None,
    })
}

/// The calendar of a rule whose period is `period_ns` (`month`: written `1mo`), from its
/// `calendar` and `timezone` fields; `None` for windows counted from the epoch. Only a fixed
/// window has calendar windows, and only of a day, a week or a month (a calendar hour would be
/// the plain `1h` but in zones with half-hour offsets); a month has no fixed length, so `1mo`
/// needs `calendar: true`.
pub fn calendar_of(
    algorithm: Algorithm,
    period_ns: u64,
    month: bool,
    calendar: bool,
    timezone: Option<&str>,
) -> Result<Option<Calendar>, FieldError> {
    if !calendar {
        if month {
            return Err(field_err(
                "period",
                "1mo has no fixed length: add `calendar: true` (and a `timezone`, default UTC) \
                 for windows of calendar months",
            ));
        }
        if timezone.is_some() {
            return Err(field_err(
                "timezone",
                "applies only to calendar windows: add `calendar: true`",
            ));
        }
        return Ok(None);
    }
    if algorithm != Algorithm::FixedWindow {
        return Err(field_err(
            "calendar",
            format!("applies only to fixed_window, not {algorithm}"),
        ));
    }
    let unit = if month {
        Unit::Month
    } else if period_ns == Unit::Day.nominal_ns() {
        Unit::Day
    } else if period_ns == Unit::Week.nominal_ns() {
        Unit::Week
    } else {
        return Err(field_err(
            "calendar",
            "needs a period of 1d, 1w or 1mo (a local day, a week from Monday, a month from the first)",
        ));
    };
    let zone = match timezone {
        None => Zone::UTC,
        Some(name) => Zone::parse(name).map_err(|e| field_err("timezone", e.to_string()))?,
    };
    Ok(Some(Calendar { unit, zone }))
}

/// Validates rule parameters with calendar windows ([`validate`], then [`calendar_of`]'s
/// calendar).
pub fn validate_calendar(
    algorithm: Algorithm,
    limit: u64,
    period_ns: u64,
    burst: Option<u64>,
    calendar: Option<Calendar>,
) -> Result<Rule, FieldError> {
    let period_ns = calendar.map_or(period_ns, |c| c.unit.nominal_ns());
    let mut rule = validate(algorithm, limit, period_ns, burst)?;
    if calendar.is_some() && algorithm != Algorithm::FixedWindow {
        return Err(field_err(
            "calendar",
            format!("applies only to fixed_window, not {algorithm}"),
        ));
    }
    rule.calendar = calendar;
    Ok(rule)
}

/// Validates an inline rule from a request.
pub fn validate_inline(r: &InlineRule) -> Result<Rule, FieldError> {
    if r.period_ms == 0 {
        return Err(field_err("period_ms", "must be greater than 0"));
    }
    let period_ns = r.period_ms.saturating_mul(NANOS_PER_MS);
    if let Some(c) = r.calendar
        && period_ns != c.unit.nominal_ns()
    {
        return Err(field_err(
            "period_ms",
            format!(
                "must be {} for a calendar {}",
                c.unit.nominal_ns() / NANOS_PER_MS,
                c.unit.period()
            ),
        ));
    }
    validate_calendar(r.algorithm, r.limit, period_ns, r.burst, r.calendar).map_err(|mut e| {
        if e.field == "period" {
            e.field = "period_ms";
            e.reason = "must be between 1 and 31622400000 (366 days)".into();
        }
        e
    })
}

/// The seed of an inline rule's bucket identities: its parameters, hashed.
pub fn inline_seed(rule: &Rule) -> u64 {
    let seed = identity::inline_seed(
        rule.algorithm.code(),
        rule.limit,
        rule.period_ns,
        rule.burst,
    );
    match rule.calendar {
        None => seed,
        Some(c) => identity::calendar_seed(seed, c.unit.code(), c.zone.name()),
    }
}

/// The seed of a named rule's bucket identities: its name and algorithm (a reload that changes
/// the algorithm starts fresh buckets; one that changes only numbers keeps them).
pub fn named_seed(name: &str, algorithm: Algorithm) -> u64 {
    identity::named_seed(name, algorithm.code())
}

pub use identity::bucket_id;

/// The most one check may cost under `rule`: its bucket's capacity, or for a global rule
/// `limit` (a global rule is a window counter over `limit` whatever its algorithm; its burst is
/// ignored).
pub fn max_cost(rule: &Rule, mode: Mode) -> u64 {
    match mode {
        Mode::Global => rule.limit,
        Mode::Owner => rule.capacity(),
    }
}

/// Why a key is refused: 1 to [`CheckAnswer::MAX_KEY_BYTES`] bytes.
pub fn validate_key(key: &str) -> Result<(), usize> {
    if key.is_empty() || key.len() > CheckAnswer::MAX_KEY_BYTES {
        Err(key.len())
    } else {
        Ok(())
    }
}

/// One decider's share of a rule when it must decide alone: limit and burst divided by the
/// `members` that share the load, rounded down so that the shares never add up to more than the
/// rule (10 among 3 rounded up gives 4 each: 12, over the limit from rounding alone; the docs'
/// benchmarks page, "Hardening findings"), but never below 1 (a share of 0 would deny
/// everything).
pub fn share_of(rule: &Rule, members: usize) -> Rule {
    let n = members.max(1) as u64;
    Rule {
        limit: (rule.limit / n).max(1),
        burst: (rule.burst / n).max(1),
        ..*rule
    }
}

#[cfg(test)]
mod share_tests {
    use super::*;
    use ringlimit_proto::Algorithm;

    fn of(algorithm: Algorithm, limit: u64) -> Rule {
        Rule {
            algorithm,
            limit,
            period_ns: 1_000_000_000,
            burst: limit,
            calendar: None,
        }
    }

    #[test]
    fn shares_never_add_up_to_more_than_the_rule_nor_fall_to_zero() {
        let rule = of(Algorithm::TokenBucket, 10);
        let share = share_of(&rule, 3);
        assert_eq!((share.limit, share.burst), (3, 3));
        assert_eq!(share_of(&rule, 1).limit, 10);
        assert_eq!(share_of(&rule, 0).limit, 10);
        let one = of(Algorithm::FixedWindow, 1);
        assert_eq!(share_of(&one, 3).limit, 1);
    }
}
