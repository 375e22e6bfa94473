//! An answer's `X-RateLimit-*` and `Retry-After` headers, and the IETF `RateLimit-Policy` and
//! `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers-11): the node's HTTP API sends
//! them, and the SDK's tower layer puts the same ones on the responses it guards.

use bytes::Bytes;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use ringlimit_proto::{Algorithm, CheckAnswer, InlineRule};
use std::fmt::Write;

// Constants, not `&str` names: a string name is parsed and checked again on every insert, and
// every answer of the check path inserts these.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// One limit as the IETF fields describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy<'a> {
    /// The policy's name: the rule's (see [`inline_policy_name`] for an inline rule).
    pub name: &'a str,
    /// The rule's period in ms.
    pub period_ms: u64,
    pub answer: &'a CheckAnswer,
    /// When the answer was made, Unix ms rounded up like `reset_at_ms` (the `t` parameter
    /// counts from it; see [`crate::answer::instant_ms`]).
    pub now_ms: u64,
}

/// The name an inline rule goes by in the IETF fields: its parameters, e.g. `100-per-60000ms`
/// or `10-per-1000ms-sliding_log` (the algorithm when not the default, the burst when given).
pub fn inline_policy_name(r: &InlineRule) -> String {
    // A calendar rule by its unit and zone: `10000-per-1mo-Europe/Berlin-fixed_window`.
    let mut name = match r.calendar {
        None => format!("{}-per-{}ms", r.limit, r.period_ms),
        Some(c) => format!("{}-per-{}-{}", r.limit, c.unit.period(), c.zone.name()),
    };
    if r.algorithm != Algorithm::default() {
        let _ = write!(name, "-{}", r.algorithm);
    }
    if let Some(b) = r.burst {
        let _ = write!(name, "-burst-{b}");
    }
    name
}

/// `RateLimit-Policy` and `RateLimit`, one list item per limit in order:
/// `"name";q=<limit>;w=<period, s>` and `"name";r=<remaining>;t=<s until full or reset>`
/// (seconds rounded up; a window shorter than a second is `w=1`). A calendar rule's `w` is its
/// unit's nominal length (a day 86400, a week 604800, a month 2678400: 31 days, the longest),
/// whatever the current window's; `t` counts to its actual end.
pub fn ietf_fields<'a>(headers: &mut HeaderMap, limits: impl IntoIterator<Item = Policy<'a>>) {
    // Built in place and handed over without a copy: this runs on every check answer.
    let (mut policy, mut state) = (String::with_capacity(64), String::with_capacity(64));
    ietf_values(&mut policy, &mut state, limits);
    if let (Ok(p), Ok(s)) = (
        HeaderValue::from_maybe_shared(Bytes::from(policy)),
        HeaderValue::from_maybe_shared(Bytes::from(state)),
    ) {
        headers.insert(RATELIMIT_POLICY, p);
        headers.insert(RATELIMIT, s);
    }
}

/// The values of [`RATELIMIT_POLICY`] and [`RATELIMIT`] for `limits`, appended to `policy` and
/// `state` (see [`ietf_fields`]).
pub fn ietf_values<'a>(
    policy: &mut String,
    state: &mut String,
    limits: impl IntoIterator<Item = Policy<'a>>,
) {
    for (i, l) in limits.into_iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        push_sf_string(policy, l.name);
        push_sf_string(state, l.name);
        let w = l.period_ms.div_ceil(1000).max(1);
        let t = l.answer.reset_at_ms.saturating_sub(l.now_ms).div_ceil(1000);
        let _ = write!(policy, ";q={};w={w}", l.answer.limit);
        let _ = write!(state, ";r={};t={t}", l.answer.remaining);
    }
}

/// Appends a structured-field string (RFC 8941 §3.3.3): printable ASCII in quotes, `"` and
/// `\\` escaped; anything else (names are validated, so never in practice) dropped.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix seconds, rounded up).
pub fn rate_headers(headers: &mut HeaderMap, a: &CheckAnswer) {
    for (name, value) in rate_values(a) {
        headers.insert(name, HeaderValue::from(value));
    }
}

/// The headers of [`rate_headers`] with their values, in order.
pub fn rate_values(a: &CheckAnswer) -> [(HeaderName, u64); 3] {
    [
        (X_RATELIMIT_LIMIT, a.limit),
        (X_RATELIMIT_REMAINING, a.remaining),
        (X_RATELIMIT_RESET, a.reset_at_ms.div_ceil(1000)),
    ]
}

/// Whole seconds to wait before retrying a denied check: rounded up, at least 1.
pub fn retry_after_secs(a: &CheckAnswer) -> u64 {
    a.retry_after_ms.div_ceil(1000).max(1)
}

/// `Retry-After` for a denied check.
pub fn retry_after(headers: &mut HeaderMap, a: &CheckAnswer) {
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(a)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ietf_fields_list_every_limit_as_structured_fields() {
        let a = CheckAnswer {
            allowed: true,
            limit: 100,
            remaining: 42,
            reset_at_ms: 1_700_000_018_000,
            retry_after_ms: 0,
            degraded: false,
            replica: false,
            leased: false,
        };
        let b = CheckAnswer {
            limit: 5,
            remaining: 0,
            reset_at_ms: 1_700_000_000_250,
            ..a
        };
        let now_ms = 1_700_000_000_000;
        let mut h = HeaderMap::new();
        ietf_fields(
            &mut h,
            [
                Policy {
                    name: "per-user",
                    period_ms: 60_000,
                    answer: &a,
                    now_ms,
                },
                Policy {
                    name: "odd\"name",
                    period_ms: 250,
                    answer: &b,
                    now_ms,
                },
            ],
        );
        assert_eq!(
            h["ratelimit-policy"],
            r#""per-user";q=100;w=60, "odd\"name";q=5;w=1"#
        );
        assert_eq!(
            h["ratelimit"],
            r#""per-user";r=42;t=18, "odd\"name";r=0;t=1"#
        );
        let inline = InlineRule {
            limit: 10,
            period_ms: 1000,
            algorithm: Algorithm::SlidingLog,
            burst: None,
            calendar: None,
        };
        assert_eq!(inline_policy_name(&inline), "10-per-1000ms-sliding_log");
        let default = InlineRule {
            algorithm: Algorithm::default(),
            burst: Some(20),
            ..inline
        };
        assert_eq!(inline_policy_name(&default), "10-per-1000ms-burst-20");
    }

    #[test]
    fn headers_round_up_to_whole_seconds() {
        let a = CheckAnswer {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_at_ms: 1_700_000_000_001,
            retry_after_ms: 1,
            degraded: false,
            replica: false,
            leased: false,
        };
        let mut h = HeaderMap::new();
        rate_headers(&mut h, &a);
        retry_after(&mut h, &a);
        assert_eq!(h["x-ratelimit-limit"], "10");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        assert_eq!(h["x-ratelimit-reset"], "1700000001");
        assert_eq!(h["retry-after"], "1");
        let zero = CheckAnswer {
            retry_after_ms: 0,
            ..a
        };
        assert_eq!(retry_after_secs(&zero), 1);
        let later = CheckAnswer {
            retry_after_ms: 2001,
            ..a
        };
        assert_eq!(retry_after_secs(&later), 3);
    }
}
