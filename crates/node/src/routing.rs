//! Where a check is decided: here when this node owns the bucket (or the rule is global), at
//! the owner otherwise, and from a local fallback share when the owner cannot answer in time
//! (fail-open). One path for single checks and batches: group by owner, one group per owner.

use crate::cluster::View;
use crate::decide::Here;
use crate::decide::given_back;
use crate::engine::Prepared;
use crate::metrics::{PeerRpcMetrics, seconds};
use crate::peers::Peers;
use arc_swap::ArcSwap;
use ringlimit_core::answer::{closed_answer, decide_share, hold_share};
use ringlimit_core::check::CheckError;
use ringlimit_core::link::fanout::{self, OwnerGroups};
use ringlimit_core::link::{ForwardError, PeerClient};
use ringlimit_core::rule::{Mode, OnOwnerUnreachable, share_of};
use ringlimit_proto::CheckAnswer;
use ringlimit_proto::peer::{Mark, PeerAnswer, PeerCheck, PeerRefund};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A batch gives its thread back to the other connections after deciding for this long (a
/// time, not a count: a new key, with an eviction, costs ~2 µs; a known one ~0.5). Measured
/// with the gate below (bench/keyflood.sh `PIN=1 OPEN_RATE=5000`, 4 runs each, alternating):
/// other keys' p99 under the flood 0.88-1.73 ms with 10 µs, 0.48-0.99 ms with 5 µs, the flood's
/// rate the same; batch CPU per check within noise (`bench/cpu.sh`, 0.66-0.72 µs both).
const SLICE: std::time::Duration = std::time::Duration::from_micros(5);
/// How often a batch looks at the clock: every 4 decisions (~5 ns a decision).
const CLOCK_EVERY: usize = 4;
/// Batches of at most this many checks are decided in one go.
const SHORT_BATCH: usize = 16;

thread_local! {
    /// One large batch decides at a time on each thread; the others wait their turn (FIFO)
    /// without being polled.
    ///
    /// Why: a single check waits for one round of every runnable task on its thread, and under
    /// a flood of batches that was a slice of every flooding connection's batch. Measured
    /// (bench/keyflood.sh `PIN=1`: the node alone on one core, saturated by 16 connections of
    /// 100 new keys): other keys' p99 3.5-271 ms, p90 0.37-161 ms, with yields every 16
    /// decisions; with this gate and 10 µs slices p99 1.15-1.20 ms, p90 < 0.1 ms.
    static BATCH_GATE: Arc<tokio::sync::Semaphore> = Arc::new(tokio::sync::Semaphore::new(1));
}

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
}

/// Sends each check where it is decided.
pub struct Dispatcher {
    here: Here,
    view: Arc<ArcSwap<View>>,
    pool: Arc<Peers>,
    pub stats: DispatchStats,
    rpc: PeerRpcMetrics,
}

impl Dispatcher {
    pub fn new(
        here: Here,
        view: Arc<ArcSwap<View>>,
        pool: Arc<Peers>,
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
        match self.route(&view, p) {
            Route::Here => Ok(self.here.decide(p)),
            Route::Share { own } => Ok(self.minority_held(p, view.share_members(), own).0),
            Route::Owner(_, client) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                let sent = self.send(client, vec![peer_check(p)]).await;
                let reply = sent.and_then(|mut a| a.pop().ok_or(ForwardError::Mismatch));
                self.settle(p, reply, view.share_members())
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
        // A longer batch decides only once it holds its thread's gate, and yields before its
        // first decision and after its last, so that parsing it and writing its answer are
        // slices of their own.
        let sliced = items.len() > SHORT_BATCH;
        let gate = sliced.then(|| BATCH_GATE.with(Arc::clone));
        let permit = match &gate {
            Some(gate) => gate.acquire().await.ok(),
            None => None,
        };
        // One instant for the whole batch (see `Engine::decide_at`), taken once it may decide.
        let now = self.here.now();
        let mut slice_start = std::time::Instant::now();
        for (i, p) in items.iter().enumerate() {
            if sliced && i % CLOCK_EVERY == 0 && (i == 0 || slice_start.elapsed() >= SLICE) {
                tokio::task::yield_now().await;
                slice_start = std::time::Instant::now();
            }
            match self.route(&view, p) {
                Route::Here => results.push(Some(Ok(self.here.decide_at(
                    p.id,
                    &p.resolved,
                    p.cost,
                    now,
                )))),
                Route::Share { own } => {
                    results.push(Some(Ok(self.minority_held(p, view.share_members(), own).0)))
                }
                Route::Owner(owner, client) => {
                    results.push(None);
                    groups.add(owner, &client, i);
                    self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Decided here; the owners' answers are awaited without the gate.
        drop(permit);
        let replies = groups
            .send(
                |i| peer_check(&items[i]),
                |client, checks| self.send(client, checks),
            )
            .await;
        for (i, reply) in replies {
            results[i] = Some(self.settle(&items[i], reply, view.share_members()));
        }
        if sliced {
            tokio::task::yield_now().await;
        }
        // Every forwarded check got a reply above, so every slot is filled.
        results
            .into_iter()
            .zip(items)
            .map(|(r, p)| r.unwrap_or_else(|| Ok(self.fallback(p, view.share_members()))))
            .collect()
    }

    /// Decides one request's checks all-or-nothing (the check service's `check_all`):
    /// admitted only when every non-shadow check admits; otherwise every check that took its
    /// cost gives it back before this returns.
    ///
    /// 1. Global checks are asked first without counting (their G-counters cannot give back).
    /// 2. Owner checks are decided at once: this node's through [`Here::decide_all`], each other
    ///    owner's as one all-or-nothing group (it gives back itself when its group denies), an
    ///    unreachable owner's from the fallback share (or denied, for a `closed` rule).
    /// 3. Admitted so far: the global checks now count (a concurrent request may have taken
    ///    the room meanwhile; such a late denial denies the request, and global checks that
    ///    counted already stay counted: never more admitted, at worst a false deny).
    /// 4. Denied: refunds go to every owner that holds a cost, all at once.
    pub async fn check_all(&self, items: &[Prepared<'_>]) -> Vec<Result<CheckAnswer, CheckError>> {
        let view = self.view.load_full();
        let alive = view.share_members();
        let now = self.here.now();
        let mut results: Vec<Option<Result<CheckAnswer, CheckError>>> = vec![None; items.len()];
        let mut holds: Vec<Option<Hold>> = vec![None; items.len()];
        let mut local = Vec::new();
        let mut groups = OwnerGroups::new();
        let mut global = Vec::new();
        for (i, p) in items.iter().enumerate() {
            if p.resolved.mode == Mode::Global {
                global.push(i);
                let d = self.here.global().peek(p.id, &p.resolved.rule, now, p.cost);
                results[i] = Some(Ok(ringlimit_core::answer::answer(&d, &p.resolved.rule)));
                continue;
            }
            match self.route(&view, p) {
                Route::Here => local.push(i),
                Route::Share { own } => {
                    let (a, hold) = self.minority_held(p, alive, own);
                    results[i] = Some(Ok(a));
                    holds[i] = hold;
                }
                Route::Owner(owner, client) => {
                    // A shadow check travels in a group of its own: the owner may not know it
                    // is one (an edge's own shadow setting), and must not let its denial give
                    // back the others'.
                    let group = (owner, p.resolved.shadow.then_some(i));
                    groups.add(group, &client, i);
                    self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let here: Vec<_> = local
            .iter()
            .map(|&i| Some((items[i].id, items[i].resolved, items[i].cost)))
            .collect();
        for (&i, decided) in local.iter().zip(self.here.decide_all(&here, now)) {
            if let Some((answer, mark)) = decided {
                results[i] = Some(Ok(answer));
                holds[i] = mark.map(Hold::Here);
            }
        }
        let clients: std::collections::HashMap<usize, Arc<PeerClient>> = groups.clients();
        let replies = groups
            .send(
                |i| peer_check(&items[i]),
                |client, checks| self.send_all(client, checks),
            )
            .await;
        for (i, reply) in replies {
            let p = &items[i];
            match reply {
                Ok(PeerAnswer::Held { answer, mark }) => {
                    results[i] = Some(Ok(answer));
                    holds[i] = clients.get(&i).map(|c| Hold::Owner(c.clone(), mark));
                }
                reply => {
                    let mut taken = None;
                    results[i] = Some(fanout::settle(reply, |e| {
                        tracing::debug!(error = %e, "owner unreachable in an all-or-nothing check");
                        let (a, t) = self.fallback_held(p, alive);
                        taken = t;
                        Ok(a)
                    }));
                    holds[i] = taken.map(|(mark, cost)| Hold::Share(mark, cost));
                }
            }
        }
        let blocks = |r: &Option<Result<CheckAnswer, CheckError>>, p: &Prepared<'_>| match r {
            Some(Ok(a)) => !a.allowed && !p.resolved.shadow,
            _ => true,
        };
        let mut denied = results.iter().zip(items).any(|(r, p)| blocks(r, p));
        if !denied {
            for &i in &global {
                let p = &items[i];
                let a = self.here.decide_at(p.id, &p.resolved, p.cost, now);
                results[i] = Some(Ok(a));
                if blocks(&results[i], p) {
                    denied = true;
                    break;
                }
            }
        }
        if denied {
            self.give_back(items, &mut results, holds, alive).await;
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(CheckError::Unavailable("no answer was produced"))))
            .collect()
    }

    /// Gives back every cost an all-or-nothing request holds: here at once, at other owners
    /// one refund group each, all at once.
    async fn give_back(
        &self,
        items: &[Prepared<'_>],
        results: &mut [Option<Result<CheckAnswer, CheckError>>],
        holds: Vec<Option<Hold>>,
        alive: usize,
    ) {
        self.stats.refunded_requests.fetch_add(1, Ordering::Relaxed);
        let mut remote: std::collections::HashMap<String, (Arc<PeerClient>, Vec<PeerRefund>)> =
            std::collections::HashMap::new();
        for (i, hold) in holds.into_iter().enumerate() {
            let Some(hold) = hold else { continue };
            let p = &items[i];
            let mut cost = p.cost;
            match hold {
                Hold::Here(mark) => self.here.refund(p.id, &p.resolved, p.cost, mark),
                Hold::Share(mark, taken) => {
                    cost = taken;
                    self.refund_share(p, alive, mark, taken);
                }
                Hold::Both(here, share, taken) => {
                    self.here.refund(p.id, &p.resolved, p.cost, here);
                    self.refund_share(p, alive, share, taken);
                }
                Hold::Owner(client, mark) => {
                    remote
                        .entry(client.addr.clone())
                        .or_insert_with(|| (client.clone(), Vec::new()))
                        .1
                        .push(PeerRefund {
                            key: p.key.to_owned(),
                            rule: p.spec.to_ref(),
                            cost: p.cost,
                            mark,
                        });
                }
            }
            if let Some(Ok(a)) = &mut results[i] {
                *a = given_back(*a, cost);
            }
        }
        let sends = remote.into_values().map(|(client, refunds)| async move {
            let n = refunds.len() as u64;
            match client.refund(refunds).await {
                Ok(answers) => answers
                    .iter()
                    .filter(|a| !matches!(a, PeerAnswer::Refunded))
                    .count() as u64,
                Err(_) => n,
            }
        });
        let lost: u64 = futures::future::join_all(sends).await.into_iter().sum();
        if lost > 0 {
            self.stats.refunds_lost.fetch_add(lost, Ordering::Relaxed);
            tracing::debug!(
                lost,
                "refunds did not reach their owner; their costs stay taken"
            );
        }
    }

    /// Sends one request's checks at one owner as an all-or-nothing group.
    async fn send_all(
        &self,
        client: Arc<PeerClient>,
        checks: Vec<PeerCheck>,
    ) -> Result<Vec<PeerAnswer>, ForwardError> {
        self.rpc.checks.observe(checks.len() as f64);
        let start = self.here.now();
        let sent = client.send_all(checks).await;
        if sent.is_ok() {
            self.rpc.duration.observe(seconds(start, self.here.now()));
        }
        sent
    }

    /// [`Dispatcher::fallback`] for an all-or-nothing check: also what the share took.
    fn fallback_held(&self, p: &Prepared<'_>, alive: usize) -> (CheckAnswer, Option<(Mark, u64)>) {
        let rule = p.resolved.rule;
        let now = self.here.now();
        if p.resolved.on_unreachable == OnOwnerUnreachable::Closed {
            self.stats.fail_closed.fetch_add(1, Ordering::Relaxed);
            return (closed_answer(&rule, now), None);
        }
        self.stats.fail_open.fetch_add(1, Ordering::Relaxed);
        hold_share(
            self.here.engine().store(),
            fallback_id(p.id),
            &rule,
            &share_of(&rule, alive),
            p.cost,
            now,
        )
    }

    /// On the small side of a partition (no majority): the fallback share of the last known
    /// cluster; for a key this node owned under the last ring (`own`), its exact bucket too,
    /// which knows what was spent before the partition: admitted only when both admit. Also what
    /// the answer holds, for an all-or-nothing request to give back.
    fn minority_held(
        &self,
        p: &Prepared<'_>,
        members: usize,
        own: bool,
    ) -> (CheckAnswer, Option<Hold>) {
        let (share, taken) = self.fallback_held(p, members);
        if !own || !share.allowed {
            return (share, taken.map(|(mark, cost)| Hold::Share(mark, cost)));
        }
        let (exact, mark) = self
            .here
            .hold_at(p.id, &p.resolved, p.cost, self.here.now());
        if !exact.allowed {
            if let Some((mark, cost)) = taken {
                self.refund_share(p, members, mark, cost);
            }
            return (
                CheckAnswer {
                    degraded: true,
                    ..exact
                },
                None,
            );
        }
        let hold = match (mark, taken) {
            (Some(here), Some((share, cost))) => Some(Hold::Both(here, share, cost)),
            (Some(here), None) => Some(Hold::Here(here)),
            (None, taken) => taken.map(|(mark, cost)| Hold::Share(mark, cost)),
        };
        let answer = CheckAnswer {
            remaining: share.remaining.min(exact.remaining),
            ..share
        };
        (answer, hold)
    }

    /// Gives back what the fallback share of bucket `p` took under `mark`.
    fn refund_share(&self, p: &Prepared<'_>, members: usize, mark: Mark, cost: u64) {
        let share = share_of(&p.resolved.rule, members);
        self.here
            .engine()
            .store()
            .refund(fallback_id(p.id), &share, cost, mark, self.here.now());
    }

    /// Whether this node owns keys under `view`: it sees a majority of the members it last knew
    /// through gossip (`cluster::quorum`) and over their peer links (`peers::reach`).
    pub fn owns_keys(&self, view: &View) -> bool {
        view.quorum.quorate && !self.pool.cut_off()
    }

    /// Where the check is decided: here (this node owns the bucket, or the rule is global:
    /// decided where it lands), at its owner, or from the fallback share when this node sees
    /// fewer than a majority of the cluster (then it owns no keys: see `cluster::quorum`).
    fn route(&self, view: &View, p: &Prepared<'_>) -> Route {
        if p.resolved.mode == Mode::Global {
            return Route::Here;
        }
        if !self.owns_keys(view) {
            self.stats.minority.fetch_add(1, Ordering::Relaxed);
            let own = view.ring.owner(p.id) == Some(&*view.self_id);
            return Route::Share { own };
        }
        match self.pool.owner_client(view, p.id) {
            None => Route::Here,
            Some((owner, client)) => Route::Owner(owner, client),
        }
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

/// Where one check is decided.
enum Route {
    Here,
    Owner(Arc<str>, Arc<PeerClient>),
    /// From the fallback share, without a majority; `own`: this node owned the key.
    Share {
        own: bool,
    },
}

/// What an all-or-nothing check holds until its request is known to be admitted.
#[derive(Clone)]
enum Hold {
    /// Taken here, under this mark.
    Here(Mark),
    /// Taken at another owner, under this mark.
    Owner(Arc<PeerClient>, Mark),
    /// Taken from this node's fallback share (owner unreachable): mark and cost taken.
    Share(Mark, u64),
    /// Taken here and from the share (a key this node owned, without a majority): the marks
    /// here and in the share, and the cost the share took.
    Both(Mark, Mark, u64),
}

fn peer_check(p: &Prepared<'_>) -> PeerCheck {
    PeerCheck {
        key: p.key.to_owned(),
        rule: p.spec.to_ref(),
        cost: p.cost,
    }
}
