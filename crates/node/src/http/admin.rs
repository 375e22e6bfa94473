//! The admin API, `/v1/admin/*`: the rules in force and where they came from, a key's state read
//! without consuming, and a key's reset across the cluster.
//!
//! It is off unless `RINGLIMIT_ADMIN_TOKEN` is set (its paths then answer 404, like any unknown
//! path); when on, every request needs `Authorization: Bearer <token>`, compared in constant time,
//! or gets 401 with the contract's error body. Reads and resets go through the same routing and
//! peer port as checks (see [`crate::admin::keys`]), so they see exactly the buckets that
//! checks see.

use super::AppState;
use super::check::RuleFields;
use super::error::{ApiError, sentence};
use crate::rules::RuleSpec;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The admin bearer token, kept as its SHA-256 digest: comparing digests in constant time
/// reveals neither the token's bytes nor its length through timing.
pub struct AdminToken([u8; 32]);

impl AdminToken {
    pub fn new(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `given` is the token.
    pub fn matches(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        self.0.ct_eq(&given).into()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|t| !t.is_empty())
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"ringlimit admin\""),
    );
    r
}

/// In front of every admin route: 404 when the admin API is off, 401 without the token.
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.admin_token else {
        return super::ops::not_found().await.into_response();
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()));
    match given {
        None => unauthorized("The admin API needs an `Authorization: Bearer <token>` header."),
        Some(g) if !token.matches(g) => unauthorized("The bearer token is not the admin token."),
        Some(_) => next.run(req).await,
    }
}

/// `GET /v1/admin/rules`: the rules in force (as `GET /v1/rules`), their source and reloads.
pub async fn rules(State(state): State<AppState>) -> Response {
    axum::Json(state.admin.admin_rules()).into_response()
}

/// The rule of an admin key request, as query parameters with the check body's names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleQuery {
    rule: Option<String>,
    limit: Option<u64>,
    period_ms: Option<u64>,
    algorithm: Option<String>,
    burst: Option<u64>,
}

impl RuleQuery {
    fn spec(&self) -> Result<RuleSpec<'_>, ApiError> {
        RuleFields {
            rule: self.rule.as_deref(),
            limit: self.limit,
            period_ms: self.period_ms,
            algorithm: self.algorithm.as_deref(),
            burst: self.burst,
        }
        .spec()
    }
}

/// A malformed query string is the contract's 400 `invalid_request`, like a malformed body.
impl<S: Send + Sync> FromRequestParts<S> for RuleQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<RuleQuery>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| q)
            .map_err(|e| ApiError::bad_request("invalid_request", sentence(e.body_text())))
    }
}

/// `GET /v1/admin/keys/{key}?rule=NAME` (or inline rule parameters): the key's bucket, owner and
/// state, read with a cost-0 check routed like any check (degraded when the owner is away).
pub async fn key_state(
    State(state): State<AppState>,
    Path(key): Path<String>,
    q: RuleQuery,
) -> Response {
    json(async { Ok(state.admin.key_state(&key, q.spec()?).await?) }.await)
}

/// `POST /v1/admin/keys/{key}/reset?rule=NAME`: drops the key's bucket and its fallback buckets
/// on every member. 200 whatever the members answer: each member's result is in the body.
pub async fn reset(
    State(state): State<AppState>,
    Path(key): Path<String>,
    q: RuleQuery,
) -> Response {
    json(async { Ok(state.admin.reset(&key, q.spec()?).await?) }.await)
}

/// 200 with the body as JSON, or the error's answer.
fn json<T: serde::Serialize>(body: Result<T, ApiError>) -> Response {
    match body {
        Ok(b) => axum::Json(b).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_parsed_and_compared() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
        let t = AdminToken::new("s3cret");
        assert!(t.matches(b"s3cret"));
        assert!(!t.matches(b"s3cre"));
        assert!(!t.matches(b"s3cret2"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "AdminToken(..)");
    }
}
