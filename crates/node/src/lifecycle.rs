//! The node's lifecycle hooks, beside the check service: readiness, a peer client per alive
//! member as membership changes, and, when the ring changes, promoting the replica copies this
//! node now owns and handing over the buckets it no longer owns. Driven by the wiring's
//! lifecycle stage (`node::lifecycle`, which follows membership); the edges read readiness.
//!
//! Handover: when the ring changes, a node sends the live buckets it no longer owns to their
//! new owners, which merge them (see `BucketState::absorb`; the receiving side is
//! `peers/server/handover.rs`). A key that moves keeps its consumption instead of starting
//! from a full bucket, which is what bounds over-admission on join, leave and rolling restarts
//! to what is decided during the move itself.

use crate::cluster::View;
use crate::durable::Durable;
use crate::local::Local;
use crate::metrics::Family;
use crate::peers::Peers;
use ringlimit_core::limiter::BucketState;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Readiness as a metric, read at scrape time: what `/readyz` answers.
pub const METRICS: &[Family<Lifecycle>] = &[Family::gauge(
    "ready",
    "1 while this node answers checks (what /readyz answers 200 to), else 0.",
    |l| u64::from(l.is_ready()),
)];

/// Readiness, peers kept in step with membership, and handover.
pub struct Lifecycle {
    local: Arc<Local>,
    pool: Arc<Peers>,
    ready: AtomicBool,
    /// Buckets this node sent to their new owners after ring changes (exported by
    /// [`crate::peers::metrics::METRICS`], shown by the cluster view).
    handed_over: Arc<AtomicU64>,
    /// `--replicas`.
    replicas: usize,
    /// The disk follower (`--data-dir`): what goes while the node leaves is written first.
    durable: Option<Arc<Durable>>,
}

impl Lifecycle {
    /// Not ready until [`Lifecycle::set_ready`].
    pub fn new(
        local: Arc<Local>,
        pool: Arc<Peers>,
        handed_over: Arc<AtomicU64>,
        replicas: usize,
    ) -> Self {
        Self {
            local,
            pool,
            ready: AtomicBool::new(false),
            handed_over,
            replicas,
            durable: None,
        }
    }

    /// Writes the buckets handed over while the node leaves to `durable` first (see
    /// [`Durable::keep_handed`]).
    pub fn with_durable(mut self, durable: Option<Arc<Durable>>) -> Self {
        self.durable = durable;
        self
    }

    /// Whether this node answers checks yet (readiness).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Grants readiness, or takes it back (shutdown).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Keeps a client per alive member (called on every membership change).
    pub fn follow_members(&self, view: &View) {
        self.pool.sync(view);
    }

    /// Makes the replica copies this node owns under `view` its buckets, and drops those it no
    /// longer replicates (called when the ring changed, before [`Lifecycle::hand_over`]; see
    /// [`Local::promote`]); returns how many were promoted.
    pub fn promote(&self, view: &View) -> usize {
        // Leaving with `--data-dir`: the copies stay as they are, on disk too, for the next
        // start (out of the ring, this node owns nothing to promote them to).
        if self.durable.as_ref().is_some_and(|d| d.is_leaving()) {
            return 0;
        }
        let now = self.local.now();
        self.local.promote(view, self.replicas, now).promoted
    }

    /// Hands the buckets this node no longer owns under `view` to their new owners (called
    /// when the ring changed; members new in it, `joined`, are told the handover's end even
    /// when nothing moves to them); returns how many moved.
    pub async fn hand_over(&self, view: &View, joined: &[Arc<str>]) -> usize {
        let moved = hand_over(
            view,
            &self.local,
            &self.pool,
            self.replicas,
            self.local.now(),
            joined,
            self.durable.as_ref(),
        )
        .await;
        self.handed_over.fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }
}

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
///
/// While the node leaves, what goes is written to `durable` first (see
/// [`Durable::keep_handed`]).
async fn hand_over(
    view: &View,
    local: &Local,
    peers: &Peers,
    replicas: usize,
    now: u64,
    joined: &[Arc<str>],
    durable: Option<&Arc<Durable>>,
) -> usize {
    let ring = &view.ring;
    if ring.is_empty() {
        return 0;
    }
    // A member not seen since this node started is sent nothing: it does not answer yet, and
    // it keeps its own buckets on its disk.
    let moving = local.owned().hand_out(|id, st| {
        st.idle_at() > now
            && ring
                .owner(id)
                .is_some_and(|o| o != &*view.self_id && !view.awaits(o))
    });
    if let Some(d) = durable
        && d.is_leaving()
        && !moving.is_empty()
    {
        let (d, kept) = (d.clone(), moving.clone());
        // Off the runtime's threads: the commit waits for the disk.
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || d.keep_handed(&kept)).await {
            tracing::error!(error = %e, "cannot keep the buckets handed over on disk");
        }
    }
    let mut by_owner: HashMap<&str, Vec<(u64, BucketState)>> = HashMap::new();
    for member in joined
        .iter()
        .filter(|m| **m != view.self_id && !view.awaits(m))
    {
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
