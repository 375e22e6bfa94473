//! One request held to several limits at once (`POST /v1/check/all`): admitted only when every
//! enforced check admits, and then each takes its cost; when any denies, none keeps its cost.
//! The routing does the deciding and the giving back ([`crate::routing::Dispatcher::check_all`]);
//! this validates the request as a whole and picks the limit that binds.

use super::{Check, CheckService, Outcome};
use crate::metrics::seconds;
use ringlimit_core::check::CheckError;

/// Most checks in one all-or-nothing request.
pub const MAX_ALL: usize = 32;

/// A request decided against all its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllOutcome {
    /// Every enforced check admitted (and took its cost).
    pub allowed: bool,
    /// The index in `results` of the limit that binds: when denied, the denying check with the
    /// longest wait; when admitted, the enforced check with the least remaining.
    pub binding: usize,
    /// Any result was made without its owner.
    pub degraded: bool,
    /// One outcome per check, in order; after a denial they read as if the request never came.
    pub results: Vec<Outcome>,
}

/// Why a request has no decision. Nothing was consumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllError {
    #[error("`checks` must hold 1 to {MAX_ALL} checks, got {0}")]
    Count(usize),
    #[error("check {index}: {error}")]
    Item { index: usize, error: CheckError },
    #[error(
        "checks {first} and {second} name the same bucket (same rule and key); give it once with the summed `cost`"
    )]
    Duplicate { first: usize, second: usize },
}

impl AllError {
    /// The HTTP API's snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            AllError::Count(_) => "invalid_batch",
            AllError::Item { error, .. } => error.code(),
            AllError::Duplicate { .. } => "duplicate_check",
        }
    }
}

impl CheckService {
    /// Decides one request against all its checks, all-or-nothing, across the cluster. Each
    /// check is counted like a single check; the request is timed as one.
    pub async fn check_all(&self, checks: &[Check<'_>]) -> Result<AllOutcome, AllError> {
        let start = self.here.now();
        if checks.is_empty() || checks.len() > MAX_ALL {
            return Err(AllError::Count(checks.len()));
        }
        let mut prepared = Vec::with_capacity(checks.len());
        for (index, c) in checks.iter().enumerate() {
            let p = self
                .prepare(c, c.cost)
                .map_err(|error| AllError::Item { index, error })?;
            if let Some(first) = prepared.iter().position(|q: &crate::engine::Prepared<'_>| {
                q.id == p.id && q.resolved.mode == p.resolved.mode
            }) {
                return Err(AllError::Duplicate {
                    first,
                    second: index,
                });
            }
            prepared.push(p);
        }
        let decided = self.dispatcher.check_all(&prepared).await;
        let end = self.here.now();
        let mut results = Vec::with_capacity(decided.len());
        for (index, (d, p)) in decided.into_iter().zip(&prepared).enumerate() {
            match d {
                Ok(a) => results.push(self.outcome(a, p, end)),
                // The routing gave back whatever the others took.
                Err(error) => return Err(AllError::Item { index, error }),
            }
        }
        self.metrics.all_duration.observe(seconds(start, end));
        Ok(decide(results))
    }
}

/// The request's decision from its checks' outcomes.
pub fn decide(results: Vec<Outcome>) -> AllOutcome {
    let enforced = |o: &&Outcome| o.shadow_denied.is_none();
    let allowed = results.iter().all(|o| o.answer.allowed);
    let pick = |list: &mut dyn Iterator<Item = (usize, &Outcome)>| {
        if allowed {
            list.min_by_key(|(_, o)| o.answer.remaining).map(|(i, _)| i)
        } else {
            list.filter(|(_, o)| !o.answer.allowed)
                .max_by_key(|(_, o)| o.answer.retry_after_ms)
                .map(|(i, _)| i)
        }
    };
    let binding = pick(&mut results.iter().enumerate().filter(|(_, o)| enforced(o)))
        .or_else(|| pick(&mut results.iter().enumerate()))
        .unwrap_or(0);
    AllOutcome {
        allowed,
        binding,
        degraded: results.iter().any(|o| o.answer.degraded),
        results,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_proto::CheckAnswer;

    fn o(allowed: bool, remaining: u64, retry: u64, shadow: Option<bool>) -> Outcome {
        Outcome {
            answer: CheckAnswer {
                allowed,
                limit: 10,
                remaining,
                reset_at_ms: 0,
                retry_after_ms: retry,
                degraded: false,
            },
            shadow_denied: shadow,
            period_ms: 1000,
            now_ms: 0,
        }
    }

    #[test]
    fn the_binding_limit_is_the_longest_wait_when_denied_and_the_least_room_when_admitted() {
        let denied = decide(vec![
            o(true, 1, 0, None),
            o(false, 0, 500, None),
            o(false, 0, 1200, None),
            o(true, 0, 0, Some(true)),
        ]);
        assert!(!denied.allowed);
        assert_eq!(denied.binding, 2);

        // A shadow rule with less room does not bind an admitted request.
        let admitted = decide(vec![
            o(true, 7, 0, None),
            o(true, 0, 0, Some(true)),
            o(true, 3, 0, None),
        ]);
        assert!(admitted.allowed);
        assert_eq!(admitted.binding, 2);

        // Only shadow rules: the least room among them.
        let shadows = decide(vec![o(true, 4, 0, Some(false)), o(true, 2, 0, Some(true))]);
        assert!(shadows.allowed);
        assert_eq!(shadows.binding, 1);
    }
}
