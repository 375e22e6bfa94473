//! Health, readiness and the JSON fallback for unknown paths.

use super::AppState;
use super::error::ApiError;
use crate::cluster::Member;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
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

#[derive(Serialize)]
struct ClusterBody<'a> {
    node_id: &'a str,
    cluster_id: &'a str,
    members: &'a [Member],
    /// Members in the ring (alive, not leaving).
    ring_members: usize,
    forwarding: Forwarding,
}

#[derive(Serialize)]
struct Forwarding {
    forwarded: u64,
    fail_open: u64,
    fail_closed: u64,
    /// Frames and checks sent to peers: checks per frame is the batching factor.
    peer_frames: u64,
    peer_checks: u64,
    batching_factor: f64,
    /// Buckets this node sent to their new owners after ring changes.
    handed_over: u64,
}

/// `GET /v1/cluster`: this node's view of the cluster.
pub async fn cluster(State(state): State<AppState>) -> Response {
    let view = state.router.view();
    let r = &state.router;
    let frames = r.peer_stats.frames.load(Ordering::Relaxed);
    let checks = r.peer_stats.checks.load(Ordering::Relaxed);
    let body = ClusterBody {
        node_id: &view.self_id,
        cluster_id: &state.cluster_id,
        members: &view.members,
        ring_members: view.ring.len(),
        forwarding: Forwarding {
            forwarded: r.stats.forwarded.load(Ordering::Relaxed),
            fail_open: r.stats.fail_open.load(Ordering::Relaxed),
            fail_closed: r.stats.fail_closed.load(Ordering::Relaxed),
            peer_frames: frames,
            peer_checks: checks,
            handed_over: r.stats.handed_over.load(Ordering::Relaxed),
            batching_factor: if frames == 0 {
                0.0
            } else {
                checks as f64 / frames as f64
            },
        },
    };
    axum::Json(body).into_response()
}
