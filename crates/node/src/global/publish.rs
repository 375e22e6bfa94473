//! Moving global counts through gossip: the publisher writes this node's changed counts into
//! its chitchat key-values, and the merger folds what peers publish into [`GlobalCounters`].
//!
//! # Publishing
//! Every `interval` (default 100 ms, `--global-publish-ms`), the buckets with new own hits are
//! written as `g:<id>` = `<period_ms>:<window>:<current>:<previous>` (see [`super::wire`]);
//! chitchat sends only changed keys, and a bucket without hits is not written again. A key
//! whose counts are two windows old no longer matters to anyone and is deleted (receivers drop
//! the windows themselves when they expire, so a delete is housekeeping, not a signal).
//!
//! Right after a round that wrote something, the publisher starts a gossip exchange with up to
//! [`NUDGE_FANOUT`] live peers (chitchat's own fanout) instead of waiting for the next regular
//! round: the new counts reach them within a round trip, so what peers miss of this node's hits
//! is about half a publish interval on average, not that plus half a gossip round. The regular
//! rounds still spread them further in larger clusters.
//!
//! A bucket that an admission leaves with at most a tenth of its quota
//! ([`super::counters::URGENT_FRACTION`]) does not wait for the tick: the publisher runs a round
//! at once, at most every `interval / 5` ([`URGENT_DIVISOR`]). Only the last tenth of each
//! window's quota is published this fast — where every hit peers miss is likely an
//! over-admission — and the early rounds are bounded per node whatever the number of buckets.
//!
//! **The per-node cap.** At most `max_published` keys are published at once (default 10,000,
//! about 450 KB of state that every node holds and that crosses the cluster once). When the cap
//! is reached, a bucket that is not published yet stays unpublished: this node still counts
//! its hits and decides it from its own count plus what peers publish, but peers do not see
//! this node's hits, so the cluster may admit up to this node's share more. Each such bucket
//! and round is counted (`unpublished` in `/v1/cluster`, `ringlimit_global_unpublished_total`)
//! and a warning is logged at most once a minute. Keys free up as their windows expire.
//!
//! # Merging
//! A chitchat listener on `g:` receives every new or changed global key of every other node.
//! It runs under chitchat's lock, so it only parses and `try_send`s into a bounded queue; when
//! the queue is full the event is dropped, counted, and a full rescan of every node's global
//! keys is made on the next tick (merging is a max, so rescanning is always safe); one is also
//! made at start, for keys that arrived before the listener existed. Deletes are
//! not delivered, and need not be: windows expire by themselves.

use super::counters::{Actor, GlobalCounters, actor};
use super::wire::{self, Update};
use chitchat::{Chitchat, ChitchatId, ListenerHandle};
use rand::seq::IndexedRandom;
use ringlimit_core::clock::{Clock, NANOS_PER_MS};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, mpsc};

/// Gossip events queued for the merger at most (about 100 bytes each).
const QUEUE: usize = 16_384;
/// How often the merger looks at the rescan flag.
const RESCAN_TICK: Duration = Duration::from_millis(250);
/// Actor names interned at most (node incarnations seen); cleared beyond.
const MAX_ACTORS: usize = 4_096;
/// A round for a bucket near its limit follows the previous round after `interval / this`.
pub const URGENT_DIVISOR: u32 = 5;
/// Peers nudged into a gossip exchange after a publish round (chitchat's own fanout).
pub const NUDGE_FANOUT: usize = 3;
/// Warnings about the publish cap are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Publishing settings.
#[derive(Debug, Clone, Copy)]
pub struct PublishSettings {
    pub interval: Duration,
    pub max_published: usize,
    /// Updates a node receives per second from all its peers together, at most (see
    /// [`Budget`]).
    pub gossip_budget: u64,
}

/// This node's share of the cluster's gossip budget: a token bucket of key writes. Every node
/// receives every other node's writes, so with each of the `n` live nodes writing at most
/// `budget / (n - 1)` a second, what any node receives stays within `budget` however large the
/// cluster or the number of hot keys (measured before it: 10,000 hot keys on 9 nodes sent
/// 336 KB/s per node, peers' receive buffers overflowed, and live nodes were declared dead;
/// `bench/scale.sh`). Changes beyond the share wait in the publisher's backlog, oldest first:
/// peers then see a bucket's count later, which is the price (over-admission up to the hits
/// a backlog holds back).
#[derive(Debug)]
pub struct Budget {
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl Budget {
    pub fn new(budget: u64, at: Instant) -> Self {
        Self {
            per_second: budget as f64,
            tokens: budget as f64,
            at,
        }
    }

    /// Writes allowed now with `peers` other live nodes; spend what is used with [`Budget::spend`].
    pub fn available(&mut self, peers: usize, at: Instant) -> usize {
        let rate = self.per_second / peers.max(1) as f64;
        let elapsed = at.saturating_duration_since(self.at).as_secs_f64();
        self.at = at;
        // At most a second's worth saved up.
        self.tokens = (self.tokens + rate * elapsed).min(rate.max(1.0));
        self.tokens.max(0.0) as usize
    }

    pub fn spend(&mut self, writes: usize) {
        self.tokens -= writes as f64;
    }
}

/// One peer update, as the listener queues it.
struct Event {
    node: ChitchatId,
    update: Update,
}

/// Starts listening for peers' global keys. Keep the returned handle: dropping it stops the
/// listener. The returned future is the merger; run it as a task.
pub async fn subscribe(
    chitchat: Arc<Mutex<Chitchat>>,
    self_id: ChitchatId,
    counters: Arc<GlobalCounters>,
    clock: Arc<dyn Clock>,
) -> (
    ListenerHandle,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = mpsc::channel::<Event>(QUEUE);
    // Start with a scan: gossip runs from the moment chitchat is spawned, so keys may have
    // arrived before this listener existed.
    let rescan = Arc::new(AtomicBool::new(true));
    let handle = {
        let (counters, rescan, self_id) = (counters.clone(), rescan.clone(), self_id.clone());
        chitchat
            .lock()
            .await
            .subscribe_event(wire::PREFIX, move |event| {
                // Runs under chitchat's lock: parse, queue, nothing else.
                if *event.node == self_id {
                    return;
                }
                match wire::parse(event.key, event.value) {
                    Ok(update) => {
                        let event = Event {
                            node: event.node.clone(),
                            update,
                        };
                        if tx.try_send(event).is_err() {
                            counters
                                .stats
                                .dropped_events
                                .fetch_add(1, Ordering::Relaxed);
                            rescan.store(true, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        counters.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
    };
    let merger = merge_loop(chitchat, self_id, counters, clock, rx, rescan);
    (handle, merger)
}

async fn merge_loop(
    chitchat: Arc<Mutex<Chitchat>>,
    self_id: ChitchatId,
    counters: Arc<GlobalCounters>,
    clock: Arc<dyn Clock>,
    mut rx: mpsc::Receiver<Event>,
    rescan: Arc<AtomicBool>,
) {
    let mut actors: HashMap<ChitchatId, Actor> = HashMap::new();
    let mut tick = tokio::time::interval(RESCAN_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Vec::with_capacity(256);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, 1024) => {
                if n == 0 {
                    return;
                }
                let (now, at) = (clock.now(), Instant::now());
                for e in batch.drain(..) {
                    merge_one(&counters, &mut actors, &e.node, &e.update, now, at);
                }
            }
            _ = tick.tick() => {
                if rescan.swap(false, Ordering::Relaxed) {
                    let all = scan(&chitchat, &self_id, &counters).await;
                    tracing::debug!(updates = all.len(), "global counters rescanned");
                    let (now, at) = (clock.now(), Instant::now());
                    for (node, u) in &all {
                        merge_one(&counters, &mut actors, node, u, now, at);
                    }
                }
            }
        }
    }
}

fn merge_one(
    counters: &GlobalCounters,
    actors: &mut HashMap<ChitchatId, Actor>,
    node: &ChitchatId,
    u: &Update,
    now: u64,
    at: Instant,
) {
    if actors.len() >= MAX_ACTORS && !actors.contains_key(node) {
        actors.clear();
    }
    let a = actors
        .entry(node.clone())
        .or_insert_with(|| actor(&node.node_id, node.generation_id));
    counters.merge(a, u, now);
    counters.note_merge(&node.node_id, at);
}

/// Every global key of every other node chitchat knows (dead ones included).
async fn scan(
    chitchat: &Mutex<Chitchat>,
    self_id: &ChitchatId,
    counters: &GlobalCounters,
) -> Vec<(ChitchatId, Update)> {
    let cc = chitchat.lock().await;
    let mut out = Vec::new();
    for (id, state) in cc.node_states() {
        if id == self_id {
            continue;
        }
        for (key, value) in state.iter_prefix(wire::PREFIX) {
            let key = key.strip_prefix(wire::PREFIX).unwrap_or(key);
            match wire::parse(key, &value.value) {
                Ok(u) => out.push((id.clone(), u)),
                Err(_) => {
                    counters.stats.malformed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    out
}

/// Publishes this node's changed counts every `settings.interval`, deletes keys that no longer
/// matter, and drops expired windows. Runs until aborted.
pub async fn publish_loop(
    chitchat: Arc<Mutex<Chitchat>>,
    counters: Arc<GlobalCounters>,
    clock: Arc<dyn Clock>,
    settings: PublishSettings,
    nudge: impl Fn(SocketAddr) + Send + 'static,
) {
    let mut publisher = Publisher::new(settings.max_published);
    let mut budget = Budget::new(settings.gossip_budget, Instant::now());
    // Other live nodes at the last round that wrote (the share of the budget divides by it).
    let mut peers_live = 0usize;
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned: Option<Instant> = None;
    let min_gap = settings.interval / URGENT_DIVISOR;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = counters.urgent.notified() => {
                // A bucket nears its limit: publish now, but never more often than `min_gap`.
                let since = last.elapsed();
                if since < min_gap {
                    tokio::time::sleep(min_gap - since).await;
                }
            }
        }
        last = Instant::now();
        let now = clock.now();
        let allowed = budget.available(peers_live, last);
        let round = publisher.round(&counters, now, allowed);
        budget.spend(round.set.len());
        if !round.set.is_empty() || !round.delete.is_empty() {
            let peers = {
                let mut cc = chitchat.lock().await;
                let state = cc.self_node_state();
                for (k, v) in round.set {
                    state.set(k, v);
                }
                for k in &round.delete {
                    state.delete(k);
                }
                let me = cc.self_chitchat_id().clone();
                let live: Vec<SocketAddr> = cc
                    .live_nodes()
                    .filter(|id| **id != me)
                    .map(|id| id.gossip_advertise_addr)
                    .collect();
                live
            };
            peers_live = peers.len();
            let picked = peers.choose_multiple(&mut rand::rng(), NUDGE_FANOUT);
            for peer in picked {
                nudge(*peer);
            }
        }
        counters.purge(now);
        if round.refused > 0 && warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            warned = Some(Instant::now());
            tracing::warn!(
                cap = settings.max_published,
                refused = round.refused,
                "per-node cap on published global keys reached: new hot buckets are decided \
                 from local counts plus peers' and not published until keys expire \
                 (see ringlimit_global_unpublished_total)"
            );
        }
    }
}

/// What one publish round writes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub set: Vec<(String, String)>,
    pub delete: Vec<String>,
    /// Buckets with new hits not published because of the cap.
    pub refused: u64,
}

/// The publisher's memory: which keys this node publishes, for which window, and the changed
/// buckets waiting for the budget.
#[derive(Debug)]
pub struct Publisher {
    /// Bucket id → (period ms, window of its last published value).
    published: HashMap<u64, (u64, u64)>,
    max_published: usize,
    /// Changed buckets not written yet (id, period ms), oldest first, each once.
    backlog: std::collections::VecDeque<(u64, u64)>,
    queued: std::collections::HashSet<u64>,
}

impl Publisher {
    pub fn new(max_published: usize) -> Self {
        Self {
            published: HashMap::new(),
            max_published,
            backlog: std::collections::VecDeque::new(),
            queued: std::collections::HashSet::new(),
        }
    }

    /// Plans one round at `now` writing at most `max_writes` keys, the changes waiting longest
    /// first (pure but for draining the dirty set and the stats).
    pub fn round(&mut self, counters: &GlobalCounters, now: u64, max_writes: usize) -> Round {
        let mut round = Round::default();
        for (id, period_ms) in counters.take_dirty() {
            if self.queued.insert(id) {
                self.backlog.push_back((id, period_ms));
            }
        }
        while round.set.len() < max_writes {
            let Some((id, period_ms)) = self.backlog.pop_front() else {
                break;
            };
            self.queued.remove(&id);
            if !self.published.contains_key(&id) && self.published.len() >= self.max_published {
                round.refused += 1;
                continue;
            }
            let window = now / period_ms.saturating_mul(NANOS_PER_MS).max(1);
            let (current, previous) = counters.own_counts(id, period_ms, window);
            self.published.insert(id, (period_ms, window));
            let u = Update {
                id,
                period_ms,
                window,
                current,
                previous,
            };
            round.set.push((wire::key(id), wire::value(&u)));
        }
        self.published.retain(|id, (period_ms, window)| {
            let current = now / period_ms.saturating_mul(NANOS_PER_MS).max(1);
            // Both counts in the value are of windows that ended: nobody reads them any more.
            let stale = current >= window.saturating_add(2);
            if stale {
                round.delete.push(wire::key(*id));
            }
            !stale
        });
        counters
            .stats
            .unpublished
            .fetch_add(round.refused, Ordering::Relaxed);
        counters
            .stats
            .published
            .store(self.published.len() as u64, Ordering::Relaxed);
        counters
            .stats
            .backlog
            .store(self.backlog.len() as u64, Ordering::Relaxed);
        round
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::limiter::test_support::{SEC, rule};
    use ringlimit_proto::Algorithm;

    const W0: u64 = 1_700_000_000 * SEC;

    #[test]
    fn publishes_changed_buckets_once_and_deletes_stale_ones() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let r = rule(Algorithm::FixedWindow, 100, 20_000, 100);
        let mut p = Publisher::new(10);
        let w = W0 / r.period_ns;
        c.check(7, &r, W0, 3);
        let round = p.round(&c, W0 + SEC, usize::MAX);
        assert_eq!(round.set, vec![(wire::key(7), format!("20000:{w}:3:0"))],);
        // Nothing new: nothing written.
        assert_eq!(p.round(&c, W0 + 2 * SEC, usize::MAX), Round::default());
        // Next window: the value carries the final count as `previous`.
        c.check(7, &r, W0 + 21 * SEC, 1);
        let round = p.round(&c, W0 + 21 * SEC, usize::MAX);
        assert_eq!(
            round.set,
            vec![(wire::key(7), format!("20000:{}:1:3", w + 1))]
        );
        assert!(round.delete.is_empty());
        // Two windows later both counts are over: the key goes.
        let round = p.round(&c, W0 + 60 * SEC, usize::MAX);
        assert_eq!(round.delete, vec![wire::key(7)]);
        assert_eq!(c.stats.published.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn beyond_the_budget_changes_wait_oldest_first() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let r = rule(Algorithm::FixedWindow, 100, 20_000, 100);
        let mut p = Publisher::new(100);
        for id in 1..=5u64 {
            c.check(id << 40, &r, W0, 1);
        }
        let first = p.round(&c, W0, 2);
        assert_eq!(first.set.len(), 2);
        assert_eq!(c.stats.backlog.load(Ordering::Relaxed), 3);
        // A bucket written again while waiting is queued once; the waiting ones go first.
        let again = first.set[0].0.clone();
        let id = u64::from_str_radix(again.strip_prefix("g:").unwrap_or(""), 16).unwrap_or(0);
        c.check(id, &r, W0, 1);
        let second = p.round(&c, W0, 3);
        assert_eq!(second.set.len(), 3);
        assert!(second.set.iter().all(|(k, _)| *k != again));
        let third = p.round(&c, W0, 3);
        assert_eq!(third.set.len(), 1);
        assert_eq!(third.set[0].0, again);
        assert_eq!(c.stats.backlog.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_budget_is_shared_by_the_peers_and_saves_up_a_second_at_most() {
        let t0 = Instant::now();
        let mut b = Budget::new(1_000, t0);
        // Alone (no peer yet): the whole budget, a second's worth at once.
        assert_eq!(b.available(0, t0), 1_000);
        b.spend(1_000);
        // With 4 peers, 250 a second: 25 after 100 ms.
        assert_eq!(b.available(4, t0 + Duration::from_millis(100)), 25);
        b.spend(25);
        // Idle for a minute: no more than a second's worth.
        assert_eq!(b.available(4, t0 + Duration::from_secs(60)), 250);
    }

    #[test]
    fn the_cap_refuses_new_keys_and_counts_them() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let r = rule(Algorithm::FixedWindow, 100, 20_000, 100);
        let mut p = Publisher::new(2);
        for id in [1, 2, 3] {
            c.check(id << 40, &r, W0, 1);
        }
        let round = p.round(&c, W0, usize::MAX);
        assert_eq!(round.set.len(), 2);
        assert_eq!(round.refused, 1);
        assert_eq!(c.stats.unpublished.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats.published.load(Ordering::Relaxed), 2);
        // A published bucket is still updated at the cap.
        let published = round.set[0].0.clone();
        let id = u64::from_str_radix(published.strip_prefix("g:").unwrap_or(""), 16).unwrap_or(0);
        c.check(id, &r, W0, 1);
        let round = p.round(&c, W0, usize::MAX);
        assert_eq!(round.set.len(), 1);
        assert_eq!(round.refused, 0);
    }
}
