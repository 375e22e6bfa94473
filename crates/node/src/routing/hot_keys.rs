//! The buckets this node forwards most (see [`ringlimit_core::hot_keys`]): every check of a bucket
//! another member owns is counted (one in [`SAMPLE`], with that weight), forwarded or decided
//! on a lease, and a task ticks the counts every 250 ms. Promoted buckets are leased (this
//! node asks their owners for slices: see `crate::leases`), demoted ones released; both are
//! counted (`ringlimit_hot_keys`, promotions and demotions).

use parking_lot::Mutex;
use ringlimit_core::hot_keys::{HotKeys, HotSettings};
use ringlimit_core::lease::{Held, Release};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One forwarded check in this many is counted, with this weight: the lock is taken for one
/// check in 8, and a hot bucket (1,000 checks/s and more) is still counted hundreds of times a
/// second.
pub const SAMPLE: u32 = 8;

thread_local! {
    /// Forwarded checks seen by this thread since its last counted one.
    static TURN: Cell<u32> = const { Cell::new(0) };
}

/// Forwarded buckets' rates, and which are hot.
#[derive(Debug)]
pub struct Forwarded {
    keys: Mutex<HotKeys>,
    tick: Duration,
    /// Buckets promoted now.
    pub hot: AtomicU64,
    pub promoted: AtomicU64,
    pub demoted: AtomicU64,
}

impl Default for Forwarded {
    fn default() -> Self {
        Self::new(HotSettings::default())
    }
}

impl Forwarded {
    pub fn new(settings: HotSettings) -> Self {
        Self {
            keys: Mutex::new(HotKeys::new(settings)),
            tick: Duration::from_nanos(settings.tick_ns),
            hot: AtomicU64::new(0),
            promoted: AtomicU64::new(0),
            demoted: AtomicU64::new(0),
        }
    }

    /// A check of bucket `id` forwarded to its owner.
    #[inline]
    pub fn record(&self, id: u64) {
        let counted = TURN.with(|t| {
            let n = t.get() + 1;
            t.set(if n == SAMPLE { 0 } else { n });
            n == SAMPLE
        });
        if counted {
            self.keys.lock().record(id, u64::from(SAMPLE));
        }
    }

    /// One tick: promotions and demotions counted, and leased or released in `held`.
    pub fn tick(&self, held: &Held) {
        let mut keys = self.keys.lock();
        let changes = keys.tick();
        self.hot.store(keys.hot_count() as u64, Ordering::Relaxed);
        drop(keys);
        self.promoted
            .fetch_add(changes.promoted.len() as u64, Ordering::Relaxed);
        self.demoted
            .fetch_add(changes.demoted.len() as u64, Ordering::Relaxed);
        for id in changes.promoted {
            tracing::debug!(bucket = id, "hot key promoted");
            held.want(id);
        }
        for id in changes.demoted {
            held.release(id, Release::Cooled);
        }
    }

    /// Ticks every 250 ms until dropped.
    pub async fn run(self: std::sync::Arc<Self>, held: std::sync::Arc<Held>) {
        let mut every = tokio::time::interval(self.tick);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.tick(&held);
        }
    }
}
