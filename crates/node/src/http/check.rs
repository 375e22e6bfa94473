//! `POST /v1/check` and `POST /v1/check/batch`: parse strictly, decide, answer with headers.
//!
//! Bodies are parsed by hand from bytes (not axum's `Json`) so that every malformed input maps
//! to the contract's error codes, with the path of the offending field in the message.

use super::error::{ApiError, ErrorBody, sentence};
use super::{AppState, MAX_BODY_BYTES};
use crate::engine::RuleSpec;
use crate::service::Check;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::LengthLimitError;
use ringlimit_core::headers::{rate_headers, retry_after};
use ringlimit_proto::{Algorithm, CheckAnswer, InlineRule};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Most checks in one batch.
pub const MAX_BATCH: usize = 1000;

/// A check as the JSON body spells it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody<'a> {
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
    #[serde(default)]
    cost: Option<u64>,
}

impl CheckBody<'_> {
    /// The check this body asks for.
    fn check(&self) -> Result<Check<'_>, ApiError> {
        let fields = RuleFields {
            rule: self.rule.as_deref(),
            limit: self.limit,
            period_ms: self.period_ms,
            algorithm: self.algorithm.as_deref(),
            burst: self.burst,
        };
        Ok(Check {
            key: &self.key,
            rule: fields.spec()?,
            cost: self.cost.unwrap_or(1),
        })
    }
}

/// The fields that name a check's rule, as check bodies and the admin API's query strings
/// spell them (so both refuse alike).
pub(super) struct RuleFields<'a> {
    pub rule: Option<&'a str>,
    pub limit: Option<u64>,
    pub period_ms: Option<u64>,
    pub algorithm: Option<&'a str>,
    pub burst: Option<u64>,
}

impl<'a> RuleFields<'a> {
    /// The rule named: `rule`, or an inline rule — one of them, not both.
    pub fn spec(&self) -> Result<RuleSpec<'a>, ApiError> {
        let RuleFields {
            rule,
            limit,
            period_ms,
            algorithm,
            burst,
        } = *self;
        let inline_fields =
            limit.is_some() || period_ms.is_some() || algorithm.is_some() || burst.is_some();
        match (rule, inline_fields) {
            (Some(_), true) => Err(ApiError::bad_request(
                "invalid_request",
                "Give either `rule` or an inline rule (`limit`, `period_ms`, `algorithm`, `burst`), not both.",
            )),
            (Some(name), false) => Ok(RuleSpec::Named(name)),
            (None, _) => {
                let (Some(limit), Some(period_ms)) = (limit, period_ms) else {
                    return Err(ApiError::bad_request(
                        "invalid_request",
                        "A check needs either `rule` or both `limit` and `period_ms`.",
                    ));
                };
                let algorithm = match algorithm {
                    None => Algorithm::default(),
                    Some(a) => a.parse().map_err(|e: ringlimit_proto::UnknownAlgorithm| {
                        ApiError::bad_request("unknown_algorithm", sentence(e.to_string()))
                    })?,
                };
                Ok(RuleSpec::Inline(InlineRule {
                    limit,
                    period_ms,
                    algorithm,
                    burst,
                }))
            }
        }
    }
}

/// Parses a JSON body. The fast path is plain `serde_json`; only a body that fails is parsed
/// again with path tracking, so that the error names the offending field at no cost to the
/// valid requests that are nearly all of the traffic.
fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|_| explain::<T>(bytes))
}

fn explain<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> ApiError {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let err = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        // Parsed after all: what failed was the trailing input.
        Ok(_) => match de.end() {
            Err(e) => e,
            Ok(()) => return ApiError::bad_request("invalid_json", "Body is not valid JSON."),
        },
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.classify() == serde_json::error::Category::Data {
                let message = if path == "." {
                    inner.to_string()
                } else {
                    format!("Field `{path}`: {inner}")
                };
                return ApiError::bad_request("invalid_request", sentence(message));
            }
            inner
        }
    };
    ApiError::bad_request(
        "invalid_json",
        sentence(format!("Body is not valid JSON: {err}")),
    )
}

async fn decide(state: &AppState, bytes: &[u8]) -> Result<CheckAnswer, ApiError> {
    let body: CheckBody<'_> = parse(bytes)?;
    Ok(state.service.check(&body.check()?).await?)
}

/// Reads a request body of at most [`MAX_BODY_BYTES`].
async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            let e = e.into_inner();
            if e.is::<LengthLimitError>() {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "The request body is over the 1 MiB limit.",
                )
            } else {
                ApiError::bad_request(
                    "invalid_body",
                    sentence(format!("Failed to read the request body: {e}")),
                )
            }
        })
}

/// `POST /v1/check` as a route. The node answers it through [`super::fast::FastPath`]; the
/// route stays so that the router still knows the path (another method gets 405, not 404).
pub async fn check(State(state): State<AppState>, body: Body) -> Response {
    check_request(&state, body).await
}

/// `POST /v1/check`: read, decide, answer.
pub async fn check_request(state: &AppState, body: Body) -> Response {
    let bytes = match read_body(body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match decide(state, &bytes).await {
        Ok(answer) => answer_response(&answer),
        Err(e) => e.into_response(),
    }
}

/// The contract's answer: 200 or 429, JSON body, `X-RateLimit-*` and `Retry-After` headers.
pub fn answer_response(a: &CheckAnswer) -> Response {
    let status = if a.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let body = serde_json::to_vec(a).unwrap_or_default();
    let mut headers = HeaderMap::with_capacity(5);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    rate_headers(&mut headers, a);
    if !a.allowed {
        retry_after(&mut headers, a);
    }
    (status, headers, body).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    #[serde(borrow)]
    checks: Vec<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum BatchItem {
    Answer(CheckAnswer),
    Error(ErrorBody),
}

#[derive(Serialize)]
struct BatchAnswer {
    results: Vec<BatchItem>,
}

/// `POST /v1/check/batch`.
pub async fn batch(State(state): State<AppState>, body: Body) -> Response {
    let bytes = match read_body(body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let batch: BatchBody<'_> = match parse(&bytes) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if batch.checks.is_empty() || batch.checks.len() > MAX_BATCH {
        return ApiError::bad_request(
            "invalid_batch",
            format!(
                "`checks` must hold 1 to {MAX_BATCH} checks, got {}.",
                batch.checks.len()
            ),
        )
        .into_response();
    }
    // Parse every item first (borrowing from the body), then decide them all at once so that
    // each owner's checks travel as one group.
    let bodies: Vec<Result<CheckBody<'_>, ApiError>> = batch
        .checks
        .iter()
        .map(|raw| parse(raw.get().as_bytes()))
        .collect();
    let mut results: Vec<Option<BatchItem>> = Vec::with_capacity(bodies.len());
    let mut checks = Vec::with_capacity(bodies.len());
    for body in &bodies {
        match body
            .as_ref()
            .map_err(Clone::clone)
            .and_then(CheckBody::check)
        {
            Ok(c) => {
                results.push(None);
                checks.push(c);
            }
            Err(e) => results.push(Some(BatchItem::Error(e.body))),
        }
    }
    let mut decided = state.service.check_many(&checks).await.into_iter();
    let results: Vec<BatchItem> = results
        .into_iter()
        .map(|slot| match slot {
            Some(error) => error,
            None => match decided.next() {
                Some(Ok(a)) => BatchItem::Answer(a),
                Some(Err(e)) => BatchItem::Error(ApiError::from(e).body),
                None => BatchItem::Error(ErrorBody {
                    error: "internal",
                    message: "No answer was produced for this check.".into(),
                }),
            },
        })
        .collect();
    axum::Json(BatchAnswer { results }).into_response()
}
