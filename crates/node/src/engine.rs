//! The local decision path for owned buckets: resolve a check's rule, identify its bucket, let
//! the store decide, and phrase the answer.

use crate::rules::{NamedRule, RuleSet};
use arc_swap::ArcSwap;
use ringlimit_core::answer::answer;
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::clock::Clock;
use ringlimit_core::limiter::Rule;
use ringlimit_core::store::Store;
use ringlimit_proto::{CheckAnswer, InlineRule, RuleRef};
use std::sync::Arc;

/// The rule a check names, borrowed from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSpec<'a> {
    Named(&'a str),
    Inline(InlineRule),
}

impl<'a> RuleSpec<'a> {
    /// The rule a peer's check names.
    pub fn of(r: &'a RuleRef) -> Self {
        match r {
            RuleRef::Named(name) => RuleSpec::Named(name),
            RuleRef::Inline(r) => RuleSpec::Inline(*r),
        }
    }

    /// This rule as a check travels to its owner.
    pub fn to_ref(self) -> RuleRef {
        match self {
            RuleSpec::Named(name) => RuleRef::Named(name.to_owned()),
            RuleSpec::Inline(r) => RuleRef::Inline(r),
        }
    }

    /// The rule's name; `None` for an inline rule.
    pub fn name(self) -> Option<&'a str> {
        match self {
            RuleSpec::Named(name) => Some(name),
            RuleSpec::Inline(_) => None,
        }
    }
}

/// One validated check, ready to decide or route (nothing consumed yet).
#[derive(Debug, Clone)]
pub struct Prepared<'a> {
    pub key: &'a str,
    pub spec: RuleSpec<'a>,
    pub cost: u64,
    pub resolved: Resolved,
    /// The bucket's identity.
    pub id: u64,
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
            RuleSpec::Named(name) => self
                .rules
                .load()
                .get(name)
                .map(|r| NamedRule::resolved(r))
                .ok_or_else(|| CheckError::UnknownRule(name.to_owned())),
            RuleSpec::Inline(inline) => Resolved::inline(&inline).map_err(CheckError::InvalidRule),
        }
    }

    /// Validates a whole check without deciding it; returns the rule and the bucket's identity.
    pub fn prepare(
        &self,
        key: &str,
        spec: RuleSpec<'_>,
        cost: u64,
    ) -> Result<(Resolved, u64), CheckError> {
        // The key first: a bad key is named whatever else is wrong.
        ringlimit_core::rule::validate_key(key).map_err(CheckError::InvalidKey)?;
        let resolved = self.resolve(spec)?;
        Ok((resolved, resolved.bucket(key, cost)?))
    }

    /// [`Engine::prepare`], keeping the check's parts together.
    pub fn prepare_check<'a>(
        &self,
        key: &'a str,
        spec: RuleSpec<'a>,
        cost: u64,
    ) -> Result<Prepared<'a>, CheckError> {
        let (resolved, id) = self.prepare(key, spec, cost)?;
        Ok(Prepared {
            key,
            spec,
            cost,
            resolved,
            id,
        })
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
