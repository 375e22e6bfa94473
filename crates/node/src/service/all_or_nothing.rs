//! One request held to several limits at once (`POST /v1/check/all`): admitted only when every
//! enforced check admits, and then each takes its cost; when any denies, none keeps its cost.
//! The routing does the deciding and the giving back ([`crate::routing::Router::check_all`]);
//! this validates the request as a whole and picks the limit that binds.

use super::{Check, CheckService, Edge, Outcome};
use crate::metrics::seconds;
use ringlimit_core::all_or_nothing::{AllError, MAX_ALL, binding, duplicate};

/// A request decided against all its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllOutcome {
    /// Every enforced check admitted (and took its cost).
    pub allowed: bool,
    /// The index in `results` of the limit that binds (see [`ringlimit_core::all_or_nothing::binding`]).
    pub binding: usize,
    /// Any result was made without its owner.
    pub degraded: bool,
    /// One outcome per check, in order; after a denial they read as if the request never came.
    pub results: Vec<Outcome>,
}

impl CheckService {
    /// Decides one request that arrived at `edge` against all its checks, all-or-nothing,
    /// across the cluster. Each check is counted like a single check; the request is timed as
    /// one.
    pub async fn check_all(
        &self,
        edge: Edge,
        checks: &[Check<'_>],
    ) -> Result<AllOutcome, AllError> {
        let start = self.local.now();
        if checks.is_empty() || checks.len() > MAX_ALL {
            return Err(AllError::Count(checks.len()));
        }
        let mut prepared = Vec::with_capacity(checks.len());
        for (index, c) in checks.iter().enumerate() {
            let p = self
                .prepare(c, c.cost)
                .map_err(|error| AllError::Item { index, error })?;
            prepared.push(p);
        }
        let ids: Vec<u64> = prepared.iter().map(|p| p.id).collect();
        if let Some(e) = duplicate(&ids) {
            return Err(e);
        }
        let blocks: Vec<_> = prepared.iter().map(|p| self.block_of(p, start)).collect();
        if blocks
            .iter()
            .zip(&prepared)
            .any(|(b, p)| b.is_some() && !p.resolved.shadow)
        {
            return self.blocked_all(edge, &prepared, &blocks, start).await;
        }
        // One check is its own all-or-nothing: the single-check path decides it the same way
        // without a group's holds, for less CPU (measured through ShouldRateLimit: the docs'
        // benchmarks page, "gRPC").
        let decided = match prepared.as_slice() {
            [single] => vec![self.router.check_blocked(single).await],
            _ => self.router.check_all(&prepared).await,
        };
        let end = self.local.now();
        let mut results = Vec::with_capacity(decided.len());
        for (index, (d, p)) in decided.into_iter().zip(&prepared).enumerate() {
            match d {
                // Denied by a block its owner knows and this node does not yet: blocked here
                // too (counted blocked at the owner).
                Ok((a, blocked)) => results.push(Outcome {
                    blocked,
                    ..self.outcome(a, p, end)
                }),
                // The routing gave back whatever the others took.
                Err(error) => return Err(AllError::Item { index, error }),
            }
        }
        self.metrics.count_edge(edge, results.len() as u64);
        self.metrics.all_duration.observe(seconds(start, end));
        Ok(decide(results))
    }
}

impl CheckService {
    /// A request one of whose enforced checks is blocked: denied, nothing taken. The blocked
    /// checks answer from their blocks; the others are read (cost 0) for what they would say.
    async fn blocked_all(
        &self,
        edge: Edge,
        prepared: &[crate::rules::Prepared<'_>],
        blocks: &[Option<crate::blocks::Hit>],
        start: u64,
    ) -> Result<AllOutcome, AllError> {
        let mut results = Vec::with_capacity(prepared.len());
        for (index, (p, hit)) in prepared.iter().zip(blocks).enumerate() {
            let o = match hit {
                Some(hit) => self.blocked_outcome(p, *hit, start),
                None => {
                    let mut read = p.clone();
                    read.cost = 0;
                    let a = self
                        .router
                        .check(&read)
                        .await
                        .map_err(|error| AllError::Item { index, error })?;
                    Outcome::new(a, &p.resolved, start)
                }
            };
            results.push(o);
        }
        let end = self.local.now();
        self.metrics.count_edge(edge, results.len() as u64);
        self.metrics.all_duration.observe(seconds(start, end));
        Ok(decide(results))
    }
}

/// The request's decision from its checks' outcomes.
pub fn decide(results: Vec<Outcome>) -> AllOutcome {
    let answers: Vec<_> = results.iter().map(|o| o.answer).collect();
    let shadow: Vec<bool> = results.iter().map(|o| o.shadow_denied.is_some()).collect();
    AllOutcome {
        allowed: answers.iter().all(|a| a.allowed),
        binding: binding(&answers, &shadow),
        degraded: answers.iter().any(|a| a.degraded),
        results,
    }
}

/// Why a forward-auth request names rules it cannot be checked under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRuleError {
    #[error("no rule named {0:?} is configured")]
    Unknown(String),
    #[error("rule {0:?} has no `request_key`, so a forwarded request has no key under it")]
    NoTemplate(String),
}

impl CheckService {
    /// The rules a gateway's forwarded request is checked under, with their key templates:
    /// those `names` (each must have a `request_key`), or every rule that has one.
    pub fn request_keys(
        &self,
        names: Option<&[&str]>,
    ) -> Result<
        Vec<(
            String,
            std::sync::Arc<crate::rules::request_key::KeyTemplate>,
        )>,
        KeyRuleError,
    > {
        let rules = self.local.rules().rules();
        match names {
            None => {
                let mut all: Vec<_> = rules
                    .iter()
                    .filter_map(|r| Some((r.name.clone(), r.request_key.clone()?)))
                    .collect();
                // One order whatever the map's: the answer lists the limits in it.
                all.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(all)
            }
            Some(names) => names
                .iter()
                .map(|&name| {
                    let rule = rules
                        .get(name)
                        .ok_or_else(|| KeyRuleError::Unknown(name.to_owned()))?;
                    let template = rule
                        .request_key
                        .clone()
                        .ok_or_else(|| KeyRuleError::NoTemplate(name.to_owned()))?;
                    Ok((name.to_owned(), template))
                })
                .collect(),
        }
    }
}
