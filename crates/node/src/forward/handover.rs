//! Bucket handover: when the ring changes, a node sends the live buckets it no longer owns to
//! their new owners, which merge them (see `BucketState::absorb`). A key that moves keeps its
//! consumption instead of starting from a full bucket, which is what bounds over-admission on
//! join, leave and rolling restarts to what is decided during the move itself.

use super::client::{PeerSettings, connect};
use super::framing;
use crate::limiter::{BucketState, SlidingLog};
use ringlimit_proto::peer::{Frame, HandedBucket, WireState};
use std::time::Duration;

/// Buckets per frame (each at most a few dozen bytes, except sliding logs).
const PER_FRAME: usize = 2_000;

/// A bucket state as it travels.
pub fn to_wire(state: &BucketState) -> WireState {
    match state {
        BucketState::Gcra { tat } => WireState::Gcra { tat: *tat },
        BucketState::Fixed { end, count } => WireState::Fixed {
            end: *end,
            count: *count,
        },
        BucketState::Sliding {
            until,
            current,
            previous,
        } => WireState::Sliding {
            until: *until,
            current: *current,
            previous: *previous,
        },
        BucketState::Log(log) => WireState::Log {
            entries: log.entries().collect(),
            max_entries: log.max_entries(),
        },
    }
}

/// A travelled state back into a bucket (untrusted input: a log is capped at its stated size,
/// itself capped at the largest limit a log may have).
pub fn from_wire(state: WireState) -> BucketState {
    match state {
        WireState::Gcra { tat } => BucketState::Gcra { tat },
        WireState::Fixed { end, count } => BucketState::Fixed { end, count },
        WireState::Sliding {
            until,
            current,
            previous,
        } => BucketState::Sliding {
            until,
            current,
            previous,
        },
        WireState::Log {
            entries,
            max_entries,
        } => {
            let max = max_entries.min(crate::limiter::MAX_SLIDING_LOG_LIMIT);
            let keep = usize::try_from(max).unwrap_or(usize::MAX);
            let skip = entries.len().saturating_sub(keep);
            BucketState::Log(Box::new(SlidingLog::from_entries(
                max,
                entries.into_iter().skip(skip),
            )))
        }
    }
}

/// Sends `buckets` to the node at `addr` on a connection of its own; returns how many it merged.
/// Borrowed, so that the caller can keep them if the push fails.
pub async fn push(
    addr: &str,
    settings: &PeerSettings,
    buckets: &[(u64, BucketState)],
) -> Result<u64, String> {
    let mut conn = tokio::time::timeout(settings.connect_timeout, connect(addr, settings))
        .await
        .map_err(|_| "connect timed out".to_string())??;
    let mut merged = 0;
    for chunk in buckets.chunks(PER_FRAME) {
        let chunk: Vec<HandedBucket> = chunk
            .iter()
            .map(|(id, st)| HandedBucket {
                id: *id,
                state: to_wire(st),
            })
            .collect();
        framing::send(&mut conn, &Frame::Handover(chunk))
            .await
            .map_err(|e| e.to_string())?;
        match framing::recv(&mut conn, Duration::from_secs(2))
            .await
            .map_err(|e| e.to_string())?
        {
            Frame::HandoverAck { merged: m } => merged += m,
            other => return Err(format!("unexpected {} frame", other.kind())),
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_survive_the_wire() {
        let log = SlidingLog::from_entries(10, [(5, 1), (3, 2)]);
        for st in [
            BucketState::Gcra { tat: 42 },
            BucketState::Fixed { end: 9, count: 3 },
            BucketState::Sliding {
                until: 7,
                current: 1,
                previous: 2,
            },
            BucketState::Log(Box::new(log)),
        ] {
            assert_eq!(from_wire(to_wire(&st)), st);
        }
    }

    #[test]
    fn a_hostile_log_is_capped() {
        let entries: Vec<(u64, u32)> = (0..20_000).map(|t| (t, 1)).collect();
        let st = from_wire(WireState::Log {
            entries,
            max_entries: u64::MAX,
        });
        let BucketState::Log(log) = st else {
            panic!("not a log")
        };
        assert_eq!(log.max_entries(), crate::limiter::MAX_SLIDING_LOG_LIMIT);
        assert_eq!(
            log.entries().count() as u64,
            crate::limiter::MAX_SLIDING_LOG_LIMIT
        );
    }
}
