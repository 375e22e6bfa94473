//! Where a check is decided: here when this node owns the bucket, at the owner otherwise, and
//! from a local fallback share when the owner cannot answer in time (fail-open). Global rules
//! are decided here always, from the gossiped counters ([`crate::global`]).

use crate::cluster::View;
use crate::engine::{CheckError, Engine, Resolved, RuleSpec};
use crate::forward::{ForwardError, PeerClient, PeerSettings, PeerStats};
use crate::global::GlobalCounters;
use crate::metrics::{PeerRpcMetrics, seconds};
use crate::rules::{Mode, OnOwnerUnreachable};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use ringlimit_proto::peer::{PeerAnswer, PeerCheck};
use ringlimit_proto::{CheckAnswer, RuleRef};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Salt that keeps a key's fallback bucket apart from its owner-mode bucket on the same node.
const FALLBACK_SALT: u64 = 0x6661_6c6c_6261_636b; // "fallback"

/// The identity of the fail-open fallback bucket of bucket `id` (held by any node).
pub fn fallback_id(id: u64) -> u64 {
    id ^ FALLBACK_SALT
}

/// Per-thread peer clients of the single-threaded HTTP runtimes, by router (a process may run
/// several nodes, in tests).
struct LocalPeers {
    generation: u64,
    /// By member: the shared client this one mirrors (a member that left and came back gets a
    /// new shared client, and so a new local one: the old one's circuit may still be open),
    /// and this runtime's own client.
    peers: HashMap<Arc<str>, (Arc<PeerClient>, Arc<PeerClient>)>,
}

thread_local! {
    static LOCAL_PEERS: std::cell::RefCell<HashMap<u64, LocalPeers>> =
        std::cell::RefCell::new(HashMap::new());
    /// Set on the threads of the dedicated HTTP runtimes (see [`use_runtime_local_peers`]).
    static ON_HTTP_RUNTIME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes checks routed from this thread use peer clients of their own, spawned on this
/// thread's single-threaded runtime (called by each HTTP runtime's thread).
pub fn use_runtime_local_peers() {
    ON_HTTP_RUNTIME.set(true);
}

/// Distinguishes routers in the per-thread client cache.
static NEXT_ROUTER_ID: AtomicU64 = AtomicU64::new(0);

/// One validated check, ready to route.
#[derive(Debug, Clone)]
pub struct Prepared<'a> {
    pub key: &'a str,
    pub spec: RuleSpec<'a>,
    pub cost: u64,
    pub resolved: Resolved,
    pub id: u64,
}

/// Routing counters.
#[derive(Debug, Default)]
pub struct RouterStats {
    /// Checks sent to their owner.
    pub forwarded: AtomicU64,
    /// Checks answered from the fallback share (degraded) because the owner could not answer.
    pub fail_open: AtomicU64,
    /// Checks denied because the owner could not answer and the rule is `closed`.
    pub fail_closed: AtomicU64,
    /// Buckets sent to their new owner after a ring change.
    pub handed_over: AtomicU64,
}

/// Routes checks to their owners; owns the peer clients.
pub struct Router {
    /// Unique in this process (key of the per-thread clients).
    id: u64,
    engine: Arc<Engine>,
    global: Arc<GlobalCounters>,
    view: Arc<ArcSwap<View>>,
    settings: Arc<PeerSettings>,
    /// One client per alive peer; read lock-free on every forwarded check, replaced whole
    /// (under `peers_update`) when membership changes.
    peers: ArcSwap<HashMap<Arc<str>, Arc<PeerClient>>>,
    peers_update: Mutex<()>,
    /// Bumped whenever `peers` is replaced, so that per-runtime copies know to follow.
    peers_generation: AtomicU64,
    pub peer_stats: Arc<PeerStats>,
    pub stats: RouterStats,
    rpc: PeerRpcMetrics,
}

impl Router {
    pub fn new(
        engine: Arc<Engine>,
        global: Arc<GlobalCounters>,
        view: Arc<ArcSwap<View>>,
        settings: PeerSettings,
        rpc: PeerRpcMetrics,
    ) -> Self {
        Self {
            id: NEXT_ROUTER_ID.fetch_add(1, Ordering::Relaxed),
            engine,
            global,
            view,
            settings: Arc::new(settings),
            peers: ArcSwap::from_pointee(HashMap::new()),
            peers_update: Mutex::new(()),
            peers_generation: AtomicU64::new(0),
            peer_stats: Arc::new(PeerStats::default()),
            stats: RouterStats::default(),
            rpc,
        }
    }

    /// How this node dials its peers.
    pub fn peer_settings(&self) -> &Arc<PeerSettings> {
        &self.settings
    }

    /// Sends one group to its owner's client, observing its size and, when answered, its time.
    async fn send(
        &self,
        client: &PeerClient,
        checks: Vec<PeerCheck>,
    ) -> Result<Vec<PeerAnswer>, ForwardError> {
        self.rpc.checks.observe(checks.len() as f64);
        let clock = self.engine.clock();
        let start = clock.now();
        let sent = client.send(checks).await;
        if sent.is_ok() {
            self.rpc.duration.observe(seconds(start, clock.now()));
        }
        sent
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The global rules' counters.
    pub fn global(&self) -> &Arc<GlobalCounters> {
        &self.global
    }

    /// The current membership view.
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// Keeps one client per alive peer: connects to new ones, drops those that left the ring.
    pub fn sync_peers(&self, view: &View) {
        let _one_writer = self.peers_update.lock();
        let current = self.peers.load();
        let mut peers = HashMap::with_capacity(view.peer_addrs.len());
        for (id, addr) in &view.peer_addrs {
            if *id == view.self_id {
                continue;
            }
            let client = match current.get(id) {
                Some(c) if c.addr == *addr => c.clone(),
                _ => Arc::new(PeerClient::spawn(
                    addr.clone(),
                    self.settings.clone(),
                    self.peer_stats.clone(),
                )),
            };
            peers.insert(id.clone(), client);
        }
        self.peers.store(Arc::new(peers));
        self.peers_generation.fetch_add(1, Ordering::Release);
    }

    /// Hands the live buckets this node no longer owns under `view`'s ring to their new owners.
    /// A bucket whose new owner cannot be reached is put back, so nothing is lost.
    pub async fn hand_over(&self, view: &View) -> usize {
        let now = self.engine.clock().now();
        let ring = &view.ring;
        if ring.is_empty() {
            return 0;
        }
        let moving = self.engine.store().take_if(|id, st| {
            st.idle_at() > now && ring.owner(id).is_some_and(|o| o != &*view.self_id)
        });
        if moving.is_empty() {
            return 0;
        }
        let mut by_owner: HashMap<&str, Vec<(u64, crate::limiter::BucketState)>> = HashMap::new();
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
            match crate::forward::handover::push(addr, &self.settings, &buckets).await {
                Ok(_) => moved += n,
                Err(e) => {
                    tracing::warn!(%owner, error = %e, buckets = n, "handover failed; keeping the buckets here");
                    for (id, st) in buckets {
                        self.engine.store().absorb(id, st, now);
                    }
                }
            }
        }
        self.stats
            .handed_over
            .fetch_add(moved as u64, Ordering::Relaxed);
        if moved > 0 {
            tracing::info!(buckets = moved, "buckets handed over to their new owners");
        }
        moved
    }

    /// Validates a check (no bucket is touched).
    pub fn prepare<'a>(
        &self,
        key: &'a str,
        spec: RuleSpec<'a>,
        cost: u64,
    ) -> Result<Prepared<'a>, CheckError> {
        let (resolved, id) = self.engine.prepare(key, spec, cost)?;
        Ok(Prepared {
            key,
            spec,
            cost,
            resolved,
            id,
        })
    }

    /// Decides one check wherever it belongs.
    pub async fn check(
        &self,
        key: &str,
        spec: RuleSpec<'_>,
        cost: u64,
    ) -> Result<CheckAnswer, CheckError> {
        let p = self.prepare(key, spec, cost)?;
        self.route(&p).await
    }

    /// Decides one prepared check wherever it belongs.
    pub async fn route(&self, p: &Prepared<'_>) -> Result<CheckAnswer, CheckError> {
        if p.resolved.mode == Mode::Global {
            return Ok(self.decide_global(p, self.engine.clock().now()));
        }
        let view = self.view.load();
        match self.owner(&view, p) {
            None => Ok(self.engine.decide(p.id, &p.resolved.rule, p.cost)),
            Some((_, client)) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                let sent = self.send(&client, vec![peer_check(p)]).await;
                let answer = sent.and_then(|mut a| a.pop().ok_or(ForwardError::Mismatch));
                self.settle(p, answer, view.alive())
            }
        }
    }

    /// A global check at `now`: decided here from the merged counters, never forwarded, never
    /// degraded.
    fn decide_global(&self, p: &Prepared<'_>, now: u64) -> CheckAnswer {
        self.global.answer(p.id, &p.resolved.rule, now, p.cost)
    }

    /// Decides many checks: local ones here, each owner's as one group (one frame).
    /// Answers come back in the order of `items`.
    pub async fn check_many(&self, items: &[Prepared<'_>]) -> Vec<Result<CheckAnswer, CheckError>> {
        let view = self.view.load_full();
        let mut results: Vec<Option<Result<CheckAnswer, CheckError>>> =
            Vec::with_capacity(items.len());
        let mut groups: HashMap<Arc<str>, (Arc<PeerClient>, Vec<usize>)> = HashMap::new();
        // One instant for the whole batch (see `Engine::decide_at`).
        let now = self.engine.clock().now();
        for (i, p) in items.iter().enumerate() {
            if p.resolved.mode == Mode::Global {
                results.push(Some(Ok(self.decide_global(p, now))));
                continue;
            }
            match self.owner(&view, p) {
                None => results.push(Some(Ok(self.engine.decide_at(
                    p.id,
                    &p.resolved.rule,
                    p.cost,
                    now,
                )))),
                Some((owner, client)) => {
                    results.push(None);
                    groups
                        .entry(owner)
                        .or_insert_with(|| (client, Vec::new()))
                        .1
                        .push(i);
                }
            }
        }
        let sends = groups.into_values().map(|(client, idx)| {
            let checks: Vec<PeerCheck> = idx.iter().map(|&i| peer_check(&items[i])).collect();
            self.stats
                .forwarded
                .fetch_add(checks.len() as u64, Ordering::Relaxed);
            async move { (idx, self.send(&client, checks).await) }
        });
        for (idx, sent) in futures::future::join_all(sends).await {
            match sent {
                Ok(answers) => {
                    for (i, a) in idx.into_iter().zip(answers) {
                        results[i] = Some(self.settle(&items[i], Ok(a), view.alive()));
                    }
                }
                Err(e) => {
                    for i in idx {
                        results[i] = Some(self.settle(&items[i], Err(e), view.alive()));
                    }
                }
            }
        }
        // `send` checks that the owner answered every check, so every slot is filled.
        results
            .into_iter()
            .zip(items)
            .map(|(r, p)| r.unwrap_or_else(|| Ok(self.fallback(p, view.alive()))))
            .collect()
    }

    /// The check's owner and its client, or `None` when this node decides it.
    fn owner(&self, view: &View, p: &Prepared<'_>) -> Option<(Arc<str>, Arc<PeerClient>)> {
        if p.resolved.mode == Mode::Global {
            // Global rules are decided where they land (see `route`).
            return None;
        }
        self.owner_client(view, p.id)
    }

    /// The owner of bucket `id` under `view` and the client that reaches it, or `None` when
    /// this node owns it. On the HTTP runtimes the client is that runtime's own: each keeps its
    /// own connection to each peer, so a forwarded check, its frame and its answer never cross
    /// threads (with the node's shared clients, on the main runtime, every forwarded check cost
    /// two cross-thread wake-ups, and forwarding through one node of three lost 8% of its
    /// throughput when HTTP moved to its own runtimes).
    fn owner_client(&self, view: &View, id: u64) -> Option<(Arc<str>, Arc<PeerClient>)> {
        let owner = view.ring.owner(id)?;
        if owner == &*view.self_id {
            return None;
        }
        let lookup = || {
            if ON_HTTP_RUNTIME.get() {
                self.local_lookup(owner)
            } else {
                self.peers
                    .load()
                    .get_key_value(owner)
                    .map(|(k, c)| (k.clone(), c.clone()))
            }
        };
        // A member we have no client for yet (the view just changed): make one.
        lookup().or_else(|| {
            self.sync_peers(view);
            lookup()
        })
    }

    fn local_lookup(&self, owner: &str) -> Option<(Arc<str>, Arc<PeerClient>)> {
        let generation = self.peers_generation.load(Ordering::Acquire);
        LOCAL_PEERS.with_borrow_mut(|all| {
            let local = all.entry(self.id).or_insert_with(|| LocalPeers {
                generation: u64::MAX,
                peers: HashMap::new(),
            });
            if local.generation != generation {
                let shared = self.peers.load();
                let mut next = HashMap::with_capacity(shared.len());
                for (id, client) in shared.iter() {
                    let mine = match local.peers.remove(id) {
                        Some((of, mine)) if Arc::ptr_eq(&of, client) => mine,
                        _ => Arc::new(PeerClient::spawn(
                            client.addr.clone(),
                            self.settings.clone(),
                            self.peer_stats.clone(),
                        )),
                    };
                    next.insert(id.clone(), (client.clone(), mine));
                }
                local.peers = next;
                local.generation = generation;
            }
            local
                .peers
                .get_key_value(owner)
                .map(|(k, (_, c))| (k.clone(), c.clone()))
        })
    }

    /// Where a check that a peer forwarded here should go instead: the owner of bucket `id`
    /// under this node's ring, when that is another member (this node handed the bucket over,
    /// or is leaving, and the sender has not heard yet). `None`: decide it here.
    pub fn relay_target(&self, id: u64) -> Option<(Arc<str>, Arc<PeerClient>)> {
        self.owner_client(&self.view.load(), id)
    }

    /// Turns the owner's reply — or its absence — into an answer.
    fn settle(
        &self,
        p: &Prepared<'_>,
        answer: Result<PeerAnswer, ForwardError>,
        alive: usize,
    ) -> Result<CheckAnswer, CheckError> {
        match answer {
            Ok(PeerAnswer::Answer(a)) => Ok(a),
            Ok(PeerAnswer::Error { code, message }) => Err(CheckError::Owner { code, message }),
            Err(e) => {
                tracing::debug!(error = %e, "owner unreachable; failing {}", match p.resolved.on_unreachable {
                    OnOwnerUnreachable::Open => "open",
                    OnOwnerUnreachable::Closed => "closed",
                });
                Ok(self.fallback(p, alive))
            }
        }
    }

    /// The answer when the owner cannot be reached: a local share of the limit, or a denial.
    fn fallback(&self, p: &Prepared<'_>, alive: usize) -> CheckAnswer {
        let rule = p.resolved.rule;
        if p.resolved.on_unreachable == OnOwnerUnreachable::Closed {
            self.stats.fail_closed.fetch_add(1, Ordering::Relaxed);
            return ringlimit_core::rule::closed_answer(&rule, self.engine.clock().now());
        }
        self.stats.fail_open.fetch_add(1, Ordering::Relaxed);
        ringlimit_core::rule::decide_share(
            self.engine.store(),
            fallback_id(p.id),
            &rule,
            &share_of(&rule, alive),
            p.cost,
            self.engine.clock().now(),
        )
    }
}

pub use ringlimit_core::rule::share_of;

fn peer_check(p: &Prepared<'_>) -> PeerCheck {
    PeerCheck {
        key: p.key.to_owned(),
        rule: match p.spec {
            RuleSpec::Named(name) => RuleRef::Named(name.to_owned()),
            RuleSpec::Inline(r) => RuleRef::Inline(r),
        },
        cost: p.cost,
    }
}
