//! This node's own pauses. A process that was stopped (SIGSTOP, a frozen VM, a runtime starved
//! for seconds) wakes with every timer expired at once: gossip's failure detector has heard
//! nothing from the peers for as long as the pause lasted and declares them dead, and the node,
//! seeing no majority, would answer from fresh fallback shares whatever waited in its sockets
//! (keys used up at their owners admitted again). It did not lose its peers: they lost it.
//!
//! A task ticks every fifth of a gossip round; a tick later than two rounds means this node did
//! not run (gossip declares a silent member dead after ten or so: a pause long enough for that
//! is always noticed), and opens a "resumed" period of ten rounds, at least [`RESUMED_FOR`].
//! Until the tick that notices, a pause shows as a tick overdue ([`Pauses::stalled`]), so
//! whatever looks first (the membership watcher, a ping round) sees it too. While either
//! holds, members gossip declares dead that were alive before stay in the view: their keys are
//! still asked of them and of their replicas, with the usual deadline and circuit, and only an
//! owner and replica that then fail to answer lead to the share (`membership`); and the peer
//! links' failed pings do not count (`peers::reach`). Gossip hears from live peers again within
//! a round or two; a member really gone meanwhile is dropped when the period ends. A runtime
//! starved for two rounds counts as paused too: at worst a member that died just then leaves
//! the ring a period later (its keys meanwhile go to its replica, its link being down).
//!
//! Monotonic time on tokio's clock: the system's outside tests, the paused virtual clock in
//! them (where [`Pauses::freeze`] stops one node's ticks as SIGSTOP would).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The shortest resumed period: gossip hears from live peers within a round or two of the
/// resume.
pub const RESUMED_FOR: Duration = Duration::from_secs(2);
/// The shortest tick (gossip rounds may be as short as 10 ms).
const MIN_TICK: Duration = Duration::from_millis(5);

/// The pause detector's state, read on every view change and ping round.
#[derive(Debug)]
pub struct Pauses {
    /// How often the detector ticks.
    tick: Duration,
    /// A tick this much later than due means this node did not run.
    gap: Duration,
    /// How long after a pause gossip's death verdicts are not believed.
    resumed_for: Duration,
    origin: Instant,
    /// When the detector last ticked (ns since `origin`).
    last_tick: AtomicU64,
    /// The end of the resumed period (ns since `origin`; 0: none yet).
    until: AtomicU64,
    /// Pauses noticed.
    noticed: AtomicU64,
    /// The longest pause noticed (ns).
    longest_ns: AtomicU64,
    /// Test seam: the detector does not tick, as in a stopped process.
    frozen: AtomicBool,
}

impl Pauses {
    /// A detector for gossip rounds of `gossip_interval`, that last ticked now.
    pub fn new(gossip_interval: Duration) -> Self {
        Self {
            tick: (gossip_interval / 5).max(MIN_TICK),
            gap: gossip_interval * 2,
            resumed_for: (gossip_interval * 10).max(RESUMED_FOR),
            origin: Instant::now(),
            last_tick: AtomicU64::new(0),
            until: AtomicU64::new(0),
            noticed: AtomicU64::new(0),
            longest_ns: AtomicU64::new(0),
            frozen: AtomicBool::new(false),
        }
    }

    fn since(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// One tick at `now`: the pause it ends, if its previous tick was more than a gap ago
    /// (the tick interval included).
    pub fn tick(&self, now: Instant) -> Option<Duration> {
        if self.frozen.load(Ordering::Relaxed) {
            return None;
        }
        let at = self.since(now);
        let gap = at.saturating_sub(self.last_tick.swap(at, Ordering::Relaxed));
        if gap <= nanos(self.tick + self.gap) {
            return None;
        }
        self.until.fetch_max(
            at.saturating_add(nanos(self.resumed_for)),
            Ordering::Relaxed,
        );
        self.noticed.fetch_add(1, Ordering::Relaxed);
        self.longest_ns.fetch_max(gap, Ordering::Relaxed);
        Some(Duration::from_nanos(gap))
    }

    /// Whether at `now` the detector's tick is overdue by more than a gap: this node is in a
    /// pause the detector has not noticed yet (it has just resumed, or its runtime is starved).
    pub fn stalled(&self, now: Instant) -> bool {
        self.since(now)
            .saturating_sub(self.last_tick.load(Ordering::Relaxed))
            > nanos(self.tick + self.gap)
    }

    /// Whether at `now` this node is paused or within the resumed period of a pause: what
    /// gossip says of the peers is not to be believed yet.
    pub fn resumed(&self, now: Instant) -> bool {
        self.since(now) < self.until.load(Ordering::Relaxed) || self.stalled(now)
    }

    /// Pauses noticed since start.
    pub fn noticed(&self) -> u64 {
        self.noticed.load(Ordering::Relaxed)
    }

    /// The longest pause noticed since start.
    pub fn longest(&self) -> Duration {
        Duration::from_nanos(self.longest_ns.load(Ordering::Relaxed))
    }

    /// Test seam: stops (`true`) or restarts the detector's ticks, as SIGSTOP and SIGCONT would
    /// (the other tasks of a node in memory go on: the harness stalls its links).
    #[doc(hidden)]
    pub fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::Relaxed);
    }

    /// How long after a pause gossip's death verdicts are not believed.
    pub fn resumed_for(&self) -> Duration {
        self.resumed_for
    }

    /// Ticks until dropped, logging each pause noticed.
    pub async fn run(self: std::sync::Arc<Self>) {
        // Starting is no pause (a node in memory restarted keeps its detector's state).
        self.last_tick
            .store(self.since(Instant::now()), Ordering::Relaxed);
        let mut tick = tokio::time::interval(self.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Some(gap) = self.tick(Instant::now()) {
                tracing::warn!(
                    paused_ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX),
                    "this node did not run for a while (stopped, frozen or starved): members \
                     gossip declares dead meanwhile are still asked for {:?}",
                    self.resumed_for
                );
            }
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gossip rounds of 100 ms: ticks every 20 ms, a pause is a tick over 200 ms late, the
    /// resumed period 2 s.
    fn pauses() -> Pauses {
        Pauses::new(Duration::from_millis(100))
    }

    #[test]
    fn late_ticks_open_a_resumed_period_and_an_overdue_tick_shows_at_once() {
        let p = pauses();
        let at = |ms: u64| p.origin + Duration::from_millis(ms);
        // On time, or late as a busy host makes it: no pause.
        assert_eq!(p.tick(at(20)), None);
        assert_eq!(p.tick(at(200)), None);
        assert!(!p.resumed(at(200)) && !p.stalled(at(420)));
        // Stopped after the tick at 200: overdue before the next tick says so.
        assert!(p.stalled(at(500)) && p.resumed(at(500)));
        assert_eq!(p.noticed(), 0);
        // The tick that notices: a resumed period from then.
        assert_eq!(p.tick(at(4_200)), Some(Duration::from_secs(4)));
        assert_eq!((p.noticed(), p.longest()), (1, Duration::from_secs(4)));
        assert!(!p.stalled(at(4_220)));
        assert!(p.resumed(at(4_220)) && p.resumed(at(6_199)));
        for ms in (4_220..=6_200).step_by(20) {
            assert_eq!(p.tick(at(ms)), None);
        }
        assert!(!p.resumed(at(6_200)), "the period ends");
        assert_eq!(p.tick(at(6_500)), Some(Duration::from_millis(300)));
        assert_eq!(
            p.noticed(),
            2,
            "a runtime starved that long counts as paused"
        );
    }

    #[test]
    fn a_frozen_detector_does_not_tick_and_notices_when_thawed() {
        let p = pauses();
        let at = |ms: u64| p.origin + Duration::from_millis(ms);
        p.freeze(true);
        assert_eq!(p.tick(at(20)), None);
        assert_eq!(p.tick(at(3_000)), None);
        assert!(p.stalled(at(3_000)));
        p.freeze(false);
        assert_eq!(p.tick(at(3_000)), Some(Duration::from_secs(3)));
        assert!(p.resumed(at(3_100)) && !p.stalled(at(3_100)));
        assert!(!p.resumed(at(5_000)) || p.stalled(at(5_000)));
    }

    #[test]
    fn thresholds_follow_the_gossip_interval() {
        let p = Pauses::new(Duration::from_millis(50));
        assert_eq!(
            (p.tick, p.gap),
            (Duration::from_millis(10), Duration::from_millis(100))
        );
        assert_eq!(p.resumed_for(), RESUMED_FOR);
        let p = Pauses::new(Duration::from_secs(1));
        assert_eq!(p.resumed_for(), Duration::from_secs(10));
        assert_eq!(Pauses::new(Duration::from_millis(10)).tick, MIN_TICK);
    }
}
