//! A `tower` layer that rate-limits an HTTP service (axum, hyper) with a [`Client`].
//!
//! Each request's key comes from a closure (a header, the path, the peer's address...). A
//! denied request gets `429 Too Many Requests` with `Retry-After` and `X-RateLimit-*` headers
//! and never reaches the inner service; an admitted one gets the same `X-RateLimit-*` headers
//! on the inner service's response. A request without a key passes unlimited. The cluster
//! being unreachable never fails a request (answers come from the client's fallback), unless
//! the client is fail-closed: then `503` with `Retry-After: 1`.

use crate::{Check, Client, ClientError};
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};
use ringlimit_proto::{CheckAnswer, InlineRule, RuleRef};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// Rate-limits the services it wraps under one rule, per key.
pub struct RateLimitLayer<K> {
    client: Client,
    rule: RuleRef,
    cost: u64,
    key: Arc<K>,
}

impl<K> Clone for RateLimitLayer<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            rule: self.rule.clone(),
            cost: self.cost,
            key: self.key.clone(),
        }
    }
}

impl<K> RateLimitLayer<K> {
    /// Limits under `rule`, keyed by `key(&request)` (`None`: not limited).
    pub fn new(client: Client, rule: RuleRef, key: K) -> Self {
        Self {
            client,
            rule,
            cost: 1,
            key: Arc::new(key),
        }
    }

    /// Limits under the cluster's rule `name`.
    pub fn named(client: Client, name: impl Into<String>, key: K) -> Self {
        Self::new(client, RuleRef::Named(name.into()), key)
    }

    /// Limits under an inline rule.
    pub fn inline(client: Client, rule: InlineRule, key: K) -> Self {
        Self::new(client, RuleRef::Inline(rule), key)
    }

    /// Tokens each request takes (default 1).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }
}

impl<S, K> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
pub struct RateLimit<S, K> {
    inner: S,
    layer: RateLimitLayer<K>,
}

impl<S: Clone, K> Clone for RateLimit<S, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: Fn(&Request<ReqBody>) -> Option<String> + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let key = (self.layer.key)(&req);
        // The clone that was made ready is the one to call (tower's ready-then-call rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let client = self.layer.client.clone();
        let rule = self.layer.rule.clone();
        let cost = self.layer.cost;
        Box::pin(async move {
            let Some(key) = key else {
                return inner.call(req).await;
            };
            let check = Check { key, rule, cost };
            match client.check(&check).await {
                Ok(a) if a.allowed => {
                    let mut res = inner.call(req).await?;
                    rate_headers(res.headers_mut(), &a);
                    Ok(res)
                }
                Ok(a) => Ok(denied(&a)),
                Err(ClientError::Unavailable(reason)) => Ok(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    &format!("The rate limiter is unavailable: {reason}."),
                )),
                Err(e) => {
                    // A misconfigured layer (a rule the cluster lacks, an invalid inline
                    // rule): the service's fault, not the caller's.
                    tracing::error!(error = %e, "rate limit check refused");
                    Ok(error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "rate_limit_misconfigured",
                        "The rate limit of this endpoint is misconfigured.",
                    ))
                }
            }
        })
    }
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix seconds), as the node's HTTP API
/// sends them; none when the limit is unknown (no node reached yet).
pub fn rate_headers(headers: &mut HeaderMap, a: &CheckAnswer) {
    if a.limit != 0 {
        ringlimit_core::headers::rate_headers(headers, a);
    }
}

fn denied<B: From<String>>(a: &CheckAnswer) -> Response<B> {
    let retry_s = ringlimit_core::headers::retry_after_secs(a);
    let mut res = error(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        &format!("Too many requests; retry after {retry_s} s."),
    );
    rate_headers(res.headers_mut(), a);
    ringlimit_core::headers::retry_after(res.headers_mut(), a);
    res
}

/// The HTTP API's error body: `{"error": code, "message": sentence}`.
fn error<B: From<String>>(status: StatusCode, code: &str, message: &str) -> Response<B> {
    let body = serde_json_body(code, message);
    let mut res = Response::new(B::from(body));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    res
}

fn serde_json_body(code: &str, message: &str) -> String {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        error: &'a str,
        message: &'a str,
    }
    // Two plain strings always serialise.
    serde_json::to_string(&Body {
        error: code,
        message,
    })
    .unwrap_or_default()
}

/// Ready-made key extractors.
pub mod key {
    use http::Request;

    /// The value of header `name` (requests without it, or with a non-UTF-8 or empty one, are
    /// not limited).
    pub fn header<B>(name: &'static str) -> impl Fn(&Request<B>) -> Option<String> + Clone {
        move |req| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        }
    }

    /// The request's path (one limit per endpoint).
    pub fn path<B>() -> impl Fn(&Request<B>) -> Option<String> + Clone {
        |req| Some(req.uri().path().to_owned())
    }
}
