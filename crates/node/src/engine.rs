//! The local decision path: resolve a check's rule, identify its bucket, let the store decide,
//! and phrase the answer. Everything a node answers for a key it owns goes through here.

use crate::clock::Clock;
use crate::limiter::Rule;
use crate::rules::{self, FieldError, Mode, NamedRule, OnOwnerUnreachable, RuleSet};
use crate::store::Store;
use arc_swap::ArcSwap;
use ringlimit_proto::{CheckAnswer, InlineRule};
use std::sync::Arc;

/// The rule a check names, borrowed from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSpec<'a> {
    Named(&'a str),
    Inline(InlineRule),
}

/// Why a check cannot be decided. Each is the caller's mistake, and none touches a bucket.
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
    Owner { code: String, message: String },
}

impl CheckError {
    /// The contract's snake_case error code.
    pub fn code(&self) -> &'static str {
        match self {
            CheckError::InvalidKey(_) => "invalid_key",
            CheckError::UnknownRule(_) => "unknown_rule",
            CheckError::InvalidRule(e) => e.code(),
            CheckError::CostTooLarge { .. } => "invalid_cost",
            CheckError::Owner { code, .. } => owner_code(code),
        }
    }
}

/// The owner's error code, if it is one of ours (a code from the network is not trusted).
fn owner_code(code: &str) -> &'static str {
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

/// A check's rule, resolved and validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub rule: Rule,
    /// Seed of this rule's bucket identities.
    pub seed: u64,
    pub mode: Mode,
    pub on_unreachable: OnOwnerUnreachable,
}

/// Rules, buckets and time: everything one node needs to decide checks it owns.
pub struct Engine {
    store: Store,
    rules: ArcSwap<RuleSet>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Engine {
    pub fn new(rules: RuleSet, max_keys: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            store: Store::new(max_keys),
            rules: ArcSwap::from_pointee(rules),
            clock,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Puts new rules in force (checks in flight finish under the old ones).
    pub fn set_rules(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
    }

    /// Resolves and validates a check's rule.
    pub fn resolve(&self, spec: RuleSpec<'_>) -> Result<Resolved, CheckError> {
        match spec {
            RuleSpec::Named(name) => {
                let rules = self.rules.load();
                let r: &NamedRule = rules
                    .get(name)
                    .ok_or_else(|| CheckError::UnknownRule(name.to_owned()))?;
                Ok(Resolved {
                    rule: r.rule,
                    seed: r.seed,
                    mode: r.mode,
                    on_unreachable: r.on_owner_unreachable,
                })
            }
            RuleSpec::Inline(inline) => {
                let rule = rules::validate_inline(&inline).map_err(CheckError::InvalidRule)?;
                Ok(Resolved {
                    rule,
                    seed: rules::inline_seed(&rule),
                    mode: Mode::Owner,
                    on_unreachable: OnOwnerUnreachable::Open,
                })
            }
        }
    }

    /// Validates a whole check without deciding it; returns the bucket's identity.
    pub fn prepare(
        &self,
        key: &str,
        spec: RuleSpec<'_>,
        cost: u64,
    ) -> Result<(Resolved, u64), CheckError> {
        rules::validate_key(key).map_err(CheckError::InvalidKey)?;
        let resolved = self.resolve(spec)?;
        let capacity = rules::max_cost(&resolved.rule, resolved.mode);
        if cost > capacity {
            return Err(CheckError::CostTooLarge { cost, capacity });
        }
        Ok((resolved, rules::bucket_id(resolved.seed, key)))
    }

    /// Decides a check on this node.
    pub fn check(
        &self,
        key: &str,
        spec: RuleSpec<'_>,
        cost: u64,
    ) -> Result<CheckAnswer, CheckError> {
        let (resolved, id) = self.prepare(key, spec, cost)?;
        Ok(self.decide(id, &resolved.rule, cost))
    }

    /// Decides a prepared check (see [`Engine::prepare`]) now.
    pub fn decide(&self, id: u64, rule: &Rule, cost: u64) -> CheckAnswer {
        let decision = self.store.check_now(id, rule, || self.clock.now(), cost);
        answer(&decision, rule)
    }

    /// Decides a prepared check at `now`, a reading of this engine's clock. Batches read the
    /// clock once for all their checks: on this VM a clock read (kvm-clock, serialising) nearly
    /// doubles a store check (60 vs 33 ns in `cargo bench --bench store`, 100k keys), and one
    /// instant for a whole batch is what a batch means.
    pub fn decide_at(&self, id: u64, rule: &Rule, cost: u64, now: u64) -> CheckAnswer {
        answer(&self.store.check(id, rule, now, cost), rule)
    }
}

pub use ringlimit_core::rule::answer;
