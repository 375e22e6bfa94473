//! The admin API, `/v1/admin/*`: the rules in force and where they came from, a key's state read
//! without consuming, and a key's reset across the cluster.
//!
//! It is off unless `RINGLIMIT_ADMIN_TOKEN` is set (its paths then answer 404, like any unknown
//! path); when on, every request needs `Authorization: Bearer <token>`, compared in constant time,
//! or gets 401 with the contract's error body. Reads and resets go through the same router and
//! peer port as checks, so they see exactly the buckets that checks see.

use super::AppState;
use super::check::rule_spec;
use super::error::{ApiError, sentence};
use crate::cluster::View;
use crate::engine::RuleSpec;
use crate::forward::reset::{self, MemberReset, ResetStatus};
use crate::router::{Prepared, fallback_id};
use crate::rules::Mode;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::discovery::RuleInfo;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::atomic::Ordering;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// Longest a reset waits for any one member (connect, handshake, answer).
const RESET_WAIT: Duration = Duration::from_secs(2);

/// Why global counters are not reset (stated in the answer of a reset of a global rule's key).
const GLOBAL_RESET: &str = "not supported: global rules count in grow-only G-counters that nodes \
    merge by maximum, so a count dropped here would come back with the next gossip from peers; \
    the key's counts expire with their window (at most two periods)";

/// The admin bearer token, kept as its SHA-256 digest: comparing digests in constant time
/// reveals neither the token's bytes nor its length through timing.
pub struct AdminToken([u8; 32]);

impl AdminToken {
    pub fn new(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `given` is the token.
    pub fn matches(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        self.0.ct_eq(&given).into()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|t| !t.is_empty())
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"ringlimit admin\""),
    );
    r
}

/// In front of every admin route: 404 when the admin API is off, 401 without the token.
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.admin_token else {
        return super::ops::not_found().await.into_response();
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()));
    match given {
        None => unauthorized("The admin API needs an `Authorization: Bearer <token>` header."),
        Some(g) if !token.matches(g) => unauthorized("The bearer token is not the admin token."),
        Some(_) => next.run(req).await,
    }
}

#[derive(Serialize)]
struct AdminRules {
    /// The rules file, or `built-in`.
    source: String,
    /// Rule sets put in force since start (1: those loaded at start).
    generation: u64,
    /// Unix ms at which the rules in force were loaded.
    loaded_at_ms: u64,
    reloads_ok: u64,
    reloads_error: u64,
    /// The last reload that changed something (`null`: none since start).
    last_reload: Option<LastReload>,
    rules: Vec<RuleInfo>,
}

#[derive(Serialize)]
struct LastReload {
    at_ms: u64,
    /// `ok` or `error`.
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `GET /v1/admin/rules`: the rules in force (as `GET /v1/rules`), their source and reloads.
pub async fn rules(State(state): State<AppState>) -> Response {
    let status = &state.rules;
    let rules = state.router.engine().rules();
    axum::Json(AdminRules {
        source: status
            .source
            .as_ref()
            .map_or_else(|| "built-in".to_owned(), |p| p.display().to_string()),
        generation: status.generation.load(Ordering::Relaxed),
        loaded_at_ms: status.loaded_at_ms.load(Ordering::Relaxed),
        reloads_ok: status.reloads_ok.load(Ordering::Relaxed),
        reloads_error: status.reloads_failed.load(Ordering::Relaxed),
        last_reload: status.last().map(|o| LastReload {
            at_ms: o.at_ms,
            result: if o.error.is_some() { "error" } else { "ok" },
            error: o.error,
        }),
        rules: rules.iter().map(|r| r.info()).collect(),
    })
    .into_response()
}

/// The rule of an admin key request, as query parameters with the check body's names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleQuery {
    rule: Option<String>,
    limit: Option<u64>,
    period_ms: Option<u64>,
    algorithm: Option<String>,
    burst: Option<u64>,
}

impl RuleQuery {
    fn spec(&self) -> Result<RuleSpec<'_>, ApiError> {
        rule_spec(
            self.rule.as_deref(),
            self.limit,
            self.period_ms,
            self.algorithm.as_deref(),
            self.burst,
        )
    }
}

/// The key's check under the query's rule, at cost 0: validated, nothing consumed.
fn prepare_key<'a>(
    state: &AppState,
    key: &'a str,
    q: &'a RuleQuery,
) -> Result<Prepared<'a>, ApiError> {
    let spec = q.spec()?;
    Ok(state.router.prepare(key, spec, 0)?)
}

/// A malformed query string is the contract's 400 `invalid_request`, like a malformed body.
impl<S: Send + Sync> FromRequestParts<S> for RuleQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<RuleQuery>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| q)
            .map_err(|e| ApiError::bad_request("invalid_request", sentence(e.body_text())))
    }
}

/// A key's bucket and who decides it.
#[derive(Serialize)]
struct Bucket<'a> {
    key: &'a str,
    /// The named rule; `null` for an inline rule.
    rule: Option<&'a str>,
    mode: &'static str,
    /// The bucket's 64-bit identity, 16 hex digits.
    bucket_id: String,
    /// The owner in this node's ring; `null` for a global rule (decided on every node).
    owner: Option<&'a str>,
    /// This node.
    node_id: &'a str,
    is_owner: bool,
}

impl<'a> Bucket<'a> {
    fn of(p: &'a Prepared<'a>, view: &'a View) -> Self {
        let owner = match p.resolved.mode {
            Mode::Global => None,
            Mode::Owner => view.ring.owner(p.id),
        };
        Bucket {
            key: p.key,
            rule: match p.spec {
                RuleSpec::Named(name) => Some(name),
                RuleSpec::Inline(_) => None,
            },
            mode: p.resolved.mode.as_str(),
            bucket_id: format!("{:016x}", p.id),
            // An empty ring (never in a running node) means this node decides.
            is_owner: p.resolved.mode == Mode::Owner && owner.is_none_or(|o| o == &*view.self_id),
            owner,
            node_id: &view.self_id,
        }
    }
}

#[derive(Serialize)]
struct KeyState<'a> {
    #[serde(flatten)]
    bucket: Bucket<'a>,
    /// A cost-0 check's answer, decided where a check would be: nothing consumed.
    state: CheckAnswer,
}

/// `GET /v1/admin/keys/{key}?rule=NAME` (or inline rule parameters): the key's bucket, owner and
/// state, read with a cost-0 check routed like any check (degraded when the owner is away).
pub async fn key_state(
    State(state): State<AppState>,
    Path(key): Path<String>,
    q: RuleQuery,
) -> Response {
    let p = match prepare_key(&state, &key, &q) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let answer = match state.router.route(&p).await {
        Ok(a) => a,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let view = state.router.view();
    axum::Json(KeyState {
        bucket: Bucket::of(&p, &view),
        state: answer,
    })
    .into_response()
}

#[derive(Serialize)]
struct ResetAnswer<'a> {
    #[serde(flatten)]
    bucket: Bucket<'a>,
    /// Buckets dropped, summed over members (the key's bucket at its owner, fallback shares
    /// wherever the owner was once unreachable).
    removed: u64,
    /// Whether every member that is not dead answered.
    complete: bool,
    members: Vec<MemberReset>,
    /// Only for a global rule: why its counters are not reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    global_reset: Option<&'static str>,
}

/// `POST /v1/admin/keys/{key}/reset?rule=NAME`: drops the key's bucket and its fallback buckets
/// on every member. 200 whatever the members answer: each member's result is in the body.
pub async fn reset(
    State(state): State<AppState>,
    Path(key): Path<String>,
    q: RuleQuery,
) -> Response {
    let p = match prepare_key(&state, &key, &q) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let view = state.router.view();
    let (members, global_reset) = match p.resolved.mode {
        // Global checks never touch a store: there is nothing a reset could drop.
        Mode::Global => (Vec::new(), Some(GLOBAL_RESET)),
        Mode::Owner => {
            // The real bucket everywhere (a node that owned it before a ring change may still
            // hold it), and the fail-open share each node may have used.
            let ids = [p.id, fallback_id(p.id)];
            let members = reset::everywhere(
                &view,
                state.router.peer_settings(),
                state.router.engine().store(),
                &ids,
                RESET_WAIT,
            )
            .await;
            (members, None)
        }
    };
    let removed = members.iter().filter_map(|m| m.removed).sum();
    let acked = members
        .iter()
        .filter(|m| m.status == ResetStatus::Ok)
        .count();
    let failed: Vec<&str> = members
        .iter()
        .filter(|m| m.status == ResetStatus::Failed)
        .map(|m| m.node_id.as_str())
        .collect();
    let bucket = Bucket::of(&p, &view);
    tracing::info!(
        key = %p.key,
        rule = bucket.rule.unwrap_or("(inline)"),
        bucket_id = %bucket.bucket_id,
        removed,
        acked,
        ?failed,
        "admin reset performed"
    );
    axum::Json(ResetAnswer {
        complete: failed.is_empty(),
        bucket,
        removed,
        members,
        global_reset,
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_parsed_and_compared() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
        let t = AdminToken::new("s3cret");
        assert!(t.matches(b"s3cret"));
        assert!(!t.matches(b"s3cre"));
        assert!(!t.matches(b"s3cret2"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "AdminToken(..)");
    }
}
