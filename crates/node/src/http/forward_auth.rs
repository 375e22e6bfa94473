//! `/v1/forward-auth` (any method): a gateway (Caddy `forward_auth`, Traefik `ForwardAuth`,
//! Envoy `ext_authz`, nginx `auth_request`) sends a copy of its client's request headers; the
//! rules' key templates (`request_key`) turn them into keys, and the request is checked under
//! all of them at once, all-or-nothing (`/v1/check/all`). 200 when admitted; `deny_status`
//! (default 429; nginx passes only 401/403) when denied — both with the rate-limit headers.

use super::AppState;
use super::check::all_response;
use super::error::{ApiError, sentence};
use super::serve::PeerAddr;
use crate::engine::RuleSpec;
use crate::request_key::Field;
use crate::service::Check;
use crate::service::all::KeyRuleError;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::borrow::Cow;
use std::net::IpAddr;

/// What a forwarded request is limited by, read off the gateway's copy of its headers.
struct Forwarded<'a> {
    headers: &'a HeaderMap,
    /// The first `X-Forwarded-For` address, else `X-Real-IP`, else the connection's peer.
    client_ip: Option<String>,
    path: Option<&'a str>,
}

impl<'a> Forwarded<'a> {
    fn new(headers: &'a HeaderMap, peer: Option<IpAddr>) -> Self {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let client_ip = header("x-forwarded-for")
            .and_then(|v| v.split(',').next())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .or_else(|| header("x-real-ip").map(str::trim))
            .map(str::to_owned)
            .or_else(|| peer.map(|p| p.to_string()));
        let path = header("x-forwarded-uri").map(|u| u.split(['?', '#']).next().unwrap_or(u));
        Self {
            headers,
            client_ip,
            path,
        }
    }

    fn read(&self, f: &Field) -> Option<&str> {
        let header = |name: &str| self.headers.get(name).and_then(|v| v.to_str().ok());
        match f {
            Field::Header(name) => header(name),
            Field::ClientIp => self.client_ip.as_deref(),
            Field::Method => header("x-forwarded-method"),
            Field::Host => header("x-forwarded-host"),
            Field::Path => self.path,
        }
    }
}

/// `?rules=a,b&deny_status=403`, both optional.
fn query(req: &Parts) -> Result<(Option<Vec<&str>>, StatusCode), ApiError> {
    let mut rules = None;
    let mut deny = StatusCode::TOO_MANY_REQUESTS;
    for pair in req
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "rules" => {
                rules = Some(v.split(',').filter(|r| !r.is_empty()).collect::<Vec<_>>());
            }
            "deny_status" => {
                deny = v
                    .parse::<u16>()
                    .ok()
                    .filter(|s| (400..=599).contains(s))
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "invalid_request",
                            format!(
                                "`deny_status` must be an HTTP status from 400 to 599, got {v:?}."
                            ),
                        )
                    })?;
            }
            other => {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    sentence(format!(
                        "unknown query parameter {other:?}; known are `rules` and `deny_status`"
                    )),
                ));
            }
        }
    }
    Ok((rules, deny))
}

/// `/v1/forward-auth`.
pub async fn forward_auth(State(state): State<AppState>, req: Request) -> Response {
    // The body is not read (a gateway may forward one); only the head matters.
    let (parts, _body) = req.into_parts();
    decide(&state, &parts)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn decide(state: &AppState, req: &Parts) -> Result<Response, ApiError> {
    let (names, deny) = query(req)?;
    let rules = state
        .service
        .request_keys(names.as_deref())
        .map_err(|e| match e {
            KeyRuleError::Unknown(_) => ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_rule",
                sentence(e.to_string()),
            ),
            KeyRuleError::NoTemplate(_) => {
                ApiError::bad_request("invalid_request", sentence(e.to_string()))
            }
        })?;
    let peer = req
        .extensions
        .get::<ConnectInfo<PeerAddr>>()
        .map(|c| c.0.0.ip());
    let forwarded = Forwarded::new(&req.headers, peer);
    // A rule whose template needs what this request lacks does not apply to it.
    let keyed: Vec<(&str, String)> = rules
        .iter()
        .filter_map(|(name, t)| Some((name.as_str(), t.render(|f| forwarded.read(f))?)))
        .collect();
    if keyed.is_empty() {
        return Ok(StatusCode::OK.into_response());
    }
    let checks: Vec<Check<'_>> = keyed
        .iter()
        .map(|(name, key)| Check {
            key,
            rule: RuleSpec::Named(name),
            cost: 1,
            shadow: false,
        })
        .collect();
    let outcome = state
        .service
        .check_all(&checks)
        .await
        .map_err(super::check::all_error)?;
    let names: Vec<Cow<'_, str>> = keyed.iter().map(|(n, _)| Cow::Borrowed(*n)).collect();
    let mut res = all_response(&outcome, &names);
    if !outcome.allowed {
        *res.status_mut() = deny;
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_client_ip_is_the_first_forwarded_for_then_real_ip_then_the_peer() {
        let peer: Option<IpAddr> = "10.0.0.9".parse().ok();
        let mut h = HeaderMap::new();
        assert_eq!(
            Forwarded::new(&h, peer).read(&Field::ClientIp),
            Some("10.0.0.9")
        );
        h.insert("x-real-ip", HeaderValue::from_static("198.51.100.2"));
        assert_eq!(
            Forwarded::new(&h, peer).read(&Field::ClientIp),
            Some("198.51.100.2")
        );
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static(" 203.0.113.7 , 10.1.1.1"),
        );
        h.insert("x-forwarded-uri", HeaderValue::from_static("/orders?id=1"));
        let f = Forwarded::new(&h, peer);
        assert_eq!(f.read(&Field::ClientIp), Some("203.0.113.7"));
        assert_eq!(f.read(&Field::Path), Some("/orders"));
        assert_eq!(f.read(&Field::Method), None);
    }
}
