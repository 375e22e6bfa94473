//! The admin API, `/v1/admin/*`: the rules in force and where they came from, a key's state read
//! without consuming, and a key's reset across the cluster.
//!
//! It is off unless admin tokens are given (`RINGLIMIT_ADMIN_TOKEN`, `--admin-tokens`: see
//! [`crate::admin::tokens`]; its paths then answer 404, like any unknown path); when on, every
//! request needs `Authorization: Bearer <token>` or gets 401 with the contract's error body, and
//! a `read` token gets 403 `forbidden` on anything but a GET. Reads and resets go through the
//! same routing and peer port as checks (see [`crate::admin::keys`]), so they see exactly the
//! buckets that checks see.

use super::AppState;
use super::check::RuleFields;
use super::error::{ApiError, sentence};
use crate::admin::tokens::{Role, bearer};
use crate::rules::RuleSpec;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ringlimit_proto::peer::TopBy;
use serde::Deserialize;

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"ringlimit admin\""),
    );
    r
}

/// Who called the admin API: the token's name (a request extension set by [`guard`]).
#[derive(Debug, Clone)]
pub struct AdminCaller {
    pub name: String,
}

/// In front of every admin route: 404 when the admin API is off, 401 without a known token,
/// 403 for a read token on anything but a read.
pub async fn guard(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(book) = state.admin_tokens.as_ref().filter(|b| b.enabled()) else {
        return super::ops::not_found().await.into_response();
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()));
    let Some(given) = given else {
        return unauthorized("The admin API needs an `Authorization: Bearer <token>` header.");
    };
    let tokens = book.tokens();
    let Some(token) = tokens.find(given) else {
        return unauthorized("The bearer token is not an admin token.");
    };
    if token.role < Role::Read {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "Token {:?} has the check role: it is a client credential for the SDK on the \
                 peer port, not an admin token.",
                token.name
            ),
        )
        .into_response();
    }
    let reads = matches!(*req.method(), Method::GET | Method::HEAD);
    if !reads && token.role < Role::Write {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "Token {:?} has the read role; {} {} needs a write token.",
                token.name,
                req.method(),
                req.uri().path()
            ),
        )
        .into_response();
    }
    let caller = AdminCaller {
        name: token.name.clone(),
    };
    drop(tokens);
    req.extensions_mut().insert(caller);
    next.run(req).await
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
    period: Option<String>,
    calendar: Option<bool>,
    timezone: Option<String>,
}

impl RuleQuery {
    fn spec(&self) -> Result<RuleSpec<'_>, ApiError> {
        RuleFields {
            rule: self.rule.as_deref(),
            limit: self.limit,
            period_ms: self.period_ms,
            algorithm: self.algorithm.as_deref(),
            burst: self.burst,
            period: self.period.as_deref(),
            calendar: self.calendar,
            timezone: self.timezone.as_deref(),
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

/// The query of `GET /v1/admin/top`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopQuery {
    rule: String,
    by: Option<String>,
    n: Option<usize>,
}

/// `GET /v1/admin/top?rule=NAME&by=denied|checks&n=10`: the keys of the rule denied (or
/// checked) most across the live members, merged.
pub async fn top(
    State(state): State<AppState>,
    q: Result<Query<TopQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) =
            q.map_err(|e| ApiError::bad_request("invalid_request", sentence(e.body_text())))?;
        let by = match q.by.as_deref().unwrap_or("denied") {
            "denied" => TopBy::Denied,
            "checks" => TopBy::Checks,
            other => {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    format!("by must be denied or checks, not {other:?}."),
                ));
            }
        };
        let n = q.n.unwrap_or(10);
        if !(1..=crate::admin::top_keys::MAX_N).contains(&n) {
            return Err(ApiError::bad_request(
                "invalid_request",
                format!("n must be 1 to {}.", crate::admin::top_keys::MAX_N),
            ));
        }
        if q.rule.is_empty() || q.rule.len() > 512 {
            return Err(ApiError::bad_request(
                "invalid_request",
                "rule must name a rule (1 to 512 bytes).",
            ));
        }
        Ok(state.admin.top(&q.rule, by, n).await)
    }
    .await;
    json(result)
}

/// 200 with the body as JSON, or the error's answer.
fn json<T: serde::Serialize>(body: Result<T, ApiError>) -> Response {
    match body {
        Ok(b) => axum::Json(b).into_response(),
        Err(e) => e.into_response(),
    }
}
