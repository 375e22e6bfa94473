//! `/v1/admin/blocks`: the managed blocklist through the admin API (behind the admin tokens,
//! see [`super::admin`]): `PUT /v1/admin/blocks/{key}` `{ "ttl": "1h", "reason": "..." }` (a
//! key, or a network written `cidr:203.0.113.0/24`), `DELETE` (with `?rule=NAME`: the
//! automatic block of the key under that rule), `GET /v1/admin/blocks` a page at a time.

use super::AppState;
use super::admin::AdminCaller;
use super::check::read_body;
use super::error::{ApiError, sentence};
use crate::admin::blocks::{BlockFilter, BlockRequestError};
use crate::blocks::BlockSource;
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

fn request_error(e: BlockRequestError) -> ApiError {
    let status = match e {
        BlockRequestError::Full(_) => StatusCode::CONFLICT,
        BlockRequestError::NotFound(_) | BlockRequestError::UnknownRule(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::new(status, e.code(), sentence(e.to_string()))
}

/// A `PUT`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    /// How long, as the rules file writes durations (`90s`, `1h`, `7d`).
    ttl: String,
    #[serde(default)]
    reason: String,
}

/// `PUT /v1/admin/blocks/{key}`: blocks the key (or network) under every rule; 200 with the
/// block as listed and the members that did not confirm it.
pub async fn put(
    State(state): State<AppState>,
    Extension(caller): Extension<AdminCaller>,
    Path(key): Path<String>,
    body: Body,
) -> Response {
    let result = async {
        let bytes = read_body(&state, body).await?;
        let body: PutBody = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(
                "invalid_json",
                sentence(format!(
                    "Body must be {{\"ttl\": \"1h\", \"reason\": \"...\"}}: {e}"
                )),
            )
        })?;
        state
            .admin
            .put_block(&key, &body.ttl, &body.reason, &caller.name)
            .await
            .map_err(request_error)
    }
    .await;
    match result {
        Ok(block) => axum::Json(block).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub struct DeleteQuery {
    rule: Option<String>,
}

/// `DELETE /v1/admin/blocks/{key}`: lifts the block; 200 with the lift and the members that
/// did not confirm it.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<AdminCaller>,
    Path(key): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> Response {
    match state
        .admin
        .delete_block(&key, q.rule.as_deref(), &caller.name)
        .await
    {
        Ok(lift) => axum::Json(lift).into_response(),
        Err(e) => request_error(e).into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    rule: Option<String>,
    reason: Option<String>,
    source: Option<String>,
    cursor: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/admin/blocks?rule=&reason=&source=auto|managed&cursor=&limit=`: a page of blocks.
pub async fn list(State(state): State<AppState>, Query(q): Query<ListQuery>) -> Response {
    let source = match q.source.as_deref() {
        None => None,
        Some("auto") => Some(BlockSource::Auto),
        Some("managed") => Some(BlockSource::Managed),
        Some(other) => {
            return ApiError::bad_request(
                "invalid_request",
                sentence(format!("source must be auto or managed, not {other:?}")),
            )
            .into_response();
        }
    };
    let f = BlockFilter {
        rule: q.rule.as_deref(),
        reason: q.reason.as_deref(),
        source,
        cursor: q.cursor.as_deref(),
        limit: q.limit,
    };
    match state.admin.list_blocks(&f) {
        Ok(page) => axum::Json(page).into_response(),
        Err(e) => request_error(e).into_response(),
    }
}
