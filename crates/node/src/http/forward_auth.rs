//! `/v1/forward-auth` (any method): a gateway (Caddy `forward_auth`, Traefik `ForwardAuth`,
//! Envoy `ext_authz`, nginx `auth_request`) sends a copy of its client's request headers; the
//! rules' key templates (`request_key`) turn them into keys, and the request is checked under
//! all of them at once, all-or-nothing (`/v1/check/all`). 200 when admitted; `deny_status`
//! (default 429; nginx passes only 401/403) when denied — both with the rate-limit headers.

use super::AppState;
use super::check::all_response;
use super::error::{ApiError, sentence};
use super::serve::PeerAddr;
use crate::forwarded::{self, TrustedProxies};
use crate::rules::RuleSpec;
use crate::rules::request_key::Field;
use crate::service::all_or_nothing::KeyRuleError;
use crate::service::{Check, Edge};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::borrow::Cow;
use std::net::IpAddr;

/// What a forwarded request is limited by, read off the gateway's copy of its headers.
struct Forwarded<'a> {
    headers: &'a HeaderMap,
    /// See [`forwarded::client_ip`].
    client_ip: Option<String>,
    path: Option<String>,
}

impl<'a> Forwarded<'a> {
    fn new(headers: &'a HeaderMap, peer: Option<IpAddr>, trusted: &TrustedProxies) -> Self {
        let forwarded_for: Vec<&[u8]> = headers
            .get_all("x-forwarded-for")
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        let real_ip = headers.get("x-real-ip").map(HeaderValue::as_bytes);
        let client_ip =
            forwarded::client_ip(&forwarded_for, real_ip, peer, trusted).map(|ip| ip.to_string());
        let path = headers
            .get("x-forwarded-uri")
            .map(|u| forwarded::path(u.as_bytes()));
        Self {
            headers,
            client_ip,
            path,
        }
    }

    fn read(&self, f: &Field) -> Option<Cow<'_, str>> {
        let header = |name: &str| {
            self.headers
                .get(name)
                .map(|v| forwarded::header_text(v.as_bytes()))
        };
        match f {
            Field::Header(name) => header(name),
            Field::ClientIp => self.client_ip.as_deref().map(Cow::Borrowed),
            Field::Method => header("x-forwarded-method"),
            // Host names are case-insensitive: one host, one key.
            Field::Host => header("x-forwarded-host").map(|h| match h {
                Cow::Borrowed(b) if !b.bytes().any(|c| c.is_ascii_uppercase()) => h,
                _ => Cow::Owned(h.to_ascii_lowercase()),
            }),
            Field::Path => self.path.as_deref().map(Cow::Borrowed),
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
    let forwarded = Forwarded::new(&req.headers, peer, &state.trusted_proxies);
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
        .check_all(Edge::ForwardAuth, &checks)
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

    #[test]
    fn the_fields_are_read_as_the_gateway_wrote_them() {
        let peer: Option<IpAddr> = "10.0.0.9".parse().ok();
        let none = TrustedProxies::default();
        let mut h = HeaderMap::new();
        assert_eq!(
            Forwarded::new(&h, peer, &none)
                .read(&Field::ClientIp)
                .as_deref(),
            Some("10.0.0.9")
        );
        h.insert("x-real-ip", HeaderValue::from_static("198.51.100.2"));
        assert_eq!(
            Forwarded::new(&h, peer, &none)
                .read(&Field::ClientIp)
                .as_deref(),
            Some("198.51.100.2")
        );
        // Two lines, one list; the client's own entry and its X-Real-IP are not read.
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.1.1.1"));
        h.insert(
            "x-forwarded-uri",
            HeaderValue::from_static("//Orders/?id=1"),
        );
        h.insert("x-forwarded-host", HeaderValue::from_static("Shop.Example"));
        h.insert(
            "x-api-key",
            HeaderValue::from_bytes(b"k\xff").expect("obs-text"),
        );
        let f = Forwarded::new(&h, peer, &none);
        assert_eq!(f.read(&Field::ClientIp).as_deref(), Some("10.1.1.1"));
        assert_eq!(f.read(&Field::Path).as_deref(), Some("/orders"));
        assert_eq!(f.read(&Field::Host).as_deref(), Some("shop.example"));
        assert_eq!(
            f.read(&Field::Header("x-api-key".into())).as_deref(),
            Some("k%FF")
        );
        assert_eq!(f.read(&Field::Method), None);
        let trusted = TrustedProxies::new(vec!["10.0.0.0/8".parse().expect("a block")]);
        let f = Forwarded::new(&h, peer, &trusted);
        assert_eq!(f.read(&Field::ClientIp).as_deref(), Some("203.0.113.7"));
    }
}
