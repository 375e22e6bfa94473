//! Every global bucket's per-window G-counters on this node: this node's own hits and the
//! counts merged from what its peers push (see [`super::push`]).
//!
//! A bucket's window `(id, period, window)` holds a G-counter whose actors are the node
//! incarnations (`node_id@generation`, so that a restarted node counts afresh instead of hiding
//! under its previous life's larger count): a `crdts::VClock`, the state of a `GCounter`, held
//! as such because a full set lists its actors ([`GlobalCounters::others`]). Own hits raise
//! this node's entry; a count from a peer is applied as the dot `{actor, count}`, which keeps
//! the larger of what is known (element-wise max merge): late, repeated, reordered or relayed
//! updates never double-count. The estimate is the sum over every actor ever heard of in that
//! window, dead members and previous incarnations included: their hits still count until the window
//! ends, and full sets relay them to nodes that join or restart.
//!
//! Memory is bounded twice: a window is dropped once it cannot matter any more (the end of the
//! window after it, which a sliding estimate still reads), and the number of windows held is
//! capped (`max_windows`); at the cap the windows closest to expiry are evicted first (and
//! counted), which at worst forgets hits and admits more.

use super::actor::{Actor, actor, parse_actor};
use super::decide;
use super::numbering::Numbering;
use super::wire::{ActorCounts, Update};
use crate::cluster::clock::Clocks;
use crdts::{CmRDT, Dot, VClock};
use parking_lot::Mutex;
use ringlimit_core::limiter::{Decision, Rule};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A bucket whose remaining quota is at most `limit / URGENT_FRACTION` after an admission is
/// published early (see [`super::publish`]).
pub const URGENT_FRACTION: u64 = 10;
/// Shards of the window table (a power of two; ids are well-spread hashes, so the top bits pick).
const SHARDS: usize = 16;
/// Fraction of a full shard evicted at once, so that a stream of new buckets does not scan the
/// shard on every insert.
const EVICT_DIVISOR: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct WindowKey {
    id: u64,
    /// The windows' numbering as counts carry it: the period for plain periods, a calendar's
    /// code for calendar windows (see [`Numbering::code`]).
    period_ms: u64,
    window: u64,
}

struct Window {
    /// Each actor's count.
    counter: VClock<Actor>,
    /// The sum of `counter`, kept: the hot path reads it on every check.
    total: u64,
    /// When the window stops mattering (ns): the end of the window after it.
    expires_at: u64,
}

impl Window {
    fn new(key: &WindowKey, numbering: Numbering) -> Self {
        Self {
            counter: VClock::new(),
            total: 0,
            // A window whose successor has no end in reach never expires by time (the cap
            // still bounds them).
            expires_at: numbering
                .end(key.window.saturating_add(1))
                .unwrap_or(u64::MAX),
        }
    }

    /// What `actor` has counted here.
    fn count_of(&self, actor: &Actor) -> u64 {
        self.counter.get(actor)
    }

    /// Raises `actor`'s count to `count` (no change when it already is at least that).
    fn raise(&mut self, actor: &Actor, count: u64) -> bool {
        let old = self.count_of(actor);
        if count <= old {
            return false;
        }
        self.counter.apply(Dot::new(actor.clone(), count));
        self.total = self.total.saturating_add(count - old);
        debug_assert_eq!(
            self.counter
                .iter()
                .fold(0u64, |sum, d| sum.saturating_add(d.counter)),
            self.total
        );
        true
    }
}

#[derive(Default)]
struct Shard {
    windows: HashMap<WindowKey, Window>,
    /// Buckets with own hits since the last publish, with their period (ms).
    dirty: HashMap<u64, u64>,
    /// The same, of `scope: regions` rules, for the other regions (kept only on a node with
    /// regions: see [`GlobalCounters::across_regions`]).
    shared_dirty: HashMap<u64, u64>,
}

impl Shard {
    fn total(&self, key: &WindowKey) -> u64 {
        self.windows.get(key).map_or(0, |w| w.total)
    }

    /// `actor`'s count of bucket `id` in `window`.
    fn count_of(&self, actor: &Actor, id: u64, period_ms: u64, window: u64) -> u64 {
        let key = WindowKey {
            id,
            period_ms,
            window,
        };
        self.windows.get(&key).map_or(0, |w| w.count_of(actor))
    }

    /// The window for `key` (numbered by `numbering`), made (within the cap) when absent.
    fn window(
        &mut self,
        key: WindowKey,
        numbering: Numbering,
        cap: usize,
        now: u64,
        evicted: &AtomicU64,
    ) -> &mut Window {
        if !self.windows.contains_key(&key) && self.windows.len() >= cap {
            self.windows.retain(|_, w| w.expires_at > now);
            if self.windows.len() >= cap {
                let n = (cap / EVICT_DIVISOR).max(1);
                let mut by_expiry: Vec<(u64, WindowKey)> = self
                    .windows
                    .iter()
                    .map(|(k, w)| (w.expires_at, *k))
                    .collect();
                by_expiry.select_nth_unstable(n - 1);
                for (_, k) in &by_expiry[..n] {
                    self.windows.remove(k);
                }
                evicted.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        self.windows
            .entry(key)
            .or_insert_with(|| Window::new(&key, numbering))
    }
}

/// Counters for `/v1/cluster` and `/metrics`.
#[derive(Debug, Default)]
pub struct GlobalStats {
    /// Windows evicted to stay within the cap while they still mattered.
    pub evicted: AtomicU64,
    /// Keys this node publishes now (gauge, set by the publisher).
    pub published: AtomicU64,
    /// Changed buckets waiting for this node's share of `--global-gossip-budget` (gauge).
    pub backlog: AtomicU64,
    /// Publish rounds in which a bucket with new hits was not published because the per-node
    /// cap on published keys was reached (see [`super::publish`]).
    pub unpublished: AtomicU64,
    /// Peer updates merged.
    pub merged: AtomicU64,
    /// Updates not queued for a peer whose queue was full (the peer is slow or unreachable;
    /// it is sent the full set later, see [`super::push`]).
    pub dropped_events: AtomicU64,
    /// Updates received from peers that were refused (ignored; see [`super::wire::validate`]).
    pub malformed: AtomicU64,
    /// `GlobalCounts` frames and their bytes (length prefix included) written to peers.
    pub push_frames: AtomicU64,
    pub push_bytes: AtomicU64,
    /// Bytes of `GlobalCounts` frames received from peers (length prefix included).
    pub received_bytes: AtomicU64,
    /// Full sets queued for a peer: new connections, and peers that may have missed a frame.
    pub resyncs: AtomicU64,
    /// Connections to peers that failed (connect or write); each is retried with a full set.
    pub push_failed: AtomicU64,
    /// Buckets whose other actors' counts were left out of a full set: over the cap (see
    /// [`super::publish`]).
    pub unrelayed: AtomicU64,
    /// Counts of other regions' actors merged, and refused (malformed, or of a window this
    /// node does not hold: see [`GlobalCounters::receive_foreign`]).
    pub region_merged: AtomicU64,
    pub region_refused: AtomicU64,
}

/// Most other regions' counts waiting to be relayed to the members (see
/// [`GlobalCounters::take_foreign`]); beyond, every member is sent a full set instead.
pub const MAX_FOREIGN_PENDING: usize = 20_000;

/// Other regions' counts merged here since the last publish round, to relay to the members.
#[derive(Default)]
struct Foreign {
    /// (actor, bucket, numbering) whose count rose.
    keys: HashSet<(Actor, u64, u64)>,
    /// More than [`MAX_FOREIGN_PENDING`] rose: the members need full sets.
    overflow: bool,
}

/// The number of the window containing `now` of the numbering a count's `period_ms` names
/// (see [`Numbering::code`]); `None` for one this node cannot resolve.
pub fn window_of(code: u64, now: u64) -> Option<u64> {
    Numbering::from_code(code).map(|n| n.window(now))
}

/// This node's global counters. Shared by the check path, the publisher and the merger.
pub struct GlobalCounters {
    self_actor: Actor,
    shards: Box<[Mutex<Shard>]>,
    /// Most windows per shard.
    shard_cap: usize,
    /// When an update from each peer (by node id) was last merged.
    last_merge: Mutex<BTreeMap<String, Instant>>,
    /// Peers (by node id) whose full set has come whole (see [`GlobalCounters::has_full_set`]).
    full_sets: Mutex<BTreeSet<String>>,
    /// Signalled when a bucket nears its limit: the publisher publishes early.
    pub(super) urgent: tokio::sync::Notify,
    /// Bumped when a `scope: regions` bucket nears its limit: every region's counts link
    /// sends early (a watch, so that each link hears it, busy or not when it came).
    urgent_regions: tokio::sync::watch::Sender<u64>,
    /// Whether `scope: regions` buckets are shared with other regions (a node with regions).
    across_regions: std::sync::atomic::AtomicBool,
    /// Other regions' counts to relay to the members.
    foreign: Mutex<Foreign>,
    pub stats: GlobalStats,
    /// The cluster clock: every `now` given is this node's wall time, and windows are numbered
    /// on the cluster's (see [`crate::cluster::clock`]), so one wrong clock does not shift them.
    clocks: Arc<Clocks>,
}

impl std::fmt::Debug for GlobalCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalCounters")
            .field("self_actor", &self.self_actor)
            .field("windows", &self.len())
            .finish_non_exhaustive()
    }
}

impl GlobalCounters {
    /// Counters for the node `self_actor`, holding at most about `max_windows` windows.
    pub fn new(self_actor: Actor, max_windows: usize) -> Self {
        Self {
            self_actor,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_cap: max_windows.div_ceil(SHARDS).max(2),
            last_merge: Mutex::new(BTreeMap::new()),
            full_sets: Mutex::new(BTreeSet::new()),
            urgent: tokio::sync::Notify::new(),
            urgent_regions: tokio::sync::watch::Sender::new(0),
            across_regions: std::sync::atomic::AtomicBool::new(false),
            foreign: Mutex::new(Foreign::default()),
            stats: GlobalStats::default(),
            clocks: Arc::new(Clocks::default()),
        }
    }

    /// These counters, numbering windows on the cluster clock of `clocks`.
    pub fn with_clocks(mut self, clocks: Arc<Clocks>) -> Self {
        self.clocks = clocks;
        self
    }

    /// From now on the own counts of `scope: regions` buckets are kept for the other regions
    /// ([`GlobalCounters::take_shared_dirty`]: a node with regions takes them).
    pub fn share_across_regions(&self) {
        self.across_regions.store(true, Ordering::Relaxed);
    }

    /// Whether own counts of `scope: regions` buckets go to other regions.
    pub fn across_regions(&self) -> bool {
        self.across_regions.load(Ordering::Relaxed)
    }

    /// Changes when a `scope: regions` bucket nears its limit (see [`GlobalCounters::check_in`]).
    pub fn urgent_across_regions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.urgent_regions.subscribe()
    }

    /// The cluster clock, as this node measures it.
    pub fn clocks(&self) -> &Arc<Clocks> {
        &self.clocks
    }

    /// This node's wall time `local_ns` on the cluster clock: what the publisher's `now` (for
    /// [`GlobalCounters::others`], [`GlobalCounters::purge`], its own windows) must be. The
    /// check and merge paths convert by themselves.
    pub fn cluster_now(&self, local_ns: u64) -> u64 {
        self.clocks.cluster_ns(local_ns)
    }

    pub fn self_actor(&self) -> &Actor {
        &self.self_actor
    }

    fn shard(&self, id: u64) -> &Mutex<Shard> {
        &self.shards[(id >> 60) as usize % SHARDS]
    }

    /// What [`GlobalCounters::check`] would decide now, counting nothing (an all-or-nothing
    /// request asks its global limits first, before anything is taken anywhere).
    pub fn peek(&self, id: u64, rule: &Rule, now: u64, cost: u64) -> Decision {
        let now = self.clocks.cluster_ns(now);
        let numbering = Numbering::of(rule);
        let key = WindowKey {
            id,
            period_ms: numbering.code(),
            window: numbering.window(now),
        };
        let shard = self.shard(id).lock();
        let current = shard.total(&key);
        let previous = match key.window.checked_sub(1) {
            Some(w) => shard.total(&WindowKey { window: w, ..key }),
            None => 0,
        };
        drop(shard);
        decide::decide(rule, now, cost, current, previous)
    }

    /// Decides a global check of bucket `id` at `now` from the merged counts, and counts it as
    /// this node's when admitted.
    pub fn check(&self, id: u64, rule: &Rule, now: u64, cost: u64) -> Decision {
        self.check_in(id, rule, false, now, cost)
    }

    /// [`GlobalCounters::check`] of a bucket that is `shared` with other regions or not (a
    /// `scope: regions` rule's): a shared one's own counts also go to the other regions.
    pub fn check_in(&self, id: u64, rule: &Rule, shared: bool, now: u64, cost: u64) -> Decision {
        let now = self.clocks.cluster_ns(now);
        let numbering = Numbering::of(rule);
        let period_ms = numbering.code();
        let window = numbering.window(now);
        let key = WindowKey {
            id,
            period_ms,
            window,
        };
        let mut shard = self.shard(id).lock();
        let current = shard.total(&key);
        let previous = match window.checked_sub(1) {
            Some(w) => shard.total(&WindowKey { window: w, ..key }),
            None => 0,
        };
        let d = decide::decide(rule, now, cost, current, previous);
        if d.allowed && cost > 0 {
            let w = shard.window(key, numbering, self.shard_cap, now, &self.stats.evicted);
            let own = w.count_of(&self.self_actor);
            w.raise(&self.self_actor, own.saturating_add(cost));
            shard.dirty.insert(id, period_ms);
            let regions = shared && self.across_regions();
            if regions {
                shard.shared_dirty.insert(id, period_ms);
            }
            drop(shard);
            // In the last tenth of the quota every hit that peers do not see yet is likely
            // over-admission elsewhere: ask the publisher (and the other regions' links) not
            // to wait for their next tick.
            if d.remaining <= (rule.limit / URGENT_FRACTION).max(1) {
                self.urgent.notify_one();
                if regions {
                    self.urgent_regions.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
        }
        d
    }

    /// Merges one peer's published counts at `now` (on the cluster clock); returns whether any
    /// count rose.
    pub fn merge(&self, actor: &Actor, u: &Update, now: u64) -> bool {
        // Validated on receipt; a numbering this node cannot resolve is nothing to merge.
        let Some(numbering) = Numbering::from_code(u.period_ms) else {
            return false;
        };
        let mut raised = false;
        let mut shard = self.shard(u.id).lock();
        for (window, count) in [
            (u.window, u.current),
            (u.window.wrapping_sub(1), u.previous),
        ] {
            let key = WindowKey {
                id: u.id,
                period_ms: u.period_ms,
                window,
            };
            if count == 0 || window == u64::MAX {
                continue;
            }
            // A window that no longer matters is not made again.
            if !shard.windows.contains_key(&key) && Window::new(&key, numbering).expires_at <= now {
                continue;
            }
            raised |= shard
                .window(key, numbering, self.shard_cap, now, &self.stats.evicted)
                .raise(actor, count);
        }
        drop(shard);
        self.stats.merged.fetch_add(1, Ordering::Relaxed);
        raised
    }

    /// Merges a `GlobalCounts` frame from the peer `node_id` (incarnation `generation`);
    /// refused updates are counted and skipped. Returns how many were merged.
    pub fn receive(&self, node_id: &str, generation: u64, counts: &[Update], now: u64) -> usize {
        let now = self.clocks.cluster_ns(now);
        let from = actor(node_id, generation);
        let mut merged = 0;
        for u in counts {
            if super::wire::validate(u).is_err() {
                self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.merge(&from, u, now);
            merged += 1;
        }
        self.note_merge(node_id, Instant::now());
        merged
    }

    /// Merges the counts of a `GlobalCountsOf` frame (validated by [`super::wire::relayed`]),
    /// each under its own actor.
    pub fn merge_relayed(&self, counts: &[(Actor, Update)], now: u64) {
        let now = self.clocks.cluster_ns(now);
        for (a, u) in counts {
            self.merge(a, u, now);
        }
    }

    /// Notes that peer `node_id`'s full set has come whole (its `GlobalCountsOf` frames, which
    /// end it).
    pub fn note_full_set(&self, node_id: &str) {
        let mut f = self.full_sets.lock();
        if !f.contains(node_id) {
            f.insert(node_id.to_owned());
        }
    }

    /// Whether a full set from peer `node_id` has come since this node started: it then holds
    /// every count that peer held, the cluster's as far as that peer knew it.
    pub fn has_full_set(&self, node_id: &str) -> bool {
        self.full_sets.lock().contains(node_id)
    }

    /// Notes that an update from `node_id` was just merged.
    pub fn note_merge(&self, node_id: &str, at: Instant) {
        let mut m = self.last_merge.lock();
        match m.get_mut(node_id) {
            Some(t) => *t = at,
            None => {
                m.insert(node_id.to_owned(), at);
            }
        }
    }

    /// How long ago an update from each peer was last merged.
    pub fn merge_ages(&self) -> BTreeMap<String, Duration> {
        let now = Instant::now();
        self.last_merge
            .lock()
            .iter()
            .map(|(k, t)| (k.clone(), now.saturating_duration_since(*t)))
            .collect()
    }

    /// Takes the buckets with own hits since the last call, with their periods (ms).
    pub fn take_dirty(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            out.extend(s.lock().dirty.drain());
        }
        out
    }

    /// Takes the `scope: regions` buckets with own hits since the last call, with their
    /// periods (ms): what goes to the other regions.
    pub fn take_shared_dirty(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            out.extend(s.lock().shared_dirty.drain());
        }
        out
    }

    /// Merges counts another region sent (validated by [`super::wire::relayed`], their actors
    /// qualified by that region's name), numbered on this node's cluster clock by the sender
    /// (see [`Numbering::translate`]). A count of a window that is neither this node's current
    /// one nor next to it cannot be matched (a clock or an offset gone wrong): it is refused,
    /// and changes nothing. What rose is relayed to the members at the next publish round.
    /// Returns how many counts were refused.
    pub fn receive_foreign(&self, counts: &[(Actor, Update)], now: u64) -> u64 {
        let now = self.clocks.cluster_ns(now);
        let mut refused = 0u64;
        let mut rose = Vec::new();
        for (a, u) in counts {
            let matched = window_of(u.period_ms, now).is_some_and(|cur| {
                u.window.saturating_add(1) >= cur && u.window <= cur.saturating_add(1)
            });
            if !matched {
                refused += 1;
                continue;
            }
            if self.merge(a, u, now) {
                rose.push((a.clone(), u.id, u.period_ms));
            }
        }
        let merged = counts.len() as u64 - refused;
        self.stats
            .region_merged
            .fetch_add(merged, Ordering::Relaxed);
        self.stats
            .region_refused
            .fetch_add(refused, Ordering::Relaxed);
        if !rose.is_empty() {
            let mut f = self.foreign.lock();
            for k in rose {
                if f.keys.len() >= MAX_FOREIGN_PENDING {
                    f.overflow = true;
                    break;
                }
                f.keys.insert(k);
            }
        }
        refused
    }

    /// The other regions' counts that rose since the last call, as of `now` (cluster clock):
    /// each actor's count in its bucket's current window and the one before, for the members
    /// (`GlobalCountsOf` frames); and whether more rose than were kept (then the members need
    /// full sets, which carry every actor's counts).
    pub fn take_foreign(&self, now: u64) -> (Vec<ActorCounts>, bool) {
        let (keys, overflow) = {
            let mut f = self.foreign.lock();
            (std::mem::take(&mut f.keys), std::mem::take(&mut f.overflow))
        };
        let mut by_actor: BTreeMap<Actor, Vec<Update>> = BTreeMap::new();
        for (a, id, period_ms) in keys {
            let Some(window) = window_of(period_ms, now) else {
                continue;
            };
            let shard = self.shard(id).lock();
            let count = |window| shard.count_of(&a, id, period_ms, window);
            // A count just ahead of this node's window (a clock a little ahead) is relayed as
            // current; the members match it alike.
            let (window, current) = match count(window + 1) {
                0 => (window, count(window)),
                ahead => (window + 1, ahead),
            };
            let previous = window.checked_sub(1).map_or(0, count);
            drop(shard);
            if current > 0 || previous > 0 {
                by_actor.entry(a).or_default().push(Update {
                    id,
                    period_ms,
                    window,
                    current,
                    previous,
                });
            }
        }
        (per_actor(by_actor), overflow)
    }

    /// This node's own counts of bucket `id` in `window` and in the window before it.
    pub fn own_counts(&self, id: u64, period_ms: u64, window: u64) -> (u64, u64) {
        let shard = self.shard(id).lock();
        let own = |window| shard.count_of(&self.self_actor, id, period_ms, window);
        (own(window), window.checked_sub(1).map_or(0, own))
    }

    /// The counts of every actor but this node of at most `max_buckets` buckets (those with a
    /// window that still matters at `now`), as a full set relays them: per bucket, each actor's
    /// count in the current window and the one before. Returns them and how many buckets were
    /// left out at the cap (which ones is arbitrary: the shards' order).
    pub fn others(&self, now: u64, max_buckets: usize) -> (Vec<ActorCounts>, u64) {
        let mut by_actor: BTreeMap<Actor, Vec<Update>> = BTreeMap::new();
        let (mut buckets, mut skipped) = (0usize, 0u64);
        // The current window of each numbering, computed once (a calendar's costs a zone lookup).
        let mut current_of: HashMap<u64, Option<u64>> = HashMap::new();
        for s in self.shards.iter() {
            let s = s.lock();
            let mut seen: HashSet<(u64, u64)> = HashSet::new();
            for key in s.windows.keys() {
                let Some(window) = *current_of
                    .entry(key.period_ms)
                    .or_insert_with(|| window_of(key.period_ms, now))
                else {
                    continue;
                };
                // The current window, the one before, and one ahead (an actor whose clock is a
                // little ahead, another region's translated counts: relayed as their current,
                // as `take_foreign` does).
                let matters = key.window == window
                    || key.window.checked_add(1) == Some(window)
                    || window.checked_add(1) == Some(key.window);
                if !matters || !seen.insert((key.id, key.period_ms)) {
                    continue;
                }
                if buckets >= max_buckets {
                    skipped += 1;
                    continue;
                }
                buckets += 1;
                let get = |window| {
                    s.windows.get(&WindowKey {
                        id: key.id,
                        period_ms: key.period_ms,
                        window,
                    })
                };
                let ahead = window.checked_add(1).and_then(get);
                let (current, previous) = (get(window), window.checked_sub(1).and_then(get));
                let actors: BTreeSet<&Actor> = [ahead, current, previous]
                    .into_iter()
                    .flatten()
                    .flat_map(|w| w.counter.iter().map(|d| d.actor))
                    .filter(|a| **a != self.self_actor)
                    .collect();
                let count = |w: Option<&Window>, a: &Actor| w.map_or(0, |w| w.count_of(a));
                for a in actors {
                    let u = match count(ahead, a) {
                        0 => (window, count(current, a), count(previous, a)),
                        n => (window + 1, n, count(current, a)),
                    };
                    by_actor.entry(a.clone()).or_default().push(Update {
                        id: key.id,
                        period_ms: key.period_ms,
                        window: u.0,
                        current: u.1,
                        previous: u.2,
                    });
                }
            }
        }
        (per_actor(by_actor), skipped)
    }

    /// The cluster-wide totals of bucket `id` in `window` and the window before it.
    pub fn totals(&self, id: u64, period_ms: u64, window: u64) -> (u64, u64) {
        let shard = self.shard(id).lock();
        let key = WindowKey {
            id,
            period_ms,
            window,
        };
        let previous = match window.checked_sub(1) {
            Some(w) => shard.total(&WindowKey { window: w, ..key }),
            None => 0,
        };
        (shard.total(&key), previous)
    }

    /// Drops the windows that no longer matter at `now`; returns how many.
    pub fn purge(&self, now: u64) -> usize {
        let mut dropped = 0;
        for s in self.shards.iter() {
            let mut s = s.lock();
            let before = s.windows.len();
            s.windows.retain(|_, w| w.expires_at > now);
            dropped += before - s.windows.len();
        }
        dropped
    }

    /// Windows held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().windows.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Counts grouped by actor as they travel: one `ActorCounts` per actor whose name parses.
fn per_actor(by_actor: BTreeMap<Actor, Vec<Update>>) -> Vec<ActorCounts> {
    by_actor
        .into_iter()
        .filter_map(|(a, counts)| {
            let (node_id, generation) = parse_actor(&a)?;
            Some(ActorCounts {
                node_id: node_id.to_owned(),
                generation,
                counts,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlimit_core::limiter::test_support::{SEC, rule};
    use ringlimit_proto::Algorithm;

    const W0: u64 = 1_700_000_000 * SEC; // aligned to 20 s and 10 s

    fn update(id: u64, window: u64, current: u64, previous: u64) -> Update {
        Update {
            id,
            period_ms: 20_000,
            window,
            current,
            previous,
        }
    }

    #[test]
    fn own_hits_and_peer_counts_add_up_to_the_limit() {
        let r = rule(Algorithm::FixedWindow, 300, 20_000, 300);
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let (b, x) = (actor("b", 1), actor("c", 7));
        let id = 42;
        let now = W0 + SEC;
        let w = now / r.period_ns;
        for _ in 0..100 {
            assert!(c.check(id, &r, now, 1).allowed);
        }
        assert!(c.merge(&b, &update(id, w, 120, 0), now));
        assert!(c.merge(&x, &update(id, w, 70, 0), now));
        assert_eq!(c.totals(id, 20_000, w), (290, 0));
        let admitted = (0..50).filter(|_| c.check(id, &r, now, 1).allowed).count();
        assert_eq!(admitted, 10);
        assert_eq!(c.own_counts(id, 20_000, w), (110, 0));
        assert_eq!(c.take_dirty(), vec![(id, 20_000)]);
        assert!(c.take_dirty().is_empty());
    }

    #[test]
    fn the_last_tenth_of_the_quota_asks_for_an_early_publish() {
        use futures::FutureExt;
        let r = rule(Algorithm::FixedWindow, 100, 20_000, 100);
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        for _ in 0..89 {
            assert!(c.check(1, &r, W0, 1).allowed);
        }
        assert!(c.urgent.notified().now_or_never().is_none());
        assert!(c.check(1, &r, W0, 1).allowed); // 10 left
        assert!(c.urgent.notified().now_or_never().is_some());
        // A peek or a denial asks for nothing.
        c.check(1, &r, W0, 0);
        assert!(c.urgent.notified().now_or_never().is_none());
    }

    #[test]
    fn the_last_tenth_of_a_shared_quota_asks_the_region_links_to_send_early() {
        let r = rule(Algorithm::FixedWindow, 100, 20_000, 100);
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        c.share_across_regions();
        let mut links = c.urgent_across_regions();
        for _ in 0..89 {
            assert!(c.check_in(1, &r, true, W0, 1).allowed);
        }
        // A bucket not shared with other regions asks nothing of their links.
        for _ in 0..95 {
            c.check_in(2, &r, false, W0, 1);
        }
        assert!(!links.has_changed().expect("a sender"));
        assert!(c.check_in(1, &r, true, W0, 1).allowed); // 10 left
        assert!(links.has_changed().expect("a sender"));
        links.mark_unchanged();
        c.check_in(1, &r, true, W0, 0);
        assert!(
            !links.has_changed().expect("a sender"),
            "a peek asks nothing"
        );
    }

    #[test]
    fn merging_is_idempotent_and_keeps_the_larger_count() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let b = actor("b", 1);
        let now = W0;
        let w = now / (20 * SEC);
        assert!(c.merge(&b, &update(1, w, 10, 4), now));
        assert!(!c.merge(&b, &update(1, w, 10, 4), now));
        // An older (reordered) update lowers nothing.
        assert!(!c.merge(&b, &update(1, w, 7, 2), now));
        assert_eq!(c.totals(1, 20_000, w), (10, 4));
        assert!(c.merge(&b, &update(1, w, 12, 4), now));
        assert_eq!(c.totals(1, 20_000, w), (12, 4));
        // The next window's update carries this one's final count as its previous.
        assert!(c.merge(&b, &update(1, w + 1, 1, 15), now + 20 * SEC));
        assert_eq!(c.totals(1, 20_000, w + 1), (1, 15));
    }

    #[test]
    fn a_restarted_node_counts_afresh() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let now = W0;
        let w = now / (20 * SEC);
        c.merge(&actor("b", 1), &update(1, w, 100, 0), now);
        c.merge(&actor("b", 2), &update(1, w, 5, 0), now);
        assert_eq!(c.totals(1, 20_000, w), (105, 0));
    }

    /// A frame from a peer: valid counts merged under the peer's incarnation (repeats change
    /// nothing), refused ones counted and skipped, the peer's merge time noted.
    #[test]
    fn a_peers_frame_is_merged_and_bad_counts_are_refused() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let now = W0;
        let w = now / (20 * SEC);
        let mut bad = update(2, w, 7, 0);
        bad.period_ms = 0;
        let frame = [update(1, w, 4, 1), bad, update(3, u64::MAX, 9, 0)];
        assert_eq!(c.receive("b", 2, &frame, now), 1);
        assert_eq!(c.receive("b", 2, &frame, now), 1);
        assert_eq!(c.totals(1, 20_000, w), (4, 1));
        assert_eq!(c.stats.malformed.load(Ordering::Relaxed), 4);
        assert!(c.merge_ages().contains_key("b"));
        // The same node's next incarnation counts afresh.
        c.receive("b", 3, &[update(1, w, 2, 0)], now);
        assert_eq!(c.totals(1, 20_000, w), (6, 1));
    }

    /// What a full set relays: every other actor's counts of the current and previous windows
    /// (a previous incarnation of this node's included, this incarnation's not) and of the
    /// window ahead, nothing of windows that ended, and no more buckets than asked, the rest
    /// counted.
    #[test]
    fn others_are_every_other_actors_counts_of_windows_that_matter() {
        let c = GlobalCounters::new(actor("a@x", 2), 1_000);
        let r = rule(Algorithm::FixedWindow, 300, 20_000, 300);
        let now = W0 + SEC;
        let w = now / (20 * SEC);
        c.check(1, &r, now, 5);
        c.merge(&actor("a@x", 1), &update(1, w, 30, 7), now);
        c.merge(&actor("b", 4), &update(1, w, 0, 3), now);
        c.merge(&actor("b", 4), &update(2, w - 1, 9, 0), now);
        // Window w - 2, merged while it was current, has ended (not purged yet).
        assert!(c.merge(&actor("b", 4), &update(3, w - 2, 8, 0), W0 - 30 * SEC));
        // Another region's actor, a little ahead: already in window w + 1.
        assert!(c.merge(&actor("eu/e", 1), &update(4, w + 1, 6, 2), now));
        let (others, skipped) = c.others(now, 10);
        assert_eq!(skipped, 0);
        let mut got: Vec<(String, u64, Update)> = others
            .into_iter()
            .flat_map(|a| {
                a.counts
                    .into_iter()
                    .map(move |u| (a.node_id.clone(), a.generation, u))
            })
            .collect();
        got.sort_by_key(|(n, g, u)| (n.clone(), *g, u.id));
        let want = vec![
            ("a@x".to_owned(), 1, update(1, w, 30, 7)),
            ("b".to_owned(), 4, update(1, w, 0, 3)),
            ("b".to_owned(), 4, update(2, w, 0, 9)),
            ("eu/e".to_owned(), 1, update(4, w + 1, 6, 2)),
        ];
        assert_eq!(got, want);
        let (others, skipped) = c.others(now, 1);
        assert_eq!(skipped, 2);
        let ids: BTreeSet<u64> = others
            .iter()
            .flat_map(|a| a.counts.iter().map(|u| u.id))
            .collect();
        assert_eq!(ids.len(), 1);
    }

    #[test]
    fn sliding_estimate_reads_the_previous_window() {
        let r = rule(Algorithm::SlidingWindow, 100, 20_000, 100);
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let b = actor("b", 1);
        let now = W0 + 5 * SEC; // a quarter in: the previous window weighs 75%
        let w = now / r.period_ns;
        c.merge(&b, &update(9, w, 0, 100), now);
        let admitted = (0..100).filter(|_| c.check(9, &r, now, 1).allowed).count();
        assert_eq!(admitted, 25);
    }

    #[test]
    fn expired_windows_are_purged_and_not_remade() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let b = actor("b", 1);
        let now = W0;
        let w = now / (20 * SEC);
        c.merge(&b, &update(1, w, 3, 2), now);
        assert_eq!(c.len(), 2);
        // At the end of window w + 1, window w - 1 and w have both stopped mattering.
        assert_eq!(c.purge(W0 + 39 * SEC), 1);
        assert_eq!(c.purge(W0 + 40 * SEC), 1);
        assert!(c.is_empty());
        assert!(!c.merge(&b, &update(1, w, 3, 2), W0 + 40 * SEC));
        assert!(c.is_empty());
    }

    #[test]
    fn the_window_cap_evicts_the_oldest_first() {
        let c = GlobalCounters::new(actor("a", 1), 32); // 2 per shard
        let b = actor("b", 1);
        let id = 5; // all in shard 0
        let now = W0;
        let w = now / (20 * SEC);
        c.merge(&b, &update(id, w, 1, 0), now);
        c.merge(&b, &update(id + 1, w + 1, 1, 0), now);
        c.merge(&b, &update(id + 2, w + 2, 1, 0), now);
        assert_eq!(c.len(), 2);
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 1);
        assert_eq!(c.totals(id, 20_000, w), (0, 0));
        assert_eq!(c.totals(id + 2, 20_000, w + 2), (1, 0));
    }
}
