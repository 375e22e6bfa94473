//! An answer's `X-RateLimit-*` and `Retry-After` headers: the node's HTTP API sends them, and
//! the SDK's tower layer puts the same ones on the responses it guards.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use ringlimit_proto::CheckAnswer;

// Constants, not `&str` names: a string name is parsed again on every insert (measured on the
// check path).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Unix seconds, rounded up).
pub fn rate_headers(headers: &mut HeaderMap, a: &CheckAnswer) {
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(a.limit));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(a.remaining));
    headers.insert(
        X_RATELIMIT_RESET,
        HeaderValue::from(a.reset_at_ms.div_ceil(1000)),
    );
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
    fn headers_round_up_to_whole_seconds() {
        let a = CheckAnswer {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_at_ms: 1_700_000_000_001,
            retry_after_ms: 1,
            degraded: false,
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
