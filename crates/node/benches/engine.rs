//! ns per check on the local decision path (the "engine": a check made ready under the rules in
//! force, then decided here by `Local`), side by side with governor's keyed limiter on the same
//! string keys: key validation, rule resolution, the bucket's identity, the store, and
//! phrasing the answer. The store alone is `ringlimit-core`'s `benches/store.rs`; both run on
//! the same key streams and loops (its `benches/common`, included here), with the same group
//! names, so their figures compare.
//!
//! Workload `uniform_100k`: 100,000 string keys (`user:00000042`) drawn uniformly from a
//! precomputed stream. The rule is a token bucket of 1,000,000 per second (burst 1,000,000),
//! and governor's quota is `Quota::per_second(1_000_000)`: every check is admitted by both
//! (asserted at setup), so both measure their admit path.
//!
//! Variants:
//! - `ringlimit_engine/named` and `/inline`: `InForce::prepare_check(key, RuleSpec, 1)` then
//!   `Here::decide` on string keys: key validation, rule resolution (an `ArcSwap` load and a
//!   map lookup, or inline validation and seeding), xxh3 of the key, the store, and phrasing
//!   the answer; SystemClock. The owned store has a change feed, unfollowed: what a node runs
//!   without replicas;
//! - `ringlimit_engine/named_followed`: `named` with a follower of the change feed subscribed
//!   (never reading), what a node streaming to a replica pays on the write side;
//! - `governor_keyed/string`: governor keyed on the same strings (`DefaultKeyedRateLimiter<String>`),
//!   the pairing for the engine variants.
//!
//! The `two_threads` groups run the same loop on 2 threads at once and report wall time divided
//! by the total number of checks (see the store benchmark).

#[path = "../../core/benches/common/mod.rs"]
mod common;

use common::{KEYS, Limiter, MAX_KEYS, RATE, Workload, multi, single};
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ringlimit_core::clock::SystemClock;
use ringlimit_core::coordinator::Here;
use ringlimit_core::store::Cursor;
use ringlimit_node::local::Local;
use ringlimit_node::rules::RuleSet;
use ringlimit_node::rules::RuleSpec;
use ringlimit_proto::{Algorithm, InlineRule};
use std::num::NonZeroU32;
use std::sync::Arc;

fn inline_rule() -> InlineRule {
    InlineRule {
        limit: u64::from(RATE),
        period_ms: 1_000,
        algorithm: Algorithm::TokenBucket,
        burst: None,
        calendar: None,
    }
}

fn new_engine() -> Local {
    let rules = RuleSet::from_yaml(&format!(
        "rules:\n  - name: bench\n    limit: {RATE}\n    period: 1s\n"
    ))
    .expect("valid bench rules");
    Local::alone(rules, MAX_KEYS, Arc::new(SystemClock::new()))
}

/// One check on the local path: made ready, then decided here.
#[inline(always)]
fn check(local: &Local, key: &str, spec: RuleSpec<'_>) -> bool {
    local
        .rules()
        .prepare_check(key, spec, 1)
        .map(|p| local.decide(&p).allowed)
        .unwrap_or(false)
}

fn governor_string() -> DefaultKeyedRateLimiter<String> {
    RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).expect("non-zero")))
}

struct GovernorString(DefaultKeyedRateLimiter<String>);

impl Limiter for GovernorString {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        self.0.check_key(w.string(i)).is_ok()
    }
}

struct EngineNamed(Local);

impl Limiter for EngineNamed {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        check(&self.0, w.string(i), RuleSpec::Named("bench"))
    }
}

/// [`EngineNamed`] with a follower of the change feed (held here, never reading).
struct EngineFollowed {
    checks: EngineNamed,
    /// Keeps the feed followed.
    _follower: Cursor,
}

impl Limiter for EngineFollowed {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, t: usize) -> bool {
        self.checks.check(w, i, t)
    }
}

fn engine_followed() -> EngineFollowed {
    let engine = new_engine();
    let cursor = engine.owned().follow().expect("the owned store has a feed");
    EngineFollowed {
        checks: EngineNamed(engine),
        _follower: cursor,
    }
}

struct EngineInline(Local, InlineRule);

impl Limiter for EngineInline {
    #[inline(always)]
    fn check(&self, w: &Workload, i: usize, _t: usize) -> bool {
        check(&self.0, w.string(i), RuleSpec::Inline(self.1))
    }
}

fn benches(c: &mut Criterion) {
    let w = Workload::new("uniform_100k", false, KEYS);
    single(c, &w, "ringlimit_engine/named", &EngineNamed(new_engine()));
    single(c, &w, "ringlimit_engine/named_followed", &engine_followed());
    single(
        c,
        &w,
        "ringlimit_engine/inline",
        &EngineInline(new_engine(), inline_rule()),
    );
    single(
        c,
        &w,
        "governor_keyed/string",
        &GovernorString(governor_string()),
    );
    multi(c, &w, "ringlimit_engine/named", &EngineNamed(new_engine()));
    multi(c, &w, "ringlimit_engine/named_followed", &engine_followed());
    multi(
        c,
        &w,
        "governor_keyed/string",
        &GovernorString(governor_string()),
    );
}

criterion_group! {
    name = engine;
    config = common::config();
    targets = benches
}
criterion_main!(engine);
