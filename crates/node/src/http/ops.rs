//! Health, readiness, cluster and rules views, and the JSON fallback for unknown paths.

use super::AppState;
use super::error::ApiError;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// `GET /healthz`: the process serves.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: the node can answer checks.
pub async fn readyz(State(state): State<AppState>) -> Response {
    if state.lifecycle.is_ready() {
        match state.admin.readiness_note() {
            // Ready all the same: windows follow the cluster's clock, not this node's.
            Some(note) => (StatusCode::OK, format!("ready\n{note}")).into_response(),
            None => (StatusCode::OK, "ready\n").into_response(),
        }
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

/// `GET /v1/cluster`: this node's view of the cluster.
pub async fn cluster(State(state): State<AppState>) -> Response {
    axum::Json(state.admin.cluster()).into_response()
}

/// `GET /v1/rules`: the rules in force here (what the SDK routes and falls back with).
pub async fn rules(State(state): State<AppState>) -> Response {
    axum::Json(ringlimit_proto::discovery::RuleList {
        rules: state.admin.rules(),
    })
    .into_response()
}

/// `GET /metrics`: OpenMetrics text.
pub async fn metrics(State(state): State<AppState>) -> Response {
    match state.admin.metrics_text() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
