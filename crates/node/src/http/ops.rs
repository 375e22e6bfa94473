//! Health, readiness and the JSON fallback for unknown paths.

use super::AppState;
use super::error::ApiError;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;

/// `GET /healthz`: the process serves.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: the node can answer checks.
pub async fn readyz(State(state): State<AppState>) -> Response {
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// Any other path.
pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "No such endpoint; see the API in the README.",
    )
}
