//! Leases in the SDK (opt-in: [`crate::ClientBuilder::leases`]): a key this client checks
//! thousands of times a second is leased from its owner, and its checks are decided in-process
//! on the slice (`"leased": true`), with no round trip and no server work per check. The same
//! messages and the same code as a node's leases (core's `lease`: what a slice is per
//! algorithm, why it never admits more than the bucket; `lease::asking` asks and gives back).
//! A rule with `lease: off` is never leased; leaky bucket and sliding log rules neither.

use crate::topology::Topology;
use parking_lot::Mutex;
use ringlimit_core::hot_keys::{HotKeys, HotSettings};
use ringlimit_core::lease::asking::{Asker, LeaseStats, Owners};
use ringlimit_core::lease::{Held, LeaseSettings, Release};
use ringlimit_core::link::Sessions;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One check in this many is counted for hot keys, with this weight (as a node does).
const SAMPLE: u32 = 8;

thread_local! {
    /// Checks seen by this thread since its last counted one.
    static TURN: Cell<u32> = const { Cell::new(0) };
}

/// A client's leases: the slices it holds, the keys it checks most, the asking task's counters.
pub(crate) struct Leasing {
    pub(crate) held: Arc<Held>,
    hot: Arc<Mutex<HotKeys>>,
    tick: Duration,
    pub(crate) stats: Arc<LeaseStats>,
    /// Checks admitted on a slice, and denied here as the owner said.
    pub(crate) leased: AtomicU64,
    pub(crate) denied: AtomicU64,
    /// Stops the tasks when the client is dropped.
    stop: CancellationToken,
}

impl Leasing {
    pub(crate) fn new() -> Self {
        let settings = HotSettings::default();
        Self {
            held: Arc::new(Held::new(LeaseSettings::default())),
            hot: Arc::new(Mutex::new(HotKeys::new(settings))),
            tick: Duration::from_nanos(settings.tick_ns),
            stats: Arc::default(),
            leased: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            stop: CancellationToken::new(),
        }
    }

    #[inline]
    pub(crate) fn record(&self, id: u64) {
        let counted = TURN.with(|t| {
            let n = t.get() + 1;
            t.set(if n == SAMPLE { 0 } else { n });
            n == SAMPLE
        });
        if counted {
            self.hot.lock().record(id, u64::from(SAMPLE));
        }
    }

    /// Starts the hot keys' tick and the asking task (who owns what from `topology`, the time
    /// from `now`), both ended by [`Leasing::stop`].
    pub(crate) fn spawn(
        &self,
        topology: impl Fn() -> Arc<Topology> + Send + Sync + 'static,
        now: impl Fn() -> u64 + Send + Sync + 'static,
        sessions: Sessions,
    ) {
        let (hot, held, tick) = (self.hot.clone(), self.held.clone(), self.tick);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                let changes = hot.lock().tick();
                for id in changes.promoted {
                    held.want(id);
                }
                for id in changes.demoted {
                    held.release(id, Release::Cooled);
                }
            }
        });
        let asker = Asker::new(self.held.clone(), sessions, self.stats.clone());
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let owners = || TopologyOwners(topology());
            tokio::select! {
                () = stop.cancelled() => {}
                () = asker.run(owners, now) => {}
            }
        });
    }

    /// Ends the tasks (the client is dropped).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }
}

/// The client's topology, as the asking task reads it.
struct TopologyOwners(Arc<Topology>);

impl Owners for TopologyOwners {
    fn owner(&self, id: u64) -> Option<(Arc<str>, String)> {
        let owner = self.0.ring.owner(id)?;
        let (member, m) = self.0.peers.get_key_value(owner)?;
        Some((member.clone(), m.peer_addr.clone()))
    }

    fn ring(&self) -> Vec<Arc<str>> {
        self.0.ring.members().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::{cluster, nowhere, rules};
    use ringlimit_proto::Ring;

    /// Whether bucket 7, checked `checks` times in one tick on a fresh thread, is promoted.
    fn promoted_after(checks: u32) -> bool {
        std::thread::spawn(move || {
            let l = Leasing::new();
            for _ in 0..checks {
                l.record(7);
            }
            l.hot.lock().tick().promoted == [7]
        })
        .join()
        .expect("the counting thread")
    }

    /// One check in [`SAMPLE`] is counted, with weight [`SAMPLE`]: a tick of 250 ms promotes a
    /// bucket whose counted rate reaches 1000/s, a count of 500. 504 checks count 63 times
    /// (504: promoted), 503 count 62 times (496: not).
    #[test]
    fn one_check_in_eight_is_counted_eight_times() {
        assert_eq!(SAMPLE, 8);
        assert!(promoted_after(504));
        assert!(!promoted_after(503));
    }

    #[tokio::test]
    async fn the_asking_task_reads_owners_and_the_ring_from_the_topology() {
        let (link, stats) = nowhere();
        let view = cluster(&[
            ("n0", "10.0.0.1:7000", "10.0.0.1:8080", "alive"),
            ("n1", "10.0.0.2:7000", "10.0.0.2:8080", "alive"),
            ("n2", "10.0.0.3:7000", "10.0.0.3:8080", "dead"),
        ]);
        let topology = Topology::empty().next(&view, &rules(), &link, &stats, false);
        let owners = TopologyOwners(Arc::new(topology));
        let ring = Ring::new(["n0", "n1"]);
        assert_eq!(owners.ring(), ring.members().to_vec());
        for id in 0..200u64 {
            let (member, addr) = owners.owner(id).expect("an owner");
            assert_eq!(Some(&*member), ring.owner(id));
            let want = if &*member == "n0" {
                "10.0.0.1:7000"
            } else {
                "10.0.0.2:7000"
            };
            assert_eq!(addr, want, "leases are asked of the owner's peer port");
        }
        let none = TopologyOwners(Arc::new(Topology::empty()));
        assert!(none.owner(1).is_none() && none.ring().is_empty());
    }
}
