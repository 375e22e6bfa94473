//! `POST /v1/check` answered before the router; every other request goes through it.
//!
//! Why: a single check costs a few microseconds, and the router's per-request work (matching,
//! cloning the route's boxed service, the matched-path extension, the extractors) was a
//! measurable share of it (`bench/http.sh`, A/B on the same machine: the docs' benchmarks page,
//! "HTTP against Redis + Lua"). The answer is the same
//! code and the same bytes: [`check::check_request`] also serves the router's route.

use super::AppState;
use super::check;
use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;
use futures::future::{BoxFuture, Either};
use std::convert::Infallible;
use std::task::{Context, Poll};
use tower::Service;

/// The node's HTTP service: the check fast path in front of `routes`.
#[derive(Clone)]
pub struct FastPath {
    state: AppState,
    routes: axum::Router,
}

impl FastPath {
    pub fn new(state: AppState, routes: axum::Router) -> Self {
        Self { state, routes }
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }
}

impl Service<Request> for FastPath {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<
        BoxFuture<'static, Result<Response, Infallible>>,
        <axum::Router as Service<Request>>::Future,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready, and so is the fast path.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        if req.method() == Method::POST && req.uri().path() == "/v1/check" {
            let state = self.state.clone();
            Either::Left(Box::pin(async move {
                Ok(check::check_request(&state, req.into_body()).await)
            }))
        } else {
            Either::Right(self.routes.call(req))
        }
    }
}
