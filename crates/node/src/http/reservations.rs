//! `POST /v1/reserve` and `POST /v1/settle`: a check of an estimated cost kept at the bucket's
//! owner, and its settle with the actual cost (see [`crate::service::reservations`]). Parsed like
//! checks (the same fields, validation and errors), answered with the same headers.

use super::AppState;
use super::answer_json;
use super::check::{CheckBody, answer_response, header_map, parse, policy, read_body};
use super::error::{ApiError, sentence};
use crate::service::Edge;
use crate::service::reservations::Reservation;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ringlimit_core::headers::inline_policy_name;
use ringlimit_core::reservations::ReserveError;
use ringlimit_proto::RuleRef;
use serde::Deserialize;
use std::borrow::Cow;

/// `POST /v1/reserve`'s body: a check's fields and `ttl_ms`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveBody<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow, default)]
    rule: Option<Cow<'a, str>>,
    #[serde(default)]
    limit: Option<u64>,
    #[serde(default)]
    period_ms: Option<u64>,
    #[serde(borrow, default)]
    algorithm: Option<Cow<'a, str>>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(borrow, default)]
    period: Option<Cow<'a, str>>,
    #[serde(default)]
    calendar: Option<bool>,
    #[serde(borrow, default)]
    timezone: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<u64>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

impl<'a> ReserveBody<'a> {
    /// The check it holds, and its `ttl_ms`.
    fn split(self) -> (CheckBody<'a>, Option<u64>) {
        let check = CheckBody {
            key: self.key,
            rule: self.rule,
            limit: self.limit,
            period_ms: self.period_ms,
            algorithm: self.algorithm,
            burst: self.burst,
            period: self.period,
            calendar: self.calendar,
            timezone: self.timezone,
            cost: self.cost,
        };
        (check, self.ttl_ms)
    }
}

/// `POST /v1/settle`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody<'a> {
    #[serde(borrow)]
    reservation: Cow<'a, str>,
    cost: u64,
}

impl From<ReserveError> for ApiError {
    fn from(e: ReserveError) -> Self {
        let status = match &e {
            ReserveError::Check(c) => return ApiError::from(c.clone()),
            ReserveError::Ttl { .. } | ReserveError::NotReservable(_) => StatusCode::BAD_REQUEST,
            ReserveError::Unknown => StatusCode::NOT_FOUND,
            ReserveError::TooMany(_) | ReserveError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError::new(status, e.code(), sentence(e.to_string()))
    }
}

/// `POST /v1/reserve`.
pub async fn reserve(State(state): State<AppState>, body: Body) -> Response {
    let bytes = match read_body(&state, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    reserve_answer(&state, &bytes)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn reserve_answer(state: &AppState, bytes: &[u8]) -> Result<Response, ApiError> {
    let body: ReserveBody<'_> = parse(bytes)?;
    let (check, ttl_ms) = body.split();
    let c = check.check()?;
    let name = check.policy_name();
    Ok(match state.service.reserve(Edge::Http, &c, ttl_ms).await? {
        Reservation::Denied(o) => answer_response(&o, &name),
        Reservation::Reserved(r) => {
            let o = &r.outcome;
            let headers = header_map(&o.answer, [policy(o, &name)]);
            let json = answer_json::reserved(&r.id, r.cost, &o.answer);
            (StatusCode::OK, headers, json).into_response()
        }
    })
}

/// `POST /v1/settle`.
pub async fn settle(State(state): State<AppState>, body: Body) -> Response {
    let bytes = match read_body(&state, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    settle_answer(&state, &bytes)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn settle_answer(state: &AppState, bytes: &[u8]) -> Result<Response, ApiError> {
    let body: SettleBody<'_> = parse(bytes)?;
    let settled = state.service.settle(&body.reservation, body.cost).await?;
    let o = &settled.outcome;
    let name = match &settled.rule {
        RuleRef::Named(name) => Cow::Borrowed(name.as_str()),
        RuleRef::Inline(r) => Cow::Owned(inline_policy_name(r)),
    };
    // Settled: 200 whatever the bucket says now (in debt, it denies the next checks).
    let headers = header_map(&o.answer, [policy(o, &name)]);
    let json = answer_json::answer(&o.answer, o.shadow_denied);
    Ok((StatusCode::OK, headers, json).into_response())
}
