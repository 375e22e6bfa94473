//! Bucket handover: when the ring changes, a node sends the live buckets it no longer owns to
//! their new owners, which merge them (see `BucketState::absorb`). A key that moves keeps its
//! consumption instead of starting from a full bucket, which is what bounds over-admission on
//! join, leave and rolling restarts to what is decided during the move itself.

use crate::cluster::View;
use ringlimit_core::limiter::BucketState;
use ringlimit_core::link::client::{PeerSettings, connect};
use ringlimit_core::link::framing;
use ringlimit_core::store::Store;
use ringlimit_proto::peer::{Frame, HandedBucket};
use std::collections::HashMap;
use std::time::Duration;

/// Buckets per frame (each at most a few dozen bytes, except sliding logs).
const PER_FRAME: usize = 2_000;

/// Hands the live buckets of `store` that this node no longer owns under `view`'s ring to their
/// new owners, at `now`. A bucket whose new owner cannot be reached is put back, so nothing is
/// lost. Returns how many buckets moved.
pub async fn hand_over(view: &View, store: &Store, settings: &PeerSettings, now: u64) -> usize {
    let ring = &view.ring;
    if ring.is_empty() {
        return 0;
    }
    let moving = store.take_if(|id, st| {
        st.idle_at() > now && ring.owner(id).is_some_and(|o| o != &*view.self_id)
    });
    if moving.is_empty() {
        return 0;
    }
    let mut by_owner: HashMap<&str, Vec<(u64, BucketState)>> = HashMap::new();
    for (id, st) in moving {
        if let Some(owner) = ring.owner(id) {
            by_owner.entry(owner).or_default().push((id, st));
        }
    }
    let mut moved = 0;
    for (owner, buckets) in by_owner {
        let Some(addr) = view.peer_addrs.get(owner) else {
            continue;
        };
        let n = buckets.len();
        match push(addr, settings, &buckets).await {
            Ok(_) => moved += n,
            Err(e) => {
                tracing::warn!(%owner, error = %e, buckets = n, "handover failed; keeping the buckets here");
                for (id, st) in buckets {
                    store.absorb(id, st, now);
                }
            }
        }
    }
    if moved > 0 {
        tracing::info!(buckets = moved, "buckets handed over to their new owners");
    }
    moved
}

/// Merges buckets handed over by their previous owner into `store` at `now`; returns how many.
pub fn receive(store: &Store, buckets: Vec<HandedBucket>, now: u64) -> u64 {
    let merged = buckets.len() as u64;
    for b in buckets {
        store.absorb(b.id, BucketState::from_wire(b.state), now);
    }
    merged
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
                state: st.to_wire(),
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
