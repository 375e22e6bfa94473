//! `POST /v1/check`, `POST /v1/check/batch` and `POST /v1/check/all`: parse strictly, decide,
//! answer with headers.
//!
//! Bodies are parsed by hand from bytes (not axum's `Json`) so that every malformed input maps
//! to the contract's error codes, with the path of the offending field in the message.

use super::answer_json::{self, Item};
use super::error::{ApiError, ErrorBody, sentence};
use super::{AppState, MAX_BODY_BYTES};
use crate::rules::RuleSpec;
use crate::service::all_or_nothing::AllOutcome;
use crate::service::{Check, Edge, MAX_BATCH, Outcome};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderName;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::LengthLimitError;
use ringlimit_core::all_or_nothing::{AllError, MAX_ALL};
use ringlimit_core::headers::{
    Policy, RATELIMIT, RATELIMIT_POLICY, ietf_values, inline_policy_name, rate_values,
    retry_after_secs,
};
use ringlimit_proto::{Algorithm, CheckAnswer, InlineRule};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A check as the JSON body spells it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckBody<'a> {
    #[serde(borrow)]
    pub key: Cow<'a, str>,
    #[serde(borrow, default)]
    pub rule: Option<Cow<'a, str>>,
    #[serde(default)]
    pub limit: Option<u64>,
    #[serde(default)]
    pub period_ms: Option<u64>,
    #[serde(borrow, default)]
    pub algorithm: Option<Cow<'a, str>>,
    #[serde(default)]
    pub burst: Option<u64>,
    /// A period as the rules file writes it (`1d`, `1w`, `1mo`), instead of `period_ms`.
    #[serde(borrow, default)]
    pub period: Option<Cow<'a, str>>,
    #[serde(default)]
    pub calendar: Option<bool>,
    #[serde(borrow, default)]
    pub timezone: Option<Cow<'a, str>>,
    #[serde(default)]
    pub cost: Option<u64>,
}

impl CheckBody<'_> {
    /// The name of this check's rule in the IETF fields.
    pub(super) fn policy_name(&self) -> Cow<'_, str> {
        match (&self.rule, self.limit, self.period_ms) {
            (Some(name), ..) => Cow::Borrowed(name),
            (None, Some(limit), Some(period_ms)) => Cow::Owned(inline_policy_name(&InlineRule {
                limit,
                period_ms,
                algorithm: self
                    .algorithm
                    .as_deref()
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_default(),
                burst: self.burst,
                calendar: None,
            })),
            // A period in the rules file's words (a calendar rule's): what the check resolves.
            (None, Some(_), None) => match self.fields().spec() {
                Ok(RuleSpec::Inline(r)) => Cow::Owned(inline_policy_name(&r)),
                _ => Cow::Borrowed(""),
            },
            _ => Cow::Borrowed(""),
        }
    }

    fn fields(&self) -> RuleFields<'_> {
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
    }

    /// The check this body asks for.
    pub(super) fn check(&self) -> Result<Check<'_>, ApiError> {
        let fields = self.fields();
        Ok(Check {
            key: &self.key,
            rule: fields.spec()?,
            cost: self.cost.unwrap_or(1),
            shadow: false,
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
    /// `period` (`1d`, `1w`, `1mo`), `calendar` and `timezone`: a calendar rule's fields.
    pub period: Option<&'a str>,
    pub calendar: Option<bool>,
    pub timezone: Option<&'a str>,
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
            period,
            calendar,
            timezone,
        } = *self;
        let inline_fields = limit.is_some()
            || period_ms.is_some()
            || algorithm.is_some()
            || burst.is_some()
            || period.is_some()
            || calendar.is_some()
            || timezone.is_some();
        match (rule, inline_fields) {
            (Some(_), true) => Err(ApiError::bad_request(
                "invalid_request",
                "Give either `rule` or an inline rule (`limit`, `period_ms`, `algorithm`, `burst`), not both.",
            )),
            (Some(name), false) => Ok(RuleSpec::Named(name)),
            (None, _) => {
                let (Some(limit), Some(_)) = (limit, period_ms.or(period.map(|_| 0))) else {
                    return Err(ApiError::bad_request(
                        "invalid_request",
                        "A check needs either `rule` or both `limit` and `period_ms` (or `period`).",
                    ));
                };
                let algorithm = match algorithm {
                    None => Algorithm::default(),
                    Some(a) => a.parse().map_err(|e: ringlimit_proto::UnknownAlgorithm| {
                        ApiError::bad_request("unknown_algorithm", sentence(e.to_string()))
                    })?,
                };
                let (period_ms, calendar) = match (period_ms, period) {
                    (Some(ms), None) if calendar.is_none() && timezone.is_none() => (ms, None),
                    (Some(_), Some(_)) => {
                        return Err(ApiError::bad_request(
                            "invalid_request",
                            "Give either `period_ms` or `period`, not both.",
                        ));
                    }
                    _ => crate::rules::inline_period(
                        algorithm,
                        period_ms.unwrap_or(0),
                        period,
                        calendar.unwrap_or(false),
                        timezone,
                    )
                    .map_err(|e| ApiError::bad_request(e.code(), sentence(e.to_string())))?,
                };
                Ok(RuleSpec::Inline(InlineRule {
                    limit,
                    period_ms,
                    algorithm,
                    burst,
                    calendar,
                }))
            }
        }
    }
}

/// Parses a JSON body. The fast path is plain `serde_json`; only a body that fails is parsed
/// again with path tracking, so that the error names the offending field at no cost to the
/// valid requests that are nearly all of the traffic.
pub(super) fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
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

async fn decide(state: &AppState, bytes: &[u8]) -> Result<Response, ApiError> {
    decide_with(state, bytes, answer_response).await
}

/// Decides the `POST /v1/check` body `bytes` and gives `answer` the outcome and its rule's
/// name in the IETF fields.
pub(super) async fn decide_with<R>(
    state: &AppState,
    bytes: &[u8],
    answer: impl FnOnce(&Outcome, &str) -> R,
) -> Result<R, ApiError> {
    let body: CheckBody<'_> = parse(bytes)?;
    let outcome = state.service.check(Edge::Http, &body.check()?).await?;
    Ok(answer(&outcome, &body.policy_name()))
}

/// Reads a request body of at most [`MAX_BODY_BYTES`], within the body timeout: a body that
/// stalls would otherwise hold its connection busy (never idle, never evictable) for ever.
pub(super) async fn read_body(state: &AppState, body: Body) -> Result<Bytes, ApiError> {
    let Ok(read) = tokio::time::timeout(
        state.body_timeout,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await
    else {
        return Err(ApiError::body_timeout(state.body_timeout));
    };
    read.map_err(|e| {
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
    let bytes = match read_body(state, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    decide(state, &bytes)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The contract's answer: 200 or 429, JSON body, `X-RateLimit-*` and `Retry-After` headers, and
/// the IETF fields for the rule `name`.
pub fn answer_response(o: &Outcome, name: &str) -> Response {
    (
        answer_status(o),
        header_map(&o.answer, [policy(o, name)]),
        answer_json::answer_with(&o.answer, o.shadow_denied, o.blocked),
    )
        .into_response()
}

/// The status of [`answer_response`].
pub(super) fn answer_status(o: &Outcome) -> StatusCode {
    status(o.answer.allowed)
}

/// The headers of an answer `a` to the limits `policies`, in order, given to `emit`: content
/// type, `X-RateLimit-*`, `Retry-After` when denied, the IETF fields. The check loop writes
/// them straight to the wire (`h1.rs`), the routes into a header map ([`header_map`]).
pub(super) fn answer_headers<'a>(
    a: &CheckAnswer,
    policies: impl IntoIterator<Item = Policy<'a>>,
    mut emit: impl FnMut(HeaderName, &[u8]),
) {
    emit(header::CONTENT_TYPE, b"application/json");
    let mut n = itoa::Buffer::new();
    for (h, v) in rate_values(a) {
        emit(h, n.format(v).as_bytes());
    }
    if !a.allowed {
        emit(
            header::RETRY_AFTER,
            n.format(retry_after_secs(a)).as_bytes(),
        );
    }
    let (mut p, mut s) = (String::with_capacity(64), String::with_capacity(64));
    ietf_values(&mut p, &mut s, policies);
    emit(RATELIMIT_POLICY, p.as_bytes());
    emit(RATELIMIT, s.as_bytes());
}

/// [`answer_headers`] as a header map.
pub(super) fn header_map<'a>(
    a: &CheckAnswer,
    policies: impl IntoIterator<Item = Policy<'a>>,
) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(7);
    answer_headers(a, policies, |h, v| {
        if let Ok(v) = HeaderValue::from_bytes(v) {
            headers.append(h, v);
        }
    });
    headers
}

/// The IETF fields' description of `o`, the answer of the rule named `name`.
pub(super) fn policy<'a>(o: &'a Outcome, name: &'a str) -> Policy<'a> {
    Policy {
        name,
        period_ms: o.period_ms,
        answer: &o.answer,
        now_ms: o.now_ms,
    }
}

fn status(allowed: bool) -> StatusCode {
    if allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    #[serde(borrow)]
    checks: Vec<&'a RawValue>,
}

/// A batch whose every item parses, in one pass: the common case. When one does not, the batch
/// is parsed again as [`BatchBody`], item by item, so that each bad item gets its own error
/// (the two passes were a large share of a batch's CPU time in `perf` under `bench/cpu.sh`'s
/// load: the docs' benchmarks page, "Server CPU per check, by path").
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypedBatch<'a> {
    #[serde(borrow)]
    checks: Vec<CheckBody<'a>>,
}

/// `POST /v1/check/batch`.
pub async fn batch(State(state): State<AppState>, body: Body) -> Response {
    let bytes = match read_body(&state, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    batch_answer(&state, &bytes).await
}

/// The answer to a `POST /v1/check/batch` whose body is `bytes`.
pub(super) async fn batch_answer(state: &AppState, bytes: &[u8]) -> Response {
    // Parse every item first (borrowing from the body), then decide them all at once so that
    // each owner's checks travel as one group.
    let bodies: Vec<Result<CheckBody<'_>, ApiError>> =
        match serde_json::from_slice::<TypedBatch<'_>>(bytes) {
            Ok(batch) => batch.checks.into_iter().map(Ok).collect(),
            Err(_) => match parse::<BatchBody<'_>>(bytes) {
                Ok(batch) => batch
                    .checks
                    .iter()
                    .map(|raw| parse(raw.get().as_bytes()))
                    .collect(),
                Err(e) => return e.into_response(),
            },
        };
    if bodies.is_empty() || bodies.len() > MAX_BATCH {
        return ApiError::bad_request(
            "invalid_batch",
            format!(
                "`checks` must hold 1 to {MAX_BATCH} checks, got {}.",
                bodies.len()
            ),
        )
        .into_response();
    }
    let mut results: Vec<Option<Item>> = Vec::with_capacity(bodies.len());
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
            Err(e) => results.push(Some(Item::Error(e.body))),
        }
    }
    let decided = state.service.check_many(Edge::Http, &checks).await;
    let mut decided = decided.iter();
    let results: Vec<Item> = results
        .into_iter()
        .map(|slot| match slot {
            Some(error) => error,
            None => match decided.next() {
                Some(Ok(o)) => match o.blocked {
                    Some(b) => Item::Blocked(&o.answer, o.shadow_denied, b),
                    None => Item::Answer(&o.answer, o.shadow_denied),
                },
                Some(Err(e)) => Item::Error(ApiError::from(e.clone()).body),
                None => Item::Error(ErrorBody {
                    error: "internal",
                    message: "No answer was produced for this check.".into(),
                }),
            },
        })
        .collect();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        answer_json::batch(&results),
    )
        .into_response()
}

/// `POST /v1/check/all` as the body spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AllBody<'a> {
    #[serde(borrow)]
    checks: Vec<&'a RawValue>,
}

/// `POST /v1/check/all`: every check of one request, all-or-nothing.
pub async fn all(State(state): State<AppState>, body: Body) -> Response {
    let bytes = match read_body(&state, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    all_answer(&state, &bytes).await
}

/// The answer to a `POST /v1/check/all` whose body is `bytes`.
pub(super) async fn all_answer(state: &AppState, bytes: &[u8]) -> Response {
    decide_all(state, bytes)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn decide_all(state: &AppState, bytes: &[u8]) -> Result<Response, ApiError> {
    let all: AllBody<'_> = parse(bytes)?;
    if all.checks.is_empty() || all.checks.len() > MAX_ALL {
        return Err(all_error(AllError::Count(all.checks.len())));
    }
    let item = |index: usize, e: ApiError| {
        ApiError::bad_request(
            e.body.error,
            sentence(format!("Check {index}: {}", e.body.message)),
        )
    };
    let mut bodies = Vec::with_capacity(all.checks.len());
    for (index, raw) in all.checks.iter().enumerate() {
        bodies.push(parse::<CheckBody<'_>>(raw.get().as_bytes()).map_err(|e| item(index, e))?);
    }
    let mut checks = Vec::with_capacity(bodies.len());
    for (index, body) in bodies.iter().enumerate() {
        checks.push(body.check().map_err(|e| item(index, e))?);
    }
    let outcome = state
        .service
        .check_all(Edge::Http, &checks)
        .await
        .map_err(all_error)?;
    let names: Vec<Cow<'_, str>> = bodies.iter().map(CheckBody::policy_name).collect();
    Ok(all_response(&outcome, &names))
}

/// An all-or-nothing request's error: 404 for an unknown rule, like a single check; else 400,
/// the message naming the check.
pub(super) fn all_error(e: AllError) -> ApiError {
    let status = match &e {
        AllError::Item { error, .. } => ApiError::from(error.clone()).status,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::new(status, e.code(), sentence(e.to_string()))
}

/// 200 or 429 with the binding limit's fields and headers, the IETF fields of every limit,
/// and every check's answer.
pub(super) fn all_response(o: &AllOutcome, names: &[Cow<'_, str>]) -> Response {
    let binding = &o.results[o.binding].answer;
    let top = CheckAnswer {
        allowed: o.allowed,
        degraded: o.degraded,
        ..*binding
    };
    let headers = header_map(&top, o.results.iter().zip(names).map(|(r, n)| policy(r, n)));
    let json = answer_json::all_with(
        &top,
        o.results[o.binding].blocked.filter(|_| !o.allowed),
        o.results
            .iter()
            .map(|r| (&r.answer, r.shadow_denied, r.blocked)),
    );
    (status(o.allowed), headers, json).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::Local;
    use crate::rules::RuleSet;
    use ringlimit_core::clock::{Clock, ManualClock};
    use ringlimit_core::coordinator::Here;
    use std::sync::Arc;

    /// The `RateLimit` field answering one inline check of `cost` on a fresh bucket, decided
    /// at an instant that is not a whole millisecond (as a real clock reads).
    fn ratelimit_field(limit: u64, period_ms: u64, cost: u64) -> String {
        let clock = ManualClock::new(1_700_000_000_123_456_789);
        let local = Local::alone(RuleSet::builtin(), 100, Arc::new(clock.clone()));
        let inline = InlineRule {
            limit,
            period_ms,
            algorithm: Algorithm::default(),
            burst: None,
            calendar: None,
        };
        let spec = RuleSpec::Inline(inline);
        let p = local.rules().prepare_check("k", spec, cost).expect("valid");
        let answer = local.decide(&p);
        let outcome = Outcome::new(answer, &p.resolved, clock.now());
        let name = inline_policy_name(&inline);
        let headers = header_map(&outcome.answer, [policy(&outcome, &name)]);
        headers[RATELIMIT].to_str().expect("ASCII").to_owned()
    }

    /// Regression: `t` was one second high (`reset_at_ms` rounded up, the answer's time rounded
    /// down, then the difference rounded up again).
    #[test]
    fn ietf_t_is_the_seconds_until_reset_rounded_up_once() {
        assert_eq!(ratelimit_field(1, 1000, 1), r#""1-per-1000ms";r=0;t=1"#);
        assert_eq!(ratelimit_field(5, 5000, 5), r#""5-per-5000ms";r=0;t=5"#);
    }
}
