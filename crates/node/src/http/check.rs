//! `POST /v1/check` and `POST /v1/check/batch`: parse strictly, decide, answer with headers.
//!
//! Bodies are parsed by hand from bytes (not axum's `Json`) so that every malformed input maps
//! to the contract's error codes, with the path of the offending field in the message.

use super::error::{ApiError, ErrorBody, sentence};
use super::{AppState, MAX_BODY_BYTES};
use crate::engine::RuleSpec;
use crate::metrics::seconds;
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
    /// The rule this body names, checked for the contract's "one of rule or limit+period_ms".
    fn spec(&self) -> Result<RuleSpec<'_>, ApiError> {
        rule_spec(
            self.rule.as_deref(),
            self.limit,
            self.period_ms,
            self.algorithm.as_deref(),
            self.burst,
        )
    }
}

/// The rule that a check's fields name: `rule`, or an inline rule — one of them, not both.
/// Shared by check bodies and the admin API's query strings, so both refuse alike.
pub(super) fn rule_spec<'a>(
    rule: Option<&'a str>,
    limit: Option<u64>,
    period_ms: Option<u64>,
    algorithm: Option<&str>,
    burst: Option<u64>,
) -> Result<RuleSpec<'a>, ApiError> {
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
    let spec = body.spec()?;
    let p = state
        .router
        .prepare(&body.key, spec, body.cost.unwrap_or(1))?;
    let answer = state.router.route(&p).await?;
    state.metrics.count(answer.allowed, p.resolved.mode);
    Ok(answer)
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
    let clock = state.router.engine().clock();
    let start = clock.now();
    match decide(state, &bytes).await {
        Ok(answer) => {
            let response = answer_response(&answer);
            state
                .metrics
                .check_duration
                .observe(seconds(start, clock.now()));
            response
        }
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
    let clock = state.router.engine().clock();
    let start = clock.now();
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
    // Parse every item first (borrowing from the body), then route them all at once so that
    // each owner's checks travel as one group.
    let bodies: Vec<Result<CheckBody<'_>, ApiError>> = batch
        .checks
        .iter()
        .map(|raw| parse(raw.get().as_bytes()))
        .collect();
    let mut results: Vec<Option<BatchItem>> = Vec::with_capacity(bodies.len());
    let mut prepared = Vec::with_capacity(bodies.len());
    for body in &bodies {
        let item = body.as_ref().map_err(Clone::clone).and_then(|b| {
            let spec = b.spec()?;
            Ok(state.router.prepare(&b.key, spec, b.cost.unwrap_or(1))?)
        });
        match item {
            Ok(p) => {
                results.push(None);
                prepared.push(p);
            }
            Err(e) => results.push(Some(BatchItem::Error(e.body))),
        }
    }
    let mut decided = state
        .router
        .check_many(&prepared)
        .await
        .into_iter()
        .zip(prepared.iter().map(|p| p.resolved.mode));
    let results: Vec<BatchItem> = results
        .into_iter()
        .map(|slot| match slot {
            Some(error) => error,
            None => match decided.next() {
                Some((Ok(a), mode)) => {
                    state.metrics.count(a.allowed, mode);
                    BatchItem::Answer(a)
                }
                Some((Err(e), _)) => BatchItem::Error(ApiError::from(e).body),
                None => BatchItem::Error(ErrorBody {
                    error: "internal",
                    message: "No answer was produced for this check.".into(),
                }),
            },
        })
        .collect();
    let response = axum::Json(BatchAnswer { results }).into_response();
    state
        .metrics
        .batch_duration
        .observe(seconds(start, clock.now()));
    response
}
