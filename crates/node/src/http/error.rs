//! The contract's error answer: a 4xx status with `{ "error": code, "message": sentence }`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ringlimit_core::check::CheckError;
use serde::Serialize;

/// An error body, also used in place of a failed item of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorBody {
    pub error: &'static str,
    pub message: String,
}

/// An error answer of the HTTP API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                error,
                message: message.into(),
            },
        }
    }

    pub fn bad_request(error: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error, message)
    }

    /// A request body not complete within `limit` of its header (`--http-body-timeout-ms`).
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "The request body did not arrive within {} ms.",
                limit.as_millis()
            ),
        )
    }
}

impl From<CheckError> for ApiError {
    fn from(e: CheckError) -> Self {
        let status = match e {
            CheckError::UnknownRule(_) => StatusCode::NOT_FOUND,
            CheckError::Rejected { .. } if e.code() == "unknown_rule" => StatusCode::NOT_FOUND,
            CheckError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_REQUEST,
        };
        Self::new(status, e.code(), sentence(e.to_string()))
    }
}

/// Capitalised and ending in a full stop: one clear sentence.
pub fn sentence(mut s: String) -> String {
    if let Some(first) = s.get(0..1) {
        let upper = first.to_uppercase();
        s.replace_range(0..1, &upper);
    }
    if !s.ends_with('.') {
        s.push('.');
    }
    s
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let close = self.status == StatusCode::REQUEST_TIMEOUT;
        let mut response = (self.status, axum::Json(self.body)).into_response();
        if close {
            // 408: the rest of the request never came, so the connection cannot carry another
            // (RFC 9110 15.5.9: the server closes it).
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}
