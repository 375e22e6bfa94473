//! The node's lifecycle hooks, beside the check service: readiness, a peer client per alive
//! member as membership changes, and, when the ring changes, promoting the replica copies this
//! node now owns and handing over the buckets it no longer owns. Driven by
//! `node::run` (which follows membership); the edges read readiness.

use crate::cluster::View;
use crate::local::Local;
use crate::peers::Peers;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Readiness as a metric (`ringlimit_ready`), read at scrape time: what `/readyz` answers.
pub struct ReadyCollector(pub Arc<Lifecycle>);

impl std::fmt::Debug for ReadyCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadyCollector")
    }
}

impl prometheus_client::collector::Collector for ReadyCollector {
    fn encode(
        &self,
        mut e: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        crate::metrics::encode_one(
            &mut e,
            crate::metrics::Kind::Gauge,
            "ready",
            "1 while this node answers checks (what /readyz answers 200 to), else 0.",
            u64::from(self.0.is_ready()),
        )
    }
}

/// Readiness, peers kept in step with membership, and handover.
pub struct Lifecycle {
    local: Arc<Local>,
    pool: Arc<Peers>,
    ready: AtomicBool,
    /// Buckets this node sent to their new owners after ring changes (exported by
    /// [`crate::peers::metrics::PeersCollector`], shown by the cluster view).
    handed_over: Arc<AtomicU64>,
    /// `--replicas`.
    replicas: usize,
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
        }
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
        let now = self.local.now();
        self.local.promote(view, self.replicas, now).promoted
    }

    /// Hands the buckets this node no longer owns under `view` to their new owners (called
    /// when the ring changed; members new in it, `joined`, are told the handover's end even
    /// when nothing moves to them); returns how many moved.
    pub async fn hand_over(&self, view: &View, joined: &[Arc<str>]) -> usize {
        let moved = crate::peers::handover::hand_over(
            view,
            &self.local,
            &self.pool,
            self.replicas,
            self.local.now(),
            joined,
        )
        .await;
        self.handed_over.fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }
}
