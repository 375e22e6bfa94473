//! Where a check is decided: here when this node owns the bucket (or the rule is global), at
//! the owner otherwise, and from a local fallback share when the owner cannot answer in time
//! (fail-open). The deciding is core's coordinator ([`ringlimit_core::coordinator`], shared
//! with the SDK); this is the node's side of it: its routing, its share buckets, its counters.
//!
//! # Layout
//! - this module — [`Router`]: checks that arrive at an edge of this node, routed by the
//!   coordinator; reservations at their owner.
//! - [`arrived`] — checks that arrive from peers: decided here, relayed once, stood in for.
//! - `gate` — the batch gate: long batches decide in slices, one at a time per thread.
//! - `timed` — RPC timing around the owner's link.
//! - [`hot_keys`] — the buckets this node forwards most, promoted and demoted (for leases).
//! - [`metrics`] — the routing's counters as metrics.

pub mod arrived;
mod gate;
pub mod hot_keys;
pub mod metrics;
mod timed;

use crate::cluster::View;
use crate::local::Local;
use crate::metrics::PeerRpcMetrics;
use crate::peers::{PeersHandle, Recall};
use crate::rules::Prepared;
use arc_swap::ArcSwap;
use gate::BatchTurn;
use parking_lot::Mutex;
use ringlimit_core::check::{CheckError, Resolved};
use ringlimit_core::coordinator::{
    self, Batch, Fallback, FallbackCause, Item, Route, Share, ShareTaken, Standby,
};
use ringlimit_core::lease::{self, Take};
use ringlimit_core::reservations::ReserveError;
use ringlimit_core::rule::{LeaseMode, Mode, OnOwnerUnreachable};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{BlockSource, Mark, PeerCheck, PeerRefund, PeerReserve, PeerSettle};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use timed::Timed;

pub use ringlimit_core::coordinator::fallback_id;

/// Routing counters.
#[derive(Debug, Default)]
pub struct RoutingStats {
    /// Checks sent to their owner.
    pub forwarded: AtomicU64,
    /// Checks from peers relayed to their owner because this node had handed their bucket
    /// over (see [`arrived`]).
    pub relayed: AtomicU64,
    /// All-or-nothing requests denied, whose admitted checks gave their cost back.
    pub refunded_requests: AtomicU64,
    /// Refunds that could not reach their owner (the cost stays taken: a false deny at worst).
    pub refunds_lost: AtomicU64,
    /// Checks answered from the fallback share (degraded) because the owner could not answer.
    pub fail_open: AtomicU64,
    /// Checks denied because the owner could not answer and the rule is `closed`.
    pub fail_closed: AtomicU64,
    /// Owner-mode checks answered without an owner because this node saw fewer than a majority
    /// of the cluster (also counted in `fail_open` or `fail_closed`).
    pub minority: AtomicU64,
    /// Checks whose owner did not answer, decided by its replica on its copy (not degraded).
    pub replica: AtomicU64,
    /// Checks of buckets other members own admitted here on a lease's slice.
    pub leased: AtomicU64,
    /// Checks denied here because the owner said, answering an ask for a slice, that the
    /// bucket denies until then.
    pub leased_denied: AtomicU64,
    /// The buckets forwarded most.
    pub hot: Arc<hot_keys::Forwarded>,
}

/// Sends each check where it is decided.
pub struct Router {
    local: Arc<Local>,
    view: Arc<ArcSwap<View>>,
    /// This runtime's way to the members (see [`crate::peers::Peers::for_runtime`]).
    pool: PeersHandle,
    /// Shared by every runtime's copy.
    pub stats: Arc<RoutingStats>,
    rpc: PeerRpcMetrics,
    /// `--replicas`: who stands in for an owner that does not answer.
    replicas: usize,
    /// Buckets this node owns but does not hold yet, recalled before their first check.
    recall: Option<Arc<Recall>>,
}

impl Router {
    pub fn new(
        local: Arc<Local>,
        view: Arc<ArcSwap<View>>,
        pool: PeersHandle,
        rpc: PeerRpcMetrics,
    ) -> Self {
        Self {
            local,
            view,
            pool,
            stats: Arc::default(),
            rpc,
            replicas: 0,
            recall: None,
        }
    }

    /// Sends checks whose owner does not answer to the owner's first live replica among the
    /// next `n` members (`--replicas`; 0: straight to the fallback share).
    pub fn with_replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Recalls buckets through `recall` before deciding their first checks here (see
    /// [`crate::peers::recall_on_join`]).
    pub fn with_recall(mut self, recall: Arc<Recall>) -> Self {
        self.recall = Some(recall);
        self
    }

    /// Recalls, while this node may, the buckets of `items` it may decide here (before the
    /// view they are routed under is read: see [`Recall::before`]).
    async fn recall_before(&self, items: &[Prepared<'_>]) {
        if let Some(recall) = self.recall.as_ref().filter(|r| r.active()) {
            let owned = items.iter().filter(|p| p.resolved.mode == Mode::Owner);
            recall.before(owned.map(|p| p.id).collect()).await;
        }
    }

    /// This router for a runtime of its own (an HTTP thread's): the same view, stats and
    /// metrics, and that runtime's copies of the members' clients.
    pub fn for_runtime(&self) -> Self {
        Self {
            local: self.local.clone(),
            view: self.view.clone(),
            pool: self.pool.peers().for_runtime(),
            stats: self.stats.clone(),
            rpc: self.rpc.clone(),
            replicas: self.replicas,
            recall: self.recall.clone(),
        }
    }

    /// The current membership view.
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// Decides one prepared check wherever it belongs.
    pub async fn check(&self, p: &Prepared<'_>) -> Result<CheckAnswer, CheckError> {
        self.check_blocked(p).await.map(|(a, _)| a)
    }

    /// [`Router::check`], and the source of the block the key's owner denied it by, when it
    /// did (a block not announced here yet).
    pub async fn check_blocked(
        &self,
        p: &Prepared<'_>,
    ) -> Result<(CheckAnswer, Option<BlockSource>), CheckError> {
        self.recall_before(std::slice::from_ref(p)).await;
        let view = self.view.load();
        let site = self.site(&view);
        let answer = coordinator::check(&site, p).await?;
        let blocked = site.blocks(1)[0].filter(|_| !answer.allowed);
        Ok((answer, blocked))
    }

    /// Decides many checks: those decided here at one instant, each owner's as one group (one
    /// frame), all owners at once. Answers come back in the order of `items`, each with the
    /// source of the block its owner denied it by, as [`Router::check_blocked`] says.
    pub async fn check_many(&self, items: &[Prepared<'_>]) -> Vec<Routed> {
        self.recall_before(items).await;
        let view = self.view.load_full();
        let site = self.site(&view);
        let mut turn = BatchTurn::take(items.len()).await;
        // One instant for the whole batch (see `Here::decide_at`), taken once it may decide.
        let mut many = Batch::new(items.len(), self.local.now());
        for (i, p) in items.iter().enumerate() {
            turn.pace(i).await;
            many.add(&site, p);
        }
        turn.release();
        let answers = many.finish(&site, items).await;
        turn.end().await;
        with_blocks(answers, site.blocks(items.len()))
    }

    /// Decides one request's checks all-or-nothing (the check service's `check_all`):
    /// admitted only when every non-shadow check admits; otherwise every check that took its
    /// cost gives it back before this returns (see [`coordinator::check_all`]).
    /// Each answer comes with the source of the block its owner denied it by (see
    /// [`Router::check_blocked`]).
    pub async fn check_all(&self, items: &[Prepared<'_>]) -> Vec<Routed> {
        self.recall_before(items).await;
        let view = self.view.load_full();
        let site = self.site(&view);
        let answers = coordinator::check_all(&site, items).await;
        with_blocks(answers, site.blocks(items.len()))
    }

    /// Reserves a prepared check's cost (its estimate) at the bucket's owner for `ttl_ms`,
    /// kept there under `nonce`: the check's answer (denied: nothing kept). Never failed open:
    /// a reservation needs its owner (no owner reached: [`ReserveError::Unavailable`]).
    pub async fn reserve(
        &self,
        p: &Prepared<'_>,
        ttl_ms: u64,
        nonce: u128,
    ) -> Result<CheckAnswer, ReserveError> {
        self.recall_before(std::slice::from_ref(p)).await;
        let view = self.view.load_full();
        let addr = match self.owner_addr(&view, p.id)? {
            None => {
                let now = self.local.now();
                return self
                    .local
                    .reserve(&p.resolved, p.id, (p.cost, ttl_ms, nonce), now);
            }
            Some(addr) => addr,
        };
        ringlimit_core::reservations::reservable(&p.resolved)?;
        let ask = PeerReserve {
            key: p.key.to_owned(),
            rule: p.spec.to_ref(),
            cost: p.cost,
            ttl_ms,
            nonce,
        };
        self.pool.peers().reserve(&addr, ask).await
    }

    /// Settles reservation `nonce` of a prepared check's bucket at its actual cost (`p.cost`)
    /// at the bucket's owner: the bucket's answer afterwards, or [`ReserveError::Unknown`].
    pub async fn settle(&self, p: &Prepared<'_>, nonce: u128) -> Result<CheckAnswer, ReserveError> {
        let view = self.view.load_full();
        let Some(addr) = self.owner_addr(&view, p.id)? else {
            let now = self.local.now();
            return self.local.settle(&p.resolved, p.id, (nonce, p.cost), now);
        };
        ringlimit_core::reservations::reservable(&p.resolved)?;
        let settle = PeerSettle {
            key: p.key.to_owned(),
            rule: p.spec.to_ref(),
            nonce,
            cost: p.cost,
        };
        self.pool.peers().settle(&addr, settle).await
    }

    /// The peer address of bucket `id`'s owner under `view`; `None`: this node. Without a
    /// majority this node owns no keys, and a reservation cannot be taken here.
    fn owner_addr(&self, view: &View, id: u64) -> Result<Option<String>, ReserveError> {
        if !self.owns_keys(view) {
            return Err(ReserveError::Unavailable(
                "this node sees fewer than a majority of the cluster".into(),
            ));
        }
        match view.ring.owner(id) {
            None => Ok(None),
            Some(owner) if owner == &*view.self_id => Ok(None),
            Some(owner) => view
                .peer_addrs
                .get(owner)
                .cloned()
                .map(Some)
                .ok_or_else(|| {
                    ReserveError::Unavailable("the key's owner has no known address".into())
                }),
        }
    }

    /// Whether this node, as the view stands, is the owner of bucket `id`: it owns keys (see
    /// [`Router::owns_keys`]) and its ring names it.
    pub fn owns(&self, id: u64) -> bool {
        let view = self.view.load();
        self.owns_keys(&view) && view.ring.owner(id) == Some(&*view.self_id)
    }

    /// Decides checks of buckets this node owns here, at one instant, each marked with what
    /// it took so that it can be given back ([`Local::hold_on`]; ringlimit.v1's held checks).
    pub async fn hold_here(&self, items: &[Prepared<'_>]) -> Vec<(CheckAnswer, Option<Mark>)> {
        self.recall_before(items).await;
        let now = self.local.now();
        items
            .iter()
            .map(|p| self.local.hold_on(crate::local::Placement::Bucket, p, now))
            .collect()
    }

    /// Answers a client's lease asks as the owner (`Local::lease_ask`, the peer port's path):
    /// each ask's bucket (prepared, or why not) and the tokens it wants, for `holder`. The
    /// buckets this node owns but does not hold yet are recalled first (a slice of a fresh
    /// bucket would over-admit).
    pub async fn lease_here(
        &self,
        asks: &[(Result<Prepared<'_>, CheckError>, u64)],
        holder: &str,
    ) -> Vec<ringlimit_proto::peer::LeaseGrant> {
        let valid: Vec<Prepared<'_>> = asks
            .iter()
            .filter_map(|(p, _)| p.as_ref().ok().cloned())
            .collect();
        self.recall_before(&valid).await;
        let now = self.local.now();
        asks.iter()
            .map(|(p, want)| match p {
                Ok(p) => self.local.lease_ask(
                    (&p.resolved, p.key),
                    p.id,
                    self.owns(p.id),
                    (holder, *want),
                    now,
                ),
                Err(e) => ringlimit_proto::peer::LeaseGrant::Error {
                    code: e.code().to_owned(),
                    message: e.to_string(),
                },
            })
            .collect()
    }

    /// Gives back `p.cost` to a bucket this node decided, taken by the admission `mark` (a
    /// client's hold or lease slice, bounded by its ledger before it comes here).
    pub fn give_back(&self, p: &Prepared<'_>, mark: Mark) {
        use ringlimit_core::coordinator::Here as _;
        self.local.refund(p, mark);
    }

    /// Whether this node owns keys under `view`: it sees a majority of the members it last knew
    /// through gossip (`cluster::quorum`) and over their peer links (`peers::reach`).
    pub fn owns_keys(&self, view: &View) -> bool {
        view.quorum.quorate && !self.pool.cut_off()
    }

    /// The coordinator's view of this node under `view`.
    fn site<'a>(&'a self, view: &'a View) -> Site<'a> {
        Site {
            d: self,
            view,
            blocked: Mutex::new(Vec::new()),
        }
    }
}

/// A routed check's answer and the source of the block its owner denied it by, if it did.
pub type Routed = Result<(CheckAnswer, Option<BlockSource>), CheckError>;

/// `answers` each with its block from `blocks` (a denied answer only).
fn with_blocks(
    answers: Vec<Result<CheckAnswer, CheckError>>,
    blocks: Vec<Option<BlockSource>>,
) -> Vec<Routed> {
    answers
        .into_iter()
        .zip(blocks)
        .map(|(a, b)| a.map(|a| (a, b.filter(|_| !a.allowed))))
        .collect()
}

/// This node as the coordinator sees it, under one membership view.
struct Site<'a> {
    d: &'a Router,
    view: &'a View,
    /// The checks owners answered denied by a block (by index), and its source: few, and
    /// nothing allocated while there are none.
    blocked: Mutex<Vec<(usize, BlockSource)>>,
}

impl Site<'_> {
    /// The block each of `n` checks was answered by (see [`coordinator::Site::blocked`]).
    fn blocks(&self, n: usize) -> Vec<Option<BlockSource>> {
        let mut out = vec![None; n];
        for (i, source) in self.blocked.lock().drain(..) {
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(source);
            }
        }
        out
    }

    /// The fallback share: buckets beside the owner buckets, under salted ids.
    fn share(&self) -> Share<'_> {
        self.d.local.owned().share()
    }
}

impl Site<'_> {
    /// A check of a bucket another member owns, decided on a slice of it this node holds
    /// (see `crate::leases`), or denied here as its owner said; `None`: to the owner.
    fn leased<L, H>(&self, p: &Prepared<'_>) -> Option<Route<L, H>> {
        if p.resolved.lease == LeaseMode::Off || !lease::leasable(p.resolved.rule.algorithm) {
            return None;
        }
        let held = self.d.local.leases().held();
        let key = || (p.key.to_owned(), p.spec.to_ref());
        let stats = &self.d.stats;
        match held.take_with(p.id, p.cost, || self.d.local.now(), key) {
            Take::Forward => None,
            Take::Leased(answer, taken) => {
                stats.leased.fetch_add(1, Ordering::Relaxed);
                Some(Route::Leased(answer, Some(taken)))
            }
            Take::Denied(answer) => {
                stats.leased_denied.fetch_add(1, Ordering::Relaxed);
                Some(Route::Leased(answer, None))
            }
        }
    }
}

impl<'a> coordinator::Site<Prepared<'_>> for Site<'a> {
    type Link = Timed<'a>;
    type Here = &'a Local;

    /// Here (this node owns the bucket, or the rule is global: decided where it lands), at
    /// its owner, or from the fallback share when this node sees fewer than a majority of the
    /// cluster (then it owns no keys: see `cluster::quorum`).
    fn route(&self, p: &Prepared<'_>) -> Route<Timed<'a>, &'a Local> {
        let d = self.d;
        if p.resolved.mode == Mode::Global {
            return Route::Here(&d.local);
        }
        if !d.owns_keys(self.view) {
            d.stats.minority.fetch_add(1, Ordering::Relaxed);
            let own = self.view.ring.owner(p.id) == Some(&*self.view.self_id);
            return Route::Share {
                own: own.then_some(&d.local),
            };
        }
        // A bucket leased here was forwarded a moment ago (and a ring change releases every
        // lease): looked for before the owner, whose lookup a leased check does not need.
        if let Some(leased) = self.leased(p) {
            d.stats.hot.record(p.id);
            return leased;
        }
        match d.pool.owner_client(self.view, p.id) {
            None => Route::Here(&d.local),
            Some((owner, client)) => {
                d.stats.hot.record(p.id);
                Route::Owner(
                    owner,
                    Timed {
                        client,
                        rpc: &d.rpc,
                        clock: d.local.clock(),
                    },
                )
            }
        }
    }

    fn now(&self) -> u64 {
        self.d.local.now()
    }

    /// A local share of the limit (of the last known cluster), or a denial.
    fn fall_back(
        &self,
        p: &Prepared<'_>,
        why: FallbackCause,
    ) -> Result<(CheckAnswer, Option<ShareTaken>), CheckError> {
        let fallback = self.share().fall_back(
            p.id,
            Some(&p.resolved),
            p.cost,
            self.view.share_members(),
            self.d.local.now(),
        );
        if let FallbackCause::Unreachable(e) = why {
            tracing::debug!(error = %e, "owner unreachable; failing {}", match p.resolved.on_unreachable {
                OnOwnerUnreachable::Open => "open",
                OnOwnerUnreachable::Closed => "closed",
            });
        }
        let counter = match fallback {
            Fallback::Closed(_) => &self.d.stats.fail_closed,
            Fallback::Open(..) | Fallback::Unknown(_) => &self.d.stats.fail_open,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(fallback.held())
    }

    /// The owner's first replica this node can reach: itself (it decides on its own copy), or
    /// a member whose link is up.
    fn replica(&self, p: &Prepared<'_>) -> Option<Standby<Timed<'a>, &'a Local>> {
        let d = self.d;
        if d.replicas == 0 {
            return None;
        }
        for member in self.view.ring.replicas(p.id, d.replicas) {
            if member == &*self.view.self_id {
                return Some(Standby::Here(&d.local));
            }
            if let Some((id, client)) = d.pool.client(member)
                && client.available()
            {
                let link = Timed {
                    client,
                    rpc: &d.rpc,
                    clock: d.local.clock(),
                };
                return Some(Standby::Member(id, link));
            }
        }
        None
    }

    fn replica_answered(&self) {
        self.d.stats.replica.fetch_add(1, Ordering::Relaxed);
    }

    fn refund_share(&self, taken: &ShareTaken) {
        self.share().refund(taken, self.d.local.now());
    }

    fn refund_lease(&self, taken: &lease::SliceTaken) {
        self.d.local.leases().held().give_back(taken);
    }

    fn forwarded(&self) {
        self.d.stats.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    fn blocked(&self, index: usize, _: &Prepared<'_>, _: &CheckAnswer, source: BlockSource) {
        self.blocked.lock().push((index, source));
    }

    fn gave_back(&self, lost: u64) {
        let stats = &self.d.stats;
        stats.refunded_requests.fetch_add(1, Ordering::Relaxed);
        if lost > 0 {
            stats.refunds_lost.fetch_add(lost, Ordering::Relaxed);
            tracing::debug!(
                lost,
                "refunds did not reach their owner; their costs stay taken"
            );
        }
    }
}

impl Item for Prepared<'_> {
    fn id(&self) -> u64 {
        self.id
    }

    fn cost(&self) -> u64 {
        self.cost
    }

    fn resolved(&self) -> Option<&Resolved> {
        Some(&self.resolved)
    }

    fn peer_check(&self) -> PeerCheck {
        PeerCheck {
            key: self.key.to_owned(),
            rule: self.spec.to_ref(),
            cost: self.cost,
        }
    }

    fn peer_refund(&self, mark: Mark) -> PeerRefund {
        PeerRefund {
            key: self.key.to_owned(),
            rule: self.spec.to_ref(),
            cost: self.cost,
            mark,
        }
    }
}
