//! How a decision is worded as the contract's [`CheckAnswer`]: owner and global decisions, a
//! fail-closed denial, and a fallback share's answer. Validation lives in [`crate::rule`].

use crate::clock::NANOS_PER_MS;
use crate::limiter::{Decision, Rule};
use crate::store::Store;
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::Mark;

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
    }
}

/// A fallback decision: bucket `id` of `store` decided alone on `share` of `rule` (a cost above
/// the share's capacity takes the whole share), answered with the whole rule's limit and marked
/// degraded. Nodes and the SDK fall back through this one path.
pub fn decide_share(
    store: &Store,
    id: u64,
    rule: &Rule,
    share: &Rule,
    cost: u64,
    now: u64,
) -> CheckAnswer {
    hold_share(store, id, rule, share, cost, now).0
}

/// [`decide_share`] for a check that may have to give its cost back (all-or-nothing): also
/// the mark and the cost of what it took, for [`Store::refund`] of bucket `id` under `share`.
pub fn hold_share(
    store: &Store,
    id: u64,
    rule: &Rule,
    share: &Rule,
    cost: u64,
    now: u64,
) -> (CheckAnswer, Option<(Mark, u64)>) {
    let cost = cost.min(share.capacity());
    let d = store.check(id, share, now, cost);
    let taken = (d.allowed && cost > 0).then_some((
        Mark {
            reset_ns: d.reset_ns,
            at_ns: now,
        },
        cost,
    ));
    let a = CheckAnswer {
        limit: rule.limit,
        degraded: true,
        ..answer(&d, share)
    };
    (a, taken)
}
