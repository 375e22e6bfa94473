//! The HTTP API (axum): checks, health, readiness, metrics.
//!
//! # Layout
//! - [`check`] — `POST /v1/check` and `/v1/check/batch`.
//! - [`ops`] — health, readiness, cluster and rules views, fallback.
//! - [`error`] — the contract's error body.

pub mod check;
pub mod error;
pub mod ops;

use crate::metrics::Metrics;
use crate::router::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Largest request body accepted (the contract's 1 MiB).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub router: Arc<Router>,
    pub ready: Arc<AtomicBool>,
    pub cluster_id: Arc<str>,
    pub metrics: Arc<Metrics>,
}

/// The node's HTTP routes.
pub fn router(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/v1/check", post(check::check))
        .route("/v1/check/batch", post(check::batch))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/v1/cluster", get(ops::cluster))
        .route("/v1/rules", get(ops::rules))
        .route("/metrics", get(crate::metrics::render))
        .fallback(ops::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
