//! `GlobalCounts` and `GlobalCountsOf`: a member's counts of global-rule buckets, its own and
//! (ending a full set) those it holds of other actors. Unanswered: counts are absolute and
//! merged by maximum, and the sender resyncs after any loss (see `crate::global::push`).

use super::{Caller, PeerServer};
use ringlimit_proto::peer::{ActorCounts, GlobalCount};
use std::sync::atomic::Ordering;

/// Global counts merged between two yields to the runtime.
const MERGE_SLICE: usize = 512;

/// Applies `merge` to `items` in slices of [`MERGE_SLICE`], yielding between them: a full set
/// (up to 10,000 counts, a few ms to merge) must not hold up the checks sharing this worker.
async fn in_slices<T>(items: &[T], mut merge: impl FnMut(&[T])) {
    for (i, slice) in items.chunks(MERGE_SLICE).enumerate() {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        merge(slice);
    }
}

impl PeerServer {
    /// The sender's own counts, of its incarnation `generation`; `bytes` is the frame's size.
    pub(super) async fn global_counts(
        &self,
        caller: &Caller<'_>,
        generation: u64,
        counts: Vec<GlobalCount>,
        bytes: usize,
    ) {
        let global = self.local.global();
        in_slices(&counts, |slice| {
            global.receive(caller.peer, generation, slice, self.local.now());
        })
        .await;
        global
            .stats
            .received_bytes
            .fetch_add(bytes as u64 + 4, Ordering::Relaxed);
    }

    /// The end of the peer's full set: the counts it holds of other actors, merged under each
    /// actor (bounded and validated first).
    pub(super) async fn global_counts_of(
        &self,
        caller: &Caller<'_>,
        counts: Vec<ActorCounts>,
        bytes: usize,
    ) {
        let global = self.local.global();
        let (valid, refused) = crate::global::wire::relayed(&counts);
        global.stats.malformed.fetch_add(refused, Ordering::Relaxed);
        in_slices(&valid, |slice| {
            global.merge_relayed(slice, self.local.now())
        })
        .await;
        global.note_merge(caller.peer, std::time::Instant::now());
        global.note_full_set(caller.peer);
        global
            .stats
            .received_bytes
            .fetch_add(bytes as u64 + 4, Ordering::Relaxed);
    }
}
