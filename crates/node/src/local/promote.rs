//! Promotion, on a ring change: the copies of buckets this node now owns become its buckets
//! (their owner left the ring), and copies it no longer replicates are dropped.
//!
//! What a promoted bucket is charged: its copy, nothing more. The copy lacks only what the
//! owner admitted after its last frame written: what it admitted in one flush interval
//! (`--replica-flush-ms`, [`super::sender::FLUSH_EVERY`] by default) plus a frame's way to
//! the replica, when the owner's link was healthy up to its death
//! (`ringlimit_replication_lag_seconds` says how long that is). Charging that window would have to guess the owner's rate in it: the safe guess (all
//! that was left could have gone in a burst) denies every promoted key until it refills, a
//! false deny for the whole cluster for what is at most a few ms of one owner's admissions;
//! and the owner's last rate is not sent. So the window is forgiven, and bounded instead:
//! bench/accuracy.sh measures admitted ÷ limit after a SIGKILL, and CI fails past its bound.
//! An owner that was unreachable before it died is different: its checks were decided by this
//! replica meanwhile (failover, see `crate::replicas::handback`), on the copy, so nothing it
//! could not decide is missing. A replica whose sends were failing (frames unacknowledged) may
//! miss more: the sender resends the whole store once it reaches the replica again, but
//! changes made while it could not are lost with the owner.
//!
//! A graceful leave sends both: the copy is promoted when this node sees the ring change, and
//! the leaving owner's handover may arrive before or after. Both are readings of one history,
//! so they are not added: a handover that arrives first supersedes the copy, one that arrives
//! after overlaps the promoted bucket (the larger consumption wins; `Engine::take_in`).
//!
//! A check that reaches this node for such a bucket before this pass ran (the view is in force
//! before the pass) does not start from a full bucket either: the engine starts a bucket it
//! does not hold from its copy (`Engine::decide`).

use crate::cluster::View;
use crate::local::Engine;

/// What a promotion pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Promoted {
    /// Copies that became this node's buckets.
    pub promoted: usize,
    /// Copies dropped: their owner is alive and this node no longer replicates them.
    pub dropped: usize,
}

/// Promotes the copies this node owns under `view` into `engine`'s store at `now`, and drops
/// those it neither owns nor replicates (with `n` replicas).
pub fn promote(view: &View, engine: &Engine, n: usize, now: u64) -> Promoted {
    let ring = &view.ring;
    let me = &*view.self_id;
    // A node that sees no ring (no quorum) owns nothing and drops nothing: it cannot tell.
    if ring.is_empty() {
        return Promoted::default();
    }
    let promoted = engine.promote(|id, _| ring.owner(id) == Some(me), now);
    let dropped = engine.drop_copies(|id, _| !ring.replicates(id, n, me));
    if promoted + dropped > 0 {
        tracing::info!(promoted, dropped, "replica copies promoted or dropped");
    }
    Promoted { promoted, dropped }
}
