//! What the store and engine benchmarks share: the key streams (workloads), the limiter
//! interface under test, and the single- and two-thread loops. Included by `benches/store.rs`
//! here and by `ringlimit-node`'s `benches/engine.rs` (with `#[path]`), so both measure on the
//! very same streams and loops and their figures compare.

#![allow(dead_code)]

use criterion::Criterion;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Distinct keys in each distribution.
pub const KEYS: usize = 100_000;
/// Distinct keys of the `uniform_1m` distribution.
pub const KEYS_1M: usize = 1_000_000;
/// Hot keys of the skewed distribution, and the share of checks they get.
pub const HOT_KEYS: usize = 1_000;
pub const HOT_SHARE_PERMILLE: u64 = 900;
/// Length of the precomputed key stream (a power of two, so the index is a mask).
pub const STREAM: usize = 1 << 20;
const MASK: usize = STREAM - 1;
/// Rate of the rule and of governor's quota.
pub const RATE: u32 = 1_000_000;
/// What the manual clock advances per check.
pub const STEP_NS: u64 = 100;
/// Bucket bound of the store: well above the keys, so nothing is evicted.
pub const MAX_KEYS: u64 = 1_000_000;
pub const THREADS: usize = 2;

pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A key stream: key indices in `0..KEYS`, as 64-bit ids and as strings.
pub struct Workload {
    pub name: &'static str,
    /// Index into `strings` per position of the stream.
    idx: Vec<u32>,
    /// The 64-bit key per position of the stream (`splitmix64` of the index).
    ids: Vec<u64>,
    /// The string key per key index.
    strings: Vec<String>,
}

impl Workload {
    pub fn new(name: &'static str, skewed: bool, keys: usize) -> Self {
        let mut state = 0x5eed_u64;
        let mut next = || {
            state = state.wrapping_add(1);
            splitmix64(state ^ 0xdead_beef)
        };
        let idx: Vec<u32> = (0..STREAM)
            .map(|_| {
                let r = next();
                let k = if skewed && r % 1000 < HOT_SHARE_PERMILLE {
                    (r >> 32) % HOT_KEYS as u64
                } else {
                    (r >> 32) % keys as u64
                };
                k as u32
            })
            .collect();
        let ids = idx.iter().map(|&k| splitmix64(u64::from(k))).collect();
        let strings = (0..keys).map(|k| format!("user:{k:08}")).collect();
        Self {
            name,
            idx,
            ids,
            strings,
        }
    }

    #[inline(always)]
    pub fn id(&self, i: usize) -> u64 {
        // The mask keeps the index in bounds, so the bounds check is elided.
        self.ids[i & MASK]
    }

    #[inline(always)]
    pub fn string(&self, i: usize) -> &String {
        &self.strings[self.idx[i & MASK] as usize]
    }
}

/// One implementation under test: a check of the stream's `i`-th key by thread `t`.
pub trait Limiter: Sync {
    fn check(&self, w: &Workload, i: usize, t: usize) -> bool;
}

/// Runs `n` checks starting at stream position `start`; returns how many were admitted.
#[inline(never)]
fn run<L: Limiter>(l: &L, w: &Workload, start: usize, n: u64, t: usize) -> u64 {
    let mut admitted = 0u64;
    for k in 0..n as usize {
        admitted += u64::from(l.check(w, start.wrapping_add(k), t));
    }
    black_box(admitted)
}

/// Fills every bucket once and checks that the admit path is what is being measured.
fn warm<L: Limiter>(l: &L, w: &Workload, what: &str, threads: usize) {
    let n = (2 * STREAM) as u64;
    for t in 0..threads {
        let admitted = run(l, w, 0, n, t);
        assert!(
            admitted * 1000 >= n * 999,
            "{what} on {}: only {admitted} of {n} admitted",
            w.name
        );
    }
}

pub fn single<L: Limiter>(c: &mut Criterion, w: &Workload, name: &str, l: &L) {
    let mut group = c.benchmark_group(format!("single_thread/{}", w.name));
    // The manual clock must not go backwards between samples: keep the stream position.
    let mut pos = 2 * STREAM;
    let mut warmed = false;
    group.bench_function(name, |b| {
        // Here rather than before, so that benchmarks filtered out cost nothing.
        if !std::mem::replace(&mut warmed, true) {
            warm(l, w, name, 1);
        }
        b.iter_custom(|iters| {
            let start = Instant::now();
            run(l, w, pos, iters, 0);
            let elapsed = start.elapsed();
            pos = pos.wrapping_add(iters as usize);
            elapsed
        })
    });
    group.finish();
}

pub fn multi<L: Limiter>(c: &mut Criterion, w: &Workload, name: &str, l: &L) {
    let mut group = c.benchmark_group(format!("two_threads/{}", w.name));
    let mut pos = 2 * STREAM;
    let mut warmed = false;
    group.bench_function(name, |b| {
        if !std::mem::replace(&mut warmed, true) {
            warm(l, w, name, THREADS);
        }
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    // Threads start a quarter of the stream apart so they hit different keys.
                    let from = pos.wrapping_add(t * (STREAM / 4));
                    s.spawn(move || run(l, w, from, iters, t));
                }
            });
            let elapsed = start.elapsed();
            pos = pos.wrapping_add(iters as usize);
            // Time per check: wall time over all threads' checks.
            elapsed / THREADS as u32
        })
    });
    group.finish();
}

pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .noise_threshold(0.05)
}
