//! Bucket handover: when the ring changes, a node sends the live buckets it no longer owns to
//! their new owners, which merge them (see `BucketState::absorb`). A key that moves keeps its
//! consumption instead of starting from a full bucket, which is what bounds over-admission on
//! join, leave and rolling restarts to what is decided during the move itself.

use super::Peers;
use crate::cluster::View;
use crate::local::Local;
use ringlimit_core::limiter::BucketState;
use std::collections::HashMap;
use std::sync::Arc;

/// Hands the live buckets of `local` that this node no longer owns under `view`'s ring to their
/// new owners (through `peers`), at `now`. A bucket whose new owner cannot be reached is put
/// back, so nothing is lost. Returns how many buckets moved.
///
/// With `replicas` > 0, a bucket handed to an owner this node now replicates (a joining
/// member takes its keys from the member after it: this one) stays here as its copy, as the
/// new owner's replication would make it: so a check that fails over to this node while the
/// new owner does not answer yet, and a recall that crosses the handover, find the state
/// instead of nothing.
///
/// Every member in `joined` (new in the ring) is sent at least the end of a handover (an empty
/// frame), so that it knows it has everything this node had for it.
pub async fn hand_over(
    view: &View,
    local: &Local,
    peers: &Peers,
    replicas: usize,
    now: u64,
    joined: &[Arc<str>],
) -> usize {
    let ring = &view.ring;
    if ring.is_empty() {
        return 0;
    }
    let moving = local.owned().hand_out(|id, st| {
        st.idle_at() > now && ring.owner(id).is_some_and(|o| o != &*view.self_id)
    });
    let mut by_owner: HashMap<&str, Vec<(u64, BucketState)>> = HashMap::new();
    for member in joined.iter().filter(|m| **m != view.self_id) {
        by_owner.entry(member).or_default();
    }
    for (id, st) in moving {
        if let Some(owner) = ring.owner(id) {
            by_owner.entry(owner).or_default().push((id, st));
        }
    }
    let replicated = |id: u64| view.ring.replicates(id, replicas, &view.self_id);
    let mut moved = 0;
    for (owner, buckets) in by_owner {
        let Some(addr) = view.peer_addrs.get(owner) else {
            continue;
        };
        let n = buckets.len();
        // Kept before the frame leaves: a recall that crosses it must find the copy.
        for (id, st) in buckets.iter().filter(|(id, _)| replicated(*id)) {
            local.copies().keep(*id, Some(st.clone()), now);
        }
        match peers.hand_over(addr, &buckets).await {
            Ok(_) => moved += n,
            Err(e) => {
                tracing::warn!(%owner, error = %e, buckets = n, "handover failed; keeping the buckets here");
                // Back in the store (which drops the copy): this node's again.
                for (id, st) in buckets {
                    local.take_in(id, st, now);
                }
            }
        }
    }
    if moved > 0 {
        tracing::info!(buckets = moved, "buckets handed over to their new owners");
    }
    moved
}
