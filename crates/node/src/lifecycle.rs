//! The node's lifecycle hooks, beside the check service: readiness, a peer client per alive
//! member as membership changes, and, when the ring changes, promoting the replica copies this
//! node now owns and handing over the buckets it no longer owns. Driven by
//! `node::run` (which follows membership); the edges read readiness.

use crate::cluster::View;
use crate::decide::Here;
use crate::peers::Peers;
use crate::replicas::ReplicaStats;
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
    here: Here,
    pool: Arc<Peers>,
    ready: AtomicBool,
    /// Buckets this node sent to their new owners after ring changes (exported by
    /// [`crate::peers::metrics::PeersCollector`], shown by the cluster view).
    handed_over: Arc<AtomicU64>,
    /// `--replicas`, and what promotion counts.
    replicas: usize,
    replica_stats: Arc<ReplicaStats>,
}

impl Lifecycle {
    /// Not ready until [`Lifecycle::set_ready`].
    pub fn new(
        here: Here,
        pool: Arc<Peers>,
        handed_over: Arc<AtomicU64>,
        replicas: usize,
        replica_stats: Arc<ReplicaStats>,
    ) -> Self {
        Self {
            here,
            pool,
            ready: AtomicBool::new(false),
            handed_over,
            replicas,
            replica_stats,
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
    /// [`crate::local::promote`]); returns how many were promoted.
    pub fn promote(&self, view: &View) -> usize {
        let done = crate::local::promote::promote(
            view,
            self.here.engine(),
            self.replicas,
            self.here.now(),
        );
        self.replica_stats
            .promoted
            .fetch_add(done.promoted as u64, Ordering::Relaxed);
        done.promoted
    }

    /// Hands the buckets this node no longer owns under `view` to their new owners (called
    /// when the ring changed; members new in it, `joined`, are told the handover's end even
    /// when nothing moves to them); returns how many moved.
    pub async fn hand_over(&self, view: &View, joined: &[Arc<str>]) -> usize {
        let moved = crate::peers::handover::hand_over(
            view,
            self.here.engine(),
            &self.pool,
            self.replicas,
            self.here.now(),
            joined,
        )
        .await;
        self.handed_over.fetch_add(moved as u64, Ordering::Relaxed);
        moved
    }
}
