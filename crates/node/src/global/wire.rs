//! How one node's global counts travel in its chitchat key-values.
//!
//! One key per bucket, `g:<bucket id, 16 hex digits>`, whose value is
//! `<period_ms>:<window>:<current>:<previous>`: the node's own admitted count in window
//! `window` (numbered `unix_ms / period_ms`, the same on every node) and in the window before it.
//! About 45 bytes a key, and the key is overwritten when the window moves on rather than a new
//! key being made per window: chitchat keeps a tombstone per deleted key for its grace period
//! and sends every key to every node, so one key per bucket keeps the replicated state (and its
//! tombstones) proportional to the hot buckets, not to buckets × windows. Carrying the previous
//! window's final count in the same value lets a node that only hears the key after the window
//! turned still learn it (the sliding-window estimate needs it).
//!
//! Everything here parses input from the network: nothing panics, every failure is a
//! [`WireError`].

use ringlimit_core::limiter::MAX_PERIOD_NS;

/// Prefix of every global-counter key.
pub const PREFIX: &str = "g:";
/// Longest value accepted (four `u64`s and three colons fit in 80).
const MAX_VALUE_LEN: usize = 80;

/// One node's counts for one bucket, as published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Update {
    pub id: u64,
    pub period_ms: u64,
    pub window: u64,
    /// Admitted by the publishing node in `window`.
    pub current: u64,
    /// Admitted by the publishing node in `window - 1`.
    pub previous: u64,
}

/// Why a gossiped key or value is not a global counter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("key {0:?} is not g:<16 hex digits>")]
    Key(String),
    #[error("value of {len} bytes is too long")]
    TooLong { len: usize },
    #[error("value {0:?} is not <period_ms>:<window>:<current>:<previous>")]
    Value(String),
    #[error("period {0} ms is out of range")]
    Period(u64),
}

/// The key for bucket `id`.
pub fn key(id: u64) -> String {
    format!("{PREFIX}{id:016x}")
}

/// The value for an update (`id` is in the key).
pub fn value(u: &Update) -> String {
    format!("{}:{}:{}:{}", u.period_ms, u.window, u.current, u.previous)
}

/// Parses a key without its `g:` prefix (as chitchat's listeners hand it over).
pub fn parse_id(key: &str) -> Result<u64, WireError> {
    if key.len() != 16 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(WireError::Key(truncate(key)));
    }
    u64::from_str_radix(key, 16).map_err(|_| WireError::Key(truncate(key)))
}

/// Parses a key (prefix stripped) and its value.
pub fn parse(key: &str, value: &str) -> Result<Update, WireError> {
    let id = parse_id(key)?;
    if value.len() > MAX_VALUE_LEN {
        return Err(WireError::TooLong { len: value.len() });
    }
    let bad = || WireError::Value(value.to_owned());
    let mut parts = value
        .split(':')
        .map(|p| p.parse::<u64>().map_err(|_| bad()));
    let mut next = || parts.next().unwrap_or_else(|| Err(bad()));
    let (period_ms, window, current, previous) = (next()?, next()?, next()?, next()?);
    if parts.next().is_some() {
        return Err(bad());
    }
    if period_ms == 0 || period_ms > MAX_PERIOD_NS / ringlimit_core::clock::NANOS_PER_MS {
        return Err(WireError::Period(period_ms));
    }
    Ok(Update {
        id,
        period_ms,
        window,
        current,
        previous,
    })
}

fn truncate(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let u = Update {
            id: 0x0123_4567_89ab_cdef,
            period_ms: 20_000,
            window: 88_000_000,
            current: 17,
            previous: 300,
        };
        let k = key(u.id);
        assert_eq!(k, "g:0123456789abcdef");
        let v = value(&u);
        assert!(k.len() + v.len() <= 45, "{k} {v}");
        assert_eq!(parse(k.strip_prefix(PREFIX).unwrap(), &v), Ok(u));
    }

    #[test]
    fn refuses_garbage() {
        let id = "0123456789abcdef";
        for (k, v) in [
            ("0123", "1:2:3:4"),
            ("0123456789abcdeg", "1:2:3:4"),
            ("+123456789abcdef", "1:2:3:4"),
            (id, ""),
            (id, "1:2:3"),
            (id, "1:2:3:4:5"),
            (id, "1:2:-3:4"),
            (id, "0:2:3:4"),
            (id, "99999999999999999:2:3:4"),
            (id, "1:2:3:18446744073709551616"),
            (id, &"9".repeat(100)),
        ] {
            assert!(parse(k, v).is_err(), "{k:?} {v:?}");
        }
    }
}
