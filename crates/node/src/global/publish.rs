//! Publishing this node's global counts: every round, the buckets with new own hits go to
//! every other live member ([`super::push`]), within the node's share of the budget.
//!
//! # Publishing
//! Every `interval` (default 100 ms, `--global-publish-ms`), the buckets with new own hits are
//! sent as `(id, period_ms, window, current, previous)` (see [`super::wire`]) straight to each
//! live member, so a peer misses about half a publish interval of this node's hits on average
//! plus a one-way delay; a bucket without hits is not sent again. A member that is new, or that
//! may have missed a frame, is sent the full set instead ([`Publisher::full_set`]): every
//! bucket this node publishes, then every other actor's counts this node holds.
//!
//! **Relaying.** A round carries this node's own counts only: every live actor sends its own
//! to every live member itself, so relaying changes would multiply the traffic by the number
//! of nodes and bring nothing new. What only relaying brings is the counts of actors that are
//! gone — a restarted node's previous life, a member that died, or one that restarted while a
//! node was away — and those no longer change: the full set a peer gets when it joins,
//! restarts or reconnects carries them. They come from the counters' windows (a node relays
//! buckets it only merged), at most `max_published` buckets of them; beyond that cap the
//! other actors' counts of the remaining buckets are left out of the full set and counted
//! (`unrelayed`, `ringlimit_global_unrelayed_total`): a peer still hears them from the actors
//! that are alive, or from another peer's full set, and otherwise forgets them (over-admission
//! up to those counts).
//!
//! **Leaving.** When the node stops gracefully it runs a last round and sends every peer the
//! full set, waiting for it to be written (at most [`FLUSH_WITHIN`]), so that the hits of its
//! last publish interval are not lost with the process.
//!
//! A bucket that an admission leaves with at most a tenth of its quota
//! ([`super::counters::URGENT_FRACTION`]) does not wait for the tick: the publisher runs a round
//! at once, at most every `interval / 5` ([`URGENT_DIVISOR`]). Only the last tenth of each
//! window's quota is published this fast — where every hit peers miss is likely an
//! over-admission — and the early rounds are bounded per node whatever the number of buckets.
//!
//! **The per-node cap.** At most `max_published` buckets are published at once (default
//! 10,000: the full set a new member is sent). When the cap is reached, a bucket that is not
//! published yet stays unpublished: this node still counts its hits and decides it from its
//! own count plus what peers publish, but peers do not see this node's hits, so the cluster may
//! admit up to this node's share more. Each such bucket and round is counted (`unpublished` in
//! `/v1/cluster`, `ringlimit_global_unpublished_total`) and a warning is logged at most once a
//! minute. A bucket leaves the published set when both counts it carries are of windows that
//! ended.
//!
//! # Merging
//! The peer server merges each `GlobalCounts` frame as it reads it
//! ([`super::GlobalCounters::receive`]), and each `GlobalCountsOf` frame under the actors it
//! names ([`super::GlobalCounters::merge_relayed`]); merging is a maximum per actor, so
//! repeats, reordering and relaying are harmless.

use super::counters::GlobalCounters;
use super::push::Pusher;
use super::wire::{FullSet, Update};
use crate::cluster::View;
use arc_swap::ArcSwap;
use ringlimit_core::clock::Clock;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A round for a bucket near its limit follows the previous round after `interval / this`.
pub const URGENT_DIVISOR: u32 = 5;

/// Before an early round (a bucket near its limit), waits out what is left of
/// `interval / URGENT_DIVISOR` since the last round, which was `since` ago.
pub async fn early_round_after(since: Duration, interval: Duration) {
    let min_gap = interval / URGENT_DIVISOR;
    if since < min_gap {
        tokio::time::sleep(min_gap - since).await;
    }
}
/// Warnings about the publish cap are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// When leaving, the longest wait for the last full set to be written to every peer.
pub const FLUSH_WITHIN: Duration = Duration::from_secs(1);

/// Publishing settings.
#[derive(Debug, Clone, Copy)]
pub struct PublishSettings {
    pub interval: Duration,
    pub max_published: usize,
    /// Updates a node receives per second from all its peers together, at most (see
    /// [`Budget`]).
    pub gossip_budget: u64,
}

/// This node's share of the cluster's budget (`--global-gossip-budget`): a token bucket of
/// bucket updates. Every node receives every other node's updates, so with each of the `n`
/// live nodes sending at most `budget / (n - 1)` a second, what any node receives (bytes, and
/// CPU to merge) stays within `budget` however large the cluster or the number of hot keys.
/// Changes beyond the share wait in the publisher's backlog, oldest first: peers then see a
/// bucket's count later, which is the price (over-admission up to the hits a backlog holds
/// back). Full sets for new or resynced peers are not counted.
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

/// Publishes this node's changed counts every `settings.interval` (sooner near a limit) to
/// the live members of `view`, and drops expired windows. When `stop` completes, sends every
/// peer a last full set (see the module doc) and returns.
pub async fn publish_loop(
    view: Arc<ArcSwap<View>>,
    counters: Arc<GlobalCounters>,
    clock: Arc<dyn Clock>,
    settings: PublishSettings,
    mut pusher: Pusher,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut publisher = Publisher::new(settings.max_published);
    let mut budget = Budget::new(settings.gossip_budget, Instant::now());
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned: Option<Instant> = None;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stop => break,
            () = counters.urgent.notified() => {
                // A bucket nears its limit: publish now (but not at once again).
                early_round_after(last.elapsed(), settings.interval).await;
            }
        }
        last = Instant::now();
        // Windows are numbered on the cluster clock (see `cluster::clock`).
        let now = counters.cluster_now(clock.now());
        let peers = pusher.track(&view.load());
        let allowed = budget.available(peers, last);
        let round = publisher.round(&counters, now, allowed);
        budget.spend(round.set.len());
        if !round.set.is_empty() || pusher.wants_full() {
            pusher.send(&round.set, || publisher.full_set(&counters, now));
        }
        // Other regions' counts this node merged (it is their link's entry): to every member.
        let (foreign, overflow) = counters.take_foreign(now);
        if overflow {
            pusher.resync_all();
        } else if !foreign.is_empty() {
            pusher.relay(&foreign);
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
    // Leaving: the hits since the last round would go with this process.
    let now = counters.cluster_now(clock.now());
    pusher.track(&view.load());
    publisher.round(&counters, now, usize::MAX);
    let full = publisher.full_set(&counters, now);
    let (delivered, peers) = pusher.flush(&full, FLUSH_WITHIN).await;
    tracing::info!(delivered, peers, "last global counts sent to peers");
}

/// What one publish round sends.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub set: Vec<Update>,
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
        let round = self.round_of(counters.take_dirty(), counters, now, max_writes);
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

    /// [`Publisher::round`] of the buckets `dirty` (id, period ms) changed, without the
    /// stats: the other regions' publisher takes its own dirty set (see
    /// `crate::regions::counts`).
    pub fn round_of(
        &mut self,
        dirty: Vec<(u64, u64)>,
        counters: &GlobalCounters,
        now: u64,
        max_writes: usize,
    ) -> Round {
        let mut round = Round::default();
        let mut windows = Windows::at(now);
        for (id, period_ms) in dirty {
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
            let Some(window) = windows.of(period_ms) else {
                continue;
            };
            let (current, previous) = counters.own_counts(id, period_ms, window);
            self.published.insert(id, (period_ms, window));
            round.set.push(Update {
                id,
                period_ms,
                window,
                current,
                previous,
            });
        }
        self.published.retain(|_, (period_ms, window)| {
            // Both counts last sent are of windows that ended: nobody reads them any more.
            windows
                .of(*period_ms)
                .is_some_and(|current| current < window.saturating_add(2))
        });
        round
    }

    /// What a member that is new, or may have missed a frame, is sent at `now`: this node's
    /// own counts of every bucket it publishes, and the other actors' counts of at most
    /// `max_published` buckets (see the module doc).
    pub fn full_set(&self, counters: &GlobalCounters, now: u64) -> FullSet {
        let (others, skipped) = counters.others(now, self.max_published);
        counters
            .stats
            .unrelayed
            .fetch_add(skipped, Ordering::Relaxed);
        FullSet {
            own: self.snapshot(counters, now),
            others,
        }
    }

    /// Every bucket this node publishes, with its own counts at `now`.
    pub fn snapshot(&self, counters: &GlobalCounters, now: u64) -> Vec<Update> {
        let mut windows = Windows::at(now);
        self.published
            .iter()
            .filter_map(|(&id, &(period_ms, _))| {
                let window = windows.of(period_ms)?;
                let (current, previous) = counters.own_counts(id, period_ms, window);
                Some(Update {
                    id,
                    period_ms,
                    window,
                    current,
                    previous,
                })
            })
            .collect()
    }
}

/// The current window of each numbering at one instant, computed once per numbering (a
/// calendar's costs a time-zone conversion; a round may publish thousands of its buckets).
struct Windows {
    now: u64,
    known: HashMap<u64, Option<u64>>,
}

impl Windows {
    fn at(now: u64) -> Self {
        Self {
            now,
            known: HashMap::new(),
        }
    }

    /// The current window of the numbering `code` names (see [`super::numbering`]).
    fn of(&mut self, code: u64) -> Option<u64> {
        let now = self.now;
        *self
            .known
            .entry(code)
            .or_insert_with(|| super::counters::window_of(code, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::actor;
    use ringlimit_core::limiter::test_support::{SEC, rule};
    use ringlimit_proto::Algorithm;

    const W0: u64 = 1_700_000_000 * SEC;

    #[test]
    fn publishes_changed_buckets_once_and_forgets_stale_ones() {
        let c = GlobalCounters::new(actor("a", 1), 1_000);
        let r = rule(Algorithm::FixedWindow, 100, 20_000, 100);
        let mut p = Publisher::new(10);
        let w = W0 / r.period_ns;
        let u = |window, current, previous| Update {
            id: 7,
            period_ms: 20_000,
            window,
            current,
            previous,
        };
        c.check(7, &r, W0, 3);
        let round = p.round(&c, W0 + SEC, usize::MAX);
        assert_eq!(round.set, vec![u(w, 3, 0)]);
        // Nothing new: nothing sent; the full set still has the bucket.
        assert_eq!(p.round(&c, W0 + 2 * SEC, usize::MAX), Round::default());
        assert_eq!(p.snapshot(&c, W0 + 2 * SEC), vec![u(w, 3, 0)]);
        // Next window: the final count travels as `previous` (in the full set too).
        assert_eq!(p.snapshot(&c, W0 + 21 * SEC), vec![u(w + 1, 0, 3)]);
        c.check(7, &r, W0 + 21 * SEC, 1);
        let round = p.round(&c, W0 + 21 * SEC, usize::MAX);
        assert_eq!(round.set, vec![u(w + 1, 1, 3)]);
        // Two windows later both counts are over: the bucket leaves the published set.
        p.round(&c, W0 + 60 * SEC, usize::MAX);
        assert!(p.snapshot(&c, W0 + 60 * SEC).is_empty());
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
        let again = first.set[0].id;
        c.check(again, &r, W0, 1);
        let second = p.round(&c, W0, 3);
        assert_eq!(second.set.len(), 3);
        assert!(second.set.iter().all(|u| u.id != again));
        let third = p.round(&c, W0, 3);
        assert_eq!(third.set.len(), 1);
        assert_eq!(third.set[0].id, again);
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
        c.check(round.set[0].id, &r, W0, 1);
        let round = p.round(&c, W0, usize::MAX);
        assert_eq!(round.set.len(), 1);
        assert_eq!(round.refused, 0);
    }
}
