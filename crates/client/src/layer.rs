//! A `tower` layer that rate-limits an HTTP service (axum, hyper) with a [`Client`].
//!
//! Each limit is a rule and a closure that takes the request's key for it (a header, the
//! path, the peer's address...); [`RateLimitLayer::and`] adds more, and a request held to
//! several limits is decided all-or-nothing ([`Client::check_all`]): a limit that denies takes
//! nothing from the others. A denied request gets `429 Too Many Requests` with `Retry-After`
//! and never reaches the inner service; an admitted one reaches it. Both carry
//! `X-RateLimit-*` (the binding limit) and the IETF `RateLimit-Policy` and `RateLimit` fields
//! (every limit). A limit whose key the request lacks does not apply; a request with no key at
//! all passes unlimited. The cluster being unreachable never fails a request (answers come
//! from the client's fallback), unless the client is fail-closed: then `503` with
//! `Retry-After: 1`.

use crate::{AllAnswer, Check, Client, ClientError};
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};
use ringlimit_core::all_or_nothing::AllError;
use ringlimit_core::headers::{Policy, ietf_fields, inline_policy_name};
use ringlimit_proto::{CheckAnswer, InlineRule, RuleRef};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// Takes a request's keys, one per limit of the layer, in order (`None`: the limit does not
/// apply). A closure `Fn(&Request<B>) -> Option<String>` is one; [`RateLimitLayer::and`]
/// chains more.
pub trait Keys<B>: Send + Sync + 'static {
    fn keys(&self, req: &Request<B>, out: &mut Vec<Option<String>>);
}

impl<B, F> Keys<B> for F
where
    F: Fn(&Request<B>) -> Option<String> + Send + Sync + 'static,
{
    fn keys(&self, req: &Request<B>, out: &mut Vec<Option<String>>) {
        out.push(self(req));
    }
}

/// The keys of `A`, then the key `F` takes.
pub struct And<A, F> {
    first: A,
    then: F,
}

impl<B, A: Keys<B>, F> Keys<B> for And<A, F>
where
    F: Fn(&Request<B>) -> Option<String> + Send + Sync + 'static,
{
    fn keys(&self, req: &Request<B>, out: &mut Vec<Option<String>>) {
        self.first.keys(req, out);
        out.push((self.then)(req));
    }
}

/// One limit of a layer: its rule and the cost a request takes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Limit {
    rule: RuleRef,
    cost: u64,
}

/// Rate-limits the services it wraps, per key, under one rule or several.
pub struct RateLimitLayer<K> {
    client: Client,
    limits: Arc<[Limit]>,
    keys: Arc<K>,
}

impl<K> Clone for RateLimitLayer<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            limits: self.limits.clone(),
            keys: self.keys.clone(),
        }
    }
}

impl<K> RateLimitLayer<K> {
    /// Limits under `rule`, keyed by `key(&request)` (`None`: not limited).
    pub fn new(client: Client, rule: RuleRef, key: K) -> Self {
        Self {
            client,
            limits: Arc::from([Limit { rule, cost: 1 }]),
            keys: Arc::new(key),
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

    /// Tokens each request takes under the last limit added (default 1).
    pub fn cost(mut self, cost: u64) -> Self {
        let mut limits = self.limits.to_vec();
        if let Some(last) = limits.last_mut() {
            last.cost = cost;
        }
        self.limits = limits.into();
        self
    }

    /// Also limits under `rule`, keyed by `key(&request)`: every request is decided against
    /// all the limits whose key it has, all-or-nothing.
    pub fn and<F>(self, rule: RuleRef, key: F) -> RateLimitLayer<And<K, F>> {
        let mut limits = self.limits.to_vec();
        limits.push(Limit { rule, cost: 1 });
        let first = Arc::try_unwrap(self.keys)
            .unwrap_or_else(|_| unreachable!("a layer being built has not been cloned"));
        RateLimitLayer {
            client: self.client,
            limits: limits.into(),
            keys: Arc::new(And { first, then: key }),
        }
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
    K: Keys<ReqBody>,
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
        let mut keys = Vec::with_capacity(self.layer.limits.len());
        self.layer.keys.keys(&req, &mut keys);
        let checks: Vec<Check> = self
            .layer
            .limits
            .iter()
            .zip(keys)
            .filter_map(|(l, key)| {
                key.map(|key| Check {
                    key,
                    rule: l.rule.clone(),
                    cost: l.cost,
                })
            })
            .collect();
        // The clone that was made ready is the one to call (tower's ready-then-call rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let client = self.layer.client.clone();
        Box::pin(async move {
            if checks.is_empty() {
                return inner.call(req).await;
            }
            let decided = match checks.as_slice() {
                // One limit: the single-check path (one group, no refunds possible).
                [check] => client.check(check).await.map(|a| AllAnswer {
                    allowed: a.allowed,
                    binding: 0,
                    results: vec![a],
                    shadow_denied: vec![None],
                }),
                _ => client.check_all(&checks).await.map_err(|e| match e {
                    AllError::Item { error, .. } => error,
                    other => ClientError::Rejected {
                        code: other.code().to_owned(),
                        message: other.to_string(),
                    },
                }),
            };
            match decided {
                Ok(all) if all.allowed => {
                    let mut res = inner.call(req).await?;
                    all_headers(res.headers_mut(), &client, &checks, &all);
                    Ok(res)
                }
                Ok(all) => {
                    let mut res = denied(all.binding_answer());
                    all_headers(res.headers_mut(), &client, &checks, &all);
                    Ok(res)
                }
                Err(ClientError::Unavailable(reason)) => Ok(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    &format!("The rate limiter is unavailable: {reason}."),
                )),
                Err(e) => {
                    // A misconfigured layer (a rule the cluster lacks, an invalid inline
                    // rule, one bucket named twice): the service's fault, not the caller's.
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

/// `X-RateLimit-*` of the binding limit and the IETF fields of every limit whose rule the
/// client knows (a named rule before any node was reached has no period to report).
fn all_headers(headers: &mut HeaderMap, client: &Client, checks: &[Check], all: &AllAnswer) {
    rate_headers(headers, all.binding_answer());
    let now_ms = ringlimit_core::answer::instant_ms(ringlimit_core::clock::unix_ns());
    let named: Vec<(String, u64)> = checks
        .iter()
        .map(|c| match &c.rule {
            RuleRef::Named(name) => (name.clone(), client.period_ms(&c.rule).unwrap_or(0)),
            RuleRef::Inline(r) => (inline_policy_name(r), r.period_ms),
        })
        .collect();
    ietf_fields(
        headers,
        named
            .iter()
            .zip(&all.results)
            .filter(|((_, period_ms), a)| *period_ms > 0 && a.limit > 0)
            .map(|((name, period_ms), answer)| Policy {
                name,
                period_ms: *period_ms,
                answer,
                now_ms,
            }),
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FailMode;
    use crate::testing::unreachable;
    use http::HeaderName;
    use std::time::Duration;

    /// The service behind the layer: says "served".
    #[derive(Clone)]
    struct Served;

    impl Service<Request<String>> for Served {
        type Response = Response<String>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<String>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<String>) -> Self::Future {
            std::future::ready(Ok(Response::new("served".into())))
        }
    }

    fn rule(limit: u64) -> InlineRule {
        InlineRule {
            limit,
            period_ms: 3_600_000,
            algorithm: ringlimit_proto::Algorithm::TokenBucket,
            burst: None,
            calendar: None,
        }
    }

    fn request(headers: &[(&'static str, &[u8])]) -> Request<String> {
        let mut req = Request::new(String::new());
        *req.uri_mut() = "/v1/things?x=1".parse().expect("a uri");
        for (name, value) in headers {
            req.headers_mut().insert(
                HeaderName::from_static(name),
                HeaderValue::from_bytes(value).expect("a header value"),
            );
        }
        req
    }

    async fn send<S>(service: &mut S, req: Request<String>) -> Response<String>
    where
        S: Service<Request<String>, Response = Response<String>>,
        S::Error: std::fmt::Debug,
    {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .expect("ready");
        service.call(req).await.expect("a response")
    }

    fn header<'a>(res: &'a Response<String>, name: &str) -> Option<&'a str> {
        res.headers().get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn keys_come_from_a_header_or_the_path() {
        let user = key::header::<String>("x-user");
        assert_eq!(user(&request(&[("x-user", b"42")])).as_deref(), Some("42"));
        assert_eq!(user(&request(&[])), None, "absent: not limited");
        assert_eq!(
            user(&request(&[("x-user", b"")])),
            None,
            "empty: not limited"
        );
        assert_eq!(
            user(&request(&[("x-user", b"\xff")])),
            None,
            "not UTF-8: not limited"
        );
        assert_eq!(
            key::path::<String>()(&request(&[])).as_deref(),
            Some("/v1/things"),
            "the path, without the query"
        );
        // Chained, the keys come in the order the limits were added.
        let both = And {
            first: key::header::<String>("x-user"),
            then: key::path::<String>(),
        };
        let mut out = Vec::new();
        both.keys(&request(&[("x-user", b"7")]), &mut out);
        assert_eq!(out, [Some("7".to_owned()), Some("/v1/things".to_owned())]);
    }

    #[test]
    fn an_unknown_limit_sends_no_ratelimit_headers_and_errors_are_json() {
        let mut headers = HeaderMap::new();
        let unknown = CheckAnswer {
            allowed: true,
            limit: 0,
            remaining: 0,
            reset_at_ms: 0,
            retry_after_ms: 0,
            degraded: true,
            replica: false,
            leased: false,
        };
        rate_headers(&mut headers, &unknown);
        assert!(headers.is_empty(), "{headers:?}");
        let res: Response<String> =
            error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "a \"why\"");
        let body: serde_json::Value = serde_json::from_str(res.body()).expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({ "error": "unavailable", "message": "a \"why\"" })
        );
        assert_eq!(header(&res, "retry-after"), Some("1"));
        assert_eq!(header(&res, "content-type"), Some("application/json"));
    }

    /// On the client's fallback (no member answers): requests within the limit reach the
    /// service with their headers, the next one gets a 429, and one without a key passes.
    #[tokio::test]
    async fn requests_over_the_limit_get_429_and_never_reach_the_service() {
        let client = unreachable(Client::builder()).await;
        let layer = RateLimitLayer::inline(client, rule(2), key::header::<String>("x-user"));
        let mut service = layer.layer(Served);
        let user = [("x-user", &b"1"[..])];
        for left in ["1", "0"] {
            let res = send(&mut service, request(&user)).await;
            assert_eq!(res.status(), StatusCode::OK);
            assert_eq!(res.body(), "served");
            assert_eq!(header(&res, "x-ratelimit-limit"), Some("2"));
            assert_eq!(header(&res, "x-ratelimit-remaining"), Some(left));
            assert!(header(&res, "ratelimit-policy").is_some(), "{res:?}");
        }
        let res = send(&mut service, request(&user)).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_ne!(res.body(), "served");
        assert!(res.body().contains("\"rate_limited\""), "{}", res.body());
        assert!(header(&res, "retry-after").is_some(), "{res:?}");
        let res = send(&mut service, request(&[])).await;
        assert_eq!(res.status(), StatusCode::OK, "no key, no limit");
        assert!(header(&res, "x-ratelimit-limit").is_none());
    }

    #[tokio::test]
    async fn fail_closed_is_503_and_a_broken_rule_is_500() {
        let closed = unreachable(Client::builder().fail_mode(FailMode::Closed)).await;
        let mut service =
            RateLimitLayer::inline(closed, rule(2), key::path::<String>()).layer(Served);
        let res = send(&mut service, request(&[])).await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(res.body().contains("\"unavailable\""), "{}", res.body());
        assert_eq!(header(&res, "retry-after"), Some("1"));

        let open = unreachable(Client::builder()).await;
        let broken = RateLimitLayer::inline(open.clone(), rule(0), key::path::<String>());
        let res = send(&mut broken.layer(Served), request(&[])).await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            res.body().contains("rate_limit_misconfigured"),
            "{}",
            res.body()
        );
        // Two limits naming one bucket: the service's mistake too.
        let twice = RateLimitLayer::inline(open, rule(5), key::path::<String>())
            .and(RuleRef::Inline(rule(5)), key::path::<String>());
        let res = send(&mut twice.layer(Served), request(&[])).await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    /// Two limits, all-or-nothing: a request the second denies takes nothing from the first.
    #[tokio::test]
    async fn a_request_under_two_limits_is_held_all_or_nothing() {
        let client = unreachable(Client::builder()).await;
        let layer = RateLimitLayer::inline(client.clone(), rule(10), key::path::<String>())
            .and(RuleRef::Inline(rule(1)), key::header::<String>("x-user"));
        let mut service = layer.layer(Served);
        let user = [("x-user", &b"1"[..])];
        assert_eq!(
            send(&mut service, request(&user)).await.status(),
            StatusCode::OK
        );
        let res = send(&mut service, request(&user)).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        let path = Check::inline("/v1/things", 10, Duration::from_secs(3_600)).cost(0);
        let left = client.check(&path).await.expect("answered").remaining;
        assert_eq!(left, 9, "the denied request's path cost was given back");
        // The cost of a limit is what each request takes.
        let costly =
            RateLimitLayer::inline(client.clone(), rule(10), key::header::<String>("x-k")).cost(4);
        let res = send(&mut costly.layer(Served), request(&[("x-k", b"a")])).await;
        assert_eq!(header(&res, "x-ratelimit-remaining"), Some("6"));
    }
}
