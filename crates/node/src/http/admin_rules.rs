//! `/v1/admin/rules/{name}`: rules written, read and deleted through the admin API (behind the
//! admin token, see [`super::admin`]). The body of a `PUT` is a JSON object of the rules file's
//! fields; the name comes from the path.

use super::AppState;
use super::check::read_body;
use super::error::{ApiError, sentence};
use crate::rules::book::ChangeError;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Who changed a rule, for the log: the admin token is one shared secret, so "admin".
const WHO: &str = "admin";

fn change_error(e: ChangeError) -> ApiError {
    let (status, code) = match &e {
        ChangeError::FromFile(_) => (StatusCode::CONFLICT, "rule_from_file"),
        ChangeError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_rule"),
        ChangeError::NotFound(_) => (StatusCode::NOT_FOUND, "unknown_rule"),
        ChangeError::Persist(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_saved"),
    };
    ApiError::new(status, code, sentence(e.to_string()))
}

/// `PUT /v1/admin/rules/{name}`: creates or replaces the API rule; 200 with the rule as listed.
pub async fn put(State(state): State<AppState>, Path(name): Path<String>, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&state, body).await?;
        let spec: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(
                "invalid_json",
                sentence(format!("Body is not valid JSON: {e}")),
            )
        })?;
        state.admin.put_rule(&name, spec, WHO).map_err(change_error)
    }
    .await;
    match result {
        Ok(rule) => axum::Json(rule).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/admin/rules/{name}`: deletes the API rule; 204.
pub async fn delete(State(state): State<AppState>, Path(name): Path<String>) -> Response {
    match state.admin.delete_rule(&name, WHO) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => change_error(e).into_response(),
    }
}

/// `GET /v1/admin/rules/{name}`: the rule in force by that name, with its source.
pub async fn get(State(state): State<AppState>, Path(name): Path<String>) -> Response {
    match state.admin.admin_rule(&name) {
        Some(rule) => axum::Json(rule).into_response(),
        None => change_error(ChangeError::NotFound(name)).into_response(),
    }
}
