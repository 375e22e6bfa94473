//! Health, readiness, cluster and rules views, and the JSON fallback for unknown paths.

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
    global: GlobalBody,
}

/// Global rules' counters on this node.
#[derive(Serialize)]
struct GlobalBody {
    /// Window counters held (own and merged, every global bucket).
    counters: usize,
    /// Keys this node publishes through gossip now.
    published: u64,
    /// Publish rounds in which a bucket was left unpublished: the per-node cap was reached.
    unpublished: u64,
    /// Windows evicted at the cap while they still mattered.
    evicted: u64,
    /// Peer updates merged, and gossip events dropped on a full queue.
    merged: u64,
    dropped_events: u64,
    /// Every other member, and every peer heard from: how long ago its counts were last merged
    /// (`null`: never).
    peers: Vec<PeerMerge>,
}

#[derive(Serialize)]
struct PeerMerge {
    node_id: String,
    last_merge_ms_ago: Option<u64>,
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
    let g = r.global();
    let mut ages = g.merge_ages();
    let mut peers: Vec<PeerMerge> = view
        .members
        .iter()
        .filter(|m| *m.node_id != *view.self_id)
        .map(|m| PeerMerge {
            last_merge_ms_ago: ages.remove(&m.node_id).map(millis),
            node_id: m.node_id.clone(),
        })
        .collect();
    peers.extend(ages.into_iter().map(|(node_id, age)| PeerMerge {
        node_id,
        last_merge_ms_ago: Some(millis(age)),
    }));
    let global = GlobalBody {
        counters: g.len(),
        published: g.stats.published.load(Ordering::Relaxed),
        unpublished: g.stats.unpublished.load(Ordering::Relaxed),
        evicted: g.stats.evicted.load(Ordering::Relaxed),
        merged: g.stats.merged.load(Ordering::Relaxed),
        dropped_events: g.stats.dropped_events.load(Ordering::Relaxed),
        peers,
    };
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
        global,
    };
    axum::Json(body).into_response()
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `GET /v1/rules`: the rules in force here (what the SDK routes and falls back with).
pub async fn rules(State(state): State<AppState>) -> Response {
    let rules = state.router.engine().rules();
    axum::Json(ringlimit_proto::discovery::RuleList {
        rules: rules.iter().map(|r| r.info()).collect(),
    })
    .into_response()
}
