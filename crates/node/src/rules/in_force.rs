//! The rules in force, and a check made ready under them: its key validated, its rule resolved
//! (by name, or inline), its bucket named ([`Prepared`]). What every edge, the peer server and
//! the RLQS owner read before anything is decided; [`super::book::RuleBook`] writes it.

use super::{NamedRule, RuleSet, RuleSpec};
use arc_swap::ArcSwap;
use ringlimit_core::check::{CheckError, Resolved};
use std::sync::Arc;

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

/// The rule set checks are decided under now (swapped whole: checks in flight finish under
/// the set they started with).
#[derive(Debug)]
pub struct InForce {
    rules: ArcSwap<RuleSet>,
    /// Rule sets put in force since start, for those who follow them (ringlimit.v1's
    /// WatchTopology) without polling.
    changes: tokio::sync::watch::Sender<u64>,
}

impl InForce {
    pub fn new(rules: RuleSet) -> Self {
        Self {
            rules: ArcSwap::from_pointee(rules),
            changes: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Told each time rules are put in force.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Puts new rules in force.
    pub fn set_rules(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
        self.changes.send_modify(|n| *n += 1);
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

    /// [`InForce::prepare`], keeping the check's parts together.
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
}
