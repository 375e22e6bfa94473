//! How global counts travel: [`Update`]s in the peer protocol's `GlobalCounts` frame
//! (`ringlimit_proto::peer`), one per bucket: the sending node's own admitted count in window
//! `window` (numbered `unix_ms / period_ms`, the same on every node) and in the window before
//! it. Carrying the previous window's final count lets a node that only hears of the bucket
//! after the window turned still learn it (the sliding-window estimate needs it).
//!
//! A [`FullSet`] ends with the counts the sender holds for other actors (live peers and gone
//! incarnations), as [`ActorCounts`] in `GlobalCountsOf` frames: that is how a node that joins
//! or restarts learns counts whose actors are no longer there to send them.
//!
//! Updates come from the network: [`validate`] and [`relayed`] refuse what the counters must
//! not hold, and nothing here panics.

use super::actor::{Actor, actor};
use super::numbering::Numbering;

/// One node's counts for one bucket, as published.
pub use ringlimit_proto::peer::GlobalCount as Update;

/// One node incarnation's counts, relayed by another node.
pub use ringlimit_proto::peer::ActorCounts;

/// Most updates in one frame (about 30 bytes each, 45 at most): a full set of 10,000 published
/// buckets is one frame, far below the peer protocol's frame limit.
pub const MAX_PER_FRAME: usize = 20_000;
/// Most actors in one `GlobalCountsOf` frame: with [`MAX_PER_FRAME`] counts and node ids of
/// [`MAX_NODE_ID_BYTES`] at most, a frame stays under 1.2 MB, far below the frame limit.
pub const MAX_ACTORS_PER_FRAME: usize = 1_000;
/// Longest node id a relayed count may name (a DNS name, a pod's name, is at most 253 bytes).
pub const MAX_NODE_ID_BYTES: usize = 255;

/// What a peer that is new, or that may have missed a frame, is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FullSet {
    /// This node's own counts: every bucket it publishes.
    pub own: Vec<Update>,
    /// The counts this node holds for every other actor (see [`super::publish`] for the cap).
    pub others: Vec<ActorCounts>,
}

impl From<Vec<Update>> for FullSet {
    fn from(own: Vec<Update>) -> Self {
        Self {
            own,
            others: Vec::new(),
        }
    }
}

/// Why an update is not a global count this node can hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("period {0} ms is out of range (nor a calendar this node knows)")]
    Period(u64),
    #[error("window {0} is not a window of the Unix epoch's first {1} ms")]
    Window(u64, u64),
}

/// Checks an update received from a peer.
pub fn validate(u: &Update) -> Result<(), WireError> {
    // A period within the rules' bounds, or a calendar this node knows (see [`Numbering`]).
    let numbering = Numbering::from_code(u.period_ms).ok_or(WireError::Period(u.period_ms))?;
    // Windows are counted in ns since the epoch on the receiving side: one whose start does
    // not fit in a u64 of ns cannot be a real window.
    if numbering.end(u.window).is_none() {
        let limit_ms = u64::MAX / ringlimit_core::clock::NANOS_PER_MS;
        return Err(WireError::Window(u.window, limit_ms));
    }
    Ok(())
}

/// The counts of one `GlobalCountsOf` frame that this node can hold, each with its actor: at
/// most [`MAX_PER_FRAME`] counts of at most [`MAX_ACTORS_PER_FRAME`] actors, of node ids of
/// 1 to [`MAX_NODE_ID_BYTES`] bytes, each count valid. Returns them and how many counts were
/// refused (an actor refused whole with no count counts as one).
pub fn relayed(entries: &[ActorCounts]) -> (Vec<(Actor, Update)>, u64) {
    let mut out = Vec::new();
    let mut refused = 0u64;
    for (i, a) in entries.iter().enumerate() {
        let whole = (a.counts.len() as u64).max(1);
        if i >= MAX_ACTORS_PER_FRAME || a.node_id.is_empty() || a.node_id.len() > MAX_NODE_ID_BYTES
        {
            refused += whole;
            continue;
        }
        let who = actor(&a.node_id, a.generation);
        for u in &a.counts {
            if out.len() >= MAX_PER_FRAME || validate(u).is_err() {
                refused += 1;
            } else {
                out.push((who.clone(), *u));
            }
        }
    }
    (out, refused)
}

/// Splits `others` into the contents of `GlobalCountsOf` frames within [`MAX_PER_FRAME`]
/// counts and [`MAX_ACTORS_PER_FRAME`] actors each (an actor's counts may span frames); always
/// at least one, possibly empty: it marks the end of a full set.
pub fn relay_frames(others: &[ActorCounts]) -> Vec<Vec<ActorCounts>> {
    let mut frames = vec![Vec::new()];
    let mut counts = 0;
    for a in others {
        for chunk in a.counts.chunks(MAX_PER_FRAME) {
            let full = frames.last().is_some_and(|f: &Vec<ActorCounts>| {
                f.len() >= MAX_ACTORS_PER_FRAME || counts + chunk.len() > MAX_PER_FRAME
            });
            if full {
                frames.push(Vec::new());
                counts = 0;
            }
            counts += chunk.len();
            if let Some(f) = frames.last_mut() {
                f.push(ActorCounts {
                    node_id: a.node_id.clone(),
                    generation: a.generation,
                    counts: chunk.to_vec(),
                });
            }
        }
    }
    frames
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

    fn of(node_id: &str, n: u64) -> ActorCounts {
        ActorCounts {
            node_id: node_id.into(),
            generation: 3,
            counts: (0..n).map(|i| update(1_000, i + 1)).collect(),
        }
    }

    /// A relayed frame: valid counts kept with their actor; a bad node id refuses its actor,
    /// a bad count only itself, and the bounds the rest, each counted.
    #[test]
    fn relayed_counts_are_bounded_and_bad_entries_refused() {
        let mut bad_count = of("b", 2);
        bad_count.counts[1].period_ms = 0;
        let entries = [
            of("a", 2),
            bad_count,
            of("", 3),
            of(&"x".repeat(MAX_NODE_ID_BYTES + 1), 1),
            ActorCounts {
                counts: Vec::new(),
                ..of("", 0)
            },
        ];
        let (ok, refused) = relayed(&entries);
        let actors: Vec<&str> = ok.iter().map(|(a, _)| &**a).collect();
        assert_eq!(actors, ["a@3", "a@3", "b@3"]);
        assert_eq!(refused, 1 + 3 + 1 + 1);
        let (ok, refused) = relayed(&[of("a", MAX_PER_FRAME as u64 + 5)]);
        assert_eq!((ok.len(), refused), (MAX_PER_FRAME, 5));
        let many: Vec<ActorCounts> = (0..MAX_ACTORS_PER_FRAME + 2).map(|_| of("a", 1)).collect();
        let (ok, refused) = relayed(&many);
        assert_eq!((ok.len(), refused), (MAX_ACTORS_PER_FRAME, 2));
    }

    /// Frames of a full set's relayed counts stay within both bounds, lose nothing, and there
    /// is always one, empty when there is nothing to relay.
    #[test]
    fn relay_frames_stay_within_the_bounds() {
        assert_eq!(relay_frames(&[]), vec![Vec::new()]);
        let big = of("a", MAX_PER_FRAME as u64 + 10);
        let small: Vec<ActorCounts> = (0..MAX_ACTORS_PER_FRAME + 1).map(|_| of("b", 1)).collect();
        let mut all = vec![big];
        all.extend(small);
        let frames = relay_frames(&all);
        assert_eq!(frames.len(), 3);
        for f in &frames {
            assert!(f.len() <= MAX_ACTORS_PER_FRAME);
            assert!(f.iter().map(|a| a.counts.len()).sum::<usize>() <= MAX_PER_FRAME);
            let (ok, refused) = relayed(f);
            assert_eq!(refused, 0);
            assert_eq!(ok.len(), f.iter().map(|a| a.counts.len()).sum::<usize>());
        }
        let total: usize = frames.iter().flatten().map(|a| a.counts.len()).sum();
        assert_eq!(total, MAX_PER_FRAME + 10 + MAX_ACTORS_PER_FRAME + 1);
    }
}
