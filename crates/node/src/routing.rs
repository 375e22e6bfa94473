//! Where a check is decided: here when this node owns the bucket (or the rule is global), at
//! the owner otherwise, and from a local fallback share when the owner cannot answer in time
//! (fail-open). One path for single checks and batches: group by owner, one group per owner.

use crate::cluster::View;
use crate::decide::Here;
use crate::engine::Prepared;
use crate::forward::PeerPool;
use crate::metrics::{PeerRpcMetrics, seconds};
use arc_swap::ArcSwap;
use ringlimit_core::answer::{closed_answer, decide_share};
use ringlimit_core::check::CheckError;
use ringlimit_core::link::fanout::{self, OwnerGroups};
use ringlimit_core::link::{ForwardError, PeerClient};
use ringlimit_core::rule::{Mode, OnOwnerUnreachable, share_of};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{PeerAnswer, PeerCheck};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Salt that keeps a key's fallback bucket apart from its owner-mode bucket on the same node.
const FALLBACK_SALT: u64 = 0x6661_6c6c_6261_636b; // "fallback"

/// The identity of the fail-open fallback bucket of bucket `id` (held by any node).
pub fn fallback_id(id: u64) -> u64 {
    id ^ FALLBACK_SALT
}

/// Routing counters.
#[derive(Debug, Default)]
pub struct DispatchStats {
    /// Checks sent to their owner.
    pub forwarded: AtomicU64,
    /// Checks answered from the fallback share (degraded) because the owner could not answer.
    pub fail_open: AtomicU64,
    /// Checks denied because the owner could not answer and the rule is `closed`.
    pub fail_closed: AtomicU64,
}

/// Sends each check where it is decided.
pub struct Dispatcher {
    here: Here,
    view: Arc<ArcSwap<View>>,
    pool: Arc<PeerPool>,
    pub stats: DispatchStats,
    rpc: PeerRpcMetrics,
}

impl Dispatcher {
    pub fn new(
        here: Here,
        view: Arc<ArcSwap<View>>,
        pool: Arc<PeerPool>,
        rpc: PeerRpcMetrics,
    ) -> Self {
        Self {
            here,
            view,
            pool,
            stats: DispatchStats::default(),
            rpc,
        }
    }

    /// The current membership view.
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// Decides one prepared check wherever it belongs.
    pub async fn check(&self, p: &Prepared<'_>) -> Result<CheckAnswer, CheckError> {
        let view = self.view.load();
        match self.owner(&view, p) {
            None => Ok(self.here.decide(p)),
            Some((_, client)) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                let sent = self.send(client, vec![peer_check(p)]).await;
                let reply = sent.and_then(|mut a| a.pop().ok_or(ForwardError::Mismatch));
                self.settle(p, reply, view.alive())
            }
        }
    }

    /// Decides many checks: those decided here at one instant, each owner's as one group (one
    /// frame), all owners at once. Answers come back in the order of `items`.
    pub async fn check_many(&self, items: &[Prepared<'_>]) -> Vec<Result<CheckAnswer, CheckError>> {
        let view = self.view.load_full();
        let mut results: Vec<Option<Result<CheckAnswer, CheckError>>> =
            Vec::with_capacity(items.len());
        let mut groups = OwnerGroups::new();
        // One instant for the whole batch (see `Engine::decide_at`).
        let now = self.here.now();
        for (i, p) in items.iter().enumerate() {
            match self.owner(&view, p) {
                None => results.push(Some(Ok(self.here.decide_at(
                    p.id,
                    &p.resolved,
                    p.cost,
                    now,
                )))),
                Some((owner, client)) => {
                    results.push(None);
                    groups.add(owner, &client, i);
                    self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let replies = groups
            .send(
                |i| peer_check(&items[i]),
                |client, checks| self.send(client, checks),
            )
            .await;
        for (i, reply) in replies {
            results[i] = Some(self.settle(&items[i], reply, view.alive()));
        }
        // Every forwarded check got a reply above, so every slot is filled.
        results
            .into_iter()
            .zip(items)
            .map(|(r, p)| r.unwrap_or_else(|| Ok(self.fallback(p, view.alive()))))
            .collect()
    }

    /// The check's owner and its client, or `None` when this node decides it (it owns the
    /// bucket, or the rule is global: decided where it lands).
    fn owner(&self, view: &View, p: &Prepared<'_>) -> Option<(Arc<str>, Arc<PeerClient>)> {
        if p.resolved.mode == Mode::Global {
            return None;
        }
        self.pool.owner_client(view, p.id)
    }

    /// Sends one group to its owner's client, observing its size and, when answered, its time.
    async fn send(
        &self,
        client: Arc<PeerClient>,
        checks: Vec<PeerCheck>,
    ) -> Result<Vec<PeerAnswer>, ForwardError> {
        self.rpc.checks.observe(checks.len() as f64);
        let start = self.here.now();
        let sent = client.send(checks).await;
        if sent.is_ok() {
            self.rpc.duration.observe(seconds(start, self.here.now()));
        }
        sent
    }

    /// Turns the owner's reply — or its absence — into an answer.
    fn settle(
        &self,
        p: &Prepared<'_>,
        reply: Result<PeerAnswer, ForwardError>,
        alive: usize,
    ) -> Result<CheckAnswer, CheckError> {
        fanout::settle(reply, |e| {
            tracing::debug!(error = %e, "owner unreachable; failing {}", match p.resolved.on_unreachable {
                OnOwnerUnreachable::Open => "open",
                OnOwnerUnreachable::Closed => "closed",
            });
            Ok(self.fallback(p, alive))
        })
    }

    /// The answer when the owner cannot be reached: a local share of the limit, or a denial.
    fn fallback(&self, p: &Prepared<'_>, alive: usize) -> CheckAnswer {
        let rule = p.resolved.rule;
        let now = self.here.now();
        if p.resolved.on_unreachable == OnOwnerUnreachable::Closed {
            self.stats.fail_closed.fetch_add(1, Ordering::Relaxed);
            return closed_answer(&rule, now);
        }
        self.stats.fail_open.fetch_add(1, Ordering::Relaxed);
        decide_share(
            self.here.engine().store(),
            fallback_id(p.id),
            &rule,
            &share_of(&rule, alive),
            p.cost,
            now,
        )
    }
}

fn peer_check(p: &Prepared<'_>) -> PeerCheck {
    PeerCheck {
        key: p.key.to_owned(),
        rule: p.spec.to_ref(),
        cost: p.cost,
    }
}
