//! `/v1/admin/rules/{name}`: rules written, read and deleted through the admin API (behind the
//! admin tokens, see [`super::admin`]). The body of a `PUT` is a JSON object of the rules file's
//! fields; the name comes from the path. Whatever node takes the request, the change is decided
//! at the member that owns the name ([`crate::admin::api_rules`]), so a read or a change right
//! after a change through another node sees it. `If-Match` (a rule's `version`, as its `ETag`)
//! makes a change conditional: 412 `version_mismatch` when the rule changed since.

use super::AppState;
use super::admin::AdminCaller;
use super::check::read_body;
use super::error::{ApiError, sentence};
use crate::admin::api_rules::{AdminRule, RuleRequest, RuleRequestError};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

fn request_error(e: RuleRequestError) -> ApiError {
    match e {
        RuleRequestError::Refused(code, message) => {
            let status = match code.as_str() {
                "rule_from_file" => StatusCode::CONFLICT,
                "unknown_rule" => StatusCode::NOT_FOUND,
                "not_saved" => StatusCode::SERVICE_UNAVAILABLE,
                "version_mismatch" => StatusCode::PRECONDITION_FAILED,
                _ => StatusCode::BAD_REQUEST,
            };
            // The code came from a book's refusals (here or at a peer): a known one, kept.
            let code: &'static str = match code.as_str() {
                "rule_from_file" => "rule_from_file",
                "unknown_rule" => "unknown_rule",
                "not_saved" => "not_saved",
                "version_mismatch" => "version_mismatch",
                "invalid_json" => "invalid_json",
                _ => "invalid_rule",
            };
            ApiError::new(status, code, sentence(message))
        }
        RuleRequestError::Unavailable(message) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }
}

/// The `If-Match` header, if any (a value that is not text is taken as naming no version).
fn if_match(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::IF_MATCH)
        .map(|v| v.to_str().unwrap_or("\"\""))
}

/// 200 with the rule as listed, and its version as the `ETag`.
fn listed(rule: AdminRule) -> Response {
    let etag = rule
        .version
        .as_ref()
        .and_then(|v| HeaderValue::from_str(&format!("\"{v}\"")).ok());
    let mut r = axum::Json(rule).into_response();
    if let Some(etag) = etag {
        r.headers_mut().insert(header::ETAG, etag);
    }
    r
}

/// `PUT /v1/admin/rules/{name}`: creates or replaces the API rule; 200 with the rule as listed.
pub async fn put(
    State(state): State<AppState>,
    Extension(caller): Extension<AdminCaller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let bytes = read_body(&state, body).await?;
        let spec: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(
                "invalid_json",
                sentence(format!("Body is not valid JSON: {e}")),
            )
        })?;
        let req = RuleRequest {
            name: &name,
            if_match: if_match(&headers),
            by: &caller.name,
        };
        state
            .admin
            .put_rule(&req, &spec)
            .await
            .map_err(request_error)
    }
    .await;
    match result {
        Ok(rule) => listed(rule),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/admin/rules/{name}`: deletes the API rule; 204.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<AdminCaller>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let req = RuleRequest {
        name: &name,
        if_match: if_match(&headers),
        by: &caller.name,
    };
    match state.admin.delete_rule(&req).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => request_error(e).into_response(),
    }
}

/// `GET /v1/admin/rules/{name}`: the rule in force by that name, with its source.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<AdminCaller>,
    Path(name): Path<String>,
) -> Response {
    match state.admin.admin_rule(&name, &caller.name).await {
        Some(rule) => listed(rule),
        None => request_error(RuleRequestError::Refused(
            "unknown_rule".into(),
            format!("No rule {name:?} is in force."),
        ))
        .into_response(),
    }
}
