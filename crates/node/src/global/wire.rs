//! How one node's global counts travel: [`Update`]s in the peer protocol's `GlobalCounts`
//! frame (`ringlimit_proto::peer`), one per bucket: the node's own admitted count in window
//! `window` (numbered `unix_ms / period_ms`, the same on every node) and in the window before
//! it. Carrying the previous window's final count lets a node that only hears of the bucket
//! after the window turned still learn it (the sliding-window estimate needs it).
//!
//! Updates come from the network: [`validate`] refuses what the counters must not hold, and
//! nothing here panics.

use ringlimit_core::limiter::MAX_PERIOD_NS;

/// One node's counts for one bucket, as published.
pub use ringlimit_proto::peer::GlobalCount as Update;

/// Most updates in one frame (about 30 bytes each): a full set of 10,000 published buckets is
/// one frame, far below the peer protocol's frame limit.
pub const MAX_PER_FRAME: usize = 20_000;

/// Why an update is not a global count this node can hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("period {0} ms is out of range")]
    Period(u64),
    #[error("window {0} is not a window of the Unix epoch's first {1} ms")]
    Window(u64, u64),
}

/// Checks an update received from a peer.
pub fn validate(u: &Update) -> Result<(), WireError> {
    if u.period_ms == 0 || u.period_ms > MAX_PERIOD_NS / ringlimit_core::clock::NANOS_PER_MS {
        return Err(WireError::Period(u.period_ms));
    }
    // Windows are counted from the epoch in ns on the receiving side: one whose start does not
    // fit in a u64 of ns cannot be a real window.
    let limit_ms = u64::MAX / ringlimit_core::clock::NANOS_PER_MS;
    if u.window
        .checked_mul(u.period_ms)
        .is_none_or(|ms| ms > limit_ms)
    {
        return Err(WireError::Window(u.window, limit_ms));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(period_ms: u64, window: u64) -> Update {
        Update {
            id: 0x0123_4567_89ab_cdef,
            period_ms,
            window,
            current: 17,
            previous: 300,
        }
    }

    #[test]
    fn accepts_real_windows_and_refuses_the_rest() {
        assert_eq!(validate(&update(20_000, 88_000_000)), Ok(()));
        assert_eq!(validate(&update(1, 1_800_000_000_000)), Ok(()));
        for bad in [
            update(0, 1),
            update(99_999_999_999_999_999, 1),
            update(1_000, u64::MAX),
            update(1, u64::MAX / 1_000),
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }
}
