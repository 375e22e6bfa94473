//! The batch gate: a long batch decides its checks in slices, one large batch at a time on
//! each thread, so that single checks on the same thread are not stuck behind a flood.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A batch gives its thread back to the other connections after deciding for this long (a time, not
/// a count: a new key, with an eviction, costs several times a known one). Shorter than the slice
/// that came first, it lowered other keys' p99 under a key flood, for the same flood rate and batch
/// CPU per check (measured with the gate below: the docs' benchmarks page, "Key flood", and
/// `bench/notes/key-flood.md`).
const SLICE: Duration = Duration::from_micros(5);
/// How often a batch looks at the clock: every 4 decisions, so that reading it stays a small
/// part of each decision.
const CLOCK_EVERY: usize = 4;
/// Batches of at most this many checks are decided in one go.
const SHORT_BATCH: usize = 16;

thread_local! {
    /// One large batch decides at a time on each thread; the others wait their turn (FIFO)
    /// without being polled.
    ///
    /// Why: a single check waits for one round of every runnable task on its thread; under a
    /// flood of batches that round was a slice of every flooding connection's batch, and other
    /// keys' tail latency grew with the flood (measured with `bench/keyflood.sh`'s `PIN=1`, the
    /// node alone on a core: `bench/notes/key-flood.md`).
    static BATCH_GATE: Arc<Semaphore> = Arc::new(Semaphore::new(1));
}

/// One batch's turn at deciding: held from [`BatchTurn::take`] to [`BatchTurn::release`] by a
/// long batch, which yields before its first decision, between slices and after its last, so
/// that parsing it and writing its answer are slices of their own.
pub(super) struct BatchTurn {
    sliced: bool,
    permit: Option<OwnedSemaphorePermit>,
    slice_start: Instant,
}

impl BatchTurn {
    /// Waits for this thread's gate when a batch of `len` checks is long.
    pub(super) async fn take(len: usize) -> Self {
        let sliced = len > SHORT_BATCH;
        let permit = match sliced.then(|| BATCH_GATE.with(Arc::clone)) {
            Some(gate) => gate.acquire_owned().await.ok(),
            None => None,
        };
        Self {
            sliced,
            permit,
            slice_start: Instant::now(),
        }
    }

    /// Before deciding check `i`: yields when a slice is over.
    pub(super) async fn pace(&mut self, i: usize) {
        if self.sliced
            && i.is_multiple_of(CLOCK_EVERY)
            && (i == 0 || self.slice_start.elapsed() >= SLICE)
        {
            tokio::task::yield_now().await;
            self.slice_start = Instant::now();
        }
    }

    /// Decided here: the owners' answers are awaited without the gate.
    pub(super) fn release(&mut self) {
        self.permit = None;
    }

    /// Answered: a long batch yields once more.
    pub(super) async fn end(self) {
        if self.sliced {
            tokio::task::yield_now().await;
        }
    }
}
