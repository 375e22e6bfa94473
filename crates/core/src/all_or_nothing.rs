//! One request held to several limits at once, all-or-nothing: what a node's
//! `POST /v1/check/all` and the SDK's `check_all` share — the request's errors, the shadow
//! rule's answer, and the choice of the limit that binds.

use crate::check::CheckError;
use ringlimit_proto::CheckAnswer;

/// Most checks in one all-or-nothing request.
pub const MAX_ALL: usize = 32;

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

/// The first pair of equal bucket identities in `ids` (a request may name a bucket once).
pub fn duplicate(ids: &[u64]) -> Option<AllError> {
    ids.iter().enumerate().find_map(|(second, id)| {
        ids[..second]
            .iter()
            .position(|other| other == id)
            .map(|first| AllError::Duplicate { first, second })
    })
}

/// A shadow rule's answer: always allowed (no wait), with what it would have decided.
pub fn shadowed(mut answer: CheckAnswer) -> (CheckAnswer, bool) {
    let denied = !answer.allowed;
    answer.allowed = true;
    answer.retry_after_ms = 0;
    (answer, denied)
}

/// The index of the limit that binds a request whose checks answered `answers` (shadow
/// rules' already made allowed, `shadow[i]` saying which): when denied, the denying check with
/// the longest wait; when admitted, the enforced check with the least remaining (a shadow
/// check only when every check is one).
pub fn binding(answers: &[CheckAnswer], shadow: &[bool]) -> usize {
    let allowed = answers.iter().all(|a| a.allowed);
    let pick = |enforced_only: bool| {
        let list = answers
            .iter()
            .enumerate()
            .filter(|(i, _)| !enforced_only || !shadow.get(*i).copied().unwrap_or(false));
        if allowed {
            list.min_by_key(|(_, a)| a.remaining).map(|(i, _)| i)
        } else {
            list.filter(|(_, a)| !a.allowed)
                .max_by_key(|(_, a)| a.retry_after_ms)
                .map(|(i, _)| i)
        }
    };
    pick(true).or_else(|| pick(false)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(allowed: bool, remaining: u64, retry_after_ms: u64) -> CheckAnswer {
        CheckAnswer {
            allowed,
            limit: 10,
            remaining,
            reset_at_ms: 0,
            retry_after_ms,
            degraded: false,
            replica: false,
            leased: false,
        }
    }

    #[test]
    fn the_binding_limit_is_the_longest_wait_when_denied_and_the_least_room_when_admitted() {
        let denied = [
            a(true, 1, 0),
            a(false, 0, 500),
            a(false, 0, 1200),
            a(true, 0, 0),
        ];
        assert_eq!(binding(&denied, &[false, false, false, true]), 2);
        // A shadow rule with less room does not bind an admitted request...
        let admitted = [a(true, 7, 0), a(true, 0, 0), a(true, 3, 0)];
        assert_eq!(binding(&admitted, &[false, true, false]), 2);
        // ...unless every rule is a shadow one.
        assert_eq!(binding(&[a(true, 4, 0), a(true, 2, 0)], &[true, true]), 1);
    }

    #[test]
    fn duplicates_name_both_indexes_and_a_shadow_answer_never_denies() {
        assert_eq!(duplicate(&[1, 2, 3]), None);
        assert_eq!(
            duplicate(&[1, 2, 1, 2]),
            Some(AllError::Duplicate {
                first: 0,
                second: 2
            })
        );
        let (answer, denied) = shadowed(a(false, 0, 900));
        assert!(answer.allowed && denied && answer.retry_after_ms == 0);
    }
}
