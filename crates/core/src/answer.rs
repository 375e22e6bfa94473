//! How a decision is worded as the contract's [`CheckAnswer`]: owner and global decisions, a
//! fail-closed denial, a rule never learnt, a cost given back. Validation lives in
//! [`crate::rule`]; the fallback share's decisions in [`crate::coordinator::share`].

use crate::clock::NANOS_PER_MS;
use crate::limiter::{Decision, Rule};
use ringlimit_proto::CheckAnswer;

/// An instant in Unix ms as answers state it: rounded up, so a reset is never announced early.
/// An instant compared with an answer's `reset_at_ms` (the IETF `t`, Envoy's
/// `duration_until_reset`) must be rounded alike: `now` rounded down made a reset exactly one
/// second away 1,001 ms away, and `t` 2.
pub fn instant_ms(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_MS)
}

/// The contract's answer for a decision under `rule` (not degraded; times rounded up to ms).
pub fn answer(d: &Decision, rule: &Rule) -> CheckAnswer {
    CheckAnswer {
        allowed: d.allowed,
        limit: rule.limit,
        remaining: d.remaining,
        reset_at_ms: instant_ms(d.reset_ns),
        retry_after_ms: d.retry_after_ns.div_ceil(NANOS_PER_MS),
        degraded: false,
        replica: false,
        leased: false,
    }
}

/// How long a fail-closed rule's denial asks the caller to wait, in ms.
pub const CLOSED_RETRY_MS: u64 = 1_000;

/// The answer of a rule that fails closed while its owner is unreachable: denied, degraded.
pub fn closed_answer(rule: &Rule, now_ns: u64) -> CheckAnswer {
    let now_ms = now_ns / NANOS_PER_MS;
    CheckAnswer {
        allowed: false,
        limit: rule.limit,
        remaining: 0,
        reset_at_ms: now_ms + CLOSED_RETRY_MS,
        retry_after_ms: CLOSED_RETRY_MS,
        degraded: true,
        replica: false,
        leased: false,
    }
}

/// The answer for a rule never learnt (an SDK before any node answered): admitted, degraded,
/// with no limit to report.
pub fn unknown_rule_answer(now_ns: u64) -> CheckAnswer {
    CheckAnswer {
        allowed: true,
        limit: 0,
        remaining: 0,
        reset_at_ms: instant_ms(now_ns),
        retry_after_ms: 0,
        degraded: true,
        replica: false,
        leased: false,
    }
}

/// An admission's answer once its cost was given back: what the bucket reads without it.
pub fn given_back(a: CheckAnswer, cost: u64) -> CheckAnswer {
    CheckAnswer {
        remaining: a.remaining.saturating_add(cost),
        ..a
    }
}
