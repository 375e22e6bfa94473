//! The HTTP edge (axum): parse → call the [`CheckService`] (checks), [`Admin`] (views,
//! metrics, admin) or [`Lifecycle`] (readiness) → reply.
//!
//! # Layout
//! - [`check`] — `POST /v1/check`, `/v1/check/batch` and `/v1/check/all`.
//! - [`reservations`] — `POST /v1/reserve` and `/v1/settle`: costs estimated now, settled later.
//! - [`forward_auth`] — `/v1/forward-auth`: gateways' forwarded requests, keyed by templates.
//! - [`ops`] — health, readiness, cluster and rules views, metrics, fallback.
//! - [`admin`] — `/v1/admin/*` behind a bearer token: rules, a key's state, a key's reset.
//! - [`admin_blocks`] — `/v1/admin/blocks`: the managed blocklist.
//! - [`error`] — the contract's error body.
//! - [`fast`] — `POST /v1/check` answered before the router.
//! - `h1` — `POST /v1/check` over HTTP/1.1 answered before hyper (other requests: hyper's).
//! - [`serve`] — one connection: the check loop, then hyper (served by [`crate::listen`]).

pub mod admin;
pub mod admin_blocks;
mod admin_rules;
pub mod answer_json;
pub mod check;
pub mod error;
pub mod fast;
pub mod forward_auth;
mod h1;
pub mod ops;
pub mod reservations;
pub mod serve;

use crate::admin::Admin;
use crate::lifecycle::Lifecycle;
use crate::service::CheckService;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{any, get, post};
use std::sync::Arc;

/// Largest request body accepted (the contract's 1 MiB).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// What the handlers share, behind one reference count per HTTP runtime.
///
/// Why one per runtime: axum clones the state for every request; with one count shared by
/// the runtimes on every core, its cache line would travel between the cores on every request.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }

    /// The same state under a reference count of its own, for one HTTP runtime, whose checks
    /// reach the members on that runtime's own clients ([`CheckService::for_runtime`]).
    pub fn for_runtime(&self) -> Self {
        Self::new(Shared {
            service: Arc::new(self.service.for_runtime()),
            ..Shared::clone(&self.0)
        })
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
#[derive(Clone)]
pub struct Shared {
    pub service: Arc<CheckService>,
    /// The admin API, the views and the metrics text.
    pub admin: Arc<Admin>,
    /// Readiness.
    pub lifecycle: Arc<Lifecycle>,
    /// The admin tokens; `None` or none enabled: the admin API is off.
    pub admin_tokens: Option<Arc<crate::admin::tokens::TokenBook>>,
    /// How long a request body may take to arrive (`--http-body-timeout-ms`).
    pub body_timeout: std::time::Duration,
    /// Forward auth's `--trusted-proxies`.
    pub trusted_proxies: Arc<crate::forwarded::TrustedProxies>,
}

/// The node's HTTP service: the routes, with `POST /v1/check` answered before them.
pub fn service(state: AppState) -> fast::FastPath {
    fast::FastPath::new(state.clone(), router(state))
}

/// The node's HTTP routes.
pub fn router(state: AppState) -> axum::Router {
    let admin = axum::Router::new()
        .route("/v1/admin/rules", get(admin::rules))
        .route(
            "/v1/admin/rules/{name}",
            get(admin_rules::get)
                .put(admin_rules::put)
                .delete(admin_rules::delete),
        )
        .route("/v1/admin/blocks", get(admin_blocks::list))
        .route(
            "/v1/admin/blocks/{*key}",
            axum::routing::put(admin_blocks::put).delete(admin_blocks::delete),
        )
        .route("/v1/admin/top", get(admin::top))
        .route("/v1/admin/keys/{key}", get(admin::key_state))
        .route("/v1/admin/keys/{key}/reset", post(admin::reset))
        .route_layer(middleware::from_fn_with_state(state.clone(), admin::guard));
    axum::Router::new()
        .merge(admin)
        .route("/v1/check", post(check::check))
        .route("/v1/check/batch", post(check::batch))
        .route("/v1/check/all", post(check::all))
        .route("/v1/reserve", post(reservations::reserve))
        .route("/v1/settle", post(reservations::settle))
        .route("/v1/forward-auth", any(forward_auth::forward_auth))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/v1/cluster", get(ops::cluster))
        .route("/v1/rules", get(ops::rules))
        .route("/metrics", get(ops::metrics))
        .fallback(ops::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
