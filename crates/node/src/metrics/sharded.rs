//! Counters and histograms that many threads update on every check, one slot per thread.
//!
//! Why: prometheus-client's `Histogram` is one mutex and its `Counter` one atomic, so every
//! check made the same cache lines travel between the cores that serve checks (and, with many
//! cores, queue on the histogram's lock). Here a thread updates a slot of its own, on a cache
//! line of its own, and a scrape adds the slots up.

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::{Atomic, Counter};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A counter whose value is kept per thread.
pub type ShardedCounter = Counter<u64, ShardedU64>;

/// Slots per metric: the CPUs, rounded up to a power of two, at most 64.
fn slots() -> usize {
    static SLOTS: OnceLock<usize> = OnceLock::new();
    *SLOTS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .next_power_of_two()
            .min(64)
    })
}

/// This thread's slot among `len` (a power of two). Threads are numbered as they first
/// update a metric, so the few threads that serve checks get distinct slots.
fn slot(len: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.with(|s| *s) & (len - 1)
}

/// One slot on a cache line of its own (128 bytes: adjacent-line prefetching pairs lines).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded<T>(T);

/// A `u64` counter value spread over per-thread slots (for [`ShardedCounter`]).
#[derive(Debug)]
pub struct ShardedU64 {
    slots: Box<[Padded<AtomicU64>]>,
}

impl Default for ShardedU64 {
    fn default() -> Self {
        Self {
            slots: (0..slots()).map(|_| Padded::default()).collect(),
        }
    }
}

impl Atomic<u64> for ShardedU64 {
    fn inc(&self) -> u64 {
        self.inc_by(1)
    }

    /// Returns this thread's slot before the increment, not the total: adding the slots up
    /// would read every other thread's cache line (nothing here uses the value).
    fn inc_by(&self, v: u64) -> u64 {
        self.slots[slot(self.slots.len())]
            .0
            .fetch_add(v, Ordering::Relaxed)
    }

    fn get(&self) -> u64 {
        self.slots
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

/// One thread's share of a histogram.
#[derive(Debug)]
struct Shard {
    sum: f64,
    count: u64,
    /// Per bucket, not cumulative (as prometheus-client encodes them).
    buckets: Box<[u64]>,
}

#[derive(Debug)]
struct HistogramInner {
    /// Upper bounds, ending with `+Inf`.
    bounds: Box<[f64]>,
    shards: Box<[Padded<Mutex<Shard>>]>,
}

/// A histogram (classic buckets) with per-thread shards; a drop-in for prometheus-client's.
#[derive(Debug, Clone)]
pub struct ShardedHistogram {
    inner: Arc<HistogramInner>,
}

impl ShardedHistogram {
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Box<[f64]> = bounds
            .into_iter()
            .filter(|b| b.is_finite())
            .chain(std::iter::once(f64::INFINITY))
            .collect();
        let shards = (0..slots())
            .map(|_| {
                Padded(Mutex::new(Shard {
                    sum: 0.0,
                    count: 0,
                    buckets: vec![0; bounds.len()].into_boxed_slice(),
                }))
            })
            .collect();
        Self {
            inner: Arc::new(HistogramInner { bounds, shards }),
        }
    }

    pub fn observe(&self, v: f64) {
        let inner = &*self.inner;
        // The first bound at or above `v`; NaN goes to +Inf, as prometheus-client does.
        let bucket = inner
            .bounds
            .iter()
            .position(|b| *b >= v)
            .unwrap_or(inner.bounds.len() - 1);
        let mut shard = inner.shards[slot(inner.shards.len())].0.lock();
        shard.sum += v;
        shard.count += 1;
        shard.buckets[bucket] += 1;
    }

    /// Sum, count and per-bucket counts over all shards.
    fn totals(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let mut buckets: Vec<(f64, u64)> = inner.bounds.iter().map(|b| (*b, 0)).collect();
        let (mut sum, mut count) = (0.0, 0);
        for shard in inner.shards.iter() {
            let shard = shard.0.lock();
            sum += shard.sum;
            count += shard.count;
            for (total, n) in buckets.iter_mut().zip(shard.buckets.iter()) {
                total.1 += n;
            }
        }
        (sum, count, buckets)
    }
}

impl TypedMetric for ShardedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ShardedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let (sum, count, buckets) = self.totals();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    /// Observations from several threads, encoded: exactly what prometheus-client's own
    /// metrics give for the same observations.
    #[test]
    fn encodes_like_prometheus_client_from_many_threads() {
        let bounds = [1.0, 2.0, 5.0];
        let (sharded, plain) = (ShardedHistogram::new(bounds), Histogram::new(bounds));
        let (counter, plain_counter) = (ShardedCounter::default(), Counter::<u64>::default());
        std::thread::scope(|s| {
            for t in 0..4 {
                let (sharded, plain) = (&sharded, &plain);
                let (counter, plain_counter) = (&counter, &plain_counter);
                s.spawn(move || {
                    for i in 0..1000 {
                        let v = f64::from((i + t) % 7);
                        sharded.observe(v);
                        plain.observe(v);
                        counter.inc();
                        plain_counter.inc_by(1);
                    }
                });
            }
        });
        sharded.observe(f64::NAN);
        plain.observe(f64::NAN);
        let text = |register: &dyn Fn(&mut Registry)| {
            let mut r = Registry::default();
            register(&mut r);
            let mut out = String::new();
            encode(&mut out, &r).expect("encode");
            out
        };
        let ours = text(&|r| {
            r.register("lat", "latency", sharded.clone());
            r.register("n", "count", counter.clone());
        });
        let theirs = text(&|r| {
            r.register("lat", "latency", plain.clone());
            r.register("n", "count", plain_counter.clone());
        });
        assert_eq!(ours, theirs);
        assert!(ours.contains("n_total 4000"), "{ours}");
        assert_eq!(counter.get(), 4000);
    }
}
