//! ns per histogram observation and counter increment, from 1 and from 2 threads at once:
//! prometheus-client's `Histogram` (one mutex) and `Counter` (one atomic) against the node's
//! per-thread sharded ones (`ringlimit_node::metrics::sharded`). Every check does one of each.
//!
//! The `two_threads` figures are wall time over the total count (the inverse of aggregate
//! throughput): on 2 cores, half the single-thread figure if nothing is shared.

use criterion::{Criterion, criterion_group, criterion_main};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use ringlimit_node::metrics::sharded::{ShardedCounter, ShardedHistogram};
use std::hint::black_box;
use std::time::{Duration, Instant};

const BOUNDS: [f64; 12] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
];

/// A check's pair of updates: one observation, one increment.
trait Pair: Sync {
    fn update(&self, v: f64);
}

struct Plain(Histogram, Counter);
impl Pair for Plain {
    fn update(&self, v: f64) {
        self.0.observe(v);
        self.1.inc();
    }
}

struct Sharded(ShardedHistogram, ShardedCounter);
impl Pair for Sharded {
    fn update(&self, v: f64) {
        self.0.observe(v);
        self.1.inc();
    }
}

/// Runs `iters` updates on each of `threads` threads; wall time over all updates.
fn run(pair: &dyn Pair, threads: u64, iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..iters {
                    pair.update(black_box((((i + t) % 64) as f64) * 20e-6));
                }
            });
        }
    });
    start.elapsed() / threads as u32
}

fn bench(c: &mut Criterion) {
    let plain = Plain(Histogram::new(BOUNDS), Counter::default());
    let sharded = Sharded(ShardedHistogram::new(BOUNDS), ShardedCounter::default());
    for threads in [1u64, 2] {
        let name = if threads == 1 {
            "one_thread"
        } else {
            "two_threads"
        };
        let mut g = c.benchmark_group(format!("metrics/{name}"));
        g.bench_function("prometheus_client", |b| {
            b.iter_custom(|iters| run(&plain, threads, iters))
        });
        g.bench_function("sharded", |b| {
            b.iter_custom(|iters| run(&sharded, threads, iters))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
